"""The two consoles every command writes to, and the library's one-line notices."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

out = Console()
err = Console(stderr=True)
# In a pipe or a CI log a line is never wrapped at the 80 columns rich assumes: its reader's window,
# grep and diff see each sentence whole.
for _console in (out, err):
    _console.soft_wrap = not _console.is_terminal


def notice(text: str) -> None:
    """A library message for the user (e.g. the kernels' first compilation), on stderr even with
    --quiet or --json: it explains a pause that happens once."""
    err.print(f"[dim]{escape(text)}[/]", highlight=False, soft_wrap=True)
