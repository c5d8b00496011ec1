"""The entry point (ascendconv/entry.py): a Ctrl-C from the first line it runs is said as every later
one is (exit 130, 'interrupted', the --json envelope), while Python imports the command line too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from ascendconv import entry
from ascendconv.cli import app
from ascendconv.cli.envelope import error_envelope
from conftest import FIXTURES

REPO = Path(__file__).resolve().parent.parent
DENSE = FIXTURES / "qwen3-dense-fp8"
ENVELOPE = error_envelope("inspect", "Interrupted", "interrupted", None, 130)

# Test-only: starts ascendconv as its console script or `python -m ascendconv` does, with SIGINT
# sent to this process as a module begins to import (signal.raise_signal runs the handler before
# it returns), in the way named.
LAUNCHER = '''
import runpy, signal, sys

module, how, entry, *args = sys.argv[1:]


def interrupt():
    signal.raise_signal(signal.SIGINT)


class Finalized:
    def __del__(self):
        interrupt()  # Python prints "Exception ignored in ..." and drops the KeyboardInterrupt


class InterruptAt:
    def find_spec(self, name, path=None, target=None):
        if name == module:
            sys.meta_path.remove(self)
            if how == "raised":
                interrupt()
            elif how == "in-exec":  # as in the methods dataclasses and namedtuple make
                exec("interrupt()")
            else:
                Finalized()
        return None


# Python's own handler, as in a foreground process, also where the tests run as a background job
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.meta_path.insert(0, InterruptAt())
sys.argv = ["ascendconv", *args]
if entry == "-m":
    runpy.run_module("ascendconv", run_name="__main__", alter_sys=True)
else:  # what pip's wrapper script does
    from ascendconv.entry import main

    sys.exit(main())
'''


def interrupted_at_import(tmp_path: Path, module: str, how: str, entry_kind: str, *args: str):
    (tmp_path / "interrupt_at_import.py").write_text(LAUNCHER)
    # `python -m` for the module entry: CPython ends a -m run otherwise than a script's
    start = ["-m", "interrupt_at_import"] if entry_kind == "-m" else [str(tmp_path / "interrupt_at_import.py")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    return subprocess.run([sys.executable, *start, module, how, entry_kind, *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=REPO)


@pytest.mark.parametrize("entry_kind", ["-m", "script"])
@pytest.mark.parametrize(
    "module, how",
    [("typer", "raised"), ("rich.console", "in-exec"), ("typer", "lost"), ("ascendconv.inspect", "in-exec")],
    ids=["in-typer-import", "in-an-exec-in-rich-import", "lost-in-a-finalizer", "in-an-exec-in-a-command-import"],
)
def test_a_ctrl_c_while_the_command_line_is_imported_is_an_interrupt(tmp_path, module, how, entry_kind):
    """Python's traceback, and the process killed by SIGINT (-2), with no envelope; one Python
    lost in a finalizer let the command run on to exit 0. A KeyboardInterrupt raised inside an
    exec() of a string killed a `python -m` run by SIGINT even once the command line had reported
    it (in the command's own lazy import)."""
    done = interrupted_at_import(tmp_path, module, how, entry_kind, "inspect", str(DENSE), "--json")
    assert done.returncode == 130, done.stderr[-2000:]
    assert json.loads(done.stdout) == ENVELOPE
    if how == "lost":
        assert done.stderr.startswith("Exception ignored in: <function Finalized.__del__")  # Python's words
        assert done.stderr.endswith("KeyboardInterrupt: \ninterrupted\n")
    else:
        assert done.stderr == "interrupted\n"


def test_without_json_an_interrupted_import_says_it_on_stderr_alone(tmp_path):
    done = interrupted_at_import(tmp_path, "typer", "raised", "-m", "inspect", str(DENSE))
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "interrupted\n")


@pytest.fixture
def sigint_kept():
    """The test process's SIGINT handler as it was: the entry ignores SIGINT once it is ending."""
    kept = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, kept)


@pytest.mark.parametrize(
    "argv, envelope",
    [
        (["inspect", "x", "--json"], ENVELOPE),
        (["--json", "verify", "x"], {**ENVELOPE, "command": "verify"}),
        (["bogus", "--json"], {**ENVELOPE, "command": None}),
        (["inspect", "x", "--", "--json"], None),
        (["--help"], None),
    ],
)
def test_the_entry_says_a_ctrl_c_while_typer_builds_the_commands(monkeypatch, capfd, sigint_kept, argv, envelope):
    """After the import, typer builds the Click commands (10 ms) before the command line's own
    handling begins: a traceback there."""

    def interrupted(typer_app):
        raise KeyboardInterrupt

    monkeypatch.setattr(typer.main, "get_command", interrupted)
    monkeypatch.setattr(sys, "argv", ["ascendconv", *argv])
    with pytest.raises(SystemExit) as exited:
        entry.main()
    assert exited.value.code == 130
    out, err = capfd.readouterr()
    assert err == "interrupted\n"
    assert (json.loads(out) if envelope else out) == (envelope or "")


def test_the_entry_knows_every_command_by_name():
    assert sorted(entry.COMMANDS) == sorted(typer.main.get_command(app).commands)


def test_the_console_script_and_python_m_start_at_the_entry():
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '\nascendconv = "ascendconv.entry:main"\n' in pyproject
    assert "from ascendconv.entry import main\n\nmain()\n" in (REPO / "ascendconv" / "__main__.py").read_text()
