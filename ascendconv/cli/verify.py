"""`ascendconv verify`: will a package load on vllm-ascend, and how close is it to its source."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ascendconv.cli import app, print_json, run
from ascendconv.cli.console import err, notice, out
from ascendconv.cli.options import AsJson, Ep, Quiet, Tp
from ascendconv.cli.progress import verify_progress


@app.command("verify")
def verify_command(
    package: Path = typer.Argument(..., metavar="OUT", help="The package directory to check."),
    tp: Tp = 1,
    ep: Ep = False,
    checksums: bool = typer.Option(True, "--checksums/--no-checksums", help="Check each shard's checksum (BLAKE3; sha256 for older packages) against the provenance file."),
    source: Optional[str] = typer.Option(
        None, "--source", metavar="SRC", help="The block-FP8 checkpoint the package came from: enables the numerical checks."
    ),
    min_sqnr_mxfp8: Optional[float] = typer.Option(None, help="Least SQNR (dB) of a W8A8_MXFP8 weight (default 25)."),
    min_sqnr_mxfp4: Optional[float] = typer.Option(None, help="Least SQNR (dB) of a W4A8_MXFP weight (default 15)."),
    exact: bool = typer.Option(False, "--exact", help="Re-derive sampled rows of every weight with the numpy reference (needs --source)."),
    exact_full: bool = typer.Option(False, "--exact-full", help="Like --exact, on every row."),
    exact_rows: int = typer.Option(8, help="Rows per weight that --exact re-derives."),
    sample: float = typer.Option(
        1.0, "--sample", metavar="FRACTION",
        help="Share of each weight's tile rows --source re-derives (seeded; every weight gets at least one); 1 = all.",
    ),
    moe_check: bool = typer.Option(False, "--moe-check", help="Run the GroupedMatmulSituQuant chain on sampled MoE layers (needs --source)."),
    moe_layers: int = typer.Option(2, help="MoE layers --moe-check / --on-npu sample; 0 for all."),
    moe_tokens: int = typer.Option(64, help="Tokens routed through each sampled MoE layer (1 to 8192)."),
    beta: float = typer.Option(4.0, help="SiTU beta."),
    linear_beta: float = typer.Option(25.0, help="SiTU linear_beta."),
    max_moe_rel_err: Optional[float] = typer.Option(
        None, help="Largest MoE output rel. error (default 0.30 for W4A8_MXFP, 0.10 for W8A8_MXFP8 / FLOAT experts)."
    ),
    on_npu: bool = typer.Option(False, "--on-npu", help="Run the fused op on an Ascend 950 and compare with the CPU reference."),
    npu_tol: float = typer.Option(0.05, help="Largest rel. error of the NPU output against the CPU reference."),
    seed: int = typer.Option(0, help="Seed of the sampled rows, activations and routing."),
    top: int = typer.Option(10, help="Worst tensors shown."),
    as_json: AsJson = False,
    quiet: Quiet = False,
) -> None:
    """Check that a package will load on vllm-ascend and, with --source, how close it is to its source.

    Exit code 0: every check passed; 1: a check failed; 2: usage error; 3: unreadable package or source.
    --quiet prints only failed checks and the verdict; --json prints the object docs/verify.md describes.
    """
    from ascendconv.cli.render.verify import render_verify
    from ascendconv.io.hfcache import resolve_source
    from ascendconv.verify import VerifyOptions, verify

    def action():
        options = VerifyOptions(
            tp=tp,
            ep=ep,
            checksums=checksums,
            source=resolve_source(source) if source is not None else None,
            exact="full" if exact_full else ("sample" if exact else "off"),
            exact_rows=exact_rows,
            sample=sample,
            moe_check=moe_check,
            moe_layers=moe_layers,
            moe_tokens=moe_tokens,
            beta=beta,
            linear_beta=linear_beta,
            max_moe_rel_err=max_moe_rel_err,
            on_npu=on_npu,
            npu_tol=npu_tol,
            seed=seed,
        )
        if min_sqnr_mxfp8 is not None:
            options.min_sqnr_mxfp8 = min_sqnr_mxfp8
        if min_sqnr_mxfp4 is not None:
            options.min_sqnr_mxfp4 = min_sqnr_mxfp4
        bar, progress = verify_progress(not quiet and not as_json and err.is_terminal)
        if bar is None:
            return verify(package, options, progress, notice)
        with bar:
            return verify(package, options, progress, notice)

    report = run(action, as_json)
    if as_json:
        print_json(report)
    else:
        render_verify(report, out, top, quiet)
    if not report.ok:
        raise typer.Exit(1)
