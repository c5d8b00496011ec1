"""End to end: every fixture under every scheme and rule, read back with the safetensors library."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from ascendconv.convert import ConvertOptions, convert
from ascendconv.formats import elements, mx, resolve
from ascendconv.formats.constants import E2M1, E4M3
from ascendconv.formats.metrics import error_stats
from ascendconv.io.safetensors import TensorReader, read_header
from ascendconv.sources import Source
from conftest import FIXTURE_NAMES, FIXTURES, RULES, SCHEMES, file_digest

# Relative L2 error bounds against the resolved source, per written type (the measured values on
# these fixtures are printed by scripts/measure_errors.py; these bounds leave a margin).
REL_L2_BOUND = {"W8A8_MXFP8": 0.045, "W4A8_MXFP": 0.16, "W4A16_MXFP4": 0.16, "W4A4_MXFP4": 0.16}


def package_tensors(out: Path) -> dict[str, np.ndarray]:
    """Every tensor of the package; F8 payloads as raw uint8 codes (numpy has no F8 dtype)."""
    tensors = {}
    for shard in sorted(out.glob("*.safetensors")):
        header = read_header(shard)
        with safe_open(str(shard), "numpy") as f:
            keys = set(f.keys())
            assert keys == set(header.tensors)
            for name in keys:
                dtype = f.get_slice(name).get_dtype()
                assert dtype == header.tensors[name].dtype
                if dtype == "F8_E4M3":
                    with TensorReader() as reader:
                        tensors[name] = reader.read(header.tensors[name])
                else:
                    tensors[name] = f.get_tensor(name)
    return tensors


def check_package(fixture: str, out: Path, rule: str) -> dict[str, float]:
    description = json.loads((out / "quant_model_description.json").read_text())
    index = json.loads((out / "quant_model_weights.safetensors.index.json").read_text())
    tensors = package_tensors(out)
    meta = {k: description.pop(k) for k in ("version", "model_quant_type", "metadata", "group_size", "optional")}
    assert meta["version"] == "1.0.0" and meta["group_size"] == 32 and meta["metadata"] == {} and meta["optional"] == {}
    # description, index and shards name exactly the same tensors
    assert set(description) == set(index["weight_map"]) == set(tensors)
    for name, file in index["weight_map"].items():
        with safe_open(str(out / file), "numpy") as f:
            assert name in f.keys()
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in tensors.values())
    present = {t for t in description.values() if t != "FLOAT"}
    ranked = ["W8A8_MXFP8", "W4A16_MXFP4", "W4A8_MXFP", "W4A4_MXFP4"]  # contract section 3
    assert meta["model_quant_type"] == (max(present, key=ranked.index) if present else "FLOAT")

    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and "quantization_config" not in config.get("text_config", {})

    source = Source.open(FIXTURES / fixture)
    errors = {}
    try:
        for prefix, linear in source.linears.items():
            kind = description[linear.weight.name]
            codes = source.reader.read(linear.weight)
            resolved = resolve.resolve_tiles(codes, source.read_scale(linear), linear.block, "bf16")
            weight = tensors[linear.weight.name]
            n, k = linear.shape
            if kind == "FLOAT":
                assert weight.dtype.name == "bfloat16" and weight.shape == (n, k)
                assert np.array_equal(weight.astype(np.float32), resolved)
                assert prefix + ".weight_scale" not in tensors
                continue
            scales = tensors[prefix + ".weight_scale"]
            assert description[prefix + ".weight_scale"] == kind
            assert scales.dtype == np.uint8 and scales.shape == (n, k // 32)
            assert not (scales == 255).any()
            if kind == "W8A8_MXFP8":
                assert weight.dtype == np.uint8 and weight.shape == (n, k)
                assert not ((weight & 0x7F) == 0x7F).any()
                values = mx.dequantize_mx(weight, scales, E4M3)
            else:
                assert weight.dtype == np.uint8 and weight.shape == (n, k // 2)
                values = mx.dequantize_mx(elements.unpack_fp4(weight), scales, E2M1)
            stats = error_stats(resolved, values)
            errors[prefix] = stats.rel_l2
            assert stats.rel_l2 <= REL_L2_BOUND[kind], (prefix, kind, stats)
            if fixture == "deepseek-v3-fp8" and kind == "W8A8_MXFP8" and rule in ("rceil", "mse"):
                # power-of-two source scales: these rules convert without any loss
                assert stats.rel_l2 == 0.0, prefix
        # tensors that are not FP8 linears are carried byte for byte
        with TensorReader() as reader:
            for name, entry in source.tensors.items():
                if name in source.scale_names or name[: -len(".weight")] in source.linears:
                    continue
                if description[name] == "FLOAT" and tensors[name].dtype != np.float32:
                    assert tensors[name].tobytes() == bytes(reader.read_bytes(entry)), name
    finally:
        source.close()
    return errors


@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("rule", RULES)
def test_every_fixture_scheme_and_rule(converted, fixture, scheme, rule):
    out = converted(fixture, scheme, rule)
    errors = check_package(fixture, out, rule)
    assert errors  # every fixture has FP8 linears that were quantized


def test_copied_files_are_byte_identical_and_nothing_else_is_safetensors(converted):
    out = converted("qwen3-moe-fp8")
    src = FIXTURES / "qwen3-moe-fp8"
    for name in ("tokenizer.model", "tokenizer.json", "generation_config.json"):
        assert (out / name).read_bytes() == (src / name).read_bytes()
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    index = json.loads((out / "quant_model_weights.safetensors.index.json").read_text())
    assert shards == sorted(set(index["weight_map"].values()))
    assert not (out / "model.safetensors.index.json").exists()
    provenance = json.loads((out / "ascendconv_provenance.json").read_text())
    for shard in shards:
        assert provenance["checksum"] == "blake3"
        recorded = provenance["shards"][shard]
        assert {k: recorded[k] for k in ("blake3", "size")} == {"blake3": file_digest(out / shard), "size": (out / shard).stat().st_size}
        assert sorted(recorded) == ["blake3", "size", "source_data"] and len(recorded["source_data"]) == 64
    assert [f["name"] for f in provenance["source"]["files"]] == sorted(p.name for p in src.glob("*.safetensors"))


def test_unquantized_source_module_stays_byte_identical(converted):
    out = converted("qwen3-moe-fp8", "w8a8-mxfp8")
    description = json.loads((out / "quant_model_description.json").read_text())
    assert description["model.layers.0.self_attn.o_proj.weight"] == "FLOAT"
    assert "model.layers.0.self_attn.o_proj.weight_scale" not in description


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("kernel_workers", [("reference", 1), ("numba", 1), ("numba", 3)])
def test_bytes_identical_across_runs_kernels_and_workers(tmp_path, kernel_workers):
    kernel, workers = kernel_workers
    options = dict(scheme="w4a8-mxfp-moe", scale_rule="mse", max_shard_size=200_000)
    first = tmp_path / "a"
    convert(FIXTURES / "deepseek-v3-fp8", first, ConvertOptions(**options, kernel="numba", workers=2))
    second = tmp_path / "b"
    convert(FIXTURES / "deepseek-v3-fp8", second, ConvertOptions(**options, kernel=kernel, workers=workers))
    a, b = digests(first), digests(second)
    # provenance records the kernel; everything else must match byte for byte
    a.pop("ascendconv_provenance.json"), b.pop("ascendconv_provenance.json")
    assert a == b


def test_shard_limit_honoured(tmp_path):
    out = tmp_path / "out"
    limit = 150_000
    convert(FIXTURES / "qwen3-moe-fp8", out, ConvertOptions(max_shard_size=limit))
    shards = sorted(out.glob("quant_model_weights-*.safetensors"))
    assert len(shards) > 3
    for shard in shards:
        header = read_header(shard)
        data = sum(e.nbytes for e in header.tensors.values())
        assert data <= limit or len(header.tensors) <= 2
        assert shard.name.endswith(f"-of-{len(shards):05d}.safetensors")


def test_single_file_package(tmp_path):
    out = tmp_path / "out"
    convert(FIXTURES / "qwen3-dense-fp8", out, ConvertOptions(max_shard_size=0))
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["quant_model_weights.safetensors"]
    assert not (out / "quant_model_weights.safetensors.index.json").exists()


def test_fp32_resolve_differs_from_bf16_only_where_rounding_matters(tmp_path):
    # F32 tile scales: resolving to BF16 first rounds twice, which moves a few E4M3 codes
    bf16 = tmp_path / "bf16"
    fp32 = tmp_path / "fp32"
    convert(FIXTURES / "qwen3-moe-fp8", bf16, ConvertOptions(resolve_dtype="bf16"))
    convert(FIXTURES / "qwen3-moe-fp8", fp32, ConvertOptions(resolve_dtype="fp32"))
    a, b = package_tensors(bf16), package_tensors(fp32)
    differing = [np.mean(a[n] != b[n]) for n in a if n.endswith(".weight") and a[n].dtype == np.uint8]
    assert differing and 0 < np.mean(differing) < 0.05


def test_dry_run_json_holds_the_description_the_run_writes(converted):
    """A CI job can review quant_model_description.json before the hours of a real conversion."""
    from typer.testing import CliRunner

    from ascendconv.cli import app

    args = ["convert", str(FIXTURES / "deepseek-v3-fp8"), "unused-out", "--scheme", "w4a8-mxfp-moe", "--dry-run", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    planned = json.loads(result.stdout)
    assert planned["dry_run"] is True and planned["model_type"] == "deepseek_v3"
    assert (planned["tp"], planned["ep"], planned["shared_experts_as_routed"], planned["warnings"]) == (1, False, False, [])
    written = json.loads((converted("deepseek-v3-fp8", "w4a8-mxfp-moe") / "quant_model_description.json").read_text())
    assert planned["description"] == written
    assert not Path("unused-out").exists()


def test_dry_run_never_imports_the_kernels():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from ascendconv.convert import ConvertOptions, convert\n"
        f"convert({str(FIXTURES / 'qwen3-moe-fp8')!r}, 'unused-out', ConvertOptions(), dry_run=True)\n"
        "assert 'numba' not in sys.modules and 'ascendconv.kernels' not in sys.modules, 'kernels imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
