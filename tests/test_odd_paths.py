"""Odd but possible file-system conditions on the input side: names too long to exist, entries that
are not the regular files they stand for, and names that are not UTF-8. Each is a named error (or a
file left out, with why), never a traceback, and never a package missing what it should hold."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from conftest import FIXTURES
from robust_helpers import replace_by_no_regular_file

runner = CliRunner()
DENSE, MOE = "qwen3-dense-fp8", "qwen3-moe-fp8"
NOT_UTF8 = os.fsdecode(b"\xff")  # the byte 0xFF in a name, as Python holds it: '\udcff'


def envelope(*args, code: int | None = None) -> dict:
    result = runner.invoke(app, [*map(str, args), "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    data = json.loads(result.stdout)
    if code is not None:
        assert (result.exit_code, data.get("exit_code", 0)) == (code, code), result.stdout
    return data


def copy(name: str, target) -> "os.PathLike":
    shutil.copytree(FIXTURES / name, target)
    return target


@pytest.mark.parametrize("command", ["inspect", "verify", "convert", "convert --source", "verify --source", "assemble"])
def test_an_input_name_too_long_to_exist_is_not_found(tmp_path, command):
    long = tmp_path / ("a" * 300)
    args = {
        "inspect": ["inspect", long],
        "verify": ["verify", long],
        "convert": ["convert", long, tmp_path / "out"],
        "convert --source": ["convert", long, tmp_path / "out", "--dry-run"],
        "verify --source": ["verify", FIXTURES / DENSE, "--source", long],  # the source is resolved first
        "assemble": ["assemble", tmp_path / "out", long],
    }[command]
    data = envelope(*args, code=3)
    assert data["error"] == "NotFoundError" and data["message"].endswith(": no such directory"), data
    if command != "assemble":
        assert data["hint"] == "a name of 300 bytes; this file system allows 255: no such directory can exist; check the path"
    assert not (tmp_path / "out").exists()


def test_a_report_name_too_long_to_write_is_refused_before_the_checks(converted, tmp_path):
    report = tmp_path / ("r" * 300 + ".html")
    data = envelope("verify", converted(DENSE), "--report", report, code=2)
    assert data["error"] == "OutputPathError" and "cannot be written (File name too long)" in data["message"]
    assert data["hint"] == "choose a shorter name"  # not 'a directory you may write to'


@pytest.mark.parametrize("kind", ["dangling link", "FIFO", "directory"])
def test_a_shard_that_is_no_regular_file_without_an_index_is_missing(tmp_path, kind):
    """Without an index the shards are the *.safetensors files: one that is a dangling link (a
    download not finished) was skipped, and the package came out without its tensors (lm_head and
    the final norm here), verify --source passing it."""
    src = copy(MOE, tmp_path / "src")
    (src / "model.safetensors.index.json").unlink()
    found = replace_by_no_regular_file(src / "model-00003-of-00003.safetensors", kind, tmp_path)
    for args in (["convert", src, tmp_path / "out"], ["inspect", src]):
        data = envelope(*args, code=3)
        assert data["error"] == "MissingShardError"
        assert data["message"] == f"{src}: shard 'model-00003-of-00003.safetensors' {found}"
        assert data["hint"] == "the download is incomplete; fetch the missing shard"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["dangling link", "FIFO", "directory"])
def test_an_index_that_is_no_regular_file_is_refused_not_taken_for_none(tmp_path, kind):
    """An index that is a dangling link (its blob not downloaded), a FIFO or a directory was taken
    for no index: the shards there were converted as the whole checkpoint, and with the last one not
    downloaded the package came out without lm_head and the final norm, exit 0, verify passing it."""
    src = copy(MOE, tmp_path / "src")
    index = src / "model.safetensors.index.json"
    (src / "model-00003-of-00003.safetensors").unlink()
    found = replace_by_no_regular_file(index, kind, tmp_path)
    for args in (["convert", src, tmp_path / "out"], ["convert", src, tmp_path / "out", "--dry-run"], ["inspect", src]):
        data = envelope(*args, code=3)
        assert data["error"] == "IndexMismatchError"
        assert data["message"] == f"{index} {found}: it names the shards, so a missing one cannot be told"
        assert data["hint"] == "the download is incomplete; fetch the index (or remove it where the checkpoint has none)"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["directory", "link loop", "dangling link"])
def test_a_config_json_that_is_no_regular_file_is_named_as_such(tmp_path, kind):
    """It was "no config.json", with the hint to pass a directory holding one: the directory holds one."""
    src = copy(DENSE, tmp_path / "src")
    config = src / "config.json"
    config.unlink()
    if kind == "directory":
        config.mkdir()
    elif kind == "link loop":
        config.symlink_to(src / "loop")
        (src / "loop").symlink_to(config)
    else:
        config.symlink_to(tmp_path / "gone.json")
    why = {
        "directory": "is a directory, not a regular file",
        "link loop": "cannot read (Too many levels of symbolic links)",
        "dangling link": "cannot read (No such file or directory)",
    }[kind]
    data = envelope("inspect", src, code=3)
    assert (data["error"], data["message"]) == ("ConfigError", f"{config}: {why}")


def test_a_shard_name_not_utf8_is_refused_before_anything_is_written(tmp_path):
    """The provenance, UTF-8 JSON, names each source shard: the run ended in a UnicodeEncodeError
    traceback (exit 1). inspect, which writes nothing, still reads the checkpoint."""
    src = copy(DENSE, tmp_path / "src")
    os.rename(src / "model.safetensors", src / f"model{NOT_UTF8}.safetensors")
    for extra in ([], ["--dry-run"]):
        data = envelope("convert", src, tmp_path / "out", *extra, code=3)
        assert data["error"] == "UnrecognizedCheckpointError"
        assert data["message"] == (
            f"{src}: shard 'model\\udcff.safetensors' has a name that is not UTF-8, which the package's provenance cannot record"
        )
        assert data["hint"].startswith("rename the shard to a UTF-8 name")
    assert not (tmp_path / "out").exists()
    assert envelope("inspect", src, code=0)["ok"] is True


def test_a_companion_file_named_not_utf8_is_left_out_with_why(tmp_path):
    src = copy(DENSE, tmp_path / "src")
    (src / f"notes{NOT_UTF8}.json").write_text("{}")
    data = envelope("convert", src, tmp_path / "out", code=0)
    assert "notes\udcff.json is not carried into the package: its name is not UTF-8" in data["warnings"]
    assert not any(name.startswith("notes") for name in os.listdir(tmp_path / "out"))
    assert envelope("verify", tmp_path / "out", "--source", src, code=0)["ok"] is True


def test_a_source_directory_named_not_utf8_converts_and_verifies(tmp_path):
    src = copy(DENSE, tmp_path / f"dense{NOT_UTF8}")
    out = tmp_path / "out"
    envelope("convert", src, out, code=0)
    provenance = json.loads((out / "ascendconv_provenance.json").read_text(encoding="utf-8"))
    assert provenance["source"]["name"] == "dense\ufffd"
    assert provenance["command"].startswith("ascendconv convert 'dense\ufffd' OUT ")
    assert envelope("verify", out, "--source", src, code=0)["ok"] is True


@pytest.mark.parametrize("command", ["inspect", "verify", "convert"])
@pytest.mark.parametrize("kind", ["dangling", "loop"])
def test_a_path_that_is_a_broken_link_is_named_as_one(tmp_path, command, kind):
    """It was "no such directory", hinted "TMP holds no directory of that name" (inspect, convert) or
    "is not a directory" with "did you mean TMP?", the parent (verify)."""
    link = tmp_path / "model"
    target = tmp_path / "gone" if kind == "dangling" else tmp_path / "other"
    link.symlink_to(target)
    if kind == "loop":
        target.symlink_to(link)
    data = envelope(command, link, *([tmp_path / "out"] if command == "convert" else []), code=3)
    assert (data["error"], data["message"]) == ("NotFoundError", f"{link}: no such directory")
    assert data["hint"] == f"{link} is a symbolic link to {target}, which leads to no directory; fix the link"


def test_a_float_checkpoint_without_a_linear_is_named(tmp_path):
    """NoQuantizableLinearError had no test: a config without quantization_config, and only a norm
    (inspect reports such a checkpoint; convert refuses it)."""
    from robust_helpers import save_tensors

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}))
    save_tensors(src / "model.safetensors", {"model.norm.weight": ("BF16", (4,), bytes(8))})
    for args in (["convert", src, tmp_path / "out"], ["convert", src, tmp_path / "out", "--dry-run"]):
        data = envelope(*args, code=3)
        assert data["error"] == "NoQuantizableLinearError"
        assert data["message"].startswith(f"{src}: no quantizable float linear")
    assert not (tmp_path / "out").exists()


def test_a_cached_file_whose_blob_is_gone_is_refused_not_left_out(tmp_path, monkeypatch):
    """A snapshot file links to its blob; with the blob gone (a cache cleaned by hand, a download cut
    short) tokenizer.json was left out with a warning that it 'is not a regular file', and the
    package came out without it, exit 0, verify passing it."""
    repo = tmp_path / "hub" / "models--Org--Tiny"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for number, file in enumerate(sorted((FIXTURES / DENSE).iterdir())):
        shutil.copyfile(file, repo / "blobs" / f"blob{number}")
        (snapshot / file.name).symlink_to(f"../../blobs/blob{number}")
    blob = (snapshot / "tokenizer.json").resolve()
    blob.unlink()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    for args in (["convert", "Org/Tiny", tmp_path / "out"], ["convert", "Org/Tiny", tmp_path / "out", "--dry-run"], ["inspect", "Org/Tiny"]):
        data = envelope(*args, code=3)
        assert data["error"] == "NotCachedError"
        assert data["message"] == f"{snapshot / 'tokenizer.json'}: the Hugging Face cache holds no blob for it ({blob} does not exist)"
        assert data["hint"] == f"the cache is damaged or a download was cut short: `hf download Org/Tiny --revision {commit}` fetches the missing file"
    assert not (tmp_path / "out").exists()


def test_a_dangling_link_beside_the_shards_is_left_out_saying_so(tmp_path):
    src = copy(DENSE, tmp_path / "src")
    (src / "extra.json").symlink_to("gone.json")
    data = envelope("convert", src, tmp_path / "out", code=0)
    # it was "it is not a regular file"
    assert data["skipped_files"] == {"extra.json": f"it is a symbolic link to {src / 'gone.json'}, which does not exist"}
    assert not os.path.lexists(tmp_path / "out" / "extra.json")
