"""The two consoles every command writes to, and the library's one-line notices."""

from __future__ import annotations

import os
import re
import shutil
import sys
from typing import NoReturn

from rich.console import Console
from rich.markup import escape

from ascendconv.errors import EXIT_BROKEN_PIPE, StdoutWriteError


def leave_broken_pipe() -> NoReturn:
    """The reader of stdout left (`ascendconv inspect X | head`): end quietly with the shell's code
    for that, 141. Click and rich would exit 1, which is verify's "a check failed". What is still
    buffered for stdout goes nowhere, also when the interpreter flushes at exit."""
    discard(sys.stdout)
    raise SystemExit(EXIT_BROKEN_PIPE)


def discard(stream) -> None:
    """Point `stream`'s descriptor at /dev/null: what is still buffered for it, and every later write
    (ours, a library's, the interpreter's flush at exit, which would turn the exit code into 120),
    goes nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True
        leave_broken_pipe()


class _Results(_Console):
    """stdout: the command's report, its JSON object. A write that fails there other than a broken
    pipe is StdoutWriteError, exit 4 (it was a traceback and exit 1, verify's "a check failed", or
    the interpreter's 120 at exit)."""

    def _check_buffer(self) -> None:
        try:
            super()._check_buffer()
        except OSError as exc:
            raise stdout_unwritable(exc) from None


def escape_unencodable() -> None:
    """stdout writes a character its encoding cannot spell (a table's rule or '…' under an ASCII
    locale, a file name's undecodable byte under a strict UTF-8 one) as its escape ('\\u2500',
    '\\udcff'), as stderr does, instead of ending the command in UnicodeEncodeError and exit 1
    (verify's "a check failed", for a package that passed)."""
    if getattr(sys.stdout, "errors", None) == "strict" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")


def write_stdout(text: str) -> None:
    """`text` on stdout as it is (a JSON object), flushed, failing as `out` does."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise stdout_unwritable(exc) from None


def stdout_unwritable(exc: OSError) -> StdoutWriteError:
    return StdoutWriteError(f"stdout: cannot be written ({exc.strerror or exc})")


class _Diagnostics(_Console):
    """stderr: progress, notices, warnings and error messages. A write that fails there other than
    a broken pipe (the disk under a CI log is full, an I/O error) silences it for the rest of the
    run instead of ending the command (`lose_stderr`)."""

    def _check_buffer(self) -> None:
        try:
            super()._check_buffer()
        except OSError:
            lose_stderr()


out = _Results()
err = _Diagnostics(stderr=True)


def lose_stderr() -> None:
    """stderr could not be written: nothing more goes there. A conversion is not lost for its log,
    and stdout and the exit code still say how the command went (an error would otherwise end in a
    traceback and exit 1, and a heartbeat's failure was taken for a full disk at OUT)."""
    err.quiet = True
    discard(sys.stderr)
# In a pipe or a CI log a line is never wrapped at the 80 columns rich assumes: its reader's window,
# grep and diff see each sentence whole.
for _console in (out, err):
    _console.soft_wrap = not _console.is_terminal
    # COLUMNS=0 (a shell that has not measured its window yet, an Emacs shell) is a width of 0 to
    # rich, which then prints nothing at all, error messages included: take the real one instead
    if _console.width < 1:
        _console.width = shutil.get_terminal_size().columns


# C0 and C1 controls (ESC, a line break, a tab, BEL, a carriage return), DEL, the Unicode line and
# paragraph separators and the bidirectional overrides and isolates
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSHOWN_IN_LINES = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")  # all but "\n"


def _escape(match: re.Match) -> str:
    return repr(match[0])[1:-1]


def terminal_safe(text: object) -> str:
    """Text from a file (a tensor or file name, a config value, a message naming them) as a terminal
    may show it: each control character as its escape, as Python writes it ('\\x1b', '\\n',
    '\\u202e'). A name is untrusted input: raw, its ESC sequences would recolour or clear the
    terminal, set its title or hide a link, a carriage return would overwrite what was printed, a
    line break would split a table's row, and a bidi override would show it reversed. rich strips
    only BEL, BS, VT, FF and CR."""
    return _UNSHOWN.sub(_escape, str(text))


def terminal_safe_lines(text: str) -> str:
    """terminal_safe of each line, the line breaks kept: for text whose lines are the printer's own
    (a table cell of several lines), whose names were made terminal_safe where they were put in."""
    return _UNSHOWN_IN_LINES.sub(_escape, text)


def has_unshown(text: str) -> bool:
    """Whether terminal_safe_lines would change `text`: one search, for a whole table at once."""
    return _UNSHOWN_IN_LINES.search(text) is not None


def notice(text: str) -> None:
    """A library message for the user (e.g. the kernels' first compilation), on stderr even with
    --quiet or --json: it explains a pause that happens once."""
    err.print(f"[dim]{escape(terminal_safe(text))}[/]", highlight=False, soft_wrap=True)
