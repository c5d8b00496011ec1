"""Source formats behind one seam: `open_source` recognises a checkpoint's format from its
config.json and returns a `Source`, whatever the format (sources/base.py). Each format is one
module; FORMATS lists them in the order they are tried."""

from __future__ import annotations

import os
from pathlib import Path

from ascendconv.errors import NotFoundError, UnsupportedSourceError, shown
from ascendconv.gcpause import gc_paused
from ascendconv.io.rules import check_source_tensors
from ascendconv.models import rules_for
from ascendconv.sources.base import Encoding, Source, SourceFormat, SourceLinear
from ascendconv.sources.checkpoint import Checkpoint, find_quantization_config, load_config
from ascendconv.sources.ct_fp8 import CompressedTensorsFp8
from ascendconv.sources.ds_v4 import DeepSeekV4
from ascendconv.sources.hf_fp8_block import HfFp8Block
from ascendconv.sources.mx_native import CompressedTensorsMx, ModelOptMxfp8, QuarkOcpMx, modelopt_quantization_config
from ascendconv.sources.mxfp4_fused import VllmFusedMxfp4
from ascendconv.sources.plain import PlainFloat

# Tried in this order: a format that shares its quant_method with a more general one comes first.
FORMATS: tuple[SourceFormat, ...] = (
    DeepSeekV4(), HfFp8Block(), CompressedTensorsMx(), CompressedTensorsFp8(), QuarkOcpMx(), ModelOptMxfp8(),
    VllmFusedMxfp4(), PlainFloat(),
)
FORMAT_NAMES = tuple(f.name for f in FORMATS)

__all__ = ["FORMATS", "FORMAT_NAMES", "Checkpoint", "Encoding", "Source", "SourceFormat", "SourceLinear", "open_source"]


def format_for(config: dict, config_path: Path) -> SourceFormat:
    """The format whose config keys config.json holds; a named refusal when none does."""
    quant, location = find_quantization_config(config)
    for candidate in FORMATS:
        if candidate.accepts(quant, config):
            return candidate
    methods = ", ".join(dict.fromkeys(repr(f.quant_method) for f in FORMATS if f.quant_method))
    raise UnsupportedSourceError(
        f"{config_path}: {location}.quant_method is {shown(quant.get('quant_method'))}, expected {methods} "
        "(or no quantization_config, for a plain float checkpoint)"
    )


@gc_paused()  # about 100,000 header entries for a full-scale checkpoint
def open_source(path: str | os.PathLike) -> Source:
    """The source checkpoint at `path`, in whichever format it is: config first (a refusal names
    the format problem before any shard is read), then every header, then the format's pairing,
    then the rules every package must meet (io/rules.py)."""
    root = Path(path)
    # before config.json, which a GGUF download may not have; a .gguf file given as SRC too
    if root.suffix.lower() == ".gguf" or (root.is_dir() and any(root.glob("*.gguf")) and not any(root.glob("*.safetensors"))):
        raise UnsupportedSourceError(
            f"{root}: GGUF is not a supported source (a .gguf file, or *.gguf files and no *.safetensors)",
            "convert the safetensors release of the model (GGUF's MXFP4 blocks pair elements j and j+16 in a "
            "byte, split-half nibbles no AscendV1 type stores)",
        )
    if not root.is_dir():
        raise NotFoundError(f"{root}: no such directory", "pass the checkpoint directory")
    config, config_path = load_config(root)
    if find_quantization_config(config)[0] is None:  # ModelOpt may describe itself beside config.json only
        modelopt = modelopt_quantization_config(root)
        if modelopt is not None:
            config = {**config, "quantization_config": modelopt}
    source_format = format_for(config, config_path)
    quant = source_format.parse(config, config_path)
    checkpoint = Checkpoint.with_config(root, config, config_path)
    checkpoint.respell(rules_for(config).family.module_renames)  # before pairing: every format sees the package's names
    source = source_format.open(checkpoint, quant)
    # the package's rules, the same for every format: checked here, once, over what the format paired
    source.unpaired = check_source_tensors(source.root, source.tensors, source.linears, source.config)
    return source
