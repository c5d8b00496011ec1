"""Model knowledge (ascendconv/models.py) and the plan decisions it drives, on small synthetic layers."""

import re

import pytest
from hypothesis import given, strategies as st

from ascendconv.errors import BadOptionError, ConfigError
from ascendconv.families import DS_V4_MTP_TIED_HEAD_REASON, GLM_MTP_HEAD_REASON, GLM_MTP_TIED_HEAD_REASON
from ascendconv.models import (
    FAMILIES,
    INDEXER_WK_REASON,
    KV_B_REASON,
    MTP_REASON,
    VISION_REASON,
    expert_count,
    rules_for,
)
from ascendconv.decide import Deployment, Override

from test_plan import entries, fp8, moe_layer, plan_of, written

DEEPSEEK = {"model_type": "deepseek_v3", "num_hidden_layers": 1, "num_nextn_predict_layers": 1, "n_routed_experts": 2}


def test_expert_count_reads_every_family_key_and_text_config():
    assert expert_count({"n_routed_experts": 256}) == 256
    assert expert_count({"num_experts": 128}) == 128
    assert expert_count({"num_local_experts": 256}) == 256
    assert expert_count({"text_config": {"num_experts": 512}}) == 512
    assert expert_count({"num_experts": True}) is None and expert_count({}) is None


_NAME_PARTS = st.sampled_from(["model", "layers", "3", "17", "mlp", "experts", "w2", "down_proj", "gate_proj", "", "x", "٣", "a\nb", "0x"])


@given(st.lists(_NAME_PARTS, min_size=1, max_size=7).map(".".join), st.sampled_from(["mystery", "deepseek_v3", "minimax_m2"]))
def test_routed_expert_names_what_the_pattern_of_its_spelling_matches(prefix, model_type):
    """The string operations of routed_expert agree with the pattern `<layer>.experts.<digits>.<proj>`
    (no newline in the name) on every name made of the parts that matter."""
    rules = rules_for({"model_type": model_type})
    projections = "|".join(sorted({p for names in rules.family.expert_projections for p in names}))
    match = re.fullmatch(rf"(?P<layer>.+)\.experts\.(?P<expert>\d+)\.(?P<proj>{projections})", prefix)
    expected = match.groupdict() if match and "\n" not in prefix else None
    assert rules.routed_expert(prefix) == expected


@given(
    st.lists(st.tuples(st.lists(_NAME_PARTS, min_size=1, max_size=6).map(".".join), st.sampled_from(["w1", "w2", "up_proj", "x"])),
             max_size=12),
    st.sampled_from(["mystery", "deepseek_v3", "minimax_m2"]),
)
def test_routed_experts_of_a_list_is_routed_expert_of_each_name(heads, model_type):
    """The one loop over a list (which reads an expert module once for the projections listed after
    it) gives what routed_expert gives each name alone, remembered or not, heads repeated or not."""
    prefixes = [f"{head}.{proj}" for head, proj in heads] + ([f"{heads[0][0]}.down_proj"] if heads else [])
    rules = rules_for({"model_type": model_type})
    rules._routed_memo.clear()
    cold = rules.routed_experts(prefixes)
    assert rules._routed_memo.keys() == set(prefixes)  # each name read is remembered, at the end
    assert rules.routed_experts(iter(prefixes)) == cold  # remembered; an iterator is read once only
    rules._routed_memo.clear()
    assert cold == [rules.routed_expert(p) for p in prefixes] == rules.routed_experts(prefixes)


def test_routed_experts_remembers_no_more_names_than_the_limit(monkeypatch):
    import ascendconv.models as models

    prefixes = [f"model.layers.{i}.mlp.experts.{e}.{p}" for i in range(2) for e in range(3) for p in ("gate_proj", "up_proj")]
    rules = rules_for({"model_type": "deepseek_v3"})
    rules._routed_memo.clear()
    monkeypatch.setattr(models, "ROUTED_MEMO_LIMIT", 5)
    rules.routed_experts(prefixes[:2])
    found = rules.routed_experts(prefixes)
    assert len(rules._routed_memo) <= 5 and rules._routed_memo.keys() <= set(prefixes)
    assert found == [rules.routed_expert(p) for p in prefixes]
    rules._routed_memo.clear()


def test_known_families_and_the_generic_rule():
    assert rules_for({"model_type": "kimi_k2"}).family.label == "Kimi-K2"
    assert rules_for({"model_type": "minimax_m2"}).known
    generic = rules_for({"model_type": "mystery_moe"})
    assert not generic.known and "mystery_moe" in generic.warning and "generic rules" in generic.warning
    # generic: any experts.N.<proj> is a routed expert, whichever naming
    assert generic.routed_expert("model.layers.1.block_sparse_moe.experts.7.w2")["layer"] == "model.layers.1.block_sparse_moe"
    assert generic.routed_expert("model.layers.1.mlp.experts.7.down_proj")["expert"] == "7"
    assert generic.routed_expert("model.layers.1.mlp.shared_experts.down_proj") is None
    # a family only knows its own naming
    assert rules_for({"model_type": "qwen3_moe"}).routed_expert("model.layers.1.block_sparse_moe.experts.7.w2") is None


def test_mtp_layers_deepseek_by_number_and_qwen3_next_by_prefix():
    deepseek = rules_for({"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_nextn_predict_layers": 1})
    assert deepseek.is_mtp("model.layers.61.mlp.experts.0.gate_proj")
    assert not deepseek.is_mtp("model.layers.60.mlp.experts.0.gate_proj")
    assert deepseek.mtp_label("model.layers.61.eh_proj.weight") == "model.layers.61"
    assert deepseek.default_float("model.layers.61.self_attn.q_a_proj") == MTP_REASON
    kimi = rules_for({"model_type": "kimi_k2", "num_hidden_layers": 61})  # no num_nextn_predict_layers
    assert not kimi.is_mtp("model.layers.61.mlp.gate_proj")
    nxt = rules_for({"model_type": "qwen3_next", "num_hidden_layers": 48})
    assert nxt.is_mtp("mtp.layers.0.mlp.experts.3.up_proj") and nxt.mtp_label("mtp.fc.weight") == "mtp"
    assert not nxt.is_mtp("model.layers.47.mlp.experts.3.up_proj")


def test_float_by_default_reasons():
    v32 = rules_for({"model_type": "deepseek_v32", "num_hidden_layers": 61, "num_nextn_predict_layers": 1})
    assert v32.default_float("model.layers.3.self_attn.indexer.wk") == INDEXER_WK_REASON
    assert v32.default_float("model.layers.3.self_attn.indexer.wq_b") is None
    assert v32.default_float("model.layers.3.self_attn.kv_b_proj") == KV_B_REASON
    assert rules_for({"model_type": "qwen3"}).default_float("model.layers.3.self_attn.kv_b_proj") is None


@pytest.mark.parametrize(
    "prefix,role",
    [("a.o_proj", "row"), ("a.mlp.experts.1.w2", "row"), ("a.linear_attn.out_proj", "row"), ("a.q_b_proj", "column"),
     ("a.mlp.experts.1.w1", "column"), ("a.kv_a_proj_with_mqa", "replicated"), ("a.indexer.wk", "replicated"),
     ("lm_head", None)],
)
def test_tp_roles(prefix, role):
    assert rules_for(None).tp_role(prefix) == role


def minimax_layer() -> dict:
    """moe_layer() under MiniMax-M2's names: block_sparse_moe.experts.N.{w1,w3,w2}."""
    names = {".mlp.": ".block_sparse_moe.", ".gate_proj.": ".w1.", ".up_proj.": ".w3.", ".down_proj.": ".w2."}

    def rename(name: str) -> str:
        for old, new in names.items():
            name = name.replace(old, new)
        return name

    return {rename(name): spec for name, spec in moe_layer().items()}


def test_minimax_experts_are_routed_experts_under_w4a8_mxfp_moe():
    plan = plan_of(minimax_layer(), scheme="w4a8-mxfp-moe", config={"model_type": "minimax_m2"})
    types = written(plan)
    assert {t for m, t in types.items() if ".experts." in m} == {"W4A8_MXFP"}
    assert {t for m, t in types.items() if ".self_attn." in m} == {"W8A8_MXFP8"}
    assert not plan.fallbacks and not plan.warnings


def test_an_override_on_one_expert_moves_the_whole_moe_layer_with_the_reason():
    plan = plan_of(
        minimax_layer(), scheme="w4a8-mxfp-moe", config={"model_type": "minimax_m2"},
        overrides=[Override.parse("*.experts.1.w2=W8A8_MXFP8")],
    )
    types = written(plan)
    assert {t for m, t in types.items() if ".experts." in m} == {"W8A8_MXFP8"}  # one type per MoE layer
    reason = plan.decisions["model.layers.0.block_sparse_moe.experts.0.w1"].reason
    assert reason == (
        "one type per MoE layer; experts.1.w2 was requested as W8A8_MXFP8 (--override *.experts.1.w2=W8A8_MXFP8)"
    )


@pytest.mark.parametrize(
    "config,words",
    [
        ({"model_type": 3}, ["model_type is 3 (int), not a string"]),
        ({"text_config": {"model_type": ["qwen3"]}}, ["model_type is ['qwen3'] (list), not a string"]),
        ({}, ["config.json has no model_type"]),
        ({"model_type": "somebody_moe"}, ["model_type 'somebody_moe' is not one ascendconv knows"]),
    ],
)
def test_the_unknown_model_type_warning_shows_what_config_json_holds(config, words):
    """A model_type that is not a string was shown as `None`, as if config.json had none."""
    warning = rules_for(config).warning
    assert all(w in warning for w in words) and "None" not in warning, warning


def test_unknown_model_type_gets_the_generic_rule_and_a_warning():
    plan = plan_of(minimax_layer(), scheme="w4a8-mxfp-moe", config={"model_type": "somebody_moe"})
    assert {t for m, t in written(plan).items() if ".experts." in m} == {"W4A8_MXFP"}
    assert plan.warnings and "somebody_moe" in plan.warnings[0]
    assert plan.to_dict()["warnings"] == plan.warnings


def deepseek_with_mtp() -> dict:
    spec = {}
    for layer in (0, 1):  # layer 1 is the MTP layer (num_hidden_layers 1)
        p = f"model.layers.{layer}"
        spec.update(fp8(f"{p}.self_attn.q_a_proj", 256, 256))
        spec.update(fp8(f"{p}.self_attn.kv_a_proj_with_mqa", 192, 256))
        spec.update(fp8(f"{p}.self_attn.kv_b_proj", 512, 128))
        spec.update(fp8(f"{p}.self_attn.indexer.wk", 128, 256))
        spec.update(fp8(f"{p}.self_attn.indexer.wq_b", 256, 256))
        for e in range(2):
            spec.update(fp8(f"{p}.mlp.experts.{e}.gate_proj", 128, 256))
            spec.update(fp8(f"{p}.mlp.experts.{e}.up_proj", 128, 256))
            spec.update(fp8(f"{p}.mlp.experts.{e}.down_proj", 256, 128))
    return spec


@pytest.mark.parametrize("scheme", ["w8a8-mxfp8", "w4a8-mxfp", "w4a8-mxfp-moe"])
def test_deepseek_v32_keeps_mtp_indexer_wk_and_kv_b_float_in_every_scheme(scheme):
    plan = plan_of(deepseek_with_mtp(), scheme=scheme, config={**DEEPSEEK, "model_type": "deepseek_v32"})
    types = written(plan)
    assert {t for m, t in types.items() if m.startswith("model.layers.1.")} == {"FLOAT"}
    assert types["model.layers.0.self_attn.indexer.wk"] == "FLOAT"
    assert types["model.layers.0.self_attn.kv_b_proj"] == "FLOAT"
    assert types["model.layers.0.self_attn.indexer.wq_b"] != "FLOAT"
    assert plan.kept_float() == {MTP_REASON: 11, INDEXER_WK_REASON: 1, KV_B_REASON: 1}
    description = plan.description()
    assert description["model.layers.0.self_attn.indexer.wk.weight"] == "FLOAT"
    assert "model.layers.0.self_attn.indexer.wk.weight_scale" not in description
    # an override still wins over the model's default
    plan = plan_of(
        deepseek_with_mtp(), scheme=scheme, config={**DEEPSEEK, "model_type": "deepseek_v32"},
        overrides=[Override.parse("model.layers.1.*=W8A8_MXFP8")],
    )
    assert written(plan)["model.layers.1.mlp.experts.0.down_proj"] == "W8A8_MXFP8"


def test_tp_splits_the_experts_down_proj_unless_experts_are_parallel():
    config = {"model_type": "qwen3_moe"}
    assert not plan_of(moe_layer(down_k=256), scheme="w4a8-mxfp", config=config, deployment=Deployment(tp=4)).fallbacks
    # K/T = 256/8 = 32: neither W4A8 (64) nor an MoE W8A8 expert (64) fits; the whole layer goes FLOAT
    plan = plan_of(moe_layer(down_k=256), scheme="w4a8-mxfp", config=config, deployment=Deployment(tp=8))
    assert {t for m, t in written(plan).items() if ".experts." in m} == {"FLOAT"}
    down = plan.decisions["model.layers.0.mlp.experts.0.down_proj"]
    assert down.reason == "K/T = 256/8 = 32 is not a multiple of 64 (W4A8_MXFP pairs scale groups)"
    assert written(plan)["model.layers.0.self_attn.o_proj"] == "W8A8_MXFP8"  # K/T = 32: W8A8 dense fits
    # expert parallelism places experts whole: no split, no fallback for them
    plan = plan_of(moe_layer(down_k=256), scheme="w4a8-mxfp", config=config, deployment=Deployment(tp=8, ep=True))
    assert {t for m, t in written(plan).items() if ".experts." in m} == {"W4A8_MXFP"}
    assert plan.to_dict()["tp"] == 8 and plan.to_dict()["ep"] is True


def test_k_that_does_not_split_over_the_ranks_is_float():
    plan = plan_of(fp8("model.layers.0.self_attn.o_proj", 256, 96), scheme="w8a8-mxfp8", deployment=Deployment(tp=5))
    decision = plan.decisions["model.layers.0.self_attn.o_proj"]
    assert (decision.written, decision.reason) == ("FLOAT", "K=96 does not split over --tp 5 ranks")


def test_shared_experts_as_routed_take_the_routed_type_and_layer():
    spec = deepseek_with_mtp()
    for proj, (n, k) in {"gate_proj": (128, 256), "up_proj": (128, 256), "down_proj": (256, 128)}.items():
        spec.update(fp8(f"model.layers.0.mlp.shared_experts.{proj}", n, k))
    shared = "model.layers.0.mlp.shared_experts.down_proj"
    plan = plan_of(spec, scheme="w4a8-mxfp-moe", config=DEEPSEEK)
    assert written(plan)[shared] == "W8A8_MXFP8"
    plan = plan_of(spec, scheme="w4a8-mxfp-moe", config=DEEPSEEK, deployment=Deployment(shared_experts_as_routed=True))
    assert written(plan)[shared] == "W4A8_MXFP" and plan.decisions[shared].group == "model.layers.0.mlp.experts"
    # and they fall back with the layer: one FLOAT expert takes the shared one along
    plan = plan_of(
        spec, scheme="w4a8-mxfp-moe", config=DEEPSEEK, deployment=Deployment(shared_experts_as_routed=True),
        overrides=[Override.parse("model.layers.0.mlp.experts.1.up_proj=FLOAT")],
    )
    assert written(plan)[shared] == "FLOAT"


@pytest.mark.parametrize("shared_first", [True, False])
def test_a_shared_expert_placed_as_routed_lends_its_facts_to_no_routed_expert(shared_first):
    """module_facts remembers a routed expert's facts by layer, projection and weight for the experts
    after it; a shared expert taken as routed (another shape) is not one of them, in any order."""
    from ascendconv.decide import module_facts
    from ascendconv.sources.hf_fp8_block import pair_fp8_linears

    shared = fp8("model.layers.0.mlp.shared_experts.gate_proj", 512, 256)
    spec = {**(shared if shared_first else {}), **fp8("model.layers.0.mlp.experts.0.gate_proj", 128, 256)}
    spec.update({**({} if shared_first else shared), **fp8("model.layers.0.mlp.experts.1.gate_proj", 128, 256)})
    linears = pair_fp8_linears(entries(spec), (128, 128))
    rules, deployment = rules_for(DEEPSEEK), Deployment(shared_experts_as_routed=True)
    together = module_facts(linears, rules, deployment)
    assert together == {p: module_facts({p: linear}, rules, deployment)[p] for p, linear in linears.items()}
    assert together["model.layers.0.mlp.experts.1.gate_proj"].shape == (128, 256)
    assert together["model.layers.0.mlp.shared_experts.gate_proj"].group == "model.layers.0.mlp.experts"


@pytest.mark.parametrize("tp", [0, -2])
def test_tp_must_be_positive(tp):
    with pytest.raises(BadOptionError, match="--tp"):
        Deployment(tp=tp)


def test_moe_coverage_knows_each_familys_expert_names():
    from ascendconv.io.rules import moe_coverage_problems, moe_layers

    names = [name for name in minimax_layer() if name.endswith(".weight")]
    config = {"model_type": "minimax_m2", "num_local_experts": 2}
    layers = moe_layers(names, config)
    assert layers == {
        "model.layers.0.block_sparse_moe": {
            e: {role: f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight" for role, w in
                (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2"))}
            for e in range(2)
        }
    }
    assert moe_coverage_problems(names, config, "x") == []
    missing = [n for n in names if n != "model.layers.0.block_sparse_moe.experts.1.w3.weight"]
    assert moe_coverage_problems(missing, config, "x") == ["model.layers.0.block_sparse_moe.experts.1 has no up_proj in x"]
    assert moe_coverage_problems(names, {**config, "num_local_experts": 4}, "x") == [
        "model.layers.0.block_sparse_moe has 2 experts but config.json says 4"
    ]


# vllm-ascend's packed-module table (its ModelSlim config), written in our words: model_type ->
# fused module -> members, and which spelling of per-expert projections it expects ("experts").
_QKV = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}
_GATE_UP = {"gate_up_proj": ("gate_proj", "up_proj")}
_MLA = {**_GATE_UP, "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa")}
_GDN = {"in_proj_qkvz": ("in_proj_qkv", "in_proj_z"), "in_proj_ba": ("in_proj_b", "in_proj_a")}
_OMNI = {"attn_qkv_proj": ("attn_q_proj", "attn_k_proj", "attn_v_proj")}
HF_EXPERTS, NATIVE_EXPERTS = ("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2")
VLLM_ASCEND_PACKED = {
    **dict.fromkeys(
        ("qwen3_moe", "qwen3_vl_moe", "glm4_moe", "glm4v_moe", "glm4v_moe_text", "gemma4", "gemma4_text", "step3p5",
         "step3p5_mtp"),
        ({**_QKV, **_GATE_UP}, HF_EXPERTS),
    ),
    "qwen2_5_vl": ({**_QKV, **_GATE_UP}, None),
    "qwen3_5": ({**_QKV, **_GATE_UP, **_GDN}, None),
    "qwen3_5_moe": ({**_QKV, **_GATE_UP, **_GDN}, HF_EXPERTS),
    "qwen3_next": ({**_QKV, **_GATE_UP, "in_proj": ("in_proj_qkvz", "in_proj_ba")}, HF_EXPERTS),
    **dict.fromkeys(
        ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "glm_moe_dsa", "pangu_ultra_moe", "pangu_ultra_moe_mtp",
         "glm4_moe_lite", "longcat_flash"),
        (_MLA, HF_EXPERTS),
    ),
    "deepseek_mtp": (_GATE_UP, HF_EXPERTS),
    "deepseek_v4": (_GATE_UP, HF_EXPERTS),
    "minimax_m2": (_QKV, NATIVE_EXPERTS),
    "minimax_m3": ({**_QKV, **_GATE_UP}, NATIVE_EXPERTS),
    "minimax_m3_vl": ({**_QKV, **_GATE_UP}, NATIVE_EXPERTS),
    "qwen3_omni_moe": ({**_QKV, **_OMNI, **_GATE_UP}, HF_EXPERTS),
    "qwen2_5_omni": ({**_QKV, **_OMNI, "attn.qkv": ("attn.q", "attn.k", "attn.v"), "qkv": ("q", "k", "v"), **_GATE_UP}, None),
    "bailing_hybrid": ({**_MLA, "o_proj": ("dense",)}, HF_EXPERTS),
}  # fmt: skip
# Where our table differs, and why (docs/families.md, "Packed groups"): Qwen3-Next's in_proj is
# never looked up (vLLM builds in_proj_qkvz and in_proj_ba apart; the release keeps in_proj_ba BF16);
# Qwen2.5-Omni's "attn.qkv" key holds a dot, and the lookup compares last names only, so it never
# matches; MiniMax-M3's model registers indexer_proj itself; DeepSeek-V4's loader renames the
# native w1 / w3 / w2 to gate / up / down_proj, so the native spellings pack and route as those.
NOT_APPLIED = {"qwen3_next": {"in_proj"}, "qwen2_5_omni": {"attn.qkv"}}
ADDED_BY_THE_MODEL = {
    "minimax_m3": ({("indexer_proj", ("index_q_proj", "index_k_proj"))}, ()),
    "deepseek_v4": ({("gate_up_proj", ("w1", "w3"))}, (NATIVE_EXPERTS,)),
}
ADDED_BY_THE_MODEL["minimax_m3_vl"] = ADDED_BY_THE_MODEL["minimax_m3"]


@pytest.mark.parametrize("model_type", sorted(VLLM_ASCEND_PACKED))
def test_every_model_type_vllm_ascend_packs_is_known_with_its_groups(model_type):
    groups, experts = VLLM_ASCEND_PACKED[model_type]
    rules = rules_for({"model_type": model_type})
    assert rules.known and rules.warning is None
    ours = {(fused, members) for members, fused in rules.family.packed}
    want = {(f, m) for f, m in groups.items() if f not in NOT_APPLIED.get(model_type, set())}
    added_groups, added_experts = ADDED_BY_THE_MODEL.get(model_type, (set(), ()))
    assert ours == want | added_groups
    assert set(rules.family.expert_projections) == set(((experts,) if experts else ()) + added_experts)
    # the lookup's view: every member of a group maps to the one fused module
    for fused, members in ours:
        assert {rules.packed_group(f"model.layers.3.block.{m}") for m in members} == {f"model.layers.3.block.{fused}"}


def test_our_table_is_vllm_ascends_plus_dense_qwen3():
    """Plus Kimi-K3, which vllm-ascend runs (its routed experts W4A8_MXFP) with no packed-table entry."""
    from ascendconv.families import FAMILIES

    assert {t for family in FAMILIES for t in family.model_types} == set(VLLM_ASCEND_PACKED) | {"qwen3", "kimi_k3"}


def test_roots_and_vision_of_the_vision_language_families():
    qwen = rules_for({"model_type": "qwen3_5_moe", "text_config": {"num_hidden_layers": 40}})
    assert qwen.default_float("model.visual.blocks.0.attn.qkv") == VISION_REASON
    assert qwen.default_float("model.language_model.layers.3.self_attn.q_proj") is None
    assert qwen.tp_role("model.language_model.layers.0.linear_attn.in_proj_qkv") == "column"
    assert qwen.shared_expert_layer("model.language_model.layers.0.mlp.shared_expert.down_proj") == "model.language_model.layers.0.mlp"
    m3 = rules_for({"model_type": "minimax_m3_vl", "text_config": {"num_hidden_layers": 60, "num_nextn_predict_layers": 1}})
    assert m3.default_float("multi_modal_projector.linear_1") == VISION_REASON
    assert m3.tp_role("language_model.model.layers.5.self_attn.index_k_proj") == "replicated"
    assert m3.is_mtp("language_model.model.layers.60.self_attn.q_proj")  # numbered after the decoder, under its root
    assert m3.indexer_of("language_model.model.layers.5.self_attn.index_q_proj") == "language_model.model.layers.5.self_attn"


@pytest.mark.parametrize("model_type", sorted({t for f in FAMILIES for t in f.model_types}) + ["mystery"])
@pytest.mark.parametrize("deployment", [Deployment(), Deployment(tp=4), Deployment(tp=4, ep=True, shared_experts_as_routed=True)])
def test_routed_experts_share_facts_as_if_each_were_decided_alone(model_type, deployment):
    """module_facts looks a routed expert's facts up by layer, projection and weight: the same facts
    as deciding each expert alone, in every family (its roots, MTP layers, tp and FLOAT rules)."""
    from ascendconv.decide import module_facts
    from ascendconv.sources.hf_fp8_block import pair_fp8_linears

    config = {"model_type": model_type, "num_hidden_layers": 2, "num_nextn_predict_layers": 1}
    rules = rules_for(config)
    spec = {}
    roots = rules.family.roots or ("model.",)
    for root in {*roots, rules.family.mtp_prefix or roots[0], *rules.family.float_roots}:
        for layer in (0, 2):  # a decoder layer and the MTP layer after it
            for names in rules.family.expert_projections or (("gate_proj", "up_proj", "down_proj"),):
                for expert in (0, 7, 10):
                    for proj, (n, k) in zip(names, ((256, 512), (256, 512), (512, 256))):
                        spec.update(fp8(f"{root}layers.{layer}.mlp.experts.{expert}.{proj}", n, k))
    linears = pair_fp8_linears(entries(spec), (128, 128))
    together = module_facts(linears, rules, deployment)
    assert {p: module_facts({p: linear}, rules, deployment)[p] for p, linear in linears.items()} == together
    moe = bool(rules.family.expert_projections)
    assert sum(1 for p in linears if rules.routed_expert(p)) == (len(linears) if moe else 0)


GLM = {"model_type": "glm_moe_dsa", "num_hidden_layers": 1, "num_nextn_predict_layers": 1, "n_routed_experts": 2}
GLM_HEAD = "model.layers.1.shared_head.head.weight"
V4_HEAD = "mtp.0.head.weight"
EMBEDDING = ("BF16", (64, 256))


def glm_with_mtp(*, lm_head: bool = True, embedding: bool = True) -> dict:
    """deepseek_with_mtp as GLM-5 stores it: layer 1 the MTP layer (eh_proj, enorm, shared_head.norm,
    no shared_head.head), with or without lm_head and the embedding."""
    spec = deepseek_with_mtp()
    spec["model.layers.1.eh_proj.weight"] = ("BF16", (256, 512))
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        spec[f"model.layers.1.{norm}.weight"] = ("BF16", (256,))
    if embedding:
        spec["model.embed_tokens.weight"] = EMBEDDING
    if lm_head:
        spec["lm_head.weight"] = EMBEDDING
    return spec


def v4_with_mtp(*, head: bool = True) -> dict:
    """DeepSeek-V4's native names: one decoder layer, the MTP layer mtp.0 (e_proj / h_proj), embed,
    with or without head."""
    spec = {"embed.weight": EMBEDDING, **({"head.weight": EMBEDDING} if head else {})}
    for p in ("layers.0", "mtp.0"):
        spec.update(fp8(f"{p}.attn.wq_a", 256, 256))
        spec.update(fp8(f"{p}.ffn.shared_experts.w1", 128, 256))
    spec.update(fp8("mtp.0.e_proj", 256, 256))
    spec.update(fp8("mtp.0.h_proj", 256, 256))
    return spec


V4 = {"model_type": "deepseek_v4", "num_hidden_layers": 1, "num_nextn_predict_layers": 1}


@pytest.mark.parametrize(
    "spec, config, head, embedding, reason",
    [
        (glm_with_mtp(lm_head=False), {**GLM, "tie_word_embeddings": True}, GLM_HEAD, "model.embed_tokens.weight",
         GLM_MTP_TIED_HEAD_REASON),
        (v4_with_mtp(head=False), {**V4, "tie_word_embeddings": True}, V4_HEAD, "embed.weight", DS_V4_MTP_TIED_HEAD_REASON),
    ],
)  # fmt: skip
def test_with_tied_embeddings_the_drafter_head_is_a_copy_of_the_embedding(spec, config, head, embedding, reason):
    plan = plan_of(spec, scheme="w8a8-mxfp8", config=config)
    assert [(a.name, a.source, a.reason) for a in plan.added] == [(head, embedding, reason)]
    copy = {t.name: t for t in plan.tensors}[head]
    assert (copy.source, copy.kind, copy.dtype, copy.shape, copy.quant_type) == (embedding, "copy", "BF16", (64, 256), "FLOAT")
    assert plan.description()[head] == "FLOAT"
    assert plan.to_dict()["added_tensors"] == {head: {"source": embedding, "reason": reason}}  # what provenance records
    assert plan.warnings == []
    off = plan_of(spec, scheme="w8a8-mxfp8", config=config, deployment=Deployment(mtp_heads=False))
    assert head not in off.description() and off.added == []
    assert off.warnings == [
        f"{head} is not in the source and --no-mtp-heads leaves it out: vllm-ascend's MTP drafter looks it up at "
        f"construction, so speculative decoding with MTP will not load ({reason})"
    ]


@pytest.mark.parametrize(
    "spec, config, head, untied",
    [
        (glm_with_mtp(lm_head=False, embedding=False), {**GLM, "tie_word_embeddings": True}, GLM_HEAD,
         "nor lm_head.weight or model.embed_tokens.weight to copy it from"),
        (glm_with_mtp(lm_head=False), GLM, GLM_HEAD,
         "nor lm_head.weight to copy it from (config.json does not set tie_word_embeddings, so "
         "model.embed_tokens.weight is not the output head)"),
        (v4_with_mtp(head=False), V4, V4_HEAD,
         "nor head.weight to copy it from (config.json does not set tie_word_embeddings, so embed.weight is not the "
         "output head)"),
    ],
)  # fmt: skip
def test_a_drafter_head_with_nothing_to_copy_says_mtp_will_not_load(spec, config, head, untied):
    for deployment in (Deployment(), Deployment(mtp_heads=False)):
        plan = plan_of(spec, scheme="w8a8-mxfp8", config=config, deployment=deployment)
        assert plan.added == [] and head not in plan.description()
        assert plan.warnings == [
            f"{head} is not in the source, {untied}: vllm-ascend's MTP drafter looks it up at construction, so "
            "speculative decoding with MTP will not load"
        ]


def test_glm_with_its_lm_head_copies_lm_head_even_with_tied_embeddings():
    plan = plan_of(glm_with_mtp(), scheme="w8a8-mxfp8", config={**GLM, "tie_word_embeddings": True})
    assert [(a.name, a.source, a.reason) for a in plan.added] == [(GLM_HEAD, "lm_head.weight", GLM_MTP_HEAD_REASON)]


def _undeclared(fix: str, stated: str) -> str:
    return (
        f"layer 1 holds MTP tensors (eh_proj / enorm) and {stated}: planned as MTP layers, FLOAT; vLLM finds MTP "
        f"layers by num_hidden_layers and num_nextn_predict_layers, so set {fix} in the package's config.json"
    )


@pytest.mark.parametrize(
    "config, warning",
    [
        ({k: v for k, v in GLM.items() if k != "num_nextn_predict_layers"},
         _undeclared('"num_nextn_predict_layers": 1', "config.json does not declare them (num_nextn_predict_layers absent)")),
        ({**GLM, "num_nextn_predict_layers": 0},
         _undeclared('"num_nextn_predict_layers": 1', "config.json does not declare them (num_nextn_predict_layers 0)")),
        ({k: v for k, v in GLM.items() if k != "num_hidden_layers"},
         _undeclared('"num_hidden_layers": 1', "config.json has no num_hidden_layers to number them from")),
    ],
)  # fmt: skip
def test_an_mtp_layer_config_json_does_not_declare_is_planned_as_mtp_and_warned(config, warning):
    """Layer 1 holds eh_proj / enorm: an MTP layer whatever num_nextn_predict_layers says (vLLM's
    loader would not find it), FLOAT with the drafter's head, as a declared one."""
    plan = plan_of(glm_with_mtp(), scheme="w4a8-mxfp-moe", config=config)
    declared = plan_of(glm_with_mtp(), scheme="w4a8-mxfp-moe", config=GLM)
    assert written(plan) == written(declared) and written(plan)["model.layers.1.mlp.experts.0.up_proj"] == "FLOAT"
    assert plan.decisions["model.layers.1.self_attn.q_a_proj"].reason == MTP_REASON
    assert [(a.name, a.source) for a in plan.added] == [(GLM_HEAD, "lm_head.weight")]
    assert plan.warnings == [warning]
    assert declared.warnings == []


def test_a_second_mtp_layer_past_the_declared_count_is_mtp_too():
    spec = glm_with_mtp()
    spec.update({name.replace("layers.1.", "layers.2."): entry for name, entry in spec.items() if "layers.1." in name})
    rules = rules_for(GLM, spec)
    assert rules.mtp_layer_numbers == (1, 2) and rules.undeclared_mtp_layers == (2,)
    assert [a.name for a in rules.mtp_heads(spec)] == [GLM_HEAD, "model.layers.2.shared_head.head.weight"]
    assert '"num_nextn_predict_layers": 2' in rules.layer_count_warning
    assert rules_for(GLM, glm_with_mtp()).undeclared_mtp_layers == ()
    # a decoder layer is no MTP layer, marker or not: only layers from num_hidden_layers on
    assert rules_for({**GLM, "num_hidden_layers": 2}, spec).undeclared_mtp_layers == ()



GAP = (
    "layer 2 holds MTP tensors (eh_proj / enorm) and {stated}: planned as MTP layers, FLOAT; vLLM finds MTP layers "
    'by num_hidden_layers and num_nextn_predict_layers, so set "num_nextn_predict_layers": 2 in the package\'s '
    "config.json; the source holds no layer 1, which vLLM's MTP drafter then builds too (it numbers MTP layers from "
    "1 on, without a gap): the model loads, but speculative decoding with MTP will not until the source's MTP "
    "layers are numbered from 1"
)


@pytest.mark.parametrize(
    "config, stated",
    [
        ({k: v for k, v in GLM.items() if k != "num_nextn_predict_layers"},
         "config.json does not declare them (num_nextn_predict_layers absent)"),
        (GLM, "config.json does not declare them (num_nextn_predict_layers 1)"),
    ],
)  # fmt: skip
def test_an_mtp_layer_after_a_gap_is_counted_through_it_and_warned_that_mtp_will_not_load(config, stated):
    """The MTP layer numbered 2 where num_hidden_layers is 1: the warning asked for
    num_nextn_predict_layers 1 when the config had none (vLLM then builds MTP layer 1 only, and the
    decoder's loader meets layer 2's tensors), and never said that no count makes the drafter load."""
    spec = {n.replace("model.layers.1.", "model.layers.2."): e for n, e in glm_with_mtp().items()}
    rules = rules_for(config, spec)
    assert rules.layer_count_warning == GAP.format(stated=stated)
    assert (rules.undeclared_mtp_layers, rules.mtp_gap) == ((2,), 1)
    assert rules_for(config, glm_with_mtp()).mtp_gap is None


def test_without_num_hidden_layers_mtp_layers_with_a_gap_are_counted_through_it():
    spec = glm_with_mtp()
    spec.update({n.replace("model.layers.1.", "model.layers.3."): e for n, e in spec.items() if "layers.1." in n})
    rules = rules_for({k: v for k, v in GLM.items() if k != "num_hidden_layers"}, spec)
    assert 'set "num_hidden_layers": 1 and "num_nextn_predict_layers": 3 in' in rules.layer_count_warning
    assert "the source holds no layer 2," in rules.layer_count_warning
    assert (rules.undeclared_mtp_layers, rules.mtp_gap) == ((1, 3), 2)

def _with_layer(spec: dict, layer: int, copied_from: int) -> dict:
    prefix = f"model.layers.{copied_from}."
    return {**spec, **{name.replace(prefix, f"model.layers.{layer}."): e for name, e in spec.items() if name.startswith(prefix)}}


def test_a_decoder_layer_numbered_as_mtp_is_warned_with_the_num_hidden_layers_fix():
    """DeepSeek-V3 with num_hidden_layers 60 for its 61 decoder layers: layer 60 was planned as the
    MTP layer, FLOAT, and the only warning (layer 61's undeclared MTP tensors) asked for
    num_nextn_predict_layers 2, which vLLM cannot build either. The fix is num_hidden_layers."""
    glm = glm_with_mtp()
    spec = {n: e for n, e in glm.items() if not n.startswith("model.layers.1.")}
    spec = _with_layer(spec, 1, copied_from=0)
    spec.update({n.replace("model.layers.1.", "model.layers.2."): e for n, e in glm.items() if n.startswith("model.layers.1.")})
    rules = rules_for(GLM, spec)
    assert (rules.uncounted_layers, rules.undeclared_mtp_layers) == ((1,), (2,))
    warning = (
        "layer 1 holds no MTP tensors (eh_proj / enorm), which vLLM's MTP drafter needs, yet config.json numbers it "
        "as MTP (num_hidden_layers 1, num_nextn_predict_layers 1): planned as MTP, FLOAT, as vLLM reads that config; "
        'if it is a decoder layer, set "num_hidden_layers": 2 in the source\'s config.json and convert again'
    )
    assert rules.layer_count_warning == warning
    plan = plan_of(spec, scheme="w4a8-mxfp-moe", config=GLM)
    assert plan.warnings == [warning]
    assert plan.decisions["model.layers.1.mlp.experts.0.up_proj"].reason == MTP_REASON
    fixed = rules_for({**GLM, "num_hidden_layers": 2}, spec)
    assert (fixed.uncounted_layers, fixed.undeclared_mtp_layers, fixed.layer_count_warning) == ((), (), None)
    # an MTP layer stored without its markers, no MTP layer after it: nothing says it is a decoder layer
    assert rules_for(DEEPSEEK, deepseek_with_mtp()).layer_count_warning is None


def test_decoder_layers_past_the_count_are_warned_and_counted_in_the_fix():
    """A Qwen3-MoE checkpoint of three layers whose config counts two: vLLM builds two and has no
    place for the third, which was planned without a word."""
    spec = _with_layer(_with_layer(moe_layer(), 1, copied_from=0), 2, copied_from=0)
    config = {"model_type": "qwen3_moe", "num_hidden_layers": 1, "num_experts": 2}
    rules = rules_for(config, spec)
    assert rules.uncounted_layers == (1, 2)
    assert rules.layer_count_warning == (
        "layers 1, 2 hold no MTP tensors (eh_proj / enorm) past config.json's num_hidden_layers (1) and its MTP "
        "layers: decoder layers it does not count, which vLLM has no place for (it builds num_hidden_layers decoder "
        'layers); if they are decoder layers, set "num_hidden_layers": 3 in the source\'s config.json and convert again'
    )
    assert rules_for({**config, "num_hidden_layers": 3}, spec).layer_count_warning is None
    # without a count there is nothing to be past
    assert rules_for({k: v for k, v in config.items() if k != "num_hidden_layers"}, spec).uncounted_layers == ()


@pytest.mark.parametrize("value,shown", [("1", "'1' (str)"), (1.0, "1.0 (float)"), (True, "True (bool)"), (-1, "-1 (int)")])
def test_num_hidden_layers_that_is_no_count_is_refused(value, shown):
    """It was passed over as if absent: the MTP layers were numbered from no layer (a GLM-5 MTP
    layer then planned as undeclared, 'config.json has no num_hidden_layers'), and the package,
    exit 0, carried a config.json by which vLLM cannot build the model."""
    with pytest.raises(ConfigError) as caught:
        rules_for({**GLM, "num_hidden_layers": value})
    assert caught.value.message == f"config.json's num_hidden_layers is {shown}, not a count of decoder layers"
    assert caught.value.hint == "write it as an integer, the number of decoder layers (vLLM builds that many)"
    assert rules_for({**GLM, "num_hidden_layers": None}).num_hidden_layers is None  # null: absent


@pytest.mark.parametrize("value", ["1", 1.0, True, -1, [1]])
def test_num_nextn_predict_layers_that_is_no_count_is_refused(value):
    with pytest.raises(ConfigError) as caught:
        rules_for({**GLM, "num_nextn_predict_layers": value})
    assert caught.value.message.startswith(f"config.json's num_nextn_predict_layers is {value!r} ")


_EXPERT_NAME = re.compile(r"^(.+)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def plain_moe_layers(names: list[str]) -> dict:
    """moe_layers worked out name by name: the reference its shortcut for an expert's adjacent
    projections is held to."""
    layers: dict = {}
    for name in names:
        match = _EXPERT_NAME.match(name)
        if match and len(match[2]) <= 9:
            layers.setdefault(match[1], {}).setdefault(int(match[2]), {})[match[3]] = name
    order = lambda layer: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", layer)]  # noqa: E731
    return {layer: layers[layer] for layer in sorted(layers, key=order)}


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["model.layers.1.mlp", "model.layers.10.mlp", "model.layers.2.mlp"]),
            st.sampled_from(["0", "1", "01", "7", "1234567890"]),
            st.lists(st.sampled_from(["gate_proj", "up_proj", "down_proj", "o_proj"]), min_size=1, max_size=4),
        ),
        max_size=12,
    ),
    st.booleans(),
)
def test_moe_layers_is_the_name_by_name_reading(experts, dense_between):
    """Adjacent projections of one expert (found once for all three), the same expert met again
    later, expert numbers spelled two ways, too many digits, and other modules between them."""
    from ascendconv.io.rules import _moe_layers, moe_layers

    names = []
    for layer, expert, projections in experts:
        names += [f"{layer}.experts.{expert}.{proj}.weight" for proj in projections]
        if dense_between:
            names.append(f"{layer}.shared_expert.up_proj.weight")
    config = {"model_type": "qwen3_moe"}
    assert moe_layers(names, config) == plain_moe_layers(names)
    assert moe_layers(names, config) == plain_moe_layers(names)  # the routed-expert memo's matches
    modules = [name[: -len(".weight")] for name in names]  # check_source_tensors reads the roles held only
    assert _moe_layers(modules, config, weight_suffix="") == {
        layer: {e: {role: name[: -len(".weight")] for role, name in roles.items()} for e, roles in experts.items()}
        for layer, experts in plain_moe_layers(names).items()
    }


@given(
    st.permutations(
        [*fp8("model.layers.0.self_attn.q_proj", 128, 128), *fp8("model.layers.0.mlp.down_proj", 128, 128),
         "model.norm.weight", "model.layers.0.input_layernorm.weight", "lm_head.bias", "version", "metadata"]
    ),
    st.sets(st.sampled_from(["version", "metadata"])),
)
def test_check_source_tensors_looks_at_the_unpaired_tensors_in_source_order(order, fields):
    """The unpaired tensors (found at C speed) are returned in source order; a tensor named like a
    field of the description is refused, the first one in source order."""
    from ascendconv.errors import UnsupportedTensorError
    from ascendconv.io.rules import check_source_tensors
    from ascendconv.sources.hf_fp8_block import pair_fp8_linears
    from pathlib import Path

    from test_plan import BLOCK

    spec = {**fp8("model.layers.0.self_attn.q_proj", 128, 128), **fp8("model.layers.0.mlp.down_proj", 128, 128)}
    names = [n for n in order if n not in {"version", "metadata"} - fields]
    tensors = entries({n: spec.get(n, ("BF16", (128,))) for n in names})
    linears = pair_fp8_linears(tensors, BLOCK)
    if fields:
        first = next(n for n in names if n in fields)
        with pytest.raises(UnsupportedTensorError, match=f"tensor '{first}' has the name of a field"):
            check_source_tensors(Path("src"), tensors, linears, {})
    else:
        paired = {name for linear in linears.values() for name in (linear.weight.name, linear.scale.name)}
        assert check_source_tensors(Path("src"), tensors, linears, {}) == [n for n in names if n not in paired]


def test_check_source_tensors_refuses_a_paired_tensor_named_like_a_description_field():
    """Not only unpaired tensors: a linear's own weight or scale of such a name is refused too (a
    hand-made pairing; no format pairs a dotless name), before a later unpaired one is looked at."""
    from pathlib import Path

    from ascendconv.errors import UnsupportedTensorError
    from ascendconv.io.rules import check_source_tensors
    from ascendconv.sources.base import Encoding, SourceLinear

    tensors = entries({"model.norm.weight": ("BF16", (128,)), "version": ("BF16", (128, 128)), "x.weight": ("F32", (8,))})
    linears = {"v": SourceLinear("v", tensors["version"], None, None, None, Encoding.FLOAT)}
    with pytest.raises(UnsupportedTensorError, match="tensor 'version' has the name of a field"):
        check_source_tensors(Path("src"), tensors, linears, {})
