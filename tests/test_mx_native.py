"""MX-native sources (compressed-tensors MXFP4/MXFP8, AMD Quark OCP-MX, NVIDIA ModelOpt MXFP8),
made by the tests from the bundled block-FP8 fixtures: re-laid out byte for byte where the written
type is theirs, re-quantized from the decoded values where it is not, every tensor read back, and
each malformed variant refused with a named error."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.convert import ConvertOptions, convert
from ascendconv.decide import Override
from ascendconv.errors import (
    ConfigError,
    InexactSourceError,
    MissingScaleError,
    NaNCodeError,
    NonFiniteScaleError,
    ScaleDtypeError,
    ScaleShapeError,
    StaticActivationError,
    UnsupportedSourceError,
    UnrecognizedCheckpointError,
    UnsupportedTensorError,
)
from ascendconv.formats import elements, mx, relayout, requantize
from ascendconv.formats.constants import E2M1, E4M3
from ascendconv.sources import open_source
from ascendconv.verify import VerifyOptions, verify
from conftest import FIXTURES, as_array, load_shard, save_shard
from mx_sources import MXFP4, MXFP8, as_mx, as_vllm_fused, experts_mxfp4, source_tensors
from robust_helpers import replace_by_no_regular_file
from test_source_formats import refused_with, respell

runner = CliRunner()
DENSE, MOE = "qwen3-dense-fp8", "qwen3-moe-fp8"
LAYOUTS = {  # name -> (layout, what each FP8 linear becomes, format name)
    "ct-mxfp4": ("ct", lambda p: MXFP4, "ct-mx"),
    "ct-mxfp8": ("ct", lambda p: MXFP8, "ct-mx"),
    "ct-mixed": ("ct", lambda p: MXFP4 if ".experts." in p else MXFP8, "ct-mx"),
    "quark": ("quark", experts_mxfp4, "quark-ocp-mx"),
    "modelopt": ("modelopt", lambda p: MXFP8, "modelopt-mxfp8"),
}


def make(tmp_path: Path, name: str, fixture: str = MOE, **kw) -> Path:
    layout, kind_of, _ = LAYOUTS[name]
    return as_mx(FIXTURES / fixture, tmp_path / f"src-{name}-{fixture}", layout, kind_of, **kw)


def package_tensors(root: Path) -> dict:
    """Every tensor of a package, read back through our reader."""
    return {n: e for p in sorted(root.glob("quant_model_weights*.safetensors")) for n, e in load_shard(p).items()}


def mx_weights(src: Path) -> dict[str, tuple]:
    """prefix -> (payload entry, scale entry, element format) of every MX linear of a source."""
    tensors = source_tensors(src)
    out = {}
    for name, entry in tensors.items():
        for suffix in (".weight_packed", ".weight"):
            prefix = name[: -len(suffix)]
            scale = tensors.get(prefix + ".weight_scale")
            if name.endswith(suffix) and scale is not None and scale[0] == "U8":
                out[prefix] = (entry, scale, E2M1 if entry[0] == "U8" else E4M3)
    return out


def decoded(payload, scale, fmt) -> np.ndarray:
    return relayout.decode(as_array(payload).view(np.uint8), as_array(scale), fmt)


@pytest.mark.parametrize("name,fixture", [(n, f) for n in LAYOUTS for f in (MOE, DENSE) if (n, f) != ("quark", DENSE)])
def test_native_relays_every_mx_tensor_byte_for_byte(tmp_path, name, fixture):
    """--scheme native: each MX payload and scale is the source's (through `as-stored`, or through
    `e2m1-as-e4m3` where an MXFP4 layer falls back to W8A8_MXFP8); every other tensor is the
    source's copy or the reference re-quantization of a block-FP8 layer; verify proves it."""
    src = make(tmp_path, name, fixture, weight_shape=True)
    source = open_source(src)
    assert source.format == LAYOUTS[name][2]
    out = tmp_path / "out"
    result = convert(src, out, ConvertOptions(scheme="native", max_shard_size=50_000))
    package = package_tensors(out)
    description = json.loads((out / "quant_model_description.json").read_text())
    conversions = result.plan.conversions()
    mx_linears = mx_weights(src)
    assert mx_linears and conversions
    widened = 0
    for prefix, (payload, scale, fmt) in mx_linears.items():
        written = package[prefix + ".weight"]
        assert package[prefix + ".weight_scale"] == ("U8", scale[1], scale[2]), prefix
        assert conversions[prefix + ".weight"] == "relaid"
        if description[prefix + ".weight"] == ("W4A8_MXFP" if fmt is E2M1 else "W8A8_MXFP8"):
            assert written == (written[0], payload[1], payload[2]) and written[0] == ("U8" if fmt is E2M1 else "F8_E4M3")
        else:  # MXFP4 under a K rule only W8A8_MXFP8 meets: the same values, as E4M3 codes
            assert fmt is E2M1 and description[prefix + ".weight"] == "W8A8_MXFP8"
            want = relayout.e2m1_as_e4m3(as_array(payload))
            assert written == ("F8_E4M3", want.shape, want.tobytes())
            assert (mx.dequantize_mx(as_array(written), as_array(scale), E4M3) == decoded(payload, scale, fmt)).all()
            widened += 1
    assert widened == (1 if fixture == DENSE and LAYOUTS[name][1]("model.layers.1.mlp.down_proj") == MXFP4 else 0)
    # every other tensor: copied as it is, or (Quark's block-FP8 layers) re-quantized as the reference does
    tensors = source_tensors(src)
    for name_, entry in package.items():
        prefix = name_.rsplit(".", 1)[0]
        if prefix in mx_linears or name_ in {p + ".weight_scale" for p in mx_linears}:
            continue
        if name_.endswith(".weight") and description[name_] != "FLOAT":
            assert conversions[name_] == "requantized" and source.linears[prefix].block is not None
            scale = as_array(tensors[prefix + ".weight_scale"]).astype(np.float32)
            block = source.linears[prefix].block
            want, scales = requantize.requantize_rows(as_array(tensors[name_]), scale.reshape(-1, scale.shape[-1]) if scale.ndim else scale.reshape(1, 1), block, 0, "bf16", E4M3, "mse")
            assert entry[2] == want.tobytes() and package[prefix + ".weight_scale"][2] == scales.tobytes()
        elif not name_.endswith(".weight_scale"):
            assert entry == tensors[name_], name_
    assert not any(n.endswith((".weight_packed", ".weight_shape")) for n in package)
    assert result.plan.conversion_counts()["relaid"] == len(mx_linears)
    report = verify(out, VerifyOptions(source=src, moe_check=fixture == MOE))
    assert report.ok, [c.to_dict() for c in report.checks if not c.ok]
    assert fixture == DENSE or next(c for c in report.checks if c.name == "moe").skipped is False
    exact = next(c for c in report.checks if c.name == "exact")
    assert f"{len(mx_linears)} re-laid MX weights equal their source bytes" in exact.detail


@pytest.mark.parametrize("name", ["ct-mxfp8", "modelopt"])
def test_an_mxfp8_source_requantized_to_w4a8_matches_the_reference_on_its_decoded_values(tmp_path, name):
    src = make(tmp_path, name)
    out = tmp_path / "out"
    result = convert(src, out, ConvertOptions(scheme="w4a8-mxfp", scale_rule="rceil"))
    assert result.plan.conversion_counts() == {"relaid": 0, "requantized": 31}
    package = package_tensors(out)
    for prefix, (payload, scale, fmt) in mx_weights(src).items():
        want, scales = requantize.quantize_rows(decoded(payload, scale, fmt), E2M1, "rceil")
        assert package[prefix + ".weight"][2] == want.tobytes() and package[prefix + ".weight_scale"][2] == scales.tobytes()
    report = verify(out, VerifyOptions(source=src))
    assert report.ok, [c.to_dict() for c in report.checks if not c.ok]
    accuracy = {t.name: t for t in report.tensors}
    # re-quantizing E4M3 values to E2M1 loses: a finite SQNR, measured against the decoded source
    assert all(0 < t.rel_err < 0.2 and np.isfinite(t.sqnr_db) for t in accuracy.values() if t.type == "W4A8_MXFP")


def test_an_mx_module_written_float_is_its_decoded_values_in_bf16(tmp_path):
    src = make(tmp_path, "ct-mxfp4")
    target = "model.layers.1.self_attn.q_proj"
    out = tmp_path / "out"
    convert(src, out, ConvertOptions(scheme="native", overrides=[__import__("ascendconv.decide").decide.Override(target, "FLOAT")]))
    payload, scale, fmt = mx_weights(src)[target]
    got = package_tensors(out)[target + ".weight"]
    assert got == ("BF16", (payload[1][0], 2 * payload[1][1]), decoded(payload, scale, fmt).astype(ml_dtypes.bfloat16).tobytes())
    assert verify(out, VerifyOptions(source=src)).ok


def test_an_mxfp8_module_written_float_below_bf16_precision_passes_verify(tmp_path):
    """Under E8M0 bytes 0..2 some MXFP8 values (1.125 x 2**-133, E4M3 subnormals x 2**-127) are finer
    than BF16's subnormals: FLOAT holds their nearest BF16, as for any FLOAT weight. verify measured
    that against the unrounded values and failed the package ('is not the BF16-resolved source:
    rel. error 2.8e-05'); it measures a FLOAT weight against the BF16 of its decoded values."""
    src = make(tmp_path, "ct-mxfp8", DENSE)
    target = "model.layers.1.self_attn.q_proj"
    shard = src / "model.safetensors"
    tensors = load_shard(shard)
    dtype, shape, data = tensors[target + ".weight_scale"]
    tensors[target + ".weight_scale"] = (dtype, shape, (np.arange(shape[0] * shape[1]) % 3).astype(np.uint8).tobytes())
    save_shard(shard, tensors)
    payload, scale, fmt = mx_weights(src)[target]
    values = decoded(payload, scale, fmt)
    bf16 = values.astype(ml_dtypes.bfloat16)
    assert (bf16.astype(np.float32) != values).any()  # some values BF16 cannot hold
    out = tmp_path / "out"
    convert(src, out, ConvertOptions(scheme="native", overrides=[Override(target, "FLOAT")]))
    assert package_tensors(out)[target + ".weight"] == ("BF16", shape[:1] + (values.shape[1],), bf16.tobytes())
    report = verify(out, VerifyOptions(source=src))
    assert report.ok, [c.problems for c in report.checks if not c.ok]
    assert {t.name: t.rel_err for t in report.tensors}[target + ".weight"] == 0.0


def test_e2m1_as_e4m3_keeps_every_value_of_every_byte():
    packed = np.arange(256, dtype=np.uint8).reshape(1, 256)
    widened = relayout.e2m1_as_e4m3(packed)
    assert widened.shape == (1, 512)
    assert np.array_equal(elements.decode_e4m3(widened), elements.decode_e2m1(elements.unpack_fp4(packed)))
    assert np.array_equal(np.signbit(elements.decode_e4m3(widened)), np.signbit(elements.decode_e2m1(elements.unpack_fp4(packed))))
    scales = np.array([[0, 127, 200, 250] * 4], np.uint8)
    assert np.array_equal(relayout.decode(packed, scales, E2M1), mx.dequantize_mx(elements.unpack_fp4(packed), scales, E2M1))
    codes = np.arange(256, dtype=np.uint8).reshape(2, 128) & 0x7E  # no NaN codes
    e4m3_scales = np.full((2, 4), 120, np.uint8)
    assert np.array_equal(relayout.decode(codes, e4m3_scales, E4M3), mx.dequantize_mx(codes, e4m3_scales, E4M3))


def test_the_plan_says_relaid_or_requantized_per_tensor(tmp_path):
    src = make(tmp_path, "quark")
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out"), "--scheme", "native", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["conversion_counts"] == {"relaid": 24, "requantized": 7}
    assert plan["conversions"]["model.layers.0.mlp.experts.2.up_proj.weight"] == "relaid"
    assert plan["conversions"]["model.layers.0.self_attn.q_proj.weight"] == "requantized"
    text = runner.invoke(app, ["convert", str(src), str(tmp_path / "out"), "--scheme", "native", "--dry-run"])
    assert text.exit_code == 0 and "MX payloads 24 relaid, 7 requantized" in text.stdout
    assert "model.layers.*.mlp.experts.*.up_proj.weight" in text.stdout
    assert not (tmp_path / "out").exists()


def test_inspect_names_the_mx_format(tmp_path):
    src = make(tmp_path, "ct-mxfp4", weight_shape=True)
    result = runner.invoke(app, ["inspect", str(src), "--json"])
    assert result.exit_code == 0, result.output
    quant = json.loads(result.stdout)["quantization"]
    assert quant["format"] == "ct-mx" and quant["encodings"] == ["mx_e2m1"] and quant["companions_dropped"] == 31


def test_modelopt_described_by_hf_quant_config_json_only(tmp_path):
    src = make(tmp_path, "modelopt")
    config = json.loads((src / "config.json").read_text())
    quant = config.pop("quantization_config")
    (src / "config.json").write_text(json.dumps(config))
    (src / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "MXFP8", "kv_cache_quant_algo": None, "group_size": 32, "exclude_modules": quant["exclude_modules"]}}))
    assert open_source(src).format == "modelopt-mxfp8"
    out = tmp_path / "out"
    convert(src, out, ConvertOptions(scheme="native"))
    assert not (out / "hf_quant_config.json").exists()  # vLLM would take it for the package's quantization
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert verify(out, VerifyOptions(source=src)).ok


@pytest.mark.parametrize("kind", ["dangling link", "FIFO", "directory"])
def test_an_hf_quant_config_json_that_is_no_regular_file_is_named(tmp_path, kind):
    """It was taken for none: the ModelOpt checkpoint it describes was refused as FP8 tensors with
    'config.json has no quantization_config' (a dangling link: its blob not downloaded)."""
    src = make(tmp_path, "modelopt")
    config = json.loads((src / "config.json").read_text())
    del config["quantization_config"]
    (src / "config.json").write_text(json.dumps(config))
    path = src / "hf_quant_config.json"
    replace_by_no_regular_file(path, kind, tmp_path)
    found = {"dangling link": "cannot read (No such file or directory)", "FIFO": "is a FIFO, not a regular file",
             "directory": "is a directory, not a regular file"}[kind]
    refused(src, tmp_path, ConfigError, [f"{path}: {found}"])


# --- refusals --------------------------------------------------------------------------------


def edit_config(src: Path, edit) -> Path:
    config = json.loads((src / "config.json").read_text())
    edit(config["quantization_config"])
    (src / "config.json").write_text(json.dumps(config))
    return src


def set_weight(group="group_0", **changes):
    return lambda q: q["config_groups"][group]["weights"].update(changes)


def refused(src: Path, tmp_path: Path, error, words):
    with pytest.raises(error) as caught:
        open_source(src)
    assert all(w in caught.value.message for w in words), caught.value.message
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out")])
    assert result.exit_code == 3 and not (tmp_path / "out").exists(), result.output


@pytest.mark.parametrize(
    "name,edit,error,words",
    [
        ("ct-mxfp4", set_weight(strategy="tensor_group"), UnsupportedSourceError, ["strategy is 'tensor_group'", "'group'"]),
        ("ct-mxfp4", set_weight(group_size=16), UnsupportedSourceError, ["group_size is 16"]),
        ("ct-mxfp4", set_weight(num_bits=8), UnsupportedSourceError, ["with 8 bits"]),
        ("ct-mxfp4", lambda q: q["config_groups"]["group_0"].update(format="nvfp4-pack-quantized") or q.update(format="mixed-precision")
         or q["config_groups"].update(group_1={**q["config_groups"]["group_0"], "format": "mxfp4-pack-quantized"}),
         InexactSourceError, ["nvfp4-pack-quantized", "NVFP4", "per 16"]),
        ("ct-mxfp4", lambda q: q.update(ignore=["re:model.([0-9"]), ConfigError, ["not a regular expression"]),
        ("ct-mxfp4", set_weight(symmetric=False), UnsupportedSourceError, ["group_0.weights.symmetric is False", "asymmetric"]),
        ("quark", lambda q: q["layer_quant_config"]["*.experts.*"]["weight"].update(dtype="fp6_e2m3"), InexactSourceError, ["fp6_e2m3", "FP6"]),
        ("quark", lambda q: q["layer_quant_config"]["*.experts.*"]["weight"].update(scale_format="fp8_e4m3"), UnsupportedSourceError, ["scale_format", "E8M0"]),
        ("quark", lambda q: q["layer_quant_config"]["*.experts.*"]["weight"].update(group_size=16), UnsupportedSourceError, ["group_size 16"]),
        ("quark", lambda q: q["layer_quant_config"].clear(), UnsupportedTensorError, ["is U8", "fp8_e4m3"]),
        ("quark", lambda q: q["layer_quant_config"]["*.experts.*"].update(input_tensors={"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False}),
         StaticActivationError, ["layer_quant_config['*.experts.*'].input_tensors", "static activation scales"]),
        ("ct-mxfp4", lambda q: q["config_groups"]["group_0"].update(input_activations={"num_bits": 8, "type": "float", "dynamic": False}),
         StaticActivationError, ["group_0", "static activation scales"]),
        ("modelopt", lambda q: q.update(quant_algo="NVFP4"), InexactSourceError, ["NVFP4", "global scale"]),
        ("modelopt", lambda q: q.update(quant_algo="FP8"), UnsupportedSourceError, ["quant_algo is 'FP8'"]),
    ],
)
def test_malformed_mx_configs_are_named(tmp_path, name, edit, error, words):
    refused(edit_config(make(tmp_path, name), edit), tmp_path, error, words)


def as_mxfp8_config(quant):
    quant.update(format="mxfp8-quantized")
    quant["config_groups"]["group_0"].update(format="mxfp8-quantized")
    quant["config_groups"]["group_0"]["weights"].update(num_bits=8)


def test_packed_mxfp4_weights_under_an_mxfp8_config_are_named_as_what_they_are(tmp_path):
    """The message read "'P.weight_packed' is U8 [128, 64], but packed MXFP4 weights are U8": the
    dtype was never the fault, the config's format was."""
    src = edit_config(make(tmp_path, "ct-mxfp4"), as_mxfp8_config)
    refused_with(
        src, UnsupportedTensorError,
        "model-00001-of-00003.safetensors: 'model.layers.0.mlp.experts.0.down_proj.weight_packed' is a packed MXFP4 weight "
        "(U8 [128, 64]), but config.json names no mxfp4-pack-quantized format (only mxfp8-quantized)",
        "quantization_config describes the checkpoint's tensors",
    )


def test_nvfp4_alone_is_refused_with_the_reason(tmp_path):
    src = edit_config(make(tmp_path, "ct-mxfp4"), lambda q: q.update(format="nvfp4-pack-quantized")
                      or q["config_groups"]["group_0"].pop("format"))
    refused(src, tmp_path, UnsupportedSourceError, ["nvfp4-pack-quantized", "E4M3 values per 16"])


EXPERT = "model.layers.1.mlp.experts.2.down_proj"


def change(target, new):
    return lambda name, entry: new(name, entry) if name == target else {name: entry}


@pytest.mark.parametrize(
    "name,tensor,error,words",
    [
        ("ct-mxfp4", change(EXPERT + ".weight_scale", lambda n, e: {}), MissingScaleError, ["weight_packed", "no", "weight_scale"]),
        ("ct-mxfp4", change(EXPERT + ".weight_scale", lambda n, e: {n: ("U8", (e[1][1], e[1][0]), e[2])}), ScaleShapeError, ["[4, 128]", "[128, 4]"]),
        ("ct-mxfp4", change(EXPERT + ".weight_scale", lambda n, e: {n: ("BF16", (128, 2), e[2])}), ScaleDtypeError, ["is BF16", "E8M0"]),
        ("ct-mxfp4", change(EXPERT + ".weight_packed", lambda n, e: {n: ("I8", e[1], e[2])}), UnsupportedTensorError, ["weight_packed", "I8", "U8"]),
        ("ct-mxfp8", change(EXPERT + ".weight_scale", lambda n, e: {n: ("U8", (128, 2), e[2][:256])}), ScaleShapeError, ["[128, 2]", "[128, 4]"]),
        ("quark", change(EXPERT + ".weight_scale", lambda n, e: {}), MissingScaleError, ["OCP-MX fp4", "weight_scale"]),
        ("modelopt", change(EXPERT + ".weight_scale", lambda n, e: {n: ("F32", (128, 1), bytes(512))}), ScaleDtypeError, ["is F32"]),
    ],
)
def test_malformed_mx_tensors_are_named(tmp_path, name, tensor, error, words):
    src = respell(make(tmp_path, name), tmp_path / "bad", tensor, lambda c: c)
    refused(src, tmp_path, error, words)


OVERFLOW = ["decodes to inf", "E8M0 byte 254", "row 0, column", "the checkpoint is damaged"]


@pytest.mark.parametrize(
    "name,suffix,poison,scheme,error,words",
    [
        ("ct-mxfp4", ".weight_scale", lambda b: b"\xff" + b[1:], "native", "NonFiniteScaleError", ["0xFF", "weight_scale"]),
        ("ct-mxfp8", ".weight", lambda b: b[:5] + b"\x7f" + b[6:], "native", "NaNCodeError", ["NaN code", "0x7F", "column 5"]),
        # a value past float32 (E8M0 byte 254 under codes >= 2), where it is re-quantized and where
        # it would be relaid as it is (the package would hold it, and verify --source refuse it)
        ("ct-mxfp8", ".weight_scale", lambda b: b"\xfe" * len(b), "w4a8-mxfp", "NonFiniteValueError", OVERFLOW),
        ("ct-mxfp8", ".weight_scale", lambda b: b"\xfe" * len(b), "native", "NonFiniteValueError", OVERFLOW),
        ("ct-mxfp4", ".weight_scale", lambda b: b"\xfe" * len(b), "native", "NonFiniteValueError", OVERFLOW),
        ("modelopt", ".weight_scale", lambda b: b"\xfe" * len(b), "native", "NonFiniteValueError", OVERFLOW),
    ],
)
def test_bad_mx_bytes_are_named_errors(tmp_path, name, suffix, poison, scheme, error, words):
    src = respell(make(tmp_path, name), tmp_path / "bad", change(EXPERT + suffix, lambda n, e: {n: (e[0], e[1], poison(e[2]))}), lambda c: c)
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out"), "--scheme", scheme, "--json"])
    assert result.exit_code == 3, result.output
    report = json.loads(result.stdout.splitlines()[0])
    text = report["message"] + " " + report["hint"]
    assert report["error"] == error and all(w in text for w in words) and EXPERT in text, report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", f"src-{name}-{MOE}"]


def test_gguf_is_refused_by_name(tmp_path):
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "model-MXFP4.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    for path in (tmp_path / "gguf", tmp_path / "gguf" / "model-MXFP4.gguf"):
        with pytest.raises(UnsupportedSourceError, match="GGUF is not a supported source") as caught:
            open_source(path)
        assert "split-half nibbles" in caught.value.hint
        result = runner.invoke(app, ["convert", str(path), str(tmp_path / "out")])
        assert result.exit_code == 3 and "GGUF" in result.stderr


@settings(max_examples=60, deadline=None, database=None)
@given(
    packed=hnp.arrays(np.uint8, st.tuples(st.integers(1, 4), st.sampled_from([16, 32, 48])), elements=st.integers(0, 255)),
    scale=st.integers(0, 250),
)
def test_the_exact_fallback_and_the_decode_agree_with_the_reference(packed, scale):
    """For any packed E2M1 rows and E8M0 bytes: e2m1-as-e4m3 under the same bytes dequantizes to the
    decoded MXFP4 values, and both equal the reference dequantizer's."""
    scales = np.full((packed.shape[0], packed.shape[1] // 16), scale, np.uint8)
    values = relayout.decode(packed, scales, E2M1)
    assert np.array_equal(values, mx.dequantize_mx(elements.unpack_fp4(packed), scales, E2M1))
    assert np.array_equal(mx.dequantize_mx(relayout.e2m1_as_e4m3(packed), scales, E4M3), values)


@pytest.mark.parametrize("fmt,largest", [(E2M1, b"\x77" * 16), (E4M3, b"\x7e" * 32)])  # 6 and 448, 32 values
def test_may_overflow_is_true_from_the_first_byte_the_largest_code_decodes_past_float32(fmt, largest):
    payload = np.frombuffer(largest, np.uint8).reshape(1, -1)
    for byte in range(255):
        scales = np.array([[byte]], np.uint8)
        assert relayout.may_overflow(scales, fmt) == (not np.isfinite(relayout.decode(payload, scales, fmt)).all()), byte


MXFP8_ACTIVATIONS = {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 32, "dynamic": True}


@pytest.mark.parametrize("activations", [None, MXFP8_ACTIVATIONS], ids=["MXFP4A16", "MXFP4xMXFP8"])
@pytest.mark.parametrize("scheme,expert_type", [("native", "W4A8_MXFP"), ("w4a8-mxfp-moe", "W4A8_MXFP"), ("w4a16-mxfp4-moe", "W4A16_MXFP4")])
def test_mxfp4_experts_take_the_type_vllm_ascend_loads_them_as(tmp_path, activations, scheme, expert_type):
    """compressed-tensors MXFP4 experts, weight-only (no input_activations: MXFP4A16) or with MXFP8
    activations: --scheme native writes them W4A8_MXFP (what vllm-ascend's own compressed-tensors
    loader makes of an MXFP4A16 MoE layer), w4a16-mxfp4-moe W4A16_MXFP4; either way the payload and
    scale bytes are the source's (as-stored), and the linears are relaid too (as-stored under native,
    e2m1-as-e4m3 under the -moe schemes' W8A8_MXFP8)."""
    src = make(tmp_path, "ct-mxfp4")
    if activations is not None:
        src = edit_config(src, lambda q: q["config_groups"]["group_0"].update(input_activations=activations))
    out = tmp_path / "out"
    result = convert(src, out, ConvertOptions(scheme=scheme))
    description = json.loads((out / "quant_model_description.json").read_text())
    package = package_tensors(out)
    linears = mx_weights(src)
    assert result.plan.conversion_counts() == {"relaid": len(linears), "requantized": 0} == {"relaid": 31, "requantized": 0}
    for prefix, (payload, scale, _) in linears.items():
        written = description[prefix + ".weight"]
        assert package[prefix + ".weight_scale"] == ("U8", scale[1], scale[2]), prefix
        if ".experts." in prefix:
            assert written == expert_type and package[prefix + ".weight"] == ("U8", payload[1], payload[2]), prefix
        elif scheme == "native":
            assert written == "W4A8_MXFP" and package[prefix + ".weight"] == ("U8", payload[1], payload[2]), prefix
        else:
            want = relayout.e2m1_as_e4m3(as_array(payload))
            assert written == "W8A8_MXFP8" and package[prefix + ".weight"] == ("F8_E4M3", want.shape, want.tobytes()), prefix
    report = verify(out, VerifyOptions(source=src, moe_check=True))
    assert report.ok, [c.to_dict() for c in report.checks if not c.ok]
    assert "31 re-laid MX weights equal their source bytes" in next(c for c in report.checks if c.name == "exact").detail


def test_modelopt_mxfp4_is_refused_as_not_supported_yet(tmp_path):
    """Its bytes would re-lay out exactly, but no published checkpoint confirms its tensor names:
    refused by name, not read by a guess."""
    from ascendconv.errors import NotYetSupportedSourceError

    src = edit_config(make(tmp_path, "modelopt"), lambda q: q.update(quant_algo="MXFP4"))
    refused(src, tmp_path, NotYetSupportedSourceError, ["quant_algo is 'MXFP4'", "not supported yet", "not confirmed"])


# --- quant_method mxfp4: experts fused as vLLM's FusedMoE stores them ---------------------------


def fused_mxfp4(tmp_path: Path, edit=lambda tensors: tensors, config_edit=lambda cfg: cfg) -> Path:
    return as_vllm_fused(make(tmp_path, "ct-mxfp4"), tmp_path / "fused", edit, config_edit)


def test_fused_mxfp4_experts_are_split_per_expert_byte_for_byte(tmp_path):
    """Every expert's gate, up and down payload and scale in the package is its byte range of the
    fused source tensor, unchanged, and equals what the same experts stored one by one give; verify
    proves each from the source."""
    src = fused_mxfp4(tmp_path)
    source = open_source(src)
    assert source.format == "mxfp4-fused" and source.quantization["fused_experts_split"] == 8
    assert source.quantization["companions_dropped"] == 0 and source.params["layout"] == "vllm-fused"
    assert all(".experts." in prefix for prefix in source.linears) and len(source.linears) == 24
    out = tmp_path / "out"
    result = convert(src, out, ConvertOptions(scheme="native"))
    assert result.plan.conversion_counts() == {"relaid": 24, "requantized": 0}  # the unquantized rest is copied
    package = package_tensors(out)
    fused = source_tensors(src)
    for layer in ("model.layers.0.mlp", "model.layers.1.mlp"):
        for stored, projections in (("w13_weight", ("gate_proj", "up_proj")), ("w2_weight", ("down_proj",))):
            for suffix, name in (("", "weight"), ("_scale", "weight_scale")):
                dtype, shape, data = fused[f"{layer}.experts.{stored}{suffix}"]
                rows, piece = shape[1] // len(projections), shape[1] // len(projections) * shape[2]
                for e in range(shape[0]):
                    for i, projection in enumerate(projections):
                        start = (e * len(projections) + i) * piece
                        got = package[f"{layer}.experts.{e}.{projection}.{name}"]
                        assert got == ("U8", (rows, shape[2]), data[start : start + piece]), (layer, e, projection, name)
    convert(tmp_path / "src-ct-mxfp4-qwen3-moe-fp8", tmp_path / "ref", ConvertOptions(scheme="native"))
    per_expert = package_tensors(tmp_path / "ref")
    assert {n: e for n, e in package.items() if ".experts." in n} == {n: e for n, e in per_expert.items() if ".experts." in n}
    description = json.loads((out / "quant_model_description.json").read_text())
    assert {description[p + ".weight"] for p in source.linears} == {"W4A8_MXFP"}
    report = verify(out, VerifyOptions(source=src, moe_check=True))
    assert report.ok, [c.to_dict() for c in report.checks if not c.ok]
    assert "24 re-laid MX weights equal their source bytes" in next(c for c in report.checks if c.name == "exact").detail


def gpt_oss_experts(out):
    """gpt-oss's names for one layer's experts instead of vLLM's."""
    renamed = {}
    for name, (dtype, shape, data) in out.items():
        layer = name.split(".experts.")[0]
        proj = "gate_up_proj" if "w13" in name else "down_proj"
        kind = "_scales" if name.endswith("_scale") else "_blocks"
        renamed[f"{layer}.experts.{proj}{kind}"] = (dtype, shape, data)
    return renamed


def with_expert_bias(out):
    layer = next(iter(out)).split(".experts.")[0]
    experts, rows = out[f"{layer}.experts.w13_weight"][1][:2]
    return {**out, f"{layer}.experts.w13_bias": ("BF16", (experts, rows), bytes(2 * experts * rows))}


def without_w2_scale(out):
    return {n: e for n, e in out.items() if not n.endswith("w2_weight_scale")}


def with_expert_0_stored_too(out):
    layer = next(iter(out)).split(".experts.")[0]
    return {**out, f"{layer}.experts.0.down_proj.weight": ("BF16", (4, 4), bytes(32))}


@pytest.mark.parametrize(
    "edit,config_edit,error,words",
    [
        (lambda o: o, lambda c: {**c, "model_type": "gpt_oss"}, "BlockedByTargetError", ["gpt_oss", "blocked by the target", "expert biases", "swigluoai"]),
        (gpt_oss_experts, lambda c: c, "BlockedByTargetError", ["gate_up_proj_blocks", "gpt-oss", "blocked by the target"]),
        (with_expert_bias, lambda c: c, "BlockedByTargetError", ["w13_bias", "expert bias"]),
        (without_w2_scale, lambda c: c, "UnsupportedTensorError", ["w2_weight", "no", "w2_weight_scale"]),
        (with_expert_0_stored_too, lambda c: c, "UnsupportedTensorError", ["experts.0.down_proj.weight", "slice of the fused"]),
    ],
    ids=["gpt-oss-model-type", "gpt-oss-tensors", "expert-bias", "missing-scale", "fused-and-per-expert"],
)
def test_fused_mxfp4_refusals_say_why(tmp_path, edit, config_edit, error, words):
    import ascendconv.errors as errors

    src = fused_mxfp4(tmp_path, edit, config_edit)
    refused(src, tmp_path, getattr(errors, error), words)
    if error == "BlockedByTargetError":
        with pytest.raises(errors.BlockedByTargetError) as caught:
            open_source(src)
        assert "BF16 re-upload" in caught.value.hint


def without_quantization_config(config):
    return {k: v for k, v in config.items() if k != "quantization_config"}


@pytest.mark.parametrize("edit", [lambda o: o, gpt_oss_experts], ids=["vllm-names", "gpt-oss-names"])
def test_fused_mxfp4_experts_without_a_quantization_config_are_refused(tmp_path, edit):
    """A fused MXFP4 upload whose config.json lost its quantization_config was read as a plain float
    checkpoint: its U8 payloads and E8M0 scales were copied as FLOAT 'values', the attention
    quantized, exit 0, and verify passed the package, as FP8 tensors without a config are not."""
    src = fused_mxfp4(tmp_path, edit, without_quantization_config)
    layer = "model.layers.0.mlp.experts"
    first = f"{layer}.w13_weight" if edit is not gpt_oss_experts else f"{layer}.gate_up_proj_blocks"
    refused_with(
        src, UnrecognizedCheckpointError,
        f"{src}: holds U8 tensors (e.g. {first!r}, named as a quantized weight or its scale) but config.json has no "
        "quantization_config",
        "must describe its quantization in config.json",
    )
    for args in (["inspect", src], ["convert", src, tmp_path / "out", "--dry-run"], ["convert", src, tmp_path / "out"]):
        result = runner.invoke(app, [str(a) for a in args])
        assert result.exit_code == 3 and first in result.stderr, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("experts", [0, 3, 5])
def test_an_mx_moe_layer_the_config_disagrees_with_is_refused_as_verify_would(tmp_path, experts):
    """The experts' packed weights are `weight_packed`, written `.weight`: convert counts them by the
    package's names, so a config.json whose expert count differs is refused up front, as verify's
    coverage check would refuse the package (found by test_fuzz)."""
    from ascendconv.errors import IncompleteMoEError

    src = make(tmp_path, "ct-mxfp4")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "num_experts": experts}))
    refused(src, tmp_path, IncompleteMoEError, ["model.layers.0.mlp has 4 experts but config.json says " + str(experts)])


@pytest.mark.parametrize("name", ["ct-mixed", "quark"])
def test_dry_run_counts_of_an_mx_source_are_the_placed_ones(tmp_path, name):
    """What a dry run shows without placing tensors (shard rows, relaid / requantized payloads)
    equals the placed plan, for MX sources whose payloads are partly relaid, under every scheme."""
    from ascendconv.decide import SCHEMES, Deployment
    from ascendconv.plan import Planner
    from ascendconv.sources import open_source
    from test_plan import assert_figures_count_the_tensors

    source = open_source(make(tmp_path, name))
    planner = Planner.for_source(source, Deployment())
    relaid = 0
    for scheme in SCHEMES:
        plan = planner.plan(scheme, max_shard_size=200_000)
        relaid += plan.conversion_counts()["relaid"]
        assert_figures_count_the_tensors(plan)
    assert relaid > 0


@pytest.mark.parametrize("name", [*sorted(LAYOUTS), "fused"])
def test_inspect_tallies_each_mx_tensor_under_its_label(tmp_path, name):
    """By quant type, inspect counts each linear's weight and scale under its MX label and every
    other tensor FLOAT: the tally over the linears is the tally tensor by tensor; the structure
    from the linears and the other tensors is the structure from every tensor."""
    from ascendconv.decide import Deployment
    from ascendconv.inspect.source import _labels, _linear_kinds, _type_tally
    from ascendconv.inspect.summary import _structure, _tally
    from ascendconv.models import rules_for
    from ascendconv.plan import Planner

    src = open_source(fused_mxfp4(tmp_path) if name == "fused" else make(tmp_path, name))
    try:
        total = sum(e.nbytes for e in src.tensors.values())
        planner = Planner.for_source(src, Deployment())
        by_type = _type_tally(_linear_kinds(src.linears, planner.rules, planner.facts).kinds, len(src.tensors), total)
        assert by_type == _tally(src.tensors, _labels(src).__getitem__)[1]
        assert set(by_type) > {"FLOAT"}
        # the unpaired tensors the seam's checks hand over: every tensor no linear consumed, in order
        consumed = {t.name for linear in src.linears.values() for t in (linear.weight, linear.scale) if t is not None}
        assert src.unpaired == [n for n in src.tensors if n not in consumed] and src.unpaired
        rules = rules_for(src.config)  # and the structure from the unpaired tensors and the linears
        assert _structure(src.unpaired, rules, src.linears) == _structure(src.tensors, rules)
    finally:
        src.close()


@pytest.mark.parametrize(
    "name,stored,suffix,entry,before",
    [
        ("ct-mxfp4", ".weight_packed", ".weight", ("BF16", (128, 128), bytes(2 * 128 * 128)), False),
        ("ct-mixed", ".weight", ".weight_packed", ("U8", (128, 64), bytes(128 * 64)), True),
    ],
)
def test_a_linear_stored_both_packed_and_plain_is_refused_naming_both(tmp_path, name, stored, suffix, entry, before):
    """compressed-tensors MXFP4 stores a weight as `weight_packed` and the package writes it as
    `weight`: a stored `weight` beside it would be a second package tensor of that name (a
    traceback from the shard writer), and of an MXFP8 `weight` and an MXFP4 `weight_packed` one
    was dropped. inspect and the dry run open the source the same way."""
    q = "model.layers.0.self_attn.q_proj"

    def tensor(tensor_name, stored_entry):
        if tensor_name != q + stored:
            return {tensor_name: stored_entry}
        pair = [(tensor_name, stored_entry), (q + suffix, entry)]
        return dict(pair[::-1] if before else pair)  # stored before the linear's own weight, or after

    src = respell(make(tmp_path, name), tmp_path / "both", tensor, lambda c: c)
    out = tmp_path / "out"
    for args in (["convert", src, out], ["convert", src, out, "--dry-run"], ["inspect", src]):
        result = runner.invoke(app, [str(a) for a in args] + ["--json"])
        assert result.exit_code == 3, result.output
        report = json.loads(result.stdout.splitlines()[0])
        assert report["error"] == "UnsupportedTensorError", report
        assert all(w in report["message"] for w in (f"{q}.weight'", f"{q}.weight_packed'", "linear")), report["message"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["both", f"src-{name}-{MOE}"]


_PREFIXES = ["a", "b", "m.experts.0.w1", "m.experts.1.w1"]
_DTYPES = ["U8", "F8_E4M3", "F8_E8M0", "BF16", "I64"]
_SHAPES = [(64, 32), (64, 64), (64, 48), (64, 24), (64, 1), (64, 2), (64, 3), (64,), (0, 64), (2,)]


@st.composite
def _ct_mx_tensors(draw):
    """Well-formed compressed-tensors MX linears (MXFP4 packed or MXFP8, K of 64 or 96, with or
    without bias and weight_shape, some in both formats), then up to three edits: a tensor dropped, retyped, reshaped, or
    one added under any of the names."""
    tensors: dict[str, tuple[str, tuple]] = {}
    odd = 0  # linears stored in both formats: the fast path may give up on them
    for prefix in draw(st.lists(st.sampled_from(_PREFIXES), unique=True, max_size=4)):
        # K of 48 or 0: weight and scale agree, but K is no multiple of 32 / the linear has no elements
        k, packed = draw(st.sampled_from([64, 96, 64, 96, 48, 0])), draw(st.booleans())
        if draw(st.booleans()) and draw(st.booleans()):  # stored in both MX formats
            tensors[prefix + ".weight"] = ("F8_E4M3", (64, k))
            odd += 1
        if packed:
            tensors[prefix + ".weight_packed"] = ("U8", (64, k // 2))
            if draw(st.booleans()):
                tensors[prefix + ".weight_shape"] = ("I64", (2,))
        else:
            tensors[prefix + ".weight"] = ("F8_E4M3", (64, k))
        tensors[prefix + ".weight_scale"] = (draw(st.sampled_from(["U8", "F8_E8M0"])), (64, k // 32))
        if draw(st.booleans()):
            tensors[prefix + ".bias"] = ("BF16", (64,))
    names = [p + s for p in _PREFIXES for s in (".weight", ".weight_packed", ".weight_scale", ".bias")]
    edits = draw(st.integers(0, 3))
    for _ in range(edits):
        name = draw(st.sampled_from(names))
        edit = draw(st.sampled_from(["drop", "dtype", "shape", "add"]))
        if edit == "drop":
            tensors.pop(name, None)
        elif edit == "add":
            tensors[name] = (draw(st.sampled_from(_DTYPES)), draw(st.sampled_from(_SHAPES)))
        elif name in tensors:
            dtype, shape = tensors[name]
            tensors[name] = (draw(st.sampled_from(_DTYPES)), shape) if edit == "dtype" else (dtype, draw(st.sampled_from(_SHAPES)))
    order = draw(st.permutations(sorted(tensors)))
    return {name: tensors[name] for name in order}, edits + odd


@settings(max_examples=1500, deadline=None)
@given(_ct_mx_tensors(), st.sampled_from([("mxfp4-pack-quantized",), ("mxfp8-quantized",), ("mxfp4-pack-quantized", "mxfp8-quantized")]))
def test_compressed_tensors_mx_pairing_fast_path_makes_what_the_naming_path_makes(drawn, formats):
    """The tight loop either gives up (None) or pairs exactly as the tensor-by-tensor loop does; it
    never accepts what that one refuses, and a faultless checkpoint takes it."""
    from types import SimpleNamespace

    from ascendconv.io.safetensors import TensorEntry, tensor_nbytes
    from ascendconv.sources.mx_native import CT_MX_FORMATS, LAYOUTS, CompressedTensorsMx, _pair_mx_faultless

    specs, odd = drawn
    tensors = {
        name: TensorEntry(name, dtype, shape, Path("s.safetensors"), 0, tensor_nbytes(dtype, shape))
        for name, (dtype, shape) in specs.items()
    }
    layouts = [LAYOUTS[CT_MX_FORMATS[f][1]] for f in formats]
    fast = _pair_mx_faultless(tensors, layouts)
    try:
        slow = CompressedTensorsMx._pair_naming_faults(tensors, layouts, SimpleNamespace(formats=formats))
    except (UnsupportedTensorError, MissingScaleError, ScaleDtypeError, ScaleShapeError) as exc:
        assert fast is None, exc  # a refusal: the fast path gave up
        return
    # it may give up on an odd one that is accepted (a `P.weight_packed` beside an MXFP8 `P.weight`)
    assert (fast is None and odd > 0) or list(fast.items()) == list(slow.items())


def test_quark_exclude_matches_each_module_as_its_names_and_patterns_do():
    """Quark's `exclude` is matched as a set of names and one expression of its patterns (one
    fnmatch per entry per linear took 5.9 s for 306 names over 44,544 expert weights): the same
    answer as each entry by itself, a name holding '[' included (a literal, as fnmatch alone
    would not take it)."""
    import fnmatch

    from ascendconv.sources.mx_native import QuarkConfig

    exclude = ("lm_head", "model.layers.0.mlp.gate", "*.self_attn.*", "model.layers.[12].mlp.experts.0.up_proj",
               "odd.[x", "model.layers.?.mlp.shared_experts.*")
    config = QuarkConfig("fp4", (("*.experts.*", "fp8_e4m3"),), exclude, "config.json")
    modules = ["lm_head", "lm_head2", "model.layers.0.mlp.gate", "model.layers.10.mlp.gate", "odd.[x", "odd.x",
               "model.layers.3.self_attn.q_proj", "model.layers.1.mlp.experts.0.up_proj",
               "model.layers.3.mlp.experts.0.up_proj", "model.layers.7.mlp.shared_experts.down_proj",
               "model.layers.17.mlp.shared_experts.down_proj", "model.layers.4.mlp.down_proj"]
    for module in modules:
        excluded = any(fnmatch.fnmatchcase(module, p) or module == p for p in exclude)
        expected = None if excluded else ("fp8_e4m3" if ".experts." in module else "fp4")
        assert config.dtype_of(module) == expected, module
    assert [config.dtype_of(m) for m in modules] == [
        None, "fp4", None, "fp4", None, "fp4", None, None, "fp8_e4m3", None, "fp4", "fp4"
    ]

