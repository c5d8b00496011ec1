"""Every FP8 spelling behind the source seam: the same weights written as compressed-tensors FP8 or
DeepSeek-V4's native layout convert to the bytes of the Hugging Face block-FP8 package; per-channel
and per-tensor tiles match the numpy reference; each malformed variant fails with a named error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.convert import ConvertOptions, convert
from ascendconv.errors import (
    ConfigError,
    MissingScaleError,
    OrphanScaleError,
    ScaleDtypeError,
    ScaleShapeError,
    StaticActivationError,
    UnsupportedSourceError,
    UnsupportedTensorError,
)
from ascendconv.formats import requantize, resolve
from ascendconv.formats.constants import E2M1, E4M3
from ascendconv.inspect import inspect_path
from ascendconv.sources import FORMAT_NAMES, open_source
from ascendconv.verify import VerifyOptions, verify
from conftest import FIXTURES, as_array, load_shard, save_shard

runner = CliRunner()
DENSE, MOE, DEEPSEEK = "qwen3-dense-fp8", "qwen3-moe-fp8", "deepseek-v3-fp8"


def respell(src: Path, dst: Path, tensor, config) -> Path:
    """A copy of checkpoint `src` at `dst` whose every tensor is passed through `tensor(name, entry)`
    (-> {name: entry}, entry = (dtype, shape, bytes)) and whose config.json through `config`."""
    shutil.copytree(src, dst)
    renamed: dict[str, str] = {}
    for shard in sorted(dst.glob("*.safetensors")):
        out = {}
        for name, entry in load_shard(shard).items():
            for new_name, new_entry in tensor(name, entry).items():
                out[new_name] = new_entry
                renamed[new_name] = shard.name
        save_shard(shard, out)
    index = dst / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"] = dict(sorted(renamed.items()))
        index.write_text(json.dumps(data))
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(config(cfg)))
    return dst


def ct_config(block=(128, 128), ignore=(), strategy="block", **weights) -> dict:
    args = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False, **weights}
    if strategy == "block":
        args["block_structure"] = list(block)
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": args,
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128, "dynamic": True},
        }},
        "ignore": list(ignore),
    }


def as_ct(src: Path, dst: Path, **config) -> Path:
    """`src` as llm-compressor writes FP8-block: `weight_scale` for `weight_scale_inv`, config_groups."""
    quant = json.loads((src / "config.json").read_text())["quantization_config"]
    ignore = [*quant.get("modules_to_not_convert", []), "re:.*\\.mlp\\.gate$"]

    def tensor(name, entry):
        return {name.replace(".weight_scale_inv", ".weight_scale"): entry}

    return respell(src, dst, tensor, lambda c: {**c, "quantization_config": ct_config(ignore=ignore, **config)})


def refused_with(src: Path, error, message: str, hint: str) -> None:
    """Opening `src` raises `error` with exactly `message`, and `hint` in its hint."""
    with pytest.raises(error) as caught:
        open_source(src)
    assert caught.value.message == message
    assert hint in caught.value.hint


def package_bytes(root: Path) -> dict[str, bytes]:
    """Every file of a package but the provenance and the model card (which name the source and its format)."""
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.name not in ("ascendconv_provenance.json", "README.md")}


@pytest.mark.parametrize("fixture", [DENSE, MOE, DEEPSEEK])
@pytest.mark.parametrize("scheme", ["w8a8-mxfp8", "w4a8-mxfp-moe"])
def test_compressed_tensors_fp8_block_gives_the_block_fp8_package(converted, tmp_path, fixture, scheme):
    src = as_ct(FIXTURES / fixture, tmp_path / "ct")
    source = open_source(src)
    assert source.format == "ct-fp8" and set(source.linears) == set(open_source(FIXTURES / fixture).linears)
    out = tmp_path / "out"
    convert(src, out, ConvertOptions(scheme=scheme))
    assert package_bytes(out) == package_bytes(converted(fixture, scheme))
    provenance = json.loads((out / "ascendconv_provenance.json").read_text())
    assert provenance["source"]["format"] == "ct-fp8"
    assert provenance["source"]["params"] == {"strategies": ["block"], "block_structures": [[128, 128]]}
    report = verify(out, VerifyOptions(source=src))
    assert report.ok, [c.to_dict() for c in report.checks if not c.ok]


def test_inspect_names_the_source_format(tmp_path):
    src = as_ct(FIXTURES / DENSE, tmp_path / "ct")
    result = runner.invoke(app, ["inspect", str(src), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    quant = data["quantization"]
    assert data["kind"] == "source"  # `hf-block-fp8` stays the kind of that one format
    assert quant["format"] == "ct-fp8" and quant["quant_method"] == "compressed-tensors"
    assert quant["weight_block_size"] == [128, 128] and quant["scale_dtypes"] == {"BF16": 14}
    human = runner.invoke(app, ["inspect", str(src)])
    assert human.stdout.splitlines()[0] == "ct  compressed-tensors FP8 (float-quantized) checkpoint"
    hf = inspect_path(FIXTURES / DENSE)
    assert (hf.kind, hf.quantization["format"], hf.label) == ("hf-block-fp8", "hf-fp8-block", "Hugging Face block FP8 checkpoint")


def scaled(data: bytes, shape, dtype, rng) -> bytes:
    """Random positive multipliers of `shape` in `dtype`."""
    values = rng.lognormal(-6, 1, shape).astype(np.float32)
    return values.astype(ml_dtypes.bfloat16 if dtype == "BF16" else np.float32).tobytes()


@pytest.mark.parametrize("strategy", ["channel", "tensor"])
@pytest.mark.parametrize("scheme", ["w8a8-mxfp8", "w4a8-mxfp"])
def test_per_channel_and_per_tensor_tiles_match_the_reference(tmp_path, strategy, scheme):
    rng = np.random.default_rng(7)
    weights = {n: e for n, e in load_shard(FIXTURES / DENSE / "model.safetensors").items() if e[0] == "F8_E4M3"}

    def tensor(name, entry):
        if not name.endswith(".weight_scale_inv"):
            return {name: entry}
        n, k = weights[name.replace("_scale_inv", "")][1]
        shape = (n, 1) if strategy == "channel" else ()
        return {name.replace("_scale_inv", "_scale"): ("F32", shape, scaled(entry[2], shape, "F32", rng))}

    src = respell(FIXTURES / DENSE, tmp_path / "ct", tensor, lambda c: {**c, "quantization_config": ct_config(strategy=strategy)})
    out = tmp_path / "out"
    convert(src, out, ConvertOptions(scheme=scheme, scale_rule="rceil", max_shard_size=0))
    package = load_shard(out / "quant_model_weights.safetensors")
    source = {n: e for shard in src.glob("*.safetensors") for n, e in load_shard(shard).items()}
    checked = 0
    for name, (dtype, shape, codes) in weights.items():
        prefix = name[: -len(".weight")]
        if package[name][0] == "BF16":
            continue  # a fallback: K does not fit the type
        fmt = E4M3 if package[name][0] == "F8_E4M3" else E2M1
        scale = as_array(source[prefix + ".weight_scale"]).astype(np.float32).reshape(-1, 1)
        block = (1, shape[1]) if strategy == "channel" else shape
        payload, scales = requantize.requantize_rows(
            as_array((dtype, shape, codes)), scale, block, 0, "bf16", fmt, "rceil"
        )
        assert package[name][2] == payload.tobytes() and package[prefix + ".weight_scale"][2] == scales.tobytes()
        checked += 1
    assert checked >= 10 and (scheme == "w8a8-mxfp8" or any(e[0] == "U8" for n, e in package.items() if n in weights))
    assert verify(out, VerifyOptions(source=src)).ok


def test_a_per_tensor_fp8_weight_in_a_block_fp8_checkpoint(tmp_path):
    """One FP8 weight with a scalar `weight_scale` among block-FP8 ones (Qwen3.8-Flash-Next's n-gram
    table): a tile of the whole weight, converted as the reference does."""
    target = "model.layers.0.mlp.up_proj"
    rng = np.random.default_rng(3)

    def tensor(name, entry):
        if name == target + ".weight_scale_inv":
            return {target + ".weight_scale": ("BF16", (), scaled(entry[2], (), "BF16", rng))}
        return {name: entry}

    src = respell(FIXTURES / DENSE, tmp_path / "src", tensor, lambda c: c)
    linear = open_source(src).linears[target]
    assert linear.block == linear.shape and linear.scale.name == target + ".weight_scale"
    out = tmp_path / "out"
    convert(src, out, ConvertOptions(max_shard_size=0))
    package = load_shard(out / "quant_model_weights.safetensors")
    source = {n: e for n, e in load_shard(src / "model.safetensors").items()}
    scale = as_array(source[target + ".weight_scale"]).astype(np.float32).reshape(1, 1)
    payload, scales = requantize.requantize_rows(as_array(source[target + ".weight"]), scale, linear.shape, 0, "bf16", E4M3, "mse")
    assert package[target + ".weight"][2] == payload.tobytes()
    assert package[target + ".weight_scale"][2] == scales.tobytes()
    assert verify(out, VerifyOptions(source=src)).ok


def as_ds_v4(src: Path, dst: Path, scale_dtype: str | None) -> Path:
    """`src` with model_type deepseek_v4; with `scale_dtype`, scales as `P.scale` in that dtype
    (F8_E8M0 bytes from power-of-two multipliers), else kept as `P.weight_scale_inv`."""

    def tensor(name, entry):
        if not name.endswith(".weight_scale_inv") or scale_dtype is None:
            return {name: entry}
        values = as_array(entry).astype(np.float32)
        if scale_dtype == "F8_E8M0":
            mantissa, exponent = np.frexp(values)
            assert (mantissa == 0.5).all()
            data = (exponent - 1 + 127).astype(np.uint8).tobytes()
        else:
            data = values.tobytes()
        return {name.replace(".weight_scale_inv", ".scale"): (scale_dtype, entry[1], data)}

    return respell(src, dst, tensor, lambda c: {**c, "model_type": "deepseek_v4"})


@pytest.mark.parametrize("scale_dtype", ["F8_E8M0", "F32"])
def test_deepseek_v4_native_scales_give_the_block_fp8_package(tmp_path, scale_dtype):
    hf = as_ds_v4(FIXTURES / DEEPSEEK, tmp_path / "hf", None)
    native = as_ds_v4(FIXTURES / DEEPSEEK, tmp_path / "native", scale_dtype)
    source = open_source(native)
    assert source.format == open_source(hf).format == "deepseek-v4-fp8"
    assert {linear.scale.dtype for linear in source.linears.values()} == {scale_dtype}
    packages = {}
    for name, src in (("hf", hf), ("native", native)):
        packages[name] = tmp_path / f"out-{name}"
        convert(src, packages[name], ConvertOptions(scheme="w4a8-mxfp-moe"))
    assert package_bytes(packages["native"]) == package_bytes(packages["hf"])
    assert verify(packages["native"], VerifyOptions(source=native)).ok


def test_deepseek_v4_with_mxfp4_experts_is_refused_as_served_natively(tmp_path):
    src = as_ds_v4(FIXTURES / DEEPSEEK, tmp_path / "v4", "F8_E8M0")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "expert_dtype": "fp4"}))
    with pytest.raises(UnsupportedSourceError, match="MXFP4") as caught:
        open_source(src)
    assert "no conversion is needed" in caught.value.hint
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out")])
    assert result.exit_code == 3 and "MXFP4" in result.stderr and not (tmp_path / "out").exists()


def test_deepseek_v4_mxfp4_expert_tensors_are_refused_without_the_config_key(tmp_path):
    expert = "model.layers.1.mlp.experts.0.gate_proj"

    def tensor(name, entry):
        if name == expert + ".weight":
            n, k = entry[1]
            return {name: ("I8", (n, k // 2), entry[2][: n * k // 2])}
        if name == expert + ".scale":
            return {name: ("F8_E8M0", (64, 4), bytes([127]) * 256)}
        return {name: entry}

    src = respell(as_ds_v4(FIXTURES / DEEPSEEK, tmp_path / "v4", "F8_E8M0"), tmp_path / "flash", tensor, lambda c: c)
    with pytest.raises(UnsupportedSourceError, match=r"is I8 \[64, 64\] .*MXFP4 routed experts") as caught:
        open_source(src)
    assert "no conversion is needed" in caught.value.hint


def test_a_deepseek_v4_scale_of_another_dtype_is_hinted_in_its_own_spelling(tmp_path):
    """The hint said "weight_scale_inv must be F32 or BF16" of a `P.scale` expected F8_E8M0 or F32."""
    scale = "model.layers.0.self_attn.q_a_proj.scale"

    def retyped(name, entry):
        return {name: ("BF16", entry[1], entry[2] * 2) if name == scale else entry}

    src = respell(as_ds_v4(FIXTURES / DEEPSEEK, tmp_path / "v4", "F8_E8M0"), tmp_path / "bf16", retyped, lambda c: c)
    with pytest.raises(ScaleDtypeError) as caught:
        open_source(src)
    assert f"{scale}' is BF16, expected one of F8_E8M0, F32" in caught.value.message, caught.value.message
    assert caught.value.hint == "each 'scale' tensor must be F8_E8M0 or F32"


@pytest.mark.parametrize("renamed", ["model.layers.0.self_attn.q_a_proj.scale", "model.norm.weight"], ids=["missing", "orphan"])
def test_a_deepseek_v4_scale_missing_or_orphaned_is_hinted_in_its_own_spelling(tmp_path, renamed):
    """Both hints named 'weight_scale_inv', a tensor DeepSeek-V4's layout does not have."""
    def tensor(name, entry):
        if name != renamed:
            return {name: entry}
        return {"model.norm.scale": entry, name: entry} if name == "model.norm.weight" else {}

    src = respell(as_ds_v4(FIXTURES / DEEPSEEK, tmp_path / "v4", "F8_E8M0"), tmp_path / "bad", tensor, lambda c: c)
    if renamed == "model.norm.weight":
        refused_with(src, OrphanScaleError,
                     "model-00002-of-00002.safetensors: scale 'model.norm.scale' has no F8_E4M3 weight: 'model.norm.weight' is BF16",
                     "a scale has no F8_E4M3 weight beside it; the checkpoint is incomplete")
    else:
        refused_with(src, MissingScaleError,
                     "model-00001-of-00002.safetensors: F8_E4M3 weight 'model.layers.0.self_attn.q_a_proj.weight' has no "
                     "'model.layers.0.self_attn.q_a_proj.scale' in any shard",
                     "every F8_E4M3 weight needs its scale; the checkpoint is incomplete")


def test_a_stray_weight_scale_inv_beside_deepseek_v4_scales_is_refused_as_verify_would(tmp_path):
    """DeepSeek-V4 consumes `P.scale`: a `P.weight_scale_inv` beside it was copied into the package,
    whose verify refuses any block-FP8 scale. Refused up front, as a stray `weight_scale` is."""
    down = "model.layers.0.mlp.down_proj"

    def tensor(name, entry):
        return {name: entry, **({down + ".weight_scale_inv": entry} if name == down + ".scale" else {})}

    src = respell(as_ds_v4(FIXTURES / DEEPSEEK, tmp_path / "v4", "F32"), tmp_path / "both", tensor, lambda c: c)
    out = tmp_path / "out"
    result = runner.invoke(app, ["convert", str(src), str(out), "--json"])
    assert result.exit_code == 3, result.output
    report = json.loads(result.stdout.splitlines()[0])
    assert report["error"] == "UnsupportedTensorError"
    assert f"{down}.weight_scale_inv" in report["message"] and "block-FP8 scale" in report["message"], report["message"]
    assert not out.exists()


def e8m0_nan(name, entry):
    if name == "model.layers.0.self_attn.q_a_proj.scale":
        return {name: (entry[0], entry[1], b"\xff" + entry[2][1:])}
    return {name: entry}


def test_an_e8m0_nan_scale_is_a_named_error(tmp_path):
    src = as_ds_v4(FIXTURES / DEEPSEEK, tmp_path / "v4", "F8_E8M0")
    bad = respell(src, tmp_path / "bad", e8m0_nan, lambda c: c)
    result = runner.invoke(app, ["convert", str(bad), str(tmp_path / "out")])
    assert result.exit_code == 3 and "0xFF" in result.stderr and "q_a_proj.scale" in result.stderr


def edit_quant(**changes):
    def edit(config):
        quant = config["quantization_config"]
        group = quant["config_groups"]["group_0"]
        for key, value in changes.items():
            if key.startswith("weights."):
                group["weights"][key.split(".", 1)[1]] = value
            elif key == "activations.dynamic":
                group["input_activations"]["dynamic"] = value
            else:
                quant[key] = value
        return config

    return edit


@pytest.mark.parametrize(
    "edit,error,words",
    [
        (edit_quant(format="nvfp4-pack-quantized"), UnsupportedSourceError, ["nvfp4-pack-quantized", "NVFP4"]),
        (edit_quant(format="pack-quantized"), UnsupportedSourceError, ["pack-quantized", "integer"]),
        (edit_quant(**{"weights.strategy": "tensor_group"}), UnsupportedSourceError, ["strategy is 'tensor_group'"]),
        (edit_quant(**{"weights.num_bits": 4}), UnsupportedSourceError, ["with 4 bits"]),
        (edit_quant(**{"weights.block_structure": [128]}), ConfigError, ["block_structure"]),
        (edit_quant(ignore=["lm_head", "re:model.layers.([0-9"]), ConfigError, ["is not a regular expression"]),
        # Python's compiler raises OverflowError and RecursionError for these, which went out as tracebacks (exit 1)
        (edit_quant(ignore=["re:a{99999999999999999999}"]), ConfigError, ["is not a regular expression (the repetition number"]),
        (edit_quant(ignore=["re:" + "(" * 5000 + ")" * 5000]), ConfigError, ["is not a regular expression (maximum recursion"]),
        (edit_quant(ignore="lm_head"), ConfigError, ["ignore"]),
        (edit_quant(config_groups={}), ConfigError, ["config_groups"]),
        (edit_quant(**{"activations.dynamic": False}), StaticActivationError, ["static activation"]),
        # asymmetric weights were read as symmetric: their zero points copied as FLOAT tensors, ignored
        (edit_quant(**{"weights.symmetric": False}), UnsupportedSourceError, ["group_0.weights.symmetric is False", "asymmetric"]),
    ],
)
def test_malformed_compressed_tensors_configs_are_named(tmp_path, edit, error, words):
    src = as_ct(FIXTURES / DENSE, tmp_path / "ct")
    (src / "config.json").write_text(json.dumps(edit(json.loads((src / "config.json").read_text()))))
    with pytest.raises(error) as caught:
        open_source(src)
    assert all(w in caught.value.message for w in words), caught.value.message
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out")])
    assert result.exit_code == 3 and str(src / "config.json") in result.stderr


def test_a_mixed_precision_top_level_format_reads_the_groups_own(converted, tmp_path):
    # compressed-tensors writes "mixed-precision" at the top when the groups name their formats; it
    # was refused as a format ascendconv does not read, although every group was float-quantized
    def mixed(config, group_format="float-quantized"):
        config["quantization_config"]["format"] = "mixed-precision"
        config["quantization_config"]["config_groups"]["group_0"]["format"] = group_format
        return config

    src = as_ct(FIXTURES / DENSE, tmp_path / "ct")
    (src / "config.json").write_text(json.dumps(mixed(json.loads((src / "config.json").read_text()))))
    assert open_source(src).format == "ct-fp8"
    convert(src, tmp_path / "out", ConvertOptions())
    assert package_bytes(tmp_path / "out") == package_bytes(converted(DENSE, "w8a8-mxfp8"))
    (src / "config.json").write_text(json.dumps(mixed(json.loads((src / "config.json").read_text()), "nvfp4-pack-quantized")))
    with pytest.raises(UnsupportedSourceError, match="'nvfp4-pack-quantized': NVFP4"):
        open_source(src)


def with_block_group(block):
    """A second FP8-block group of another block_structure beside group_0's [128, 128]."""
    def edit(config):
        groups = config["quantization_config"]["config_groups"]
        weights = {**groups["group_0"]["weights"], "block_structure": list(block)}
        groups["group_1"] = {**groups["group_0"], "targets": ["re:.*mlp.*"], "weights": weights}
        return config

    return edit


def test_a_scale_grid_two_block_groups_share_is_refused_unless_they_read_alike(converted, tmp_path):
    """A [256, 192] weight's [2, 2] scale is the grid of a 128x128 block and of a 192x128 one, whose
    tiles resolve different rows with different scales (rows 128..191): it was read with the first
    group's tile, exit 0, and verify passed it. Where the tiles read alike (128x128 and 256x128 for a
    64-row weight: one row of tiles either way) the weight is read as before."""
    src = as_ct(FIXTURES / DENSE, tmp_path / "ct")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(with_block_group((192, 128))(config)))
    refused_with(
        src, ScaleShapeError,
        "model.safetensors: 'model.layers.0.mlp.down_proj.weight_scale' has shape [2, 2], the scale grid of block 128x128 "
        "and of block 192x128 for weight [256, 192]: which tile it has cannot be told",
        "not by the group's targets",
    )
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out")])
    assert result.exit_code == 3 and "which tile it has cannot be told" in result.stderr
    assert not (tmp_path / "out").exists()
    (src / "config.json").write_text(json.dumps(with_block_group((256, 128))(config)))
    convert(src, tmp_path / "out", ConvertOptions())
    assert package_bytes(tmp_path / "out") == package_bytes(converted(DENSE, "w8a8-mxfp8"))


def drop(target):
    return lambda name, entry: {} if name == target else {name: entry}


def reshape_scale(target, shape):
    return lambda name, entry: {name: (entry[0], shape, entry[2][: 2 * int(np.prod(shape))])} if name == target else {name: entry}


def zero_point(target):
    """An asymmetric weight's zero point beside its scale (a config that says symmetric all the same)."""
    return lambda name, entry: {name: entry, name.replace("_scale", "_zero_point"): entry} if name == target else {name: entry}


@pytest.mark.parametrize(
    "tensor,error,words",
    [
        (drop("model.layers.1.mlp.down_proj.weight_scale"), MissingScaleError, ["down_proj.weight", "no", "weight_scale"]),
        (reshape_scale("model.layers.1.mlp.down_proj.weight_scale", (2, 1)), ScaleShapeError, ["[2, 1]", "[2, 2]"]),
        (zero_point("model.layers.1.mlp.down_proj.weight_scale"), UnsupportedTensorError,
         ["model.safetensors: tensor 'model.layers.1.mlp.down_proj.weight_zero_point' is a zero point of linear", "asymmetric"]),
    ],
)
def test_malformed_compressed_tensors_tensors_are_named(tmp_path, tensor, error, words):
    ct = as_ct(FIXTURES / DENSE, tmp_path / "ct")
    src = respell(ct, tmp_path / "bad", tensor, lambda c: c)
    with pytest.raises(error) as caught:
        open_source(src)
    assert all(w in caught.value.message for w in words), caught.value.message


def test_a_weight_scale_in_a_block_fp8_checkpoint_is_still_a_stray_name(tmp_path):
    """Only a format that consumes `weight_scale` may carry one: in HF block FP8 beside a
    `weight_scale_inv` it would collide with the package's own scale name."""
    def tensor(name, entry):
        extra = {name.replace("_scale_inv", "_scale"): entry} if name == "model.layers.0.mlp.up_proj.weight_scale_inv" else {}
        return {name: entry, **extra}

    src = respell(FIXTURES / DENSE, tmp_path / "src", tensor, lambda c: c)
    with pytest.raises(UnsupportedTensorError, match="weight_scale"):
        open_source(src)


# --- plain float checkpoints ---------------------------------------------------------------------


def as_float(src: Path, dst: Path, dtype: str = "BF16") -> Path:
    """`src` (block FP8) resolved as vllm-ascend resolves it on load, stored in `dtype`, with no
    quantization_config: the BF16 master such a release is usually made from."""
    tensors = {n: e for shard in src.glob("*.safetensors") for n, e in load_shard(shard).items()}
    block = tuple(json.loads((src / "config.json").read_text())["quantization_config"]["weight_block_size"])
    numpy_dtype = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32}[dtype]

    def tensor(name, entry):
        if name.endswith(".weight_scale_inv"):
            return {}
        if entry[0] != "F8_E4M3":
            return {name: entry}
        scale = as_array(tensors[name + "_scale_inv"]).astype(np.float32)
        values = resolve.resolve_tiles(as_array(entry), scale, block, "bf16")
        return {name: (dtype, entry[1], values.astype(numpy_dtype).tobytes())}

    return respell(src, dst, tensor, lambda c: {k: v for k, v in c.items() if k != "quantization_config"})


@pytest.mark.parametrize(
    "fixture,scheme",
    [(DENSE, "w4a8-mxfp"), (MOE, "w4a8-mxfp-moe"), (DEEPSEEK, "w8a8-mxfp8"), (MOE, "w4a16-mxfp4-moe"), (DENSE, "w4a4-mxfp4")],
)
def test_a_bf16_master_quantizes_to_the_bytes_of_its_fp8_release(converted, tmp_path, fixture, scheme):
    """Quantizing BF16 values is the second half of converting FP8 tiles (resolve to BF16, then MX):
    every MX weight of the package made from the BF16 master equals the FP8 release's, byte for byte;
    what is written FLOAT is the master's own bytes."""
    src = as_float(FIXTURES / fixture, tmp_path / "bf16")
    source = open_source(src)
    assert source.format == "float" and source.quantization["fmt"] == "BF16"
    out = tmp_path / "out"
    convert(src, out, ConvertOptions(scheme=scheme, max_shard_size=0))
    from_float = load_shard(out / "quant_model_weights.safetensors")
    from_fp8 = {n: e for p in converted(fixture, scheme).glob("*.safetensors") for n, e in load_shard(p).items()}
    description = json.loads((out / "quant_model_description.json").read_text())
    masters = {n: e for p in src.glob("*.safetensors") for n, e in load_shard(p).items()}
    same = 0
    for name, entry in from_float.items():
        if description.get(name, "FLOAT") != "FLOAT":
            if name in from_fp8 and from_fp8[name][0] != "BF16":  # (the release left some modules BF16)
                assert entry == from_fp8[name], name
                same += 1
        elif name.endswith(".bias") and entry[0] == "F32":  # an MX layer's bias, cast to F32
            assert (as_array(entry) == as_array(masters[name]).astype(np.float32)).all()
        elif name in masters:
            assert entry == masters[name], name  # copied as it is
    assert same >= 10
    report = verify(out, VerifyOptions(source=src, moe_check=fixture == MOE))
    assert report.ok, [c.to_dict() for c in report.checks if not c.ok]


@pytest.mark.parametrize("dtype", ["F16", "F32"])
@pytest.mark.parametrize("rule", ["floor", "rceil", "mse"])
def test_f16_and_f32_masters_match_the_reference(tmp_path, dtype, rule):
    src = as_float(FIXTURES / DENSE, tmp_path / "master", dtype)
    out = tmp_path / "out"
    convert(src, out, ConvertOptions(scheme="w4a8-mxfp", scale_rule=rule, max_shard_size=0))
    package = load_shard(out / "quant_model_weights.safetensors")
    checked = 0
    for name, entry in load_shard(src / "model.safetensors").items():
        if not name.endswith("proj.weight"):
            continue
        values = as_array(entry).astype(np.float32)
        fmt = {"F8_E4M3": E4M3, "U8": E2M1}.get(package[name][0])
        if fmt is None:
            assert package[name] == entry  # written FLOAT: the master's bytes
            continue
        payload, scales = requantize.quantize_rows(values, fmt, rule)
        assert package[name][2] == payload.tobytes()
        assert package[name.replace(".weight", ".weight_scale")][2] == scales.tobytes()
        checked += 1
    assert checked == 14


def test_a_nan_in_a_float_master_is_a_named_error(tmp_path):
    target = "model.layers.1.mlp.up_proj.weight"

    def poison(name, entry):
        if name != target:
            return {name: entry}
        values = as_array(entry).copy()
        values[3, 40] = np.nan
        return {name: (entry[0], entry[1], values.tobytes())}

    src = respell(as_float(FIXTURES / DENSE, tmp_path / "bf16"), tmp_path / "bad", poison, lambda c: c)
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out")])
    assert result.exit_code == 3
    # the element itself (the rows of a chunk were named before), and what to do
    assert f"{target!r} holds nan at row 3, column 40" in result.stderr
    assert "download the checkpoint again" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_float_checkpoint_with_fp8_tensors_and_no_config_is_refused(tmp_path):
    src = respell(FIXTURES / DENSE, tmp_path / "src", lambda n, e: {n: e},
                  lambda c: {k: v for k, v in c.items() if k != "quantization_config"})
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out")])
    assert result.exit_code == 3 and "holds F8_E4M3 tensors" in result.stderr and "no quantization_config" in result.stderr


def as_gpt_oss_bf16(src: Path, dst: Path) -> Path:
    """A float MoE checkpoint in the layout of gpt-oss's BF16 re-uploads: each layer's experts fused
    as `experts.gate_up_proj` [E, H, 2I] (gate and up columns interleaved) with `gate_up_proj_bias`
    [E, 2I], `experts.down_proj` [E, I, H] with `down_proj_bias` [E, H]; model_type gpt_oss."""
    tensors = {n: e for shard in src.glob("*.safetensors") for n, e in load_shard(shard).items()}

    def stacked(layer, projection):
        count = len({n.split(".experts.")[1].split(".")[0] for n in tensors if n.startswith(layer + ".experts.")})
        return np.stack([as_array(tensors[f"{layer}.experts.{e}.{projection}.weight"]) for e in range(count)])

    def tensor(name, entry):
        if ".experts." not in name:
            return {name: entry}
        layer = name.split(".experts.")[0]
        if name != f"{layer}.experts.0.gate_proj.weight":
            return {}
        gate, up, down = (stacked(layer, p) for p in ("gate_proj", "up_proj", "down_proj"))
        gate_up = np.empty((gate.shape[0], 2 * gate.shape[1], gate.shape[2]), gate.dtype)
        gate_up[:, 0::2], gate_up[:, 1::2] = gate, up
        out = {}
        for proj, values in (("gate_up_proj", gate_up.transpose(0, 2, 1)), ("down_proj", down.transpose(0, 2, 1))):
            values = np.ascontiguousarray(values)
            bias = np.zeros((values.shape[0], values.shape[2]), values.dtype)
            out[f"{layer}.experts.{proj}"] = ("BF16", values.shape, values.tobytes())
            out[f"{layer}.experts.{proj}_bias"] = ("BF16", bias.shape, bias.tobytes())
        return out

    return respell(src, dst, tensor, lambda c: {**c, "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"]})


def test_a_gpt_oss_bf16_re_upload_is_blocked_by_the_target_as_its_mxfp4_release_is(tmp_path):
    """The MXFP4 release's refusal sends users to a BF16 re-upload: that one is refused for the same
    reason (the target), not as a transposed fused layout whose suggested fix would split the
    interleaved gate/up columns as halves, and the hint does not send them back to ascendconv."""
    from ascendconv.errors import BlockedByTargetError

    src = as_gpt_oss_bf16(as_float(FIXTURES / MOE, tmp_path / "bf16"), tmp_path / "gpt-oss")
    with pytest.raises(BlockedByTargetError) as caught:
        open_source(src)
    assert "model_type is 'gpt_oss'" in caught.value.message and "pass no expert biases" in caught.value.message
    assert "with vllm-ascend as it is (unquantized)" in caught.value.hint and "refuses that one too" in caught.value.hint
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out")])
    assert result.exit_code == 3 and "BlockedByTargetError" not in result.stdout and "blocked by the target" in result.stderr
    assert not (tmp_path / "out").exists()


def fused(src: Path, dst: Path) -> Path:
    """`src` (a float MoE checkpoint, per-expert tensors) with each layer's experts stored fused, as
    transformers v5 writes them: `experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I]."""
    tensors = {n: e for shard in src.glob("*.safetensors") for n, e in load_shard(shard).items()}
    experts = int(json.loads((src / "config.json").read_text())["num_experts"])

    def tensor(name, entry):
        if ".experts." not in name:
            return {name: entry}
        layer, rest = name.split(".experts.")
        e, proj = rest.split(".")[:2]
        if e != "0" or proj == "up_proj":
            return {}
        dtype, (rows, cols), _ = entry
        if proj == "gate_proj":
            data = b"".join(tensors[f"{layer}.experts.{i}.{p}.weight"][2] for i in range(experts) for p in ("gate_proj", "up_proj"))
            return {f"{layer}.experts.gate_up_proj": (dtype, (experts, 2 * rows, cols), data)}
        data = b"".join(tensors[f"{layer}.experts.{i}.down_proj.weight"][2] for i in range(experts))
        return {f"{layer}.experts.down_proj": (dtype, (experts, rows, cols), data)}

    return respell(src, dst, tensor, lambda c: c)


def package_tensors(root: Path) -> dict:
    return {n: e for p in sorted(root.glob("*.safetensors")) for n, e in load_shard(p).items()}


def test_fused_3d_experts_are_split_per_expert(tmp_path):
    per_expert = as_float(FIXTURES / MOE, tmp_path / "bf16")
    src = fused(per_expert, tmp_path / "fused")
    assert any(n.endswith("experts.gate_up_proj") for p in src.glob("*.safetensors") for n in load_shard(p))
    source = open_source(src)
    assert source.quantization["fused_experts_split"] == 4  # gate_up and down of 2 MoE layers
    assert "model.layers.1.mlp.experts.3.up_proj" in source.linears
    packages = {}
    for name, path in (("per-expert", per_expert), ("fused", src)):
        packages[name] = tmp_path / f"out-{name}"
        convert(path, packages[name], ConvertOptions(scheme="w4a8-mxfp-moe"))
    assert package_tensors(packages["fused"]) == package_tensors(packages["per-expert"])
    for name in ("quant_model_description.json", "config.json"):
        assert (packages["fused"] / name).read_bytes() == (packages["per-expert"] / name).read_bytes()
    report = verify(packages["fused"], VerifyOptions(source=src, moe_check=True))
    assert report.ok, [c.to_dict() for c in report.checks if not c.ok]


def test_transposed_or_odd_fused_experts_are_refused(tmp_path):
    src = fused(as_float(FIXTURES / MOE, tmp_path / "bf16"), tmp_path / "fused")

    def transpose(name, entry):
        if name.endswith("experts.gate_up_proj"):
            e, rows, cols = entry[1]
            return {name: (entry[0], (e, cols, rows), entry[2])}
        return {name: entry}

    bad = respell(src, tmp_path / "transposed", transpose, lambda c: c)
    with pytest.raises(UnsupportedTensorError, match=r"hidden_size is 128: the layout \[E, out, in\]"):
        open_source(bad)


def test_a_tensor_named_as_a_slice_of_fused_float_experts_is_refused(tmp_path):
    """The stored tensor silently replaced the slice of that name; refused, as fused MXFP4 experts are."""
    src = fused(as_float(FIXTURES / MOE, tmp_path / "bf16"), tmp_path / "fused")
    slice_name = "model.layers.0.mlp.experts.0.gate_proj.weight"

    def tensor(name, entry):
        stray = {slice_name: ("BF16", (128, 128), bytes(2 * 128 * 128))} if name.endswith("layers.0.mlp.experts.gate_up_proj") else {}
        return {name: entry, **stray}

    bad = respell(src, tmp_path / "both", tensor, lambda c: c)
    out = tmp_path / "out"
    result = runner.invoke(app, ["convert", str(bad), str(out), "--json"])
    assert result.exit_code == 3, result.output
    report = json.loads(result.stdout.splitlines()[0])
    assert report["error"] == "UnsupportedTensorError"
    assert all(w in report["message"] for w in (slice_name, "slice of the fused", "experts.gate_up_proj")), report["message"]
    assert not out.exists()


@pytest.mark.parametrize("recorded, problem", [
    ("gguf", "source.format is 'gguf', expected one of " + ", ".join(FORMAT_NAMES)),
    (["hf-fp8-block"], 'source.format is a list (["hf-fp8-block"]), expected a string'),
    (None, "source.format is null, expected a string"),
])
def test_verify_refuses_a_provenance_with_an_unknown_source_format(converted, tmp_path, recorded, problem):
    package = tmp_path / "pkg"
    shutil.copytree(converted(DENSE), package)
    path = package / "ascendconv_provenance.json"
    provenance = json.loads(path.read_text())
    provenance["source"]["format"] = recorded
    path.write_text(json.dumps(provenance))
    report = verify(package, VerifyOptions())
    check = next(c for c in report.checks if c.name == "provenance")
    assert check.problems == [f"ascendconv_provenance.json: {problem}"]


def test_a_gguf_directory_is_refused_by_name(tmp_path):
    src = tmp_path / "gguf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    (src / "model-mxfp4.gguf").write_bytes(b"GGUF" + bytes(60))
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out")])
    assert result.exit_code == 3 and "GGUF is not a supported source" in result.stderr


def test_tile_scales_are_read_chunk_by_chunk(tmp_path, monkeypatch):
    """A chunk of rows reads only the rows of tile scales it converts, so the scales held follow
    the pipeline's chunks, whatever the tile size (with [1, 1] tiles the F32 scales are four times
    the weights; they used to be read whole, every linear's, before anything was written)."""
    from ascendconv.io.writer import ShardWriter, TensorSpec
    from ascendconv.pipeline import CHUNK_ELEMENTS
    from ascendconv.sources.base import Source

    src = tmp_path / "src"
    src.mkdir()
    n, k = 4096, 8192
    rng = np.random.default_rng(5)
    specs = [TensorSpec("model.layers.0.mlp.down_proj.weight", "F8_E4M3", (n, k)),
             TensorSpec("model.layers.0.mlp.down_proj.weight_scale_inv", "F32", (n, k // 32))]
    writer = ShardWriter(src / "model.safetensors", specs)
    writer.write(specs[0].name, rng.integers(0, 0x7E, n * k, dtype=np.uint8))
    writer.write(specs[1].name, rng.uniform(1e-3, 1e-2, n * k // 32).astype(np.float32))
    writer.close()
    config = {"model_type": "qwen3", "quantization_config": {"quant_method": "fp8", "weight_block_size": [1, 32]}}
    (src / "config.json").write_text(json.dumps(config))
    read = []
    original = Source.read_scale

    def recording(self, linear, tile_rows=None):
        read.append(tile_rows)
        return original(self, linear, tile_rows)

    monkeypatch.setattr(Source, "read_scale", recording)
    convert(src, tmp_path / "out", ConvertOptions(scale_rule="floor"))
    rows_per_chunk = CHUNK_ELEMENTS["numba"] // k
    assert sorted(read) == [(r, min(n, r + rows_per_chunk)) for r in range(0, n, rows_per_chunk)]
    assert len(read) == 2
    monkeypatch.setattr(Source, "read_scale", original)
    assert verify(tmp_path / "out", VerifyOptions(source=src)).ok


@pytest.mark.parametrize("spelling", ["hf-fp8-block", "ct-fp8", "ds-v4-e8m0", "ds-v4-f32", "bf16", "bf16-fused"])
def test_the_seam_hands_over_the_tensors_no_linear_consumed(tmp_path, spelling):
    """open_source checks every format's pairing once and keeps what the checks found: the tensors
    no linear consumed (norms, router, embeddings, biases), in source order, whatever the spelling."""
    made = {
        "hf-fp8-block": lambda: FIXTURES / MOE,
        "ct-fp8": lambda: as_ct(FIXTURES / MOE, tmp_path / "ct"),
        "ds-v4-e8m0": lambda: as_ds_v4(FIXTURES / DEEPSEEK, tmp_path / "ds", "F8_E8M0"),  # power-of-two scales
        "ds-v4-f32": lambda: as_ds_v4(FIXTURES / DEEPSEEK, tmp_path / "ds", "F32"),
        "bf16": lambda: as_float(FIXTURES / MOE, tmp_path / "bf16"),
        "bf16-fused": lambda: fused(as_float(FIXTURES / MOE, tmp_path / "bf16"), tmp_path / "fused"),
    }
    source = open_source(made[spelling]())
    try:
        consumed = {t.name for linear in source.linears.values() for t in (linear.weight, linear.scale) if t is not None}
        assert source.unpaired == [name for name in source.tensors if name not in consumed]
        assert "model.norm.weight" in source.unpaired and any(n.endswith(".mlp.gate.weight") for n in source.unpaired)
        assert not any(".experts." in name and name.endswith(".weight") for name in source.unpaired)
    finally:
        source.close()
