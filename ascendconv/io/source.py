"""The source side: a Hugging Face checkpoint directory, its config and its validated tensor map.

`SourceCheckpoint.open` reads config.json and every shard header (never tensor data) and pairs each
F8_E4M3 weight with its `weight_scale_inv` (contract section 1). Value checks that need data (finite
scales, NaN codes) happen where the data is read: `read_scale` here, the codes in convert.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ascendconv.errors import (
    ConfigError,
    DuplicateTensorError,
    IndexMismatchError,
    MissingScaleError,
    MissingShardError,
    NonFiniteScaleError,
    NotBlockFP8Error,
    NotFoundError,
    OrphanScaleError,
    ScaleDtypeError,
    ScaleShapeError,
    UnrecognizedCheckpointError,
    UnsupportedTensorError,
    shown,
)
from ascendconv.gcpause import gc_paused
from ascendconv.io.files import is_regular, is_within, read_json
from ascendconv.io.rules import check_source_tensors
from ascendconv.io.safetensors import SafetensorsHeader, TensorEntry, TensorReader, read_header

if TYPE_CHECKING:
    import numpy as np

INDEX_NAME = "model.safetensors.index.json"
SCALE_SUFFIX = ".weight_scale_inv"
WEIGHT_SUFFIX = ".weight"
SCALE_DTYPES = ("F32", "BF16")
MAX_BLOCK = 2**31 - 1  # tile sides beyond any checkpoint, within the kernels' integer arithmetic
# How configs name the E4M3 format (DeepSeek: "e4m3"; MiniMax-M2: "float8_e4m3fn", torch's name).
# The name only has to mean E4M3: each weight's F8_E4M3 dtype is what pair_fp8_linears checks.
E4M3_SPELLINGS = ("e4m3", "e4m3fn", "float8_e4m3fn", "float8_e4m3", "fp8_e4m3")


@dataclass(frozen=True)
class BlockFP8Config:
    """`quantization_config` of a block-wise FP8 checkpoint."""

    block: tuple[int, int]  # (rows of N, columns of K) per scale tile
    activation_scheme: str
    fmt: str
    scale_fmt: str | None
    modules_to_not_convert: tuple[str, ...]
    location: str  # "quantization_config" or "text_config.quantization_config"


@dataclass(frozen=True)
class Fp8Linear:
    """A quantized linear of the source: E4M3 weight [N, K] plus its tile scales."""

    prefix: str
    weight: TensorEntry
    scale: TensorEntry
    bias: TensorEntry | None

    @property
    def shape(self) -> tuple[int, int]:
        return self.weight.shape  # type: ignore[return-value]


def find_quantization_config(config: dict) -> tuple[dict | None, str]:
    if isinstance(config.get("quantization_config"), dict):
        return config["quantization_config"], "quantization_config"
    text = config.get("text_config")
    if isinstance(text, dict) and isinstance(text.get("quantization_config"), dict):
        return text["quantization_config"], "text_config.quantization_config"
    return None, ""


def parse_block_fp8_config(config: dict, config_path: Path) -> BlockFP8Config:
    """Accept only block-wise FP8 with dynamic activations; name the reason otherwise."""
    quant, location = find_quantization_config(config)
    if quant is None:
        raise NotBlockFP8Error(f"{config_path}: no quantization_config (this is not an FP8 checkpoint)")
    method = quant.get("quant_method")
    if method != "fp8":
        raise NotBlockFP8Error(f"{config_path}: {location}.quant_method is {shown(method)}, expected 'fp8'")
    block = quant.get("weight_block_size")
    if block is None:
        raise NotBlockFP8Error(
            f"{config_path}: {location} has no weight_block_size (per-tensor FP8 is not block-wise FP8)"
        )
    if not (
        isinstance(block, list)
        and len(block) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and 0 < b <= MAX_BLOCK for b in block)
    ):
        raise ConfigError(
            f"{config_path}: {location}.weight_block_size is {shown(block)}, expected [bn, bk] "
            f"(integers from 1 to {MAX_BLOCK})"
        )
    scheme = quant.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise NotBlockFP8Error(
            f"{config_path}: {location}.activation_scheme is {shown(scheme)}; only 'dynamic' is supported"
        )
    fmt = quant.get("fmt", "e4m3")
    if not (isinstance(fmt, str) and fmt.lower() in E4M3_SPELLINGS):
        raise NotBlockFP8Error(
            f"{config_path}: {location}.fmt is {shown(fmt)}; only E4M3 weights are supported "
            f"({', '.join(repr(s) for s in E4M3_SPELLINGS)})"
        )
    skipped = quant.get("modules_to_not_convert") or quant.get("ignored_layers") or []
    if not (isinstance(skipped, list) and all(isinstance(m, str) for m in skipped)):
        raise ConfigError(
            f"{config_path}: {location}.modules_to_not_convert is {shown(skipped)}, expected a list of module names"
        )
    return BlockFP8Config(
        block=(block[0], block[1]),
        activation_scheme=scheme,
        fmt=fmt,
        scale_fmt=quant.get("scale_fmt"),
        modules_to_not_convert=tuple(skipped),
        location=location,
    )


def load_config(root: Path) -> tuple[dict, Path]:
    path = root / "config.json"
    if not path.is_file():
        raise UnrecognizedCheckpointError(f"{root}: no config.json")
    config = read_json(path, ConfigError)
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: not a JSON object", "fix or re-download config.json")
    return config, path


def discover_shards(root: Path, index_name: str = INDEX_NAME) -> tuple[list[Path], dict[str, str] | None]:
    """The weight files of a directory: from its index, a single file, or bare shards.

    Returns the shard paths (sorted) and the index's weight_map when there is an index.
    """
    index_path = root / index_name
    if index_path.is_file():
        index = read_json(index_path, IndexMismatchError)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise IndexMismatchError(f"{index_path}: cannot read the index (no weight_map object)")
        for name, file in weight_map.items():
            if not isinstance(file, str) or file in ("", ".", "..") or os.path.basename(file) != file:
                raise IndexMismatchError(
                    f"{index_path}: tensor {shown(name)} is mapped to {shown(file)}, not to a file name in {root}"
                )
        names = sorted(set(weight_map.values()))
        for name in names:
            if not is_regular(root / name):
                users = sorted(t for t, f in weight_map.items() if f == name)
                found = "is not a regular file" if os.path.exists(root / name) else "is not"
                raise MissingShardError(
                    f"{index_path}: shard {shown(name)} is named for {len(users)} tensors "
                    f"(first: {shown(users[0])}) but {found} in {root}"
                )
        return [root / n for n in names], weight_map
    shards = sorted(p for p in root.glob("*.safetensors") if is_regular(p))
    return shards, None


def merge_headers(
    headers: list[SafetensorsHeader], weight_map: dict[str, str] | None, index_path: Path
) -> dict[str, TensorEntry]:
    """One name -> entry map over all shards; duplicates and index disagreements are errors."""
    tensors: dict[str, TensorEntry] = {}
    for header in headers:
        for name, entry in header.tensors.items():
            if name in tensors:
                raise DuplicateTensorError(
                    f"tensor {shown(name)} is defined twice: in {tensors[name].path.name} and in {header.path.name}"
                )
            tensors[name] = entry
    if weight_map is not None:
        for name, file in weight_map.items():
            entry = tensors.get(name)
            if entry is None:
                raise IndexMismatchError(f"{index_path}: tensor {shown(name)} is mapped to {shown(file)} but no shard holds it")
            if entry.path.name != file:
                raise IndexMismatchError(
                    f"{index_path}: tensor {shown(name)} is mapped to {shown(file)} but is stored in {shown(entry.path.name)}"
                )
        extra = sorted(set(tensors) - set(weight_map))
        if extra:
            raise IndexMismatchError(
                f"{index_path}: tensor {shown(extra[0])} in {tensors[extra[0]].path.name} is missing from the index"
                + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
            )
    return tensors


def pair_fp8_linears(tensors: dict[str, TensorEntry], block: tuple[int, int]) -> dict[str, Fp8Linear]:
    """Pair every F8_E4M3 weight with its scale and check the scale's dtype and shape."""
    linears: dict[str, Fp8Linear] = {}
    for name, entry in tensors.items():
        if name.endswith(SCALE_SUFFIX):
            weight_name = name[: -len(SCALE_SUFFIX)] + WEIGHT_SUFFIX
            weight = tensors.get(weight_name)
            if weight is None or weight.dtype != "F8_E4M3":
                found = "is missing" if weight is None else f"is {weight.dtype}"
                raise OrphanScaleError(
                    f"{entry.path.name}: scale {shown(name)} has no F8_E4M3 weight: {shown(weight_name)} {found}"
                )
            continue
        if entry.dtype not in ("F8_E4M3", "F8_E5M2"):
            continue
        if entry.dtype == "F8_E5M2" or not name.endswith(WEIGHT_SUFFIX) or len(entry.shape) != 2:
            raise UnsupportedTensorError(
                f"{entry.path.name}: tensor {shown(name)} is {entry.dtype} {list(entry.shape)}; only 2-D "
                "F8_E4M3 '.weight' tensors are supported",
                "this checkpoint uses an FP8 layout ascendconv does not know",
            )
        prefix = name[: -len(WEIGHT_SUFFIX)]
        scale = tensors.get(prefix + SCALE_SUFFIX)
        if scale is None:
            raise MissingScaleError(
                f"{entry.path.name}: F8_E4M3 weight {shown(name)} has no {shown(prefix + SCALE_SUFFIX)} in any shard"
            )
        if scale.dtype not in SCALE_DTYPES:
            raise ScaleDtypeError(
                f"{scale.path.name}: {shown(scale.name)} is {scale.dtype}, expected one of {', '.join(SCALE_DTYPES)}"
            )
        n, k = entry.shape
        expected = (math.ceil(n / block[0]), math.ceil(k / block[1]))
        if scale.shape != expected:
            raise ScaleShapeError(
                f"{scale.path.name}: {shown(scale.name)} has shape {list(scale.shape)}, expected {list(expected)} "
                f"for weight {list(entry.shape)} with weight_block_size {list(block)}"
            )
        linears[prefix] = Fp8Linear(prefix, entry, scale, tensors.get(prefix + ".bias"))
    return linears


@dataclass
class SourceCheckpoint:
    root: Path
    config: dict
    config_path: Path
    quant: BlockFP8Config
    headers: list[SafetensorsHeader]
    tensors: dict[str, TensorEntry]  # every tensor, in (file, offset) order
    linears: dict[str, Fp8Linear]  # by module prefix
    reader: TensorReader = field(default_factory=TensorReader, repr=False)

    @classmethod
    @gc_paused()  # about 100,000 header entries for a full-scale checkpoint
    def open(cls, path: str | os.PathLike) -> "SourceCheckpoint":
        root = Path(path)
        if not root.is_dir():
            raise NotFoundError(f"{root}: no such directory", "pass the checkpoint directory")
        config, config_path = load_config(root)
        quant = parse_block_fp8_config(config, config_path)
        shard_paths, weight_map = discover_shards(root)
        if not shard_paths:
            raise UnrecognizedCheckpointError(f"{root}: no *.safetensors files")
        headers = [read_header(p) for p in shard_paths]
        tensors = merge_headers(headers, weight_map, root / INDEX_NAME)
        tensors = dict(sorted(tensors.items(), key=lambda kv: (kv[1].path.name, kv[1].offset)))
        linears = pair_fp8_linears(tensors, quant.block)
        check_source_tensors(root, tensors, linears, config)
        return cls(root, config, config_path, quant, headers, tensors, linears)

    def companion_files(self) -> tuple[list[str], dict[str, str]]:
        """Top-level files that may be carried into the package, and the ones that may not, with why.

        Only regular files whose real path stays inside the source directory qualify, or inside the
        Hugging Face cache's blob store when the source is a cache snapshot (whose files link there):
        a link to /proc/self/environ or a secret elsewhere must never end up in a package.
        """
        real_root = Path(os.path.realpath(self.root))
        allowed = [real_root]
        if real_root.parent.name == "snapshots":
            allowed.append(real_root.parent.parent / "blobs")
        safe: list[str] = []
        refused: dict[str, str] = {}
        for path in sorted(self.root.iterdir()):
            if not path.is_symlink() and path.is_dir():
                continue
            real = Path(os.path.realpath(path))
            if not any(is_within(real, base) for base in allowed):
                refused[path.name] = f"links outside the source directory (to {real})"
            elif not real.is_file():
                refused[path.name] = "is not a regular file"
            else:
                safe.append(path.name)
        return safe, refused

    @property
    def total_bytes(self) -> int:
        return sum(h.file_size for h in self.headers)

    @property
    def scale_names(self) -> set[str]:
        return {linear.scale.name for linear in self.linears.values()}

    def read_scale(self, linear: Fp8Linear) -> np.ndarray:
        """The tile scales as float32, checked finite."""
        import numpy as np  # not at import: commands that read only headers never need it

        scale = self.reader.read(linear.scale).astype(np.float32)
        if not np.isfinite(scale).all():
            bad = np.argwhere(~np.isfinite(scale))[0]
            raise NonFiniteScaleError(
                f"{linear.scale.path.name}: {shown(linear.scale.name)} holds {scale[tuple(bad)]} at tile {bad.tolist()}"
            )
        return scale

    def close(self) -> None:
        self.reader.close()
