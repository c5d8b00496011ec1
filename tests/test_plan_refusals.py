"""What convert refuses or warns about up front, before writing a byte: a --tp its own `verify --tp`
would reject, an --override glob that matches nothing (unless allowed), MTP layers quantized by an
override (a warning, in --json too), a packed group or MoE layer with a member the source does not
quantize (planned FLOAT whole, as verify's packed_groups requires; an --override forcing it refused)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.convert import ConvertOptions, convert
from ascendconv.decide import Deployment, Override
from ascendconv.errors import BadOptionError
from ascendconv.inspect import inspect_path
from ascendconv.verify import VerifyOptions, verify
from conftest import FIXTURES
from test_models import DEEPSEEK, deepseek_with_mtp
from test_plan import plan_of
from test_source_formats import as_float, respell

runner = CliRunner()
DENSE = "qwen3-dense-fp8"
MOE = "qwen3-moe-fp8"
NUMPY_TYPES = {"BF16": ml_dtypes.bfloat16, "F64": np.float64, "I32": np.int32, "U8": np.uint8, "I8": np.int8}


def with_heads(fixture_copy, heads: int):
    """The dense fixture (2 attention heads, linears that split over 2 ranks but not 3) with `heads`."""
    root = fixture_copy(DENSE)
    config = json.loads((root / "config.json").read_text())
    config["num_attention_heads"] = heads
    (root / "config.json").write_text(json.dumps(config))
    return root


def test_a_tp_the_package_could_not_be_served_under_is_refused_naming_the_layers(fixture_copy, tmp_path):
    src = with_heads(fixture_copy, 6)  # heads that divide over 3 ranks: the splits alone are at fault
    with pytest.raises(BadOptionError, match=r"--tp 3: the package could not be served: ") as refused:
        convert(src, tmp_path / "out", ConvertOptions(deployment=Deployment(tp=3)))
    assert "model.layers.0.self_attn.q_proj (W8A8_MXFP8, column-parallel): N=128 does not split over 3 ranks" in str(refused.value)
    assert "--override" in refused.value.hint
    assert not (tmp_path / "out").exists()
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out"), "--tp", "3", "--dry-run"])
    assert result.exit_code == 2 and "could not be served" in result.stderr


HEADS_REFUSED = "config.json: 2 attention heads do not divide over 3 ranks, and vLLM refuses such a deployment"
HEADS_FIX = "choose a --tp that divides the number of attention heads"


def test_heads_a_tp_does_not_divide_are_the_reason_given_before_splits_that_do_not_align(converted, tmp_path):
    """--tp 3 on the dense fixture: 2 heads do not divide over 3 ranks and its linears do not split
    either. convert named the splits, with a hint to --override types, which cannot help: vLLM
    refuses the deployment for its heads whatever the weights."""
    for dry_run in ([], ["--dry-run"]):
        result = runner.invoke(app, ["convert", str(FIXTURES / DENSE), str(tmp_path / "out"), "--tp", "3", *dry_run, "--json"])
        assert result.exit_code == 2
        assert json.loads(result.stdout) == {"ok": False, "schema": 1, "command": "convert", "error": "BadOptionError",
                                             "message": f"--tp 3: {HEADS_REFUSED}", "hint": HEADS_FIX, "exit_code": 2}
        assert not (tmp_path / "out").exists()
    # inspect warns of the heads alone; verify's tp check leads with them and gives their fix
    assert inspect_path(FIXTURES / DENSE, deployment=Deployment(tp=3)).warnings == [HEADS_REFUSED]
    tp = verify(converted(DENSE), VerifyOptions(tp=3, checksums=False)).check("tp")
    assert (tp.ok, tp.problems[0], tp.hint) == (False, HEADS_REFUSED, HEADS_FIX)
    assert "model.layers.0.self_attn.q_proj (W8A8_MXFP8, column-parallel): N=128 does not split over 3 ranks (N/T = 42.6667)" in tp.problems


def test_a_tp_convert_accepts_is_one_its_verify_accepts(tmp_path):
    out = tmp_path / "out"
    convert(FIXTURES / DENSE, out, ConvertOptions(deployment=Deployment(tp=2)))
    report = verify(out, VerifyOptions(tp=2))
    assert report.ok, [(c.name, c.problems) for c in report.failed]


def test_an_override_that_matches_nothing_is_an_error_unless_allowed(tmp_path):
    typo = Override.parse("model.layer.0.*=FLOAT")  # model.layers.0.*
    with pytest.raises(BadOptionError, match=r"--override model.layer.0.\*=FLOAT: matches no linear"):
        convert(FIXTURES / DENSE, tmp_path / "out", ConvertOptions(overrides=[typo]))
    assert not (tmp_path / "out").exists()
    args = ["convert", str(FIXTURES / DENSE), str(tmp_path / "out"), "--override", "model.layer.0.*=FLOAT", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and json.loads(result.stdout.splitlines()[0])["error"] == "BadOptionError"
    assert "--allow-unmatched-override" in json.loads(result.stdout.splitlines()[0])["hint"]
    result = runner.invoke(app, [*args, "--allow-unmatched-override"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["warnings"] == ["--override model.layer.0.*=FLOAT: matches no linear of the source"]
    result = runner.invoke(app, [*args[:-1], "--allow-unmatched-override", "--overwrite"])
    assert result.exit_code == 0 and "warning: --override model.layer.0.*=FLOAT" in " ".join(result.stderr.split())


def test_quantizing_mtp_layers_by_override_warns():
    config = {**DEEPSEEK, "model_type": "deepseek_v32"}
    assert plan_of(deepseek_with_mtp(), config=config).warnings == []
    plan = plan_of(deepseek_with_mtp(), config=config, overrides=[Override.parse("model.layers.1.*=W8A8_MXFP8")])
    assert plan.warnings == ["11 MTP modules quantized by --override: vllm-ascend expects the MTP layer FLOAT"]
    assert plan.to_dict()["warnings"] == plan.warnings  # what --json prints


def left_unquantized(src, dst, module: str, dtype: str = "BF16", shape: tuple[int, ...] | None = None):
    """A copy of `src` whose linear `module` the source does not quantize: stored as `dtype` (in
    `shape`, if given), its scale dropped and, in a quantized source, listed in modules_to_not_convert."""

    def tensor(name, entry):
        if name == module + ".weight_scale_inv":
            return {}
        if name == module + ".weight":
            stored = shape or entry[1]
            return {name: (dtype, stored, np.full(stored, 0.01).astype(NUMPY_TYPES[dtype]).tobytes())}
        return {name: entry}

    def config(cfg):
        quant = cfg.get("quantization_config")
        if quant is not None:
            cfg["quantization_config"] = {**quant, "modules_to_not_convert": [*quant.get("modules_to_not_convert", []), module]}
        return cfg

    return respell(src, dst, tensor, config)


def converted_as_planned(src, out, scheme: str = "w8a8-mxfp8") -> list[dict]:
    """Convert `src` and check what the plan says against what inspect and verify say: the dry run's
    fallbacks are inspect's and the run's, and verify accepts the package. Returns the fallbacks."""
    dry = runner.invoke(app, ["convert", str(src), str(out), "--scheme", scheme, "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    fallbacks = json.loads(dry.stdout)["fallbacks"]
    assert [f.to_dict() for f in inspect_path(src).schemes[scheme].fallbacks] == fallbacks
    result = convert(src, out, ConvertOptions(scheme=scheme))
    assert [d.to_dict() for d in result.plan.fallbacks] == fallbacks
    report = verify(out, VerifyOptions())
    assert report.ok, [(c.name, c.problems) for c in report.failed]
    return fallbacks


def test_a_release_leaving_one_packed_member_unquantized_converts_its_group_float(tmp_path):
    """An FP8 release whose q_proj is BF16 (modules_to_not_convert): q, k and v are written FLOAT,
    the plan says why, and verify's packed_groups accepts the package."""
    q, k, v = (f"model.layers.0.self_attn.{p}_proj" for p in "qkv")
    src = left_unquantized(FIXTURES / DENSE, tmp_path / "src", q)
    fallbacks = converted_as_planned(src, tmp_path / "out")
    why = f"packed with {q}: the source leaves it unquantized (BF16 [128, 256]), so it stays FLOAT"
    assert fallbacks == [{"module": m, "requested": "W8A8_MXFP8", "written": "FLOAT", "reason": why} for m in (k, v)]
    description = json.loads((tmp_path / "out" / "quant_model_description.json").read_text())
    assert [description[m + ".weight"] for m in (q, k, v)] == ["FLOAT"] * 3
    assert description["model.layers.1.self_attn.k_proj.weight"] == "W8A8_MXFP8"


@pytest.mark.parametrize(
    "dtype,shape,stored",
    # (an integer projection weight is refused as an unrecognized quantized payload: below)
    [("F64", None, "F64 [128, 256], a dtype"), ("BF16", (256,), "BF16 [256], not a 2-D weight")],
)
def test_a_float_checkpoint_with_a_packed_member_it_cannot_quantize_converts_its_group_float(tmp_path, dtype, shape, stored):
    q, k = "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"
    src = left_unquantized(as_float(FIXTURES / DENSE, tmp_path / "bf16"), tmp_path / "src", q, dtype, shape)
    fallbacks = converted_as_planned(src, tmp_path / "out")
    assert [f["module"] for f in fallbacks] == [k, "model.layers.0.self_attn.v_proj"]
    assert fallbacks[0]["reason"].startswith(f"packed with {q}: the source stores it {stored}")


@pytest.mark.parametrize("dtype", ["U8", "I8", "I32"])
def test_a_float_checkpoint_with_an_integer_projection_weight_is_refused_as_unrecognized(tmp_path, dtype):
    """Integers named as a projection's weight are some quantized format's codes: copied FLOAT, as they
    were, the package held codes the runtime reads as values (and verify's dtypes check fails it)."""
    q = "model.layers.0.self_attn.q_proj"
    src = left_unquantized(as_float(FIXTURES / DENSE, tmp_path / "bf16"), tmp_path / "src", q, dtype)
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out"), "--json"])
    assert result.exit_code == 3, result.output
    error = json.loads(result.stdout)
    assert error["error"] == "UnrecognizedCheckpointError"
    assert error["message"] == (
        f"{src}: holds {dtype} tensors (e.g. '{q}.weight', named as a quantized weight or its scale) but config.json "
        "has no quantization_config"
    )
    assert not (tmp_path / "out").exists()


def test_a_release_leaving_one_routed_expert_unquantized_converts_its_moe_layer_float(tmp_path):
    expert = "model.layers.0.mlp.experts.1.up_proj"
    src = left_unquantized(FIXTURES / MOE, tmp_path / "src", expert)
    fallbacks = converted_as_planned(src, tmp_path / "out", "w4a8-mxfp-moe")
    assert {f["module"].split(".experts.")[0] for f in fallbacks} == {"model.layers.0.mlp"}
    assert {f["reason"] for f in fallbacks} == {
        "one type per MoE layer; experts.1.up_proj: the source leaves it unquantized (BF16 [128, 128]), so it stays FLOAT"
    }
    description = json.loads((tmp_path / "out" / "quant_model_description.json").read_text())
    assert {t for n, t in description.items() if n.startswith("model.layers.0.mlp.experts.")} == {"FLOAT"}
    assert description["model.layers.1.mlp.experts.1.up_proj.weight"] == "W4A8_MXFP"


def test_an_override_that_would_mix_a_packed_group_is_refused_before_writing(tmp_path):
    q = "model.layers.0.self_attn.q_proj"
    src = left_unquantized(FIXTURES / DENSE, tmp_path / "src", q)
    args = ["convert", str(src), str(tmp_path / "out"), "--override", "*.k_proj=W8A8_MXFP8", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout.splitlines()[0])
    assert error["error"] == "BadOptionError"
    assert f"the packed module model.layers.0.self_attn.qkv_proj holds {q}" in error["message"]
    assert not (tmp_path / "out").exists()
