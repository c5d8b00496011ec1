"""The plan's identity covers the source's data, not only its names, sizes and headers: two
checkpoints of one layout (a fine-tune, a re-upload between CI jobs) are never mixed by `assemble`
or `--resume`, and `verify --source` tells them apart."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.convert import ConvertOptions, convert
from ascendconv.errors import ResumeMismatchError
from ascendconv.io.checksum import SAMPLE_BYTES, SAMPLE_WINDOWS, sampled_digest
from ascendconv.io.outdir import STAGING_TAG
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

    def stop(done, total):
        if done > total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(src, out, ConvertOptions(max_shard_size=LIMIT, resume=True), stop)
    shutil.rmtree(src)
    fine_tuned(src)  # re-uploaded under the same name between the two runs
    with pytest.raises(ResumeMismatchError, match=r"data_sample"):
        convert(src, out, ConvertOptions(max_shard_size=LIMIT, resume=True))
    assert not out.exists() and list(tmp_path.glob(f".out{STAGING_TAG}*"))


def test_assemble_refuses_parts_of_two_checkpoints_of_one_layout(tmp_path):
    other = fine_tuned(tmp_path / "fine-tune")
    convert(FIXTURES / DENSE, tmp_path / "p1", ConvertOptions(max_shard_size=LIMIT, part=(1, 2)))
    convert(other, tmp_path / "p2", ConvertOptions(max_shard_size=LIMIT, part=(2, 2)))
    result = runner.invoke(app, ["assemble", str(tmp_path / "out"), str(tmp_path / "p1"), str(tmp_path / "p2"), "--quiet"])
    assert result.exit_code == 3, result.output
    assert "comes from another plan" in result.stderr and "data_sample" in result.stderr
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

