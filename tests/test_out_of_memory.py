"""Running out of memory is this machine's problem, not the input's: OutOfMemoryError (exit 4),
naming what was being done and how to fix it; never a traceback, never "damaged input"."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from ascendconv import pipeline
from ascendconv.cli import app
from conftest import FIXTURES, write_large_checkpoint

runner = CliRunner()
DENSE = FIXTURES / "qwen3-dense-fp8"


def failing_copy(name: str):
    def copy(data):
        raise MemoryError("Unable to allocate 64.0 MiB for an array with shape (67108864,) and data type uint8")

    return copy


def test_a_worker_out_of_memory_names_the_tensor_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "_copy_op", failing_copy)
    result = runner.invoke(app, ["convert", str(DENSE), str(tmp_path / "out"), "--quiet"])
    assert result.exit_code == 4, result.output
    assert "Traceback" not in result.output and (result.exception is None or isinstance(result.exception, SystemExit))
    assert "error: no memory left to convert tensor 'lm_head.weight' of " in result.stderr
    assert f"{DENSE / 'model.safetensors'} (Unable to allocate 64.0 MiB" in result.stderr
    assert "hint: free memory, raise the limit (ulimit -v), or use fewer --workers" in result.stderr
    assert "damaged" not in result.stderr and "cut short" not in result.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())

    as_json = runner.invoke(app, ["convert", str(DENSE), str(tmp_path / "out"), "--json"])
    error = json.loads(as_json.stdout.strip().splitlines()[0])
    assert (error["error"], error["exit_code"]) == ("OutOfMemoryError", 4) and "lm_head.weight" in error["message"]


def test_out_of_memory_anywhere_else_is_the_same_named_error(converted, monkeypatch):
    """verify and assemble reach no pipeline: the CLI's one net names the command."""
    from ascendconv.verify import layout

    pkg = converted("qwen3-dense-fp8")

    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(layout._Layout, "__init__", no_memory)
    result = runner.invoke(app, ["verify", str(pkg), "--quiet"])
    assert result.exit_code == 4 and "error: no memory left to verify" in result.stderr, result.output
    assert "Traceback" not in result.output and "hint: free memory" in result.stderr


LIMITED = """
import resource, sys
import numpy  # before the limit: what is limited is the conversion's own allocations
from ascendconv.cli import app
size = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmSize:"))) * 1024
limit = size + int(sys.argv[1]) * 2**20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
app(sys.argv[2:])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status are Linux's")
def test_a_real_process_under_an_address_space_limit_fails_named(tmp_path):
    """convert under RLIMIT_AS a little above what it has mapped once started: numpy's allocations
    fail inside the conversion, which must end with exit 4 and the named error."""
    src = write_large_checkpoint(tmp_path / "src")
    env = {**os.environ, "MALLOC_ARENA_MAX": "1", "COLUMNS": "200"}  # one malloc arena: threads map no 64 MB each
    codes = []
    for headroom_mb in (96, 128, 160):
        out = tmp_path / f"out-{headroom_mb}"
        done = subprocess.run([sys.executable, "-c", LIMITED, str(headroom_mb), "convert", str(src), str(out),
                               "--kernel", "reference", "--workers", "1", "--quiet"],
                              capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode in (0, 4), done.stderr[-2000:]
        assert "Traceback" not in done.stderr and "cut short" not in done.stderr and "damaged" not in done.stderr
        if done.returncode == 4:
            assert "error: no memory left to convert" in done.stderr and "hint: free memory" in done.stderr
            assert not out.exists()
        codes.append(done.returncode)
    assert 4 in codes, "no limit made the conversion run out of memory: the test measured nothing"

