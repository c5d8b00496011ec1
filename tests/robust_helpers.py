"""Helpers of the robustness tests: raw header surgery and running the CLI in and out of process."""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from ascendconv.cli import app

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent

# What an error report may be called: every AscendconvError subclass (no KeyError, TypeError, ...).
EXIT_CODES = {"convert": (0, 2, 3, 4), "inspect": (0, 2, 3), "verify": (0, 1, 2, 3), "assemble": (0, 2, 3, 4)}


def project_error_names() -> set[str]:
    import ascendconv.errors as errors

    return {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.AscendconvError)
    }


def invoke(*args: str):
    """Run the CLI in process; returns the CliRunner result (stdout and stderr apart)."""
    return runner.invoke(app, [str(a) for a in args])


def assert_clean(result, command: str) -> None:
    """The command ended as the tool means to: a known exit code, a named error, no traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{command} raised {type(result.exception).__name__}: {result.exception}\n{result.output[-2000:]}"
    )
    assert result.exit_code in EXIT_CODES[command], (result.exit_code, result.output[-2000:])
    assert "Traceback" not in result.output
    if result.exit_code in (3, 4):
        assert "error:" in result.stderr
    if result.exit_code == 2:  # ours ("error: ...") or typer's ("Invalid value ...")
        assert "error:" in result.stderr or "Invalid value" in result.stderr


def json_error(result) -> dict:
    return json.loads(result.stdout.strip().splitlines()[0])


def run_cli(*args: str, timeout: float = 120, preexec_fn=None) -> subprocess.CompletedProcess:
    """Run `python -m ascendconv.cli` in a real process, killed after `timeout` seconds."""
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "ascendconv.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        preexec_fn=preexec_fn,
        cwd=REPO,
    )


def read_raw_header(path: Path) -> tuple[bytes, bytes]:
    """(header JSON bytes, data bytes) of a safetensors file."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8 : 8 + n], raw[8 + n :]


def write_raw_header(path: Path, header: bytes, data: bytes) -> None:
    header += b" " * (-(8 + len(header)) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def edit_header(path: Path, edit) -> None:
    """Rewrite the header of a safetensors file with edit(header_dict); the data stays."""
    header, data = read_raw_header(path)
    parsed = json.loads(header)
    edit(parsed)
    write_raw_header(path, json.dumps(parsed).encode(), data)


@contextlib.contextmanager
def any_int_digits():
    """Lift Python's int-string digit limit (3.11+, and late 3.10 releases) for writing hostile JSON."""
    limit = getattr(sys, "get_int_max_str_digits", lambda: None)()
    if limit is not None:
        sys.set_int_max_str_digits(0)
    try:
        yield
    finally:
        if limit is not None:
            sys.set_int_max_str_digits(limit)


def edit_json(path: Path, edit) -> None:
    """Rewrite a JSON file with edit(data) (in place, or its return value); integers of any length."""
    with any_int_digits():
        data = json.loads(path.read_text())
        result = edit(data)
        path.write_text(json.dumps(data if result is None else result))


def dumps_any(data) -> bytes:
    """json.dumps of data that may hold integers beyond Python's digit limit."""
    with any_int_digits():
        return json.dumps(data).encode()


def save_tensors(path: Path, tensors: dict) -> None:
    """conftest.save_shard that also takes empty tensors (the writer expects no bytes for them)."""
    from ascendconv.io.writer import ShardWriter, TensorSpec

    writer = ShardWriter(path, [TensorSpec(n, d, tuple(s)) for n, (d, s, _) in tensors.items()])
    for name, (_, _, data) in tensors.items():
        if data:
            writer.write(name, data)
    writer.close()


def tree_snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """relative path -> (size, mtime_ns) of every file under root: to prove a tree untouched."""
    return {
        str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if not p.is_dir()
    }


def replace_by_no_regular_file(path, kind: str, tmp_path) -> str:
    """`path` made (in place of any file there) a dangling link (a download not finished), a FIFO or a
    directory; returns how the shard errors say what it is."""
    if os.path.lexists(path):
        path.unlink()
    if kind == "dangling link":
        path.symlink_to(tmp_path / "blob-not-downloaded")
    elif kind == "FIFO":
        os.mkfifo(path)
    else:
        path.mkdir()
    return "is a symbolic link to a file that does not exist" if kind == "dangling link" else "is not a regular file"
