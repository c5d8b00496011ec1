"""W4A16_MXFP4 and W4A4_MXFP4, and the scheme rows: what convert writes for them (golden bytes,
bit-exact against the numpy reference), the loader-facing shapes and K rules per rank, the
refusals, and what verify catches and runs for them."""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ascendconv.ascendv1 import QUANT_TYPES, SCHEME_ROWS
from ascendconv.cli import app
from ascendconv.decide import SCHEMES, Deployment, Override, Scheme, best_feasible
from ascendconv.errors import BadOptionError
from ascendconv.formats import elements, mx, resolve
from ascendconv.formats.constants import E2M1, E2M1_GRID, E4M3
from ascendconv.io.safetensors import read_header
from ascendconv.sources import Source
from ascendconv.verify import VerifyOptions, verify
from ascendconv.verify import moe as verify_moe
from conftest import FIXTURE_NAMES, FIXTURES, RULES, load_shard, save_shard
from test_convert_e2e import check_package
from test_plan import fp8, moe_layer, plan_of, written
from test_verify import moe_figures64

NEW_SCHEMES = ("w4a16-mxfp4-moe", "w4a4-mxfp4", "w4a4-mxfp4-moe")

# sha256 over (name, bytes) of every quant_model_* file (description, index, shards), rule mse.
# The dense fixture has no routed experts: its two MoE schemes write the w8a8-mxfp8 package.
GOLDEN = {
    ("qwen3-dense-fp8", "w4a16-mxfp4-moe"): "c9e91153891e4fd1682042dfbcef1ab1a1366896afb84d3c07146bb7b581afab",
    ("qwen3-dense-fp8", "w4a4-mxfp4"): "ec5e20863b73cea8a65cb16d6719fa02814716fd0600b0a9cd6c839d10528185",
    ("qwen3-dense-fp8", "w4a4-mxfp4-moe"): "c9e91153891e4fd1682042dfbcef1ab1a1366896afb84d3c07146bb7b581afab",
    ("qwen3-moe-fp8", "w4a16-mxfp4-moe"): "c284fa5e575c7d749fc7b4b0a4a8669e6750cfa070d4b663ee9734d8fbc4ae1f",
    ("qwen3-moe-fp8", "w4a4-mxfp4"): "8976687f7eab8a15f6166d88e88df256b75e7e80be3d7eac031fe2f2375f0161",
    ("qwen3-moe-fp8", "w4a4-mxfp4-moe"): "629f2964d0e10609af455140e7d64480ce2afe4a6ab4effa4ae8400bec3494dc",
    ("deepseek-v3-fp8", "w4a16-mxfp4-moe"): "9746bee49ff3926d0349fe89f502c715ce783bf735544552bd0572100d76735b",
    ("deepseek-v3-fp8", "w4a4-mxfp4"): "e935b663d511619349555747e53cf6ef0bddb6e4af97599f1c7442cb2855af65",
    ("deepseek-v3-fp8", "w4a4-mxfp4-moe"): "67cbf562d6c20123d8dda6988abf244802bef7cd229cc512ef69d61dface1a79",
}

# What each scheme asks for: (linears, routed experts), written out rather than read from the rows.
SCHEME_TYPES = {
    "w8a8-mxfp8": ("W8A8_MXFP8", "W8A8_MXFP8"),
    "w4a8-mxfp": ("W4A8_MXFP", "W4A8_MXFP"),
    "w4a8-mxfp-moe": ("W8A8_MXFP8", "W4A8_MXFP"),
    "w4a16-mxfp4-moe": ("W8A8_MXFP8", "W4A16_MXFP4"),
    "w4a4-mxfp4": ("W4A4_MXFP4", "W4A4_MXFP4"),
    "w4a4-mxfp4-moe": ("W8A8_MXFP8", "W4A4_MXFP4"),
    "native": ("W8A8_MXFP8", "W8A8_MXFP8"),  # what a source without MX linears asks for
}


def package_digest(out: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(out.glob("quant_model_*")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def package_bytes(out: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    tensors = {}
    for shard in sorted(out.glob("*.safetensors")):
        tensors.update(load_shard(shard))
    return tensors


def description(out: Path) -> dict:
    return json.loads((out / "quant_model_description.json").read_text())


# --- the rows ----------------------------------------------------------------------------------------


def test_scheme_rows_are_the_cli_choices_and_ask_for_their_types():
    assert SCHEMES == tuple(SCHEME_TYPES) == tuple(row.name for row in SCHEME_ROWS)
    assert [member.value for member in Scheme] == list(SCHEMES)
    assert {row.name: (row.linear, row.expert) for row in SCHEME_ROWS} == SCHEME_TYPES
    result = CliRunner().invoke(app, ["convert", "--help"])
    assert all(name in result.output for name in SCHEMES)


def test_the_new_types_columns():
    w4a16, w4a4 = QUANT_TYPES["W4A16_MXFP4"], QUANT_TYPES["W4A4_MXFP4"]
    assert (w4a16.element, w4a16.activation, w4a16.weight_dtype, w4a16.k_per_byte) == (E2M1, None, "U8", 2)
    assert (w4a4.element, w4a4.activation, w4a4.weight_dtype, w4a4.k_per_byte) == (E2M1, E2M1, "U8", 2)
    assert (w4a16.linear_k, w4a16.routed_k) == (None, 32)
    assert (w4a4.linear_k, w4a4.routed_k) == (32, 64)
    assert w4a4.chain() == ("W4A4_MXFP4", "W4A8_MXFP", "W8A8_MXFP8", "FLOAT")
    assert w4a16.chain() == ("W4A16_MXFP4", "W8A8_MXFP8", "FLOAT")
    # loader-facing shapes: W4A4 linear scales have cdiv(K, 32) columns, odd counts included
    assert w4a4.weight_shape(128, 160) == (128, 80) and w4a4.scale_shape(128, 160) == (128, 5)
    assert w4a16.scale_shape(256, 96) == (256, 3)
    assert [QUANT_TYPES[t].rank for t in ("FLOAT", "W8A8_MXFP8", "W4A16_MXFP4", "W4A8_MXFP", "W4A4_MXFP4")] == [0, 1, 2, 3, 4]
    assert w4a4.moe_check.input_round == "round" and w4a4.moe_check.inner_round == "rint"
    assert w4a16.moe_check.activation is None and not w4a16.moe_check.op_reference
    assert QUANT_TYPES["W4A8_MXFP"].moe_check.op_reference


# --- element rounding ----------------------------------------------------------------------------------


def _nearest_e2m1(value: Fraction, ties_away: bool) -> int:
    """An independent E2M1 encoder on exact fractions: the grid value nearest to |value| (clamped
    to 6); a tie goes away from zero or to the even index."""
    magnitude = min(abs(value), Fraction(6))
    grid = [Fraction(g) for g in E2M1_GRID]
    best = min(range(8), key=lambda i: (abs(grid[i] - magnitude), (-i if ties_away else i % 2)))
    return best | (8 if value < 0 or (value == 0 and str(value).startswith("-")) else 0)


def test_e2m1_round_modes_on_every_multiple_of_one_64th():
    values = np.arange(-7 * 64, 7 * 64 + 1, dtype=np.float32) / np.float32(64)
    for mode, away in (("round", True), ("rint", False)):
        got = elements.encode_e2m1(values, mode)
        want = [_nearest_e2m1(Fraction(float(v)), away) for v in values]
        assert got.tolist() == want, mode
    # they differ exactly at the ties: 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 and their negatives
    ties = values[elements.encode_e2m1(values, "round") != elements.encode_e2m1(values, "rint")]
    assert sorted(set(np.abs(ties).tolist())) == [0.25, 1.25, 2.5, 5.0]  # the others tie to an even code above
    assert elements.encode_e2m1(np.array([-0.0], np.float32), "round").tolist() == [8]
    with pytest.raises(ValueError, match="round_mode"):
        elements.encode_e2m1(values, "ceil")
    with pytest.raises(ValueError, match="mse"):
        mx.quantize_mx(values[:32], E2M1, "mse", "round")
    with pytest.raises(ValueError, match="round_mode"):
        mx.quantize_mx(values[:32], E4M3, "floor", "round")


# --- conversion ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
@pytest.mark.parametrize("scheme", NEW_SCHEMES)
def test_golden_bytes(converted, fixture, scheme):
    assert package_digest(converted(fixture, scheme)) == GOLDEN[(fixture, scheme)]


@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
@pytest.mark.parametrize("scheme", NEW_SCHEMES)
@pytest.mark.parametrize("rule", RULES)
def test_bit_exact_against_the_numpy_reference(converted, fixture, scheme, rule):
    """Every MX weight and scale of the new schemes equals the numpy reference's bytes for the
    BF16-resolved source, and every FP8 linear asks for its scheme's type."""
    out = converted(fixture, scheme, rule)
    check_package(fixture, out, rule)
    labels = description(out)
    tensors = package_bytes(out)
    source = Source.open(FIXTURES / fixture)
    linear_type, expert_type = SCHEME_TYPES[scheme]
    try:
        for prefix, linear in source.linears.items():
            label = labels[linear.weight.name]
            if label == "FLOAT":
                continue
            routed = ".experts." in prefix
            assert label == (expert_type if routed else linear_type) or label == "W8A8_MXFP8", prefix  # or a fallback
            resolved = resolve.resolve_tiles(
                source.reader.read(linear.weight), source.read_scale(linear), linear.block, "bf16"
            )
            element = QUANT_TYPES[label].element
            codes, scales = mx.quantize_mx(resolved, element, rule)
            payload = elements.pack_fp4(codes) if element is E2M1 else codes
            dtype, shape, data = tensors[linear.weight.name]
            assert (dtype, shape) == (QUANT_TYPES[label].weight_dtype, payload.shape)
            assert data == payload.tobytes(), prefix
            assert tensors[prefix + ".weight_scale"] == ("U8", scales.shape, scales.tobytes()), prefix
    finally:
        source.close()


@pytest.mark.parametrize("fixture", ("qwen3-moe-fp8", "deepseek-v3-fp8"))
@pytest.mark.parametrize("rule", RULES)
def test_w4a16_experts_are_the_w4a8_experts_byte_for_byte(converted, fixture, rule):
    w4a16, w4a8 = converted(fixture, "w4a16-mxfp4-moe", rule), converted(fixture, "w4a8-mxfp-moe", rule)
    assert package_bytes(w4a16) == package_bytes(w4a8)
    a, b = description(w4a16), description(w4a8)
    relabelled = {name for name in a if a[name] != b[name]}
    experts = {name for name, label in b.items() if label == "W4A8_MXFP"}
    assert experts and relabelled == experts | {"model_quant_type"}
    assert {a[name] for name in experts} == {"W4A16_MXFP4"} and a["model_quant_type"] == "W4A16_MXFP4"


def test_w4a4_linear_with_an_odd_scale_group_count(converted):
    """The dense fixture's layer-1 down_proj has K=160: five scale groups, an odd count the W4A4
    linear loader pads, so it stays W4A4_MXFP4 (under w4a8-mxfp it falls back to W8A8_MXFP8)."""
    out = converted("qwen3-dense-fp8", "w4a4-mxfp4")
    header = read_header(next(out.glob("*.safetensors"))).tensors
    prefix = "model.layers.1.mlp.down_proj"
    assert description(out)[prefix + ".weight"] == "W4A4_MXFP4"
    assert header[prefix + ".weight"].shape == (256, 80)
    assert header[prefix + ".weight_scale"].shape == (256, 5)


# --- planning: K rules per rank, fallbacks, refusals -------------------------------------------------------


def _moe_with(inter: int, o_proj_k: int = 256) -> dict:
    """One attention block and one MoE layer of two experts of intermediate size `inter`."""
    spec = moe_layer(inter)
    spec.update(fp8("model.layers.0.self_attn.o_proj", 256, o_proj_k))
    return spec


def _layer_types(plan) -> tuple[str, str]:
    types = written(plan)
    experts = {t for m, t in types.items() if ".experts." in m}
    assert len(experts) == 1  # one type per MoE layer
    return types["model.layers.0.self_attn.o_proj"], experts.pop()


@pytest.mark.parametrize(
    "scheme, inter, o_proj_k, want",
    [
        # expert down_proj K/T = inter/T; o_proj K/T = o_proj_k/T
        ("w4a4-mxfp4", 256, 160, {1: ("W4A4_MXFP4", "W4A4_MXFP4"), 2: ("FLOAT", "W4A4_MXFP4"), 4: ("FLOAT", "W4A4_MXFP4")}),
        ("w4a4-mxfp4", 192, 192, {1: ("W4A4_MXFP4", "W4A4_MXFP4"), 2: ("W4A4_MXFP4", "FLOAT"), 4: ("FLOAT", "FLOAT")}),
        ("w4a4-mxfp4-moe", 256, 256, {1: ("W8A8_MXFP8", "W4A4_MXFP4"), 2: ("W8A8_MXFP8", "W4A4_MXFP4"), 4: ("W8A8_MXFP8", "W4A4_MXFP4")}),
        ("w4a16-mxfp4-moe", 192, 256, {1: ("W8A8_MXFP8", "W4A16_MXFP4"), 2: ("W8A8_MXFP8", "W4A16_MXFP4"), 4: ("W8A8_MXFP8", "FLOAT")}),
        ("w4a16-mxfp4-moe", 96, 256, {1: ("W8A8_MXFP8", "W4A16_MXFP4"), 2: ("W8A8_MXFP8", "FLOAT"), 4: ("W8A8_MXFP8", "FLOAT")}),
    ],
)
def test_k_rules_per_rank(scheme, inter, o_proj_k, want):
    for tp, (o_proj, experts) in want.items():
        plan = plan_of(_moe_with(inter, o_proj_k), scheme=scheme, deployment=Deployment(tp=tp))
        assert _layer_types(plan) == (o_proj, experts), (tp, plan.fallbacks)
        by_name = {t.name: t for t in plan.tensors}
        scale = by_name.get("model.layers.0.self_attn.o_proj.weight_scale")
        if o_proj != "FLOAT":
            assert scale.shape == (256, -(-o_proj_k // 32))  # stored whole: each rank takes its columns
        if experts != "FLOAT":  # with --ep the experts keep their whole K
            ep = plan_of(_moe_with(inter, o_proj_k), scheme=scheme, deployment=Deployment(tp=tp, ep=True))
            assert _layer_types(ep)[1] == experts


def test_fallback_reasons_follow_the_chain():
    assert best_feasible("W4A4_MXFP4", 96, True) == ("FLOAT", "K=96 is not a multiple of 64 (MoE experts pair scale groups)")
    assert best_feasible("W4A4_MXFP4", 96, False) == ("W4A4_MXFP4", None)
    assert best_feasible("W4A4_MXFP4", 80, False) == ("FLOAT", "K=80 is not a multiple of 32")
    assert best_feasible("W4A16_MXFP4", 96, True) == ("W4A16_MXFP4", None)
    assert best_feasible("W4A16_MXFP4", 48, True)[0] == "FLOAT"
    plan = plan_of(_moe_with(96), scheme="w4a4-mxfp4")
    reasons = {d.module: d.reason for d in plan.fallbacks}
    assert reasons["model.layers.0.mlp.experts.1.gate_proj"] == (
        "one type per MoE layer; experts.0.down_proj: K=96 is not a multiple of 64 (MoE experts pair scale groups)"
    )


def test_a_moe_layer_keeps_one_type_when_members_fit_different_chains():
    """W4A16 experts with I=96 fit K % 32; an override puts one gate_proj in W8A8_MXFP8, whose MoE
    rule (K % 64) the down_projs do not meet: the layer goes down to FLOAT, all of it."""
    plan = plan_of(
        _moe_with(96),
        scheme="w4a16-mxfp4-moe",
        overrides=[Override.parse("model.layers.0.mlp.experts.0.gate_proj=W8A8_MXFP8")],
    )
    assert _layer_types(plan)[1] == "FLOAT"
    # and a group mixing W4A8 and W4A16 requests takes W4A16 (same bytes, the lower rank)
    plan = plan_of(
        _moe_with(128), scheme="w4a16-mxfp4-moe", overrides=[Override.parse("*.experts.1.*=W4A8_MXFP")]
    )
    assert _layer_types(plan)[1] == "W4A16_MXFP4"


def test_override_accepts_the_new_types_and_refuses_w4a16_on_a_linear():
    plan = plan_of(moe_layer(), scheme="w8a8-mxfp8", overrides=[Override.parse("*.experts.*=W4A16_MXFP4")])
    assert _layer_types(plan) == ("W8A8_MXFP8", "W4A16_MXFP4")
    plan = plan_of(moe_layer(), overrides=[Override.parse("*.o_proj=W4A4_MXFP4")])
    assert _layer_types(plan)[0] == "W4A4_MXFP4"
    with pytest.raises(BadOptionError, match=r"--override model\.layers\.0\.\*=W4A16_MXFP4 would write model\.layers\.0"
                       r"\.self_attn\.\w_proj as W4A16_MXFP4: W4A16_MXFP4 is for routed experts only \(vllm-ascend "
                       r"registers no W4A16_MXFP4 linear scheme\)") as raised:
        plan_of(moe_layer(), overrides=[Override.parse("model.layers.0.*=W4A16_MXFP4")])
    assert "narrow the GLOB to routed experts" in raised.value.hint


def test_cli_refuses_w4a16_on_a_linear_with_exit_2(tmp_path):
    result = CliRunner().invoke(
        app,
        ["convert", str(FIXTURES / "qwen3-moe-fp8"), str(tmp_path / "out"), "--override", "*=W4A16_MXFP4", "--dry-run"],
    )
    assert result.exit_code == 2, result.output
    assert "W4A16_MXFP4 is for routed experts only" in result.output
    assert not (tmp_path / "out").exists()


def test_model_quant_type_ranks_w4a16_between_w8a8_and_w4a8():
    assert plan_of(moe_layer(), scheme="w4a16-mxfp4-moe").model_quant_type == "W4A16_MXFP4"
    mixed = plan_of(moe_layer(), scheme="w4a16-mxfp4-moe", overrides=[Override.parse("*.o_proj=W4A8_MXFP")])
    assert mixed.model_quant_type == "W4A8_MXFP"
    w4a4 = plan_of(moe_layer(), scheme="w4a8-mxfp", overrides=[Override.parse("*.o_proj=W4A4_MXFP4")])
    assert w4a4.model_quant_type == "W4A4_MXFP4"


# --- verify ------------------------------------------------------------------------------------------------


def _rewrite_scale(out: Path, name: str, columns: int) -> None:
    """Replace `name` (U8 [N, G]) by [N, columns]: its groups, then zero columns (a writer that padded)."""
    shard = next(out.glob("*.safetensors"))
    tensors = load_shard(shard)
    dtype, (n, g), data = tensors[name]
    old = np.frombuffer(data, np.uint8).reshape(n, g)
    new = np.zeros((n, columns), np.uint8)
    new[:, : min(g, columns)] = old[:, : min(g, columns)]
    tensors[name] = (dtype, (n, columns), new.tobytes())
    save_shard(shard, tensors)


def test_verify_catches_w4a4_linear_scales_with_the_wrong_column_count(converted, tmp_path):
    import shutil

    out = tmp_path / "pkg"
    shutil.copytree(converted("qwen3-dense-fp8", "w4a4-mxfp4"), out)
    assert verify(out, VerifyOptions(checksums=False)).ok
    name = "model.layers.1.mlp.down_proj.weight_scale"  # K=160: cdiv(160, 32) = 5 columns
    _rewrite_scale(out, name, 6)  # pre-padded to an even count, as the loader would pad it
    report = verify(out, VerifyOptions(checksums=False))
    shapes = next(c for c in report.checks if c.name == "shapes")
    assert not report.ok and not shapes.ok
    assert shapes.problems == [
        f"'{name}' (quant_model_weights-00001-of-00001.safetensors) has shape [256, 6]; W4A4_MXFP4 weight "
        "'model.layers.1.mlp.down_proj.weight' [256, 80] (N=256, K=160) needs [256, 5]"
    ]


def test_verify_fails_a_linear_labelled_w4a16(converted, tmp_path):
    import shutil

    out = tmp_path / "pkg"
    shutil.copytree(converted("qwen3-moe-fp8", "w4a8-mxfp"), out)
    path = out / "quant_model_description.json"
    labels = json.loads(path.read_text())
    for suffix in (".weight", ".weight_scale"):
        labels["model.layers.0.self_attn.q_proj" + suffix] = "W4A16_MXFP4"
    path.write_text(json.dumps(labels))
    report = verify(out, VerifyOptions(checksums=False))
    alignment = next(c for c in report.checks if c.name == "alignment")
    assert not alignment.ok
    assert alignment.problems == [
        "model.layers.0.self_attn.q_proj (W4A16_MXFP4): W4A16_MXFP4 is for routed experts only "
        "(vllm-ascend registers no W4A16_MXFP4 linear scheme)"
    ]


@pytest.mark.parametrize("scheme", NEW_SCHEMES)
def test_clean_packages_pass_every_check(converted, scheme):
    pkg = converted("qwen3-moe-fp8", scheme)
    report = verify(pkg, VerifyOptions(source=FIXTURES / "qwen3-moe-fp8", exact="sample", moe_check=True, moe_layers=0))
    assert report.ok, [c for c in report.checks if not c.ok]
    assert {t.type for t in report.tensors} >= {SCHEME_TYPES[scheme][1]}
    expert_type = SCHEME_TYPES[scheme][1]
    assert {m.type for m in report.moe} == {expert_type} and len(report.moe) == 2
    assert all(m.max_rel_err == QUANT_TYPES[expert_type].moe_rel_err for m in report.moe)


def _e2m1_round_half_away_mx(x: np.ndarray) -> np.ndarray:
    """Independent MXFP4 activation quantization (floor scale, ties away from zero), dequantized."""
    groups = x.astype(np.float64).reshape(x.shape[0], -1, 32)
    amax = np.abs(groups).max(axis=-1)
    _, exponent = np.frexp(amax)  # amax = m * 2**exponent, m in [0.5, 1)
    scale = np.where(amax > 0, np.ldexp(1.0, exponent - 1 - 2), 1.0)  # 2**(floor(log2 amax) - emax)
    y = np.minimum(np.abs(groups) / scale[..., None], 6.0)
    grid = np.array(E2M1_GRID)
    midpoints = (grid[1:] + grid[:-1]) / 2
    q = grid[np.searchsorted(midpoints, y, side="right")]
    return (np.sign(groups) * q * scale[..., None]).reshape(x.shape)


@pytest.mark.parametrize("scheme", ["w4a16-mxfp4-moe", "w4a4-mxfp4"])
def test_moe_check_runs_each_types_chain(converted, scheme):
    """--moe-check's figures, recomputed in float64 from the files: W4A16 experts take the BF16
    activations as they are, W4A4 experts MXFP4 activations rounded half away from zero (and the
    SiTU output quantized to MXFP4, nearest-even, on its way into down_proj)."""
    pkg = converted("qwen3-moe-fp8", scheme)
    options = VerifyOptions(source=FIXTURES / "qwen3-moe-fp8", moe_check=True, moe_layers=0)
    report = verify(pkg, options)
    expert_type = SCHEME_TYPES[scheme][1]
    check = QUANT_TYPES[expert_type].moe_check
    assert report.ok and len(report.moe) == 2 and all(m.path.startswith(check.path) for m in report.moe)
    a16 = expert_type == "W4A16_MXFP4"
    moe_figures64(
        pkg,
        report,
        options,
        lambda codes, scales, x_bf16: x_bf16 if a16 else _e2m1_round_half_away_mx(x_bf16),
        lambda reader, w, s: mx.dequantize_mx(elements.unpack_fp4(reader.read(w)), reader.read(s), E2M1).astype(np.float64),
        (lambda y: y) if a16 else (lambda y: verify_moe.mx_output(y, check)),
    )


def test_inspect_says_what_vllm_ascend_runs_per_scheme():
    from ascendconv.inspect import inspect_path

    report = inspect_path(FIXTURES / "qwen3-moe-fp8")
    runtime = {scheme: estimate.runtime for scheme, estimate in report.schemes.items()}
    assert set(runtime) == set(SCHEMES)
    assert f"W4A16_MXFP4 (24 modules): {QUANT_TYPES['W4A16_MXFP4'].runtime}" in runtime["w4a16-mxfp4-moe"]
    assert any(note.startswith("W4A4_MXFP4 (31 modules): ") and "round_mode round" in note for note in runtime["w4a4-mxfp4"])
    assert report.schemes["w4a16-mxfp4-moe"].model_quant_type == "W4A16_MXFP4"
    assert report.schemes["w4a16-mxfp4-moe"].bytes_out == report.schemes["w4a8-mxfp-moe"].bytes_out
