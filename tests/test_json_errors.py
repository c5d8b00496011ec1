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


SCHEMES = "'w8a8-mxfp8', 'w4a8-mxfp', 'w4a8-mxfp-moe', 'w4a16-mxfp4-moe', 'w4a4-mxfp4', 'w4a4-mxfp4-moe', 'native'"


@pytest.mark.parametrize("argv, command, code, message, hint, usage", [
    (["convert", "--json", "--bogus-option", "x", "y"], "convert", "NoSuchOption", "No such option: --bogus-option", None,
     "Usage: ascendconv convert [OPTIONS] {SRC} {OUT}\nTry 'ascendconv convert -h' for help.\n"),
    (["convert", "--json"], "convert", "MissingParameter", "Missing argument 'SRC'.", None,
     "Usage: ascendconv convert [OPTIONS] {SRC} {OUT}\nTry 'ascendconv convert -h' for help.\n"),
    (["convert", "x", "y", "--scheme", "w4a8-mxfp4", "--json"], "convert", "BadParameter",
     f"Invalid value for '--scheme': 'w4a8-mxfp4' is not one of {SCHEMES}.", "did you mean 'w4a8-mxfp'?",
     "Usage: ascendconv convert [OPTIONS] {SRC} {OUT}\nTry 'ascendconv convert -h' for help.\n"),
    (["bogus", "--json"], None, "UsageError", "No such command 'bogus'.", None,
     "Usage: ascendconv [OPTIONS] COMMAND [ARGS]...\nTry 'ascendconv -h' for help.\n"),
])
def test_a_parser_error_under_json_is_the_envelope_and_on_stderr_only_its_error_and_hint(argv, command, code, message, hint, usage):
    """Under --json Click's usage text ("Usage: ... Try ... Error: ...") came on stderr beside the
    envelope: stderr now reads as every other error's does under --json, `error:` and `hint:`."""
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert json.loads(result.stdout) == {"ok": False, "schema": 1, "command": command, "error": code,
                                         "message": message, "hint": hint, "exit_code": 2}
    assert result.stderr == f"error: {message}\n" + (f"hint: {hint}\n" if hint else "")
    # without --json: Click's usage text as it was, the hint after it, stdout empty
    plain = runner.invoke(app, [a for a in argv if a != "--json"], prog_name="ascendconv")
    assert plain.exit_code == 2 and plain.stdout == ""
    assert plain.stderr == f"{usage}\nError: {message}\n" + (f"hint: {hint}\n" if hint else "")


def test_a_parser_error_and_a_library_error_read_alike_on_stderr_under_json(tmp_path):
    library = runner.invoke(app, ["convert", str(tmp_path / "nowhere"), str(tmp_path / "out"), "--json"])
    parser = runner.invoke(app, ["convert", str(tmp_path / "nowhere"), str(tmp_path / "out"), "--tp", "x", "--json"])
    for result in (library, parser):
        data = json.loads(result.stdout)
        assert result.stderr == f"error: {data['message']}\n" + (f"hint: {data['hint']}\n" if data["hint"] else "")
