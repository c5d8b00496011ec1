"""The command line: parse, call one library function, render. No logic lives here.

One module per command (convert, assemble, inspect, verify) registers itself on `app`; the options
they share are in `options.py`, the human output in `render/`.
"""

from __future__ import annotations

import atexit
import gc
import json
import signal
from typing import Callable

import typer
from rich.markup import escape

from ascendconv import __version__
from ascendconv.cli.console import err, out
from ascendconv.errors import EXIT_INTERRUPTED, AscendconvError, Interrupted

# At exit the interpreter's last garbage collection walks every object still alive, numba's type
# system included: 0.11 s of a 0.63 s convert of the sample, 0.03 s of a 0.15 s verify. Objects frozen
# first are skipped; nothing is lost, as a command holds no cyclic garbage whose finalizer matters
# (files are closed and temporary directories removed before it returns).
atexit.register(gc.freeze)

app = typer.Typer(
    add_completion=False,
    rich_markup_mode=None,
    no_args_is_help=True,
    help="Convert Hugging Face block-FP8 checkpoints to AscendV1 MX packages for vllm-ascend.",
)


def _version(value: bool) -> None:
    if value:
        out.print(f"ascendconv {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """ascendconv: offline block-FP8 -> MXFP8 / MXFP4 conversion for Ascend NPUs."""


def run(action: Callable[[], object], as_json: bool) -> object:
    """Call the library; turn its errors into a message, a hint and an exit code."""
    try:
        return action()
    except AscendconvError as exc:
        if as_json:
            print(json.dumps({"ok": False, **exc.to_dict()}))
        # soft_wrap: a message names files and tensors; never break it inside a name
        err.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False, soft_wrap=True)
        if exc.hint:
            err.print(f"[dim]hint:[/] {escape(exc.hint)}", highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        what = f"by {signal.Signals(exc.signum).name}" if isinstance(exc, Interrupted) else ""
        outcome = getattr(exc, "outcome", None)
        err.print(
            f"[bold red]interrupted[/] {what}" + (f": {escape(outcome)}" if outcome else ""), highlight=False, soft_wrap=True
        )
        raise typer.Exit(exc.exit_code if isinstance(exc, Interrupted) else EXIT_INTERRUPTED)


def print_json(result) -> None:
    """A library result as the one JSON object --json promises on stdout."""
    print(json.dumps(result.to_dict(), indent=2))


# Registered after `app` and `run` exist: each command module imports them from here.
from ascendconv.cli import assemble, convert, inspect, verify  # noqa: E402,F401
