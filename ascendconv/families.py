"""The model families ascendconv knows, one entry each: pure data, no I/O.

vllm-ascend decides how it loads an AscendV1 package per `model_type`: its packed-module table
(which modules it looks up as one fused module, so they must share a type), its prefix and
substring aliases, its unquantized-layer rules and the model files of vLLM and vllm-ascend. An entry
here is that knowledge written for the converter: where the decoder's layers live (roots), how
routed and shared experts are spelled, the packed groups, how tensor parallelism splits each linear,
where the multi-token-prediction (MTP) layers are, the indexers, which modules stay FLOAT and why,
the tensors the runtime needs and a release lacks (`mtp_heads`), and what `inspect` says about the
runtime. The source of each rule is the comment beside it. docs/families.md is the same table for
people.

A new family is one entry here plus its full-scale header-only copy in the tests, never a branch
elsewhere; `models.rules_for` turns an entry and a config.json into the rules the planner applies.
"""

from __future__ import annotations

from dataclasses import dataclass

Roles = tuple[str, str, str]  # a routed / shared expert's projections as (gate, up, down)
Packed = tuple[tuple[str, ...], str]  # (member module names, the fused name the runtime looks up)

# Projection spellings of an expert, as (gate, up, down): the down projection is the row-parallel
# one (K is the expert's intermediate size).
GATE_UP_DOWN: Roles = ("gate_proj", "up_proj", "down_proj")
W1_W3_W2: Roles = ("w1", "w3", "w2")  # Mixtral / MiniMax / DeepSeek-native: w1 gate, w3 up, w2 down

# Packed groups, as vllm-ascend's packed-module table lists them (it looks a fused module's type up
# through each member and refuses the model when the members disagree).
QKV: Packed = (("q_proj", "k_proj", "v_proj"), "qkv_proj")
GATE_UP: Packed = (("gate_proj", "up_proj"), "gate_up_proj")
MLA_QKV_A: Packed = (("q_a_proj", "kv_a_proj_with_mqa"), "fused_qkv_a_proj")  # MLA's two down projections
# Qwen3.5's gated DeltaNet: vLLM builds in_proj_qkv + in_proj_z as one merged column-parallel linear
# and in_proj_b + in_proj_a as another (its GDN layer's create_qkvz_proj / create_ba_proj); a type
# that differs between the halves fails the load ("Not all shards of ... in_proj_qkvz ...").
GDN_QKVZ: Packed = (("in_proj_qkv", "in_proj_z"), "in_proj_qkvz")
GDN_BA: Packed = (("in_proj_b", "in_proj_a"), "in_proj_ba")
# MiniMax-M3's sparse attention: vllm-ascend fuses index_q_proj + index_k_proj into indexer_proj
# (into qkv_proj as well when all five share one type) and raises "index_q/index_k quantization
# types differ" otherwise.
INDEX_QK: Packed = (("index_q_proj", "index_k_proj"), "indexer_proj")
# DeepSeek-V4 keeps native names: vllm-ascend's V4 model fuses the shared expert's w1 + w3 into
# gate_up_proj (its loader renames w1 -> gate_proj, w3 -> up_proj, then stacks them).
NATIVE_W1_W3: Packed = (("w1", "w3"), "gate_up_proj")
# Qwen2.5-Omni / Qwen3-Omni: the audio and vision towers' attention (packed by vllm-ascend too).
OMNI_ATTN_QKV: Packed = (("attn_q_proj", "attn_k_proj", "attn_v_proj"), "attn_qkv_proj")
OMNI_QKV: Packed = (("q", "k", "v"), "qkv")
# Bailing-hybrid (Ring / Ling linear): vllm-ascend looks o_proj up under the checkpoint's "dense".
BAILING_DENSE: Packed = (("dense",), "o_proj")

# How vLLM splits a linear over T tensor-parallel ranks, by the ending of its module name: 'row'
# splits K (each type's K rule then applies to K/T), 'column' splits N, 'replicated' splits nothing.
# The longest matching ending wins.
HF_TP: tuple[tuple[str, str], ...] = (
    *((name, "row") for name in ("o_proj", "down_proj", "w2", "out_proj")),
    *((name, "column") for name in (
        "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "w1", "w3", "q_b_proj", "kv_b_proj",
        "in_proj_qkvz", "in_proj_ba",
    )),
    # MLA's q_a / kv_a (fused_qkv_a_proj) and the DeepSeek-V3.2 / GLM-5 indexer's projections are
    # ReplicatedLinear in vLLM
    *((name, "replicated") for name in ("q_a_proj", "kv_a_proj_with_mqa", "indexer.wq_b", "indexer.wk")),
)  # fmt: skip
# Qwen3.5's GDN members before vLLM merges them: column-parallel, like their fused modules.
GDN_TP = tuple((name, "column") for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"))
# MiniMax-M3: index_q follows the KV heads' split; index_k is replicated on every rank (vllm-ascend's
# M3 indexer linear loads the one index_k shard on each rank).
M3_TP = (("index_q_proj", "column"), ("index_k_proj", "replicated"))
# Bailing-hybrid's attention output "dense" is its o_proj.
BAILING_TP = (("dense", "row"),)
# DeepSeek-V4 as vllm-ascend's V4 attention builds it: wq_a and wkv replicated, wq_b and wo_a
# column-parallel, wo_b row-parallel (K = o_groups x o_lora_rank); the indexer's wq_b and the
# compressor replicated; routed and shared experts w1 / w3 column, w2 row; the MTP e_proj / h_proj
# replicated.
DS_V4_TP: tuple[tuple[str, str], ...] = (
    ("attn.wq_a", "replicated"), ("attn.wkv", "replicated"), ("attn.wq_b", "column"), ("attn.wo_a", "column"),
    ("attn.wo_b", "row"), ("indexer.wq_b", "replicated"), ("compressor.wkv", "replicated"),
    ("compressor.wgate", "replicated"), ("w1", "column"), ("w3", "column"), ("w2", "row"),
    ("e_proj", "replicated"), ("h_proj", "replicated"),
)  # fmt: skip

# Why a module stays FLOAT by default (the package then holds its BF16-resolved weight).
# vllm-ascend's MLA splits kv_b_proj into the absorbed W_UK / W_UV matrices at load, from a float
# weight (the AscendV1 contract, section 3).
KV_B_REASON = "kv_b_proj stays FLOAT (vllm-ascend absorbs it into MLA attention)"
# vLLM's DeepSeek-V3.2 indexer fuses wk with the BF16 weights_proj into one projection built without
# a quant config; its loader can only upcast an FP8 wk that has a block scale (weight_scale_inv).
INDEXER_WK_REASON = "indexer.wk stays FLOAT (vLLM fuses it with the BF16 weights_proj, unquantized)"
# vllm-ascend runs the DeepSeek MTP layer unquantized (its MTP support note: the layer stays
# bfloat16 and is described FLOAT; its packed-module table: "the MTP layer of deepseek on the NPU is
# not quantized"); msModelSlim likewise leaves MTP layers unquantized by default. Qwen3-Next's and
# Qwen3.5's mtp.* get the same rule (no public source says how vllm-ascend loads a quantized one; a
# quantized Qwen3.5 MoE MTP layer would be looked up under a model_type the table lacks), and so does
# DeepSeek-V4's mtp.0.*, whose e_proj / h_proj the V4 drafter builds with an empty prefix: their
# lookup finds "some FLOAT weight" and runs them unquantized whatever the package holds.
MTP_REASON = "MTP layer stays FLOAT (vllm-ascend runs the MTP draft layer unquantized)"
# Input embeddings: vLLM looks their rows up (VocabParallelEmbedding's quant_method.embedding), and
# vllm-ascend's quantized embedding method is its linear method (a matmul, no lookup), so a package
# whose embedding is MX does not run; a release that stores it FP8 gets its resolved BF16 weight. The
# module's last name, in each spelling (HF embed_tokens, DeepSeek-V4's top-level embed, GPT-2's wte,
# Bloom / ChatGLM's word_embeddings, InternLM's tok_embeddings).
EMBEDDING_NAMES = ("embed_tokens", "embed", "wte", "word_embeddings", "tok_embeddings")
EMBEDDING_REASON = "the input embedding stays FLOAT (vLLM looks its rows up; vllm-ascend has no MX embedding lookup)"
# Vision (and audio) towers: every release keeps them BF16 (Qwen3.5's modules_to_not_convert lists
# each vision linear; MiniMax-M3's tower, projector and patch merger are BF16), and vllm-ascend's
# description aliases for them map names, not types: the package keeps them as the release has them.
VISION_REASON = "vision / audio tower stays FLOAT (the release and vllm-ascend run it unquantized)"

# What the runtime needs and the release lacks: the MTP drafter's own LM head. Both drafters build
# it as a quantizable ParallelLMHead at construction, before the target's head is shared with them,
# so the description must name it; the copy is the model's lm_head weight, as the runtime documents.
# GLM-5.x: vLLM's DeepSeek MTP model (vllm-ascend's GLM drafter) names it
# model.layers.{n}.shared_head.head; the GLM-5 releases store none (unlike DeepSeek-V3.2), so the
# lookup raises KeyError while the target loads; vllm-ascend's GLM-5 tutorial has users copy
# lm_head.weight there by hand.
GLM_MTP_HEAD_REASON = (
    "the MTP drafter's shared_head.head (vLLM's DeepSeek MTP model builds it; the GLM-5 release has none): "
    "a FLOAT copy of lm_head"
)
# DeepSeek-V4: vllm-ascend's V4 drafter names its head mtp.0.head and renames the checkpoint's
# head.weight to it only under its own deepseek_v4_fp8 quantization; under an AscendV1 package the
# lookup needs mtp.0.head.weight. V4-Flash ships none (TensorRT-LLM's V4 loader: "Flash omits this
# key entirely"); whether Flash-Base does is disputed, so it is added only where the source lacks it.
DS_V4_MTP_HEAD_REASON = (
    "the MTP drafter's head (vllm-ascend's DeepSeek-V4 drafter looks up mtp.0.head; the release has none): "
    "a FLOAT copy of head"
)
# With tie_word_embeddings the output head is the input embedding (the release stores no lm_head /
# head.weight), so the drafter's head is a copy of the embedding.
GLM_MTP_TIED_HEAD_REASON = (
    "the MTP drafter's shared_head.head (vLLM's DeepSeek MTP model builds it; the GLM-5 release has none): "
    "a FLOAT copy of embed_tokens, the output head of a model with tied embeddings"
)
DS_V4_MTP_TIED_HEAD_REASON = (
    "the MTP drafter's head (vllm-ascend's DeepSeek-V4 drafter looks up mtp.0.head; the release has none): "
    "a FLOAT copy of embed, the output head of a model with tied embeddings"
)


@dataclass(frozen=True)
class HeadCopy:
    """A FLOAT tensor the package adds: a copy of the source tensor `source` (plan.added_tensor), named `target`.
    `{n}` in `target` stands for each MTP layer's number (DeepSeek / GLM number them after the
    decoder layers). Added only where the source has `source` and lacks `target`; where config.json
    sets tie_word_embeddings, a source without `source` has `tied_source` (the input embedding) copied
    instead, for `tied_reason`."""

    target: str
    source: str
    reason: str
    tied_source: str | None = None
    tied_reason: str | None = None


@dataclass(frozen=True)
class Family:
    """The static knowledge of one model_type (or a few that load alike)."""

    model_types: tuple[str, ...]
    label: str
    expert_projections: tuple[Roles, ...] = ()  # routed experts: <block>.experts.E.<proj>
    packed: tuple[Packed, ...] = ()
    roots: tuple[str, ...] = ("model.",)  # where `layers.N.` live ("": DeepSeek-native names)
    shared_expert_names: tuple[str, ...] = ()  # the shared expert's module name under the MoE block
    tp: tuple[tuple[str, str], ...] = HF_TP  # (ending of the module name, row | column | replicated)
    float_rules: tuple[tuple[str, str], ...] = ()  # (ending of the module name, reason)
    float_roots: tuple[str, ...] = ()  # module-name prefixes kept FLOAT for VISION_REASON
    # MTP layers: under this top-level prefix ("mtp."), else (DeepSeek, GLM) the config's
    # num_nextn_predict_layers layers numbered from num_hidden_layers under each root
    mtp_prefix: str | None = None
    # the tensors only an MTP layer numbered after the decoder holds (DeepSeek / GLM: the embedding /
    # hidden-state projection eh_proj and its norm enorm): a layer from num_hidden_layers on that holds
    # one is an MTP layer even where num_nextn_predict_layers does not count it
    mtp_markers: tuple[str, ...] = ("eh_proj", "enorm")
    mtp_heads: tuple[HeadCopy, ...] = ()
    indexer: str | None = None  # the attention indexer's module name (V3.2 / GLM-5 / V4: "indexer")
    mla: bool = False  # MLA attention (the fused MLA prolog note in inspect)
    runtime_notes: tuple[str, ...] = ()  # what inspect says about running this family on vllm-ascend
    # (source spelling, package spelling) of a module-name infix: the package names a tensor as
    # vllm-ascend's description lookup does, whichever of vLLM's spellings the upload used
    module_renames: tuple[tuple[str, str], ...] = ()


def _mla(*model_types: str, label: str, indexer: bool = False, **extra) -> Family:
    """A DeepSeek-V2/V3-like family: MLA attention, gate/up/down experts, shared_experts, MTP layers
    numbered after the decoder. vllm-ascend's table packs gate_up_proj and fused_qkv_a_proj."""
    floats = ((".kv_b_proj", KV_B_REASON),) + (((".indexer.wk", INDEXER_WK_REASON),) if indexer else ())
    fields = dict(
        expert_projections=(GATE_UP_DOWN,),
        packed=(GATE_UP, MLA_QKV_A),
        shared_expert_names=("shared_experts",),
        float_rules=floats,
        indexer="indexer" if indexer else None,
        mla=True,
    )
    return Family(model_types, label, **{**fields, **extra})


def _gqa(*model_types: str, label: str, moe: bool = True, **extra) -> Family:
    """A Llama-like family: q/k/v and gate/up packed; gate/up/down experts when it is a MoE."""
    fields = dict(expert_projections=(GATE_UP_DOWN,) if moe else (), packed=(QKV, GATE_UP))
    return Family(model_types, label, **{**fields, **extra})


QWEN_VL_ROOTS = ("model.language_model.", "model.", "language_model.model.")  # new and old transformers layouts
QWEN_VISION = ("model.visual.", "visual.")
QWEN3_5_NOTES = (
    "the MTP drafter shares the target's lm_head (vllm-ascend aliases the drafter's lm_head to "
    "language_model.lm_head): nothing to add",
)
GEMMA4_EXPERTS_NOTE = (
    "routed experts a checkpoint stores under '<layer>.moe.experts.' (vLLM's spelling) are written under "
    "'<layer>.experts.': vllm-ascend strips '.moe' before it looks them up in the description, and "
    "vLLM's Gemma 4 weight loader adds it back"
)
GLM_MTP_HEADS = (
    HeadCopy(
        "model.layers.{n}.shared_head.head.weight", "lm_head.weight", GLM_MTP_HEAD_REASON,
        "model.embed_tokens.weight", GLM_MTP_TIED_HEAD_REASON,
    ),
)  # fmt: skip
DS_V4_MTP_HEADS = (
    HeadCopy("mtp.0.head.weight", "head.weight", DS_V4_MTP_HEAD_REASON, "embed.weight", DS_V4_MTP_TIED_HEAD_REASON),
)

FAMILIES: tuple[Family, ...] = (
    # DeepSeek-V3 / R1 / V3.1: MLA, routed + shared experts, MTP layer(s) after the decoder layers.
    _mla("deepseek_v3", label="DeepSeek-V3 / R1 / V3.1"),
    _mla("deepseek_v2", label="DeepSeek-V2"),
    # DeepSeek-V3.2-Exp adds the lightning indexer (self_attn.indexer.{wq_b,wk,k_norm,weights_proj}).
    _mla("deepseek_v32", label="DeepSeek-V3.2-Exp", indexer=True),
    # Kimi-K2's config says model_type kimi_k2 and loads as DeepseekV3ForCausalLM (no MTP tensors).
    _mla("kimi_k2", label="Kimi-K2"),
    # openPangu Ultra MoE and LongCat-Flash load through vLLM's DeepSeek-V2 code paths in vllm-ascend's
    # table (gate_up, fused_qkv_a, per-expert experts); GLM-4.7-Flash (glm4_moe_lite) is MLA as well.
    _mla("pangu_ultra_moe", label="openPangu Ultra MoE"),
    _mla("longcat_flash", label="LongCat-Flash"),
    _mla("glm4_moe_lite", label="GLM-4.7-Flash (glm4_moe_lite)"),
    # The MTP draft models' own model_types in vllm-ascend's table: DeepSeek's packs gate_up only.
    _mla("pangu_ultra_moe_mtp", label="openPangu Ultra MoE MTP draft"),
    _mla("deepseek_mtp", label="DeepSeek MTP draft", packed=(GATE_UP,)),
    # GLM-5 / 5.1 (glm_moe_dsa): vLLM's GlmMoeDsaForCausalLM subclasses DeepSeek-V2 with the V3.2
    # indexer, so the DeepSeek-V3.2 rules hold; MTP layer 78 lacks its shared_head.head.
    _mla(
        "glm_moe_dsa",
        label="GLM-5 / 5.1",
        indexer=True,
        mtp_heads=GLM_MTP_HEADS,
    ),
    # Bailing-hybrid (Ring / Ling 2.5 linear): MLA plus linear attention; vllm-ascend renames
    # linear_attn / self_attn to attention and looks o_proj up as "dense".
    _mla(
        "bailing_hybrid",
        label="Bailing-hybrid (Ring / Ling linear)",
        packed=(GATE_UP, MLA_QKV_A, BAILING_DENSE),
        tp=HF_TP + BAILING_TP,
    ),
    _gqa("qwen3", label="Qwen3 (dense)", moe=False),
    _gqa("qwen3_moe", label="Qwen3-MoE"),
    # Qwen3-Next: gated DeltaNet linear attention (linear_attn.in_proj_qkvz / in_proj_ba / out_proj),
    # one shared expert per layer (mlp.shared_expert), MTP modules under the top-level "mtp." prefix.
    # vllm-ascend's table also has in_proj = (in_proj_qkvz, in_proj_ba), for a vLLM build that merges
    # both into one linear; the release keeps in_proj_ba BF16 and vLLM's Qwen3-Next builds the two
    # apart, so that group is not applied (docs/families.md, "Packed groups").
    _gqa("qwen3_next", label="Qwen3-Next", shared_expert_names=("shared_expert",), mtp_prefix="mtp."),
    # Qwen3.5 / 3.6 / 3.8 (qwen3_5 dense, qwen3_5_moe): the vision-language wrapper puts the decoder
    # under model.language_model., the vision tower under model.visual., MTP under mtp.; the gated
    # DeltaNet halves are stored apart (in_proj_qkv / in_proj_z / in_proj_b / in_proj_a) and packed.
    _gqa(
        "qwen3_5",
        label="Qwen3.5 / 3.8 (dense)",
        moe=False,
        packed=(QKV, GATE_UP, GDN_QKVZ, GDN_BA),
        roots=QWEN_VL_ROOTS,
        tp=HF_TP + GDN_TP,
        float_roots=QWEN_VISION,
        mtp_prefix="mtp.",
        runtime_notes=QWEN3_5_NOTES,
    ),
    _gqa(
        "qwen3_5_moe",
        label="Qwen3.5 / 3.6 MoE",
        packed=(QKV, GATE_UP, GDN_QKVZ, GDN_BA),
        roots=QWEN_VL_ROOTS,
        shared_expert_names=("shared_expert",),
        tp=HF_TP + GDN_TP,
        float_roots=QWEN_VISION,
        mtp_prefix="mtp.",
        runtime_notes=QWEN3_5_NOTES,
    ),
    _gqa("qwen2_5_vl", label="Qwen2.5-VL", moe=False, roots=QWEN_VL_ROOTS, float_roots=QWEN_VISION),
    _gqa("qwen3_vl_moe", label="Qwen3-VL MoE", roots=QWEN_VL_ROOTS, float_roots=QWEN_VISION),
    # Qwen3-Omni / Qwen2.5-Omni: the thinker holds the language model; audio and vision towers FLOAT.
    _gqa(
        "qwen3_omni_moe",
        label="Qwen3-Omni MoE",
        packed=(QKV, OMNI_ATTN_QKV, GATE_UP),
        roots=("thinker.model.", "model."),
        float_roots=("thinker.visual.", "thinker.audio_tower.", "visual.", "audio_tower."),
    ),
    _gqa(
        "qwen2_5_omni",
        label="Qwen2.5-Omni",
        moe=False,
        packed=(QKV, OMNI_ATTN_QKV, OMNI_QKV, GATE_UP),
        roots=("thinker.model.", "model."),
        float_roots=("thinker.visual.", "thinker.audio_tower.", "visual.", "audio_tower."),
    ),
    # GLM-4.5 / 4.6 (glm4_moe) and GLM-4.5V (glm4v_moe): GQA with shared experts, MTP layer after the
    # decoder layers.
    _gqa("glm4_moe", label="GLM-4.5 / 4.6", shared_expert_names=("shared_experts",)),
    _gqa(
        "glm4v_moe", "glm4v_moe_text",
        label="GLM-4.5V / 4.6V",
        shared_expert_names=("shared_experts",),
        roots=QWEN_VL_ROOTS,
        float_roots=QWEN_VISION,
    ),  # fmt: skip
    # Gemma 4: vLLM's module tree holds the experts under "<layer>.moe.experts", and uploads made from
    # it (vLLM-fused MXFP4, llm-compressor's per-expert linears) store that spelling; vllm-ascend
    # strips ".moe" before it looks a module up in the description, and vLLM's weight mapper adds it
    # to "<layer>.experts.E." names, so the package spells "<layer>.experts" (both read it).
    _gqa(
        "gemma4", "gemma4_text",
        label="Gemma 4",
        roots=QWEN_VL_ROOTS,
        float_roots=("model.vision_tower.",),
        module_renames=((".moe.experts.", ".experts."),),
        runtime_notes=(GEMMA4_EXPERTS_NOTE,),
    ),  # fmt: skip
    # Step-3.5 and its MTP draft (the draft nests its block under ".mtp_block.", which vllm-ascend
    # strips before the lookup).
    _gqa("step3p5", label="Step-3.5"),
    _gqa("step3p5_mtp", label="Step-3.5 MTP draft"),
    # MiniMax-M2: routed experts block_sparse_moe.experts.N.{w1,w3,w2}; vllm-ascend maps the "mlp"
    # prefix to "block_sparse_moe" and packs experts as w1/w3/w2.
    Family(("minimax_m2",), "MiniMax-M2", expert_projections=(W1_W3_W2,), packed=(QKV,)),
    # MiniMax-M3 (minimax_m3_vl, text minimax_m3): the language model under language_model.model.
    # (vllm-ascend's M3 mapper accepts model.language_model. too), w1/w3/w2 routed experts,
    # shared_experts with gate/up/down (fused gate_up_proj), sparse attention's index projections.
    Family(
        ("minimax_m3", "minimax_m3_vl"),
        "MiniMax-M3",
        expert_projections=(W1_W3_W2,),
        packed=(QKV, GATE_UP, INDEX_QK),
        roots=("language_model.model.", "model.language_model.", "model."),
        shared_expert_names=("shared_experts",),
        tp=HF_TP + M3_TP,
        float_roots=("vision_tower.", "model.vision_tower.", "multi_modal_projector.", "patch_merge_mlp."),
        indexer="index_q_proj",
        runtime_notes=(
            "sparse layers: index_q_proj and index_k_proj share one type (vllm-ascend fuses them into "
            "qkv_proj when q/k/v have that type too, else into indexer_proj)",
        ),
    ),
    # Kimi-K3 (kimi_k3, text model kimi_linear): the language model under language_model.model.,
    # latent-MoE layers block_sparse_moe with routed experts experts.N.{w1,w3,w2} and shared_experts
    # gate/up/down, gated MLA and KDA linear attention. The release quantizes only the routed experts
    # (compressed-tensors MXFP4); vllm-ascend runs them as W4A8_MXFP, reading K3's compressed-tensors
    # metadata or a ModelSlim description alike (its K3 MegaMoe work). Its packed-module table has no
    # kimi_k3 entry; the groups here are the Kimi-Linear model's fused q/k/v and gate/up (sglang's
    # packed mapping for it), which no linear of the release's package belongs to.
    Family(
        ("kimi_k3",),
        "Kimi-K3",
        expert_projections=(W1_W3_W2,),
        packed=(QKV, GATE_UP),
        roots=("language_model.model.", "model."),
        shared_expert_names=("shared_experts",),
        float_rules=((".kv_b_proj", KV_B_REASON),),
        float_roots=("vision_tower.", "mm_projector."),
    ),
    # DeepSeek-V4 (deepseek_v4): DeepSeek-native names without a root prefix (layers.L.attn.*,
    # layers.L.ffn.experts.E.w{1,2,3}, ffn.shared_experts.w{1,2,3}, mtp.0.*), compressor and indexer.
    # The package keeps these names in its weights and description: vllm-ascend's V4 loader renames
    # weights itself, and its description aliases (model. prefix, attn -> self_attn, ffn -> mlp,
    # w1 -> gate_proj, ...) apply only when the description holds the native hc_head_fn
    # (docs/families.md, "DeepSeek-V4 names"). A copy re-saved under HF spellings (gate/up/down_proj,
    # which the V4 loader and vllm-ascend's table also take) follows the same rules.
    Family(
        ("deepseek_v4",),
        "DeepSeek-V4",
        expert_projections=(W1_W3_W2, GATE_UP_DOWN),
        packed=(NATIVE_W1_W3, GATE_UP),
        roots=("",),
        shared_expert_names=("shared_experts",),
        tp=DS_V4_TP,
        mtp_prefix="mtp.",
        mtp_heads=DS_V4_MTP_HEADS,
        indexer="indexer",
        runtime_notes=(
            "weights and description keep DeepSeek-native names; the description's hc_head_fn entry turns on "
            "vllm-ascend's aliases for them",
        ),
    ),
)

# Unknown model types: every naming above at once, so any experts.N.<proj> is a routed expert and
# every known packed set stays packed; MLA's kv_b_proj and the indexer's wk keep their FLOAT rule.
GENERIC = Family(
    (),
    "generic",
    expert_projections=(GATE_UP_DOWN, W1_W3_W2),
    packed=(QKV, GATE_UP, MLA_QKV_A, GDN_QKVZ, GDN_BA, INDEX_QK),
    roots=("model.", "model.language_model.", "language_model.model."),
    shared_expert_names=("shared_experts", "shared_expert"),
    tp=HF_TP + GDN_TP + M3_TP,
    float_rules=((".kv_b_proj", KV_B_REASON), (".indexer.wk", INDEXER_WK_REASON)),
    mtp_prefix="mtp.",
    indexer="indexer",
)
