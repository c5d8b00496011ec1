"""Deterministic bytes: the same source and options give the same package, file for file (names,
modes and sha256), however the run reached the source and whatever wrote each file."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from ascendconv import assemble as assemble_module
from ascendconv.convert import ConvertOptions, convert
from ascendconv.io import writer as writer_module
from ascendconv.io.hfcache import resolve_source
from conftest import FIXTURES

DENSE = "qwen3-dense-fp8"
OPTIONS = dict(scheme="w4a8-mxfp", max_shard_size=200_000)


def package_hashes(root: Path) -> dict[str, tuple[str, str]]:
    """name -> (mode, sha256) of every file of a package, and the directory's own mode under '.'."""
    hashes = {".": (oct(stat.S_IMODE(root.stat().st_mode)), "")}
    for path in sorted(root.iterdir()):
        hashes[path.name] = (oct(stat.S_IMODE(path.stat().st_mode)), hashlib.sha256(path.read_bytes()).hexdigest())
    return hashes


def converted_from(src, out: Path, **options) -> dict[str, tuple[str, str]]:
    convert(src, out, ConvertOptions(**{**OPTIONS, **options}))
    return package_hashes(out)


def test_a_source_given_as_dot_or_through_a_link_writes_the_same_package(tmp_path, monkeypatch):
    """The provenance and the card named the source by the last part of SRC as typed: `convert .`
    recorded the name '' (the card's title ', AscendV1 ...', the command `ascendconv convert '' OUT`)
    and a symbolic link its own name, so the same checkpoint gave other bytes, and parts or a
    --resume run started from another spelling refused each other's work."""
    reference = converted_from(FIXTURES / DENSE, tmp_path / "ref")
    link = tmp_path / "current"
    link.symlink_to(FIXTURES / DENSE)
    assert converted_from(link, tmp_path / "via-link") == reference
    monkeypatch.chdir(FIXTURES / DENSE)
    assert converted_from(".", tmp_path / "via-dot") == reference


def hub_cache(root: Path, src: Path, commit: str) -> Path:
    """A Hugging Face cache holding `src` as Org/tiny at `commit` (refs/main), files linked to blobs."""
    repo = root / "models--Org--tiny"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for file in src.iterdir():
        data = file.read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / file.name).symlink_to(Path("../../blobs") / blob)
    return snapshot


def test_a_cached_snapshot_given_as_dot_or_through_a_link_is_its_repo(tmp_path, monkeypatch):
    """A snapshot reached through a symbolic link was no hub source (no base_model, the link's name),
    and `.` inside it recorded the source name ''."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = hub_cache(tmp_path / "hub", FIXTURES / DENSE, commit)
    reference = converted_from(resolve_source("Org/tiny"), tmp_path / "ref")
    link = tmp_path / "model"
    link.symlink_to(snapshot)
    assert converted_from(link, tmp_path / "via-link") == reference
    monkeypatch.chdir(snapshot)
    assert converted_from(".", tmp_path / "via-dot") == reference


@contextlib.contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.parametrize("direct", [False, True], ids=["page-cache", "o-direct"])
def test_every_file_has_one_mode_whether_converted_linked_or_copied(tmp_path, monkeypatch, direct):
    """Shards were created 0o666 and every other file 0o644 (both less the umask): under a umask that
    lets group or others write (002, the default of many distributions), the shards of a package
    were 0664 beside its 0644 JSON, and `assemble` across file systems (the shards copied, not
    linked) gave 0644 shards, so the same package differed from itself in `ls -l` and in a tar.
    Shards of either writer: through the page cache, and with O_DIRECT (those of 64 MiB or more)."""
    if direct:
        monkeypatch.setattr(writer_module, "DIRECT_IO_MIN_BYTES", 0)
    with umask(0o002):
        reference = converted_from(FIXTURES / DENSE, tmp_path / "ref")
        for i in (1, 2):
            convert(FIXTURES / DENSE, tmp_path / f"part{i}", ConvertOptions(**OPTIONS, part=(i, 2)))

        def no_link(*args, **kwargs):
            raise OSError(errno.EXDEV, "Invalid cross-device link")

        monkeypatch.setattr(assemble_module.os, "link", no_link)
        result = assemble_module.assemble(tmp_path / "copied", [tmp_path / "part1", tmp_path / "part2"])
    assert result.linked == 0
    assert package_hashes(tmp_path / "copied") == reference
    assert {mode for name, (mode, _) in reference.items() if name != "."} == {"0o644"}


@pytest.mark.parametrize("epoch", ["1764624600.5", "-1", "yesterday", "9" * 30, "\uff11\uff12\uff13"])
def test_a_malformed_source_date_epoch_is_refused_before_anything_is_written(tmp_path, monkeypatch, epoch):
    """SOURCE_DATE_EPOCH is what makes two runs byte-identical: a value that is not whole seconds was
    taken as unset (the date of the run, other bytes at every run, not a word said), and one past
    time_t ended the conversion, after every shard was written, in an OverflowError traceback."""
    from typer.testing import CliRunner

    from ascendconv.cli import app

    runner = CliRunner()
    assert runner.invoke(app, ["convert", str(FIXTURES / DENSE), str(tmp_path / "part"), "--part", "1/1", "--quiet"]).exit_code == 0
    monkeypatch.setenv("SOURCE_DATE_EPOCH", epoch)
    for args in (["convert", FIXTURES / DENSE, tmp_path / "out"], ["convert", FIXTURES / DENSE, tmp_path / "out", "--dry-run"],
                 ["assemble", tmp_path / "out", tmp_path / "part"]):
        result = runner.invoke(app, [*map(str, args), "--json"])
        assert result.exit_code == 2, result.output
        error = json.loads(result.stdout)
        assert error["error"] == "BadOptionError" and error["message"].startswith("SOURCE_DATE_EPOCH=")
        assert not (tmp_path / "out").exists()
