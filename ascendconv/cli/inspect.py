"""`ascendconv inspect`: what a checkpoint or a package holds, from headers only."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ascendconv.cli import app, header_only_process, print_json, run
from ascendconv.cli.console import out
from ascendconv.cli.options import AsJson, Ep, MtpHeads, SharedAsRouted, Tp, given
from ascendconv.decide import Deployment


@app.command("inspect")
def inspect_command(
    src: Annotated[
        str,
        typer.Argument(
            metavar="PATH", help="A checkpoint or package directory, or a repo id in the local HF cache.", parser=given
        ),
    ],
    tensors: Annotated[
        bool, typer.Option("--tensors", help="List tensors: name, dtype, shape, quant type, shard, bytes.")
    ] = False,
    tensor_filter: Annotated[
        Optional[str],
        typer.Option(
            "--filter", metavar="GLOB", help="Only tensors whose name matches GLOB, e.g. '*.experts.0.*' (implies --tensors)."
        ),
    ] = None,
    as_json: AsJson = False,
    tp: Tp = Deployment.tp,
    ep: Ep = Deployment.ep,
    shared_experts_as_routed: SharedAsRouted = Deployment.shared_experts_as_routed,
    mtp_heads: MtpHeads = Deployment.mtp_heads,
) -> None:
    """Show what a checkpoint or a package holds, from headers only (no tensor data is read).

    --json prints the object docs/inspect.md describes.
    """
    from ascendconv.cli.render.inspect import render_inspect
    from ascendconv.inspect import inspect_path

    header_only_process()
    glob = tensor_filter if tensor_filter is not None else ("*" if tensors else None)
    report = run(
        lambda: inspect_path(src, tensors=glob, deployment=Deployment(tp, ep, shared_experts_as_routed, mtp_heads)),
        as_json,
        "inspect",
    )
    if as_json:
        print_json(report, "inspect")
    else:
        render_inspect(report, out)
