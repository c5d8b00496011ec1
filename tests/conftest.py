"""Shared helpers: the bundled fixtures, a converted-package cache, and shard surgery for bad inputs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from ascendconv.io.safetensors import NUMPY_DTYPES, TensorReader, read_header
from ascendconv.io.writer import ShardWriter, TensorSpec

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FIXTURE_NAMES = ("qwen3-dense-fp8", "qwen3-moe-fp8", "deepseek-v3-fp8")
SCHEMES = ("w8a8-mxfp8", "w4a8-mxfp", "w4a8-mxfp-moe")
RULES = ("floor", "rceil", "mse")

# The provenance's date is the one field of a package that depends on when it was written; pinned
# here (and in every subprocess), packages of separate runs compare byte for byte as a whole. The
# tests that need the clock remove it.
os.environ.setdefault("SOURCE_DATE_EPOCH", "1764624600")


def file_digest(path: Path, algorithm: str = "blake3") -> str:
    """The digest provenance records for a file, computed independently of ascendconv."""
    import hashlib

    import blake3

    data = path.read_bytes()
    return blake3.blake3(data).hexdigest() if algorithm == "blake3" else hashlib.sha256(data).hexdigest()


def load_shard(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """name -> (dtype, shape, raw bytes), in file order."""
    header = read_header(path)
    with TensorReader() as reader:
        ordered = sorted(header.tensors.values(), key=lambda e: e.offset)
        return {e.name: (e.dtype, e.shape, bytes(reader.read_bytes(e))) for e in ordered}


def save_shard(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]]) -> None:
    writer = ShardWriter(path, [TensorSpec(n, d, tuple(s)) for n, (d, s, _) in tensors.items()])
    for name, (_, _, data) in tensors.items():
        writer.write(name, data)
    writer.close()


def as_array(entry: tuple[str, tuple[int, ...], bytes]) -> np.ndarray:
    dtype, shape, data = entry
    return np.frombuffer(data, NUMPY_DTYPES[dtype]).reshape(shape)


@pytest.fixture
def fixture_copy(tmp_path):
    """A writable copy of a bundled fixture: fixture_copy('qwen3-dense-fp8') -> Path."""

    def make(name: str) -> Path:
        target = tmp_path / "src" / name
        shutil.copytree(FIXTURES / name, target)
        return target

    return make


_converted: dict[tuple, Path] = {}


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """Convert a fixture once per session per option set: converted(fixture, scheme, rule, **kw) -> Path."""
    from ascendconv.convert import ConvertOptions, convert

    def make(fixture: str, scheme: str = "w8a8-mxfp8", rule: str = "mse", **options) -> Path:
        key = (fixture, scheme, rule, tuple(sorted(options.items())))
        if key not in _converted:
            out = tmp_path_factory.mktemp("pkg") / "out"
            convert(FIXTURES / fixture, out, ConvertOptions(scheme=scheme, scale_rule=rule, **options))
            _converted[key] = out
        return _converted[key]

    return make


def write_large_checkpoint(root: Path, shards: int = 2, linears_per_shard: int = 2, n: int = 2048, k: int = 8192) -> Path:
    """A block-FP8 checkpoint of real weight bytes, big enough that converting it takes a while
    (shards x linears x n x k bytes): for tests that must catch a conversion in the middle."""
    import json

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    weight_map = {}
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for i in range(linears_per_shard):
            prefix = f"model.layers.{shard * linears_per_shard + i}.mlp.down_proj"
            codes = rng.integers(0, 0x7E, size=(n, k), dtype=np.uint8)  # no NaN codes (0x7F, 0xFF)
            scales = rng.uniform(1e-4, 1e-3, size=(-(-n // 128), -(-k // 128))).astype(np.float32)
            tensors[prefix + ".weight"] = ("F8_E4M3", (n, k), codes.tobytes())
            tensors[prefix + ".weight_scale_inv"] = ("F32", scales.shape, scales.tobytes())
        save_shard(root / file, tensors)
        weight_map.update({name: file for name in tensors})
    config = {
        "model_type": "qwen3",
        "num_hidden_layers": shards * linears_per_shard,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
    }
    (root / "config.json").write_text(json.dumps(config))
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root
