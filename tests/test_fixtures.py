"""The committed fixtures in fixtures/ are exactly what scripts/make_fixtures.py produces,
and they are well-formed Hugging Face block-FP8 checkpoints.

Headers are parsed here by hand: safetensors cannot hand F8 tensors to numpy (its
issue #682), so the library is only used to check that it opens every file and lists the
same keys.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import struct
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
SIZE_LIMIT = 2_000_000  # bytes, all fixtures together
BLOCK = 128


def _load_script():
    spec = importlib.util.spec_from_file_location("make_fixtures", REPO / "scripts" / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_fixtures", module)
    spec.loader.exec_module(module)
    return module


mf = _load_script()
FIXTURE_DIRS = mf.FIXTURE_DIRS
SCALE_DTYPE = {"qwen3-dense-fp8": "BF16", "qwen3-moe-fp8": "F32", "deepseek-v3-fp8": "F32"}


# --------------------------------------------------------------------------- helpers


def read_safetensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """name -> (dtype, shape, payload bytes), checking the container as we go."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), f"{path}: header length {n} past end of file"
    header = json.loads(raw[8 : 8 + n])
    assert "__metadata__" not in header, f"{path}: unexpected metadata"
    data = raw[8 + n :]
    itemsize = {"F8_E4M3": 1, "BF16": 2, "F32": 4}
    out, spans = {}, []
    for name, info in header.items():
        begin, end = info["data_offsets"]
        assert end - begin == math.prod(info["shape"]) * itemsize[info["dtype"]], f"{path}: {name} size"
        assert 0 <= begin <= end <= len(data), f"{path}: {name} out of bounds"
        spans.append((begin, end))
        out[name] = (info["dtype"], info["shape"], data[begin:end])
    spans.sort()
    assert spans[0][0] == 0 and spans[-1][1] == len(data), f"{path}: data not fully covered"
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), f"{path}: offsets not contiguous"
    return out


def load_checkpoint(d: Path) -> dict[str, tuple[str, list[int], bytes, str]]:
    """All tensors of a fixture: name -> (dtype, shape, payload, file name)."""
    tensors: dict[str, tuple[str, list[int], bytes, str]] = {}
    for f in sorted(d.glob("*.safetensors")):
        for name, (dtype, shape, payload) in read_safetensors(f).items():
            assert name not in tensors, f"{name} stored twice ({tensors[name][3]}, {f.name})"
            tensors[name] = (dtype, shape, payload, f.name)
    return tensors


def digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def to_float32(dtype: str, payload: bytes) -> np.ndarray:
    np_dtype = {"F32": np.float32, "BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn}[dtype]
    return np.frombuffer(payload, np_dtype).astype(np.float32)


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fixtures")
    mf.main(out)
    return out


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", FIXTURE_DIRS)
def test_committed_fixture_is_what_the_script_generates(name, regenerated):
    committed, fresh = digests(FIXTURES / name), digests(regenerated / name)
    assert committed.keys() == fresh.keys(), "file lists differ: rerun scripts/make_fixtures.py"
    changed = [f for f in committed if committed[f] != fresh[f]]
    assert not changed, f"{name}: {changed} differ from the generator's output; rerun scripts/make_fixtures.py"


def test_generator_is_deterministic(tmp_path, regenerated):
    mf.main(tmp_path)
    for name in FIXTURE_DIRS:
        assert digests(tmp_path / name) == digests(regenerated / name)


def test_total_size_under_limit():
    total = sum(p.stat().st_size for name in FIXTURE_DIRS for p in (FIXTURES / name).rglob("*") if p.is_file())
    assert total < SIZE_LIMIT, f"fixtures take {total} bytes, limit {SIZE_LIMIT}"


@pytest.mark.parametrize("name", FIXTURE_DIRS)
def test_safetensors_library_reads_the_same_keys(name):
    for f in sorted((FIXTURES / name).glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as st:
            assert sorted(st.keys()) == sorted(read_safetensors(f))
            assert not st.metadata()


@pytest.mark.parametrize("name", FIXTURE_DIRS)
def test_every_fp8_weight_has_a_well_formed_scale(name):
    tensors = load_checkpoint(FIXTURES / name)
    n_fp8 = 0
    for t, (dtype, shape, payload, _) in tensors.items():
        if t.endswith(".weight_scale_inv"):
            assert tensors[t.removesuffix("_scale_inv")][0] == "F8_E4M3", f"{t} has no FP8 weight"
        if dtype != "F8_E4M3":
            continue
        n_fp8 += 1
        assert t.endswith(".weight")
        s_dtype, s_shape, s_payload, _ = tensors[f"{t}_scale_inv"]
        n, k = shape
        assert s_dtype == SCALE_DTYPE[name]
        assert s_shape == [-(-n // BLOCK), -(-k // BLOCK)], f"{t}: scale shape {s_shape} for {shape}"
        scale = to_float32(s_dtype, s_payload)
        assert np.isfinite(scale).all() and (scale > 0).all()
        if name == "deepseek-v3-fp8":  # ue8m0: powers of two
            assert (np.frexp(scale)[0] == 0.5).all(), f"{t}: scale not a power of two"
    assert n_fp8 > 0


@pytest.mark.parametrize("name", FIXTURE_DIRS)
def test_no_nan_codes_in_fp8_payloads(name):
    for t, (dtype, _, payload, _) in load_checkpoint(FIXTURES / name).items():
        if dtype == "F8_E4M3":
            codes = np.frombuffer(payload, np.uint8)
            assert not np.isin(codes, (0x7F, 0xFF)).any(), f"{t}: NaN code"


@pytest.mark.parametrize("name", FIXTURE_DIRS)
def test_dequantized_weights_match_the_drawn_matrices(name):
    """codes * tile scale reproduces the float32 matrix the generator drew (FP8 error only)."""
    spec = {s["dir"]: s for s in (mf.QWEN3_DENSE, mf.QWEN3_MOE, mf.DEEPSEEK_V3)}[name]
    tensors = load_checkpoint(FIXTURES / name)
    for t, (dtype, shape, payload, _) in tensors.items():
        if dtype != "F8_E4M3":
            continue
        s_dtype, s_shape, s_payload, _ = tensors[f"{t}_scale_inv"]
        scale = to_float32(s_dtype, s_payload).reshape(s_shape)
        full = np.repeat(np.repeat(scale, BLOCK, 0), BLOCK, 1)[: shape[0], : shape[1]]
        w = to_float32(dtype, payload).reshape(shape) * full
        ref = mf.make_weight(spec["seed"], t, tuple(shape))
        rel = np.linalg.norm(w - ref) / np.linalg.norm(ref)
        assert rel < 0.05, f"{t}: relative error {rel:.4f}"


@pytest.mark.parametrize("name", ["qwen3-moe-fp8", "deepseek-v3-fp8"])
def test_index_matches_the_shards(name):
    d = FIXTURES / name
    text = (d / "model.safetensors.index.json").read_text()
    index = json.loads(text)
    tensors = load_checkpoint(d)
    assert list(index) == ["metadata", "weight_map"]
    assert list(index["weight_map"]) == sorted(index["weight_map"])
    assert index["weight_map"] == {t: v[3] for t, v in tensors.items()}
    assert index["metadata"] == {"total_size": sum(len(v[2]) for v in tensors.values())}
    n = {"qwen3-moe-fp8": 3, "deepseek-v3-fp8": 2}[name]
    assert sorted(set(index["weight_map"].values())) == [
        f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)
    ]


def test_fixture_edge_cases_are_present():
    """The cases the converter's tests rely on; change them only together with those tests."""
    dense = load_checkpoint(FIXTURES / "qwen3-dense-fp8")
    assert [p.name for p in (FIXTURES / "qwen3-dense-fp8").glob("*.safetensors")] == ["model.safetensors"]
    assert dense["model.layers.0.mlp.down_proj.weight"][1] == [256, 192]  # K % 64 == 0, % 128 != 0
    assert dense["model.layers.1.mlp.down_proj.weight"][1] == [256, 160]  # K % 32 == 0, % 64 != 0
    assert dense["model.layers.0.self_attn.k_proj.weight"][1] == [64, 256]  # N < one tile
    assert dense["model.layers.0.self_attn.q_proj.bias"][0] == "BF16"

    moe = load_checkpoint(FIXTURES / "qwen3-moe-fp8")
    config = json.loads((FIXTURES / "qwen3-moe-fp8" / "config.json").read_text())
    o_proj = "model.layers.0.self_attn.o_proj"
    assert o_proj in config["quantization_config"]["modules_to_not_convert"]
    assert moe[f"{o_proj}.weight"][0] == "BF16" and f"{o_proj}.weight_scale_inv" not in moe
    assert moe["model.layers.1.self_attn.o_proj.weight"][0] == "F8_E4M3"
    split = "model.layers.0.mlp.experts.3.down_proj.weight"
    assert moe[split][3] != moe[f"{split}_scale_inv"][3]
    assert (FIXTURES / "qwen3-moe-fp8" / "tokenizer.model").stat().st_size > 0

    ds = load_checkpoint(FIXTURES / "deepseek-v3-fp8")
    config = json.loads((FIXTURES / "deepseek-v3-fp8" / "config.json").read_text())
    assert config["quantization_config"]["scale_fmt"] == "ue8m0"
    assert ds["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"][1] == [576, 128]  # ragged N, as DeepSeek-V3
    assert ds["model.layers.1.mlp.gate.e_score_correction_bias"][0] == "F32"
    assert ds["model.layers.1.mlp.gate.weight"][0] == "BF16"
    split = "model.layers.1.mlp.shared_experts.down_proj.weight"
    assert ds[split][3] != ds[f"{split}_scale_inv"][3]
    for f in ("configuration_deepseek.py", "vocab.tiktoken"):
        assert (FIXTURES / "deepseek-v3-fp8" / f).is_file()


@pytest.mark.parametrize("name", FIXTURE_DIRS)
def test_config_declares_block_fp8(name):
    config = json.loads((FIXTURES / name / "config.json").read_text())
    q = config["quantization_config"]
    assert q["quant_method"] == "fp8" and q["activation_scheme"] == "dynamic"
    assert q["weight_block_size"] == [BLOCK, BLOCK]
