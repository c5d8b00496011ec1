"""The command line: parse, call one library function, render. No logic lives here."""

from __future__ import annotations

import gc
import json
import signal
import sys
from pathlib import Path
from typing import Callable, List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich import box
from rich.cells import cell_len
from rich.text import Text

from ascendconv import __version__
from ascendconv.errors import EXIT_INTERRUPTED, AscendconvError, Interrupted

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
    except KeyboardInterrupt as exc:
        what = f"by {signal.Signals(exc.signum).name}" if isinstance(exc, Interrupted) else ""
        outcome = getattr(exc, "outcome", None)
        err.print(
            f"[bold red]interrupted[/] {what}" + (f": {escape(outcome)}" if outcome else ""), highlight=False, soft_wrap=True
        )
        raise typer.Exit(exc.exit_code if isinstance(exc, Interrupted) else EXIT_INTERRUPTED)


def notice(text: str) -> None:
    """A library message for the user (e.g. the kernels' first compilation), on stderr even with
    --quiet or --json: it explains a pause that happens once."""
    err.print(f"[dim]{escape(text)}[/]", highlight=False, soft_wrap=True)


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
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

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


# The deployment options, one meaning for convert, inspect and verify.
TP_OPTION = typer.Option(
    1, "--tp", metavar="T", help="Tensor-parallel ranks vLLM will use: row-parallel layers must align with K/T."
)
EP_OPTION = typer.Option(False, "--ep", help="Expert parallelism: routed experts are placed whole, not split over --tp.")
SHARED_AS_ROUTED_OPTION = typer.Option(
    False,
    "--shared-experts-as-routed",
    help="Shared experts take the routed experts' type (for vllm-ascend's mix_placement).",
)


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
    workers: int = typer.Option(0, help="Conversion threads; 0 uses every core (more than the cores are capped to them)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the plan and write nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty OUT."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no table."),
    resume: bool = typer.Option(
        False, "--resume", help="Keep finished shards if the run stops; reuse those an earlier --resume run kept."
    ),
    part: Optional[str] = typer.Option(
        None, metavar="I/N", help="Write only part I of N into OUT (a part directory); join parts with `assemble`."
    ),
    ray: bool = typer.Option(False, "--ray", help="Convert the parts as Ray tasks (local Ray, or --ray-address)."),
    ray_address: Optional[str] = typer.Option(None, help="Ray cluster to join, e.g. auto or ray://head:10001 (implies --ray)."),
    ray_parts: int = typer.Option(0, help="Parts under --ray; 0: one per task slot, at most one per shard."),
    ray_cpus: int = typer.Option(2, help="CPUs per Ray task (its conversion threads)."),
    ray_retries: int = typer.Option(2, help="Retries of a failed Ray task; each reuses the shards it finished."),
    tp: int = TP_OPTION,
    ep: bool = EP_OPTION,
    shared_experts_as_routed: bool = SHARED_AS_ROUTED_OPTION,
) -> None:
    """Convert a block-FP8 checkpoint into an AscendV1 W8A8_MXFP8 / W4A8_MXFP package."""
    from ascendconv.convert import ConvertOptions, convert as run_convert
    from ascendconv.parts import parse_part
    from ascendconv.io.hfcache import resolve_source
    from ascendconv.plan import Deployment, Override, parse_size

    # A one-shot process: every full collection would walk the objects numba and numpy created at
    # import, for nothing. Move them out of the collector's way (this also spares the final
    # collection at exit); a library caller keeps its own collector untouched.
    gc.freeze()

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
            resume=resume,
            part=parse_part(part) if part is not None else None,
            deployment=Deployment(tp, ep, shared_experts_as_routed),
        )
        runner = run_convert
        if (ray or ray_address) and not dry_run:
            runner = ray_runner(options, ray_address, ray_parts, ray_cpus, ray_retries)
        bar, progress = byte_progress(not quiet and not dry_run and err.is_terminal, "converting")
        if bar is None:
            return runner(resolve_source(src), out_dir, options, None, dry_run, notice)
        with bar:
            return runner(resolve_source(src), out_dir, options, progress, dry_run, notice)

    result = run(action, as_json)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    elif not quiet:
        render_convert(result)


def ray_runner(options, address: Optional[str], parts: int, cpus: int, retries: int) -> Callable:
    """convert's stand-in under --ray: the same call, run as Ray tasks."""
    from ascendconv.cluster import RayOptions, convert_on_ray, import_ray
    from ascendconv.errors import BadOptionError

    if options.part or options.resume:
        raise BadOptionError(
            "--ray runs every part itself and cannot be combined with --part or --resume",
            "under --ray a failed task is retried and reuses the shards it finished (--ray-retries)",
        )
    import_ray()  # fails at once, with how to install it
    ray_options = RayOptions(address=address, parts=parts, cpus_per_task=cpus, max_retries=retries)
    return lambda src, out, options, progress, dry_run, notice: convert_on_ray(src, out, options, ray_options, progress)


def render_convert(result) -> None:
    """What became what (module groups), shards when planning, fallbacks, and the totals."""
    plan = result.plan
    head = "plan (dry run, nothing written)" if result.dry_run else f"wrote {result.output}"
    if result.part:
        head += f" (part {result.part[0]} of {result.part[1]}: {_plural(len(result.shard_checksums), 'shard')})"
    out.print(Text(head, style="bold"))
    if result.reused_shards:
        out.print(f"resumed: {_plural(len(result.reused_shards), 'finished shard')} reused, the rest converted")
    deployment = plan.deployment
    if deployment.tp > 1 or deployment.ep or deployment.shared_experts_as_routed:
        out.print(Text(
            f"planned for --tp {deployment.tp}" + (" --ep" if deployment.ep else "")
            + (" --shared-experts-as-routed" if deployment.shared_experts_as_routed else ""),
        ))
    for warning in plan.warnings:
        err.print(Text(f"warning: {warning}", style="yellow"))
    rows = [[pattern, str(sum(types.values())), _types_cell(types)] for pattern, types in plan.module_groups().items()]
    _section(out, "FP8 linears, by module (layer and expert numbers as *)")
    out.print(_fit_table(out, ["module", "n", "written as"], rows, right=(1,)))
    if result.dry_run:
        _section(out, f"shards (limit {human_bytes(plan.max_shard_size) if plan.max_shard_size else 'none'})")
        rows = [[s.file, str(len(s.tensors)), human_bytes(s.nbytes)] for s in plan.shards]
        out.print(_fit_table(out, ["file", "tensors", "bytes"], rows, right=(1, 2)))
    kept = plan.kept_float()
    if kept:
        _section(out, "kept FLOAT by the model's rules")
        out.print(_fit_table(out, ["modules", "reason"], [[str(n), why] for why, n in kept.items()], right=(0,), wrap=1))
    if plan.fallbacks:
        _section(out, f"{_plural(len(plan.fallbacks), 'fallback')}")
        out.print(_fit_table(out, ["module", "n", "type", "reason"], _fallback_rows(plan.fallbacks), right=(1,), wrap=3))
    counts = ", ".join(f"{n} {t}" for t, n in plan.tensor_counts().items() if n)
    bytes_out = plan.bytes_out if result.dry_run else result.bytes_written
    out.print()
    out.print(
        f"{plan.scheme}, rule {plan.scale_rule}, resolve {plan.resolve_dtype}, kernel {result.kernel}: "
        f"{len(plan.tensors)} tensors ({counts}); {human_bytes(plan.bytes_in)} in, {human_bytes(bytes_out)} out "
        f"in {_plural(len(plan.shards), 'shard')}; {result.seconds:.2f} s",
        highlight=False,
    )


# --- assemble -----------------------------------------------------------------------------------


@app.command("assemble")
def assemble_command(
    out_dir: Path = typer.Argument(..., metavar="OUT", help="Package directory to create."),
    part_dirs: List[Path] = typer.Argument(..., metavar="PARTDIR...", help="Every part directory of one plan."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty OUT."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary."),
) -> None:
    """Join the parts written by `convert --part I/N` into the package (checked, then written atomically)."""
    from ascendconv.assemble import assemble

    def action():
        bar, progress = byte_progress(not quiet and err.is_terminal, "checking parts")
        if bar is None:
            return assemble(out_dir, part_dirs, overwrite)
        with bar:
            return assemble(out_dir, part_dirs, overwrite, progress=progress)

    result = run(action, as_json)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    elif not quiet:
        out.print(
            f"wrote {result.output}: {_plural(result.shards, 'shard')} from {_plural(result.parts, 'part')} "
            f"({result.linked} linked, {result.shards - result.linked} copied), {human_bytes(result.bytes_written)} "
            f"in {result.seconds:.2f} s",
            highlight=False,
        )


# --- inspect ------------------------------------------------------------------------------------


@app.command("inspect")
def inspect_command(
    src: str = typer.Argument(..., metavar="PATH", help="A checkpoint or package directory, or a repo id in the local HF cache."),
    tensors: bool = typer.Option(False, "--tensors", help="List tensors: name, dtype, shape, quant type, shard, bytes."),
    tensor_filter: Optional[str] = typer.Option(
        None, "--filter", metavar="GLOB", help="Only tensors whose name matches GLOB, e.g. '*.experts.0.*' (implies --tensors)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout (see docs/inspect.md)."),
    tp: int = TP_OPTION,
    ep: bool = EP_OPTION,
    shared_experts_as_routed: bool = SHARED_AS_ROUTED_OPTION,
) -> None:
    """Show what a checkpoint or a package holds, from headers only (no tensor data is read)."""
    from ascendconv.inspect import inspect_path
    from ascendconv.plan import Deployment

    glob = tensor_filter if tensor_filter is not None else ("*" if tensors else None)
    report = run(lambda: inspect_path(src, tensors=glob, deployment=Deployment(tp, ep, shared_experts_as_routed)), as_json)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        render_inspect(report)


_GAP = 2  # cells between two columns of an inspect table


def elide_middle(text: str, width: int) -> str:
    """`text` cut to `width` cells by replacing its middle with '…', so both ends stay readable.

    A dotted name keeps its start through its first number or '*' ('model.layers.12') and gives the
    rest of the room to its end, which says what the tensor is; other text is cut in the middle.
    A number is never cut in two (a partial 'layers.1' of 'layers.12' would mislead), so the result
    can be a cell or two shorter than `width`.
    """
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return "…"[:max(width, 0)]
    head = (width - 1) // 2
    parts = text.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit() or part == "*":
            head = min(head, len(".".join(parts[: i + 1])))
            break
    while 0 < head < len(text) and text[head - 1].isdigit() and text[head].isdigit():
        head -= 1
    start = len(text) - (width - 1 - head)
    while 0 < start < len(text) and text[start - 1].isdigit() and text[start].isdigit():
        start += 1
    if start < len(text) and text[start] == ".":  # '…' already marks the cut
        start += 1
    tail = len(text) - start
    return text[:head] + "…" + (text[-tail:] if tail else "")


def _fit_table(
    console: Console,
    headers: list[str],
    rows: list[list[str]],
    right: tuple[int, ...] = (),
    elide: int | None = 0,
    wrap: int | None = None,
    gap: int = _GAP,
) -> Table:
    """A borderless table no wider than the console: column `elide` is cut in the middle to the room
    the other columns leave; column `wrap` (if any) wraps its words; the rest keep their width."""
    widths = [
        max([cell_len(h)] + [cell_len(line) for row in rows for line in row[i].split("\n")])
        for i, h in enumerate(headers)
    ]
    room = console.width - gap * (len(headers) - 1)
    fixed = sum(w for i, w in enumerate(widths) if i not in (elide, wrap))
    if wrap is not None:
        wrap_min = min(widths[wrap], 24)
        if elide is not None:
            widths[elide] = min(widths[elide], max(12, room - fixed - wrap_min))
        widths[wrap] = max(8, min(widths[wrap], room - fixed - (widths[elide] if elide is not None else 0)))
    elif elide is not None:
        widths[elide] = min(widths[elide], max(12, room - fixed))
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, gap - 1, 0, 0), header_style="bold")
    for i, header in enumerate(headers):
        table.add_column(
            header,
            justify="right" if i in right else "left",
            no_wrap=i != wrap,
            overflow="fold" if i == wrap else "ellipsis",
            max_width=widths[i],
        )
    for row in rows:
        cells = [
            Text(
                "\n".join(elide_middle(line, widths[i]) for line in cell.split("\n")) if i == elide else cell
            )
            for i, cell in enumerate(row)
        ]
        table.add_row(*cells)
    return table


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _section(console: Console, title: str) -> None:
    console.print()
    console.print(Text(title, style="bold"))


def _types_cell(counts: dict[str, int]) -> str:
    """One type as it is; several as 'TYPE n' lines."""
    if len(counts) == 1:
        return next(iter(counts))
    return "\n".join(f"{t} {n}" for t, n in counts.items())


def render_inspect(report, console: Console | None = None) -> None:
    """Print an InspectReport: the summary, or the tensor table when the report lists tensors."""
    console = console or out
    if report.tensors is not None:
        _render_tensor_list(report, console)
    else:
        _render_inspect_summary(report, console)


def _render_inspect_summary(report, console: Console) -> None:
    from ascendconv.inspect import KIND_PLAIN

    head = Text()
    head.append(report.path.name or str(report.path), style="bold")
    head.append(f"  {report.label}")
    console.print(head)

    model = report.model
    facts = [
        ("path", str(report.path)),
        (
            "model",
            f"{model['model_type'] or '(no model_type)'}, {', '.join(model['architectures']) or '(no architectures)'}",
        ),
    ]
    quant = report.quantization
    if quant is not None:
        bn, bk = quant["weight_block_size"]
        scales = "/".join(quant["scale_dtypes"]) or "no"
        text = f"{quant['quant_method']} {quant['fmt']}, block {bn}x{bk}, {scales} scales"
        if quant["scale_fmt"]:
            text += f" ({quant['scale_fmt']})"
        text += f", {quant['activation_scheme']} activations"
        if quant["location"] != "quantization_config":
            text += f" (in {quant['location']})"
        facts.append(("quantization", text))
        skipped = quant["modules_to_not_convert"]
        listed = ", ".join(skipped[:_MAX_LISTED]) + (f", … and {len(skipped) - _MAX_LISTED} more" if len(skipped) > _MAX_LISTED else "")
        facts.append(("unquantized", f"{len(skipped)}: {listed}" if skipped else "none listed"))
    package = report.package
    if package is not None:
        facts.append(
            (
                "model_quant_type",
                f"{package['model_quant_type']} (version {package['version']}, group_size {package['group_size']})",
            )
        )
        prov = package["provenance"]
        if prov is None:
            facts.append(("provenance", "none (not written by ascendconv)"))
        else:
            facts.append(("converted by", f"{prov['tool']} {prov['version']} from {prov['source']}"))
            facts.append(
                (
                    "scheme",
                    f"{prov['scheme']}, rule {prov['scale_rule']}, resolve {prov['resolve_dtype']}, "
                    f"{_plural(prov['fallbacks'], 'fallback')}",
                )
            )
    index = "with index" if report.index else "no index"
    facts.append(("files", f"{_plural(len(report.shards), 'shard')}, {human_bytes(report.total_bytes)}, {index}"))
    text = f"{report.tensor_count} ({human_bytes(report.tensor_bytes)} of data)"
    if quant is not None:
        text += f", {report.fp8_linears} FP8 linears"
    facts.append(("tensors", text))
    text = _plural(report.layers, "layer")
    if model["num_hidden_layers"] is not None and model["num_hidden_layers"] != report.layers:
        text += f" ({model['num_hidden_layers']} in config)"
    if report.routed_experts:
        text += f", {report.routed_experts} routed experts in {_plural(report.moe_layers, 'MoE layer')}"
    else:
        text += ", no routed experts"
    if report.shared_expert_layers:
        text += f", shared experts in {report.shared_expert_layers}"
    if report.indexer_layers:
        text += f", indexers in {report.indexer_layers}"
    if report.mtp_layers:
        text += f", MTP: {', '.join(report.mtp_layers)}"
    facts.append(("structure", text))
    facts.append(("rules", report.family))
    if report.deployment is not None:
        deployment = report.deployment
        text = f"--tp {deployment['tp']}" + (" --ep" if deployment["ep"] else "")
        if deployment["shared_experts_as_routed"]:
            text += " --shared-experts-as-routed"
        facts.append(("planned for", text))
    if report.kind == KIND_PLAIN:
        facts.append(("convert", "not possible: no block-FP8 quantization_config"))
    label_width = max(cell_len(label) for label, _ in facts)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column()  # sentences wrap at word boundaries, under their own column
    for label, value in facts:
        if label == "path":  # a name: elided, never wrapped
            value = elide_middle(value, console.width - label_width - 2)
        grid.add_row(Text(label, style="dim"), Text(value))
    console.print(grid)
    for warning in report.warnings:
        console.print(Text(f"warning: {warning}", style="yellow"))

    for title, table, key in (("tensors by dtype", report.by_dtype, "dtype"), ("tensors by quant type", report.by_quant_type, "quant type")):
        _section(console, title)
        rows = [[name, str(cb.tensors), human_bytes(cb.bytes)] for name, cb in table.items()]
        console.print(_fit_table(console, [key, "tensors", "bytes"], rows, right=(1, 2), elide=None))

    if report.schemes is not None:
        _render_scheme_estimates(report, console)
    if report.groups:
        _section(console, "module groups (layer and expert numbers as *)")
        if report.schemes is not None:
            schemes = list(report.schemes)
            headers = ["module", "n", *schemes]
            rows = [[g.pattern, str(g.modules), *(_types_cell(g.schemes[s]) for s in schemes)] for g in report.groups]
        elif package is not None:
            headers = ["module", "n", "type", "dtype"]
            rows = [[g.pattern, str(g.modules), _types_cell(g.types), _types_cell(g.dtypes)] for g in report.groups]
        else:
            headers = ["module", "n", "dtype"]
            rows = [[g.pattern, str(g.modules), _types_cell(g.dtypes)] for g in report.groups]
        console.print(_fit_table(console, headers, rows, right=(1,)))
    if report.schemes is not None:
        _render_fallbacks(report, console)
        _render_runtime(report, console)
    if package is not None:
        _render_package_files(report, console)


def _render_scheme_estimates(report, console: Console) -> None:
    from ascendconv.ascendv1 import QUANT_TYPES

    _section(console, "what convert would write, per --scheme (default options)")
    estimates = list(report.schemes.values())
    rows = [[f"{t} modules", *(str(e.modules[t]) for e in estimates)] for t in QUANT_TYPES]
    rows.append(["fallbacks", *(str(len(e.fallbacks)) for e in estimates)])
    rows.append(["model_quant_type", *(e.model_quant_type for e in estimates)])
    rows.append(["tensor bytes", *(human_bytes(e.bytes_out) for e in estimates)])
    rows.append(["shards (4 GiB)", *(str(e.shards) for e in estimates)])
    headers = ["", *(e.scheme for e in estimates)]
    console.print(_fit_table(console, headers, rows, right=tuple(range(1, len(headers))), elide=None))


def _fallback_rows(fallbacks) -> list[list[str]]:
    """One row per (module pattern, requested, written, reason with numbers as *)."""
    from ascendconv.plan import module_pattern

    merged: dict[tuple, list] = {}
    for fb in fallbacks:
        merged.setdefault((module_pattern(fb.module), fb.requested, fb.written, module_pattern(fb.reason)), []).append(fb)
    rows = []
    for (pattern, requested, written, reason), members in merged.items():
        one = len(members) == 1
        rows.append(
            [members[0].module if one else pattern, str(len(members)), f"{requested}\n→ {written}", members[0].reason if one else reason]
        )
    return rows


def _render_fallbacks(report, console: Console) -> None:

    any_fallback = False
    for scheme, estimate in report.schemes.items():
        if not estimate.fallbacks:
            continue
        any_fallback = True
        _section(console, f"fallbacks under {scheme}: {_plural(len(estimate.fallbacks), 'module')}")
        rows = _fallback_rows(estimate.fallbacks)
        console.print(_fit_table(console, ["module", "n", "type", "reason"], rows, right=(1,), wrap=3))
    if not any_fallback:
        console.print(Text("no fallbacks under any scheme", style="dim"))


def _render_runtime(report, console: Console) -> None:
    _section(console, "what vllm-ascend will run, per --scheme")
    for scheme, estimate in report.schemes.items():
        console.print(Text(scheme, style="bold"))
        notes = Table.grid(padding=(0, 1))
        notes.add_column(no_wrap=True)
        notes.add_column()  # a note wraps under itself
        for note in estimate.runtime:
            notes.add_row("  -", Text(note))
        console.print(notes)


_MAX_LISTED = 10


def _render_package_files(report, console: Console) -> None:
    _section(console, f"shards ({len(report.shards)})")
    shown = report.shards if len(report.shards) <= _MAX_LISTED else report.shards[: _MAX_LISTED - 1]
    rows = [[s.file, "unreadable" if s.tensors is None else str(s.tensors), human_bytes(s.bytes)] for s in shown]
    if len(shown) < len(report.shards):
        rows.append([f"… and {len(report.shards) - len(shown)} more", "", ""])
    console.print(_fit_table(console, ["file", "tensors", "bytes"], rows, right=(1, 2)))
    if report.problems:
        _section(console, f"{_plural(len(report.problems), 'disagreement')} (`ascendconv verify` checks everything)")
        listing = Table.grid(padding=(0, 1))
        listing.add_column(no_wrap=True)
        listing.add_column()  # a long message wraps under itself
        for problem in report.problems[:_MAX_LISTED]:
            listing.add_row("-", Text(problem, style="yellow"))
        console.print(listing)
        if len(report.problems) > _MAX_LISTED:
            console.print(Text(f"… and {len(report.problems) - _MAX_LISTED} more (see --json)", style="yellow"))
    else:
        console.print(Text("description, index and shards agree", style="dim"))


def _render_tensor_list(report, console: Console) -> None:
    numbers = {s.file: i + 1 for i, s in enumerate(report.shards)}
    head = Text()
    head.append(report.path.name or str(report.path), style="bold")
    head.append(f"  {report.label}")
    console.print(head)
    console.print(
        Text(
            f"{len(report.tensors)} of {_plural(report.tensor_count, 'tensor')} match "
            + elide_middle(repr(report.tensor_filter), console.width // 2)
        )
    )
    rows = [
        [
            t.name,
            t.dtype,
            "×".join(map(str, t.shape)) or "scalar",
            t.quant_type or "(undescribed)",
            str(numbers.get(t.shard, "?")),
            human_bytes(t.bytes),
        ]
        for t in report.tensors
    ]
    headers = ["name", "dtype", "shape", "quant type", "shard", "bytes"]
    console.print(_fit_table(console, headers, rows, right=(4, 5), gap=1))
    listed = list(numbers.items())
    if len(listed) > 3:
        console.print(Text(f"shards are numbered 1..{len(listed)} in name order:", style="dim"))
        listed = [listed[0], listed[-1]]
    for file, number in listed:
        label = f"shard {number} = "
        console.print(Text(label + elide_middle(file, console.width - len(label)), style="dim"))


# --- verify ---------------------------------------------------------------------------------------


@app.command("verify")
def verify_command(
    package: Path = typer.Argument(..., metavar="OUT", help="The package directory to check."),
    tp: int = TP_OPTION,
    ep: bool = EP_OPTION,
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
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout (see docs/verify.md)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar; only failed checks and the verdict."),
) -> None:
    """Check that a package will load on vllm-ascend and, with --source, how close it is to its source.

    Exit code 0: every check passed; 1: a check failed; 2: usage error; 3: unreadable package or source.
    """
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
        print(json.dumps(report.to_dict(), indent=2))
    else:
        render_verify(report, top, quiet)
    if not report.ok:
        raise typer.Exit(1)


def verify_progress(enabled: bool):
    """A rich progress bar on stderr that follows verify's phases, or nothing."""
    if not enabled:
        return None, None
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TimeRemainingColumn

    labels = {"scan": "scanning shards", "source": "comparing with source", "moe": "MoE layers", "npu": "NPU"}
    bar = Progress("[progress.description]{task.description}", BarColumn(), TaskProgressColumn(), TimeRemainingColumn(),
                   console=err, transient=True)
    task = bar.add_task("verifying", total=None)
    return bar, lambda phase, done, total: bar.update(
        task, description=labels.get(phase, phase), completed=done, total=total
    )


def _db(x) -> str:
    if x is None or x != x:
        return "nan"
    return "exact" if x == float("inf") else f"{x:.1f}"


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


def render_verify(report, top: int = 10, quiet: bool = False) -> None:
    """Print a VerifyReport: the checks, the problems of failed ones, the worst tensors, MoE and NPU."""
    prov = report.provenance
    if not quiet:
        origin = (
            f"ascendconv {prov.get('version')}, {prov.get('scheme')}, rule {prov.get('scale_rule')}, "
            f"resolve {prov.get('resolve_dtype')}, kernel {prov.get('kernel')}"
            if prov
            else "no provenance"
        )
        out.print(f"[bold]verify[/] {escape(str(report.package))}  [dim]({escape(origin)})[/]", highlight=False)
        rows = [[c.name, "FAIL" if not c.ok else ("skip" if c.skipped else "pass"), c.detail] for c in report.checks]
        out.print(_fit_table(out, ["check", "result", "detail"], rows, elide=None, wrap=2))
    for check in report.failed:
        out.print(f"[bold red]{check.name}[/]: {len(check.problems)} problem(s)", highlight=False)
        for problem in check.problems[:8]:
            out.print(f"  - {escape(problem)}", highlight=False)
        if len(check.problems) > 8:
            out.print(f"  … and {len(check.problems) - 8} more (see --json)")
        if check.hint:
            out.print(f"  [dim]hint:[/] {escape(check.hint)}", highlight=False)
    if report.tensors and not quiet:
        _section(out, f"worst {min(top, len(report.tensors))} of {len(report.tensors)} weights")
        rows = [
            [t.name, t.type, _db(t.sqnr_db), f"{t.rel_err:.4f}", f"{t.max_abs:.3g}", f"{t.saturated:.2%}", _yes(t.ok)]
            for t in report.tensors[:top]
        ]
        headers = ["tensor", "type", "SQNR dB", "rel err", "max abs", "saturated", "ok"]
        out.print(_fit_table(out, headers, rows, right=(2, 3, 4, 5)))
    if report.moe and not quiet:
        _section(out, "MoE layers: GroupedMatmulSituQuant chain, package vs source experts")
        rows = [
            [m.layer, m.type, f"{m.experts_used}/{m.experts}", str(m.tokens), f"{m.rel_err_situ:.4f}",
             f"{m.rel_err:.4f}", f"{m.max_rel_err:g}", _yes(m.ok)]
            for m in report.moe
        ]
        headers = ["layer", "type", "experts", "tokens", "SiTU err", "out err", "limit", "ok"]
        out.print(_fit_table(out, headers, rows, right=(2, 3, 4, 5, 6)))
    if report.npu and not quiet:
        _section(out, "GroupedMatmulSituQuant on the NPU vs the CPU reference")
        rows = [
            [r.layer, str(r.experts_used), str(r.tokens), f"{r.rel_err:.4f}", f"{r.codes_equal:.2%}",
             f"{r.scales_equal:.2%}", f"{r.tol:g}", _yes(r.ok)]
            for r in report.npu
        ]
        headers = ["layer", "experts", "tokens", "rel err", "codes eq", "scales eq", "tol", "ok"]
        out.print(_fit_table(out, headers, rows, right=(1, 2, 3, 4, 5, 6)))
    passed = sum(1 for c in report.checks if c.ok and not c.skipped)
    if report.ok:
        out.print(f"[bold green]OK[/]: {passed} check(s) passed ({report.seconds:.2f} s)", highlight=False)
    else:
        names = ", ".join(c.name for c in report.failed)
        out.print(f"[bold red]FAILED[/]: {len(report.failed)} check(s) failed: {names}", highlight=False)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
