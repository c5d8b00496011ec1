"""verify: clean packages pass; each corruption of the catalogue fails one named check with a message
that names the tensor or file; the numbers against the source; the MoE chain against float64."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ascendconv import npu as npu_module
from ascendconv import verify as v
from ascendconv.cli import app
from ascendconv.formats import elements, mx, resolve
from ascendconv.npu import reference as gmm_situ
from ascendconv.npu.reference import GmmSituInputs
from ascendconv.formats.constants import E2M1, E4M3
from ascendconv.io.safetensors import TensorReader, read_header
from ascendconv.sources import Source
from ascendconv.errors import NpuUnavailableError, TruncatedFileError
from ascendconv.verify import VerifyOptions, verify
from ascendconv.verify import accuracy as verify_accuracy, checks as verify_checks
from ascendconv.verify import integrity as verify_integrity, moe as verify_moe
from conftest import FIXTURE_NAMES, FIXTURES, SCHEMES, file_digest, load_shard, save_shard

runner = CliRunner()
DENSE, MOE, DEEPSEEK = "qwen3-dense-fp8", "qwen3-moe-fp8", "deepseek-v3-fp8"
SHARD = "quant_model_weights-00001-of-00001.safetensors"
INDEX = "quant_model_weights.safetensors.index.json"
DESCRIPTION = "quant_model_description.json"
PROVENANCE = "ascendconv_provenance.json"
Q = "model.layers.0.self_attn.q_proj"
O = "model.layers.0.self_attn.o_proj"  # in no packed group
STRUCTURAL = (
    "files", "config", "description", "headers", "index", "coverage", "dtypes", "shapes", "pairs",
    "alignment", "packed_groups", "scales", "payload", "provenance", "checksums", "copies",
)


# --- helpers ---------------------------------------------------------------------------------------


@pytest.fixture
def package(converted, tmp_path):
    """A writable copy of a converted fixture package: package(fixture, scheme) -> Path."""

    def make(fixture: str = DENSE, scheme: str = "w8a8-mxfp8", name: str = "pkg") -> Path:
        target = tmp_path / name
        shutil.copytree(converted(fixture, scheme), target)
        return target

    return make


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2))


def edit_shard(pkg: Path, edit, shard: str = SHARD) -> None:
    tensors = load_shard(pkg / shard)
    edit(tensors)
    save_shard(pkg / shard, tensors)


def reseal(pkg: Path) -> None:
    """Re-record checksums, sizes, file digests and total_size, so that only the corruption under
    test is visible."""
    index = read_json(pkg / INDEX)
    index["metadata"]["total_size"] = sum(
        e.nbytes for f in set(index["weight_map"].values()) for e in read_header(pkg / f).tensors.values()
    )
    write_json(pkg / INDEX, index)
    prov = read_json(pkg / PROVENANCE)
    for file in prov["shards"]:
        prov["shards"][file][prov["checksum"]] = file_digest(pkg / file, prov["checksum"])
        prov["shards"][file]["size"] = (pkg / file).stat().st_size
    prov["files"] = {name: hashlib.sha256((pkg / name).read_bytes()).hexdigest() for name in prov["files"]}
    write_json(pkg / PROVENANCE, prov)


def drop_everywhere(pkg: Path, names: list[str]) -> None:
    """Remove tensors from the description, the index and the shard, then reseal: a package
    consistent in itself that lacks them."""
    desc, index = read_json(pkg / DESCRIPTION), read_json(pkg / INDEX)
    for name in names:
        del desc[name], index["weight_map"][name]
    write_json(pkg / DESCRIPTION, desc)
    write_json(pkg / INDEX, index)
    edit_shard(pkg, lambda t: [t.pop(name) for name in names])
    reseal(pkg)


def failed(report) -> set[str]:
    return {c.name for c in report.failed}


def problems(report, name: str) -> str:
    check = report.check(name)
    assert check is not None, f"no check {name!r}"
    return "\n".join(check.problems)


def run_verify(*args):
    return runner.invoke(app, ["verify", *map(str, args)])


# --- clean packages ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_clean_package_passes_everything(converted, fixture, scheme):
    pkg = converted(fixture, scheme)
    report = verify(pkg, VerifyOptions(source=FIXTURES / fixture, exact="sample", moe_check=True))
    assert report.ok, [(c.name, c.problems) for c in report.failed]
    names = [c.name for c in report.checks]
    assert names == [*STRUCTURAL, "source", "accuracy", "exact", "moe"]
    source = Source.open(FIXTURES / fixture)
    assert {t.name for t in report.tensors} == {l.weight.name for l in source.linears.values()}
    source.close()
    sqnr = [t.sqnr_db for t in report.tensors]
    assert sqnr == sorted(sqnr), "worst tensors first"
    moe = fixture != DENSE
    assert bool(report.moe) == moe and report.check("moe").skipped == (not moe)


@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
def test_exact_full_and_fp32_resolve(converted, fixture, monkeypatch):
    pkg = converted(fixture, "w4a8-mxfp-moe", "floor", resolve_dtype="fp32")
    report = verify(pkg, VerifyOptions(source=FIXTURES / fixture, exact="full"))
    assert report.ok, [(c.name, c.problems) for c in report.failed]
    assert "every row" in report.check("exact").detail
    # the kernel's sums of every row (--exact-full) and numpy's, sampling every row, agree
    monkeypatch.setattr(verify_accuracy, "STATS_ELEMENTS", 2**40)
    default = {t.name: t for t in verify(pkg, VerifyOptions(source=FIXTURES / fixture)).tensors}
    for t in report.tensors:
        assert t.rel_err == pytest.approx(default[t.name].rel_err, rel=1e-9)
        assert (t.max_abs, t.saturated) == (default[t.name].max_abs, default[t.name].saturated)


def test_cli_json_schema_and_exit_0(converted):
    pkg = converted(MOE, "w4a8-mxfp-moe")
    result = run_verify(pkg, "--source", FIXTURES / MOE, "--moe-check", "--exact", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["failed"] == []
    for check in report["checks"]:
        assert {"name", "ok", "detail", "problems", "hint", "skipped"} <= check.keys()
    tensor = report["tensors"][0]
    assert {"name", "type", "rel_err", "sqnr_db", "max_abs", "saturated", "min_sqnr_db", "ok"} <= tensor.keys()
    assert tensor["type"] in ("W8A8_MXFP8", "W4A8_MXFP") and 0 < tensor["rel_err"] < 0.2
    assert report["moe"] and {"layer", "rel_err", "rel_err_situ"} <= report["moe"][0].keys()
    assert report["provenance"]["scheme"] == "w4a8-mxfp-moe"
    from ascendconv import __version__

    settings = {"version": __version__, "scheme": "w4a8-mxfp-moe", "scale_rule": "mse",
                "resolve_dtype": "bf16", "kernel": report["provenance"]["kernel"]}
    assert {k: report["provenance"][k] for k in settings} == settings
    recorded = json.loads((pkg / "ascendconv_provenance.json").read_text())
    assert report["provenance"]["fallbacks"] == recorded["fallbacks"] and report["provenance"]["date"] == recorded["date"]
    assert report["provenance"]["deployment"] == {"tp": 1, "ep": False, "shared_experts_as_routed": False, "mtp_heads": True}
    provenance = next(c for c in report["checks"] if c["name"] == "provenance")
    assert provenance["detail"] == (f"ascendconv {__version__}, w4a8-mxfp-moe, rule mse, resolve bf16, "
                                    f"kernel {report['provenance']['kernel']}")


def test_cli_renders_tables(converted):
    pkg = converted(MOE, "w4a8-mxfp-moe")
    result = run_verify(pkg, "--source", FIXTURES / MOE, "--moe-check", "--top", "3")
    assert result.exit_code == 0, result.output
    for words in ("checksums", "worst 3 of 31 weights", "MoE layers", "OK:"):
        assert words in result.stdout


def test_exact_power_of_two_source_is_lossless(converted):
    """DeepSeek-style ue8m0 tile scales: MXFP8 under rceil converts without loss (contract section 4)."""
    report = verify(converted(DEEPSEEK, "w8a8-mxfp8", "rceil"), VerifyOptions(source=FIXTURES / DEEPSEEK))
    mx8 = [t for t in report.tensors if t.type == "W8A8_MXFP8"]
    assert mx8 and all(t.rel_err == 0 and math.isinf(t.sqnr_db) for t in mx8)
    floats = [t for t in report.tensors if t.type == "FLOAT"]
    assert floats and all(t.ok and t.rel_err == 0 for t in floats)  # kv_b_proj, resolved to BF16


# --- the corruption catalogue ------------------------------------------------------------------------


def test_dropped_tensor(package):
    pkg = package()
    name = "model.layers.0.input_layernorm.weight"
    edit_shard(pkg, lambda t: t.pop(name))
    reseal(pkg)
    report = verify(pkg)
    assert failed(report) == {"coverage", "index"}
    assert f"{name!r} is described (FLOAT) but in no shard" in problems(report, "coverage")
    assert f"maps {name!r} to {SHARD} but no shard holds it" in problems(report, "index")


def test_extra_tensor(package):
    pkg = package()
    name = "model.layers.0.mlp.extra.weight"
    edit_shard(pkg, lambda t: t.__setitem__(name, ("BF16", (4,), bytes(8))))
    reseal(pkg)
    report = verify(pkg)
    assert failed(report) == {"coverage", "index"}
    assert f"{name!r} is in {SHARD} but not described" in problems(report, "coverage")


@pytest.mark.parametrize(
    "tensor, dtype, words",
    [
        (Q + ".weight", "U8", "is U8; a W8A8_MXFP8 weight must be F8_E4M3"),
        (Q + ".weight_scale", "F8_E8M0", "is F8_E8M0; a W8A8_MXFP8 scale must be U8"),
        (Q + ".bias", "BF16", "is BF16; the bias of a W8A8_MXFP8 layer must be F32"),
    ],
)
def test_wrong_dtype_code(package, tensor, dtype, words):
    pkg = package()

    def retype(t):
        old, shape, data = t[tensor]
        if dtype == "BF16":  # F32 -> BF16 halves the bytes
            data = np.frombuffer(data, np.float32).astype(elements.ml_dtypes.bfloat16).tobytes()
        t[tensor] = (dtype, shape, data)

    edit_shard(pkg, retype)
    reseal(pkg)
    report = verify(pkg)
    assert failed(report) == {"dtypes"}
    assert f"{tensor!r} ({SHARD}) {words}" in problems(report, "dtypes")


@pytest.mark.parametrize("tensor, dtype", [("model.layers.0.input_layernorm.weight", "I16"), (O + ".weight", "U8")])
def test_an_integer_weight_labelled_float_fails_dtypes(package, tensor, dtype):
    """The loader copies a FLOAT tensor into a float weight by value: I16 codes in a layernorm, or a
    W4A8 payload relabelled FLOAT with its scale dropped, once passed verify."""
    pkg = package(scheme="w4a8-mxfp")
    if tensor == O + ".weight":
        drop_everywhere(pkg, [O + ".weight_scale"])
        desc = read_json(pkg / DESCRIPTION)
        desc[tensor] = "FLOAT"
        write_json(pkg / DESCRIPTION, desc)
    edit_shard(pkg, lambda t: t.__setitem__(tensor, (dtype, *t[tensor][1:])))
    reseal(pkg)
    report = verify(pkg)
    assert failed(report) == {"dtypes"}
    assert problems(report, "dtypes") == (
        f"{tensor!r} ({SHARD}) is {dtype} but labelled FLOAT: the loader copies it into a float weight by value"
    )


def test_wrong_dtype_is_caught_numerically_too(package):
    pkg = package()
    edit_shard(pkg, lambda t: t.__setitem__(Q + ".weight", ("U8", *t[Q + ".weight"][1:])))
    reseal(pkg)
    report = verify(pkg, VerifyOptions(source=FIXTURES / DENSE))
    assert failed(report) == {"dtypes", "accuracy"}
    assert f"not measured: {Q}.weight: W8A8_MXFP8 weight is U8" in problems(report, "accuracy")


def test_wrong_shape(package):
    pkg = package()
    name = Q + ".weight_scale"

    def transpose_header(t):
        dtype, (n, g), data = t[name]
        t[name] = (dtype, (g, n), data)

    edit_shard(pkg, transpose_header)
    reseal(pkg)
    report = verify(pkg)
    assert failed(report) == {"shapes"}
    assert f"{name!r} ({SHARD}) has shape [8, 128]; W8A8_MXFP8 weight {Q + '.weight'!r} [128, 256]" in problems(
        report, "shapes"
    )
    assert "needs [128, 8]" in problems(report, "shapes")


def test_truncated_shard(package):
    pkg = package(MOE)
    shard = pkg / SHARD
    shard.write_bytes(shard.read_bytes()[:-100])
    report = verify(pkg)
    assert failed(report) == {"headers", "checksums"}
    assert SHARD in problems(report, "headers") and "truncated" in problems(report, "headers")
    # a shard whose header cannot be read is not hashed at all: no time spent on a file already wrong
    assert f"{SHARD}: not hashed, its header cannot be read" in problems(report, "checksums")


def test_flipped_byte(package):
    pkg = package()
    header = read_header(pkg / SHARD)
    entry = header.tensors["model.embed_tokens.weight"]
    raw = bytearray((pkg / SHARD).read_bytes())
    raw[entry.offset + 1000] ^= 0x01  # the low byte of a BF16 value: never NaN, only the checksum sees it
    (pkg / SHARD).write_bytes(bytes(raw))
    report = verify(pkg)
    assert failed(report) == {"checksums"}
    assert f"{SHARD}: blake3" in problems(report, "checksums") and "recorded at conversion" in problems(report, "checksums")
    assert verify(pkg, VerifyOptions(checksums=False)).ok


def as_sha256_package(pkg: Path) -> None:
    """Rewrite provenance the way packages written before BLAKE3 recorded checksums: no "checksum"
    field, {"sha256": hex} per shard."""
    prov = read_json(pkg / PROVENANCE)
    assert prov.pop("checksum") == "blake3"
    prov["shards"] = {file: {"sha256": file_digest(pkg / file, "sha256")} for file in prov["shards"]}
    write_json(pkg / PROVENANCE, prov)


def test_package_with_sha256_checksums_still_verifies(package):
    pkg = package(MOE)
    as_sha256_package(pkg)
    report = verify(pkg)
    assert report.ok
    assert report.check("checksums").detail.startswith("1 shard matches the sha256 recorded at conversion: it holds ")
    raw = bytearray((pkg / SHARD).read_bytes())
    raw[-1] ^= 0x01
    (pkg / SHARD).write_bytes(bytes(raw))
    report = verify(pkg)
    assert failed(report) == {"checksums"}
    assert f"{SHARD}: sha256" in problems(report, "checksums")


def test_unknown_checksum_algorithm_fails_provenance(package):
    pkg = package()
    prov = read_json(pkg / PROVENANCE)
    prov["checksum"] = "md5"
    write_json(pkg / PROVENANCE, prov)
    report = verify(pkg)
    assert "provenance" in failed(report)
    assert "checksum is 'md5', expected one of blake3, sha256" in problems(report, "provenance")


def test_stale_safetensors(package):
    pkg = package()
    shutil.copyfile(FIXTURES / DENSE / "model.safetensors", pkg / "model.safetensors")
    report = verify(pkg)
    assert failed(report) == {"files"}
    assert "stray file model.safetensors" in problems(report, "files")
    assert "vLLM loads every *.safetensors" in problems(report, "files")


def test_leftover_quantization_config(package):
    pkg = package()
    config = read_json(pkg / "config.json")
    config["quantization_config"] = read_json(FIXTURES / DENSE / "config.json")["quantization_config"]
    write_json(pkg / "config.json", config)
    report = verify(pkg)
    assert failed(report) == {"config", "copies"}
    assert "config.json keeps quantization_config" in problems(report, "config")
    assert "config.json: sha256" in problems(report, "copies")


def transplant(pkg: Path, donor: Path, prefixes: list[str]) -> None:
    """Replace modules of `pkg` with the same modules of `donor` (another scheme), labels included,
    keeping everything else consistent (the provenance records the --override that asks for their
    type): a package whose only fault is a mixed group."""
    donor_tensors = load_shard(donor / SHARD)
    donor_desc = read_json(donor / DESCRIPTION)
    desc = read_json(pkg / DESCRIPTION)

    def swap(t):
        for prefix in prefixes:
            for suffix in (".weight", ".weight_scale"):
                t[prefix + suffix] = donor_tensors[prefix + suffix]
                desc[prefix + suffix] = donor_desc[prefix + suffix]

    edit_shard(pkg, swap)
    desc["model_quant_type"] = "W4A8_MXFP"
    write_json(pkg / DESCRIPTION, desc)
    prov = read_json(pkg / PROVENANCE)
    prov["overrides"] = [f"{prefix}={desc[prefix + '.weight']}" for prefix in prefixes]
    write_json(pkg / PROVENANCE, prov)
    reseal(pkg)


def test_mixed_types_in_packed_group(package, converted):
    pkg = package(DENSE, "w8a8-mxfp8")
    transplant(pkg, converted(DENSE, "w4a8-mxfp"), [Q])
    report = verify(pkg)
    assert failed(report) == {"packed_groups"}
    text = problems(report, "packed_groups")
    assert "packed module model.layers.0.self_attn.qkv_proj mixes types" in text
    assert "W8A8_MXFP8: k_proj, v_proj; W4A8_MXFP: q_proj" in text


def test_mixed_types_in_moe_layer(package, converted):
    pkg = package(MOE, "w8a8-mxfp8")
    expert = "model.layers.1.mlp.experts.2"
    transplant(pkg, converted(MOE, "w4a8-mxfp"), [f"{expert}.{p}" for p in ("gate_proj", "up_proj", "down_proj")])
    report = verify(pkg)
    assert failed(report) == {"packed_groups"}
    text = problems(report, "packed_groups")
    assert "MoE layer model.layers.1.mlp.experts mixes types" in text
    assert "W4A8_MXFP: experts.2.down_proj, experts.2.gate_proj, experts.2.up_proj" in text
    # the MoE check refuses the layer rather than mixing experts
    report = verify(pkg, VerifyOptions(source=FIXTURES / MOE, moe_check=True, moe_layers=0))
    assert "not checked: model.layers.1.mlp: experts mix types" in problems(report, "moe")


def test_scale_byte_255(package):
    pkg = package()
    name = Q + ".weight_scale"

    def poison(t):
        dtype, shape, data = t[name]
        raw = bytearray(data)
        raw[5 * shape[1] + 3] = 255
        t[name] = (dtype, shape, bytes(raw))

    edit_shard(pkg, poison)
    report = verify(pkg)  # the checksum no longer vouches for the shard: its tensors are scanned
    assert failed(report) == {"scales", "checksums"}
    assert f"{name!r} ({SHARD}) holds the E8M0 NaN byte 255 at row 5, group 3" in problems(report, "scales")
    reseal(pkg)
    report = verify(pkg, VerifyOptions(checksums=False))  # e.g. a package written by another tool
    assert failed(report) == {"scales"}
    assert "row 5, group 3" in problems(report, "scales")


def test_nan_code_in_fp8_payload(package):
    pkg = package()
    name = Q + ".weight"

    def poison(t):
        dtype, shape, data = t[name]
        raw = bytearray(data)
        raw[7 * shape[1] + 9] = 0xFF
        t[name] = (dtype, shape, bytes(raw))

    edit_shard(pkg, poison)
    report = verify(pkg)
    assert failed(report) == {"payload", "checksums"}
    assert f"{name!r} ({SHARD}) holds the E4M3 NaN code 0xFF at row 7, column 9" in problems(report, "payload")
    reseal(pkg)
    report = verify(pkg, VerifyOptions(checksums=False))
    assert failed(report) == {"payload"}


def test_a_shard_whose_checksum_matches_is_hashed_not_scanned(package, monkeypatch):
    """Its bytes are those convert wrote (never a NaN code or scale 255): the scan is skipped and
    the report says so; without a recorded checksum every tensor is scanned."""
    pkg = package()
    scanned = []
    monkeypatch.setattr(verify_integrity, "_scan_chunk", lambda lay, entry, *args: scanned.append(entry.name))
    report = verify(pkg)
    assert report.ok and scanned == []
    assert "1 shard not scanned: its checksum matches, so it holds the bytes" in report.check("scales").detail
    verify(pkg, VerifyOptions(checksums=False))
    assert Q + ".weight" in scanned and Q + ".weight_scale" in scanned


@pytest.mark.parametrize(
    "scheme, tp, words",
    [
        ("w8a8-mxfp8", 2, "model.layers.1.mlp.down_proj (W8A8_MXFP8, row-parallel): K/T = 160/2 = 80 is not a multiple of 32"),
        ("w4a8-mxfp", 2, "model.layers.0.mlp.down_proj (W4A8_MXFP, row-parallel): K/T = 192/2 = 96 is not a multiple of 64"),
        ("w8a8-mxfp8", 3, "model.layers.0.self_attn.q_proj (W8A8_MXFP8, column-parallel): N=128 does not split over 3 ranks"),
    ],
)
def test_k_misaligned_for_tp(converted, scheme, tp, words):
    pkg = converted(DENSE, scheme)
    assert verify(pkg).ok
    report = verify(pkg, VerifyOptions(tp=tp))
    assert failed(report) == {"tp"}
    assert words in problems(report, "tp")
    result = run_verify(pkg, "--tp", tp)
    assert result.exit_code == 1 and "tp" in result.stdout


def test_tp_rules_pass_where_splits_align(converted):
    # the MoE fixture: every K is 128, every N a multiple of 64; one KV head is replicated, not split
    assert verify(converted(MOE, "w4a8-mxfp"), VerifyOptions(tp=2)).ok
    report = verify(converted(DENSE, "w8a8-mxfp8"), VerifyOptions(tp=4))
    assert "k_proj" not in problems(report, "tp")  # 1 KV head: replicated over 4 ranks


def test_description_group_size_and_model_quant_type(package):
    pkg = package()
    desc = read_json(pkg / DESCRIPTION)
    desc["group_size"] = 0
    desc["model_quant_type"] = "W4A8_MXFP"
    write_json(pkg / DESCRIPTION, desc)
    report = verify(pkg)
    assert failed(report) == {"description", "copies"}  # copies: the file is not the one written
    text = problems(report, "description")
    assert "group_size is 0, expected the integer 32" in text
    assert "model_quant_type is 'W4A8_MXFP' but the highest type present is 'W8A8_MXFP8'" in text


def test_an_input_embedding_described_as_mx_is_named(package):
    pkg = package()
    desc = read_json(pkg / DESCRIPTION)
    desc["model.embed_tokens.weight"] = "W8A8_MXFP8"
    write_json(pkg / DESCRIPTION, desc)
    report = verify(pkg)
    assert "description" in failed(report)
    assert ("'model.embed_tokens.weight' is labelled W8A8_MXFP8: an input embedding, whose rows vLLM looks up, and "
            "vllm-ascend has no MX embedding lookup") in problems(report, "description")


def test_description_missing_an_entry(package):
    pkg = package()
    desc = read_json(pkg / DESCRIPTION)
    del desc[Q + ".weight_scale"]
    write_json(pkg / DESCRIPTION, desc)
    report = verify(pkg)
    assert failed(report) == {"coverage", "pairs", "copies"}
    assert f"{Q + '.weight_scale'!r} is in {SHARD} but not described" in problems(report, "coverage")
    assert f"W8A8_MXFP8 weight {Q + '.weight'!r} has no {Q + '.weight_scale'!r}" in problems(report, "pairs")


def test_whole_moe_layer_missing_an_expert(package):
    pkg = package(MOE, "w4a8-mxfp")
    name = "model.layers.0.mlp.experts.1.up_proj"
    drop_everywhere(pkg, [name + ".weight", name + ".weight_scale"])
    report = verify(pkg)
    assert failed(report) == {"coverage"}
    assert "model.layers.0.mlp.experts.1 has no up_proj" in problems(report, "coverage")


def test_a_decoder_layer_missing_everywhere_fails_coverage(package):
    """vLLM builds num_hidden_layers layers: one no tensor is loaded into runs on uninitialised
    weights. Layer 1 dropped from description, index and shard (or config.json saying 3 layers)
    once passed verify."""
    pkg = package()
    drop_everywhere(pkg, [n for n in read_json(pkg / DESCRIPTION) if n.startswith("model.layers.1.")])
    report = verify(pkg)
    assert failed(report) == {"coverage"}
    assert problems(report, "coverage") == (
        f"config.json's num_hidden_layers is 2, but {DESCRIPTION} holds no tensor of layer 1: vLLM builds every "
        "layer and runs one it loaded nothing into on uninitialised weights"
    )
    pkg = package(name="more-layers")
    config = read_json(pkg / "config.json")
    config["num_hidden_layers"] = 10**12  # bounded by the names, not the count
    write_json(pkg / "config.json", config)
    reseal(pkg)
    assert "holds no tensor of layers 2, 3, 4, 5, 6 and 999999999993 more:" in problems(verify(pkg), "coverage")


def test_missing_shard_and_numbering(package, converted):
    pkg = package(MOE, "w8a8-mxfp8")
    (pkg / SHARD).unlink()
    report = verify(pkg)
    assert "files" in failed(report)
    assert f"shard {SHARD} is named by {INDEX}" in problems(report, "files") and "is missing" in problems(report, "files")


def test_index_total_size_wrong(package):
    pkg = package()
    index = read_json(pkg / INDEX)
    index["metadata"]["total_size"] += 1
    write_json(pkg / INDEX, index)
    report = verify(pkg)
    assert failed(report) == {"index", "copies"}
    assert "metadata.total_size is" in problems(report, "index")
    assert f"{INDEX}: sha256" in problems(report, "copies")


def test_no_provenance(package):
    pkg = package()
    (pkg / PROVENANCE).unlink()
    report = verify(pkg)
    assert failed(report) == {"checksums"} and report.check("provenance").skipped
    assert "no ascendconv_provenance.json" in problems(report, "checksums")
    assert verify(pkg, VerifyOptions(checksums=False)).ok


def test_changed_payload_byte_caught_by_exact(package):
    """A resealed package with one payload byte changed: the structure is fine, --exact is not."""
    pkg = package()
    name = Q + ".weight"

    def nudge(t):
        dtype, shape, data = t[name]
        raw = bytearray(data)
        raw[11] = raw[11] ^ 0x01 if (raw[11] ^ 0x01) & 0x7F != 0x7F else raw[11] ^ 0x02
        t[name] = (dtype, shape, bytes(raw))

    edit_shard(pkg, nudge)
    reseal(pkg)
    assert verify(pkg).ok
    report = verify(pkg, VerifyOptions(source=FIXTURES / DENSE, exact="sample"))
    assert failed(report) == {"exact"}
    assert f"{name!r} payload: 1 byte in 1 row differs from the reference; first at row 0, byte 11" in problems(report, "exact")


# --- tampering: a package damaged, then resealed (checksums re-recorded), against its source ------

EXPERT = "model.layers.0.mlp.experts.1.up_proj"


def tamper(pkg: Path, name: str, edit) -> None:
    """Apply edit(raw bytearray, row bytes) to one tensor of the shard, then reseal the package."""

    def change(t):
        dtype, shape, data = t[name]
        raw = bytearray(data)
        edit(raw, len(raw) // shape[0])
        t[name] = (dtype, shape, bytes(raw))

    edit_shard(pkg, change)
    reseal(pkg)


def zero_row(row):
    def edit(raw, width):
        raw[row * width : (row + 1) * width] = bytes(width)

    return edit


def raise_scales(row, groups=None):
    """Raise the scale bytes of one row (or some of its groups) by one step (x2)."""

    def edit(raw, width):
        for g in range(width) if groups is None else groups:
            raw[row * width + g] += 1

    return edit


def flip_bits(row, columns):
    def edit(raw, width):
        for c in columns:
            raw[row * width + c] ^= 0x01  # a low mantissa / FP4 bit: never makes a NaN code

    return edit


@pytest.mark.parametrize(
    ("scheme", "tensor", "edit", "row", "what"),
    [
        ("w4a8-mxfp-moe", EXPERT + ".weight", zero_row(17), 17, "payload"),
        ("w8a8-mxfp8", EXPERT + ".weight", zero_row(100), 100, "payload"),
        ("w4a8-mxfp-moe", EXPERT + ".weight_scale", raise_scales(5), 5, "scale"),
        ("w8a8-mxfp8", Q + ".weight_scale", raise_scales(9, groups=[3]), 9, "scale"),
        ("w4a8-mxfp-moe", Q + ".weight", flip_bits(66, [0, 7, 40]), 66, "payload"),
    ],
    ids=["expert-row-zeroed-w4", "expert-row-zeroed-w8", "row-scales-raised", "one-group-scale-raised", "payload-bits"],
)
def test_resealed_tampering_is_caught_by_source_naming_tensor_and_row(package, scheme, tensor, edit, row, what):
    """Checksums prove only that shards are what provenance says; a resealed package passes
    without --source by construction, and --source (no --exact) re-derives the bytes and names
    the damaged tensor and row."""
    fixture = MOE if tensor.startswith(EXPERT) else DENSE
    pkg = package(fixture, scheme)
    tamper(pkg, tensor, edit)
    assert verify(pkg).ok  # what the checksums cannot see
    report = verify(pkg, VerifyOptions(source=FIXTURES / fixture))
    assert "exact" in failed(report) and failed(report) <= {"exact", "accuracy"}
    message = problems(report, "exact")
    assert f"{tensor!r} {what}:" in message and f"first at row {row}," in message
    assert " in 1 row differ" in message  # "1 byte in 1 row differs", "3 bytes in 1 row differ"


def test_sample_rederives_a_seeded_share_of_every_weight(converted):
    pkg = converted(DEEPSEEK, "w8a8-mxfp8")
    full = verify(pkg, VerifyOptions(source=FIXTURES / DEEPSEEK))
    half = verify(pkg, VerifyOptions(source=FIXTURES / DEEPSEEK, sample=0.5, seed=3))
    assert full.ok and half.ok
    assert "every row" in full.check("exact").detail
    rows = [int(w) for w in half.check("exact").detail.split()[:3:2]]  # "R of T rows (--sample 0.5, seed 3 ...)"
    assert 0 < rows[0] < rows[1] and "--sample 0.5, seed 3" in half.check("exact").detail
    again = verify(pkg, VerifyOptions(source=FIXTURES / DEEPSEEK, sample=0.5, seed=3))
    assert again.check("exact").detail == half.check("exact").detail
    assert {t.name for t in half.tensors} == {t.name for t in full.tensors}  # every weight measured


@pytest.mark.parametrize("argv", [["--sample", "0"], ["--sample", "1.5"], ["--sample", "0.5", "--exact-full"]])
def test_bad_sample_is_a_usage_error(converted, argv):
    result = run_verify(converted(DENSE, "w8a8-mxfp8"), "--source", FIXTURES / DENSE, *argv)
    assert result.exit_code == 2, result.output


def test_accuracy_threshold_names_the_worst_tensor(converted):
    pkg = converted(DENSE, "w4a8-mxfp")
    report = verify(pkg, VerifyOptions(source=FIXTURES / DENSE, min_sqnr_mxfp4=19.0))
    assert failed(report) == {"accuracy"}
    worst = report.tensors[0]
    assert worst.type == "W4A8_MXFP" and not worst.ok
    assert f"{worst.name!r} (W4A8_MXFP): SQNR {worst.sqnr_db:.1f} dB < 19 dB" in problems(report, "accuracy")


def test_wrong_source(converted):
    report = verify(converted(DENSE, "w8a8-mxfp8"), VerifyOptions(source=FIXTURES / MOE))
    assert "source" in failed(report)
    assert "the package was converted from shards ['model.safetensors']" in problems(report, "source")


def test_copied_tensor_modified_is_caught_by_source(package):
    pkg = package()
    name = "model.norm.weight"

    def change(t):
        dtype, shape, data = t[name]
        raw = bytearray(data)
        raw[0] ^= 0x01
        t[name] = (dtype, shape, bytes(raw))

    edit_shard(pkg, change)
    reseal(pkg)
    report = verify(pkg, VerifyOptions(source=FIXTURES / DENSE))
    assert failed(report) == {"source"}
    assert f"{name!r} ({SHARD}) differs from the source copy at byte 0" in problems(report, "source")


# --- exit codes -----------------------------------------------------------------------------------


def test_exit_codes(converted, tmp_path, package):
    pkg = converted(DENSE)
    assert run_verify(pkg).exit_code == 0
    assert run_verify(tmp_path / "nope").exit_code == 3
    (tmp_path / "empty").mkdir()
    result = run_verify(tmp_path / "empty")
    assert result.exit_code == 3 and "not an AscendV1 package" in result.stderr
    assert run_verify(pkg, "--source", tmp_path / "nope").exit_code == 3
    for extra in (["--exact"], ["--moe-check"], ["--tp", "0"], ["--beta", "0"], ["--tp", "x"]):
        assert run_verify(pkg, *extra).exit_code == 2, extra
    broken = package(name="broken")
    shutil.copyfile(FIXTURES / DENSE / "model.safetensors", broken / "model.safetensors")
    result = run_verify(broken, "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["failed"] == ["files"]


# --- MoE chain against float64 ---------------------------------------------------------------------


def situ64(h: np.ndarray, beta: float, linear_beta: float) -> np.ndarray:
    half = h.shape[1] // 2
    gate, up = h[:, :half], h[:, half:]
    return beta * np.tanh(gate / beta) / (1.0 + np.exp(-gate)) * linear_beta * np.tanh(up / linear_beta)


def test_situ_float_and_down_match_float64():
    rng = np.random.default_rng(5)
    x = elements.bf16_round(rng.standard_normal((24, 256), dtype=np.float32))
    w13 = elements.bf16_round((rng.standard_normal((256, 256)) * 0.05).astype(np.float32))
    w2 = elements.bf16_round((rng.standard_normal((256, 128)) * 0.05).astype(np.float32))
    y = verify_moe.situ_float(x, w13, 4.0, 25.0)
    want = situ64(x.astype(np.float64) @ w13.astype(np.float64).T, 4.0, 25.0)
    assert np.linalg.norm(y - want) / np.linalg.norm(want) < 2**-7  # two BF16 roundings
    out = verify_moe.down_float(y, w2)
    want_out = want @ w2.astype(np.float64).T
    assert np.linalg.norm(out - want_out) / np.linalg.norm(want_out) < 2**-7
    q = verify_moe.mx_output(y)  # E4M3 (3 mantissa bits) under the floor rule, which saturates: ~3% overall
    assert np.linalg.norm(q - y) / np.linalg.norm(y) < 0.04


def test_float_chain_equals_the_gmm_situ_reference():
    """The float chain (used for W8A8 / FLOAT experts and for the source) is the op's reference
    chain, bit for bit, when given the dequantized FP4 weights."""
    rng = np.random.default_rng(9)
    e, inter, k = 3, 64, 128
    x_codes, x_scales, _ = gmm_situ.make_activations(3, 20, k)
    weights = (rng.standard_normal((e, 2 * inter, k)) * 0.1).astype(np.float32)
    codes, scales = mx.quantize_mx(weights, E2M1, "mse")
    w_packed = elements.pack_fp4(codes)
    counts = np.array([7, 0, 13])
    y_codes, y_scales = gmm_situ.gmm_situ_quant_reference(GmmSituInputs(x_codes, x_scales, w_packed, scales, counts, 4.0, 25.0))
    y_float = gmm_situ.gmm_situ_float(GmmSituInputs(x_codes, x_scales, w_packed, scales, counts, 4.0, 25.0))
    x = gmm_situ.dequantize_activations(x_codes, x_scales)
    start = 0
    for expert, count in enumerate(counts):
        rows = slice(start, start + count)
        w = gmm_situ.dequantize_expert_weight(w_packed[expert], scales[expert])
        y = verify_moe.situ_float(x[rows], w, 4.0, 25.0)
        assert np.array_equal(y, y_float[rows])
        assert np.array_equal(verify_moe.mx_output(y), mx.dequantize_mx(y_codes[rows], y_scales[rows], E4M3))
        start += count


def _expert_float(reader, entry_w, entry_s, quant_type):
    payload = reader.read(entry_w)
    if quant_type == "W4A8_MXFP":
        return mx.dequantize_mx(elements.unpack_fp4(payload), reader.read(entry_s), E2M1).astype(np.float64)
    return mx.dequantize_mx(payload, reader.read(entry_s), E4M3).astype(np.float64)


def moe_figures64(pkg: Path, report, options: VerifyOptions, activations, package_weight, inner) -> None:
    """Recompute each sampled layer's --moe-check figures in float64 from the files and compare:
    `activations(x_codes, x_scales, x_bf16)` is what gate/up consume, `package_weight(reader,
    weight entry, scale entry)` a package expert as float64, `inner(y)` what down_proj consumes."""
    source = Source.open(options.source)
    headers = read_header(pkg / SHARD).tensors
    with TensorReader() as reader:
        for moe in report.moe:
            layer = moe.layer
            x_codes, x_scales, x_bf16, counts = verify_moe._layer_inputs(layer, 128, 4, options)
            x = activations(x_codes, x_scales, x_bf16).astype(np.float64)
            starts = np.concatenate([[0], np.cumsum(counts)])
            y_src, y_pkg, o_src, o_pkg, o_bf16 = [], [], [], [], []
            for e in range(4):
                rows = x[starts[e] : starts[e + 1]]
                rows_bf16 = x_bf16[starts[e] : starts[e + 1]].astype(np.float64)

                def src(p):
                    linear = source.linears[f"{layer}.experts.{e}.{p}"]
                    codes = source.reader.read(linear.weight)
                    return resolve.resolve_tiles(codes, source.read_scale(linear), (128, 128), "bf16").astype(np.float64)

                def pkg_w(p):
                    name = f"{layer}.experts.{e}.{p}"
                    return package_weight(reader, headers[name + ".weight"], headers[name + ".weight_scale"])

                ys = situ64(rows @ np.concatenate([src("gate_proj"), src("up_proj")]).T, 4.0, 25.0)
                yp = situ64(rows @ np.concatenate([pkg_w("gate_proj"), pkg_w("up_proj")]).T, 4.0, 25.0)
                y_src.append(ys)
                y_pkg.append(yp)
                o_src.append(ys @ src("down_proj").T)
                o_pkg.append(inner(yp.astype(np.float32)).astype(np.float64) @ pkg_w("down_proj").T)
                o_bf16.append(situ64(rows_bf16 @ np.concatenate([src("gate_proj"), src("up_proj")]).T, 4.0, 25.0) @ src("down_proj").T)
            y_src, y_pkg = np.concatenate(y_src), np.concatenate(y_pkg)
            o_src, o_pkg, o_bf16 = np.concatenate(o_src), np.concatenate(o_pkg), np.concatenate(o_bf16)
            rel_situ = np.linalg.norm(y_pkg - y_src) / np.linalg.norm(y_src)
            rel = np.linalg.norm(o_pkg - o_src) / np.linalg.norm(o_src)
            assert moe.rel_err_bf16 == pytest.approx(np.linalg.norm(o_pkg - o_bf16) / np.linalg.norm(o_bf16), rel=0.05)
            assert moe.rel_err_situ == pytest.approx(rel_situ, rel=0.02), (layer, moe.rel_err_situ, rel_situ)
            assert moe.rel_err == pytest.approx(rel, rel=0.05), (layer, moe.rel_err, rel)
            assert moe.tokens == 64 and moe.experts == 4
    source.close()


@pytest.mark.parametrize("scheme", ["w4a8-mxfp", "w8a8-mxfp8"])
def test_moe_check_matches_float64(converted, scheme):
    """The figures of --moe-check, recomputed straightforwardly in float64 from the files."""
    pkg = converted(MOE, scheme)
    options = VerifyOptions(source=FIXTURES / MOE, moe_check=True, moe_layers=0)
    report = verify(pkg, options)
    assert report.ok and len(report.moe) == 2
    quant_type = "W4A8_MXFP" if scheme == "w4a8-mxfp" else "W8A8_MXFP8"
    moe_figures64(
        pkg,
        report,
        options,
        lambda codes, scales, _: gmm_situ.dequantize_activations(codes, scales),
        lambda reader, w, s: _expert_float(reader, w, s, quant_type),
        verify_moe.mx_output,
    )


def test_moe_threshold_and_sampling(converted):
    pkg = converted(MOE, "w4a8-mxfp")
    report = verify(pkg, VerifyOptions(source=FIXTURES / MOE, moe_check=True, moe_layers=1, max_moe_rel_err=0.01))
    assert failed(report) == {"moe"} and [m.layer for m in report.moe] == ["model.layers.0.mlp"]
    assert "model.layers.0.mlp (W4A8_MXFP): MoE output rel. error" in problems(report, "moe")
    assert verify_moe.sample_layers([f"l{i}" for i in range(10)], 3) == ["l0", "l4", "l9"]
    counts = verify_moe.routing_counts(0, 3, 64, 8)
    assert counts.sum() == 64 and np.array_equal(counts, verify_moe.routing_counts(0, 3, 64, 8))


# --- --on-npu ------------------------------------------------------------------------------------


def test_on_npu_without_an_npu_is_the_environments_problem_exit_4(converted, monkeypatch):
    monkeypatch.setattr(npu_module, "npu_available", lambda: (False, "no NPU device is visible (test)"))
    pkg = converted(MOE, "w4a8-mxfp-moe")
    with pytest.raises(NpuUnavailableError, match="cannot run here: no NPU device is visible"):
        verify(pkg, VerifyOptions(on_npu=True))
    result = run_verify(pkg, "--on-npu")
    assert result.exit_code == 4 and "no NPU device is visible" in result.stderr
    assert "ascendconv[npu]" in result.stderr  # how to get what is missing
    result = run_verify(pkg, "--on-npu", "--json")
    assert result.exit_code == 4 and json.loads(result.stdout.splitlines()[0])["error"] == "NpuUnavailableError"


def test_on_npu_real_probe(converted):
    """Whatever this machine is, --on-npu never crashes; without an NPU it names npu_available's reason."""
    available, reason = npu_module.npu_available()
    if available:
        assert verify(converted(MOE, "w4a8-mxfp-moe"), VerifyOptions(on_npu=True)).check("npu").ok
    else:
        with pytest.raises(NpuUnavailableError) as raised:
            verify(converted(MOE, "w4a8-mxfp-moe"), VerifyOptions(on_npu=True))
        assert reason in raised.value.message


def test_on_npu_not_applicable_without_w4a8_experts(converted, monkeypatch):
    monkeypatch.setattr(npu_module, "npu_available", lambda: (False, "unused"))
    report = verify(converted(MOE, "w8a8-mxfp8"), VerifyOptions(on_npu=True))
    check = report.check("npu")
    assert check.ok and check.skipped and "W4A8_MXFP" in check.detail


def test_on_npu_compares_with_the_reference(converted, monkeypatch):
    calls = []

    def fake_run(inputs, **kwargs):
        calls.append(inputs.w_packed.shape)
        return gmm_situ.gmm_situ_quant_reference(inputs)

    monkeypatch.setattr(npu_module, "npu_available", lambda: (True, "fake Ascend950"))
    monkeypatch.setattr(npu_module, "run_gmm_situ_on_npu", fake_run)
    pkg = converted(MOE, "w4a8-mxfp-moe")
    report = verify(pkg, VerifyOptions(on_npu=True, moe_layers=0))
    assert report.ok and len(report.npu) == 2 and calls == [(4, 256, 64), (4, 256, 64)]
    assert all(r.rel_err == 0 and r.codes_equal == 1.0 for r in report.npu)

    def wrong_layout(inputs, **kwargs):  # gate and up swapped: what a wrong w13 order would do
        w, s = inputs.w_packed, inputs.w_scales
        swapped = np.concatenate([w[:, 128:], w[:, :128]], axis=1)
        s_swapped = np.concatenate([s[:, 128:], s[:, :128]], axis=1)
        return gmm_situ.gmm_situ_quant_reference(dataclasses.replace(inputs, w_packed=swapped, w_scales=s_swapped))

    monkeypatch.setattr(npu_module, "run_gmm_situ_on_npu", wrong_layout)
    report = verify(pkg, VerifyOptions(on_npu=True))
    assert failed(report) == {"npu"}
    assert "model.layers.0.mlp: NPU output differs from the CPU reference by rel. error" in problems(report, "npu")


# --- the registry, and errors that are findings versus bugs -----------------------------------------


def test_every_check_is_declared_in_the_registry_in_the_order_it_runs(converted):
    report = verify(converted(MOE, "w4a8-mxfp"), VerifyOptions(tp=2, source=FIXTURES / MOE, moe_check=True))
    names = [c.name for c in report.checks]
    assert names == sorted(names, key=list(v.CHECKS).index)
    assert set(v.CHECKS) - set(names) == {"npu"}
    assert all(v.CHECKS[name].family in ("structure", "integrity", "accuracy", "moe", "npu") for name in v.CHECKS)
    with pytest.raises(KeyError):  # a check without a declaration is a programming error
        verify_checks.make_check("undeclared", ["a problem"], "")


def test_a_shard_cut_short_while_scanned_is_a_finding_a_bug_is_a_traceback(package, monkeypatch):
    pkg = package()
    prov = read_json(pkg / PROVENANCE)
    prov["shards"][SHARD][prov["checksum"]] = "0" * 64  # the checksum no longer vouches: the shard is scanned
    write_json(pkg / PROVENANCE, prov)

    def cut_short(lay, entry, *args):
        raise TruncatedFileError(f"{entry.path}: tensor {entry.name!r} is cut short (truncated file)")

    monkeypatch.setattr(verify_integrity, "_scan_chunk", cut_short)
    report = verify(pkg)
    assert failed(report) == {"checksums"}
    assert f"{SHARD}: {pkg / SHARD}: tensor" in problems(report, "checksums")
    assert "is cut short (truncated file)" in problems(report, "checksums")

    def bug(lay, entry, *args):
        raise KeyError(entry.name)

    monkeypatch.setattr(verify_integrity, "_scan_chunk", bug)
    with pytest.raises(KeyError):
        verify(pkg)


def test_a_failing_npu_operator_is_a_finding_a_bug_is_a_traceback(converted, monkeypatch):
    def device_error(inputs, **kwargs):
        raise RuntimeError("ACL error 507015: aicore execution failed")

    monkeypatch.setattr(npu_module, "npu_available", lambda: (True, "fake Ascend950"))
    monkeypatch.setattr(npu_module, "run_gmm_situ_on_npu", device_error)
    pkg = converted(MOE, "w4a8-mxfp-moe")
    report = verify(pkg, VerifyOptions(on_npu=True))
    assert failed(report) == {"npu"}
    assert (
        "model.layers.0.mlp: GroupedMatmulSituQuant failed on the NPU: RuntimeError: ACL error 507015"
        in problems(report, "npu")
    )

    def bug(inputs, **kwargs):
        raise TypeError("run_gmm_situ_on_npu() got an unexpected keyword argument")

    monkeypatch.setattr(npu_module, "run_gmm_situ_on_npu", bug)
    with pytest.raises(TypeError):
        verify(pkg, VerifyOptions(on_npu=True))
