"""The plan's identity covers the source's data, not only its names, sizes and headers: two
checkpoints of one layout (a fine-tune, a re-upload between CI jobs) are never mixed by `assemble`
or `--resume`, and `verify --source` tells them apart."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.convert import ConvertOptions, convert
from ascendconv.errors import ResumeMismatchError
from ascendconv.ascendv1 import SOURCE_DATA_KEY
from ascendconv.io.checksum import MERGE_GAP, SAMPLE_BYTES, SAMPLE_WINDOWS, TENSOR_WINDOW, sampled_digest, shard_windows, tensor_windows
from ascendconv.io.safetensors import read_header
from ascendconv.package_files import data_sample, tensor_sample
from ascendconv.io.outdir import STAGING_TAG
from ascendconv.sources import open_source
from ascendconv.verify import VerifyOptions, verify
from conftest import FIXTURES, load_shard, save_shard

runner = CliRunner()
DENSE = "qwen3-dense-fp8"
LIMIT = 150_000


def fine_tuned(root: Path) -> Path:
    """The dense fixture with one layer's norm nudged: same names, dtypes, shapes, headers."""
    src = Path(shutil.copytree(FIXTURES / DENSE, root))
    tensors = load_shard(src / "model.safetensors")
    name = "model.layers.0.input_layernorm.weight"
    dtype, shape, data = tensors[name]
    tensors[name] = (dtype, shape, bytes([data[0] ^ 0x01]) + data[1:])  # the low bit of one BF16 value
    save_shard(src / "model.safetensors", tensors)
    assert (src / "model.safetensors").read_bytes()[:4096] == (FIXTURES / DENSE / "model.safetensors").read_bytes()[:4096]
    return src


PADDING = "model.rotary_padding.weight"  # copied as it is: it makes the shard larger than the 16 old windows


def padded(root: Path) -> Path:
    """The dense fixture with a 4 MiB tensor more, so that its shard's old windows (16 x 64 KiB)
    leave most of its tensors unread."""
    src = Path(shutil.copytree(FIXTURES / DENSE, root))
    tensors = load_shard(src / "model.safetensors")
    noise = np.random.default_rng(0).integers(0, 256, 2**22, dtype=np.uint8).tobytes()
    save_shard(src / "model.safetensors", {**tensors, PADDING: ("BF16", (2048, 1024), noise)})
    return src


def unsampled_before(path: Path) -> str:
    """A quantized weight of the shard that no old window (io.checksum.shard_windows) touches."""
    header = read_header(path)
    windows = shard_windows(header.data_start, header.file_size)
    return next(
        e.name for e in sorted(header.tensors.values(), key=lambda e: e.name)
        if e.dtype == "F8_E4M3" and all(e.offset + e.nbytes <= a or e.offset >= b for a, b in windows)
    )


def layer_fine_tuned(base: Path, root: Path) -> tuple[Path, str]:
    """`base` with one weight fine-tuned (its rows shifted by one: nearly every byte changes, every
    code stays finite), a weight the old windows never read."""
    src = Path(shutil.copytree(base, root))
    name = unsampled_before(src / "model.safetensors")
    tensors = load_shard(src / "model.safetensors")
    dtype, shape, data = tensors[name]
    tensors[name] = (dtype, shape, np.roll(np.frombuffer(data, np.uint8).reshape(shape), 1, axis=0).tobytes())
    save_shard(src / "model.safetensors", tensors)
    return src, name


def stopped_half_way(src: Path, out: Path) -> None:
    """A --resume run of `src` interrupted once half its bytes are converted."""

    def stop(done, total):
        if done > total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(src, out, ConvertOptions(max_shard_size=LIMIT, resume=True), stop)


def test_every_tensor_is_sampled_at_its_start_middle_and_end():
    spans = [(100, 100 + 5), (200, 200 + 3 * TENSOR_WINDOW), (10**6, 10**6 + 2**20), (5 * 10**6, 5 * 10**6 + 40_000)]
    ranges = tensor_windows(spans, 100, 6 * 10**6)
    covered = lambda byte: any(a <= byte < b for a, b in ranges)  # noqa: E731
    for begin, stop in spans:
        assert covered(begin) and covered(stop - 1) and covered(begin + (stop - begin) // 2), (begin, stop)
    assert all(b - a <= 3 * SAMPLE_BYTES for a, b in ranges)  # windows, never whole large tensors
    assert ranges == sorted(ranges) and all(b1 + MERGE_GAP < a2 for (_, b1), (a2, _) in zip(ranges, ranges[1:]))


def test_a_fine_tuned_layer_outside_the_old_windows_changes_the_identity(tmp_path):
    base = padded(tmp_path / "base")
    other, name = layer_fine_tuned(base, tmp_path / "fine-tune")
    a, b = read_header(base / "model.safetensors"), read_header(other / "model.safetensors")
    assert a.header_bytes == b.header_bytes
    assert data_sample(a) == data_sample(b), "the old shard windows were blind to it"
    assert tensor_sample(a) != tensor_sample(b), name


def test_resume_refuses_a_layer_fine_tuned_since_outside_the_old_windows(tmp_path):
    src = padded(tmp_path / "src")
    out = tmp_path / "out"
    stopped_half_way(src, out)
    shutil.move(src, tmp_path / "before")
    layer_fine_tuned(tmp_path / "before", src)  # re-uploaded under the same name between the two runs
    with pytest.raises(ResumeMismatchError, match=r"tensor_sample"):
        convert(src, out, ConvertOptions(max_shard_size=LIMIT, resume=True))
    assert not out.exists() and list(tmp_path.glob(f".out{STAGING_TAG}*"))


def test_assemble_refuses_parts_of_a_checkpoint_and_its_fine_tuned_layer(tmp_path):
    base = padded(tmp_path / "base")
    other, _ = layer_fine_tuned(base, tmp_path / "fine-tune")
    convert(base, tmp_path / "p1", ConvertOptions(max_shard_size=LIMIT, part=(1, 2)))
    convert(other, tmp_path / "p2", ConvertOptions(max_shard_size=LIMIT, part=(2, 2)))
    result = runner.invoke(app, ["assemble", str(tmp_path / "out"), str(tmp_path / "p1"), str(tmp_path / "p2"), "--quiet"])
    assert result.exit_code == 3, result.output
    assert "comes from another plan" in result.stderr
    assert "tensor_sample" in result.stderr
    assert not (tmp_path / "out").exists()


def test_every_shard_records_the_source_bytes_it_was_made_from(tmp_path):
    src = padded(tmp_path / "src")
    one = convert(src, tmp_path / "one", ConvertOptions(max_shard_size=LIMIT))
    reference = convert(src, tmp_path / "ref", ConvertOptions(max_shard_size=LIMIT, kernel="reference"))
    shards = json.loads((tmp_path / "one" / "ascendconv_provenance.json").read_text())["shards"]
    assert len(shards) == len(one.plan.shards) > 2
    assert all(len(entry[SOURCE_DATA_KEY]) == 64 for entry in shards.values())
    assert len({entry[SOURCE_DATA_KEY] for entry in shards.values()}) == len(shards)
    # what was read does not depend on the kernel (its chunks differ), nor on the parts
    ref_shards = json.loads((tmp_path / "ref" / "ascendconv_provenance.json").read_text())["shards"]
    assert {n: e[SOURCE_DATA_KEY] for n, e in ref_shards.items()} == {n: e[SOURCE_DATA_KEY] for n, e in shards.items()}
    for i in (1, 2):
        convert(src, tmp_path / f"p{i}", ConvertOptions(max_shard_size=LIMIT, part=(i, 2)))
    assert runner.invoke(app, ["assemble", str(tmp_path / "joined"), str(tmp_path / "p1"), str(tmp_path / "p2"), "--quiet"]).exit_code == 0
    joined = json.loads((tmp_path / "joined" / "ascendconv_provenance.json").read_text())["shards"]
    assert joined == shards
    assert verify(tmp_path / "one", VerifyOptions(source=src)).ok and reference.shard_checksums == one.shard_checksums


def one_byte_between_the_windows(src: Path) -> None:
    """Change one byte of the padding tensor where neither its windows nor the shard's fall: the
    sampled identity stays the same."""
    path = src / "model.safetensors"
    header = read_header(path)
    entry = header.tensors[PADDING]
    spans = [(e.offset, e.offset + e.nbytes) for e in header.tensors.values()]
    ranges = tensor_windows(spans, header.data_start, header.file_size)
    offset = next(o for o in range(entry.offset, entry.offset + entry.nbytes, 4096)
                  if all(o + 1 <= a or o >= b for a, b in ranges))
    before = tensor_sample(header)
    with open(path, "r+b") as f:
        f.seek(offset)
        value = f.read(1)
        f.seek(offset)
        f.write(bytes([value[0] ^ 0x01]))
    assert tensor_sample(read_header(path)) == before


def test_verify_source_proves_each_shard_was_made_from_the_bytes_given(tmp_path):
    src = padded(tmp_path / "src")
    convert(src, tmp_path / "pkg", ConvertOptions(max_shard_size=LIMIT))
    assert verify(tmp_path / "pkg", VerifyOptions(source=src)).ok
    one_byte_between_the_windows(src)
    source = verify(tmp_path / "pkg", VerifyOptions(source=src)).check("source")
    assert not source.ok and "was made from other source bytes than the source given holds" in source.detail
    assert source.detail.count("other source bytes") == 1  # the padding's shard only
    # which of the two sides may have changed, the package's among them
    assert "a source changed since it was converted, or tensors of this shard moved to another or removed" in source.detail
    result = runner.invoke(app, ["verify", str(tmp_path / "pkg"), "--source", str(src), "--quiet"])
    assert result.exit_code == 1 and "Traceback" not in result.output


def test_verify_source_hashes_each_source_tensor_once_as_it_compares_it(tmp_path, monkeypatch):
    """The digests that prove a shard's source bytes are taken by the pass that compares them, each
    tensor just before its comparison reads it: one read of the source from the disk, not two."""
    import ascendconv.pipeline as pipeline
    import ascendconv.verify.accuracy as accuracy

    src = FIXTURES / "qwen3-moe-fp8"
    convert(src, tmp_path / "pkg", ConvertOptions(max_shard_size=LIMIT))
    events, digest, compare_plain = [], pipeline.entry_digest, accuracy._compare_plain

    def hashing(source, entry):
        events.append(("hash", entry.name))
        return digest(source, entry)

    def comparing(lay, reader, source, entry, name):
        events.append(("compare", entry.name))
        return compare_plain(lay, reader, source, entry, name)

    monkeypatch.setattr(pipeline, "entry_digest", hashing)
    monkeypatch.setattr(accuracy, "_compare_plain", comparing)
    report = verify(tmp_path / "pkg", VerifyOptions(source=src))
    assert report.ok, [c.to_dict() for c in report.checks if not c.ok]
    source = open_source(src)
    hashed = [name for kind, name in events if kind == "hash"]
    assert sorted(hashed) == sorted(n for n, e in source.tensors.items() if e.nbytes)  # every one, once
    for i, (kind, name) in enumerate(events):
        if kind == "compare":  # a copied tensor: hashed by the same item, before it was compared
            assert ("hash", name) in events[:i]
    kinds = [kind for kind, _ in events]  # one pass: hashing goes on after the first comparisons
    assert kinds.index("compare") < len(kinds) - 1 - kinds[::-1].index("hash")
    source.close()


def test_a_source_tensor_no_compared_item_reads_is_hashed_once_after_the_comparisons(tmp_path, monkeypatch):
    """A package tensor renamed to a linear's source scale: the shard it sits in is made of that
    scale, but no compared item reads the scale (the linear's weight is gone from the package). It is
    hashed once, after the pass, and the shard's recorded source bytes are found not to match."""
    import ascendconv.pipeline as pipeline

    src = FIXTURES / "qwen3-moe-fp8"
    convert(src, tmp_path / "pkg", ConvertOptions(max_shard_size=LIMIT))
    source = open_source(src)
    linear = next(lin for lin in source.linears.values() if lin.scale is not None)
    weight, scale = linear.prefix + ".weight", linear.scale.name
    shard = next(p for p in sorted((tmp_path / "pkg").glob("quant_model_weights-*.safetensors")) if weight in read_header(p).tensors)
    save_shard(shard, {scale if name == weight else name: t for name, t in load_shard(shard).items()})
    hashed, phases, digest = [], [], pipeline.entry_digest
    monkeypatch.setattr(pipeline, "entry_digest", lambda source, entry: hashed.append(entry.name) or digest(source, entry))
    report = verify(tmp_path / "pkg", VerifyOptions(source=src), progress=lambda phase, *_: phases.append(phase))
    found = report.check("source")
    assert not found.ok
    assert f"package tensor {scale!r} does not come from the source" in found.problems
    assert f"{weight!r} comes from the source but is not in the package" in found.problems
    made_from_other = [p for p in found.problems if "other source bytes" in p]
    assert len(made_from_other) == 1 and made_from_other[0].startswith(f"package shard {shard.name} was made from")
    assert hashed.count(scale) == 1 and hashed[-1] == scale  # by the pass after the comparisons
    assert sorted(hashed) == sorted(set(hashed))  # no tensor twice
    assert "source-data" in phases and phases.index("source-data") > phases.index("source")
    source.close()


def test_a_package_written_before_the_new_fields_still_verifies(converted, tmp_path):
    pkg = Path(shutil.copytree(converted(DENSE), tmp_path / "pkg"))
    path = pkg / "ascendconv_provenance.json"
    prov = json.loads(path.read_text())
    header = read_header(FIXTURES / DENSE / "model.safetensors")
    for record in prov["source"]["files"]:  # as the version before wrote it
        del record["tensor_sample"]
        record["data_sample"] = data_sample(header)
    for entry in prov["shards"].values():
        del entry[SOURCE_DATA_KEY]
    path.write_text(json.dumps(prov, indent=2))
    assert verify(pkg, VerifyOptions(source=FIXTURES / DENSE)).ok
    for record in prov["source"]["files"]:  # older still: no sample at all
        del record["data_sample"]
    path.write_text(json.dumps(prov, indent=2))
    assert verify(pkg, VerifyOptions(source=FIXTURES / DENSE)).ok
    other = fine_tuned(tmp_path / "fine-tune")  # a package of before still tells a source of other bytes
    prov["source"]["files"][0]["data_sample"] = data_sample(header)
    path.write_text(json.dumps(prov, indent=2))
    assert not verify(pkg, VerifyOptions(source=other)).check("source").ok


def test_the_sample_covers_both_ends_and_every_wide_change(tmp_path):
    path = tmp_path / "big"
    size = 64 * 2**20
    with open(path, "wb") as f:
        f.truncate(size)
    base = sampled_digest(path, 8, size)
    step = (size - 8 - SAMPLE_BYTES) // (SAMPLE_WINDOWS - 1)
    # any change spanning step + one window bytes (a fine-tune changes nearly all) meets a window
    for start in (8, size // 3, size - step - SAMPLE_BYTES):
        with open(path, "r+b") as f:
            f.seek(start)
            f.write(b"\x01" * (step + SAMPLE_BYTES))
        assert sampled_digest(path, 8, size) != base, start
        with open(path, "r+b") as f:
            f.seek(start)
            f.write(b"\x00" * (step + SAMPLE_BYTES))
    for offset in (8, size - 1):  # the first and the last byte are always read
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(b"\x01")
        assert sampled_digest(path, 8, size) != base
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(b"\x00")
    assert sampled_digest(path, 8, size) == base


def test_resume_refuses_shards_converted_from_the_checkpoint_that_was_there_before(tmp_path):
    src = Path(shutil.copytree(FIXTURES / DENSE, tmp_path / "src"))
    out = tmp_path / "out"
    stopped_half_way(src, out)
    shutil.rmtree(src)
    fine_tuned(src)  # re-uploaded under the same name between the two runs
    with pytest.raises(ResumeMismatchError, match=r"tensor_sample"):
        convert(src, out, ConvertOptions(max_shard_size=LIMIT, resume=True))
    assert not out.exists() and list(tmp_path.glob(f".out{STAGING_TAG}*"))


def test_assemble_refuses_parts_of_two_checkpoints_of_one_layout(tmp_path):
    other = fine_tuned(tmp_path / "fine-tune")
    convert(FIXTURES / DENSE, tmp_path / "p1", ConvertOptions(max_shard_size=LIMIT, part=(1, 2)))
    convert(other, tmp_path / "p2", ConvertOptions(max_shard_size=LIMIT, part=(2, 2)))
    result = runner.invoke(app, ["assemble", str(tmp_path / "out"), str(tmp_path / "p1"), str(tmp_path / "p2"), "--quiet"])
    assert result.exit_code == 3, result.output
    assert "comes from another plan" in result.stderr and "tensor_sample" in result.stderr
    assert not (tmp_path / "out").exists()


def test_verify_source_tells_a_fine_tune_from_the_checkpoint_converted(converted, tmp_path):
    pkg = converted(DENSE)
    other = fine_tuned(tmp_path / "fine-tune")
    report = verify(pkg, VerifyOptions(source=other))
    source = report.check("source")
    assert not source.ok and "source shard model.safetensors differs from the one converted" in source.detail
    assert verify(pkg, VerifyOptions(source=FIXTURES / DENSE)).ok


def test_a_source_file_recorded_under_a_list_as_name_is_no_traceback(converted, tmp_path):
    pkg = Path(shutil.copytree(converted(DENSE), tmp_path / "pkg"))
    prov = json.loads((pkg / "ascendconv_provenance.json").read_text())
    prov["source"]["files"][0]["name"] = ["model.safetensors"]
    (pkg / "ascendconv_provenance.json").write_text(json.dumps(prov))
    result = runner.invoke(app, ["verify", str(pkg), "--source", str(FIXTURES / DENSE), "--quiet"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    report = verify(pkg, VerifyOptions(source=FIXTURES / DENSE))
    assert "the package was converted from shards []" in report.check("source").detail
    assert not report.check("provenance").ok



def test_a_kept_shard_whose_ledger_entry_lacks_its_source_digest_is_converted_again(tmp_path):
    src = padded(tmp_path / "src")
    out = tmp_path / "out"
    stopped_half_way(src, out)
    (ledger_path,) = tmp_path.glob(f".out{STAGING_TAG}*/.ascendconv-resume.json")
    ledger = json.loads(ledger_path.read_text())
    assert ledger["shards"] and all(len(entry["reads"]) == 64 for entry in ledger["shards"].values())
    for entry in ledger["shards"].values():
        del entry["reads"]
    ledger_path.write_text(json.dumps(ledger))
    result = convert(src, out, ConvertOptions(max_shard_size=LIMIT, resume=True))
    assert result.reused_shards == [] and verify(out, VerifyOptions(source=src)).ok


def test_a_snapshot_of_another_revision_that_differs_is_named_with_the_one_converted(converted, tmp_path):
    """The shards differ, and the package was converted from a cached snapshot of another revision
    than the one given (the cache's main moved on): the source check says which to pass. A local
    directory, or the same revision, says nothing more."""
    recorded, other = "a" * 40, "b" * 40
    pkg = Path(shutil.copytree(converted(DENSE), tmp_path / "pkg"))
    prov = json.loads((pkg / "ascendconv_provenance.json").read_text())
    prov["hub"] = {"repo_id": "Qwen/Qwen3-Dense-FP8", "revision": recorded}
    (pkg / "ascendconv_provenance.json").write_text(json.dumps(prov))
    snapshots = tmp_path / "hub" / "models--Qwen--Qwen3-Dense-FP8" / "snapshots"
    differs = "source shard model.safetensors differs from the one converted"
    for revision, told in ((other, True), (recorded, False)):
        snapshot = fine_tuned(snapshots / revision)
        problems = verify(pkg, VerifyOptions(source=snapshot)).check("source").problems
        assert any(p.startswith(differs) for p in problems), problems
        note = (f"the package was converted from 'Qwen/Qwen3-Dense-FP8@{recorded}', the source given is "
                f"Qwen/Qwen3-Dense-FP8@{other}: pass --source 'Qwen/Qwen3-Dense-FP8@{recorded}'")
        assert (note in problems) is told, problems
    local = verify(pkg, VerifyOptions(source=fine_tuned(tmp_path / "local"))).check("source").problems
    assert any(p.startswith(differs) for p in local) and not any("was converted from '" in p for p in local)
