"""Every source error of contract section 1 fails with exit code 3, names file and tensor, leaves no OUT."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.errors import DuplicateTensorError
from conftest import FIXTURES, load_shard, save_shard
from mx_sources import MXFP4, MXFP8, as_mx, as_vllm_fused, experts_mxfp4
from test_source_formats import as_ct, as_ds_v4, as_float, respell

runner = CliRunner()
DENSE = "qwen3-dense-fp8"
Q = "model.layers.0.self_attn.q_proj"


def run_convert(src, out, *extra):
    return runner.invoke(app, ["convert", str(src), str(out), "--quiet", *extra])


def edit_dense(src, edit):
    shard = src / "model.safetensors"
    tensors = load_shard(shard)
    edit(tensors)
    save_shard(shard, tensors)


def drop(name):
    return lambda t: t.pop(name)


def retype_scale(t):
    dtype, shape, data = t[Q + ".weight_scale_inv"]
    values = np.frombuffer(data, np.uint16).astype(np.float16)  # any 2-byte dtype that is not BF16
    t[Q + ".weight_scale_inv"] = ("F16", shape, values.tobytes())


def reshape_scale(t):
    dtype, shape, data = t[Q + ".weight_scale_inv"]
    t[Q + ".weight_scale_inv"] = (dtype, (shape[0] * shape[1], 1), data)


def nan_scale(t):
    dtype, shape, data = t[Q + ".weight_scale_inv"]
    raw = bytearray(data)
    raw[0:2] = b"\xc0\x7f"  # BF16 NaN
    t[Q + ".weight_scale_inv"] = (dtype, shape, bytes(raw))


def huge_scale(t):
    import ml_dtypes

    dtype, shape, data = t[Q + ".weight_scale_inv"]
    values = np.frombuffer(data, ml_dtypes.bfloat16).copy()
    values[0] = 1e38  # finite, but code x scale overflows float32
    t[Q + ".weight_scale_inv"] = (dtype, shape, values.tobytes())


def nan_code(t):
    dtype, shape, data = t[Q + ".weight"]
    raw = bytearray(data)
    raw[3 * shape[1] + 5] = 0x7F
    t[Q + ".weight"] = (dtype, shape, bytes(raw))


@pytest.mark.parametrize(
    "edit,error,words",
    [
        (drop(Q + ".weight_scale_inv"), "MissingScaleError", [Q + ".weight", "model.safetensors"]),
        (drop(Q + ".weight"), "OrphanScaleError", [Q + ".weight_scale_inv", "model.safetensors"]),
        (retype_scale, "ScaleDtypeError", [Q + ".weight_scale_inv", "F16"]),
        (reshape_scale, "ScaleShapeError", [Q + ".weight_scale_inv", "has shape [2, 1], expected [1, 2]"]),
        (nan_scale, "NonFiniteScaleError", [Q + ".weight_scale_inv", "nan"]),
        (nan_code, "NaNCodeError", [Q + ".weight", "0x7F", "row 3, column 5"]),
        (huge_scale, "NonFiniteValueError", [Q + ".weight", Q + ".weight_scale_inv", "NaN/Inf"]),
    ],
)
def test_named_source_errors(fixture_copy, tmp_path, edit, error, words):
    src = fixture_copy(DENSE)
    edit_dense(src, edit)
    out = tmp_path / "out"
    result = run_convert(src, out, "--json")
    assert result.exit_code == 3, result.output
    report = json.loads(result.stdout.strip().splitlines()[0])
    assert report["error"] == error
    for word in words:
        assert word in report["message"], (word, report["message"])
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def past_bf16_scale(t):
    """Tile scale BF16 0x7B12 (7.5816e35) and a code 448 at row 3, column 5 of q_proj: the product,
    1.99609375 x 2**127, is a float32, but BF16 rounds it to inf."""
    dtype, shape, data = t[Q + ".weight_scale_inv"]
    scales = np.frombuffer(data, np.uint16).copy()
    scales[0] = 0x7B12
    t[Q + ".weight_scale_inv"] = (dtype, shape, scales.tobytes())
    dtype, shape, data = t[Q + ".weight"]
    raw = bytearray(data)
    raw[3 * shape[1] + 5] = 0x7E
    t[Q + ".weight"] = (dtype, shape, bytes(raw))


@pytest.mark.parametrize("written", ["W8A8_MXFP8", "FLOAT"])
def test_values_past_bf16_are_refused_whether_quantized_or_written_float(fixture_copy, tmp_path, written):
    """The MX path refused rows whose code x tile scale BF16 rounds to inf; written FLOAT (an
    --override, a K that fits no type, a module kept in BF16) the same rows went into the package
    as +inf, exit 0, for verify to fail later. Both are NonFiniteValueError now, naming the rows."""
    src = fixture_copy(DENSE)
    edit_dense(src, past_bf16_scale)
    out = tmp_path / "out"
    result = run_convert(src, out, "--json", "--override", f"model.layers.0.self_attn.*={written}")
    assert result.exit_code == 3, result.output
    report = json.loads(result.stdout.strip().splitlines()[0])
    assert report["error"] == "NonFiniteValueError"
    assert f"'{Q}.weight' rows 0.." in report["message"] and f"tile scales from '{Q}.weight_scale_inv'" in report["message"]
    assert report["hint"].startswith("code x tile scale is past the range of float32 (or of BF16")
    assert not out.exists()


def test_truncated_shard(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    shard = src / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])
    result = run_convert(src, tmp_path / "out")
    assert result.exit_code == 3
    assert "model.safetensors" in result.stderr and "truncated" in result.stderr
    assert not (tmp_path / "out").exists()


def test_corrupt_header(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    shard = src / "model.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[8:12] = b"\xff\xfe{["
    shard.write_bytes(bytes(raw))
    result = run_convert(src, tmp_path / "out")
    assert result.exit_code == 3
    assert "model.safetensors" in result.stderr and "not valid JSON" in result.stderr


def test_shard_named_in_index_but_missing(fixture_copy, tmp_path):
    src = fixture_copy("qwen3-moe-fp8")
    (src / "model-00002-of-00003.safetensors").unlink()
    result = run_convert(src, tmp_path / "out", "--json")
    assert result.exit_code == 3
    report = json.loads(result.stdout.splitlines()[0])
    assert report["error"] == "MissingShardError" and "model-00002-of-00003.safetensors" in report["message"]


def test_tensor_named_twice(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    tensors = load_shard(src / "model.safetensors")
    save_shard(src / "extra.safetensors", {Q + ".weight": tensors[Q + ".weight"]})
    result = run_convert(src, tmp_path / "out", "--json")
    assert result.exit_code == 3
    report = json.loads(result.stdout.splitlines()[0])
    assert report["error"] == "DuplicateTensorError" and Q + ".weight" in report["message"]
    assert "extra.safetensors" in report["message"] and "model.safetensors" in report["message"]


@pytest.mark.parametrize(
    "quant,error",
    [
        (None, "no quantization_config"),
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "no weight_block_size"),
        ({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"}, "activation_scheme"),
        ({"quant_method": "awq"}, "expected 'fp8'"),
    ],
)
def test_not_a_block_fp8_checkpoint(fixture_copy, tmp_path, quant, error):
    src = fixture_copy(DENSE)
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config")
    if quant is not None:
        config["quantization_config"] = quant
    (src / "config.json").write_text(json.dumps(config))
    result = run_convert(src, tmp_path / "out")
    assert result.exit_code == 3 and error in result.stderr and "config.json" in result.stderr


@pytest.mark.parametrize(
    "where,value,words",
    [
        ("quantization_config", [1, 2], "quantization_config is [1, 2] (list), not a JSON object"),
        ("quantization_config", "fp8", "quantization_config is 'fp8' (str), not a JSON object"),
        ("text_config.quantization_config", 8, "text_config.quantization_config is 8 (int), not a JSON object"),
    ],
)
def test_a_quantization_config_that_is_not_an_object_is_named(fixture_copy, tmp_path, where, value, words):
    """It was taken for none at all: "config.json has no quantization_config" of an FP8 checkpoint."""
    src = fixture_copy(DENSE)
    config = json.loads((src / "config.json").read_text())
    if where == "quantization_config":
        config["quantization_config"] = value
    else:
        config["text_config"] = {"quantization_config": value}
    (src / "config.json").write_text(json.dumps(config))
    for args in (["convert", str(src), str(tmp_path / "out")], ["inspect", str(src)]):
        result = runner.invoke(app, [*args, "--json"])
        assert result.exit_code == 3, result.output
        report = json.loads(result.stdout.splitlines()[0])
        assert report["error"] == "ConfigError" and words in report["message"], report
    assert not (tmp_path / "out").exists()


def test_existing_output_is_refused_unless_overwrite(fixture_copy, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    src = fixture_copy(DENSE)
    result = run_convert(src, out)
    assert result.exit_code == 2 and "not empty" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"
    result = run_convert(src, out, "--overwrite")  # not a package: --overwrite refuses to delete it
    assert result.exit_code == 2 and "only an earlier package" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    assert run_convert(src, out).exit_code == 0  # an empty OUT needs no --overwrite
    (out / "stale.safetensors.index.json").write_text("{}")  # a file an earlier package may have held
    result = run_convert(src, out, "--overwrite")
    assert result.exit_code == 0 and not (out / "stale.safetensors.index.json").exists()
    assert (out / "quant_model_description.json").exists()


def test_usage_errors_exit_2(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    for extra in (["--scheme", "w2"], ["--scale-rule", "x"], ["--override", "bad"], ["--max-shard-size", "lots"]):
        result = run_convert(src, tmp_path / "out", *extra)
        assert result.exit_code == 2, (extra, result.output)
    assert not (tmp_path / "out").exists()


def test_missing_source_and_uncached_repo_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    result = run_convert(tmp_path / "nope", tmp_path / "out")
    assert result.exit_code == 3 and "no such directory" in result.stderr
    result = run_convert("someorg/somemodel-FP8", tmp_path / "out", "--json")
    assert result.exit_code == 3
    assert json.loads(result.stdout.splitlines()[0])["error"] == "NotCachedError"


def test_header_length_beyond_file(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    shard = src / "model.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[:8] = struct.pack("<Q", len(raw) * 2)
    shard.write_bytes(bytes(raw))
    result = run_convert(src, tmp_path / "out")
    assert result.exit_code == 3 and "does not fit" in result.stderr


def test_interrupt_exits_130_and_leaves_nothing(fixture_copy, tmp_path, monkeypatch):
    import ascendconv.convert

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ascendconv.convert, "write_package_files", interrupted)
    result = run_convert(fixture_copy(DENSE), tmp_path / "out")
    assert result.exit_code == 130 and "interrupted" in result.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "src"]


def test_failure_mid_stream_leaves_nothing(fixture_copy, tmp_path):
    from ascendconv.convert import ConvertOptions, convert

    def failing_progress(done, total):
        if done > total // 2:
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        convert(fixture_copy("qwen3-moe-fp8"), tmp_path / "out", ConvertOptions(max_shard_size=100_000), failing_progress)
    assert list(tmp_path.iterdir()) == [tmp_path / "src"]


def test_a_name_defined_twice_names_its_first_and_second_shard():
    from ascendconv.io.safetensors import SafetensorsHeader, TensorEntry
    from ascendconv.sources.checkpoint import merge_headers

    def header(file: str, *names: str) -> SafetensorsHeader:
        path = Path(file)
        entries = {n: TensorEntry(n, "BF16", (1,), path, 8 + 2 * i, 2) for i, n in enumerate(names)}
        return SafetensorsHeader(path, 8 + 2 * len(names), 8, entries, {}, b"")

    one, two, three = header("a.safetensors", "x", "y"), header("b.safetensors", "z"), header("c.safetensors", "w", "y", "z")
    assert list(merge_headers([one, two], None, Path("i.json"))) == ["x", "y", "z"]
    with pytest.raises(DuplicateTensorError, match=r"tensor 'y' is defined twice: in a.safetensors and in c.safetensors"):
        merge_headers([one, two, three], None, Path("i.json"))


_SHARD_FILES = ["a.safetensors", "b.safetensors", "c.safetensors"]


@given(
    st.dictionaries(st.sampled_from("tuvwxyz"), st.sampled_from(_SHARD_FILES), min_size=1),  # name -> its shard
    st.lists(
        st.tuples(
            st.sampled_from("tuvwxyzq"),
            st.one_of(st.sampled_from(["d.safetensors", None, *_SHARD_FILES]), st.lists(st.just("a"), max_size=1)),
        ),
        max_size=3,
    ),  # index entries changed, added (q) or removed (None)
)
def test_the_index_agrees_with_the_headers_exactly_when_it_maps_each_of_their_tensors_to_its_shard(stored, edits):
    """_index_agrees' grouped check is the plain one: the index is the headers' name -> shard map."""
    from ascendconv.io.safetensors import SafetensorsHeader, TensorEntry
    from ascendconv.sources.checkpoint import _index_agrees

    headers = []
    for file in _SHARD_FILES:
        path, names = Path(file), [n for n, f in stored.items() if f == file]
        entries = {n: TensorEntry(n, "BF16", (1,), path, 8 + 2 * i, 2) for i, n in enumerate(names)}
        headers.append(SafetensorsHeader(path, 8 + 2 * len(names), 8, entries, {}, b""))
    weight_map = dict(stored)
    for name, file in edits:
        if file is None:
            weight_map.pop(name, None)
        else:
            weight_map[name] = file
    expected = weight_map == {n: h.path.name for h in headers for n in h.tensors}
    assert _index_agrees(headers, weight_map, len(stored)) is expected


# --- static activation scales: one refusal, whatever the format ----------------------------------

MOE, DEEPSEEK = "qwen3-moe-fp8", "deepseek-v3-fp8"
EXPERT = "model.layers.1.mlp.experts.2.down_proj"
# format -> (its source, built into a directory; a tensor of a quantized linear; the static scale put beside it)
STATIC_SCALES = {
    "hf-fp8-block": (lambda d: FIXTURES / DENSE, Q + ".weight", Q + ".input_scale"),
    "deepseek-v4-fp8": (lambda d: as_ds_v4(FIXTURES / DEEPSEEK, d / "v4", "F8_E8M0"),
                        "model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.q_a_proj.input_scale"),
    "ct-fp8": (lambda d: as_ct(FIXTURES / DENSE, d / "ct"), Q + ".weight", Q + ".input_scale"),
    "float": (lambda d: as_float(FIXTURES / DENSE, d / "bf16"), Q + ".weight", Q + ".input_scale"),
    "ct-mx": (lambda d: as_mx(FIXTURES / MOE, d / "mx", "ct", lambda p: MXFP4), Q + ".weight_packed", Q + ".input_scale"),
    "quark-ocp-mx": (lambda d: as_mx(FIXTURES / MOE, d / "mx", "quark", experts_mxfp4), EXPERT + ".weight", EXPERT + ".input_scale"),
    "modelopt-mxfp8": (lambda d: as_mx(FIXTURES / MOE, d / "mx", "modelopt", lambda p: MXFP8), Q + ".weight", Q + ".input_scale"),
    "mxfp4-fused": (lambda d: as_vllm_fused(as_mx(FIXTURES / MOE, d / "mx", "ct", lambda p: MXFP4), d / "fused"),
                    "model.layers.1.mlp.experts.w13_weight", "model.layers.1.mlp.experts.w13_input_scale"),
}


@pytest.mark.parametrize("build,beside,stray", STATIC_SCALES.values(), ids=STATIC_SCALES.keys())
def test_a_static_input_scale_is_refused_in_every_format(tmp_path, build, beside, stray):
    """A static activation scale beside a quantized linear was copied into the package as FLOAT
    (only compressed-tensors' config refused it); every format refuses the tensor in the same words."""

    def tensor(name, entry):
        return {name: entry, **({stray: ("F32", (1,), np.ones(1, np.float32).tobytes())} if name == beside else {})}

    src = respell(build(tmp_path), tmp_path / "static", tensor, lambda c: c)
    out = tmp_path / "out"
    result = run_convert(src, out, "--json")
    assert result.exit_code == 3, result.output
    report = json.loads(result.stdout.strip().splitlines()[0])
    assert report["error"] == "StaticActivationError", report
    assert stray in report["message"] and "static activation scale" in report["message"], report["message"]
    assert "a static input_scale has no place in the package" in report["hint"]
    assert not out.exists()
