"""Runs that meet at one OUT: the lock, its messages, and what readers of OUT see while a run
publishes there. Each race is held at its critical point (a process holding the lock, a hook at
the rename) instead of being left to timing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from ascendconv.cli import app
from conftest import FIXTURES
from robust_helpers import REPO

runner = CliRunner()
DENSE = FIXTURES / "qwen3-dense-fp8"


def hold_lock(out: Path) -> subprocess.Popen:
    """Another process holding OUT's lock, as a run converting to OUT does, until its stdin closes."""
    code = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from ascendconv.io.outdir import OutputLock
        lock = OutputLock(Path({str(out)!r}))
        lock.acquire()
        print("held", flush=True)
        sys.stdin.read()
        lock.release()
        """
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_busy_output_names_the_run_that_holds_it(tmp_path):
    out = tmp_path / "out"
    holder = hold_lock(out)
    try:
        result = runner.invoke(app, ["convert", str(DENSE), str(out), "--quiet"])
        assert result.exit_code == 2, result.output
        assert f"another ascendconv run (pid {holder.pid}) is writing this output" in result.stderr
        assert "wait for it to finish" in result.stderr
        assert not out.exists()
    finally:
        holder.communicate("", timeout=30)
    assert runner.invoke(app, ["convert", str(DENSE), str(out), "--quiet"]).exit_code == 0
