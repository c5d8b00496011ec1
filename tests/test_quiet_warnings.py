"""--quiet leaves out the tables, never the warnings: a CI run that passes it still sees what may
be wrong (on stderr, one line each); under --json they are in the object."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ascendconv.cli import app
from conftest import FIXTURES

runner = CliRunner()
DENSE = FIXTURES / "qwen3-dense-fp8"


def test_warnings_are_printed_under_quiet_and_kept_in_json(tmp_path):
    """A --quiet CI run still sees what may be wrong: one line per warning on stderr."""
    args = ["convert", str(DENSE), "--override", "model.layer.0.*=FLOAT", "--allow-unmatched-override", "--dry-run"]
    quiet = runner.invoke(app, [*args[:2], str(tmp_path / "q"), *args[2:], "--quiet"])
    assert quiet.exit_code == 0, quiet.output
    lines = [line for line in quiet.stderr.splitlines() if line.startswith("warning:")]
    assert lines == ["warning: --override model.layer.0.*=FLOAT: matches no linear of the source"], quiet.stderr
    assert quiet.stdout == ""
    as_json = runner.invoke(app, [*args[:2], str(tmp_path / "j"), *args[2:], "--json"])
    assert json.loads(as_json.stdout)["warnings"] == ["--override model.layer.0.*=FLOAT: matches no linear of the source"]
    written = runner.invoke(app, [*args[:2], str(tmp_path / "w"), *args[2:-1], "--quiet"])
    assert written.exit_code == 0 and "warning: --override model.layer.0.*" in written.stderr
    assert (tmp_path / "w" / "quant_model_description.json").exists()
