"""The command line: parse, call one library function, render. No logic lives here.

One module per command (convert, assemble, inspect, verify) registers itself on `app`; the options
they share are in `options.py`, the human output in `render/`.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import itertools
import os
import signal
import sys
import threading
from typing import Callable, NoReturn

import typer
from rich.markup import escape
from typer.core import TyperGroup, TyperOption

from ascendconv import __version__
from ascendconv.cli.console import discard, err, escape_unencodable, leave_broken_pipe, lose_stderr, out, terminal_safe
from ascendconv.cli.envelope import dump_envelope, error_envelope, usage_hint
from ascendconv.entry import interrupt_behind
from ascendconv.errors import (
    EXIT_INTERRUPTED,
    AscendconvError,
    Interrupted,
    StdoutWriteError,
    file_system_error,
    out_of_memory,
    unreadable,
)

# At exit the interpreter's last garbage collection walks every object still alive, numba's type
# system included: 0.11 s of a 0.63 s convert of the sample, 0.03 s of a 0.15 s verify. Objects frozen
# first are skipped; nothing is lost, as a command holds no cyclic garbage whose finalizer matters
# (files are closed and temporary directories removed before it returns).
atexit.register(gc.freeze)

class CommandLine(TyperGroup):
    """The group every command hangs on: an option parser's usage error (an unknown option, a value
    not among the choices) is printed with a "did you mean" where one is close; when --json was
    given, as every other error is: the one JSON error object on stdout, and on stderr its message
    and hint alone (Click's usage text, meant for a person at a terminal, is left out)."""

    argv: list[str] = []  # the command line main() was given

    def invoke(self, ctx):
        """The command; a reader of stdout that left ends it as `leave_broken_pipe` says (Click's own
        handling, outside, would exit 1). A Ctrl-C outside the library call (a command's lazy
        imports, its rendering) is said as one inside it is: typer's own handling exits 130 without a
        word or an envelope, and one inside numpy's import is an ImportError, a traceback, exit 1."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            leave_broken_pipe()
        except (KeyboardInterrupt, ImportError) as exc:
            interrupt = interrupt_behind(exc)
            if interrupt is None:
                raise
            raise typer.Exit(report_interrupt(interrupt, self.json_flag_given(self.argv), ctx.invoked_subcommand))

    def make_context(self, info_name, args, parent=None, **extra):
        """The line parsed as far as the command's name; a Ctrl-C in that is said as one in the
        command is (typer's handling, around it, exits 130 without a word or an envelope)."""
        try:
            return super().make_context(info_name, args, parent, **extra)
        except KeyboardInterrupt as exc:
            raise typer.Exit(report_interrupt(exc, self.json_flag_given(self.argv), self.command_named(self.argv)))

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        argv = self.argv = list(sys.argv[1:] if args is None else args)
        if not standalone_mode:
            return super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        escape_unencodable()
        try:
            self.run_line(argv, prog_name, complete_var, **extra)
        except StdoutWriteError as exc:  # from the output of a command, or of its error
            report_error(exc, False, None)
            discard(sys.stdout)  # what is still buffered for it must not fail the exit
            sys.exit(exc.exit_code)

    def run_line(self, argv: list[str], prog_name, complete_var, **extra) -> NoReturn:
        """The command line's run, ended with its exit code."""
        try:
            code = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as exc:  # Click's usage errors, raised by the option parser
            hint = usage_hint(exc)
            if self.json_flag_given(argv):
                command = self.command_named(argv)
                report(command, type(exc).__name__, exc.format_message(), hint, exc.exit_code, as_json=True)
            else:
                try:
                    exc.show()  # Click's own writing, to stderr
                except OSError:
                    lose_stderr()
                show_hint(hint)
            sys.exit(exc.exit_code)
        except typer.Abort:
            err.print("Aborted!", highlight=False)
            sys.exit(1)
        except MemoryError as exc:
            # the one net for every command and every step of it (a lazy import, the library, the
            # rendering): the pipeline names the tensor it was converting, this the command
            command = self.command_named(argv)
            named = out_of_memory(exc, f"to {command or 'start'}")
            report_error(named, self.json_flag_given(argv), command)
            sys.exit(named.exit_code)
        sys.exit(code if isinstance(code, int) else 0)

    def command_named(self, argv: list[str]) -> str | None:
        """The command `argv` names, for an error's envelope where Click has not resolved one."""
        return next((a for a in argv if a in self.commands), None)

    def json_flag_given(self, argv: list[str]) -> bool:
        """Whether `argv` gives --json as Click parses the line: the flag of the command named, not the
        value of an option that takes one (`--override --json`) nor an argument after a bare `--`.
        Which options take values is read from the group's and the commands' own parameters. The
        token counts even where Click stops at an error before it (`verify --bogus --json`), before
        the command (`ascendconv --json convert`, an unknown option of the group: the envelope says
        so), and after a command that does not exist (`ascendconv bogus --json`), whose options are
        unknown."""
        params, command = self.params, None
        tokens = iter(argv)
        for token in tokens:
            if token == "--":
                return False
            if token == "-" or not token.startswith("-"):  # an argument
                if command is None:
                    command = self.commands.get(token)
                    if command is None:  # no such command: nothing tells its options' values apart
                        return "--json" in itertools.takewhile(lambda rest: rest != "--", tokens)
                    params = command.params
                continue
            if token == "--json":  # before the command: not an option of the group, but plainly asked for
                return command is None or any(isinstance(p, TyperOption) and "--json" in p.opts for p in params)
            for _ in range(values_taken(params, token)):
                next(tokens, None)
        return False


def values_taken(params: list, token: str) -> int:
    """How many of the tokens after the option `token` (`--tp`, `-q`, `-qt`: short flags joined) Click
    takes as its value: none for a flag, an unknown option, or a value in the token itself (`--tp=2`,
    `-t2`)."""
    names = [token] if token.startswith("--") else [f"-{c}" for c in token[1:]]
    for i, name in enumerate(names):
        option = next((p for p in params if isinstance(p, TyperOption) and name in p.opts), None)
        if option is not None and not option.is_flag and not option.count:
            return option.nargs if i == len(names) - 1 else 0
    return 0


app = typer.Typer(
    cls=CommandLine,
    rich_markup_mode=None,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Convert FP8, MX and BF16 checkpoints to AscendV1 MX packages for vllm-ascend.",
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


def report_error(exc: AscendconvError, as_json: bool, command: str | None) -> None:
    report(command, exc.code, exc.message, exc.hint, exc.exit_code, as_json)


def report(command: str | None, code: str, message: str, hint: str | None, exit_code: int, as_json: bool) -> None:
    """An error as every command shows it: `error: ...` and `hint: ...` on stderr, and under --json
    the envelope on stdout first."""
    try:
        if as_json:
            dump_envelope(error_envelope(command, code, message, hint, exit_code))
    finally:  # said on stderr also when stdout cannot take the envelope
        # soft_wrap: a message names files and tensors; never break it inside a name
        err.print(f"[bold red]error:[/] {escape(terminal_safe(message))}", highlight=False, soft_wrap=True)
        show_hint(hint)


def show_hint(hint: str | None) -> None:
    if hint:
        err.print(f"[dim]hint:[/] {escape(terminal_safe(hint))}", highlight=False, soft_wrap=True)


def run(action: Callable[[], object], as_json: bool, command: str) -> object:
    """Call the library; turn its errors into a message, a hint and an exit code."""
    try:
        return action()
    except AscendconvError as exc:
        report_error(exc, as_json, command)
        raise typer.Exit(exc.exit_code)
    except PermissionError as exc:  # an input this user may not read: a directory without x, a file without r
        named = unreadable(exc)
        report_error(named, as_json, command)
        raise typer.Exit(named.exit_code)
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # stdout's reader left: CommandLine.invoke exits 141
            raise
        named = file_system_error(exc)
        report_error(named, as_json, command)
        raise typer.Exit(named.exit_code)
    except KeyboardInterrupt as exc:
        raise typer.Exit(report_interrupt(exc, as_json, command))


def report_interrupt(exc: KeyboardInterrupt, as_json: bool, command: str | None) -> int:
    """Say an interrupt as every command does ('interrupted by SIGTERM: what is at OUT', under --json
    the envelope too) and return its exit code (128 + the signal)."""
    what = f"by {signal.Signals(exc.signum).name}" if isinstance(exc, Interrupted) else ""
    outcome = getattr(exc, "outcome", None)
    err.print(
        "[bold red]interrupted[/]" + (f" {what}" if what else "") + (f": {escape(terminal_safe(outcome))}" if outcome else ""),
        highlight=False, soft_wrap=True,
    )
    code = exc.exit_code if isinstance(exc, Interrupted) else EXIT_INTERRUPTED
    if as_json:
        dump_envelope(error_envelope(command, "Interrupted", f"interrupted {what}".strip(), outcome, code))
    exit_quietly_if_interrupted_again()
    return code


def exit_quietly_if_interrupted_again() -> None:
    """After an interrupt is reported, a second one while the interpreter waits for worker threads
    to wind down (an impatient Ctrl-C) ends the process at once, as the first one's exit would,
    instead of printing a traceback from the interpreter's shutdown. What is at OUT was settled
    before the report. The handlers go in as that shutdown begins, so that a library caller (or a
    test runner) that goes on after the interrupt keeps its own."""
    from ascendconv.io.outdir import INTERRUPTING_SIGNALS

    def leave(signum: int, frame) -> None:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(128 + signum)

    def install() -> None:
        for name in INTERRUPTING_SIGNALS:
            signal.signal(getattr(signal, name), leave)

    # threading runs these before it joins the remaining threads, at shutdown (Python >= 3.9)
    register = getattr(threading, "_register_atexit", None)
    if register is not None and threading.current_thread() is threading.main_thread():
        with contextlib.suppress(RuntimeError):  # shutdown has begun already
            register(install)


def header_only_process() -> None:
    """For a command that reads only headers (inspect, convert --dry-run): no cyclic garbage
    collection for the rest of the process. Such a command builds a few hundred thousand records
    that hold no reference cycles and exits; each full pass of the collector walked them all, about
    a third of its run on the largest checkpoints (docs/performance.md). A library caller keeps its
    own collector untouched."""
    gc.disable()


def print_json(result, command: str) -> None:
    """A library result as the one JSON object --json promises on stdout, in the envelope."""
    from ascendconv.cli.envelope import envelope

    dump_envelope(envelope(command, result.to_dict()), indent=2)


# Registered after `app` and `run` exist: each command module imports them from here.
from ascendconv.cli import assemble, convert, inspect, verify  # noqa: E402,F401
