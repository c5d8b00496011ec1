"""The source seam: what every source format hands the planner, the pipeline and verify.

A format module (one per published checkpoint format) reads its own config keys, pairs its own
tensors and returns a `Source`: the checkpoint, the quantizable linears as `SourceLinear`s, the
names of the tensors consumed with them (their scales), and what the provenance records of the
format. Above this floor nothing asks which format it reads: a linear's `encoding` says how its
rows decode, and the row operations of that encoding (`sources/rows.py`) do the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, ClassVar

from ascendconv.errors import NonFiniteScaleError, ScaleDtypeError, shown
from ascendconv.formats.constants import W4A8_MXFP, W8A8_MXFP8
from ascendconv.gcpause import record_builder
from ascendconv.io.safetensors import TensorEntry
from ascendconv.sources.checkpoint import Checkpoint

if TYPE_CHECKING:
    import numpy as np


class Encoding(str, Enum):
    """How the rows of a source linear's weight decode to values."""

    FP8_TILES = "fp8_tiles"  # E4M3 codes [N, K] times one float multiplier per (bn x bk) tile
    FLOAT = "float"  # BF16 / F16 / F32 values [N, K], quantized as they are; written FLOAT, copied
    # MX already (sources/mx_native.py): a payload with one E8M0 byte per 32 values along K, the
    # scale [N, K/32]; re-laid out where the written type is theirs, else decoded
    MX_E2M1 = "mx_e2m1"  # packed E2M1, U8 [N, K/2], element 2j in the low nibble
    MX_E4M3 = "mx_e4m3"  # E4M3 codes, F8_E4M3 [N, K]


# The package type each MX encoding already is, byte for byte.
NATIVE_TYPES = {Encoding.MX_E2M1: W4A8_MXFP, Encoding.MX_E4M3: W8A8_MXFP8}


WEIGHT_SUFFIX = ".weight"
BIAS_SUFFIX = ".bias"
# Scale tensors of FP8 tiles, as their formats store the multiplier: floats, or E8M0 bytes (2**(b-127)).
TILE_SCALE_DTYPES = ("F32", "BF16", "F16", "F8_E8M0")


@dataclass(frozen=True, slots=True)
class SourceLinear:
    """A quantizable [N, K] linear of the source, in any format: the tensor whose rows are streamed
    (`weight`), the scale tensor consumed with it (None for float values), and its bias."""

    prefix: str
    weight: TensorEntry
    scale: TensorEntry | None
    bias: TensorEntry | None
    block: tuple[int, int] | None  # (rows of N, columns of K) per scale tile; None without tiles
    encoding: Encoding = Encoding.FP8_TILES

    @property
    def copied_when_float(self) -> bool:
        """Written FLOAT, its bytes are the source's (float values); FP8 tiles are resolved to BF16."""
        return self.encoding is Encoding.FLOAT

    @property
    def shape(self) -> tuple[int, int]:
        """[N, K] of the values (a packed E2M1 weight stores K/2 bytes per row)."""
        if self.encoding is Encoding.MX_E2M1:
            n, k = self.weight.shape
            return n, 2 * k
        return self.weight.shape

    @property
    def native(self) -> str | None:
        """The package type the stored bytes already are (re-laid out, not re-quantized), or None."""
        return NATIVE_TYPES.get(self.encoding)


# SourceLinear(prefix, weight, scale, bias, block, encoding), every field given: what a format's
# pairing loop calls once per linear of a full-scale source
new_linear = record_builder(SourceLinear)


def biases_by_module(tensors: dict[str, TensorEntry]) -> dict[str, TensorEntry]:
    """Module prefix -> its `.bias`, found in one pass: a faultless pairing loop looks each linear's
    up here instead of making a name per linear (a full-scale source has few biases)."""
    cut = len(BIAS_SUFFIX)
    return {name[:-cut]: entry for name, entry in tensors.items() if name.endswith(BIAS_SUFFIX)}


@dataclass
class Source:
    """An opened source checkpoint: its files and headers (`checkpoint`), its format, and its
    quantizable linears by module prefix. `quant` is the format's parsed configuration, whatever
    the format needs to keep of config.json."""

    checkpoint: Checkpoint
    format: str
    quant: object
    linears: dict[str, SourceLinear]
    params: dict = field(default_factory=dict)  # what the provenance records of the format
    quantization: dict = field(default_factory=dict)  # what inspect shows of it (keys: see inspect/source.py)
    # The tensors as the package sees them, where the format splits stored ones (fused 3-D experts
    # into per-expert slices: byte ranges of the stored tensor); else the checkpoint's own.
    logical_tensors: dict[str, TensorEntry] | None = None
    # The tensors no linear consumed, in source order: carried as they are (open_source sets it
    # from the checks of io/rules.py, which find them anyway).
    unpaired: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, path) -> "Source":
        from ascendconv.sources import open_source  # the door: detection across every format

        return open_source(path)

    # the checkpoint's files, read by everyone above the seam
    @property
    def root(self):
        return self.checkpoint.root

    @property
    def config(self) -> dict:
        return self.checkpoint.config

    @property
    def config_path(self):
        return self.checkpoint.config_path

    @property
    def headers(self):
        return self.checkpoint.headers

    @property
    def tensors(self) -> dict[str, TensorEntry]:
        return self.checkpoint.tensors if self.logical_tensors is None else self.logical_tensors

    @property
    def reader(self):
        return self.checkpoint.reader

    @property
    def total_bytes(self) -> int:
        return self.checkpoint.total_bytes

    def companion_files(self) -> tuple[list[str], dict[str, str]]:
        return self.checkpoint.companion_files()

    def close(self) -> None:
        self.checkpoint.close()

    @property
    def scale_names(self) -> set[str]:
        """Tensors consumed with a linear (its scales): the package makes its own from them."""
        return {linear.scale.name for linear in self.linears.values() if linear.scale is not None}

    def read_scale(self, linear: SourceLinear, tile_rows: tuple[int, int] | None = None) -> "np.ndarray":
        """A linear's tile multipliers as float32 [tile rows, tile columns], checked finite (an E8M0
        byte b is 2**(b-127)); with `tile_rows` (t0, t1), only those rows of tiles, so that
        converting a chunk of rows never holds more scales than the chunk needs."""
        import numpy as np  # not at import: commands that read only headers never need it

        entry = linear.scale
        rows, columns = self.tile_grid(linear)
        t0, t1 = tile_rows or (0, rows)
        if len(entry.shape) == 2:
            raw = self.reader.read_rows(entry, t0, t1)
        else:  # a per-tensor scale, stored as [] or [1]: one tile
            raw = self.reader.read(entry).reshape(rows, columns)[t0:t1]
        if entry.dtype == "F8_E8M0":
            if (raw == 0xFF).any():
                bad = np.argwhere(raw == 0xFF)[0] + (t0, 0)
                raise NonFiniteScaleError(f"{entry.path.name}: {shown(entry.name)} holds the E8M0 NaN byte 0xFF at tile {bad.tolist()}")
            return np.ldexp(np.float32(1), raw.astype(np.int32) - 127).astype(np.float32)
        if entry.dtype not in TILE_SCALE_DTYPES:
            raise ScaleDtypeError(f"{entry.path.name}: {shown(entry.name)} is {entry.dtype}")
        scale = raw.astype(np.float32, copy=False)
        if not np.isfinite(scale).all():
            bad = np.argwhere(~np.isfinite(scale))[0]
            raise NonFiniteScaleError(
                f"{entry.path.name}: {shown(entry.name)} holds {scale[tuple(bad)]} at tile {(bad + (t0, 0)).tolist()}"
            )
        return scale

    @staticmethod
    def tile_grid(linear: SourceLinear) -> tuple[int, int]:
        """(tile rows, tile columns) of a linear's scale."""
        (n, k), (bn, bk) = linear.shape, linear.block
        return -(-n // bn), -(-k // bk)


class SourceFormat:
    """One published checkpoint format: whether a config.json is in it, and how to open it.

    `accepts` looks at the quantization_config (None when config.json has none) and, where a format
    shares its quant_method with another, the model_type of config.json; `parse`
    validates the format's config keys before any shard is read; `open` pairs the format's tensors
    in the checkpoint's headers, raising named errors for every problem of the format's layout
    (nothing of tensor data is read). The rules every package must meet, whatever the format, the
    seam applies after it (`open_source`)."""

    name: ClassVar[str]
    label: ClassVar[str]  # for people: "Hugging Face block FP8"
    quant_method: ClassVar[str | None]  # the quant_method value it answers to (None: no quantization_config)

    def accepts(self, quant: dict | None, config: dict) -> bool:
        """By default: the quantization_config's quant_method is the format's."""
        return quant is not None and quant.get("quant_method") == self.quant_method

    def parse(self, config: dict, config_path) -> object:
        raise NotImplementedError

    def open(self, checkpoint: Checkpoint, quant) -> Source:
        raise NotImplementedError
