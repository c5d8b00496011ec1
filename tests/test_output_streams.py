"""stdout and stderr as a CI job may hand them over: a full disk under the log, an odd terminal
width, in real processes (the interpreter's own buffering and its flush at exit included)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES

MOE = FIXTURES / "qwen3-moe-fp8"
FULL = Path("/dev/full")  # every write fails with ENOSPC
needs_dev_full = pytest.mark.skipif(not FULL.exists(), reason="no /dev/full on this system")


def ascendconv(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env: dict | None = None) -> subprocess.CompletedProcess:
    """The command line in its own process, its streams buffered as a CI job's are (no
    PYTHONUNBUFFERED)."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run([sys.executable, "-m", "ascendconv", *map(str, args)], stdout=stdout, stderr=stderr,
                          env={**environment, **(env or {})}, timeout=300)


@needs_dev_full
@pytest.mark.parametrize("as_json", [False, True])
def test_a_stderr_that_cannot_be_written_costs_the_log_not_the_conversion(tmp_path, as_json):
    """The disk under the log is full: the heartbeat's failed write was taken for the package's
    (NoSpaceError, 'the file system is full ... the package was not written'), then reporting that
    failed too: a traceback and exit 1, while the envelope said exit_code 4."""
    out = tmp_path / "out"
    with FULL.open("w") as full:
        result = ascendconv("convert", MOE, out, *(["--json"] if as_json else []), stderr=full)
    assert result.returncode == 0, result.stdout.decode()
    assert (out / "quant_model_description.json").is_file()
    if as_json:
        envelope = json.loads(result.stdout)
        assert (envelope["ok"], envelope["command"], envelope["output"]) == (True, "convert", str(out))
    else:
        assert result.stdout.decode().splitlines()[-1] == f"then: vllm serve {out} --quantization ascend --tensor-parallel-size 1"


@needs_dev_full
@pytest.mark.parametrize("args, code, error", [
    (["inspect", "no-such-checkpoint", "--json"], 3, "NotFoundError"),
    (["inspect", MOE, "--bogus", "--json"], 2, "NoSuchOption"),
    (["inspect", MOE, "--bogus"], 2, None),
])
def test_an_error_keeps_its_exit_code_when_stderr_cannot_be_written(tmp_path, args, code, error):
    with FULL.open("w") as full:
        result = ascendconv(*args, stderr=full)
    assert result.returncode == code
    if error:
        envelope = json.loads(result.stdout)
        assert (envelope["error"], envelope["exit_code"]) == (error, code)
    else:
        assert result.stdout == b""


def test_a_terminal_width_of_zero_still_prints_everything(tmp_path):
    """COLUMNS=0 (a shell that has not measured its window yet): rich took it for a width of 0 and
    printed nothing at all, an error's message and hint included; only the exit code was left."""
    missing = ascendconv("inspect", tmp_path / "ckpt", env={"COLUMNS": "0"})
    assert missing.returncode == 3
    assert missing.stderr.decode().splitlines() == [
        f"error: {tmp_path / 'ckpt'}: no such directory",
        f"hint: {tmp_path} holds no directory of that name; pass a checkpoint directory or a cached repo id",
    ]
    shown = ascendconv("inspect", MOE, env={"COLUMNS": "0"})
    assert shown.returncode == 0
    assert shown.stdout == ascendconv("inspect", MOE).stdout and shown.stdout.startswith(b"qwen3-moe-fp8  Hugging Face block FP8 checkpoint\n")


STDOUT_FULL = [
    "error: stdout: cannot be written (No space left on device)",
    "hint: free space where stdout is redirected, or redirect it elsewhere; what the command did stands "
    "(a package it wrote is in place), only its output is lost",
]


@needs_dev_full
@pytest.mark.parametrize("args", [["inspect", MOE], ["inspect", MOE, "--json"], ["--version"]])
def test_a_stdout_that_cannot_be_written_is_a_named_environment_error(args):
    """stdout redirected to a full disk: a traceback and exit 1 (verify's 'a check failed'), or,
    for output small enough to stay buffered, the interpreter's 'Exception ignored' and exit 120."""
    with FULL.open("w") as full:
        result = ascendconv(*args, stdout=full)
    assert result.returncode == 4
    assert result.stderr.decode().splitlines() == STDOUT_FULL


@needs_dev_full
def test_an_error_whose_envelope_cannot_be_written_is_still_told_on_stderr(tmp_path):
    with FULL.open("w") as full:
        result = ascendconv("inspect", tmp_path / "ckpt", "--json", stdout=full)
    assert result.returncode == 4
    assert result.stderr.decode().splitlines() == [
        f"error: {tmp_path / 'ckpt'}: no such directory",
        f"hint: {tmp_path} holds no directory of that name; pass a checkpoint directory or a cached repo id",
        *STDOUT_FULL,
    ]


@needs_dev_full
def test_a_conversion_whose_summary_cannot_be_printed_leaves_its_package(tmp_path):
    out = tmp_path / "out"
    with FULL.open("w") as full:
        result = ascendconv("convert", MOE, out, stdout=full)
    assert result.returncode == 4
    assert result.stderr.decode().splitlines()[-2:] == STDOUT_FULL  # after the heartbeat
    assert (out / "quant_model_description.json").is_file()


def test_a_character_stdout_cannot_encode_is_escaped_never_a_traceback(tmp_path):
    """An ASCII stdout (PYTHONIOENCODING=ascii) could not take a table's rule, a strict UTF-8 one
    (PYTHONIOENCODING=utf-8, a non-UTF-8 system locale) a directory name's undecodable byte:
    UnicodeEncodeError, exit 1, which for verify says a check failed."""
    ascii_run = ascendconv("inspect", MOE, env={"PYTHONIOENCODING": "ascii"})
    assert ascii_run.returncode == 0, ascii_run.stderr.decode()[-500:]
    assert b"\ndtype    tensors       bytes\n" + b"-" * 28 + b"\n" in ascii_run.stdout  # the rule drawn in ASCII
    assert b"\\u" not in ascii_run.stdout

    odd = tmp_path / os.fsdecode(b"ckpt\xff")
    shutil.copytree(MOE, odd)
    strict_run = ascendconv("inspect", odd, env={"PYTHONIOENCODING": "utf-8"})
    assert strict_run.returncode == 0, strict_run.stderr.decode()[-500:]
    assert strict_run.stdout.splitlines()[0] == b"ckpt\\udcff  Hugging Face block FP8 checkpoint"
