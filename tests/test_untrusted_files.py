"""Files of ours that someone else may have replaced or planted (a kept staging, its ledger, a part's
manifest and shards, a copied source file, an HF refs/ file): never followed through a symlink where
we write, never read from a FIFO or a device, bounded in size and depth, each ending at once in a
named error; and nothing half-written at OUT."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ascendconv.assemble import link_or_copy
from ascendconv.cli import app
from ascendconv.convert import ConvertOptions, convert
from ascendconv.errors import CopiedFileError, NotCachedError, ShardChecksumError
from ascendconv.io.files import MAX_COPIED_BYTES, copy_regular, created_mode, read_regular_bytes
from ascendconv.io.hfcache import resolve_source
from ascendconv.io.outdir import STAGING_TAG
from ascendconv.resume import LEDGER_NAME, write_json_atomic
from conftest import FIXTURES
from robust_helpers import run_cli

runner = CliRunner()
DENSE = "qwen3-dense-fp8"
SHARD_LIMIT = 150_000  # the dense fixture in 4 to 6 shards
DEEP = b"[" * 100_000 + b"]" * 100_000


def plant(path: Path, kind: str) -> None:
    """Put a FIFO, a link to /dev/zero or JSON nested 100,000 deep where a file of ours should be."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(DEEP)


def test_regular_reads_refuse_fifos_devices_links_and_size(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "big").write_bytes(b"x" * 101)
    (tmp_path / "link").symlink_to(tmp_path / "big")
    with pytest.raises(CopiedFileError, match="is a FIFO"):
        read_regular_bytes(tmp_path / "fifo", 100, CopiedFileError)
    with pytest.raises(CopiedFileError, match="is a character device"):
        copy_regular(tmp_path / "zero", tmp_path / "copy", CopiedFileError)
    with pytest.raises(CopiedFileError, match="101 bytes, more than the 100 bytes"):
        read_regular_bytes(tmp_path / "big", 100, CopiedFileError)
    with pytest.raises(CopiedFileError, match="is a symbolic link"):
        read_regular_bytes(tmp_path / "link", 1000, CopiedFileError, follow=False)
    assert read_regular_bytes(tmp_path / "link", 1000, CopiedFileError) == b"x" * 101
    assert not (tmp_path / "copy").exists()


def test_a_copy_never_writes_through_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "source").write_bytes(b"new content")
    (tmp_path / "target").symlink_to(victim)
    with pytest.raises(FileExistsError):
        copy_regular(tmp_path / "source", tmp_path / "target", CopiedFileError)
    assert victim.read_bytes() == b"precious"


def test_the_ledger_is_replaced_without_writing_through_a_planted_temporary(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / f"{LEDGER_NAME}.tmp").symlink_to(victim)
    write_json_atomic(tmp_path / LEDGER_NAME, {"shards": {}})
    assert victim.read_bytes() == b"precious"
    assert json.loads((tmp_path / LEDGER_NAME).read_text()) == {"shards": {}}
    assert sorted(p.name for p in tmp_path.iterdir()) == [LEDGER_NAME, "victim"]


def kept_staging(tmp_path: Path) -> tuple[Path, Path]:
    """OUT and a kept staging of a --resume run stopped half-way."""
    out = tmp_path / "out"

    def recorded() -> int:
        for ledger in tmp_path.glob(f".out{STAGING_TAG}*/{LEDGER_NAME}"):
            with contextlib.suppress(OSError, ValueError):
                return len(json.loads(ledger.read_text())["shards"])
        return 0

    def stop(done, total):
        if done > total // 2:
            # shards are closed by the writer thread, behind the progress: let two finish first
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and recorded() < 2:
                time.sleep(0.01)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(FIXTURES / DENSE, out, ConvertOptions(max_shard_size=SHARD_LIMIT, resume=True), stop)
    (staging,) = tmp_path.glob(f".out{STAGING_TAG}*")
    return out, staging


@pytest.mark.parametrize("kind", ["fifo", "zero", "deep"])
def test_a_hostile_resume_ledger_ends_at_once_with_a_named_error(tmp_path, kind):
    out, staging = kept_staging(tmp_path)
    plant(staging / LEDGER_NAME, kind)
    result = run_cli("convert", FIXTURES / DENSE, out, "--resume", "--json", "--max-shard-size", "150KB", timeout=60)
    assert result.returncode == 3, result.stderr
    error = json.loads(result.stdout.splitlines()[0])
    assert error["error"] == "ResumeLedgerError" and str(staging / LEDGER_NAME) in error["message"]
    assert "--overwrite" in error["hint"] and "Traceback" not in result.stderr
    assert not out.exists()
    # --overwrite discards that staging and converts afresh
    result = run_cli("convert", FIXTURES / DENSE, out, "--resume", "--overwrite", "--quiet", "--max-shard-size", "150KB")
    assert result.returncode == 0, result.stderr
    assert not list(tmp_path.glob(f".out{STAGING_TAG}*"))


def test_a_kept_shard_replaced_by_a_symlink_or_a_hard_link_is_converted_again(tmp_path):
    out, staging = kept_staging(tmp_path)
    ledger = json.loads((staging / LEDGER_NAME).read_text())
    first, second = sorted(ledger["shards"])[:2]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(staging / first, elsewhere / first)
    (staging / first).symlink_to(elsewhere / first)  # the same bytes, but a link into someone's directory
    os.link(staging / second, elsewhere / second)  # a second name someone else could write through
    result = convert(FIXTURES / DENSE, out, ConvertOptions(max_shard_size=SHARD_LIMIT, resume=True))
    assert first not in result.reused_shards and second not in result.reused_shards
    for name in (first, second):
        st = os.lstat(out / name)
        assert not (out / name).is_symlink() and st.st_nlink == 1
    assert (elsewhere / first).exists() and (elsewhere / second).exists()  # not ours: left as they were


def test_a_kept_staging_of_another_user_is_not_adopted(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the staging to another user")
    out, staging = kept_staging(tmp_path)
    os.chown(staging, 65534, 65534)
    result = runner.invoke(app, ["convert", str(FIXTURES / DENSE), str(out), "--resume", "--quiet", "--max-shard-size", "150KB"])
    assert result.exit_code == 2 and "belongs to user 65534" in result.stderr, result.output
    assert not out.exists() and staging.is_dir()


def test_a_failed_resume_run_says_where_its_work_is_kept(tmp_path, monkeypatch):
    out, staging = kept_staging(tmp_path)
    import ascendconv.convert as convert_module

    def fail(*args, **kwargs):
        from ascendconv.errors import NoSpaceError

        raise NoSpaceError(f"{out}: no space left")

    monkeypatch.setattr(convert_module, "write_package_files", fail)
    result = runner.invoke(app, ["convert", str(FIXTURES / DENSE), str(out), "--resume", "--quiet", "--max-shard-size", "150KB"])
    assert result.exit_code == 4
    text = " ".join(result.stderr.split())
    assert f"finished shards are kept in {staging}" in text and "--resume reuses them" in text


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    root = tmp_path_factory.mktemp("parts")
    made = [root / f"p{i}" for i in (1, 2)]
    for i, directory in enumerate(made, start=1):
        convert(FIXTURES / DENSE, directory, ConvertOptions(max_shard_size=SHARD_LIMIT, part=(i, 2)))
    return made


def copied_parts(parts: list[Path], tmp_path: Path) -> list[Path]:
    return [Path(shutil.copytree(p, tmp_path / p.name)) for p in parts]


@pytest.mark.parametrize("kind", ["fifo", "zero", "deep"])
def test_a_hostile_part_manifest_ends_at_once_with_a_named_error(parts, tmp_path, kind):
    p1, p2 = copied_parts(parts, tmp_path)
    plant(p2 / "ascendconv_part.json", kind)
    result = run_cli("assemble", tmp_path / "out", p1, p2, "--json", timeout=60)
    assert result.returncode == 3, result.stderr
    error = json.loads(result.stdout.splitlines()[0])
    assert error["error"] == "PartError" and str(p2 / "ascendconv_part.json") in error["message"]
    assert not (tmp_path / "out").exists()


def test_a_symlinked_part_shard_is_refused_not_linked_as_a_symlink(parts, tmp_path):
    p1, p2 = copied_parts(parts, tmp_path)
    shard = next(p2.glob("*.safetensors"))
    kept = tmp_path / "kept.safetensors"
    shutil.move(shard, kept)
    shard.symlink_to(kept)
    result = runner.invoke(app, ["assemble", str(tmp_path / "out"), str(p1), str(p2), "--quiet"])
    assert result.exit_code == 3 and "is a symbolic link" in result.stderr and str(shard) in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_part_shard_swapped_after_its_check_is_not_linked(tmp_path):
    checked, swapped = tmp_path / "checked", tmp_path / "swapped"
    checked.write_bytes(b"a")
    swapped.write_bytes(b"b")
    identity = (os.stat(checked).st_dev, os.stat(checked).st_ino)
    (tmp_path / "staging").mkdir()
    with pytest.raises(ShardChecksumError, match="was replaced after its checksum was checked"):
        link_or_copy(swapped, tmp_path / "staging" / "s", identity, created_mode())
    assert link_or_copy(checked, tmp_path / "staging" / "t", identity, created_mode()) is True


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_hostile_hf_ref_ends_at_once(tmp_path, monkeypatch, kind):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    repo = cache / "models--org--name"
    (repo / "snapshots" / "abc").mkdir(parents=True)
    (repo / "refs").mkdir()
    plant(repo / "refs" / "main", kind)
    with pytest.raises(NotCachedError, match=str(repo / "refs" / "main")):
        resolve_source("org/name")
    (repo / "refs" / "main").unlink()
    (repo / "refs" / "main").write_text("abc" * 2000)  # far longer than any commit hash
    with pytest.raises(NotCachedError, match="more than the 4096 bytes"):
        resolve_source("org/name")


# --- the smaller defects: each a named error or a true message ---------------------------------


def test_a_lone_surrogate_tensor_name_is_a_named_error(tmp_path):
    from ascendconv.errors import HeaderError
    from ascendconv.io.safetensors import read_header
    from robust_helpers import read_raw_header, write_raw_header

    src = Path(shutil.copytree(FIXTURES / DENSE, tmp_path / "src"))
    header, data = read_raw_header(src / "model.safetensors")
    write_raw_header(src / "model.safetensors", header.replace(b'"model.norm.weight"', b'"model.norm\\ud800"'), data)
    with pytest.raises(HeaderError, match="lone surrogate"):
        read_header(src / "model.safetensors")
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out"), "--quiet"])
    assert result.exit_code == 3 and "lone surrogate" in result.stderr and "Traceback" not in result.output


def test_a_lone_surrogate_in_a_manifest_is_a_named_error(parts, tmp_path):
    p1, p2 = copied_parts(parts, tmp_path)
    manifest = json.loads((p2 / "ascendconv_part.json").read_text())
    manifest["shards"]["\ud800.safetensors"] = "00" * 32
    (p2 / "ascendconv_part.json").write_text(json.dumps(manifest))  # ASCII escapes: valid JSON
    result = runner.invoke(app, ["assemble", str(tmp_path / "out"), str(p1), str(p2), "--quiet"])
    assert result.exit_code == 3 and "Traceback" not in result.output, result.output
    assert "is malformed" in result.stderr or "does not match its fingerprint" in result.stderr


def test_metadata_that_is_not_an_object_is_refused(tmp_path):
    from ascendconv.errors import HeaderError
    from ascendconv.io.safetensors import read_header
    from robust_helpers import write_raw_header

    for metadata, refused in ((b"[]", True), (b'{"a": 1}', True), (b"null", False), (b'{"format": "pt"}', False)):
        header = b'{"__metadata__": ' + metadata + b', "t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}'
        write_raw_header(tmp_path / "s.safetensors", header, b"\0")
        if refused:
            with pytest.raises(HeaderError, match="__metadata__ is"):
                read_header(tmp_path / "s.safetensors")
        else:
            assert list(read_header(tmp_path / "s.safetensors").tensors) == ["t"]


def test_out_equal_to_src_gives_no_overwrite_hint(tmp_path):
    src = Path(shutil.copytree(FIXTURES / DENSE, tmp_path / "src"))
    result = runner.invoke(app, ["convert", str(src), str(src), "--overwrite", "--quiet"])
    assert result.exit_code == 2 and "is the source directory" in result.stderr
    assert "--overwrite" not in result.stderr and "choose an OUT other than the source" in result.stderr


def test_a_shard_size_below_one_byte_is_refused():
    from ascendconv.errors import BadOptionError
    from ascendconv.options import parse_size

    with pytest.raises(BadOptionError, match="less than one byte"):
        parse_size("0.4")
    assert parse_size("0") == 0 and parse_size("1.5KB") == 1500 and parse_size("0.5KiB") == 512


@pytest.mark.parametrize("text", ["1.5", "2.5B", "100.25"])
def test_a_fractional_byte_count_is_refused_asking_for_the_unit(tmp_path, text):
    """'--max-shard-size 1.5' was one byte per shard, so a package of one file per tensor."""
    result = runner.invoke(app, ["convert", str(FIXTURES / DENSE), str(tmp_path / "out"), "--max-shard-size", text, "--json"])
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
    error = json.loads(result.stdout)
    assert error["message"] == f"--max-shard-size: size {text!r} is a fraction of a byte count"
    number = text.rstrip("B")
    assert error["hint"] == f"give the unit meant ({number}GB, {number}GiB) or a whole number of bytes"


def test_an_index_shard_without_the_suffix_is_not_copied_as_a_companion(tmp_path):
    src = Path(shutil.copytree(FIXTURES / "deepseek-v3-fp8", tmp_path / "src"))
    index = json.loads((src / "model.safetensors.index.json").read_text())
    (src / "model-00002-of-00002.safetensors").rename(src / "model-00002")
    index["weight_map"] = {t: ("model-00002" if f == "model-00002-of-00002.safetensors" else f) for t, f in index["weight_map"].items()}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    result = convert(src, tmp_path / "out", ConvertOptions())
    assert "model-00002" not in result.plan.copied_files and not (tmp_path / "out" / "model-00002").exists()


def test_a_companion_larger_than_any_copied_file_is_left_out_with_a_warning_not_refused(tmp_path):
    # a release may hold a large file in a format vLLM does not read (a .nemo archive, a .tar);
    # refusing the whole conversion for it left no way but editing the source (or the HF cache)
    src = Path(shutil.copytree(FIXTURES / "qwen3-dense-fp8", tmp_path / "src"))
    with open(src / "model.nemo", "wb") as f:
        f.truncate(MAX_COPIED_BYTES + 1)  # sparse: nothing is written
    result = convert(src, tmp_path / "out", ConvertOptions())
    why = f"{MAX_COPIED_BYTES + 1:,} bytes, larger than any file the package carries (1024 MiB)"
    assert result.plan.skipped_files == {"model.nemo": why}
    assert f"model.nemo is not carried into the package: {why}" in result.plan.warnings
    assert "model.nemo" not in result.plan.copied_files and not (tmp_path / "out" / "model.nemo").exists()
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()


def test_assemble_checks_space_up_front_and_hints_no_option_it_lacks(parts, tmp_path, monkeypatch):
    import ascendconv.assemble as assemble_module
    from ascendconv.errors import NoSpaceError
    from ascendconv.io.output import output_error

    monkeypatch.setattr(assemble_module, "space_to_assemble", lambda out, parts: 2**62)
    result = runner.invoke(app, ["assemble", str(tmp_path / "out"), *map(str, parts), "--quiet"])
    assert result.exit_code == 4 and "the package needs" in result.stderr and not (tmp_path / "out").exists()
    error = output_error(OSError(27, "File too large"), tmp_path / "out", shard_size_option=False)
    assert "--max-shard-size" not in error.hint and "ulimit -f" in error.hint
    assert isinstance(output_error(OSError(28, "No space"), tmp_path / "out"), NoSpaceError)


def test_more_source_shards_than_descriptors_convert_and_verify(tmp_path):
    """300 source shards under `ulimit -n 128` (as 1,000+ under 1024): the reader keeps at most a
    quarter of the limit open, so neither convert nor verify --source runs out of descriptors."""
    import resource

    from conftest import write_large_checkpoint

    src = write_large_checkpoint(tmp_path / "src", shards=300, linears_per_shard=1, n=128, k=128)
    out = tmp_path / "out"

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    result = run_cli("convert", src, out, "--quiet", "--kernel", "reference", preexec_fn=limited, timeout=600)
    assert result.returncode == 0, result.stderr
    result = run_cli("verify", out, "--source", src, "--quiet", preexec_fn=limited, timeout=600)
    assert result.returncode == 0, result.stderr


def test_no_memory_to_map_a_tensor_is_the_machine_not_damaged_input(monkeypatch):
    import errno
    import mmap as mmap_module

    from ascendconv.errors import OutOfMemoryError
    from ascendconv.io.safetensors import TensorReader, read_header

    header = read_header(FIXTURES / DENSE / "model.safetensors")
    entry = next(e for e in header.tensors.values() if e.nbytes)

    def no_memory(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mmap_module, "mmap", no_memory)
    with TensorReader() as reader, pytest.raises(OutOfMemoryError, match="no memory left to map") as refused:
        reader.map_range(entry, 0, entry.nbytes)
    assert refused.value.exit_code == 4


# --- integers of more digits than int() converts -------------------------------------------------

HUGE_INT = b"9" * 5000  # past Python's 4,300 digits: json.loads raised ValueError in Python's words


def with_huge_int(text: bytes) -> bytes:
    """A JSON object's text with a key holding an integer of 5,000 digits (trailing padding kept)."""
    end = text.rindex(b"}")
    return text[:end] + b', "huge": ' + HUGE_INT + b"}" + text[end + 1:]


def huge_int_message(what: Path | str) -> str:
    return (f"{what} holds an integer of more than 4,300 digits, longer than any value such a file holds: "
            "it is damaged or was edited")


def test_a_huge_integer_in_a_part_manifest_is_a_part_error_in_our_words(parts, tmp_path):
    from ascendconv.errors import PartError

    p1, p2 = copied_parts(parts, tmp_path)
    manifest = p2 / "ascendconv_part.json"
    manifest.write_bytes(with_huge_int(manifest.read_bytes()))
    result = runner.invoke(app, ["assemble", str(tmp_path / "out"), str(p1), str(p2), "--json"])
    assert result.exit_code == 3 and "Traceback" not in result.output
    assert json.loads(result.stdout) == {"ok": False, "schema": 1, "command": "assemble", "error": "PartError",
                                         "message": huge_int_message(manifest), "hint": PartError.default_hint,
                                         "exit_code": 3}
    assert "set_int_max_str_digits" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_huge_integer_in_a_resume_ledger_is_a_ledger_error_in_our_words(tmp_path):
    from ascendconv.errors import ResumeLedgerError

    out, staging = kept_staging(tmp_path)
    ledger = staging / LEDGER_NAME
    ledger.write_bytes(with_huge_int(ledger.read_bytes()))
    result = runner.invoke(app, ["convert", str(FIXTURES / DENSE), str(out), "--resume", "--json", "--max-shard-size", "150KB"])
    assert result.exit_code == 3 and "Traceback" not in result.output
    assert json.loads(result.stdout) == {"ok": False, "schema": 1, "command": "convert", "error": "ResumeLedgerError",
                                         "message": huge_int_message(ledger), "hint": ResumeLedgerError.default_hint,
                                         "exit_code": 3}
    assert not out.exists()


@pytest.mark.parametrize("fixture, file, error, what, hint", [
    (DENSE, "config.json", "ConfigError", "{path}", "fix the file named (config.json, or the quantization config beside it), or download the checkpoint again"),
    (DENSE, "model.safetensors", "HeaderError", "{path}: the header", "the file is corrupt or not a safetensors file; download it again"),
    ("qwen3-moe-fp8", "model.safetensors.index.json", "IndexMismatchError", "{path}",
     "the index and the shards disagree; download the checkpoint again"),
])
def test_a_huge_integer_in_a_source_file_is_a_named_error_in_our_words(tmp_path, fixture, file, error, what, hint):
    """config.json, a shard header, the index: every JSON the tool reads goes through one parser."""
    from robust_helpers import read_raw_header, write_raw_header

    src = Path(shutil.copytree(FIXTURES / fixture, tmp_path / "src"))
    path = src / file
    if file.endswith(".safetensors"):
        header, data = read_raw_header(path)
        write_raw_header(path, with_huge_int(header), data)
    else:
        path.write_bytes(with_huge_int(path.read_bytes()))
    expected = {"ok": False, "schema": 1, "error": error, "message": huge_int_message(what.format(path=path)),
                "hint": hint, "exit_code": 3}
    for command in (["convert", str(src), str(tmp_path / "out")], ["inspect", str(src)]):
        result = runner.invoke(app, [*command, "--json"])
        assert result.exit_code == 3 and "Traceback" not in result.output
        assert json.loads(result.stdout) == {**expected, "command": command[0]}
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("file", ["quant_model_description.json", "ascendconv_provenance.json"])
def test_a_huge_integer_in_a_package_file_is_a_package_error_in_our_words(converted, tmp_path, file):
    from ascendconv.errors import PackageError

    package = Path(shutil.copytree(converted(DENSE), tmp_path / "pkg"))
    path = package / file
    path.write_bytes(with_huge_int(path.read_bytes()))
    for command in ("inspect", "verify"):
        result = runner.invoke(app, [command, str(package), "--json"])
        assert result.exit_code == 3 and "Traceback" not in result.output
        assert json.loads(result.stdout) == {"ok": False, "schema": 1, "command": command, "error": "PackageError",
                                             "message": huge_int_message(path), "hint": PackageError.default_hint,
                                             "exit_code": 3}
