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


BAD_TP = "Invalid value for '--tp': 'z' is not a valid int."


@pytest.mark.parametrize("argv, as_json", [
    (["convert", "--json", "x", "y", "--tp", "z"], True),
    (["convert", "x", "--json", "y", "--tp", "z"], True),
    (["convert", "x", "y", "--tp", "z", "--json"], True),
    (["convert", "x", "y", "--override", "a=FLOAT", "--json", "--tp", "z"], True),
    (["convert", "x", "y", "--override", "--json", "--tp", "z"], False),  # --override's value
    (["convert", "x", "y", "--override", "--json", "--json", "--tp", "z"], True),  # its value, then the flag
    (["convert", "--tp", "z", "x", "--", "--json"], False),  # OUT, after a bare --
    (["convert", "--tp", "z", "--", "x", "--json"], False),
    (["verify", "--report", "--json", "--tp", "z", "pkg"], False),  # --report's value
    (["verify", "--source", "--json", "pkg", "--tp", "z"], False),  # --source's value
])
def test_json_is_the_flag_click_parses_not_a_value_or_an_argument_named_so(argv, as_json):
    """--json was looked for anywhere on the line: an option's value or an argument after `--`
    spelled '--json' made a parser error print the envelope instead of Click's usage text."""
    result = runner.invoke(app, argv, prog_name="ascendconv")
    assert result.exit_code == 2
    if as_json:
        assert json.loads(result.stdout) == {"ok": False, "schema": 1, "command": argv[0], "error": "BadParameter",
                                             "message": BAD_TP, "hint": None, "exit_code": 2}
        assert result.stderr == f"error: {BAD_TP}\n"
    else:
        arguments = "{SRC} {OUT}" if argv[0] == "convert" else "{OUT}"
        assert result.stdout == ""
        assert result.stderr == (f"Usage: ascendconv {argv[0]} [OPTIONS] {arguments}\n"
                                 f"Try 'ascendconv {argv[0]} -h' for help.\n\nError: {BAD_TP}\n")


@pytest.mark.parametrize("argv, as_json", [
    (["verify", "--json", "pkg"], True),
    (["verify", "pkg", "--json"], True),
    (["verify", "--source", "--json", "pkg"], False),
    (["verify", "--", "--json"], False),
])
def test_json_of_a_library_error_is_the_flag_click_parses(monkeypatch, argv, as_json):
    """The CLI's net for MemoryError, which reads the line itself, as the options parsed by Click do."""
    import ascendconv.io.hfcache
    import ascendconv.verify

    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(ascendconv.verify, "local_directory", no_memory)
    monkeypatch.setattr(ascendconv.io.hfcache, "resolve_source", no_memory)
    result = runner.invoke(app, argv)
    assert result.exit_code == 4
    message = "no memory left to verify"
    if as_json:
        data = json.loads(result.stdout)
        assert (data["ok"], data["command"], data["error"], data["message"]) == (False, "verify", "OutOfMemoryError", message)
    else:
        assert result.stdout == ""
    assert result.stderr.startswith(f"error: {message}\n")


def test_a_library_error_with_json_as_a_value_or_after_dashes_stays_plain(tmp_path):
    nowhere = str(tmp_path / "nowhere")
    message = f"{nowhere}: no such directory"
    for argv in (["convert", nowhere, str(tmp_path / "out"), "--override", "--json=FLOAT"],
                 ["convert", nowhere, "--", "--json"]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 3 and result.stdout == "" and result.stderr.startswith(f"error: {message}\n")
    for argv in (["convert", "--json", nowhere, str(tmp_path / "out")], ["convert", nowhere, str(tmp_path / "out"), "--json"]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 3 and json.loads(result.stdout)["message"] == message


def test_json_given_before_the_command_is_an_envelope_naming_where_it_goes():
    result = runner.invoke(app, ["--json", "convert", "x", "y"], prog_name="ascendconv")
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert (data["command"], data["error"], data["exit_code"]) == ("convert", "NoSuchOption", 2)
    assert data["message"] == "No such option: --json (Possible options: --version)"
    assert data["hint"] == "--json is an option of each command: give it after the command's name, e.g. ascendconv convert --json SRC OUT"
    assert result.stderr == f"error: {data['message']}\nhint: {data['hint']}\n"


@pytest.mark.parametrize("argv, param", [
    (["verify", ""], "'OUT'"),
    (["verify", "fixtures/qwen3-dense-fp8", "--source", ""], "'--source'"),
    (["verify", "fixtures/qwen3-dense-fp8", "--report", ""], "'--report'"),
    (["inspect", ""], "'PATH'"),
    (["convert", "", "out"], "'SRC'"),
    (["convert", "fixtures/qwen3-dense-fp8", ""], "'OUT'"),
    (["assemble", "", "part"], "'OUT'"),
    (["assemble", "out", ""], "'PARTDIR...'"),
])
def test_an_empty_path_is_a_usage_error_never_the_current_directory(argv, param, tmp_path, monkeypatch):
    """`verify "$OUT"` with OUT unset: Path('') is '.', so the current directory was verified (a
    package there passed, exit 0), inspected or converted in the place of the one meant."""
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    result = runner.invoke(app, [*argv, "--json"])
    data = json.loads(result.stdout)
    assert (result.exit_code, data["error"], data["exit_code"]) == (2, "BadParameter", 2)
    assert data["message"] == f"Invalid value for {param}: an empty path (an unset variable?); write '.' for the current directory"


def test_an_empty_ray_address_is_refused_never_a_run_without_ray():
    """`--ray-address "$RAY_ADDRESS"` with the variable unset converted on this machine alone."""
    result = runner.invoke(app, ["convert", "fixtures/qwen3-dense-fp8", "out", "--ray-address", "", "--dry-run", "--json"])
    data = json.loads(result.stdout)
    assert (result.exit_code, data["error"], data["message"]) == (2, "BadOptionError", "--ray-address '': not a Ray address")


def _interrupted_while_importing():
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as exc:  # numpy, interrupted while imported, raises ImportError from it
        raise ImportError("numpy._core.umath failed to import") from exc


@pytest.mark.parametrize("raised", [KeyboardInterrupt, _interrupted_while_importing], ids=["ctrl-c", "ctrl-c-in-an-import"])
def test_a_ctrl_c_outside_the_library_call_is_an_interrupt_not_a_failure(monkeypatch, tmp_path, raised):
    """A Ctrl-C in a command's own lazy imports, before the library call: Click's 'Aborted!' and exit
    1 (verify's 'a check failed'), or, inside numpy's import, a traceback of ImportError and exit 1;
    under --json no envelope."""
    import ascendconv.cli.inspect as inspect_command

    def interrupted():
        if raised is KeyboardInterrupt:
            raise KeyboardInterrupt
        raised()

    monkeypatch.setattr(inspect_command, "header_only_process", interrupted)
    result = runner.invoke(app, ["inspect", str(tmp_path), "--json"])
    assert result.exit_code == 130, result.output
    assert json.loads(result.stdout) == {
        "ok": False, "schema": 1, "command": "inspect", "error": "Interrupted", "message": "interrupted",
        "hint": None, "exit_code": 130,
    }
    assert result.stderr == "interrupted\n"  # no trailing space where no signal is named


def test_a_ctrl_c_while_the_line_is_parsed_is_an_interrupt(monkeypatch):
    """typer's handling around the parse of the line up to the command's name exited 130 without a
    word or an envelope."""
    from typer.core import TyperGroup

    def interrupted(self, ctx, args):
        raise KeyboardInterrupt

    monkeypatch.setattr(TyperGroup, "parse_args", interrupted)
    result = runner.invoke(app, ["inspect", "fixtures/qwen3-dense-fp8", "--json"])
    assert (result.exit_code, result.stderr) == (130, "interrupted\n")
    assert json.loads(result.stdout) == {
        "ok": False, "schema": 1, "command": "inspect", "error": "Interrupted", "message": "interrupted",
        "hint": None, "exit_code": 130,
    }
