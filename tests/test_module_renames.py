"""Module names a family's package spells otherwise than its uploads (families.py `module_renames`):
Gemma 4's routed experts, stored under vLLM's '<layer>.moe.experts.' by vLLM-fused MXFP4 and
llm-compressor uploads, which vllm-ascend looks up in the description as '<layer>.experts.'."""

from __future__ import annotations

import json
from pathlib import Path

from ascendconv.convert import ConvertOptions, convert
from ascendconv.errors import DuplicateTensorError
from ascendconv.sources import open_source
from ascendconv.verify import VerifyOptions, verify
from conftest import FIXTURES
from mx_sources import MXFP4, as_mx, as_vllm_fused
from robust_helpers import json_error, run_cli
from test_source_formats import respell

MOE = FIXTURES / "qwen3-moe-fp8"  # experts under model.layers.N.mlp.experts
PACKAGE_FILES = ("quant_model_description.json", "quant_model_weights.safetensors.index.json")


def as_gemma4(src: Path, dst: Path, infix: str) -> Path:
    """`src` with its experts under `model.layers.N<infix>experts.` and model_type gemma4_text."""
    return respell(
        src, dst, lambda name, entry: {name.replace(".mlp.experts.", f"{infix}experts."): entry},
        lambda cfg: {**cfg, "model_type": "gemma4_text"},
    )


def package_bytes(out: Path) -> dict[str, bytes]:
    """What vllm-ascend reads of a package: its description, index and weight shards."""
    names = [*PACKAGE_FILES, *sorted(p.name for p in out.glob("quant_model_weights-*.safetensors"))]
    return {name: (out / name).read_bytes() for name in names}


def test_experts_stored_under_moe_are_written_as_vllm_ascend_looks_them_up(tmp_path):
    vllm_spelled = as_gemma4(MOE, tmp_path / "moe", ".moe.")
    package_spelled = as_gemma4(MOE, tmp_path / "plain", ".")
    for src in (vllm_spelled, package_spelled):
        convert(src, tmp_path / f"out-{src.name}", ConvertOptions(scheme="w4a8-mxfp-moe"))
    out = tmp_path / "out-moe"
    description = json.loads((out / "quant_model_description.json").read_text())
    assert description["model.layers.0.experts.3.gate_proj.weight"] == "W4A8_MXFP"
    assert not [name for name in description if ".moe." in name]
    # the same package, byte for byte, as from the source that already spells it so
    assert package_bytes(out) == package_bytes(tmp_path / "out-plain")
    report = verify(out, VerifyOptions(source=vllm_spelled, moe_check=True))
    assert report.ok, [c for c in report.checks if not c.ok]


def test_vllm_fused_mxfp4_experts_under_moe_split_into_the_package_spelling(tmp_path):
    ct = as_mx(MOE, tmp_path / "ct", "ct", lambda prefix: MXFP4)
    fused = as_gemma4(as_vllm_fused(ct, tmp_path / "fused"), tmp_path / "gemma4", ".moe.")
    assert "model.layers.0.moe.experts.w13_weight" in json.loads((fused / "model.safetensors.index.json").read_text())["weight_map"]
    source = open_source(fused)
    assert "model.layers.1.experts.2.up_proj" in source.linears
    assert not [p for p in source.linears if ".moe." in p]
    out = tmp_path / "out"
    convert(fused, out, ConvertOptions(scheme="native"))
    description = json.loads((out / "quant_model_description.json").read_text())
    assert description["model.layers.1.experts.2.up_proj.weight"] == "W4A8_MXFP"
    assert verify(out, VerifyOptions(source=fused, moe_check=True)).ok


def test_a_module_stored_under_both_spellings_is_refused_naming_both(tmp_path):
    src = as_gemma4(MOE, tmp_path / "moe", ".moe.")
    both = respell(
        src, tmp_path / "both",
        lambda name, entry: {name: entry, **({"model.layers.0.experts.1.up_proj.weight": entry}
                                            if name == "model.layers.0.moe.experts.1.up_proj.weight" else {})},
        lambda cfg: cfg,
    )  # fmt: skip
    result = run_cli("convert", "--json", both, tmp_path / "out")
    error = json_error(result)
    assert result.returncode == 3 and error["error"] == DuplicateTensorError.__name__
    assert "'model.layers.0.moe.experts.1.up_proj.weight'" in error["message"]
    assert "'model.layers.0.experts.1.up_proj.weight' are both" in error["message"]
    assert not (tmp_path / "out").exists()


def test_other_families_keep_the_moe_spelling(tmp_path):
    src = respell(MOE, tmp_path / "qwen", lambda name, entry: {name.replace(".mlp.experts.", ".moe.experts."): entry}, lambda cfg: cfg)
    assert "model.layers.0.moe.experts.0.gate_proj" in open_source(src).linears


def test_verify_names_a_gemma4_description_spelled_with_moe(tmp_path):
    src = as_gemma4(MOE, tmp_path / "plain", ".")
    out = tmp_path / "out"
    convert(src, out, ConvertOptions(scheme="w4a8-mxfp-moe"))
    path = out / "quant_model_description.json"
    described = json.loads(path.read_text())
    path.write_text(json.dumps({k.replace("layers.1.experts.", "layers.1.moe.experts."): v for k, v in described.items()}))
    check = next(c for c in verify(out, VerifyOptions()).checks if c.name == "description")
    assert not check.ok
    assert check.problems == [
        "'model.layers.1.moe.experts.0.down_proj.weight' and 23 more are spelled with '.moe.experts.': vllm-ascend "
        "looks Gemma 4 modules up with '.experts.' in its place, so it finds none of them (convert writes '.experts.')"
    ]
