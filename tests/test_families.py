"""The real model families at full scale, on header-only sparse copies generated per session.

Each family's copy (tests/fullscale.py) has the published config.json, every tensor's name, dtype
and shape and the shard layout, with data regions left as holes. For each: the generator against the
published totals, inspect, a plan per scheme (what `convert --dry-run` prints), TP deployments and
CLI dry runs, with the decisions checked against what vllm-ascend's loader does for that model_type.
Expected counts are derived from each architecture, not copied from a run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.convert import ConvertOptions, convert
from ascendconv.inspect import inspect_path
from ascendconv.sources import Source
from ascendconv.families import DS_V4_MTP_HEAD_REASON, GLM_MTP_HEAD_REASON
from ascendconv.models import INDEXER_WK_REASON, KV_B_REASON, MTP_REASON, rules_for
from ascendconv.decide import SCHEMES, Deployment, Override
from ascendconv.errors import BadOptionError
from ascendconv.plan import Planner
from ascendconv.verify import VerifyOptions, verify
from conftest import FIXTURES, load_shard, save_shard
from fullscale import FAMILIES, MX_FAMILIES, deepseek_v4, deepseek_v4_flash, write_sparse_checkpoint

# Published totals of each release: tensors, and bytes or GiB rounded to 2 places.
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
    # 43 layers of attention wq_a, wq_b, wkv, wo_a, wo_b and the shared w1 / w3 / w2, the indexer's
    # wq_b on the 21 ratio-4 layers, 43 x 256 routed experts; MTP mtp.0 (5 + 3 + 768 + e_proj, h_proj)
    "deepseek-v4-flash-base": dict(float=5 + 3 + 256 * 3 + 2, moe_w8=43 * 8 + 21, moe_w4=43 * 256 * 3),
}

MTP_PREFIX = {
    "deepseek-v3": "model.layers.61.", "deepseek-v3.2-exp": "model.layers.61.", "qwen3-next-80b-a3b": "mtp.",
    "qwen3.8-27b": "mtp.", "qwen3.6-35b-a3b": "mtp.", "qwen3.5-397b-a17b": "mtp.", "glm-5.1": "model.layers.78.",
    "deepseek-v4-flash-base": "mtp.",
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
    "deepseek-v4-flash-base": (43, 44, 256, 44, ["mtp"], 21),
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


@pytest.mark.parametrize("name", list(FAMILIES))
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


@pytest.mark.parametrize("name", list(FAMILIES))
def test_plan_per_scheme_matches_what_vllm_ascend_loads(planner, name):
    expected = EXPECTED[name]
    plans = {scheme: planner(name).plan(scheme) for scheme in SCHEMES}
    quantized, w8, w4 = expected["moe_w8"] + expected["moe_w4"], expected["moe_w8"], expected["moe_w4"]

    def counts(**written):
        return {"FLOAT": expected["float"], "W8A8_MXFP8": 0, "W4A16_MXFP4": 0, "W4A8_MXFP": 0, "W4A4_MXFP4": 0, **written}

    assert plans["w8a8-mxfp8"].type_counts() == counts(W8A8_MXFP8=quantized)
    assert plans["w4a8-mxfp"].type_counts() == counts(W4A8_MXFP=quantized)
    assert plans["w4a8-mxfp-moe"].type_counts() == counts(W8A8_MXFP8=w8, W4A8_MXFP=w4)
    assert plans["w4a16-mxfp4-moe"].type_counts() == counts(W8A8_MXFP8=w8, W4A16_MXFP4=w4)
    assert plans["w4a4-mxfp4"].type_counts() == counts(W4A4_MXFP4=quantized)
    assert plans["w4a4-mxfp4-moe"].type_counts() == counts(W8A8_MXFP8=w8, W4A4_MXFP4=w4)
    # W4A16 experts are W4A8 experts byte for byte: the same package size
    assert plans["w4a16-mxfp4-moe"].bytes_out == plans["w4a8-mxfp-moe"].bytes_out
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


@pytest.mark.parametrize("name, tp", [("qwen3-30b-a3b", 8), ("qwen3-235b-a22b", 16), ("minimax-m2", 16)])
def test_w4a16_experts_take_k_per_rank_of_96_which_w4a4_does_not(planner, name, tp):
    """K/T = 96: a multiple of 32 (W4A16_MXFP4's unpaired expert scales), not of 64 (W4A4_MXFP4's
    paired ones, and W8A8_MXFP8's): W4A16 keeps the experts, W4A4 writes them FLOAT."""
    experts = EXPECTED[name]["moe_w4"]
    w4a16 = planner(name, Deployment(tp=tp)).plan("w4a16-mxfp4-moe")
    assert w4a16.type_counts()["W4A16_MXFP4"] == experts and w4a16.fallbacks == []
    w4a4 = planner(name, Deployment(tp=tp)).plan("w4a4-mxfp4-moe")
    assert w4a4.type_counts()["FLOAT"] == experts and len(w4a4.fallbacks) == experts


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
        "FLOAT": EXPECTED[name]["float"], "W8A8_MXFP8": EXPECTED[name]["moe_w8"], "W4A16_MXFP4": 0,
        "W4A8_MXFP": EXPECTED[name]["moe_w4"], "W4A4_MXFP4": 0,
    }
    assert data["warnings"] == [] and data["fallbacks"] == []
    assert len(description) - 5 == sum(data["tensors"].values())  # one entry per tensor, 5 fields
    mtp = MTP_PREFIX.get(name, "(no MTP)")
    for tensor, label in description.items():
        if tensor.startswith(mtp) or ".kv_b_proj." in tensor or ".indexer.wk." in tensor:
            assert label == "FLOAT", tensor
        elif ".experts." in tensor:
            assert label == "W4A8_MXFP", tensor


# --- the 2026 families --------------------------------------------------------------------------------

NEW_2026 = ["qwen3.8-27b", "qwen3.6-35b-a3b", "qwen3.5-397b-a17b", "glm-5.1", "minimax-m3"]
# The packed groups vllm-ascend fuses for each (fused name -> members), in our words: a description
# must give every member of one of them the same type.
LOOKUP_GROUPS = {
    "qwen3.8-27b": {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj"),
                    "in_proj_qkvz": ("in_proj_qkv", "in_proj_z"), "in_proj_ba": ("in_proj_b", "in_proj_a")},
    "glm-5.1": {"gate_up_proj": ("gate_proj", "up_proj"), "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa")},
    "minimax-m3": {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj"),
                   "indexer_proj": ("index_q_proj", "index_k_proj")},
}  # fmt: skip
LOOKUP_GROUPS["qwen3.6-35b-a3b"] = LOOKUP_GROUPS["qwen3.5-397b-a17b"] = LOOKUP_GROUPS["qwen3.8-27b"]
VISION = {"qwen3.8-27b": "model.visual.", "qwen3.6-35b-a3b": "model.visual.", "qwen3.5-397b-a17b": "model.visual.",
          "minimax-m3": "vision_tower."}  # fmt: skip
GLM_HEAD = "model.layers.78.shared_head.head.weight"


def lookup_problems(description: dict, groups: dict) -> list[str]:
    """vllm-ascend's lookup replayed over a description: a fused module takes its type from its
    members, which must all be described and agree; a MoE layer's experts share one type."""
    problems = []
    members_of = {m: (fused, members) for fused, members in groups.items() for m in members}
    seen = set()
    for name in description:
        if not name.endswith(".weight"):
            continue
        base, _, last = name[: -len(".weight")].rpartition(".")
        if last in members_of and (base, members_of[last][0]) not in seen:
            fused, members = members_of[last]
            seen.add((base, fused))
            labels = {description.get(f"{base}.{m}.weight") for m in members}
            if len(labels) != 1 or None in labels:
                problems.append(f"{base}.{fused}: {sorted(map(str, labels))}")
    experts: dict[str, set] = {}
    for name, label in description.items():
        if ".experts." in name and name.endswith(".weight"):
            experts.setdefault(name.partition(".experts.")[0], set()).add(label)
    problems += [f"{layer}.experts: {sorted(labels)}" for layer, labels in experts.items() if len(labels) > 1]
    return problems


@pytest.mark.parametrize("name", NEW_2026)
def test_every_scheme_and_deployment_plans_a_package_the_lookup_accepts(planner, name):
    """Every scheme at --tp 1/4/8/16, with and without --ep: known rules (no generic warning), MTP and
    vision FLOAT, each packed group of one type in the description, and fallbacks only where K/T
    leaves no type (then the warning says what --tp costs and that --ep keeps the experts)."""
    mtp, vision = MTP_PREFIX.get(name, "(no MTP)"), VISION.get(name, "(no vision)")
    for tp in (1, 4, 8, 16):
        for ep in (False, True):
            for scheme in SCHEMES:
                plan = planner(name, Deployment(tp=tp, ep=ep)).plan(scheme)
                by_group: dict[str, set] = {}
                for decision in plan.decisions.values():
                    by_group.setdefault(decision.group, set()).add(decision.written)
                assert all(len(types) == 1 for types in by_group.values()), (tp, ep, scheme)
                if scheme == "w4a8-mxfp-moe" and tp in (1, 16):  # the lookup replayed over the whole description
                    description = plan.description()
                    assert lookup_problems(description, LOOKUP_GROUPS[name]) == [], (tp, ep, scheme)
                    assert {label for t, label in description.items() if t.startswith((mtp, vision))} <= {"FLOAT"}
                assert {t.quant_type for t in plan.tensors if t.name.startswith((mtp, vision))} <= {"FLOAT"}
                routed_fallbacks = [d for d in plan.fallbacks if ".experts." in d.module]
                growth = [w for w in plan.warnings if "--ep" in w]
                assert bool(growth) == bool(routed_fallbacks) and len(plan.warnings) == len(growth) <= 1
                if ep:
                    assert routed_fallbacks == []
                added = {t.name for t in plan.tensors if t.kind == "copy" and t.name != t.source}
                assert added == ({GLM_HEAD} if name == "glm-5.1" else set())


def test_qwen3_6_at_tp_16_says_what_the_package_grows_and_that_ep_keeps_the_experts(planner):
    plan = planner("qwen3.6-35b-a3b", Deployment(tp=16)).plan("w4a8-mxfp-moe")
    # 30,720 expert linears of 512 x 2048: BF16 2 x 1,048,576 B instead of W4A8's 524,288 + 32,768 B each
    extra = 30_720 * (2 * 512 * 2048 - (512 * 1024 + 512 * 64))
    assert plan.bytes_out - extra == planner("qwen3.6-35b-a3b", Deployment(tp=16, ep=True)).plan("w4a8-mxfp-moe").bytes_out
    assert plan.warnings == [
        "--tp 16 splits the routed experts' K below what W4A8_MXFP accepts: 30720 expert linears in 40 MoE layers "
        f"are written FLOAT, and the package grows by {extra / 1e9:.1f} GB ({(plan.bytes_out - extra) / 1e9:.1f} GB -> "
        f"{plan.bytes_out / 1e9:.1f} GB, {plan.bytes_out / (plan.bytes_out - extra):.2f}x); with --ep vLLM places "
        "experts whole and they stay W4A8_MXFP"
    ]
    assert int(plan.bytes_out / 1e9) == 70  # from a 37.5 GB source: the figure


@pytest.mark.parametrize(
    "name, override, partner",
    [
        ("qwen3.8-27b", "*.layers.0.linear_attn.in_proj_z=FLOAT", "model.language_model.layers.0.linear_attn.in_proj_qkv"),
        ("qwen3.8-27b", "*.layers.3.self_attn.k_proj=FLOAT", "model.language_model.layers.3.self_attn.v_proj"),
        ("minimax-m3", "*.layers.5.self_attn.index_k_proj=FLOAT", "language_model.model.layers.5.self_attn.index_q_proj"),
        ("glm-5.1", "*.layers.9.self_attn.q_a_proj=FLOAT", "model.layers.9.self_attn.kv_a_proj_with_mqa"),
    ],
)
def test_packed_groups_hold_under_an_override_of_one_member(planner, name, override, partner):
    plan = planner(name).plan("w8a8-mxfp8", overrides=[Override.parse(override)])
    decision = plan.decisions[partner]
    assert (decision.requested, decision.written) == ("W8A8_MXFP8", "FLOAT")
    assert decision.reason.startswith("packed with ") and decision.reason.endswith(f"requested as FLOAT (--override {override})")
    assert lookup_problems(plan.description(), LOOKUP_GROUPS[name]) == []


def test_glm_5_plan_adds_the_mtp_head_as_a_float_copy_of_lm_head(planner, family_root):
    plan = planner("glm-5.1").plan("w4a8-mxfp-moe")
    head = {t.name: t for t in plan.tensors}[GLM_HEAD]
    assert (head.source, head.kind, head.dtype, head.shape, head.quant_type) == ("lm_head.weight", "copy", "BF16", (154880, 6144), "FLOAT")
    assert plan.description()[GLM_HEAD] == "FLOAT"
    assert plan.to_dict()["added_tensors"] == {GLM_HEAD: {"source": "lm_head.weight", "reason": GLM_MTP_HEAD_REASON}}
    assert plan.warnings == []
    # --no-mtp-heads: not added, and the plan says the drafter will not load
    off = planner("glm-5.1", Deployment(mtp_heads=False)).plan("w4a8-mxfp-moe")
    assert GLM_HEAD not in off.description() and off.bytes_out == plan.bytes_out - 154880 * 6144 * 2
    assert len(off.warnings) == 1 and off.warnings[0].startswith(f"{GLM_HEAD} is not in the source and --no-mtp-heads")
    # inspect of the source says it for every scheme
    report = inspect_path(family_root("glm-5.1"))
    for estimate in report.schemes.values():
        assert f"adds {GLM_HEAD}, a FLOAT copy of lm_head.weight: {GLM_MTP_HEAD_REASON}" in estimate.runtime


@pytest.mark.parametrize("name", NEW_2026)
def test_dry_run_json_of_the_2026_families(family_root, planner, name):
    """The CLI's dry run: the rules of the family, no warning, and the description the planner makes
    (what convert would write), with the MTP head added for GLM-5 and said in `added_tensors`."""
    result = CliRunner().invoke(
        app, ["convert", str(family_root(name)), "unused-out", "--scheme", "w4a8-mxfp-moe", "--dry-run", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["model_type"] in {"qwen3_5", "qwen3_5_moe", "glm_moe_dsa", "minimax_m3_vl"}
    assert data["warnings"] == [] and data["fallbacks"] == [] and data["mtp_heads"] is True
    assert {t: n for t, n in data["modules"].items() if n} == {
        t: n for t, n in (("FLOAT", EXPECTED[name]["float"]), ("W8A8_MXFP8", EXPECTED[name]["moe_w8"]),
                          ("W4A8_MXFP", EXPECTED[name]["moe_w4"])) if n
    }
    assert data["description"] == planner(name).plan("w4a8-mxfp-moe").description()
    assert data["added_tensors"] == ({GLM_HEAD: {"source": "lm_head.weight", "reason": GLM_MTP_HEAD_REASON}}
                                     if name == "glm-5.1" else {})


def test_deepseek_v4_flash_matches_its_published_bytes_and_mtp_count():
    """V4-Flash shares the Base's layout with MXFP4 experts: its published exact size checks the
    layout the Base copy is built from."""
    flash = deepseek_v4_flash()
    assert (len(flash.tensors), flash.tensor_bytes) == (69_187, 159_609_485_896)
    assert sum(1 for t in flash.tensors if t[0].startswith("mtp.0.")) == 1_575
    assert "mtp.0.head.weight" not in {t[0] for t in flash.tensors}


def test_qwen3_6_counts_match_the_published_breakdown():
    names = [t[0] for t in FAMILIES["qwen3.6-35b-a3b"]().tensors]
    assert sum(1 for n in names if n.startswith("mtp.")) == 1_560
    assert sum(1 for n in names if n.startswith("model.visual.")) == 333
    body = [n for n in names if not n.startswith("mtp.")]
    assert sum(1 for n in body if ".experts." in n and n.endswith(".weight")) == 30_720
    assert sum(1 for n in body if ".experts." not in n and n.endswith(".weight_scale_inv")) == 250


def test_deepseek_v4_rules_on_the_native_names():
    """The DeepSeek-V4 entry on the names of its header-only copy (the reader of that layout is
    another module): experts, shared experts, packed w1/w3, tp roles, MTP, indexers, the head."""
    family = deepseek_v4()
    names = {t[0] for t in family.tensors}
    rules = rules_for(family.config)
    assert rules.family.label == "DeepSeek-V4" and rules.warning is None
    expert = rules.routed_expert("layers.7.ffn.experts.255.w2")
    assert (expert["layer"], expert["expert"], rules.expert_role(expert["proj"])) == ("layers.7.ffn", "255", "down_proj")
    assert rules.shared_expert_layer("layers.7.ffn.shared_experts.w1") == "layers.7.ffn"
    assert rules.packed_group("layers.7.ffn.shared_experts.w3") == "layers.7.ffn.shared_experts.gate_up_proj"
    assert rules.packed_group("layers.7.ffn.experts.3.w1") == "layers.7.ffn.experts"
    roles = {m: rules.tp_role(m) for m in ("layers.7.attn.wo_b", "layers.7.attn.wo_a", "layers.7.attn.wq_b",
                                            "layers.7.attn.indexer.wq_b", "layers.7.attn.wq_a", "layers.7.ffn.experts.3.w2",
                                            "mtp.0.e_proj", "head")}  # fmt: skip
    assert roles == {"layers.7.attn.wo_b": "row", "layers.7.attn.wo_a": "column", "layers.7.attn.wq_b": "column",
                     "layers.7.attn.indexer.wq_b": "replicated", "layers.7.attn.wq_a": "replicated",
                     "layers.7.ffn.experts.3.w2": "row", "mtp.0.e_proj": "replicated", "head": None}  # fmt: skip
    assert rules.default_float("mtp.0.ffn.experts.3.w1") == MTP_REASON and rules.default_float("layers.7.attn.wq_b") is None
    assert rules.mtp_label("mtp.0.e_proj.weight") == "mtp"
    assert len({rules.indexer_of(n) for n in names} - {None}) == 21  # the ratio-4 layers
    # the drafter's head: added from head.weight, only where the source lacks it
    assert [(a.name, a.source) for a in rules.mtp_heads(names)] == [("mtp.0.head.weight", "head.weight")]
    assert rules.mtp_heads(names | {"mtp.0.head.weight"}) == []


def test_mtp_heads_need_the_mtp_layer_and_the_source_tensor():
    glm = rules_for(FAMILIES["glm-5.1"]().config)
    assert [a.name for a in glm.mtp_heads({"lm_head.weight", "model.layers.78.enorm.weight"})] == [GLM_HEAD]
    assert glm.mtp_heads({"lm_head.weight", "model.layers.77.enorm.weight"}) == []  # no MTP layer in the source
    assert glm.mtp_heads({"model.layers.78.enorm.weight"}) == []  # nothing to copy
    assert rules_for({"model_type": "deepseek_v32", "num_hidden_layers": 61, "num_nextn_predict_layers": 1}).mtp_heads(
        {"lm_head.weight", "model.layers.61.enorm.weight"}
    ) == []  # V3.2 ships its head: the rule is GLM's


def _as_glm5(fixture_copy) -> Path:
    """The small DeepSeek-V3 fixture as a GLM-5 checkpoint: its second layer is the MTP layer (it has
    no shared_head.head, as the GLM-5 releases)."""
    root = fixture_copy("deepseek-v3-fp8")
    config = json.loads((root / "config.json").read_text())
    config.update(model_type="glm_moe_dsa", num_hidden_layers=1, num_nextn_predict_layers=1)
    (root / "config.json").write_text(json.dumps(config))
    return root


def test_a_glm5_package_carries_the_drafter_head_and_verify_accepts_it(fixture_copy, tmp_path):
    src = _as_glm5(fixture_copy)
    out = tmp_path / "pkg"
    result = convert(src, out, ConvertOptions(scheme="w4a8-mxfp-moe"))
    head = "model.layers.1.shared_head.head.weight"
    assert result.plan.warnings == []
    description = json.loads((out / "quant_model_description.json").read_text())
    assert description[head] == "FLOAT" and description["lm_head.weight"] == "FLOAT"
    package = {}
    for shard in sorted(out.glob("quant_model_weights*.safetensors")):
        package.update(load_shard(shard))
    source = {}
    for shard in sorted(src.glob("*.safetensors")):
        source.update(load_shard(shard))
    assert package[head] == source["lm_head.weight"]  # dtype, shape and bytes
    provenance = json.loads((out / "ascendconv_provenance.json").read_text())
    assert provenance["added_tensors"] == {head: {"source": "lm_head.weight", "reason": GLM_MTP_HEAD_REASON}}
    report = verify(out, VerifyOptions(source=src))
    assert report.ok, [c for c in report.checks if not c.ok]
    # --no-mtp-heads: no copy, a warning, and a package verify still accepts
    off = tmp_path / "off"
    result = convert(src, off, ConvertOptions(scheme="w4a8-mxfp-moe", deployment=Deployment(mtp_heads=False)))
    assert head not in json.loads((off / "quant_model_description.json").read_text())
    assert len(result.plan.warnings) == 1 and "--no-mtp-heads" in result.plan.warnings[0]
    assert verify(off, VerifyOptions(source=src)).ok


def test_the_provenance_records_no_mtp_heads_and_inspect_and_verify_say_it(fixture_copy, tmp_path):
    """The switch was only in the recorded command: inspect OUT showed 'planned for --tp 1' for a
    package without the drafter's head."""
    src = _as_glm5(fixture_copy)
    out = tmp_path / "off"
    runner = CliRunner()
    result = runner.invoke(app, ["convert", str(src), str(out), "--no-mtp-heads", "--quiet"])
    assert result.exit_code == 0, result.output
    provenance = json.loads((out / "ascendconv_provenance.json").read_text())
    assert provenance["deployment"] == {"tp": 1, "ep": False, "shared_experts_as_routed": False, "mtp_heads": False}
    shown = runner.invoke(app, ["inspect", str(out)])
    assert shown.exit_code == 0 and any(
        line.split() == ["planned", "for", "--tp", "1", "--no-mtp-heads"] for line in shown.stdout.splitlines()
    ), shown.stdout
    checked = runner.invoke(app, ["verify", str(out), "--tp", "2", "--json"])
    assert json.loads(checked.stdout)["deployment"]["recorded"] == provenance["deployment"]


def test_a_drafter_head_copied_from_an_fp8_lm_head_is_its_bf16_values(fixture_copy, tmp_path):
    """A release whose lm_head is FP8 (E4M3 codes and tile scales): the drafter's head is written as
    that weight resolved to BF16, as any FLOAT linear is (FP8 bytes under a FLOAT label would not
    load), and verify compares it with the resolved source; a damaged copy is named."""
    import numpy as np

    from ascendconv.formats import requantize

    src = _as_glm5(fixture_copy)
    shard = src / "model-00002-of-00002.safetensors"
    tensors = load_shard(shard)
    codes = np.random.default_rng(5).integers(0, 0x7F, (64, 128), dtype=np.uint8)  # no NaN code (0x7F, 0xFF)
    codes[::3] |= 0x80  # negative values too
    scale = np.array([[0.0125]], np.float32)
    tensors["lm_head.weight"] = ("F8_E4M3", (64, 128), codes.tobytes())
    tensors["lm_head.weight_scale_inv"] = ("F32", (1, 1), scale.tobytes())
    save_shard(shard, tensors)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight_scale_inv"] = shard.name
    (src / "model.safetensors.index.json").write_text(json.dumps(index))

    out = tmp_path / "pkg"
    result = convert(src, out, ConvertOptions(scheme="w8a8-mxfp8"))
    head = "model.layers.1.shared_head.head.weight"
    description = json.loads((out / "quant_model_description.json").read_text())
    assert description[head] == "FLOAT" and description["lm_head.weight"] == "W8A8_MXFP8"
    package = {}
    for path in sorted(out.glob("quant_model_weights*.safetensors")):
        package.update(load_shard(path))
    want = requantize.resolve_rows_bf16(codes, scale, (128, 128), 0).view(np.uint16).tobytes()
    assert package[head] == ("BF16", (64, 128), want)
    assert sum(t.nbytes for t in result.plan.tensors) == result.plan.bytes_out  # counted as placed
    report = verify(out, VerifyOptions(source=src))
    assert report.ok, [c for c in report.checks if not c.ok]

    path = next(p for p in sorted(out.glob("quant_model_weights*.safetensors")) if head in load_shard(p))
    damaged = load_shard(path)
    dtype, shape, data = damaged[head]
    damaged[head] = (dtype, shape, data[: 2 * 128 * 7] + bytes([data[2 * 128 * 7] ^ 0x40]) + data[2 * 128 * 7 + 1 :])
    save_shard(path, damaged)
    source_check = next(c for c in verify(out, VerifyOptions(source=src, checksums=False)).checks if c.name == "source")
    assert not source_check.ok
    assert any(f"{head!r}" in p and "is not the BF16 values of 'lm_head.weight': row 7 differs" in p for p in source_check.problems)


def test_verify_source_finds_a_damaged_head_copy(fixture_copy, tmp_path):
    src = _as_glm5(fixture_copy)
    out = tmp_path / "pkg"
    convert(src, out, ConvertOptions(scheme="w8a8-mxfp8"))
    head = "model.layers.1.shared_head.head.weight"
    shard = next(s for s in sorted(out.glob("quant_model_weights*.safetensors")) if head in load_shard(s))
    tensors = load_shard(shard)
    dtype, shape, data = tensors[head]
    tensors[head] = (dtype, shape, bytes([data[0] ^ 0x40]) + data[1:])
    save_shard(shard, tensors)
    report = verify(out, VerifyOptions(source=src, checksums=False))
    source_check = next(c for c in report.checks if c.name == "source")
    assert not source_check.ok and any(f"{head!r}" in p and "differs from the source copy at byte 0" in p for p in source_check.problems)



def test_verify_source_holds_the_drafter_head_to_the_source_not_to_the_provenance(fixture_copy, tmp_path):
    """A resealed package whose drafter head holds the embedding of this untied model, its provenance
    saying so, passed verify --source: the head was compared with the tensor the provenance named.
    One whose head was removed everywhere, the provenance's record of it too, passed as well."""
    from test_verify import DESCRIPTION, PROVENANCE, SHARD, drop_everywhere, read_json, reseal, write_json

    src = _as_glm5(fixture_copy)
    head = "model.layers.1.shared_head.head.weight"
    swapped, dropped = tmp_path / "swapped", tmp_path / "dropped"
    for out in (swapped, dropped):
        convert(src, out, ConvertOptions(scheme="w8a8-mxfp8"))
    tensors = load_shard(swapped / SHARD)
    tensors[head] = tensors["model.embed_tokens.weight"]
    save_shard(swapped / SHARD, tensors)
    provenance = read_json(swapped / PROVENANCE)
    provenance["added_tensors"][head]["source"] = "model.embed_tokens.weight"
    write_json(swapped / PROVENANCE, provenance)
    reseal(swapped)
    assert verify(swapped).ok
    problems = next(c for c in verify(swapped, VerifyOptions(source=src)).checks if c.name == "source").problems
    assert problems[0] == (f"{PROVENANCE} records {head!r} as a copy of 'model.embed_tokens.weight', but convert "
                           "copies 'lm_head.weight' from this source")
    assert any(p.startswith(f"{head!r} (") and p.endswith("differs from the source copy at byte 0") for p in problems[1:])

    drop_everywhere(dropped, [head])
    provenance = read_json(dropped / PROVENANCE)
    provenance["added_tensors"] = {}
    write_json(dropped / PROVENANCE, provenance)
    reseal(dropped)
    assert head not in read_json(dropped / DESCRIPTION) and verify(dropped).ok
    problems = next(c for c in verify(dropped, VerifyOptions(source=src)).checks if c.name == "source").problems
    assert problems[:2] == [
        f"convert adds {head!r} (a copy of 'lm_head.weight') from this source for the MTP drafter, and {PROVENANCE} "
        "does not record it",
        f"{head!r} comes from the source but is not in the package",
    ]
    # converted with --no-mtp-heads, the same package is what convert writes
    provenance["deployment"]["mtp_heads"] = False
    write_json(dropped / PROVENANCE, provenance)
    reseal(dropped)
    assert verify(dropped, VerifyOptions(source=src)).ok

# --- DeepSeek-V4-Flash-Base, read by the DeepSeek-V4 source format ------------------------------------

V4 = "deepseek-v4-flash-base"
V4_HEAD = "mtp.0.head.weight"
V4_EXPECTED = EXPECTED[V4]


def v4_lookup_keys(description: dict) -> dict:
    """vllm-ascend's description aliases for deepseek_v4, in our words: only when the description
    holds hc_head_fn, every key also answers with a `model.` prefix, then `.attn.` as `.self_attn.`,
    `ffn` as `mlp`, `.w1.` / `.w2.` / `.w3.` as gate / down / up_proj, `head` as `lm_head` and `embed`
    as `embed_tokens`, each step over the keys the steps before made."""
    keys = dict(description)
    if "hc_head_fn" not in keys:
        return keys
    steps = [
        lambda k: k if k.startswith("model") else f"model.{k}",
        lambda k: k.replace(".attn.", ".self_attn.") if "attn" in k and "self_attn" not in k else k,
        lambda k: k.replace("ffn", "mlp"),
    ]
    for step in steps:
        keys.update({step(k): v for k, v in list(keys.items())})

    def names(k: str) -> str:
        k = k.replace(".w1.", ".gate_proj.").replace(".w2.", ".down_proj.").replace(".w3.", ".up_proj.")
        k = k.replace("head", "lm_head") if "head" in k and "lm_head" not in k else k
        return k.replace("embed", "embed_tokens") if "embed" in k and "embed_tokens" not in k else k

    keys.update({names(k): v for k, v in list(keys.items())})
    return keys


def v4_lookup_problems(description: dict, config: dict) -> list[str]:
    """The modules vllm-ascend's DeepSeek-V4 model and MTP drafter build, looked up as its loader does:
    a fused module through its members (one type), a MoE layer through expert 0."""
    keys = v4_lookup_keys(description)
    packed = {"gate_up_proj": ("gate_proj", "up_proj"), "experts": ("experts.0.gate_proj", "experts.0.up_proj", "experts.0.down_proj")}
    problems = []

    def lookup(prefix: str) -> None:
        last = prefix.rpartition(".")[2]
        members = [prefix.replace(last, m) for m in packed.get(last, (last,))]
        labels = [keys.get(f"{m}.weight") for m in members]
        if None in labels or len(set(labels)) != 1:
            problems.append(f"{prefix}: {labels}")

    ratios = config["compress_ratios"]
    for i in range(config["num_hidden_layers"]):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        for name in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b"):
            lookup(f"{a}.{name}")
        if ratios[i] == 4:
            lookup(f"{a}.indexer.wq_b")
        lookup(f"{m}.shared_experts.gate_up_proj")
        lookup(f"{m}.shared_experts.down_proj")
        lookup(f"{m}.experts")
    lookup("lm_head")
    lookup("mtp.0.head")  # the drafter's head, built before the target's is shared with it
    for name in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b"):
        lookup(f"mtp.0.self_attn.{name}")
    lookup("mtp.0.mlp.experts")
    lookup("mtp.0.mlp.shared_experts.gate_up_proj")
    return problems


@pytest.fixture(scope="module")
def v4_planner(family_root):
    """Planners over the DeepSeek-V4-Flash-Base copy, one source opened for the module."""
    source = Source.open(family_root(V4))
    planners: dict = {}

    def make(deployment: Deployment = Deployment()):
        if deployment not in planners:
            planners[deployment] = Planner.for_source(source, deployment)
        return planners[deployment]

    yield make
    source.close()


def test_deepseek_v4_inspect_says_what_the_package_adds(family_root):
    report = inspect_path(family_root(V4))  # its structure: test_inspect_names_the_structure
    assert report.family == "DeepSeek-V4" and report.quantization["scale_dtypes"] == {"F32": 33_024 + 768, "F8_E8M0": 365 + 10}
    for estimate in report.schemes.values():
        assert f"adds {V4_HEAD}, a FLOAT copy of head.weight: {DS_V4_MTP_HEAD_REASON}" in estimate.runtime


def test_deepseek_v4_every_scheme_and_deployment_plans_what_its_lookup_accepts(v4_planner):
    config = FAMILIES[V4]().config
    for tp in (1, 4, 8, 16):
        for ep in (False, True):
            for scheme in SCHEMES:
                plan = v4_planner(Deployment(tp=tp, ep=ep)).plan(scheme)
                assert plan.fallbacks == [] and plan.warnings == []  # wo_b K/T = 8192/16, w2 2048/16 = 128
                quantized = V4_EXPECTED["moe_w8"] + V4_EXPECTED["moe_w4"]
                assert plan.type_counts()["FLOAT"] == V4_EXPECTED["float"] and sum(plan.type_counts().values()) == (
                    V4_EXPECTED["float"] + quantized
                )
                if scheme == "w4a8-mxfp-moe" and tp in (1, 16):
                    description = plan.description()
                    assert v4_lookup_problems(description, config) == [], (tp, ep)
                    assert {label for t, label in description.items() if t.startswith("mtp.")} == {"FLOAT"}


def test_deepseek_v4_package_keeps_native_names_and_adds_the_drafter_head(v4_planner):
    plan = v4_planner().plan("w4a8-mxfp-moe")
    description = plan.description()
    assert {t: n for t, n in plan.type_counts().items() if n} == {
        "FLOAT": V4_EXPECTED["float"], "W8A8_MXFP8": V4_EXPECTED["moe_w8"], "W4A8_MXFP": V4_EXPECTED["moe_w4"]
    }
    # native names in weights and description: hc_head_fn switches vllm-ascend's aliases on
    assert description["hc_head_fn"] == "FLOAT" and description["head.weight"] == "FLOAT"
    assert description["layers.7.attn.wq_a.weight"] == "W8A8_MXFP8"
    assert description["layers.7.ffn.experts.3.w2.weight"] == "W4A8_MXFP"
    assert not any(name.startswith("model.") for name in description)
    head = {t.name: t for t in plan.tensors}[V4_HEAD]
    assert (head.source, head.kind, head.dtype, head.shape) == ("head.weight", "copy", "BF16", (129280, 4096))
    assert description[V4_HEAD] == "FLOAT"
    # the shared expert's w1 / w3 are one module for vllm-ascend: an override of one moves both
    moved = v4_planner().plan("w8a8-mxfp8", overrides=[Override.parse("layers.5.ffn.shared_experts.w1=FLOAT")])
    assert moved.decisions["layers.5.ffn.shared_experts.w3"].written == "FLOAT"
    assert v4_lookup_problems(moved.description(), FAMILIES[V4]().config) == []
    # --no-mtp-heads: no head, and the drafter's lookup fails, as the plan warns
    off = v4_planner(Deployment(mtp_heads=False)).plan("w4a8-mxfp-moe")
    assert V4_HEAD not in off.description() and len(off.warnings) == 1
    assert v4_lookup_problems(off.description(), FAMILIES[V4]().config) == ["mtp.0.head: [None]"]


def test_deepseek_v4_dry_run_json(family_root, v4_planner):
    result = CliRunner().invoke(
        app, ["convert", str(family_root(V4)), "unused-out", "--scheme", "w4a8-mxfp-moe", "--dry-run", "--json", "--tp", "16"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["model_type"], data["warnings"], data["fallbacks"]) == ("deepseek_v4", [], [])
    assert data["added_tensors"] == {V4_HEAD: {"source": "head.weight", "reason": DS_V4_MTP_HEAD_REASON}}
    assert data["description"] == v4_planner(Deployment(tp=16)).plan("w4a8-mxfp-moe").description()


def test_a_deepseek_v4_package_carries_mtp_0_head_and_verify_accepts_it(tmp_path):
    """The small DeepSeek-V3 fixture in DeepSeek-V4 spelling (native `.scale`, `head.weight`, its
    second layer as the MTP layer `mtp.0.`): the package copies head.weight to mtp.0.head.weight."""
    from test_source_formats import DEEPSEEK, as_ds_v4, respell

    native = as_ds_v4(FIXTURES / DEEPSEEK, tmp_path / "native", "F8_E8M0")

    def rename(name, entry):
        name = name.replace("model.layers.1.", "mtp.0.")
        return {"head.weight" if name == "lm_head.weight" else name: entry}

    src = respell(native, tmp_path / "v4", rename, lambda c: {**c, "num_hidden_layers": 1})
    out = tmp_path / "pkg"
    result = convert(src, out, ConvertOptions(scheme="w4a8-mxfp-moe"))
    assert [(a.name, a.source) for a in result.plan.added] == [(V4_HEAD, "head.weight")]
    description = json.loads((out / "quant_model_description.json").read_text())
    assert description[V4_HEAD] == "FLOAT" and {v for k, v in description.items() if k.startswith("mtp.0.")} == {"FLOAT"}
    package = {}
    for shard in sorted(out.glob("quant_model_weights*.safetensors")):
        package.update(load_shard(shard))
    assert package[V4_HEAD] == package["head.weight"]
    assert verify(out, VerifyOptions(source=src)).ok


# --- MX-native families ------------------------------------------------------------------------------
# Kimi-K3's release is compressed-tensors MXFP4 (its routed experts; everything else BF16). The
# generator's full copy (497,052 tensors) is checked against the published figures; inspect and the
# plans run on the first 4 layers of the same checkpoint (layer 0 dense, layers 1-3 MoE with all 896
# full-size experts, layer 3 gated MLA, 96 shards), since the full copy takes minutes to plan twelve
# ways on a shared machine and every layer of it is planned alike.
K3_CUT = 4
K3_MOE_LAYERS, K3_EXPERTS = K3_CUT - 1, 896
K3_EXPERT_LINEARS = K3_MOE_LAYERS * K3_EXPERTS * 3  # w1, w3, w2 of each routed expert


def test_kimi_k3_generator_matches_the_published_figures():
    """1.56 TB in 96 shards (the release as downloaded), 93% of it routed experts; 92 MoE layers of
    896 experts, each w1 / w3 [3072, 3584] and w2 [3584, 3072] as packed E2M1 plus E8M0 bytes."""
    family = MX_FAMILIES["kimi-k3"]()
    experts = [t for t in family.tensors if ".experts." in t[0]]
    assert len(experts) == 92 * 896 * 3 * 2 and len({t[0] for t in family.tensors}) == len(family.tensors)
    expert_bytes = 92 * 896 * 3 * (3072 * 3584 // 2 + 3072 * 3584 // 32)
    assert sum(math.prod(shape) for _, _, shape in experts) == expert_bytes  # U8: a byte each
    assert round(family.tensor_bytes / 1e12, 2) == 1.56 and family.shards == 96
    assert round(expert_bytes / family.tensor_bytes, 2) == 0.93


@pytest.fixture(scope="module")
def kimi_k3_cut(tmp_path_factory):
    root = write_sparse_checkpoint(MX_FAMILIES["kimi-k3"](K3_CUT), tmp_path_factory.mktemp("families") / "kimi-k3")
    return root, Source.open(root)


def test_kimi_k3_inspect_names_its_mx_experts(kimi_k3_cut):
    root, _ = kimi_k3_cut
    report = inspect_path(root)
    assert report.family == "Kimi-K3" and report.warnings == [] and report.kind == "source"
    assert report.quantization["format"] == "ct-mx" and report.quantization["encodings"] == ["mx_e2m1"]
    assert (report.layers, report.moe_layers, report.routed_experts, report.shared_expert_layers) == (K3_CUT, K3_MOE_LAYERS, 896, 3)
    assert report.fp8_linears == K3_EXPERT_LINEARS  # only the routed experts are quantized in the release
    for scheme in ("native", "w4a8-mxfp-moe", "w4a8-mxfp"):
        assert report.schemes[scheme].modules["W4A8_MXFP"] == K3_EXPERT_LINEARS, scheme


@pytest.mark.parametrize("tp", [1, 8, 16])
@pytest.mark.parametrize("ep", [False, True])
def test_kimi_k3_every_expert_is_relaid_at_every_deployment(kimi_k3_cut, tp, ep):
    """native and w4a8-mxfp-moe write each routed expert W4A8_MXFP, its bytes the source's: w2's K of
    3072 splits to 384 (--tp 8) and 192 (--tp 16) per rank, multiples of 64, so nothing falls back."""
    _, source = kimi_k3_cut
    planner = Planner.for_source(source, Deployment(tp=tp, ep=ep))
    for scheme in ("native", "w4a8-mxfp-moe"):
        plan = planner.plan(scheme)
        assert plan.type_counts() == {"FLOAT": 0, "W8A8_MXFP8": 0, "W4A16_MXFP4": 0, "W4A8_MXFP": K3_EXPERT_LINEARS, "W4A4_MXFP4": 0}
        assert plan.conversion_counts() == {"relaid": K3_EXPERT_LINEARS, "requantized": 0}, scheme
        assert plan.fallbacks == [] and plan.warnings == [], scheme
        relaid = [t for t in plan.tensors if t.kind == "mx_relaid"]
        assert len(relaid) == K3_EXPERT_LINEARS and {t.transform for t in relaid} == {"as-stored"}
        assert {t.source for t in relaid} == {f"{p}.weight_packed" for p in source.linears}


@pytest.mark.parametrize("args", [["--scheme", "native", "--tp", "16"], ["--scheme", "w4a8-mxfp-moe", "--tp", "8", "--ep"]])
def test_kimi_k3_dry_run_json(kimi_k3_cut, args):
    root, _ = kimi_k3_cut
    result = CliRunner().invoke(app, ["convert", str(root), "unused-out", *args, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["modules"]["W4A8_MXFP"] == K3_EXPERT_LINEARS and data["fallbacks"] == [] and data["warnings"] == []
    assert data["conversion_counts"] == {"relaid": K3_EXPERT_LINEARS, "requantized": 0}
    experts = {t for t in data["description"] if ".experts." in t and t.endswith(".weight")}
    assert len(experts) == K3_EXPERT_LINEARS and all(data["conversions"][t] == "relaid" for t in experts)
    assert {data["description"][t] for t in experts} == {"W4A8_MXFP"}
    assert {label for t, label in data["description"].items() if ".experts." not in t and t.endswith(".weight")} == {"FLOAT"}


def test_a_tp_that_does_not_divide_the_attention_heads_is_refused_as_vllm_refuses_it(family_root, tmp_path):
    # Qwen3.8-27B: 24 query heads; every linear's N splits over 16 ranks, but vLLM refuses the deployment
    root = family_root("qwen3.8-27b")
    with pytest.raises(BadOptionError) as refused:
        convert(root, tmp_path / "out", ConvertOptions(deployment=Deployment(tp=16)), dry_run=True)
    assert refused.value.message == (
        "--tp 16: config.json: 24 attention heads do not divide over 16 ranks, and vLLM refuses such a deployment"
    )
    assert refused.value.hint == "choose a --tp that divides the number of attention heads"
    assert convert(root, tmp_path / "out", ConvertOptions(deployment=Deployment(tp=8)), dry_run=True).plan.deployment.tp == 8


@pytest.mark.parametrize("heads", [float("nan"), "32", 0, -4, True])
def test_a_head_count_that_is_not_a_count_is_refused_at_a_tp_above_1(fixture_copy, tmp_path, heads):
    root = fixture_copy("qwen3-dense-fp8")
    config = json.loads((root / "config.json").read_text())
    config["num_attention_heads"] = heads
    (root / "config.json").write_text(json.dumps(config))
    with pytest.raises(BadOptionError) as refused:
        convert(root, tmp_path / "out", ConvertOptions(deployment=Deployment(tp=2)), dry_run=True)
    assert "num_attention_heads is" in refused.value.message and "not a count of heads" in refused.value.message
    assert refused.value.hint == "fix num_attention_heads in config.json"
    assert convert(root, tmp_path / "out", ConvertOptions(), dry_run=True).plan.deployment.tp == 1  # no split, nothing to hold


def test_verify_names_a_tp_that_does_not_divide_the_attention_heads(tmp_path):
    out = tmp_path / "dense"
    convert(FIXTURES / "qwen3-dense-fp8", out, ConvertOptions())  # 2 attention heads
    report = verify(out, VerifyOptions(tp=4, checksums=False))
    assert report.check("tp").problems[0] == (
        "config.json: 2 attention heads do not divide over 4 ranks, and vLLM refuses such a deployment"
    )
    assert not any("attention heads" in p for p in verify(out, VerifyOptions(tp=2, checksums=False)).check("tp").problems)


def test_inspect_warns_of_a_tp_that_does_not_divide_the_attention_heads(family_root):
    report = inspect_path(family_root("qwen3.8-27b"), deployment=Deployment(tp=16))
    assert report.warnings == ["config.json: 24 attention heads do not divide over 16 ranks, and vLLM refuses such a deployment"]
    assert inspect_path(family_root("qwen3.8-27b"), deployment=Deployment(tp=8)).warnings == []
