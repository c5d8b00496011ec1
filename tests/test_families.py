"""The real model families at full scale, on header-only sparse copies generated per session.

Each family's copy (tests/fullscale.py) has the published config.json, every tensor's name, dtype
and shape and the shard layout, with data regions left as holes. For each: the generator against the
published totals, inspect, a plan per scheme (what `convert --dry-run` prints), TP deployments and
CLI dry runs, with the decisions checked against what vllm-ascend's loader does for that model_type.
Expected counts are derived from each architecture, not copied from a run.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.inspect import inspect_path
from ascendconv.sources import Source
from ascendconv.models import INDEXER_WK_REASON, KV_B_REASON, MTP_REASON
from ascendconv.decide import SCHEMES, Deployment
from ascendconv.plan import Planner
from fullscale import FAMILIES, write_sparse_checkpoint

# Published totals (docs/families.md, "Sources"): tensors, and bytes or GiB rounded to 2 places.
# The 2026 figures: Qwen3.8-27B 28.75 GiB (the tensor count and exact bytes of a layout built from
# its published facts: 1,606 and 30,866,663,264); Qwen3.6-35B-A3B 64,196 tensors, "37.5 GB"
# (37,454,789,472 from its facts); GLM-5.1 "about 750 GB" (119,028 tensors and 756 GB from its
# facts with F32 scales); DeepSeek-V4-Flash-Base 69,187 tensors (V4-Flash's count: same layout),
# 292.55 GB assumed; Qwen3.5-397B and MiniMax-M3 have no published total (counts from their facts).
PUBLISHED = {
    "deepseek-v3": (91_991, 688_574_839_360),
    "kimi-k2": (139_644, 958.49),
    "qwen3-30b-a3b": (37_491, 29.03),
    "minimax-m2": (96_103, 214.32),
    "qwen3.8-27b": (1_606, 30_866_663_264),
    "qwen3.6-35b-a3b": (64_196, 37_454_789_472),
    "qwen3.5-397b-a17b": (189_042, 378.23),
    "glm-5.1": (119_028, 704.23),
    "minimax-m3": (45_836, 401.92),
    "deepseek-v4-flash-base": (69_187, 272.46),
}
# Families the block-FP8 reader opens; DeepSeek-V4's native layout waits for its reader.
READABLE = [name for name in FAMILIES if name != "deepseek-v4-flash-base"]

# Per family: FP8 linears written per type under each scheme at --tp 1. A MoE model's experts are
# layers x experts x 3; "attention" counts the FP8 attention projections per layer.
DS_ATTENTION = 4  # q_a, q_b, kv_a, o (kv_b stays FLOAT)
EXPECTED = {
    # 61 layers: 3 dense + 58 MoE of 256 experts + 1 shared expert; MTP layer 61 (5 + 768 + 3) FLOAT
    "deepseek-v3": dict(float=61 + 776, moe_w8=61 * DS_ATTENTION + 3 * 3 + 58 * 3, moe_w4=58 * 256 * 3),
    # + per layer indexer.wq_b (quantized) and indexer.wk (FLOAT); the MTP layer has both, FLOAT
    "deepseek-v3.2-exp": dict(float=61 + 61 + 778, moe_w8=61 * (DS_ATTENTION + 1) + 3 * 3 + 58 * 3, moe_w4=58 * 256 * 3),
    # 61 layers: 1 dense + 60 MoE of 384 experts + 1 shared expert, no MTP tensors
    "kimi-k2": dict(float=61, moe_w8=61 * DS_ATTENTION + 3 + 60 * 3, moe_w4=60 * 384 * 3),
    "qwen3-30b-a3b": dict(float=0, moe_w8=48 * 4, moe_w4=48 * 128 * 3),
    "qwen3-235b-a22b": dict(float=0, moe_w8=94 * 4, moe_w4=94 * 128 * 3),
    "qwen3-coder-480b": dict(float=0, moe_w8=62 * 4, moe_w4=62 * 160 * 3),
    # 12 full-attention layers (q/k/v/o) + 36 DeltaNet layers (in_proj_qkvz, out_proj), a shared
    # expert per layer; mtp.layers.0 (4 + 1536 + 3) FLOAT
    "qwen3-next-80b-a3b": dict(float=1543, moe_w8=12 * 4 + 36 * 2 + 48 * 3, moe_w4=48 * 512 * 3),
    "qwen3-32b": dict(float=0, moe_w8=64 * 7, moe_w4=0),
    "minimax-m2": dict(float=0, moe_w8=62 * 4, moe_w4=62 * 256 * 3),
    # 48 DeltaNet layers (in_proj_qkv, in_proj_z, out_proj) + 16 full-attention (q/k/v/o) + 64 MLPs;
    # mtp.layers.0 (4 + 3) FLOAT
    "qwen3.8-27b": dict(float=7, moe_w8=48 * 3 + 16 * 4 + 64 * 3, moe_w4=0),
    # 30 DeltaNet + 10 full-attention layers, a shared expert each; mtp.layers.0 (4 + 768 + 3) FLOAT
    "qwen3.6-35b-a3b": dict(float=775, moe_w8=30 * 3 + 10 * 4 + 40 * 3, moe_w4=40 * 256 * 3),
    "qwen3.5-397b-a17b": dict(float=1543, moe_w8=45 * 3 + 15 * 4 + 60 * 3, moe_w4=60 * 512 * 3),
    # 78 layers: attention (q_a, q_b, kv_a, o) + indexer.wq_b, 3 dense, 75 MoE + shared; kv_b and
    # indexer.wk FLOAT per layer; MTP layer 78 (7 + 768 + 3) FLOAT
    "glm-5.1": dict(float=78 + 78 + 778, moe_w8=78 * 5 + 3 * 3 + 75 * 3, moe_w4=75 * 256 * 3),
    # 60 layers of q/k/v/o, 57 sparse ones with index_q/index_k, 3 dense MLPs, 57 MoE + shared
    "minimax-m3": dict(float=0, moe_w8=60 * 4 + 57 * 2 + 3 * 3 + 57 * 3, moe_w4=57 * 128 * 3),
}

MTP_PREFIX = {
    "deepseek-v3": "model.layers.61.", "deepseek-v3.2-exp": "model.layers.61.", "qwen3-next-80b-a3b": "mtp.",
    "qwen3.8-27b": "mtp.", "qwen3.6-35b-a3b": "mtp.", "qwen3.5-397b-a17b": "mtp.", "glm-5.1": "model.layers.78.",
}  # fmt: skip

STRUCTURE = {  # layers, MoE layers (MTP included), routed experts, layers with shared experts, MTP, indexers
    "deepseek-v3": (61, 59, 256, 59, ["model.layers.61"], 0),
    "deepseek-v3.2-exp": (61, 59, 256, 59, ["model.layers.61"], 62),
    "kimi-k2": (61, 60, 384, 60, [], 0),
    "qwen3-30b-a3b": (48, 48, 128, 0, [], 0),
    "qwen3-235b-a22b": (94, 94, 128, 0, [], 0),
    "qwen3-coder-480b": (62, 62, 160, 0, [], 0),
    "qwen3-next-80b-a3b": (48, 49, 512, 49, ["mtp"], 0),
    "qwen3-32b": (64, 0, 0, 0, [], 0),
    "minimax-m2": (62, 62, 256, 0, [], 0),
    "qwen3.8-27b": (64, 0, 0, 0, ["mtp"], 0),
    "qwen3.6-35b-a3b": (40, 41, 256, 41, ["mtp"], 0),
    "qwen3.5-397b-a17b": (60, 61, 512, 61, ["mtp"], 0),
    "glm-5.1": (78, 76, 256, 76, ["model.layers.78"], 79),
    "minimax-m3": (60, 57, 128, 57, [], 57),
}

@pytest.fixture(scope="session")
def family_root(tmp_path_factory):
    """family name -> directory of its sparse header-only copy, written once per session."""
    roots: dict = {}

    def make(name: str):
        if name not in roots:
            roots[name] = write_sparse_checkpoint(FAMILIES[name](), tmp_path_factory.mktemp("families") / name)
        return roots[name]

    return make


@pytest.fixture(scope="module")
def planner(family_root):
    """(family, Deployment) -> Planner over the family's copy, opened once. Module scope: the
    opened sources (about a million objects) are let go before later tests run, whose subprocesses
    would otherwise inherit a large peak RSS from this process."""
    sources: dict = {}
    planners: dict = {}

    def make(name: str, deployment: Deployment = Deployment()):
        if name not in sources:
            sources.clear()  # one family at a time: tests use them in turn
            planners.clear()
            sources[name] = Source.open(family_root(name))
        key = (name, deployment)
        if key not in planners:
            planners[key] = Planner.for_source(sources[name], deployment)
        return planners[key]

    yield make
    sources.clear()
    planners.clear()


def written(plan, fragment: str) -> set[str]:
    return {d.written for m, d in plan.decisions.items() if fragment in m}


def test_generators_match_the_published_totals():
    for name, (tensors, size) in PUBLISHED.items():
        family = FAMILIES[name]()
        assert len(family.tensors) == tensors, name
        assert len({t[0] for t in family.tensors}) == tensors, f"{name}: duplicate names"
        if isinstance(size, int):
            assert family.tensor_bytes == size, name
        else:
            assert round(family.tensor_bytes / 2**30, 2) == size, name


@pytest.mark.parametrize("name", READABLE)
def test_inspect_names_the_structure(family_root, name):
    family = FAMILIES[name]()
    report = inspect_path(family_root(name))
    assert (report.tensor_count, report.tensor_bytes) == (len(family.tensors), family.tensor_bytes)
    assert len(report.shards) == family.shards
    assert report.total_bytes > report.tensor_bytes  # plus the headers: every data byte is there
    layers, moe, experts, shared, mtp, indexers = STRUCTURE[name]
    assert (report.layers, report.moe_layers, report.routed_experts) == (layers, moe, experts)
    assert (report.shared_expert_layers, report.mtp_layers, report.indexer_layers) == (shared, mtp, indexers)
    assert report.warnings == [] and report.family != "generic"
    assert report.model["num_experts"] == (experts or None)
    for scheme in SCHEMES:
        modules = report.schemes[scheme].modules
        assert sum(modules.values()) == report.fp8_linears
        assert modules["FLOAT"] == EXPECTED[name]["float"]


@pytest.mark.parametrize("name", READABLE)
def test_plan_per_scheme_matches_what_vllm_ascend_loads(planner, name):
    expected = EXPECTED[name]
    plans = {scheme: planner(name).plan(scheme) for scheme in SCHEMES}
    quantized = expected["moe_w8"] + expected["moe_w4"]
    assert plans["w8a8-mxfp8"].type_counts() == {"FLOAT": expected["float"], "W8A8_MXFP8": quantized, "W4A8_MXFP": 0}
    assert plans["w4a8-mxfp"].type_counts() == {"FLOAT": expected["float"], "W8A8_MXFP8": 0, "W4A8_MXFP": quantized}
    assert plans["w4a8-mxfp-moe"].type_counts() == {
        "FLOAT": expected["float"], "W8A8_MXFP8": expected["moe_w8"], "W4A8_MXFP": expected["moe_w4"]
    }
    for plan in plans.values():
        assert plan.fallbacks == []  # nothing misaligned at --tp 1
        assert plan.quantized_mtp_modules() == 0
        # every MoE layer has one type; shared experts are not routed experts
        by_group: dict[str, set] = {}
        for decision in plan.decisions.values():
            by_group.setdefault(decision.group, set()).add(decision.written)
        assert all(len(types) == 1 for types in by_group.values())
    mtp = MTP_PREFIX.get(name, "(no MTP)")
    moe = plans["w4a8-mxfp-moe"]
    for module, decision in moe.decisions.items():
        if module.startswith(mtp):
            assert decision.written == "FLOAT", module
        elif ".experts." in module:
            assert decision.written == "W4A8_MXFP", module
        elif ".shared_expert" in module:
            assert decision.written == "W8A8_MXFP8", module


def test_deepseek_v3_mtp_layer_and_kv_b_stay_float(planner):
    plan = planner("deepseek-v3").plan("w4a8-mxfp")
    assert written(plan, "model.layers.61.") == {"FLOAT"}
    assert written(plan, ".kv_b_proj") == {"FLOAT"}
    assert plan.kept_float() == {KV_B_REASON: 61, MTP_REASON: 776}
    mtp = plan.decisions["model.layers.61.mlp.experts.0.down_proj"]
    assert (mtp.requested, mtp.reason) == ("FLOAT", MTP_REASON)
    # the MTP layer's own BF16 tensors are copied as they are
    copies = {t.name: t for t in plan.tensors if t.kind == "copy"}
    assert copies["model.layers.61.eh_proj.weight"].dtype == "BF16"


def test_deepseek_v32_indexer_wk_stays_float_and_wq_b_is_quantized(planner):
    plan = planner("deepseek-v3.2-exp").plan("w4a8-mxfp-moe")
    assert written(plan, ".indexer.wk") == {"FLOAT"}
    assert written(plan, "model.layers.7.self_attn.indexer.wq_b") == {"W8A8_MXFP8"}
    assert plan.kept_float() == {KV_B_REASON: 61, INDEXER_WK_REASON: 61, MTP_REASON: 778}
    wk = {t.name: t for t in plan.tensors}["model.layers.7.self_attn.indexer.wk.weight"]
    assert (wk.dtype, wk.shape, wk.kind) == ("BF16", (128, 7168), "resolve")  # vLLM loads a BF16 wk as it is


@pytest.mark.parametrize(
    "name, tp, down, k_label",
    [
        ("qwen3-30b-a3b", 8, "model.layers.5.mlp.experts.3.down_proj", "K/T = 768/8 = 96"),
        ("qwen3-235b-a22b", 16, "model.layers.5.mlp.experts.3.down_proj", "K/T = 1536/16 = 96"),
        ("qwen3-coder-480b", 16, "model.layers.5.mlp.experts.3.down_proj", "K/T = 2560/16 = 160"),
        ("minimax-m2", 16, "model.layers.5.block_sparse_moe.experts.3.w2", "K/T = 1536/16 = 96"),
    ],
)
def test_tp_without_expert_parallelism_plans_the_fallbacks_up_front(planner, name, tp, down, k_label):
    experts = EXPECTED[name]["moe_w4"]
    plan = planner(name, Deployment(tp=tp)).plan("w4a8-mxfp-moe")
    assert plan.type_counts()["FLOAT"] == experts and len(plan.fallbacks) == experts
    assert plan.decisions[down].reason == f"{k_label} is not a multiple of 64 (W4A8_MXFP pairs scale groups)"
    # expert parallelism places experts whole: the same deployment with --ep needs no fallback
    assert planner(name, Deployment(tp=tp, ep=True)).plan("w4a8-mxfp-moe").fallbacks == []


def test_deepseek_needs_no_fallback_at_tp_16(planner):
    assert planner("deepseek-v3", Deployment(tp=16)).plan("w4a8-mxfp").fallbacks == []


def test_qwen3_next_shared_expert_and_mtp(planner):
    plan = planner("qwen3-next-80b-a3b").plan("w4a8-mxfp-moe")
    assert written(plan, "mtp.") == {"FLOAT"}
    assert written(plan, "model.layers.4.mlp.shared_expert.") == {"W8A8_MXFP8"}
    assert {t.name: t for t in plan.tensors}["model.layers.0.linear_attn.in_proj_ba.weight"].kind == "copy"
    # --shared-experts-as-routed: the shared expert takes the routed experts' type and layer
    as_routed = planner("qwen3-next-80b-a3b", Deployment(shared_experts_as_routed=True)).plan("w4a8-mxfp-moe")
    shared = as_routed.decisions["model.layers.4.mlp.shared_expert.down_proj"]
    assert (shared.written, shared.group) == ("W4A8_MXFP", "model.layers.4.mlp.experts")
    # at --tp 16 --ep the shared expert (not placed with the experts) splits K = 512 into 32 per rank
    split = planner("qwen3-next-80b-a3b", Deployment(tp=16, ep=True)).plan("w4a8-mxfp")
    assert {d.module.rsplit(".", 2)[-2] for d in split.fallbacks} == {"shared_expert"}
    assert split.decisions["model.layers.4.mlp.shared_expert.down_proj"].written == "W8A8_MXFP8"


def test_minimax_experts_are_w4a8_and_the_package_halves(planner):
    plans = {scheme: planner("minimax-m2").plan(scheme) for scheme in SCHEMES}
    assert written(plans["w4a8-mxfp-moe"], ".block_sparse_moe.experts.") == {"W4A8_MXFP"}
    # experts are 97% of the weights: W4A8 experts take the package from 237 GB to about 125 GB
    assert plans["w4a8-mxfp-moe"].bytes_out < 0.53 * plans["w8a8-mxfp8"].bytes_out
    gate = {t.name: t for t in plans["w4a8-mxfp-moe"].tensors}["model.layers.0.block_sparse_moe.gate.weight"]
    assert (gate.dtype, gate.kind) == ("F32", "copy")


# The CLI dry run for the families whose rules differ most (MTP by number, indexer; MTP by prefix,
# shared expert; w1/w3/w2 experts, float8_e4m3fn): the plans of every family are checked above.
@pytest.mark.parametrize("name", ["deepseek-v3.2-exp", "qwen3-next-80b-a3b", "minimax-m2"])
def test_dry_run_json(family_root, name):
    result = CliRunner().invoke(
        app, ["convert", str(family_root(name)), "unused-out", "--scheme", "w4a8-mxfp-moe", "--dry-run", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    description = data["description"]
    assert data["modules"] == {
        "FLOAT": EXPECTED[name]["float"], "W8A8_MXFP8": EXPECTED[name]["moe_w8"], "W4A8_MXFP": EXPECTED[name]["moe_w4"]
    }
    assert data["warnings"] == [] and data["fallbacks"] == []
    assert len(description) - 5 == sum(data["tensors"].values())  # one entry per tensor, 5 fields
    mtp = MTP_PREFIX.get(name, "(no MTP)")
    for tensor, label in description.items():
        if tensor.startswith(mtp) or ".kv_b_proj." in tensor or ".indexer.wk." in tensor:
            assert label == "FLOAT", tensor
        elif ".experts." in tensor:
            assert label == "W4A8_MXFP", tensor
