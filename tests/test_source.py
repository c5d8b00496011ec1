"""The source reader on the bundled fixtures, config variants, index problems and the HF cache."""

from __future__ import annotations

import json

import pytest

from ascendconv.errors import ConfigError, IndexMismatchError, NotBlockFP8Error, NotCachedError, NotFoundError, StaticActivationError
from ascendconv.io.hfcache import resolve_source
from ascendconv.sources import Source
from ascendconv.sources.hf_fp8_block import parse_block_fp8_config
from conftest import FIXTURES


def test_dense_fixture_has_bf16_scales_and_one_file():
    source = Source.open(FIXTURES / "qwen3-dense-fp8")
    assert [h.path.name for h in source.headers] == ["model.safetensors"]
    assert source.quant.block == (128, 128) and source.quant.location == "quantization_config"
    assert {linear.scale.dtype for linear in source.linears.values()} == {"BF16"}
    assert len(source.linears) == 14  # 2 layers x (q, k, v, o, gate, up, down)
    down = source.linears["model.layers.1.mlp.down_proj"]
    assert down.shape == (256, 160) and down.scale.shape == (2, 2)  # K % 32 == 0, K % 64 != 0


def test_moe_fixture_pairs_a_weight_with_a_scale_in_another_shard():
    source = Source.open(FIXTURES / "qwen3-moe-fp8")
    assert len(source.headers) == 3
    split = [l for l in source.linears.values() if l.weight.path != l.scale.path]
    assert split, "the fixture must hold a weight whose scale is in another shard"
    assert {linear.scale.dtype for linear in source.linears.values()} == {"F32"}
    assert "model.layers.0.self_attn.o_proj" not in source.linears  # left unquantized
    assert source.tensors["model.layers.0.self_attn.o_proj.weight"].dtype == "BF16"
    assert "model.layers.0.self_attn.o_proj" in source.quant.modules_to_not_convert


def test_deepseek_fixture_ragged_mla_projection_and_power_of_two_scales():
    source = Source.open(FIXTURES / "deepseek-v3-fp8")
    kv_a = source.linears["model.layers.0.self_attn.kv_a_proj_with_mqa"]
    assert kv_a.shape == (576, 128) and kv_a.scale.shape == (5, 1)
    assert source.quant.scale_fmt == "ue8m0"
    import numpy as np

    for linear in source.linears.values():
        scale = source.read_scale(linear)
        mantissa, _ = np.frexp(scale)
        assert (mantissa == 0.5).all()
    assert source.tensors["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == "F32"


def test_quantization_config_under_text_config_and_ignored_layers():
    config = {"text_config": {"quantization_config": {
        "quant_method": "fp8", "weight_block_size": [128, 64], "ignored_layers": ["lm_head"]}}}
    quant = parse_block_fp8_config(config, FIXTURES / "config.json")
    assert quant.block == (128, 64) and quant.modules_to_not_convert == ("lm_head",)
    assert quant.location == "text_config.quantization_config"
    with pytest.raises(ConfigError, match="weight_block_size"):
        parse_block_fp8_config({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}}, FIXTURES)
    with pytest.raises(NotBlockFP8Error, match="e5m2"):
        parse_block_fp8_config({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": "e5m2"}}, FIXTURES)


@pytest.mark.parametrize("fmt", ["e4m3", "float8_e4m3fn", "E4M3", "e4m3fn"])
def test_e4m3_spellings_of_real_configs_are_accepted(fmt):
    config = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": fmt}}
    assert parse_block_fp8_config(config, FIXTURES / "config.json").fmt == fmt


def test_null_fmt_activation_scheme_and_skip_lists_read_as_absent():
    # configs dumped from an object whose fields were unset write them null (transformers writes
    # modules_to_not_convert: null); null is not a static activation scheme nor a non-E4M3 format
    config = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": None,
                                      "activation_scheme": None, "modules_to_not_convert": None, "scale_fmt": None}}
    quant = parse_block_fp8_config(config, FIXTURES / "config.json")
    assert (quant.fmt, quant.activation_scheme, quant.modules_to_not_convert, quant.scale_fmt) == ("e4m3", "dynamic", (), None)
    with pytest.raises(StaticActivationError, match="'static'"):
        parse_block_fp8_config({"quantization_config": {**config["quantization_config"], "activation_scheme": "static"}}, FIXTURES)


@pytest.mark.parametrize("scheme, error", [("Static", StaticActivationError), (float("nan"), ConfigError), ("dynamc", ConfigError), (1, ConfigError)])
def test_an_activation_scheme_is_read_as_dynamic_static_or_named_as_neither(scheme, error):
    base = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    assert parse_block_fp8_config({"quantization_config": {**base, "activation_scheme": "Dynamic"}}, FIXTURES).block == (128, 128)
    with pytest.raises(error) as caught:
        parse_block_fp8_config({"quantization_config": {**base, "activation_scheme": scheme}}, FIXTURES / "config.json")
    static = "static activation scales" in caught.value.message
    assert static == (error is StaticActivationError)


@pytest.mark.parametrize("fmt", ["float8_e5m2", "mxfp8", 3])
def test_fmt_that_is_not_e4m3_is_refused(fmt):
    config = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": fmt}}
    with pytest.raises(NotBlockFP8Error, match="only E4M3 weights"):
        parse_block_fp8_config(config, FIXTURES / "config.json")


def test_minimax_fmt_spelling_opens_and_the_tensor_dtype_decides(fixture_copy):
    src = fixture_copy("qwen3-moe-fp8")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["fmt"] = "float8_e4m3fn"
    (src / "config.json").write_text(json.dumps(config))
    source = Source.open(src)
    assert source.quant.fmt == "float8_e4m3fn" and source.linears
    assert all(linear.weight.dtype == "F8_E4M3" for linear in source.linears.values())


def test_index_that_disagrees_with_the_shards(fixture_copy):
    src = fixture_copy("qwen3-moe-fp8")
    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name, file = next(iter(index["weight_map"].items()))
    other = next(f for f in sorted(set(index["weight_map"].values())) if f != file)
    index["weight_map"][name] = other
    index_path.write_text(json.dumps(index))
    with pytest.raises(IndexMismatchError, match=f"{name}.*mapped to '{other}'"):
        Source.open(src)
    del index["weight_map"][name]
    index_path.write_text(json.dumps(index))
    with pytest.raises(IndexMismatchError, match="missing from the index"):
        Source.open(src)
    # as many names as the shards hold, one of them renamed: the shards' name is missing from it
    index["weight_map"][name + "_renamed"] = file
    index_path.write_text(json.dumps(index))
    with pytest.raises(IndexMismatchError, match=f"{name}_renamed.*mapped to '{file}' but no shard holds it"):
        Source.open(src)


@pytest.mark.parametrize("bad", [1, True, None, 1.5, ["a.safetensors"], {"f": 1}, "", "..", "sub/a.safetensors"])
def test_an_index_mapping_a_tensor_to_no_file_name_names_its_first_such_tensor(tmp_path, bad):
    from ascendconv.sources.checkpoint import discover_shards

    (tmp_path / "a.safetensors").write_bytes(b"")
    weight_map = {"x": "a.safetensors", "y": bad, "z": bad, "w": 7}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(IndexMismatchError) as caught:
        discover_shards(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path / 'model.safetensors.index.json'}: tensor 'y' is mapped to {bad!r}, not to a file name")


def test_hf_cache_resolution(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    repo = cache / "models--Qwen--Qwen3-30B-A3B-FP8"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    assert resolve_source("Qwen/Qwen3-30B-A3B-FP8") == repo / "snapshots" / "abc123"
    assert resolve_source("Qwen/Qwen3-30B-A3B-FP8@abc123") == repo / "snapshots" / "abc123"
    with pytest.raises(NotCachedError, match="revision 'v2'.*cached: abc123"):
        resolve_source("Qwen/Qwen3-30B-A3B-FP8@v2")
    with pytest.raises(NotCachedError, match="not in the Hugging Face cache"):
        resolve_source("deepseek-ai/DeepSeek-V3")
    # refs/main naming a commit whose snapshot is missing: the message says which, not only "not in the cache"
    (repo / "refs" / "main").write_text("def456\n")
    with pytest.raises(NotCachedError) as missing:
        resolve_source("Qwen/Qwen3-30B-A3B-FP8")
    assert missing.value.message == (
        f"Qwen/Qwen3-30B-A3B-FP8: revision 'main' is not in the cache at {repo}: {repo / 'refs' / 'main'} names def456, "
        "which has no snapshot (cached: abc123)"
    )
    assert missing.value.hint == "download it first (e.g. `hf download REPO`) or pass a local directory"
    # refs/main a directory or a dangling link: named with the repo id, and the hint to remove it (a download
    # writes refs/main through a link, and fails on a directory)
    ref = repo / "refs" / "main"
    ref.unlink()
    for make, what in ((ref.mkdir, "is a directory, not a regular file"), (lambda: ref.symlink_to(tmp_path / "gone"),
                                                                            "cannot read (No such file or directory)")):
        make()
        with pytest.raises(NotCachedError) as damaged:
            resolve_source("Qwen/Qwen3-30B-A3B-FP8")
        assert damaged.value.message == f"Qwen/Qwen3-30B-A3B-FP8: {ref}: {what}"
        assert damaged.value.hint == f"the cache is damaged: remove {ref}, then download again"
        ref.rmdir() if ref.is_dir() and not ref.is_symlink() else ref.unlink()
    ref.write_text("abc123\n")
    with pytest.raises(NotFoundError):
        resolve_source(str(tmp_path / "missing" / "dir"))
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert resolve_source("Qwen/Qwen3-30B-A3B-FP8") == repo / "snapshots" / "abc123"
