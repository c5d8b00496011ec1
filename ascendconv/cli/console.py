"""The two consoles every command writes to, and the library's one-line notices."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from rich.console import Console
from rich.markup import escape

from ascendconv.errors import EXIT_BROKEN_PIPE


def leave_broken_pipe() -> NoReturn:
    """The reader of stdout left (`ascendconv inspect X | head`): end quietly with the shell's code
    for that, 141. Click and rich would exit 1, which is verify's "a check failed". What is still
    buffered for stdout goes nowhere, also when the interpreter flushes at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(EXIT_BROKEN_PIPE)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True
        leave_broken_pipe()


out = _Console()
err = _Console(stderr=True)
# In a pipe or a CI log a line is never wrapped at the 80 columns rich assumes: its reader's window,
# grep and diff see each sentence whole.
for _console in (out, err):
    _console.soft_wrap = not _console.is_terminal


def notice(text: str) -> None:
    """A library message for the user (e.g. the kernels' first compilation), on stderr even with
    --quiet or --json: it explains a pause that happens once."""
    err.print(f"[dim]{escape(text)}[/]", highlight=False, soft_wrap=True)
