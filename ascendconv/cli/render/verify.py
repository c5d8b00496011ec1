"""verify's human output: the checks, the problems of failed ones, the worst tensors, MoE and NPU."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from ascendconv.ascendv1 import Provenance
from ascendconv.cli.console import terminal_safe
from ascendconv.errors import plural
from ascendconv.cli.render.tables import deployment_flags, elide_name, print_table, section

BLOCKS = "▁▂▃▄▅▆▇█"
STRIP_LOW_DB, STRIP_HIGH_DB = 10.0, 40.0  # the HTML report's colour scale


def _db(x) -> str:
    if x is None or x != x:
        return "nan"
    return "exact" if x == float("inf") else f"{x:.1f}"


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


def render_verify(report, out: Console, top: int = 10, quiet: bool = False) -> None:
    """Print a VerifyReport: the checks, the problems of failed ones, the worst tensors, MoE and NPU."""
    prov = report.provenance
    if not quiet:
        origin = Provenance(prov).origin() if prov else "no provenance"
        out.print(f"[bold]verify[/] {escape(terminal_safe(report.package))}  [dim]({escape(terminal_safe(origin))})[/]", highlight=False)
        line = deployment_line(report.deployment)
        if line:
            out.print(f"[dim]{escape(terminal_safe(line))}[/]", highlight=False)
        rows = [[c.name, "FAIL" if not c.ok else ("skip" if c.skipped else "pass"), terminal_safe(c.detail)] for c in report.checks]
        print_table(out, ["check", "result", "detail"], rows, elide=None, wrap=2)
    for check in report.failed:
        out.print(f"[bold red]{check.name}[/]: {plural(len(check.problems), 'problem')}", highlight=False)
        for problem in check.problems[:8]:
            out.print(f"  - {escape(terminal_safe(problem))}", highlight=False)
        if len(check.problems) > 8:
            out.print(f"  … and {len(check.problems) - 8} more (see --json)")
        if check.hint:
            out.print(f"  [dim]hint:[/] {escape(terminal_safe(check.hint))}", highlight=False)
    if report.tensors and not quiet:
        layer_strip(report.to_dict(), out)
        section(out, f"worst {min(top, len(report.tensors))} of {plural(len(report.tensors), 'weight')}")
        rows = [
            [terminal_safe(t.name), t.type, _db(t.sqnr_db), f"{t.rel_err:.4f}", f"{t.max_abs:.3g}", f"{t.saturated:.2%}", _yes(t.ok)]
            for t in report.tensors[:top]
        ]
        headers = ["tensor", "type", "SQNR dB", "rel err", "max abs", "saturated", "ok"]
        print_table(out, headers, rows, right=(2, 3, 4, 5))
    if report.moe and not quiet:
        section(out, "MoE layers: GroupedMatmulSituQuant chain, package vs source experts")
        rows = [
            [terminal_safe(m.layer), m.type, f"{m.experts_used}/{m.experts}", str(m.tokens), f"{m.rel_err_situ:.4f}",
             f"{m.rel_err:.4f}", f"{m.max_rel_err:g}", _yes(m.ok), f"{m.rel_err_bf16:.4f}"]
            for m in report.moe
        ]
        headers = ["layer", "type", "experts", "tokens", "SiTU err", "out err", "limit", "ok", "vs BF16"]
        print_table(out, headers, rows, right=(2, 3, 4, 5, 6, 8))
    if report.npu and not quiet:
        section(out, "GroupedMatmulSituQuant on the NPU vs the CPU reference")
        rows = [
            [terminal_safe(r.layer), str(r.experts_used), str(r.tokens), f"{r.rel_err:.4f}", f"{r.codes_equal:.2%}",
             f"{r.scales_equal:.2%}", f"{r.tol:g}", _yes(r.ok)]
            for r in report.npu
        ]
        headers = ["layer", "experts", "tokens", "rel err", "codes eq", "scales eq", "tol", "ok"]
        print_table(out, headers, rows, right=(1, 2, 3, 4, 5, 6))
    if report.ok:
        out.print(f"[bold green]OK[/]: {report.tally()} ({report.seconds:.2f} s)", highlight=False)
    else:
        names = ", ".join(c.name for c in report.failed)
        out.print(f"[bold red]FAILED[/]: {plural(len(report.failed), 'check')} failed: {names}", highlight=False)


ORIGINS = {
    "given": "given on the command line",
    "recorded": "as recorded at conversion",
    "unreadable": "the recorded value is unreadable, see provenance",
    "default": "the default",
}


def deployment_line(deployment: dict | None) -> str | None:
    """Which --tp / --ep the package was checked for and where each came from; None when neither
    was recorded at conversion (the options speak for themselves)."""
    if deployment is None:
        return None
    origins = set(deployment["from"].values())
    if origins <= {"given", "default"} and deployment["recorded"] is None:
        return None
    flags = {"tp": f"--tp {deployment['tp']}", "ep": "--ep" if deployment["ep"] else "--no-ep"}
    if origins == {"recorded"}:
        return f"checked for --tp {deployment['tp']}{' --ep' if deployment['ep'] else ''}, as recorded at conversion"
    line = "checked for " + ", ".join(f"{flags[key]} ({ORIGINS[origin]})" for key, origin in deployment["from"].items())
    recorded = deployment["recorded"]
    return line + (f"; converted for {deployment_flags(recorded)}" if recorded else "")


def layer_strip(data: dict, out: Console) -> None:
    """The heat map of the HTML report in one line per module kind: a character per layer, its
    height the worst SQNR of that layer's weights of the kind, '!' where one is below its threshold.
    Weights outside the layers (an MTP module under 'mtp.0.', a vision merger) are in words at the
    end of their kind's line, which has no character when the kind is in no layer."""
    import math

    from ascendconv.cli.render.report_data import OUTSIDE, layer_grid

    grid = layer_grid(data)
    rows = [r for r in grid.rows if r != OUTSIDE]
    if not rows:
        return
    section(out, f"worst SQNR per layer, {rows[0]} to {rows[-1]} left to right "
                 f"({BLOCKS[0]} {STRIP_LOW_DB:.0f} dB or less … {BLOCKS[-1]} {STRIP_HIGH_DB:.0f} dB or more, = exact, ! failed)")
    labels = {kind: terminal_safe(kind) for kind in grid.kinds}
    label_width = max(len(label) for label in labels.values())
    if out.is_terminal:
        label_width = min(label_width, max(12, out.width - len(rows) - 18))
    for kind in grid.kinds:
        marks, worst = [], None
        for row in rows:
            cell = grid.cells.get((row, kind))
            if cell is None:
                marks.append(" ")
                continue
            if worst is None or cell.worst_db < worst[0]:
                worst = (cell.worst_db, row)
            if cell.failed:
                marks.append("!")
            elif not math.isfinite(cell.worst_db):
                marks.append("=")
            else:
                share = (min(max(cell.worst_db, STRIP_LOW_DB), STRIP_HIGH_DB) - STRIP_LOW_DB) / (STRIP_HIGH_DB - STRIP_LOW_DB)
                marks.append(BLOCKS[min(len(BLOCKS) - 1, int(share * len(BLOCKS)))])
        label = elide_name(labels[kind], label_width) if out.is_terminal else labels[kind]
        words = []
        if worst is not None:
            words.append("exact" if not math.isfinite(worst[0]) else f"{worst[0]:.1f} dB (layer {terminal_safe(worst[1])})")
        outside = grid.cells.get((OUTSIDE, kind))
        if outside is not None:
            failed = f", {outside.failed} of {outside.tensors} failed" if outside.failed else ""
            words.append(f"{OUTSIDE}: " + ("exact" if not math.isfinite(outside.worst_db) else f"{outside.worst_db:.1f} dB") + failed)
        strip = "" if worst is None else "".join(marks) + "  "
        out.print(f"{label:<{label_width}}  {strip}{'; '.join(words)}", markup=False, highlight=False)
