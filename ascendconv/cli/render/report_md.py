"""verify --report FILE.md and --step-summary: the HTML report's content as GitHub-flavoured
Markdown, small enough for a CI job summary (tables of groups, not of tensors), rendered from
`VerifyReport.to_dict()` alone. Names from files go into code spans, other text from files is
escaped (ascendconv.markdown): a Markdown renderer must show them as text, never as markup, links or
HTML."""

from __future__ import annotations

import math
from typing import TextIO

from ascendconv.cli.render.report_data import (
    check_result,
    fallback_groups,
    float_modules,
    layer_grid,
    provenance_rows,
    type_figures,
    verdict,
)
from ascendconv.errors import plural
from ascendconv.markdown import code, text

WORST_LISTED = 10
GROUPS_LISTED = 30
PROBLEMS_LISTED = 5


def _db(db) -> str:
    return "exact" if db is None or not math.isfinite(db) else f"{db:.1f}"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers), *("| " + " | ".join(r) + " |" for r in rows)]


def render(report: dict, out: TextIO) -> None:
    lines = [f"## ascendconv verify {code(report.get('package'))}", "",
             f"**{'✅' if report.get('ok') else '❌'} {text(verdict(report))}** ({report.get('seconds', 0):.2f} s)", ""]
    lines += _table(["check", "result", "detail"], [
        [code(c["name"]), check_result(c), text(c["detail"])] for c in report.get("checks", [])
    ])
    for check in report.get("checks", []):
        if check["ok"] or not check.get("problems"):
            continue
        lines += ["", f"**{code(check['name'])}**: {plural(len(check['problems']), 'problem')}", ""]
        lines += [f"- {code(p)}" for p in check["problems"][:PROBLEMS_LISTED]]
        if len(check["problems"]) > PROBLEMS_LISTED:
            lines.append(f"- … and {len(check['problems']) - PROBLEMS_LISTED} more (see `verify --json`)")
        if check.get("hint"):
            lines.append(f"- hint: {text(check['hint'])}")
    figures = type_figures(report)
    if figures:
        lines += ["", "### SQNR per quant type (dB)", ""]
        lines += _table(["type", "weights", "exact", "worst", "median", "best", "threshold", "failed"], [
            [code(f.quant_type), str(f.count), str(f.exact), _db(f.sqnr_db[0] if f.sqnr_db else None),
             _db(f.quantile(0.5)), _db(f.sqnr_db[-1] if f.sqnr_db else None),
             "-" if f.threshold is None else text(f.threshold), str(f.failed)] for f in figures
        ])
        grid = layer_grid(report)
        lines += ["", "### Worst SQNR per layer and module kind (dB; ⚠ a weight below its threshold)", ""]
        lines += _table(["layer", *(code(k) for k in grid.kinds)], [
            [text(row), *(
                "" if (cell := grid.cells.get((row, kind))) is None
                else _db(cell.worst_db) + (" ⚠" if cell.failed else "") for kind in grid.kinds
            )] for row in grid.rows
        ])
    if report.get("moe"):
        lines += ["", "### MoE layers (GroupedMatmulSituQuant chain)", ""]
        lines += _table(["layer", "type", "experts", "out err", "limit", "ok"], [
            [code(m["layer"]), text(m["type"]), f"{m['experts_used']}/{m['experts']}",
             "-" if m["rel_err"] is None else f"{m['rel_err']:.4f}", text(m["max_rel_err"]), "yes" if m["ok"] else "**NO**"]
            for m in report["moe"]
        ])
    groups = fallback_groups(report)
    lines += ["", f"### Fallbacks ({sum(g[1] for g in groups)})", ""]
    if groups:
        lines += _table(["module", "modules", "type", "reason"], [
            [code(p), str(n), f"{text(req)} → {text(wr)}", text(reason)] for p, n, req, wr, reason in groups[:GROUPS_LISTED]
        ])
        if len(groups) > GROUPS_LISTED:
            lines += ["", f"… and {plural(len(groups) - GROUPS_LISTED, 'more kind')} (see the HTML report or `verify --json`)"]
    else:
        lines.append("None recorded.")
    floats = float_modules(report)
    if floats:
        lines += ["", "### FLOAT modules", ""]
        lines += _table(["module", "weights", "exact"], [[code(p), str(n), str(x)] for p, n, x in floats[:GROUPS_LISTED]])
    tensors = report.get("tensors", [])[:WORST_LISTED]
    if tensors:
        lines += ["", f"### Worst {len(tensors)} of {plural(len(report['tensors']), 'weight')}", ""]
        lines += _table(["tensor", "type", "SQNR dB", "rel err", "ok"], [
            [code(t["name"]), text(t["type"]), _db(t["sqnr_db"]), "-" if t["rel_err"] is None else f"{t['rel_err']:.4f}",
             "yes" if t["ok"] else "**NO**"] for t in tensors
        ])
    lines += ["", "### Provenance", ""]
    lines += _table(["", ""], [[text(k), code(v) if k == "command" else text(v)] for k, v in provenance_rows(report)])
    out.write("\n".join(lines) + "\n")
