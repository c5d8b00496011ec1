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
