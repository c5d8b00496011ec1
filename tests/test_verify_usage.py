"""verify's command line as a tester met it: options it ignored or took out of range, a file given
for the package, and the line that says where --tp came from."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from conftest import FIXTURES

runner = CliRunner()
DENSE = "qwen3-dense-fp8"


def verify_json(*args) -> tuple[int, dict]:
    result = runner.invoke(app, ["verify", *map(str, args), "--json"])
    return result.exit_code, json.loads(result.stdout)


def test_a_negative_top_is_a_usage_error(converted):
    code, data = verify_json(converted(DENSE), "--top", "-1")
    assert (code, data["error"]) == (2, "BadOptionError")
    assert "--top -1: must be 0 or more" in data["message"]


def test_sample_without_source_is_a_usage_error_not_ignored(converted):
    code, data = verify_json(converted(DENSE), "--sample", "0.5")
    assert (code, data["error"]) == (2, "BadOptionError")
    assert data["message"] == "--sample 0.5 needs --source SRC"


@pytest.mark.parametrize("flag", ["--exact", "--exact-full"])
def test_exact_without_source_names_the_flag_given(converted, flag):
    code, data = verify_json(converted(DENSE), flag)
    assert (code, data["error"]) == (2, "BadOptionError")
    assert (data["message"], data["hint"]) == (f"{flag} needs --source SRC", "pass the checkpoint the package came from")
