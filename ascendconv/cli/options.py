"""Options shared by several commands, as `Annotated` aliases: one spelling and one help text each.

Defaults are not written here: a command reads them from the library's options dataclasses.
"""

from __future__ import annotations

from pathlib import Path

import typer
from typing import Annotated

from ascendconv.formats.constants import ResolveDtype, ScaleRule
from ascendconv.options import KernelName
from ascendconv.ascendv1 import SCHEME_ROWS
from ascendconv.decide import Scheme

def given(text: str) -> str:
    """A directory, file or repo id as given; an empty one, as an unset variable makes it (`verify
    "$OUT"`), is a usage error: Path('') is '.', and the current directory was verified, inspected or
    converted in its place, exit 0."""
    if not text:
        raise typer.BadParameter("an empty path (an unset variable?); write '.' for the current directory")
    return text


def given_path(text: str) -> Path:
    return Path(given(text))


AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar; print only what the command says it keeps.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace a non-empty OUT.")]
NewPackage = Annotated[Path, typer.Argument(metavar="OUT", help="Package directory to create.", parser=given_path)]

# The deployment options, one meaning for convert, inspect and verify.
Tp = Annotated[
    int, typer.Option("--tp", metavar="T", help="Tensor-parallel ranks vLLM will use: row-parallel layers must align with K/T.")
]
Ep = Annotated[bool, typer.Option("--ep", help="Expert parallelism: routed experts are placed whole, not split over --tp.")]
SharedAsRouted = Annotated[
    bool,
    typer.Option(
        "--shared-experts-as-routed", help="Shared experts take the routed experts' type (for vllm-ascend's mix_placement)."
    ),
]
MtpHeads = Annotated[
    bool,
    typer.Option(
        "--mtp-heads/--no-mtp-heads",
        help="Add the MTP drafter heads the release lacks (GLM-5 shared_head.head, DeepSeek-V4 mtp.0.head), as FLOAT copies.",
    ),
]

SchemeChoice = Annotated[
    Scheme,
    typer.Option(
        "--scheme",
        help="Types of linears / routed experts: "
        + "; ".join(f"{row.name} {'MX as is, else ' if row.native else ''}{row.linear} / {row.expert}" for row in SCHEME_ROWS)
        + " (the README's scheme table says when to choose which).",
    ),
]
ScaleRuleChoice = Annotated[ScaleRule, typer.Option("--scale-rule", help="MX shared-exponent rule.")]
ResolveDtypeChoice = Annotated[
    ResolveDtype, typer.Option("--resolve-dtype", help="Resolve source tiles to bf16 (as vllm-ascend does) or fp32.")
]
KernelChoice = Annotated[KernelName, typer.Option("--kernel", help="numba (fast) or reference (numpy).")]
Workers = Annotated[
    int, typer.Option("--workers", help="Conversion threads; 0 uses every core (more than the cores are capped to them).")
]


def size_text(nbytes: int) -> str:
    """A byte count as the shortest exact size `parse_size` reads back: 4294967296 -> '4GiB'."""
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes and nbytes % factor == 0:
            return f"{nbytes // factor}{unit}"
    return str(nbytes)
