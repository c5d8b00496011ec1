"""Start-up: a command imports nothing it does not use (issue 8). Timing is scripts/bench.py's job;
this checks the cause of slow start-ups, the modules loaded, in a fresh interpreter per command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import FIXTURES

PROBE = """
import sys
from ascendconv.cli import app
try:
    app()
finally:
    print("MODULES", " ".join(sorted(sys.modules)), file=sys.stderr)
"""
HEAVY = ("numpy", "ml_dtypes", "numba", "llvmlite", "pydantic", "blake3", "importlib.metadata")


def loaded(*argv: str) -> set[str]:
    run = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    line = next(line for line in run.stderr.splitlines() if line.startswith("MODULES "))
    return set(line.split()[1:])


def heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY}


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["inspect", str(FIXTURES / "qwen3-moe-fp8")],
        ["convert", "--dry-run", str(FIXTURES / "qwen3-moe-fp8"), "unused-out"],
    ],
    ids=["help", "inspect", "dry-run"],
)
def test_header_only_commands_import_no_numerics(argv):
    modules = loaded(*argv)
    assert "ascendconv.cli" in modules
    assert heavy(modules) == set()
    assert "ascendconv.verify" not in modules and "rich.progress" not in modules


def test_help_imports_no_command_module():
    modules = loaded("--help")
    assert not {"ascendconv.convert", "ascendconv.inspect", "ascendconv.verify"} & modules


@pytest.fixture(scope="module")
def dense_package(tmp_path_factory):
    out = tmp_path_factory.mktemp("startup") / "pkg"
    subprocess.run(
        [sys.executable, "-m", "ascendconv.cli", "convert", str(FIXTURES / "qwen3-dense-fp8"), str(out), "--quiet"],
        check=True,
        timeout=300,
    )
    return out


def test_verify_of_an_intact_package_only_hashes(dense_package):
    """`verify OUT` checks structure and checksums: BLAKE3, no numpy (its shards are not scanned)."""
    modules = loaded("verify", str(dense_package), "--quiet")
    assert {m.split(".")[0] for m in heavy(modules)} == {"blake3"}
    assert "ascendconv.verify.accuracy" not in modules


def test_the_probe_sees_numerics_when_a_command_uses_them(dense_package):
    """The checks above can fail: verify --source reads tensor values, so numpy is loaded."""
    modules = loaded("verify", str(dense_package), "--source", str(FIXTURES / "qwen3-dense-fp8"), "--quiet")
    assert {"numpy", "ascendconv.verify.accuracy"} <= modules


def test_exit_skips_the_final_garbage_collection():
    """The CLI freezes every live object at exit, so the interpreter's last collection does not
    walk numba's type system (0.1 s of a convert of the sample). Frozen by the exit handlers, which
    run before the collection; a command's own handlers, registered later, run before the freeze."""
    probe = (
        "import atexit, gc\n"
        "import ascendconv.cli\n"
        "atexit.register(lambda: print('frozen before my handler:', gc.get_freeze_count() > 0))\n"
        "import numba\n"
        "atexit._run_exitfuncs()\n"
        "print('frozen after:', gc.get_freeze_count() > 0)\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert run.stdout.splitlines() == ["frozen before my handler: False", "frozen after: True"]
