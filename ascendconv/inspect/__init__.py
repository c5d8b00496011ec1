"""Headers-only report of what a directory holds: a source checkpoint (any format of sources/), an AscendV1 package,
or a plain (BF16/F16/F32) HF checkpoint.

`inspect_path` reads config.json, the index and every shard's header, and nothing else: no tensor
byte is read, so a 1,000-shard checkpoint is inspected in seconds. For a block-FP8 source it
also runs the pure planner once per scheme to say what `convert` would produce. For a package it
collects (never fixes) the disagreements between description, index and shards; `verify` is the
full check. Nothing here prints: the result is an `InspectReport` whose `to_dict()` is the stable
`--json` document described in docs/inspect.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from ascendconv.ascendv1 import DESCRIPTION_NAME
from ascendconv.errors import BadOptionError, NoQuantizableLinearError, PackageError
from ascendconv.gcpause import gc_paused
from ascendconv.inspect.package import inspect_package
from ascendconv.inspect.plain import inspect_plain
from ascendconv.inspect.report import (
    KIND_PACKAGE,
    KIND_PLAIN,
    KIND_SOURCE,
    CountBytes,
    Fallback,
    InspectReport,
    ModuleGroup,
    SchemeEstimate,
    ShardInfo,
    TensorRow,
)
from ascendconv.inspect.source import inspect_source
from ascendconv.io.hfcache import cached_repo, local_directory, resolve_source
from ascendconv.io.package import is_package, refuse_part_directory, unreplaced
from ascendconv.sources.checkpoint import find_quantization_config, load_config
from ascendconv.decide import Deployment


MAX_GLOB_BRACKETS = 256  # a tensor name's character sets need a handful


@gc_paused()  # a full-scale report builds several hundred thousand objects and no cycles
def inspect_path(
    path: str | os.PathLike, tensors: str | None = None, deployment: Deployment | None = None
) -> InspectReport:
    """Recognise what `path` holds and report on it from headers alone.

    `path` is a directory or a Hugging Face repo id present in the local cache (never downloaded).
    `tensors` is a glob on tensor names: when given, the report lists the matching tensors ("*" for
    all). `deployment` (--tp, --ep, --shared-experts-as-routed) is what a source's per-scheme plans
    are made for. Raises a project error (exit code 3) for anything that is not a source checkpoint, a
    plain float checkpoint or an AscendV1 package, and for a source whose headers are invalid.
    """
    if tensors is not None and tensors.count("[") > MAX_GLOB_BRACKETS:
        # the glob's translation takes time quadratic in its '[': 4,000 of them 0.5 s, 50,000 past a minute
        raise BadOptionError(
            f"--filter: a glob of {tensors.count('['):,} '[' (at most {MAX_GLOB_BRACKETS} are read)",
            "match fewer character sets, or list the tensors with --tensors and filter them with grep",
        )
    root = local_directory(resolve_source(str(path)), "inspect")
    report = _inspect_directory(root, tensors, deployment)
    repo = cached_repo(root)
    report.hub = None if repo is None else {"repo_id": repo[0], "revision": repo[1]}
    return report


def _inspect_directory(root: Path, tensors: str | None, deployment: Deployment | None) -> InspectReport:
    refuse_part_directory(root, "a package or a checkpoint")
    if is_package(root):
        with unreplaced(root, "inspected"):  # description and shards of one package, never of two
            return inspect_package(root, tensors)
    if any(root.glob("quant_model_weights*.safetensors")):
        raise PackageError(
            f"{root}: holds quant_model_weights*.safetensors but no {DESCRIPTION_NAME}",
            "the package is incomplete; convert the checkpoint again",
        )
    config, config_path = load_config(root)
    quant, _ = find_quantization_config(config)
    try:
        return inspect_source(root, tensors, deployment or Deployment())
    except NoQuantizableLinearError:  # a float checkpoint with nothing to convert: a summary
        if quant is not None:
            raise
        return inspect_plain(root, config, config_path, tensors)


__all__ = [
    "CountBytes",
    "Fallback",
    "InspectReport",
    "KIND_PACKAGE",
    "KIND_PLAIN",
    "KIND_SOURCE",
    "ModuleGroup",
    "SchemeEstimate",
    "ShardInfo",
    "TensorRow",
    "inspect_path",
]
