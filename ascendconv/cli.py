"""The command line: parse, call one library function, render. No logic lives here."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from ascendconv import __version__
from ascendconv.errors import EXIT_INTERRUPTED, AscendconvError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Convert Hugging Face block-FP8 checkpoints to AscendV1 MX packages for vllm-ascend.",
)
out = Console()
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        out.print(f"ascendconv {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """ascendconv: offline block-FP8 -> MXFP8 / MXFP4 conversion for Ascend NPUs."""


def run(action: Callable[[], object], as_json: bool) -> object:
    """Call the library; turn its errors into a message, a hint and an exit code."""
    try:
        return action()
    except AscendconvError as exc:
        if as_json:
            print(json.dumps({"ok": False, **exc.to_dict()}))
        # soft_wrap: a message names files and tensors; never break it inside a name
        err.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False, soft_wrap=True)
        if exc.hint:
            err.print(f"[dim]hint:[/] {escape(exc.hint)}", highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/]: nothing was left at the output path")
        raise typer.Exit(EXIT_INTERRUPTED)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def byte_progress(enabled: bool, label: str):
    """A rich progress bar on stderr (bytes, rate, ETA), or nothing."""
    if not enabled:
        return None, None
    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    )
    task = bar.add_task(label, total=None)
    return bar, lambda done, total: bar.update(task, completed=done, total=total)


@app.command()
def convert(
    src: str = typer.Argument(..., help="Source checkpoint directory (or a repo id in the local HF cache)."),
    out_dir: Path = typer.Argument(..., metavar="OUT", help="Package directory to create."),
    scheme: str = typer.Option("w8a8-mxfp8", help="w8a8-mxfp8, w4a8-mxfp, or w4a8-mxfp-moe (experts W4A8, rest W8A8)."),
    scale_rule: str = typer.Option("mse", help="MX shared-exponent rule: floor, rceil or mse."),
    resolve_dtype: str = typer.Option("bf16", help="Resolve source tiles to bf16 (as vllm-ascend does) or fp32."),
    override: Optional[List[str]] = typer.Option(None, help="GLOB=TYPE on module names; repeatable, later wins."),
    max_shard_size: str = typer.Option("4GiB", help="Shard size limit, e.g. 500MB, 2GiB; 0 for one file."),
    kernel: str = typer.Option("numba", help="numba (fast) or reference (numpy)."),
    workers: int = typer.Option(0, help="Conversion threads; 0 uses every core."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the plan and write nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty OUT."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no table."),
) -> None:
    """Convert a block-FP8 checkpoint into an AscendV1 W8A8_MXFP8 / W4A8_MXFP package."""
    from ascendconv.convert import ConvertOptions, convert as run_convert
    from ascendconv.io.hfcache import resolve_source
    from ascendconv.plan import Override, parse_size

    def action():
        options = ConvertOptions(
            scheme=scheme,
            scale_rule=scale_rule,
            resolve_dtype=resolve_dtype,
            overrides=[Override.parse(o) for o in override or []],
            max_shard_size=parse_size(max_shard_size),
            kernel=kernel,
            workers=workers,
            overwrite=overwrite,
        )
        bar, progress = byte_progress(not quiet and not dry_run and err.is_terminal, "converting")
        if bar is None:
            return run_convert(resolve_source(src), out_dir, options, None, dry_run)
        with bar:
            return run_convert(resolve_source(src), out_dir, options, progress, dry_run)

    result = run(action, as_json)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    elif not quiet:
        render_convert(result)


def render_convert(result) -> None:
    plan = result.plan
    title = "plan (dry run, nothing written)" if result.dry_run else f"wrote {result.output}"
    summary = Table(title=title, show_header=True, header_style="bold")
    summary.add_column("type")
    summary.add_column("modules", justify="right")
    summary.add_column("tensors", justify="right")
    modules, tensors = plan.type_counts(), plan.tensor_counts()
    for quant_type in modules:
        summary.add_row(quant_type, str(modules[quant_type]), str(tensors[quant_type]))
    out.print(summary)
    bytes_out = plan.bytes_out if result.dry_run else result.bytes_written
    out.print(
        f"scheme [bold]{plan.scheme}[/], rule [bold]{plan.scale_rule}[/], resolve {plan.resolve_dtype}, "
        f"kernel {result.kernel}: {human_bytes(plan.bytes_in)} in, {human_bytes(bytes_out)} out, "
        f"{len(plan.shards)} shard(s), {result.seconds:.2f} s",
        highlight=False,
    )
    if result.dry_run:
        shards = Table(title="shards", header_style="bold")
        shards.add_column("file", overflow="ellipsis")
        shards.add_column("tensors", justify="right")
        shards.add_column("bytes", justify="right")
        for shard in plan.shards:
            shards.add_row(shard.file, str(len(shard.tensors)), human_bytes(shard.nbytes))
        out.print(shards)
    if plan.fallbacks:
        table = Table(title=f"{len(plan.fallbacks)} fallback(s)", header_style="bold")
        table.add_column("module", overflow="ellipsis", max_width=44)
        table.add_column("asked")
        table.add_column("written")
        table.add_column("reason", overflow="fold")
        for fb in plan.fallbacks:
            table.add_row(fb.module, fb.requested, fb.written, fb.reason)
        out.print(table)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
