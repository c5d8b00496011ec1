"""Every error code an option-parser error prints under --json is one docs/json.md lists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ascendconv.cli import app

runner = CliRunner()
JSON_DOC = Path(__file__).resolve().parent.parent / "docs" / "json.md"


def documented_parser_errors() -> set[str]:
    row = next(line for line in JSON_DOC.read_text().splitlines() if line.startswith("| `error` |"))
    parser_part = row[row.index("an option-parser error") : row.index("or `Interrupted`")]
    return set(re.findall(r"`([A-Za-z]+)`", parser_part))


@pytest.mark.parametrize(
    "argv, code",
    [
        (["bogus"], "UsageError"),
        (["verify", "--bogus"], "NoSuchOption"),
        (["verify"], "MissingParameter"),
        (["inspect", ".", "--tp", "x"], "BadParameter"),
    ],
)
def test_parser_errors_are_the_documented_codes(argv, code):
    result = runner.invoke(app, [*argv, "--json"])
    data = json.loads(result.stdout)
    assert (result.exit_code, data["error"]) == (2, code)
    assert code in documented_parser_errors()


@pytest.mark.parametrize("as_json", [True, False])
def test_an_os_error_no_check_foresaw_is_a_named_environment_error(monkeypatch, as_json):
    """An I/O error of the disk (EIO) from deep in the library: FileSystemError naming the path and
    the system's words, exit 4, the envelope under --json; never a traceback and exit 1 (verify's
    'a check failed')."""
    import errno

    import ascendconv.inspect

    def failing(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error", "/data/ckpt/model-00001-of-00002.safetensors")

    monkeypatch.setattr(ascendconv.inspect, "inspect_path", failing)
    result = runner.invoke(app, ["inspect", "fixtures/qwen3-dense-fp8", *(["--json"] if as_json else [])])
    assert result.exit_code == 4
    message = "/data/ckpt/model-00001-of-00002.safetensors: Input/output error"
    if as_json:
        data = json.loads(result.stdout)
        assert (data["ok"], data["error"], data["message"], data["exit_code"]) == (False, "FileSystemError", message, 4)
        assert data["hint"].startswith("check the path and the disk")
    else:
        assert result.stdout == "" and f"error: {message}" in result.stderr
