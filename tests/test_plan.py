"""The pure planner: types, packed groups, fallbacks, shards, description (no files involved)."""

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascendconv.ascendv1 import RANK
from ascendconv.errors import BadOptionError
from ascendconv.families import EMBEDDING_REASON
from ascendconv.io.safetensors import TensorEntry, tensor_nbytes
from ascendconv.sources.hf_fp8_block import pair_fp8_linears
from ascendconv.decide import SCHEMES, Deployment, Override, module_pattern, packed_group
from ascendconv.options import parse_size
from ascendconv.plan import assign_shards, files_to_copy, make_plan

BLOCK = (128, 128)


def entries(spec: dict[str, tuple[str, tuple[int, ...]]]) -> dict[str, TensorEntry]:
    out, offset = {}, 0
    for name, (dtype, shape) in spec.items():
        nbytes = tensor_nbytes(dtype, shape)
        out[name] = TensorEntry(name, dtype, shape, Path("model.safetensors"), offset, nbytes)
        offset += nbytes
    return out


def fp8(prefix: str, n: int, k: int) -> dict:
    return {
        prefix + ".weight": ("F8_E4M3", (n, k)),
        prefix + ".weight_scale_inv": ("F32", (math.ceil(n / 128), math.ceil(k / 128))),
    }


def plan_of(spec: dict, **options):
    tensors = entries(spec)
    return make_plan(tensors, pair_fp8_linears(tensors, BLOCK), ["config.json"], 0, **options)


def moe_layer(down_k: int = 128) -> dict:
    spec = {"model.embed_tokens.weight": ("BF16", (64, 256))}
    spec.update(fp8("model.layers.0.self_attn.q_proj", 256, 256))
    spec.update(fp8("model.layers.0.self_attn.k_proj", 128, 256))
    spec.update(fp8("model.layers.0.self_attn.v_proj", 128, 256))
    spec.update(fp8("model.layers.0.self_attn.o_proj", 256, 256))
    spec["model.layers.0.mlp.gate.weight"] = ("BF16", (2, 256))
    for e in range(2):
        spec.update(fp8(f"model.layers.0.mlp.experts.{e}.gate_proj", down_k, 256))
        spec.update(fp8(f"model.layers.0.mlp.experts.{e}.up_proj", down_k, 256))
        spec.update(fp8(f"model.layers.0.mlp.experts.{e}.down_proj", 256, down_k))
    return spec


def written(plan) -> dict[str, str]:
    return {m: d.written for m, d in plan.decisions.items()}


def test_packed_groups():
    assert packed_group("model.layers.3.mlp.experts.17.down_proj") == "model.layers.3.mlp.experts"
    assert packed_group("model.layers.3.self_attn.k_proj") == "model.layers.3.self_attn.qkv_proj"
    assert packed_group("model.layers.3.mlp.shared_experts.up_proj") == "model.layers.3.mlp.shared_experts.gate_up_proj"
    assert packed_group("model.layers.3.self_attn.kv_a_proj_with_mqa") == "model.layers.3.self_attn.fused_qkv_a_proj"
    assert packed_group("model.layers.3.self_attn.o_proj") == "model.layers.3.self_attn.o_proj"


def test_moe_scheme_puts_experts_in_w4a8_and_the_rest_in_w8a8():
    plan = plan_of(moe_layer(), scheme="w4a8-mxfp-moe")
    types = written(plan)
    assert {t for m, t in types.items() if ".experts." in m} == {"W4A8_MXFP"}
    assert {t for m, t in types.items() if ".experts." not in m} == {"W8A8_MXFP8"}
    assert plan.model_quant_type == "W4A8_MXFP" and plan.fallbacks == []
    by_name = {t.name: t for t in plan.tensors}
    down = by_name["model.layers.0.mlp.experts.1.down_proj.weight"]
    assert (down.dtype, down.shape) == ("U8", (256, 64))
    assert by_name["model.layers.0.mlp.experts.1.down_proj.weight_scale"].shape == (256, 4)
    q = by_name["model.layers.0.self_attn.q_proj.weight"]
    assert (q.dtype, q.shape, q.quant_type) == ("F8_E4M3", (256, 256), "W8A8_MXFP8")
    assert "model.layers.0.self_attn.q_proj.weight_scale_inv" not in by_name
    assert by_name["model.layers.0.mlp.gate.weight"].quant_type == "FLOAT"


def test_one_misaligned_expert_takes_the_whole_moe_layer_down_the_chain():
    spec = moe_layer()
    spec.update(fp8("model.layers.0.mlp.experts.1.down_proj", 256, 96))  # K=96: %32 ok, %64 not
    plan = plan_of(spec, scheme="w4a8-mxfp")
    types = written(plan)
    # MoE experts need K % 64 even in W8A8, so the whole layer ends as FLOAT, together.
    assert {t for m, t in types.items() if ".experts." in m} == {"FLOAT"}
    reasons = {d.module: d.reason for d in plan.fallbacks}
    assert "K=96 is not a multiple of 64" in reasons["model.layers.0.mlp.experts.1.down_proj"]
    assert reasons["model.layers.0.mlp.experts.0.gate_proj"] == (
        "one type per MoE layer; experts.1.down_proj: K=96 is not a multiple of 64 (W4A8_MXFP pairs scale groups)"
    )
    resolved = {t.name: t for t in plan.tensors}["model.layers.0.mlp.experts.0.up_proj.weight"]
    assert (resolved.dtype, resolved.kind) == ("BF16", "resolve")


def test_dense_down_proj_with_k_multiple_of_32_falls_back_to_w8a8_alone():
    spec = fp8("model.layers.0.mlp.gate_proj", 352, 256)
    spec.update(fp8("model.layers.0.mlp.up_proj", 352, 256))
    spec.update(fp8("model.layers.0.mlp.down_proj", 256, 352))
    plan = plan_of(spec, scheme="w4a8-mxfp")
    assert written(plan) == {
        "model.layers.0.mlp.gate_proj": "W4A8_MXFP",
        "model.layers.0.mlp.up_proj": "W4A8_MXFP",
        "model.layers.0.mlp.down_proj": "W8A8_MXFP8",
    }
    [fallback] = plan.fallbacks
    assert fallback.to_dict() == {
        "module": "model.layers.0.mlp.down_proj",
        "requested": "W4A8_MXFP",
        "written": "W8A8_MXFP8",
        "reason": "K=352 is not a multiple of 64 (W4A8_MXFP pairs scale groups)",
    }


def test_override_on_one_member_moves_its_packed_group_and_later_overrides_win():
    plan = plan_of(
        moe_layer(),
        scheme="w8a8-mxfp8",
        overrides=[Override.parse("*.k_proj=FLOAT"), Override.parse("*.o_proj=FLOAT"), Override.parse("*.o_proj=W4A8_MXFP")],
    )
    types = written(plan)
    assert types["model.layers.0.self_attn.q_proj"] == "FLOAT"
    assert types["model.layers.0.self_attn.v_proj"] == "FLOAT"
    assert types["model.layers.0.self_attn.o_proj"] == "W4A8_MXFP"
    q = plan.decisions["model.layers.0.self_attn.q_proj"]
    assert q.is_fallback and "packed with model.layers.0.self_attn.k_proj" in q.reason


QKV = ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj")


@pytest.mark.parametrize(
    "dtype,shape,why",
    [
        ("BF16", (256, 256), "the source leaves it unquantized (BF16 [256, 256]), so it stays FLOAT"),
        ("F64", (256, 256), "the source stores it F64 [256, 256], a dtype ascendconv does not quantize, so it stays FLOAT"),
        ("I32", (256, 256), "the source stores it I32 [256, 256], a dtype ascendconv does not quantize, so it stays FLOAT"),
        ("BF16", (256,), "the source stores it BF16 [256], not a 2-D weight, so it stays FLOAT"),
    ],
)
def test_a_packed_member_the_source_does_not_quantize_keeps_its_whole_group_float(dtype, shape, why):
    """q_proj copied as stored is FLOAT; vllm-ascend loads qkv_proj in one type, so k and v go FLOAT with it."""
    spec = moe_layer()
    del spec["model.layers.0.self_attn.q_proj.weight_scale_inv"]
    spec["model.layers.0.self_attn.q_proj.weight"] = (dtype, shape)
    plan = plan_of(spec, scheme="w8a8-mxfp8")
    assert QKV[0] not in plan.decisions
    assert {m: t for m, t in written(plan).items() if m in QKV} == {QKV[1]: "FLOAT", QKV[2]: "FLOAT"}
    assert written(plan)["model.layers.0.self_attn.o_proj"] == "W8A8_MXFP8"
    assert [(d.module, d.requested, d.written, d.reason) for d in plan.fallbacks] == [
        (member, "W8A8_MXFP8", "FLOAT", f"packed with {QKV[0]}: {why}") for member in QKV[1:]
    ]
    assert {t.name: t.quant_type for t in plan.tensors if t.name.startswith(QKV)} == {
        member + ".weight": "FLOAT" for member in QKV
    }


def test_a_routed_expert_the_source_does_not_quantize_keeps_its_moe_layer_float():
    spec = moe_layer()
    del spec["model.layers.0.mlp.experts.1.up_proj.weight_scale_inv"]
    spec["model.layers.0.mlp.experts.1.up_proj.weight"] = ("BF16", (128, 256))
    plan = plan_of(spec, scheme="w4a8-mxfp-moe")
    assert {t for m, t in written(plan).items() if ".experts." in m} == {"FLOAT"}
    assert written(plan)["model.layers.0.self_attn.q_proj"] == "W8A8_MXFP8"
    reasons = {d.module: d.reason for d in plan.fallbacks}
    assert sorted(reasons) == sorted(m for m in plan.decisions if ".experts." in m)
    assert reasons["model.layers.0.mlp.experts.0.down_proj"] == (
        "one type per MoE layer; experts.1.up_proj: the source leaves it unquantized (BF16 [128, 256]), so it stays FLOAT"
    )


def test_an_override_quantizing_a_group_with_a_member_the_source_does_not_quantize_is_refused():
    spec = moe_layer()
    del spec["model.layers.0.self_attn.q_proj.weight_scale_inv"]
    spec["model.layers.0.self_attn.q_proj.weight"] = ("BF16", (256, 256))
    with pytest.raises(BadOptionError) as refused:
        plan_of(spec, overrides=[Override.parse("*.self_attn.*=W8A8_MXFP8")])
    assert str(refused.value) == (
        f"--override *.self_attn.*=W8A8_MXFP8 would write {QKV[1]} as W8A8_MXFP8, but the packed module "
        f"model.layers.0.self_attn.qkv_proj holds {QKV[0]}: the source leaves it unquantized (BF16 [256, 256]), so "
        "it stays FLOAT; vllm-ascend loads a packed module in one type"
    )
    assert "narrow the GLOB to leave model.layers.0.self_attn.qkv_proj FLOAT" in refused.value.hint
    # an override that keeps the group FLOAT, or quantizes others, is the plan without it
    plan = plan_of(spec, overrides=[Override.parse("*.k_proj=FLOAT"), Override.parse("*.o_proj=W4A8_MXFP")])
    assert {m: t for m, t in written(plan).items() if m in QKV} == {QKV[1]: "FLOAT", QKV[2]: "FLOAT"}
    assert written(plan)["model.layers.0.self_attn.o_proj"] == "W4A8_MXFP"


def test_kv_b_proj_stays_float_unless_overridden():
    spec = fp8("model.layers.0.self_attn.kv_b_proj", 256, 512)
    assert written(plan_of(spec, scheme="w8a8-mxfp8")) == {"model.layers.0.self_attn.kv_b_proj": "FLOAT"}
    plan = plan_of(spec, scheme="w8a8-mxfp8", overrides=[Override.parse("*.kv_b_proj=W8A8_MXFP8")])
    assert written(plan) == {"model.layers.0.self_attn.kv_b_proj": "W8A8_MXFP8"}


def test_an_fp8_input_embedding_stays_float_in_every_spelling_and_an_fp8_lm_head_does_not():
    # vllm-ascend's quantized embedding method is its linear method, with no row lookup: an MX
    # embedding does not run, so a release that stores it FP8 gets its resolved BF16 weight
    embeddings = ("model.embed_tokens", "model.language_model.embed_tokens", "embed", "transformer.wte")
    spec = {}
    for prefix in embeddings:
        spec.update(fp8(prefix, 64, 256))
    spec.update(fp8("lm_head", 64, 256))
    for scheme in ("w8a8-mxfp8", "w4a8-mxfp"):
        plan = plan_of(spec, scheme=scheme)
        assert written(plan) == {**dict.fromkeys(embeddings, "FLOAT"), "lm_head": plan.decisions["lm_head"].requested}
        assert plan.decisions["lm_head"].written != "FLOAT"
        assert plan.kept_float() == {EMBEDDING_REASON: 4}
        assert {t.name: t.dtype for t in plan.tensors if t.name.startswith(embeddings)} == {
            p + ".weight": "BF16" for p in embeddings
        }


@pytest.mark.parametrize("glob", ["model.embed_tokens", "*", "*embed*"])
def test_an_override_quantizing_an_input_embedding_is_refused(glob):
    # the package it asks for cannot run: vllm-ascend has no MX embedding lookup
    spec = {**fp8("model.embed_tokens", 64, 256), **fp8("lm_head", 64, 256)}
    with pytest.raises(BadOptionError, match="is an input embedding: vLLM looks its rows up") as caught:
        plan_of(spec, overrides=[Override.parse(f"{glob}=W8A8_MXFP8")])
    assert f"--override {glob}=W8A8_MXFP8 would write model.embed_tokens as W8A8_MXFP8" in caught.value.message
    assert caught.value.hint == "narrow the GLOB to leave the embedding FLOAT"
    assert written(plan_of(spec, overrides=[Override.parse("lm_head=W4A8_MXFP")])) == {
        "model.embed_tokens": "FLOAT", "lm_head": "W4A8_MXFP"
    }


def test_biases_on_routed_experts_written_mx_are_warned_of():
    # vllm-ascend's MX MoE kernels take no expert bias: a layer served so runs without them
    spec = moe_layer()
    spec["model.layers.0.mlp.experts.1.down_proj.bias"] = ("BF16", (256,))
    spec["model.layers.0.self_attn.q_proj.bias"] = ("BF16", (256,))  # a linear's bias is applied: no warning
    plan = plan_of(spec, scheme="w4a8-mxfp-moe")
    generic = plan.rules.warning
    assert plan.warnings == [
        generic,
        "routed experts carry biases in 1 MoE layer (first: model.layers.0.mlp.experts.1.down_proj.bias), written F32 "
        "beside MX experts: vllm-ascend's MX MoE applies no expert bias, so served so, these layers run without them"
    ]
    floated = plan_of(spec, scheme="w4a8-mxfp-moe", overrides=[Override.parse("*.experts.*=FLOAT")])
    assert floated.warnings == [generic] and plan_of(moe_layer(), scheme="w4a8-mxfp-moe").warnings == [generic]


def test_bias_of_an_mx_layer_becomes_float32():
    spec = fp8("m.o_proj", 256, 256)
    spec["m.o_proj.bias"] = ("BF16", (256,))
    bias = {t.name: t for t in plan_of(spec).tensors}["m.o_proj.bias"]
    assert (bias.dtype, bias.kind, bias.quant_type) == ("F32", "bias_f32", "FLOAT")
    bias = {t.name: t for t in plan_of(spec, overrides=[Override.parse("m.*=FLOAT")]).tensors}["m.o_proj.bias"]
    assert (bias.dtype, bias.kind) == ("BF16", "copy")


def test_description_index_and_model_quant_type():
    plan = plan_of(moe_layer(), scheme="w8a8-mxfp8", max_shard_size=0)
    description = plan.description()
    assert list(description)[-5:] == ["version", "model_quant_type", "metadata", "group_size", "optional"]
    assert description["model_quant_type"] == "W8A8_MXFP8" and description["group_size"] == 32
    assert description["model.layers.0.self_attn.q_proj.weight_scale"] == "W8A8_MXFP8"
    assert description["model.embed_tokens.weight"] == "FLOAT"
    assert plan.index() is None and [s.file for s in plan.shards] == ["quant_model_weights.safetensors"]
    all_float = plan_of(moe_layer(), overrides=[Override.parse("*=FLOAT")])
    assert all_float.model_quant_type == "FLOAT"


def test_shards_cut_before_the_limit_keep_mx_pairs_together_and_number_from_one():
    plan = plan_of(moe_layer(), scheme="w8a8-mxfp8", max_shard_size=70_000)
    assert all(s.nbytes <= 70_000 or len(s.tensors) <= 2 for s in plan.shards)
    n = len(plan.shards)
    assert n > 2 and [s.file for s in plan.shards] == [
        f"quant_model_weights-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)
    ]
    for shard in plan.shards:
        names = [t.name for t in shard.tensors]
        for name in names:
            if name.endswith(".weight_scale"):
                assert name[: -len("_scale")] in names
    index = plan.index()
    assert index["metadata"]["total_size"] == plan.bytes_out
    assert set(index["weight_map"]) == {t.name for t in plan.tensors}
    order = [t.name for s in plan.shards for t in s.tensors]
    assert order == [t.name for t in plan.tensors]


def test_a_tensor_larger_than_the_limit_gets_a_shard_of_its_own():
    spec = {"a": ("U8", (10,)), "big": ("U8", (1000,)), "b": ("U8", (10,))}
    plan = plan_of(spec, max_shard_size=100)
    assert [[t.name for t in s.tensors] for s in plan.shards] == [["a"], ["big"], ["b"]]
    placed, shards = assign_shards([], 100)
    assert placed == [] and len(shards) == 1


def test_files_to_copy_keeps_tokenizer_code_and_templates_but_no_weights():
    names = [
        "config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.model",
        "vocab.tiktoken", "configuration_deepseek.py", "chat_template.jinja", "pytorch_model.bin", ".gitattributes",
        "merges.txt", "preprocessor_config.json",
    ]
    assert files_to_copy(names) == ([
        "chat_template.jinja", "config.json", "configuration_deepseek.py", "merges.txt",
        "preprocessor_config.json", "tokenizer.model", "vocab.tiktoken",
    ], {})


def test_files_to_copy_never_takes_a_name_the_package_writes():
    names = ["config.json", "quant_model_description.json", "ascendconv_provenance.json",
             "quant_model_weights.safetensors.index.json", "quant_model_weights-notes.txt"]
    copied, skipped = files_to_copy(names)
    assert copied == ["config.json"]
    assert sorted(skipped) == sorted(names[1:])
    assert all("writes a file of this name" in why for why in skipped.values())


@pytest.mark.parametrize("text,value", [("0", 0), ("500MB", 500 * 10**6), ("2GiB", 2 * 2**30), ("4gib", 4 * 2**30), ("123", 123)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("bad", ["", "GiB", "-1", "5 parsecs"])
def test_parse_size_refuses(bad):
    with pytest.raises(BadOptionError):
        parse_size(bad)


@pytest.mark.parametrize("bad", ["nothing", "=FLOAT", "*.q_proj=W4A4"])
def test_override_parse_refuses(bad):
    with pytest.raises(BadOptionError):
        Override.parse(bad)


def test_unknown_scheme_and_rule_are_usage_errors():
    with pytest.raises(BadOptionError, match="scheme"):
        plan_of(moe_layer(), scheme="w2a2")
    with pytest.raises(BadOptionError, match="scale rule"):
        plan_of(moe_layer(), scale_rule="ceil")


def test_quant_type_table_is_consistent_with_the_element_formats():
    """The one table verify, plan and inspect read: each MX type's payload stores whole elements
    (8 bits: one E4M3 code, or two E2M1 codes per byte), with one E8M0 scale per 32 values of K."""
    from ascendconv.ascendv1 import MX_TYPES, QUANT_TYPES, quant_type_named
    from ascendconv.formats.constants import E2M1, E4M3, FLOAT, W4A4_MXFP4, W4A8_MXFP, W4A16_MXFP4, W8A8_MXFP8

    assert MX_TYPES == (W8A8_MXFP8, W4A16_MXFP4, W4A8_MXFP, W4A4_MXFP4)
    assert [QUANT_TYPES[t].element for t in (FLOAT, W8A8_MXFP8, W4A8_MXFP, W4A16_MXFP4, W4A4_MXFP4)] == [
        None, E4M3, E2M1, E2M1, E2M1
    ]
    for name in MX_TYPES:
        quant_type = QUANT_TYPES[name]
        assert quant_type.element.bits * quant_type.k_per_byte == 8
        assert quant_type.weight_shape(7168, 2048) == (7168, 2048 // quant_type.k_per_byte)
        assert quant_type.scale_shape(7168, 2048) == (7168, 64)
        assert quant_type.scale_shape(10, 33) == (10, 2)  # a partial last group still has its scale
    assert QUANT_TYPES[W8A8_MXFP8].weight_dtype == "F8_E4M3" and QUANT_TYPES[W4A8_MXFP].weight_dtype == "U8"
    assert QUANT_TYPES[FLOAT].scale_shape(10, 64) is None
    assert quant_type_named(["W8A8_MXFP8"]) is None and quant_type_named("W8A16") is None


# --- figures: what a plan's tensors add up to, counted without making them ----------------------------


def greedy_cuts(units: list[int], limit: int) -> list[int]:
    """The shard rule said plainly: cut before a unit that would take a non-empty shard past the limit."""
    cuts, size, filled = [0], 0, 0
    for i, unit in enumerate(units):
        if filled and size + unit > limit:
            cuts.append(i)
            size, filled = 0, 0
        size += unit
        filled += 1
    return cuts


@given(st.lists(st.integers(0, 40), max_size=60), st.integers(1, 50))
def test_shard_cuts_are_the_greedy_rule(units, limit):
    from ascendconv.plan import shard_cuts

    assert shard_cuts(units, limit) == greedy_cuts(units, limit)



@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 2), st.integers(0, 6)), max_size=20), st.integers(1, 50))
def test_shard_contents_cut_runs_of_units_where_shard_cuts_cuts_them_one_by_one(runs, limit):
    from ascendconv.plan import shard_contents, shard_cuts

    units = [(nbytes, tensors) for nbytes, tensors, count in runs for _ in range(count)]
    cuts = shard_cuts([nbytes for nbytes, _ in units], limit) + [len(units)]
    shards = [units[start:end] for start, end in zip(cuts, cuts[1:])]
    assert shard_contents(runs, limit) == [(sum(t for _, t in shard), sum(b for b, _ in shard)) for shard in shards]

def counted(plan) -> tuple[dict[str, int], int, int]:
    """(tensors per label, bytes, shards) from the plan's own tensors and shards."""
    counts = dict.fromkeys(plan.figures.tensors, 0)
    for tensor in plan.tensors:
        counts[tensor.quant_type] += 1
    return counts, sum(t.nbytes for t in plan.tensors), len(plan.shards)


def module_groups_one_by_one(plan) -> list:
    """Plan.module_groups said plainly: each member's pattern, its types by their first member's name."""
    patterns: dict[str, dict[str, list]] = {}
    for group in plan.groups.values():
        for prefix in group.members:
            slot = patterns.setdefault(module_pattern(prefix), {}).setdefault(group.written, [0, prefix])
            slot[0] += 1
            slot[1] = min(slot[1], prefix)
    return [
        (pattern, [(t, slot[0]) for t, slot in sorted(types.items(), key=lambda item: item[1][1])])
        for pattern, types in sorted(patterns.items())
    ]


def assert_module_groups_are_counted_one_by_one(plan) -> None:
    found = plan.module_groups()
    assert [(pattern, list(types.items())) for pattern, types in found.items()] == module_groups_one_by_one(plan)


def assert_figures_count_the_tensors(plan) -> None:
    assert_module_groups_are_counted_one_by_one(plan)
    rows, conversions = plan.shard_rows(), plan.conversion_counts()  # before the plan is placed
    by_pattern = plan.conversion_groups()
    assert (plan.figures.tensors, plan.figures.bytes_out, plan.figures.shards) == counted(plan)
    assert rows == [(s.file, len(s.tensors), s.nbytes) for s in plan.shards] == plan.shard_rows()
    placed = {"relaid": 0, "requantized": 0}
    for tensor in plan.tensors:
        if tensor.conversion:
            placed[tensor.conversion] += 1
    assert conversions == placed
    placed_by_pattern: dict[str, dict[str, int]] = {}
    for name, conversion in plan.conversions().items():
        placed_by_pattern.setdefault(module_pattern(name), {"relaid": 0, "requantized": 0})[conversion] += 1
    assert by_pattern == dict(sorted(placed_by_pattern.items()))
    assert list(by_pattern) == sorted(by_pattern)
    assert plan.model_quant_type == max({t.quant_type for t in plan.tensors}, key=RANK.__getitem__)
    assert sum(len(s.tensors) for s in plan.shards) == len(plan.tensors)


@pytest.mark.parametrize("max_shard_size", [0, 1, 40_000, 10**12])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_figures_count_what_the_plan_places(scheme, max_shard_size):
    spec = moe_layer(down_k=96)  # a misaligned MoE layer: fallbacks, FLOAT experts under some schemes
    spec["model.layers.0.self_attn.o_proj.bias"] = ("BF16", (256,))
    spec["model.norm.weight"] = ("F32", (256,))
    assert_figures_count_the_tensors(plan_of(spec, scheme=scheme, max_shard_size=max_shard_size))


def test_module_groups_order_a_patterns_types_by_their_first_member_by_name():
    """Routed experts are counted per projection: MoE layers 10 (aligned) and 2 (misaligned down_proj,
    falls back) share patterns of two types, 10's first by name; a shared expert placed with the
    routed ones, and names the rule reads as no routed expert, are counted one by one."""
    spec = {}
    for layer, down_k in ((2, 96), (10, 128)):
        for e in (0, 1, 11):
            spec.update(fp8(f"model.layers.{layer}.mlp.experts.{e}.gate_proj", down_k, 256))
            spec.update(fp8(f"model.layers.{layer}.mlp.experts.{e}.up_proj", down_k, 256))
            spec.update(fp8(f"model.layers.{layer}.mlp.experts.{e}.down_proj", 256, down_k))
        spec.update(fp8(f"model.layers.{layer}.mlp.shared_expert.gate_proj", 128, 256))
    spec.update(fp8("model.layers.3.mlp.experts.x1.gate_proj", 128, 256))  # no expert number
    spec.update(fp8("model.layers.3.mlp.experts.7.gate_proj7", 128, 256))  # no projection the rule knows
    for scheme in SCHEMES:
        for deployment in (Deployment(), Deployment(shared_experts_as_routed=True)):
            plan = plan_of(spec, scheme=scheme, deployment=deployment)
            assert_module_groups_are_counted_one_by_one(plan)
    plan = plan_of(spec, scheme="w4a8-mxfp-moe")
    assert list(plan.module_groups()["model.layers.*.mlp.experts.*.down_proj"]) == ["W4A8_MXFP", "FLOAT"]


def test_figures_count_what_a_full_scale_plan_places(tmp_path):
    """DeepSeek-V3 as published (163 shards, MTP layer, kv_b_proj FLOAT), every scheme, at --tp 16
    (fallbacks) and with --ep."""
    from fullscale import FAMILIES, write_sparse_checkpoint

    from ascendconv.decide import Deployment
    from ascendconv.plan import Planner
    from ascendconv.sources import Source

    source = Source.open(write_sparse_checkpoint(FAMILIES["deepseek-v3"](), tmp_path / "ds"))
    for deployment in (Deployment(tp=16), Deployment(tp=16, ep=True)):
        planner = Planner.for_source(source, deployment)
        for scheme in SCHEMES:
            assert_figures_count_the_tensors(planner.plan(scheme))


_PAIRING_FAULTS = {  # name -> edit of a spec of three well-formed linears (sfx: the spelling's scale suffix)
    "none": lambda spec, sfx: None,
    "scale missing": lambda spec, sfx: spec.pop("m.1.q" + sfx, None),
    "scale F16": lambda spec, sfx: spec.update({"m.2.q" + sfx: ("F16", (2, 2))}),
    "scale shape": lambda spec, sfx: spec.update({"m.1.q" + sfx: ("F32", (9, 9))}),
    "weight E5M2": lambda spec, sfx: spec.update({"m.0.q.weight": ("F8_E5M2", (256, 256))}),
    "weight 3-D": lambda spec, sfx: spec.update({"m.2.q.weight": ("F8_E4M3", (2, 128, 256))}),
    "orphan scale": lambda spec, sfx: spec.update({"m.9.q" + sfx: ("F32", (1, 1))}),
    "scale of a BF16 weight": lambda spec, sfx: spec.update({"m.9.q.weight": ("BF16", (8, 8)), "m.9.q" + sfx: ("F32", (1, 1))}),
    "an FP8 scale": lambda spec, sfx: spec.update({"m.9.q" + sfx: ("F8_E4M3", (1, 1))}),
    "FP8 not a weight": lambda spec, sfx: spec.update({"m.9.q.qweight": ("F8_E4M3", (8, 8))}),
    "per-tensor scale": lambda spec, sfx: (spec.pop("m.1.q" + sfx, None), spec.update({"m.1.q.weight_scale": ("F32", (1,))})),
    "per-tensor scale F16": lambda spec, sfx: (spec.pop("m.1.q" + sfx, None), spec.update({"m.1.q.weight_scale": ("F16", ())})),
    "per-tensor scale of two": lambda spec, sfx: (spec.pop("m.1.q" + sfx, None), spec.update({"m.1.q.weight_scale": ("F32", (2,))})),
    "a bias": lambda spec, sfx: spec.update({"m.2.q.bias": ("BF16", (256,))}),
    "a bias of the linear a per-tensor scale may take": lambda spec, sfx: spec.update({"m.1.q.bias": ("BF16", (256,))}),
    "an FP8 bias": lambda spec, sfx: spec.update({"m.0.q.bias": ("F8_E4M3", (256,))}),
    "a stray bias": lambda spec, sfx: spec.update({"m.8.bias": ("BF16", (4,))}),
}


@given(st.lists(st.sampled_from(sorted(_PAIRING_FAULTS)), max_size=3), st.sampled_from([".weight_scale_inv", ".scale"]), st.randoms())
def test_pairing_without_faults_pairs_as_tensor_by_tensor_and_leaves_faults_to_it(faults, suffix, random):
    """pair_fp8_linears' short path pairs what the tensor-by-tensor one pairs, in any source order,
    and leaves every fault to it: the same linears, or the same named error (the first in order)."""
    from ascendconv.sources.hf_fp8_block import _pair_naming_faults

    spec = {}
    for i in range(3):
        spec.update({f"m.{i}.q.weight": ("F8_E4M3", (256, 256)), f"m.{i}.q{suffix}": ("F32", (2, 2))})
    for fault in faults:
        _PAIRING_FAULTS[fault](spec, suffix)
    names = list(spec)
    random.shuffle(names)
    tensors = entries({name: spec[name] for name in names})

    def outcome(pair):
        try:
            return pair(tensors, BLOCK, suffix, ("F32", "BF16"), "weight_block_size")
        except Exception as exc:  # noqa: BLE001 - which error, and what it says, is what is compared
            return type(exc).__name__, str(exc)

    assert outcome(pair_fp8_linears) == outcome(_pair_naming_faults)


def test_a_plan_and_its_planner_are_freed_by_reference_counting():
    """A plan refers to its groups, not to itself: with the collector off (as every header-only command
    and the planner run) the last reference to a placed plan frees its tensors at once. A plan in a
    cycle stayed until a full collection: the family tests peaked at 10.5 GB of such plans."""
    import gc
    import weakref

    from ascendconv.decide import Deployment
    from ascendconv.plan import Planner
    from ascendconv.sources import open_source

    source = open_source(Path(__file__).parent.parent / "fixtures" / "qwen3-moe-fp8")
    enabled = gc.isenabled()
    gc.disable()
    try:
        planner = Planner.for_source(source, Deployment())
        plan = planner.plan("w4a8-mxfp-moe")
        assert plan.tensors and plan.shard_rows() and plan.decisions
        refs = [weakref.ref(planner), weakref.ref(plan)]
        del planner, plan
        assert [ref() is None for ref in refs] == [True, True]
    finally:
        if enabled:
            gc.enable()
