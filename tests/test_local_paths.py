"""Paths given on the command line as a tester mistyped them: every command names the closest
directory beside a missing one, and says a file is not the directory it takes."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from conftest import FIXTURES

runner = CliRunner()


def error_of(*args, cwd, hub) -> dict:
    """The --json error envelope of a command run in `cwd` with an empty Hugging Face cache."""
    here = os.getcwd()
    os.chdir(cwd)
    try:
        result = runner.invoke(app, [*map(str, args), "--json"], env={"HF_HUB_CACHE": str(hub)})
    finally:
        os.chdir(here)
    data = json.loads(result.stdout)
    assert result.exit_code == data["exit_code"] == 3
    return data


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "fixtures" / "qwen3-moe-fp8").mkdir(parents=True)
    (tmp_path / "moe-w4").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    "command, typed, meant",
    [
        ("inspect", "{root}/fixtures/qwen3-moe-fp", "{root}/fixtures/qwen3-moe-fp8"),
        ("inspect", "./fixtures/qwen3-moe-fp", "fixtures/qwen3-moe-fp8"),
        ("inspect", "moe-w5", "moe-w4"),
        ("verify", "fixtures/qwen3-moe-fp", "fixtures/qwen3-moe-fp8"),
        ("verify", "{root}/moe-w5", "{root}/moe-w4"),
        ("convert", "moe-w5", "moe-w4"),
    ],
)
def test_a_mistyped_local_path_names_the_closest_directory_beside_it(workdir, command, typed, meant):
    args = [command, typed.format(root=workdir)] + (["out"] if command == "convert" else [])
    data = error_of(*args, cwd=workdir, hub=workdir / "hub")
    assert data["error"] == "NotFoundError" and "no such directory" in data["message"]
    assert data["hint"] == f"did you mean {meant.format(root=workdir)}?"


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_file_is_refused_as_not_the_directory_the_command_takes(converted, tmp_path, command):
    pkg = tmp_path / "pkg"
    shutil.copytree(converted("qwen3-dense-fp8"), pkg)
    data = error_of(command, pkg / "config.json", cwd=tmp_path, hub=tmp_path / "hub")
    assert data["error"] == "UnrecognizedCheckpointError"
    assert data["message"] == f"{pkg / 'config.json'}: is a file; {command} takes a directory"
    assert data["hint"] == f"did you mean {pkg}?"
