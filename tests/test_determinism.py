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


def parts_under(tmp_path: Path, masks: tuple[int, ...]) -> list[Path]:
    """Part i of len(masks) converted under umask masks[i - 1], as part jobs of other shells or
    containers are."""
    directories = []
    for i, mask in enumerate(masks, start=1):
        with umask(mask):
            convert(FIXTURES / DENSE, tmp_path / f"part{i}", ConvertOptions(**OPTIONS, part=(i, len(masks))))
        directories.append(tmp_path / f"part{i}")
    return directories


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_parts_of_other_umasks_assemble_into_the_package_of_the_assembling_umask(tmp_path, mask):
    """A linked shard is its part's file, and kept the mode its part job's umask gave it: parts made
    under umask 002 and 077 and assembled under 022 gave 0600 shards among 0644 ones and 0644 JSON.
    Each shard now has the mode of the package's other files, as a one-process run under the
    assembling umask writes it, and is still linked."""
    parts = parts_under(tmp_path, (0o002, 0o077))
    with umask(mask):
        reference = converted_from(FIXTURES / DENSE, tmp_path / "ref")
        result = assemble_module.assemble(tmp_path / "out", parts)
    assert package_hashes(tmp_path / "out") == reference
    assert result.linked == result.shards == sum(1 for name in reference if name.endswith(".safetensors"))
    assert reference["."][0] == oct(0o777 & ~mask)


def test_a_shard_linked_into_another_package_is_copied_not_changed_when_its_mode_differs(tmp_path):
    """A link shares its inode with every other name of it: setting the mode of a shard already linked
    into a first package would change that published package's modes too, so the second package,
    under another umask, gets copies (and the space check counts them)."""
    parts = parts_under(tmp_path, (0o022, 0o022))
    read = [assemble_module.read_part(p) for p in parts]
    with umask(0o022):
        first = assemble_module.assemble(tmp_path / "first", parts)
        linked_space = assemble_module.space_to_assemble(tmp_path / "second", read)
    with umask(0o077):
        private = converted_from(FIXTURES / DENSE, tmp_path / "private-ref")
        copied = sum(path.stat().st_size for path in (tmp_path / "first").glob("*.safetensors"))
        assert assemble_module.space_to_assemble(tmp_path / "second", read) == linked_space + copied
        second = assemble_module.assemble(tmp_path / "second", parts)
    assert (first.linked, second.linked) == (first.shards, 0)
    assert package_hashes(tmp_path / "second") == private
    assert {mode for name, (mode, _) in package_hashes(tmp_path / "first").items() if name != "."} == {"0o644"}


def test_a_part_shard_whose_mode_is_not_ours_to_change_is_copied(tmp_path, monkeypatch):
    """A part written by another user can be linkable (readable and writable by us) and still not
    ours to chmod: the package gets a copy of the package's mode."""

    def not_owner(*args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    parts = parts_under(tmp_path, (0o077, 0o077))
    monkeypatch.setattr(assemble_module.os, "chmod", not_owner)
    with umask(0o022):
        reference = converted_from(FIXTURES / DENSE, tmp_path / "ref")
        result = assemble_module.assemble(tmp_path / "out", parts)
    assert result.linked == 0
    assert package_hashes(tmp_path / "out") == reference
    assert {oct(stat.S_IMODE(path.stat().st_mode)) for path in tmp_path.glob("part*/*.safetensors")} == {"0o600"}


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
