"""The `ascendconv` command's entry point: the console script and `python -m ascendconv`.

Importing the command line (typer, rich, every command's options) takes 0.05-0.3 s, and a Ctrl-C
there ended the process in Python's traceback, killed by the signal, without the message, the exit
code and the --json envelope of a later one. This module imports only os, signal and sys before it
listens for SIGINT (not `typing`, nor `ascendconv.errors`: milliseconds each), then imports the
command line and runs it, and reports in the command line's words an interrupt the command line
cannot report itself.
"""

from __future__ import annotations

import os
import signal
import sys

# The commands' names, known before the command line that defines them is imported (a test holds
# them to its commands)
COMMANDS = ("convert", "assemble", "inspect", "verify")


def main() -> None:
    """Run the command line on sys.argv; it exits with the command's code."""
    try:
        said_if_interrupted(run_command_line)
    finally:
        forget_caught_interrupts()


def run_command_line() -> None:
    """Import the command line while SIGINT is listened for, then run it. A KeyboardInterrupt that
    leaves it came before it could report one (typer building the commands): once it has, it exits
    by SystemExit."""
    heard: list[int] = []

    def note(signum: int, frame) -> None:
        heard.append(signum)
        raise KeyboardInterrupt

    # Only over Python's own handler: where SIGINT is ignored (a background job) it stays ignored
    listening = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    try:
        if listening:
            signal.signal(signal.SIGINT, note)
        from ascendconv.cli import app
    finally:
        # Python's handler back: the command line installs its own only over that one (io/outdir.py)
        if listening and signal.getsignal(signal.SIGINT) is note:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    if heard:
        # the import went on: its KeyboardInterrupt was raised where Python ignores exceptions (an
        # import lock's callback: "Exception ignored in ...") and lost
        exit_interrupted()
    app(prog_name="ascendconv")


def said_if_interrupted(action) -> None:
    """`action()`; a Ctrl-C in it (or an import it interrupted) ends the process as an interrupt."""
    try:
        action()
    except (KeyboardInterrupt, ImportError) as exc:
        if interrupt_behind(exc) is None:
            raise
        exit_interrupted()


def forget_caught_interrupts() -> None:
    """Under `python -m`, CPython ends the process by SIGINT at exit, whatever its exit code, once
    a KeyboardInterrupt has left code run by exec() of a string (dataclasses and namedtuple make
    their methods so, on import), though it was caught and reported after. An exec() of a string
    that completes clears that mark (Python/pythonrun.c, run_eval_code_obj)."""
    exec("")


def interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C behind an exception: itself, or the one a module interrupted while it was imported
    (numpy's, lazily, in a command) raised its ImportError from."""
    while exc is not None and not isinstance(exc, KeyboardInterrupt):
        exc = exc.__cause__ or exc.__context__
    return exc


def exit_interrupted():
    """Say an interrupt as the command line's `report_interrupt` does, without its modules:
    'interrupted' on stderr, under --json the envelope on stdout (docs/json.md); exit 130. Before the
    line is parsed, --json is asked for wherever it comes before a bare '--', and the command is the
    line's first word if it names one."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the process ends here: a second Ctrl-C cuts nothing short
    from ascendconv.errors import EXIT_INTERRUPTED

    words = sys.argv[1:]
    if "--" in words:
        words = words[: words.index("--")]
    write(sys.stderr, "interrupted\n")
    if "--json" in words:
        import json

        first = next((word for word in words if not word.startswith("-")), None)
        write(sys.stdout, json.dumps({
            "ok": False, "schema": 1, "command": first if first in COMMANDS else None, "error": "Interrupted",
            "message": "interrupted", "hint": None, "exit_code": EXIT_INTERRUPTED,
        }) + "\n")
    sys.exit(EXIT_INTERRUPTED)


def write(stream, text: str) -> None:
    """`text` on a standard stream's descriptor, past its buffer: nothing is left for the
    interpreter's flush at exit to fail on (stdout's reader gone would make the exit code 120)."""
    data = text.encode()
    try:
        while data:
            data = data[os.write(stream.fileno(), data):]
    except (OSError, AttributeError, ValueError):  # closed, or None: the exit code still says it
        pass
