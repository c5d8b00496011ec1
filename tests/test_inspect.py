"""`inspect`: recognition, headers-only summaries of sources and packages, the tensor table, --json,
80-column rendering, the HF cache, corrupt inputs, and a 1,000-shard checkpoint."""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st
from rich.console import Console
from safetensors import safe_open
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.ascendv1 import QUANT_TYPES
from ascendconv.cli.render.inspect import render_inspect
from ascendconv.cli.render.tables import elide_middle, elide_name, human_bytes
from ascendconv.convert import ConvertOptions, plan_for
from ascendconv.errors import (
    MissingScaleError,
    MissingShardError,
    NotBlockFP8Error,
    NotCachedError,
    NotFoundError,
    PackageError,
    ScaleShapeError,
    TruncatedFileError,
    UnrecognizedCheckpointError,
    UnsupportedSourceError,
)
from ascendconv.inspect import KIND_PACKAGE, KIND_PLAIN, KIND_SOURCE, inspect_path
from ascendconv.decide import SCHEMES as DECIDE_SCHEMES, module_pattern
from ascendconv.io.safetensors import TensorReader, read_header
from ascendconv.io.writer import ShardWriter, TensorSpec
from ascendconv.sources import Source
from ascendconv.verify import VerifyOptions, verify
from conftest import FIXTURE_NAMES, FIXTURES, SCHEMES, load_shard, save_shard
from robust_helpers import replace_by_no_regular_file

runner = CliRunner()
DENSE, MOE, DEEPSEEK = "qwen3-dense-fp8", "qwen3-moe-fp8", "deepseek-v3-fp8"
JSON_KEYS = [
    "ok", "schema", "command", "kind", "path", "hub", "model", "quantization", "package", "files", "tensors", "structure", "deployment", "warnings",
    "groups", "schemes", "problems", "tensor_filter", "tensor_list",
]


def invoke(*args):
    return runner.invoke(app, ["inspect", *map(str, args)])


def package_of(converted, fixture: str, scheme: str) -> Path:
    return converted(fixture, scheme, "mse", kernel="reference")


# convert cannot yet write a resolved BF16 (FLOAT) weight: ShardWriter.write takes a memoryview of the
# bfloat16 array, which Python's buffer protocol refuses ("cannot include dtype 'E' in a buffer").
# DeepSeek's kv_b_proj is always FLOAT, so no DeepSeek package can be written until that is fixed.
def library_counts(root: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Tensors and bytes per dtype, from the safetensors library (an independent reader)."""
    counts: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    itemsize = {"F8_E4M3": 1, "U8": 1, "BF16": 2, "F16": 2, "F32": 4}
    for shard in sorted(root.glob("*.safetensors")):
        with safe_open(str(shard), "numpy") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                dtype = piece.get_dtype()
                counts[dtype] = counts.get(dtype, 0) + 1
                nbytes[dtype] = nbytes.get(dtype, 0) + math.prod(piece.get_shape()) * itemsize[dtype]
    return counts, nbytes


def render(report, width: int = 80) -> list[str]:
    """The report as a terminal `width` columns wide shows it (uncoloured)."""
    console = Console(width=width, record=True, color_system=None, force_terminal=True)
    render_inspect(report, console)
    return console.export_text().splitlines()


# --- sources ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
def test_every_fixture_is_recognised_and_counted_from_headers(fixture):
    root = FIXTURES / fixture
    report = inspect_path(root)
    assert report.kind == KIND_SOURCE
    counts, nbytes = library_counts(root)
    assert {d: c.tensors for d, c in report.by_dtype.items()} == counts
    assert {d: c.bytes for d, c in report.by_dtype.items()} == nbytes
    assert report.tensor_count == sum(counts.values())
    assert report.total_bytes == sum(p.stat().st_size for p in root.glob("*.safetensors"))
    assert [s.file for s in report.shards] == sorted(p.name for p in root.glob("*.safetensors"))
    config = json.loads((root / "config.json").read_text())
    assert report.model["model_type"] == config["model_type"]
    assert report.model["architectures"] == config["architectures"]
    assert report.layers == config["num_hidden_layers"] == 2
    # every F8 weight and its scale are FP8_BLOCK; the rest is FLOAT
    assert report.by_quant_type["FP8_BLOCK"].tensors == 2 * counts["F8_E4M3"] == 2 * report.fp8_linears
    assert report.quantization["weight_block_size"] == [128, 128]
    assert report.tensors is None and report.problems == []


def test_dense_fixture_summary_and_its_w4a8_fallback():
    report = inspect_path(FIXTURES / DENSE)
    assert report.by_dtype["F8_E4M3"].tensors == 14 and report.fp8_linears == 14  # 2 layers x 7 linears
    assert report.quantization["scale_dtypes"] == {"BF16": 14}
    assert report.by_dtype["BF16"].tensors == 14 + 17  # the scales plus 17 unquantized tensors
    assert report.index is None and len(report.shards) == 1
    assert (report.routed_experts, report.moe_layers) == (0, 0)

    k = read_header(FIXTURES / DENSE / "model.safetensors").tensors["model.layers.1.mlp.down_proj.weight"].shape[1]
    assert k % 32 == 0 and k % 64 != 0
    assert report.schemes["w8a8-mxfp8"].fallbacks == []
    (fallback,) = report.schemes["w4a8-mxfp"].fallbacks
    assert fallback.module == "model.layers.1.mlp.down_proj"
    assert (fallback.requested, fallback.written) == ("W4A8_MXFP", "W8A8_MXFP8")
    assert fallback.reason.startswith(f"K={k} is not a multiple of 64")
    assert report.schemes["w4a8-mxfp"].model_quant_type == "W4A8_MXFP"
    assert report.schemes["w4a8-mxfp"].modules == {
        "FLOAT": 0, "W8A8_MXFP8": 1, "W4A16_MXFP4": 0, "W4A8_MXFP": 13, "W4A4_MXFP4": 0
    }

    groups = {g.pattern: g for g in report.groups}
    down = groups["model.layers.*.mlp.down_proj"]
    assert down.modules == 2 and down.types == {"FP8_BLOCK": 2}
    assert down.schemes == {
        "w8a8-mxfp8": {"W8A8_MXFP8": 2},
        "w4a8-mxfp": {"W8A8_MXFP8": 1, "W4A8_MXFP": 1},
        "w4a8-mxfp-moe": {"W8A8_MXFP8": 2},
        "w4a16-mxfp4-moe": {"W8A8_MXFP8": 2},
        "w4a4-mxfp4": {"W4A4_MXFP4": 2},  # K=160: W4A4 linears take K % 32 (the loader pads)
        "w4a4-mxfp4-moe": {"W8A8_MXFP8": 2},
        "native": {"W8A8_MXFP8": 2},  # no MX linear in an FP8 source: as w8a8-mxfp8
    }
    assert groups["lm_head"].schemes["w4a8-mxfp"] == {"FLOAT": 1}


def test_moe_fixture_experts_shards_and_unquantized_module():
    report = inspect_path(FIXTURES / MOE)
    assert (report.layers, report.moe_layers, report.routed_experts) == (2, 2, 4)
    assert report.model["num_experts"] == 4
    assert len(report.shards) == 3 and report.index == "model.safetensors.index.json"
    assert report.quantization["scale_dtypes"] == {"F32": report.fp8_linears}
    assert "model.layers.0.self_attn.o_proj" in report.quantization["modules_to_not_convert"]
    assert report.by_dtype["F32"].tensors == report.by_dtype["F8_E4M3"].tensors == report.fp8_linears
    groups = {g.pattern: g for g in report.groups}
    experts = groups["model.layers.*.mlp.experts.*.down_proj"]
    assert experts.modules == 2 * 4
    assert experts.schemes["w4a8-mxfp-moe"] == {"W4A8_MXFP": 8}
    assert groups["model.layers.*.self_attn.q_proj"].schemes["w4a8-mxfp-moe"] == {"W8A8_MXFP8": 2}
    o_proj = groups["model.layers.*.self_attn.o_proj"]  # layer 0 left in BF16 by the checkpoint
    assert o_proj.types == {"FP8_BLOCK": 1, "FLOAT": 1} and o_proj.dtypes == {"BF16": 1, "F8_E4M3": 1}
    assert o_proj.schemes["w8a8-mxfp8"] == {"FLOAT": 1, "W8A8_MXFP8": 1}


def test_deepseek_fixture_mla_and_shared_experts():
    report = inspect_path(FIXTURES / DEEPSEEK)
    assert (report.layers, report.moe_layers, report.routed_experts) == (2, 1, 4)  # layer 0 is dense
    assert report.quantization["scale_fmt"] == "ue8m0"
    groups = {g.pattern: g for g in report.groups}
    for scheme in SCHEMES:
        assert groups["model.layers.*.self_attn.kv_b_proj"].schemes[scheme] == {"FLOAT": 2}
        assert report.schemes[scheme].modules["FLOAT"] == 2
    assert groups["model.layers.*.mlp.shared_experts.down_proj"].schemes["w4a8-mxfp-moe"] == {"W8A8_MXFP8": 1}
    assert groups["model.layers.*.mlp.experts.*.gate_proj"].schemes["w4a8-mxfp-moe"] == {"W4A8_MXFP": 4}


@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
def test_scheme_estimates_are_what_convert_plans(fixture):
    report = inspect_path(FIXTURES / fixture)
    source = Source.open(FIXTURES / fixture)
    for scheme in SCHEMES:
        plan = plan_for(source, ConvertOptions(scheme=scheme))
        estimate = report.schemes[scheme]
        assert estimate.bytes_out == plan.bytes_out
        assert estimate.model_quant_type == plan.model_quant_type
        assert estimate.tensors == plan.tensor_counts()
        assert [f.to_dict() for f in estimate.fallbacks] == [d.to_dict() for d in plan.fallbacks]


def test_nothing_beyond_headers_is_read(monkeypatch, converted):
    package = package_of(converted, MOE, "w4a8-mxfp-moe")

    def refuse(*args, **kwargs):
        raise AssertionError("inspect read tensor data")

    monkeypatch.setattr(TensorReader, "read_bytes", refuse)
    monkeypatch.setattr(Source, "read_scale", refuse)
    for root in [*(FIXTURES / f for f in FIXTURE_NAMES), package]:
        assert inspect_path(root, tensors="*").tensors


# --- packages -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fixture,scheme",
    [(DENSE, "w4a8-mxfp"), (MOE, "w4a8-mxfp-moe"), (DEEPSEEK, "w8a8-mxfp8")],
)
def test_package_written_by_convert_matches_the_source_estimate(converted, fixture, scheme):
    root = package_of(converted, fixture, scheme)
    report = inspect_path(root)
    assert report.kind == KIND_PACKAGE and report.problems == []
    source = inspect_path(FIXTURES / fixture)
    estimate = source.schemes[scheme]
    assert report.package["model_quant_type"] == estimate.model_quant_type
    assert report.package["group_size"] == 32 and report.package["version"] == "1.0.0"
    assert report.package["provenance"]["scheme"] == scheme
    assert report.package["provenance"]["fallbacks"] == len(estimate.fallbacks)
    assert report.tensor_bytes == estimate.bytes_out
    assert {t: c.tensors for t, c in report.by_quant_type.items()} == {
        t: n for t, n in estimate.tensors.items() if n
    }
    counts, nbytes = library_counts(root)
    assert {d: c.tensors for d, c in report.by_dtype.items()} == counts
    assert {d: c.bytes for d, c in report.by_dtype.items()} == nbytes
    # every module group carries the types the source report announced for this scheme
    expected = {g.pattern: g.schemes[scheme] for g in source.groups}
    assert {g.pattern: g.types for g in report.groups} == expected
    assert (report.layers, report.moe_layers, report.routed_experts) == (
        source.layers, source.moe_layers, source.routed_experts,
    )


def test_package_disagreements_are_reported_not_fixed(converted, tmp_path):
    root = tmp_path / "pkg"
    shutil.copytree(package_of(converted, MOE, "w4a8-mxfp-moe"), root)
    description_path = root / "quant_model_description.json"
    description = json.loads(description_path.read_text())
    described = "model.layers.0.self_attn.q_proj.weight"
    del description[described]
    description["model_quant_type"] = "W8A8_MXFP8"
    description_path.write_text(json.dumps(description))
    config = json.loads((root / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8"}
    (root / "config.json").write_text(json.dumps(config))
    before = {p.name: p.read_bytes() for p in root.iterdir()}

    report = inspect_path(root, tensors=described)
    assert [(t.name, t.quant_type) for t in report.tensors] == [(described, None)]
    assert report.by_quant_type["(undescribed)"].tensors == 1
    report = inspect_path(root)
    problems = "\n".join(report.problems)
    assert f"{described!r} is in" in problems and "not described" in problems
    assert "model_quant_type is 'W8A8_MXFP8' but the highest type described is 'W4A8_MXFP'" in problems
    assert "quantization_config" in problems
    assert {p.name: p.read_bytes() for p in root.iterdir()} == before  # nothing was fixed

    shard = sorted(root.glob("quant_model_weights-*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-100])
    report = inspect_path(root)
    assert any(shard.name in p and "truncated" in p for p in report.problems)
    assert [s.tensors for s in report.shards if s.file == shard.name] == [None]
    result = invoke(root)
    assert result.exit_code == 0 and "disagreement" in result.stdout and "unreadable" in result.stdout


def test_package_with_unreadable_or_missing_description_is_refused(converted, tmp_path):
    root = tmp_path / "pkg"
    shutil.copytree(package_of(converted, DENSE, "w8a8-mxfp8"), root)
    (root / "quant_model_description.json").write_text("{not json")
    with pytest.raises(PackageError, match="quant_model_description.json"):
        inspect_path(root)
    result = invoke(root, "--json")
    assert result.exit_code == 3 and json.loads(result.stdout.splitlines()[0])["error"] == "PackageError"
    (root / "quant_model_description.json").unlink()  # not mistaken for a plain checkpoint
    with pytest.raises(PackageError, match="no quant_model_description.json"):
        inspect_path(root)


# --- plain checkpoints and things that are not checkpoints ---------------------------------------


def write_checkpoint(root: Path, tensors: dict[str, tuple[str, tuple[int, ...]]], config: dict | None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (root / "config.json").write_text(json.dumps(config))
    specs = [TensorSpec(n, d, s) for n, (d, s) in tensors.items()]
    writer = ShardWriter(root / "model.safetensors", specs)
    for spec in specs:
        writer.write(spec.name, bytes(spec.nbytes))
    writer.close()
    return root


PLAIN = {
    "model.embed_tokens.weight": ("BF16", (64, 32)),
    "model.layers.0.self_attn.q_proj.weight": ("BF16", (32, 32)),
    "model.layers.1.self_attn.q_proj.weight": ("F16", (32, 32)),
    "model.layers.0.input_layernorm.weight": ("F32", (32,)),
    "model.layers.1.input_layernorm.weight": ("F32", (32,)),
}


def test_plain_float_checkpoint_is_a_float_source(tmp_path):
    """A BF16 / F16 checkpoint with linear projections converts (sources/plain.py): inspect reports it
    as a source of format "float", with what each scheme writes."""
    root = write_checkpoint(tmp_path / "plain", PLAIN, {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})
    report = inspect_path(root, tensors="*layernorm*")
    assert report.kind == "source" and report.quantization["format"] == "float"
    assert report.label == "plain float (BF16 / F16 / F32) checkpoint"
    assert report.quantization["fmt"] == "BF16/F16" and report.fp8_linears == 2
    assert {d: c.tensors for d, c in report.by_dtype.items()} == {"BF16": 2, "F16": 1, "F32": 2}
    assert report.schemes["w8a8-mxfp8"].modules["W8A8_MXFP8"] == 2
    assert report.layers == 2
    assert [t.name for t in report.tensors] == [
        "model.layers.0.input_layernorm.weight",
        "model.layers.1.input_layernorm.weight",
    ]
    result = invoke(root)
    assert result.exit_code == 0 and "plain float (BF16 / F16 / F32)" in result.stdout


def test_plain_float_checkpoint_without_linears(tmp_path):
    tensors = {n: e for n, e in PLAIN.items() if "q_proj" not in n}
    root = write_checkpoint(tmp_path / "plain", tensors, {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})
    report = inspect_path(root, tensors="*layernorm*")
    assert report.kind == KIND_PLAIN and report.quantization is None and report.schemes is None
    assert {d: c.tensors for d, c in report.by_dtype.items()} == {"BF16": 1, "F32": 2}
    assert {t: c.tensors for t, c in report.by_quant_type.items()} == {"FLOAT": 3}
    assert report.layers == 2 and report.fp8_linears == 0
    result = invoke(root)
    assert result.exit_code == 0 and "not quantized" in result.stdout and "not possible" in result.stdout


@pytest.mark.parametrize(
    "make,error,words",
    [
        (lambda d: d.mkdir(), UnrecognizedCheckpointError, ["no config.json"]),
        (lambda d: write_checkpoint(d, PLAIN, None), UnrecognizedCheckpointError, ["no config.json"]),
        (
            lambda d: (d.mkdir(), (d / "config.json").write_text("{}")),
            UnrecognizedCheckpointError,
            ["no *.safetensors"],
        ),
        (
            lambda d: write_checkpoint(d, {"w.weight": ("F8_E4M3", (4, 4))}, {}),
            UnrecognizedCheckpointError,
            ["F8_E4M3", "'w.weight'", "no quantization_config"],
        ),
        (
            lambda d: write_checkpoint(d, {"ids": ("I64", (4,))}, {}),
            UnrecognizedCheckpointError,
            ["no floating-point tensors", "I64"],
        ),
        (
            lambda d: write_checkpoint(d, PLAIN, {"quantization_config": {"quant_method": "gptq"}}),
            UnsupportedSourceError,
            ["quant_method is 'gptq'"],
        ),
        (
            lambda d: write_checkpoint(d, PLAIN, {"quantization_config": {"quant_method": "fp8"}}),
            NotBlockFP8Error,
            ["no weight_block_size", "per-tensor"],
        ),
        (lambda d: (d.parent.mkdir(exist_ok=True), d.write_text("x")), UnrecognizedCheckpointError, ["is a file"]),
    ],
)
def test_anything_else_is_refused_with_a_clear_message(tmp_path, make, error, words):
    target = tmp_path / "thing"
    make(target)
    with pytest.raises(error) as caught:
        inspect_path(target)
    for word in words:
        assert word in caught.value.message, (word, caught.value.message)
    assert caught.value.hint
    result = invoke(target, "--json")
    assert result.exit_code == 3
    assert json.loads(result.stdout.splitlines()[0]) == {
        "ok": False, "schema": 1, "command": "inspect", **caught.value.to_dict(), "exit_code": 3
    }


def test_missing_path(tmp_path):
    with pytest.raises(NotFoundError):
        inspect_path(tmp_path / "missing")
    result = invoke(tmp_path / "missing")
    assert result.exit_code == 3 and "no such directory" in result.stderr


# --- corrupt sources ----------------------------------------------------------------------------

Q = "model.layers.0.self_attn.q_proj"


def test_corrupt_sources_raise_the_named_error(fixture_copy):
    src = fixture_copy(DENSE)
    shard = src / "model.safetensors"
    tensors = load_shard(shard)
    dtype, shape, data = tensors[Q + ".weight_scale_inv"]
    tensors[Q + ".weight_scale_inv"] = (dtype, (shape[0] * shape[1], 1), data)
    save_shard(shard, tensors)
    with pytest.raises(ScaleShapeError, match=Q + ".weight_scale_inv"):
        inspect_path(src)
    result = invoke(src, "--json")
    assert result.exit_code == 3 and json.loads(result.stdout.splitlines()[0])["error"] == "ScaleShapeError"

    del tensors[Q + ".weight_scale_inv"]
    save_shard(shard, tensors)
    with pytest.raises(MissingScaleError, match=Q + ".weight"):
        inspect_path(src)

    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(TruncatedFileError, match="model.safetensors"):
        inspect_path(src)
    shard.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all" + bytes(8))
    result = invoke(src)
    assert result.exit_code == 3 and "not valid JSON" in result.stderr


def test_shard_named_in_the_index_but_missing(fixture_copy):
    src = fixture_copy(MOE)
    (src / "model-00003-of-00003.safetensors").unlink()
    with pytest.raises(MissingShardError, match="model-00003-of-00003.safetensors"):
        inspect_path(src)


# --- the tensor table and --json ----------------------------------------------------------------


def test_tensor_rows_are_sorted_naturally_and_filtered(tmp_path):
    report = inspect_path(FIXTURES / MOE, tensors="*")
    assert len(report.tensors) == report.tensor_count
    row = next(t for t in report.tensors if t.name == "model.layers.0.mlp.experts.3.down_proj.weight_scale_inv")
    assert (row.dtype, row.shape, row.quant_type, row.bytes) == ("F32", (1, 1), "FP8_BLOCK", 4)
    assert row.shard == "model-00002-of-00003.safetensors"  # the scale lives in another shard than its weight
    assert row.to_dict() == {
        "name": row.name, "dtype": "F32", "shape": [1, 1], "quant_type": "FP8_BLOCK",
        "shard": "model-00002-of-00003.safetensors", "bytes": 4,
    }
    names = [t.name for t in inspect_path(FIXTURES / MOE, tensors="model.layers.1.mlp.experts.*.up_proj.weight").tensors]
    assert names == [f"model.layers.1.mlp.experts.{e}.up_proj.weight" for e in range(4)]

    layers = {f"model.layers.{i}.input_layernorm.weight": ("BF16", (8,)) for i in (10, 2, 1)}
    root = write_checkpoint(tmp_path / "many", layers, {"model_type": "x"})
    names = [t.name for t in inspect_path(root, tensors="*").tensors]
    assert names == [f"model.layers.{i}.input_layernorm.weight" for i in (1, 2, 10)]
    assert inspect_path(root, tensors="nothing*").tensors == []


def test_cli_summary_tensors_and_json(converted):
    package = package_of(converted, MOE, "w4a8-mxfp-moe")
    for target in [*(FIXTURES / f for f in FIXTURE_NAMES), package]:
        result = invoke(target)
        assert result.exit_code == 0, result.output
        assert "module groups" in result.stdout

        result = invoke(target, "--json")
        assert result.exit_code == 0
        data = json.loads(result.stdout)
        assert list(data) == JSON_KEYS
        assert data["ok"] is True and data["schema"] == 1 and data["tensor_list"] is None
        assert data == {"command": "inspect", **json.loads(json.dumps(inspect_path(target).to_dict()))}

        result = invoke(target, "--tensors", "--json")
        data = json.loads(result.stdout)
        assert data["tensor_filter"] == "*" and len(data["tensor_list"]) == data["tensors"]["count"]
        assert set(data["tensor_list"][0]) == {"name", "dtype", "shape", "quant_type", "shard", "bytes"}

    result = invoke(FIXTURES / MOE, "--filter", "*.experts.0.*")  # --filter implies --tensors
    assert result.exit_code == 0 and "12 of 76 tensors match '*.experts.0.*'" in result.stdout
    result = invoke(FIXTURES / MOE, "--tensors", "--filter", "lm_head.weight", "--json")
    assert [t["name"] for t in json.loads(result.stdout)["tensor_list"]] == ["lm_head.weight"]


def test_json_documents_of_a_source_and_a_package(converted):
    data = inspect_path(FIXTURES / DENSE).to_dict()
    assert data["kind"] == "hf-block-fp8" and data["package"] is None
    assert list(data["schemes"]) == list(DECIDE_SCHEMES)  # every scheme row
    assert set(data["schemes"]["w4a8-mxfp"]) == {
        "model_quant_type", "modules", "tensors", "bytes_out", "shards", "fallbacks", "kept_float", "runtime"
    }
    assert data["schemes"]["w4a8-mxfp"]["fallbacks"][0]["module"] == "model.layers.1.mlp.down_proj"
    assert data["structure"] == {
        "family": "Qwen3 (dense)", "layers": 2, "moe_layers": 0, "routed_experts": 0, "shared_expert_layers": 0,
        "mtp_layers": [], "indexer_layers": 0, "fp8_linears": 14,
    }
    assert data["files"]["shards"] == [{"file": "model.safetensors", "tensors": 45, "bytes": data["files"]["total_bytes"]}]
    data = inspect_path(package_of(converted, DENSE, "w4a8-mxfp")).to_dict()
    assert data["kind"] == "ascendv1-package" and data["quantization"] is None and data["schemes"] is None
    assert data["files"]["index"] == "quant_model_weights.safetensors.index.json"
    assert data["package"]["model_quant_type"] == "W4A8_MXFP"


def test_usage_errors_exit_2():
    assert invoke().exit_code == 2
    assert invoke(FIXTURES / DENSE, "--no-such-option").exit_code == 2


# --- rendering ----------------------------------------------------------------------------------


def test_elide_middle_keeps_both_ends_and_whole_numbers():
    name = "model.layers.12.mlp.experts.37.down_proj.weight"
    assert elide_middle(name, 80) == name
    assert elide_middle(name, 43) == "model.layers.12…experts.37.down_proj.weight"  # start through the layer
    assert elide_middle(name, 37) == "model.layers.12…s.37.down_proj.weight"
    for width in range(2, len(name)):
        cut = elide_middle(name, width)
        head, tail = cut.split("…")
        assert name.startswith(head) and name.endswith(tail) and width - 2 <= len(cut) <= width
        assert not (head[-1:].isdigit() and name[len(head)].isdigit()), cut  # never half a number
        assert not (tail[:1].isdigit() and name[-len(tail) - 1].isdigit()), cut
    assert elide_middle("x" * 50, 11) == "xxxxx…xxxxx"
    assert elide_middle(name, 1) == "…" and elide_middle(name, 0) == ""


def test_elide_name_keeps_layer_and_expert_numbers_and_the_last_words():
    name = "model.layers.12.mlp.experts.37.down_proj.weight"
    assert elide_name(name, 80) == name
    assert elide_name(name, 40) == "…layers.12…experts.37.down_proj.weight"
    assert elide_name(name, 30) == "…l.12…e.37.down_proj.weight"
    for width in range(27, len(name)):
        cut = elide_name(name, width)
        assert len(cut) <= width and re.findall(r"\d+", cut) == ["12", "37"] and cut.endswith("down_proj.weight")
    assert elide_name(name, 20) == elide_middle(name, 20)  # no room for both numbers and the end
    assert elide_name("x" * 50, 11) == elide_middle("x" * 50, 11)


@pytest.mark.parametrize("fixture", [DENSE, MOE, DEEPSEEK])
def test_every_view_fits_80_columns(converted, fixture):
    scheme = "w4a8-mxfp" if fixture == DENSE else "w4a8-mxfp-moe"
    for root in (FIXTURES / fixture, package_of(converted, fixture, scheme)):
        for glob in (None, "*"):
            lines = render(inspect_path(root, tensors=glob))
            assert lines and max(len(line) for line in lines) <= 80, "\n".join(lines)


@pytest.mark.parametrize("width", [60, 80, 100])
def test_per_scheme_tables_are_split_to_fit_and_cut_no_number_or_type(width):
    """Seven scheme columns need about 120 cells: on a narrower terminal the tables come in parts that
    each fit, repeating the row labels, and every count, size and type is printed whole."""
    report = inspect_path(FIXTURES / MOE)
    lines = render(report, width)
    assert max(len(line) for line in lines) <= width
    cells = [cell for line in lines for cell in re.split(r"\s{2,}", line.strip()) if cell]
    assert not any("…" in cell for cell in cells if not cell.startswith("model."))  # only names are elided
    words = " ".join(lines).split()
    for scheme, estimate in report.schemes.items():
        assert words.count(scheme) == 3  # whole: a column of each table, and its runtime heading
        assert human_bytes(estimate.bytes_out) in " ".join(lines)
    estimates = lines[lines.index("what convert would write, per --scheme (default options)") :]
    # estimates: 19 cells of labels, then 12-17 per scheme; groups: 31 cells of names and counts, then 12-17
    assert sum(line.startswith("tensor bytes ") for line in estimates) == {60: 3, 80: 2, 100: 2}[width]
    assert sum(line.startswith("lm_head ") for line in estimates) == {60: 6, 80: 3, 100: 2}[width]


@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
def test_tensor_table_at_80_columns_has_one_line_per_tensor(fixture):
    report = inspect_path(FIXTURES / fixture, tensors="*")
    lines = render(report)
    assert max(len(line) for line in lines) <= 80
    rows = lines[4 : 4 + len(report.tensors)]  # after the title, the match count, the header and its rule
    assert lines[2].split() == ["name", "dtype", "shape", "quant", "type", "shard", "bytes"]
    elided = 0
    for line, tensor in zip(rows, report.tensors):
        shown, dtype, shape, quant_type, shard = line.split()[:5]
        assert (dtype, shape, quant_type) == (tensor.dtype, "×".join(map(str, tensor.shape)), tensor.quant_type)
        assert report.shards[int(shard) - 1].file == tensor.shard
        if shown != tensor.name:
            # elided, with every layer and expert number kept, and the name's end whole
            assert re.findall(r"\d+", shown) == [t for t in tensor.name.split(".") if t.isdigit()], shown
            assert shown.endswith("." + tensor.name.split(".")[-1]), shown
            elided += 1
    assert elided  # these fixtures have names longer than the room left at 80 columns
    assert lines[4 + len(report.tensors) :] == [f"shard {i + 1} = {s.file}" for i, s in enumerate(report.shards)]


def test_wide_terminal_shows_names_whole():
    report = inspect_path(FIXTURES / DEEPSEEK, tensors="*")
    text = "\n".join(render(report, width=160))
    assert all(t.name in text for t in report.tensors)


def test_summary_mentions_the_fallback_with_its_reason():
    text = "\n".join(render(inspect_path(FIXTURES / DENSE)))
    assert "fallbacks under w4a8-mxfp: 1 module" in text
    assert "model.layers.1.mlp.down_proj" in text and "is not a multiple of 64" in text


# --- the Hugging Face cache ---------------------------------------------------------------------


def test_repo_id_resolved_from_the_local_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    repo = cache / "models--Qwen--Qwen3-Tiny-FP8"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    for file in (FIXTURES / DENSE).iterdir():  # the cache links snapshot files to blobs
        (snapshot / file.name).symlink_to(file)

    report = inspect_path("Qwen/Qwen3-Tiny-FP8")
    assert report.kind == KIND_SOURCE and report.path == snapshot and report.fp8_linears == 14
    result = invoke("Qwen/Qwen3-Tiny-FP8", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["path"] == str(snapshot)
    result = runner.invoke(
        app, ["convert", "Qwen/Qwen3-Tiny-FP8", str(tmp_path / "out"), "--dry-run", "--kernel", "reference", "--json"]
    )
    assert result.exit_code == 0, result.output

    with pytest.raises(NotCachedError):
        inspect_path("Qwen/Not-Downloaded")
    result = invoke("Qwen/Not-Downloaded", "--json")
    assert result.exit_code == 3 and json.loads(result.stdout.splitlines()[0])["error"] == "NotCachedError"
    assert "hf download" in json.loads(result.stdout.splitlines()[0])["hint"]


# --- scale ----------------------------------------------------------------------------------------


def make_many_shards(root: Path, count: int) -> Path:
    """A block-FP8 checkpoint of `count` one-layer shards (weight, scale, norm each) with an index."""
    root.mkdir(parents=True)
    config = {
        "model_type": "toy",
        "architectures": ["ToyForCausalLM"],
        "num_hidden_layers": count,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
    }
    (root / "config.json").write_text(json.dumps(config))
    weight_map = {}
    for i in range(count):
        file = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        prefix = f"model.layers.{i}.mlp.down_proj"
        specs = [
            TensorSpec(prefix + ".weight", "F8_E4M3", (32, 64)),
            TensorSpec(prefix + ".weight_scale_inv", "F32", (1, 1)),
            TensorSpec(f"model.layers.{i}.post_attention_layernorm.weight", "BF16", (64,)),
        ]
        writer = ShardWriter(root / file, specs)
        for spec in specs:
            writer.write(spec.name, bytes(spec.nbytes))
        writer.close()
        weight_map.update({spec.name: file for spec in specs})
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


def test_a_thousand_shards(tmp_path, capsys):
    root = make_many_shards(tmp_path / "big", 1000)
    started = time.perf_counter()
    report = inspect_path(root)
    seconds = time.perf_counter() - started
    with capsys.disabled():
        print(f"\n[inspect of 1,000 shards: {seconds:.2f} s]", end=" ")
    assert len(report.shards) == 1000 and report.tensor_count == 3000
    assert report.fp8_linears == 1000 and report.layers == 1000
    groups = {g.pattern: g for g in report.groups}
    assert groups["model.layers.*.mlp.down_proj"].modules == 1000
    # K=64: W4A8_MXFP fits, so nothing falls back anywhere
    assert all(not e.fallbacks for e in report.schemes.values())
    lines = render(report)
    assert max(len(line) for line in lines) <= 80 and "1000 shards" in "\n".join(lines)
    result = invoke(root, "--tensors")  # a pipe: every tensor name whole, one row each
    names = [line.split()[0] for line in result.stdout.splitlines()[4:3004]]
    assert result.exit_code == 0 and names == [t.name for t in inspect_path(root, tensors="*").tensors]
    assert result.stdout.splitlines()[-3:] == [
        "shards are numbered 1..1000 in name order:",
        "shard 1 = model-00001-of-01000.safetensors",
        "shard 1000 = model-01000-of-01000.safetensors",
    ]


def test_module_pattern():
    assert module_pattern("model.layers.12.mlp.experts.37.down_proj") == "model.layers.*.mlp.experts.*.down_proj"
    assert module_pattern("model.layers.3.self_attn.q_proj") == "model.layers.*.self_attn.q_proj"
    assert module_pattern("lm_head") == "lm_head"
    assert module_pattern("model.visual.blocks.0.attn.qkv") == "model.visual.blocks.*.attn.qkv"
    assert module_pattern("model.layers.1.mlp.gate_up_proj2") == "model.layers.*.mlp.gate_up_proj2"


@given(st.lists(st.sampled_from(["model", "layers", "12", "x7", "", "٣", "²", "0", "a\nb", "3\n", "\n"]), max_size=8).map(".".join))
def test_module_pattern_segment_by_segment_is_the_pattern_at_once(name):
    from ascendconv.decide import NUMBERED_SEGMENT

    assert module_pattern(name) == NUMBERED_SEGMENT.sub("*", name)
    assert module_pattern(name) == NUMBERED_SEGMENT.sub("*", name)  # remembered


def test_module_pattern_of_a_name_of_many_segments():
    assert module_pattern("a." * 5000 + "7") == "a." * 5000 + "*"


@pytest.mark.parametrize("label", [5, None, ["W8A8_MXFP8"], "W9_MXFP"])
def test_package_description_naming_no_type_is_a_disagreement_as_verify_fails_it(converted, tmp_path, label):
    root = tmp_path / "pkg"
    shutil.copytree(package_of(converted, DENSE, "w8a8-mxfp8"), root)
    description_path = root / "quant_model_description.json"
    description = json.loads(description_path.read_text())
    name = "model.layers.0.self_attn.q_proj.weight"
    description[name] = label
    description_path.write_text(json.dumps(description))
    problem = f"{name!r} has type {label!r}; known types: FLOAT, W8A8_MXFP8, W4A16_MXFP4, W4A8_MXFP, W4A4_MXFP4"
    assert problem in inspect_path(root).problems
    assert problem in verify(root, VerifyOptions(checksums=False)).check("description").problems


def test_a_cached_repo_is_titled_by_its_repo_id_and_its_revision_shown(tmp_path, monkeypatch):
    repo = tmp_path / "hub" / "models--Org--QwenMoe"
    shutil.copytree(FIXTURES / MOE, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    report = inspect_path("Org/QwenMoe")
    assert (report.title, report.to_dict()["hub"]) == ("Org/QwenMoe", {"repo_id": "Org/QwenMoe", "revision": "abc123"})
    lines = runner.invoke(app, ["inspect", "Org/QwenMoe"]).stdout.splitlines()
    assert lines[0].startswith("Org/QwenMoe  ")
    assert "revision      abc123 of Org/QwenMoe in the Hugging Face cache" in lines
    assert inspect_path(FIXTURES / MOE).to_dict()["hub"] is None


def test_runtime_notes_count_one_in_the_singular():
    dense = inspect_path(FIXTURES / DENSE).schemes["w4a8-mxfp"].runtime
    assert f"W8A8_MXFP8 (1 module): {QUANT_TYPES['W8A8_MXFP8'].runtime}" in dense
    assert "1 fallback (see fallbacks), planned for --tp 1" in dense
    deepseek = inspect_path(FIXTURES / DEEPSEEK).schemes["w4a8-mxfp-moe"].runtime
    assert any(note.startswith("1 MoE layer holds shared experts of another type") for note in deepseek)


def test_a_recorded_fallback_written_as_no_string_names_no_type_and_ends_nothing(converted, tmp_path):
    root = tmp_path / "pkg"
    shutil.copytree(package_of(converted, DENSE, "w8a8-mxfp8"), root)
    name = "model.layers.0.self_attn.q_proj.weight"
    description_path = root / "quant_model_description.json"
    description = json.loads(description_path.read_text())
    description[name] = "W4A8_MXFP"
    description_path.write_text(json.dumps(description))
    provenance_path = root / "ascendconv_provenance.json"
    provenance = json.loads(provenance_path.read_text())
    provenance["fallbacks"] = [{"written": ["W4A8_MXFP"]}, {"written": {"W4A8_MXFP": 1}}, 5, None]
    provenance_path.write_text(json.dumps(provenance))
    problem = (
        "ascendconv_provenance.json: scheme w8a8-mxfp8 writes W8A8_MXFP8 linears and W8A8_MXFP8 routed experts, but "
        f"1 described tensor is W4A8_MXFP (e.g. {name!r}), which no recorded fallback or override writes: the package "
        "was not converted with the scheme recorded"
    )
    assert problem in inspect_path(root).problems
    result = invoke(root, "--json")
    assert result.exit_code == 0 and problem in json.loads(result.stdout)["problems"]
    assert problem in verify(root, VerifyOptions(checksums=False)).check("provenance").problems


def test_a_recorded_fallback_written_as_no_string_ends_no_role_check_either(converted, tmp_path):
    """verify's role check (a scheme whose linears and experts differ) read the recorded fallbacks by
    a second copy of the rule, without its guard: a 'written' list was a TypeError there."""
    root = tmp_path / "pkg"
    shutil.copytree(package_of(converted, MOE, "w4a8-mxfp-moe"), root)
    provenance_path = root / "ascendconv_provenance.json"
    provenance = json.loads(provenance_path.read_text())
    first = len(provenance["fallbacks"])
    provenance["fallbacks"] = [*provenance["fallbacks"], {"written": ["W4A8_MXFP"]}, {"written": {"W4A8_MXFP": 1}}]
    provenance_path.write_text(json.dumps(provenance))
    report = verify(root, VerifyOptions(checksums=False))
    # the damaged entries are named (the first, and how many), and no role problem follows from them
    assert report.check("provenance").problems == [
        f"ascendconv_provenance.json: fallbacks[{first}].module is missing, expected a string "
        f"(2 of the {first + 2} entries of fallbacks are of the wrong shape)"
    ]


PROVENANCE_KEYS = ["tool", "version", "source", "scheme", "scale_rule", "resolve_dtype", "fallbacks", "hub", "deployment",
                   "overrides", "command", "date"]


def test_provenance_fields_of_the_wrong_type_are_named_never_shown_as_none(converted, tmp_path):
    """inspect printed 'converted by None None' and 'None fallbacks': each field inspect shows, of a
    JSON type convert never writes there or missing, is now a disagreement naming what the file
    holds, the summary says unknown, and --json keeps its keys (null)."""
    root = tmp_path / "pkg"
    shutil.copytree(package_of(converted, DENSE, "w8a8-mxfp8"), root)
    path = root / "ascendconv_provenance.json"
    provenance = json.loads(path.read_text())
    del provenance["version"]
    provenance["source"]["name"] = ["qwen3-dense-fp8"]
    provenance.update(tool=3, scheme=None, scale_rule={}, resolve_dtype=["bf16"], fallbacks={"n": 0}, hub={"repo_id": 3, "revision": "a" * 40},
                      deployment=[1], overrides="*=FLOAT", command=5, date=False)
    path.write_text(json.dumps(provenance))

    result = invoke(root)
    assert result.exit_code == 0, result.output
    assert "None" not in result.stdout
    facts = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in result.stdout.splitlines()[1:8])
    assert facts["converted by"] == "(unknown) (unknown) from (unknown)"
    assert facts["scheme"] == "(unknown), rule (unknown), resolve (unknown), fallbacks (unknown)"
    assert facts["source"] == "(unknown)"
    assert "planned for" not in facts and "command" not in facts

    data = json.loads(invoke(root, "--json").stdout)
    assert list(data["package"]["provenance"]) == PROVENANCE_KEYS
    assert data["package"]["provenance"] == {**dict.fromkeys(PROVENANCE_KEYS), "overrides": []}
    assert data["problems"] == [f"ascendconv_provenance.json: {problem}" for problem in [
        "tool is a number (3), expected a string",
        "version is missing, expected a string",
        'source.name is a list (["qwen3-dense-fp8"]), expected a string',
        "scheme is null, expected a string",
        "scale_rule is an object ({}), expected a string",
        'resolve_dtype is a list (["bf16"]), expected a string',
        'fallbacks is an object ({"n": 0}), expected a list',
        "hub.repo_id is a number (3), expected a string",
        "overrides is a string ('*=FLOAT'), expected a list",
        "command is a number (5), expected a string",
        "date is false, expected a string",
        "deployment is a list ([1]), expected an object",
    ]]
    assert "- ascendconv_provenance.json: tool is a number (3), expected a string" in result.stdout


def test_description_fields_missing_are_named_never_shown_as_none(converted, tmp_path):
    """inspect printed 'W8A8_MXFP8 (version None, group_size None)' with no disagreement, where
    verify failed the description: both now name the fields by one rule (Package.field_problems)."""
    root = tmp_path / "pkg"
    shutil.copytree(package_of(converted, DENSE, "w8a8-mxfp8"), root)
    path = root / "quant_model_description.json"
    description = json.loads(path.read_text())
    del description["version"], description["group_size"], description["model_quant_type"]
    path.write_text(json.dumps(description))

    result = invoke(root)
    assert result.exit_code == 0, result.output
    assert "None" not in result.stdout
    assert "(unknown) (version (unknown), group_size (unknown))" in result.stdout
    wanted = [
        "version is missing, expected '1.0.0'",
        "group_size is missing, expected the integer 32 (0 breaks the loader, a float its shapes)",
    ]
    problems = inspect_path(root).problems
    assert [p for p in problems if p.startswith(("version", "group_size"))] == wanted
    check = verify(root, VerifyOptions(checksums=False)).check("description")
    assert check.problems[:2] == [f"quant_model_description.json: {problem}" for problem in wanted]
    assert "None" not in " ".join([check.detail, *check.problems])


NO_REGULAR_FILE = {"dangling link": "a symbolic link to nothing", "FIFO": "a FIFO", "directory": "a directory"}


@pytest.mark.parametrize("kind", NO_REGULAR_FILE)
@pytest.mark.parametrize("file", ["quant_model_weights.safetensors.index.json", "ascendconv_provenance.json", "config.json"])
def test_a_package_file_that_is_no_regular_file_is_a_disagreement_not_taken_for_none(converted, tmp_path, file, kind):
    root = tmp_path / "pkg"
    shutil.copytree(package_of(converted, DENSE, "w8a8-mxfp8"), root)
    replace_by_no_regular_file(root / file, kind, tmp_path)
    problem = f"{file} is {NO_REGULAR_FILE[kind]}, not a regular file: read as absent"
    assert inspect_path(root).problems[0] == problem
    result = invoke(root, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["problems"][0] == problem


@pytest.mark.parametrize("kind, said", [("dangling link", "cannot read (No such file or directory)"),
                                         ("FIFO", "is a FIFO, not a regular file"),
                                         ("directory", "is a directory, not a regular file")])
def test_a_description_that_is_no_regular_file_is_named_not_called_absent(converted, tmp_path, kind, said):
    root = tmp_path / "pkg"
    shutil.copytree(package_of(converted, DENSE, "w8a8-mxfp8"), root)
    replace_by_no_regular_file(root / "quant_model_description.json", kind, tmp_path)
    message = f"{root / 'quant_model_description.json'}: {said}"
    with pytest.raises(PackageError) as raised:
        inspect_path(root)
    assert (raised.value.message, raised.value.hint) == (message, "pass a directory written by `ascendconv convert`")
    with pytest.raises(PackageError, match=re.escape(message)):
        verify(root, VerifyOptions(checksums=False))
    result = invoke(root, "--json")
    assert result.exit_code == 3
    assert {k: v for k, v in json.loads(result.stdout).items() if k in ("error", "message")} == {
        "error": "PackageError", "message": message}


def test_a_filter_of_thousands_of_character_sets_is_refused_not_left_to_hang(tmp_path):
    """fnmatch's translation of a glob is quadratic in its '[': '--filter' of 50,000 of them ran past a
    minute on any checkpoint."""
    from typer.testing import CliRunner

    from ascendconv.cli import app

    glob = "[" * 50_000
    result = CliRunner().invoke(app, ["inspect", str(FIXTURES / "qwen3-moe-fp8"), "--filter", glob, "--json"])
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)
    assert (error["error"], error["message"]) == ("BadOptionError", "--filter: a glob of 50,000 '[' (at most 256 are read)")
    at_most = "[m]odel.[l]ayers.0.mlp.gate.*" + "[!x]" * 254 + "*"  # 256 '[' still read
    listed = CliRunner().invoke(app, ["inspect", str(FIXTURES / "qwen3-moe-fp8"), "--filter", at_most, "--json"])
    assert listed.exit_code == 0 and json.loads(listed.stdout)["tensor_list"] == []
    gate = CliRunner().invoke(app, ["inspect", str(FIXTURES / "qwen3-moe-fp8"), "--filter", "[m]odel.[l]ayers.0.mlp.gate.*", "--json"])
    assert [row["name"] for row in json.loads(gate.stdout)["tensor_list"]] == ["model.layers.0.mlp.gate.weight"]


# --- the report's tallies of a source's linears, in one pass, against the plain ones ------------


def _tally_case(draw):
    """A source's linears and other tensors, drawn: routed experts (some projections missing, an
    expert only in an unpaired bias, a layer of nothing else), shared experts, indexers, an MTP
    layer, and linears of every encoding, weight dtype and scale dtype (or none)."""
    from ascendconv.io.safetensors import TensorEntry
    from ascendconv.sources.base import Encoding, SourceLinear

    model_type = draw(st.sampled_from(["deepseek_v32", "qwen3_next", "qwen3_moe"]))
    layers = draw(st.integers(1, 3))
    config = {"model_type": model_type, "num_hidden_layers": layers, "num_nextn_predict_layers": 1}
    mtp = f"model.layers.{layers}" if model_type == "deepseek_v32" else "mtp.layers.0"
    shared = "shared_experts" if model_type == "deepseek_v32" else "shared_expert"
    blocks = [f"model.layers.{i}" for i in range(layers)] + draw(st.sampled_from([[], [mtp]]))
    prefixes = []
    for block in blocks:
        prefixes += draw(st.sampled_from([[], [f"{block}.self_attn.q_proj", f"{block}.self_attn.o_proj"]]))
        prefixes += draw(st.sampled_from([[], [f"{block}.self_attn.indexer.wk"]]))
        prefixes += draw(st.sampled_from([[], [f"{block}.mlp.{shared}.gate_proj", f"{block}.mlp.{shared}.down_proj"]]))
        experts = draw(st.integers(0, 5))
        pairs = [(e, p) for e in range(experts) for p in ("gate_proj", "up_proj", "down_proj")]
        prefixes += [f"{block}.mlp.experts.{e}.{p}" for e, p in pairs if draw(st.integers(0, 4))]
    tensors: dict[str, TensorEntry] = {}
    linears = {}

    def entry(name: str, dtype: str, shape: tuple) -> TensorEntry:
        tensors[name] = TensorEntry(name, dtype, shape, Path("model.safetensors"), 0, draw(st.integers(1, 9)) * 4096)
        return tensors[name]

    for prefix in prefixes:
        encoding = draw(st.sampled_from(list(Encoding)))
        weight = entry(prefix + ".weight", draw(st.sampled_from(["F8_E4M3", "BF16", "U8"])), (128, 256))
        scale = None
        if draw(st.booleans()):
            scale = entry(prefix + ".weight_scale_inv", draw(st.sampled_from(["F32", "BF16", "F8_E8M0"])), (1, 2))
        linears[prefix] = SourceLinear(prefix, weight, scale, None, (128, 128), encoding)
    unpaired = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    unpaired += draw(st.sampled_from([[], ["model.layers.0.mlp.experts.9.gate_proj.bias"]]))
    for name in unpaired:
        entry(name, draw(st.sampled_from(["BF16", "F32"])), (8,) if "norm" in name or "bias" in name else (64, 128))
    return config, tensors, linears, unpaired


@given(st.data(), st.booleans())
def test_the_linear_tallies_of_one_pass_are_the_plain_ones(data, shared_as_routed):
    """inspect's one pass over the linears (a routed expert counted by its layer and projection,
    its pattern made once) gives the structure, module groups, quant type tally and scale dtypes
    that module by module and tensor by tensor give."""
    from collections import Counter
    from types import SimpleNamespace

    from ascendconv.decide import Deployment
    from ascendconv.inspect.source import (
        FP8_BLOCK, MX_SOURCE_LABELS, _labels, _linear_kinds, _scale_dtypes, _source_patterns, _type_tally,
    )
    from ascendconv.inspect.summary import _module_groups, _ordered, _structure, _tally
    from ascendconv.plan import Planner

    config, tensors, linears, unpaired = _tally_case(data.draw)
    planner = Planner(tensors, linears, [], 0, config, Deployment(shared_experts_as_routed=shared_as_routed))
    written = {s: {n: g.written for n, g in planner.plan(s).groups.items()} for s in DECIDE_SCHEMES}
    source = SimpleNamespace(tensors=tensors, linears=linears, unpaired=unpaired)
    kinds = _linear_kinds(linears, planner.rules, planner.facts)

    assert _structure(unpaired, planner.rules, kinds.others, kinds.routed_layers) == _structure(tensors, planner.rules)
    modules = {prefix: linear.weight for prefix, linear in linears.items()}
    for name in unpaired:
        if name.endswith(".weight") and len(tensors[name].shape) >= 2:
            modules.setdefault(name[: -len(".weight")], tensors[name])
    plain: dict[str, Counter] = {}
    for prefix, weight in modules.items():
        fact = planner.facts.get(prefix)
        label = MX_SOURCE_LABELS.get(linears[prefix].encoding, FP8_BLOCK) if prefix in linears else "FLOAT"
        plain.setdefault(module_pattern(prefix), Counter())[(fact and fact.group, label, weight.dtype)] += 1
    assert _module_groups(_source_patterns(kinds.kinds, source), written) == _module_groups(plain, written)
    total = sum(e.nbytes for e in tensors.values())
    assert _type_tally(kinds.kinds, len(tensors), total) == _tally(tensors, _labels(source).__getitem__)[1]
    scales = Counter(linear.scale.dtype for linear in linears.values() if linear.scale is not None)
    assert _scale_dtypes(kinds.kinds) == _ordered(scales)
