"""`ascendconv verify`: will a package load on vllm-ascend, and how close is it to its source."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ascendconv.cli import app, print_json, run
from ascendconv.cli.console import err, notice, out
from ascendconv.cli.options import AsJson, Quiet, given, given_path
from ascendconv.cli.progress import verify_progress
from ascendconv.options import DEFAULT_MAX_MOE_REL_ERR, DEFAULT_TOP, MAX_MOE_TOKENS, VerifyOptions, check_top

DEFAULTS = VerifyOptions()  # the defaults are VerifyOptions', written once


@app.command("verify")
def verify_command(
    # an unreadable OUT is bad input (exit 3, named), which the library reports, not a usage error
    package: Path = typer.Argument(..., metavar="OUT", help="The package directory to check.", parser=given_path),
    tp: Optional[int] = typer.Option(
        None, "--tp", metavar="T", help="Tensor-parallel ranks vLLM will use (default: as recorded at conversion, else 1)."
    ),
    ep: Optional[bool] = typer.Option(
        None, "--ep/--no-ep", help="Expert parallelism: routed experts placed whole (default: as recorded at conversion)."
    ),
    checksums: bool = typer.Option(DEFAULTS.checksums, "--checksums/--no-checksums", help="Check each shard's checksum (BLAKE3; sha256 for older packages) against the provenance file."),
    source: Optional[str] = typer.Option(
        None, "--source", metavar="SRC", help="The checkpoint the package came from: enables the numerical checks.",
        parser=given,
    ),
    min_sqnr_mxfp8: float = typer.Option(DEFAULTS.min_sqnr_mxfp8, help="Least SQNR (dB) of a W8A8_MXFP8 weight."),
    min_sqnr_mxfp4: float = typer.Option(DEFAULTS.min_sqnr_mxfp4, help="Least SQNR (dB) of an MXFP4 weight (W4A8_MXFP, W4A16_MXFP4, W4A4_MXFP4)."),
    exact: bool = typer.Option(False, "--exact", help="Re-derive sampled rows of every weight with the numpy reference (needs --source)."),
    exact_full: bool = typer.Option(False, "--exact-full", help="Like --exact, on every row."),
    exact_rows: int = typer.Option(DEFAULTS.exact_rows, help="Rows per weight that --exact re-derives."),
    sample: float = typer.Option(
        DEFAULTS.sample, "--sample", metavar="FRACTION",
        help="Share of each weight's tile rows --source re-derives (seeded; every weight gets at least one); 1 = all.",
    ),
    moe_check: bool = typer.Option(False, "--moe-check", help="Run the GroupedMatmulSituQuant chain on sampled MoE layers (needs --source)."),
    moe_layers: int = typer.Option(DEFAULTS.moe_layers, help="MoE layers --moe-check / --on-npu sample; 0 for all."),
    moe_tokens: int = typer.Option(
        DEFAULTS.moe_tokens, help=f"Tokens routed through each sampled MoE layer (1 to {MAX_MOE_TOKENS})."
    ),
    beta: float = typer.Option(DEFAULTS.beta, help="SiTU beta."),
    linear_beta: float = typer.Option(DEFAULTS.linear_beta, help="SiTU linear_beta."),
    max_moe_rel_err: Optional[float] = typer.Option(
        None,
        help="Largest MoE output rel. error (default: "
        + ", ".join(f"{limit:g} for {kind}" for kind, limit in DEFAULT_MAX_MOE_REL_ERR.items())
        + " experts).",
    ),
    on_npu: bool = typer.Option(False, "--on-npu", help="Run the fused op on an Ascend 950 and compare with the CPU reference."),
    npu_tol: float = typer.Option(DEFAULTS.npu_tol, help="Largest rel. error of the NPU output against the CPU reference."),
    seed: int = typer.Option(DEFAULTS.seed, help="Seed of the sampled rows, activations and routing."),
    top: int = typer.Option(DEFAULT_TOP, help="Worst tensors shown (0 or more)."),
    report_files: Optional[list[Path]] = typer.Option(
        None, "--report", metavar="FILE", parser=given_path,
        help="Also write the report as FILE.html (self-contained page) or FILE.md; may be given more than once.",
    ),
    step_summary: bool = typer.Option(
        False, "--step-summary", help="Append the Markdown report to $GITHUB_STEP_SUMMARY (when set: a GitHub Actions job)."
    ),
    as_json: AsJson = False,
    quiet: Quiet = False,
) -> None:
    """Check that a package will load on vllm-ascend and, with --source, how close it is to its source.

    Exit code 0: every check passed; 1: a check failed; 2: usage error; 3: unreadable package or source;
    4: a check asked for cannot run here (--on-npu without an Ascend 950), stdout cannot be written, or
    memory or threads ran out (a ulimit).
    --quiet prints only failed checks and the verdict; --json prints the object docs/verify.md describes.
    """
    from ascendconv.cli.render.verify import render_verify
    from ascendconv.io.hfcache import resolve_source
    from ascendconv.verify import verify

    from ascendconv.cli.reports import check_report_paths, check_step_summary, write_reports

    run(lambda: check_top(top), as_json, "verify")
    reports = run(lambda: check_report_paths(report_files or [], package), as_json, "verify")
    run(lambda: check_step_summary(step_summary), as_json, "verify")

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
            min_sqnr_mxfp8=min_sqnr_mxfp8,
            min_sqnr_mxfp4=min_sqnr_mxfp4,
        )
        bar, progress = verify_progress(quiet or (as_json and err.is_terminal))
        if bar is None:
            return verify(package, options, progress, notice)
        with bar:
            return verify(package, options, progress, notice)

    report = run(action, as_json, "verify")
    for problem in write_reports(report.to_dict(), reports, step_summary):
        notice(problem)
    if as_json:
        print_json(report, "verify")
    else:
        render_verify(report, out, top, quiet)
    if not report.ok:
        raise typer.Exit(1)

