"""verify --report FILE.html: one self-contained page (inline CSS and SVG, no script, no network: its
Content-Security-Policy forbids any fetch), rendered from `VerifyReport.to_dict()` alone. Every
string that came from a file (tensor and module names, details, reasons) is HTML-escaped:
checkpoints are untrusted input."""

from __future__ import annotations

import html
import math
from typing import TextIO

from ascendconv.cli.render.report_data import (
    OUTSIDE,
    check_result,
    fallback_groups,
    float_modules,
    histogram,
    layer_grid,
    provenance_rows,
    type_figures,
    verdict,
)
from ascendconv.errors import plural

# SQNR colour scale, in dB: fixed, so that a colour means the same in every report. Low is dark
# (viridis-like steps, legible for colour-blind readers); MXFP4 weights sit near 19 dB, MXFP8 near 30.
SCALE_LOW_DB, SCALE_HIGH_DB = 10.0, 40.0
PALETTE = ("#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725")
EXACT_COLOUR = "#d0d0d0"
CELL_W, CELL_H, ROW_LABEL_W, HEADER_H = 64, 18, 150, 150
WORST_LISTED = 20
PROBLEMS_LISTED = 20

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1b1b1b;max-width:1400px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.verdict{display:inline-block;padding:2px 10px;border-radius:4px;font-weight:600;color:#fff}
.ok{background:#2e7d32} .fail{background:#c62828}
table{border-collapse:collapse;margin:6px 0} th,td{padding:3px 10px;text-align:left;vertical-align:top;border-bottom:1px solid #eee}
th{background:#f6f6f6;font-weight:600} td.num{text-align:right;font-variant-numeric:tabular-nums}
code{font:12.5px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;word-break:break-all}
.muted{color:#666} .FAIL{color:#c62828;font-weight:600} .pass{color:#2e7d32} .skip{color:#8a6d00}
svg.heatmap{display:block} svg text{font:11px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
details{margin:2px 0} summary{cursor:pointer}
.cards{display:flex;gap:14px;flex-wrap:wrap;margin:12px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:150px}
.card b{display:block;font-size:18px}
"""


def e(value: object) -> str:
    """Any value as HTML text (names from files included)."""
    return html.escape(str(value), quote=True)


def colour(db: float) -> str:
    if not math.isfinite(db):
        return EXACT_COLOUR
    share = (min(max(db, SCALE_LOW_DB), SCALE_HIGH_DB) - SCALE_LOW_DB) / (SCALE_HIGH_DB - SCALE_LOW_DB)
    return PALETTE[min(len(PALETTE) - 1, int(share * len(PALETTE)))]


def _db(db: float) -> str:
    return "exact" if not math.isfinite(db) else f"{db:.1f}"


def heat_map(report: dict) -> str:
    """An inline SVG: one row per layer, one column per module kind, each cell the worst SQNR of
    its weights (all experts of a MoE projection in one cell); a failed weight outlines its cell."""
    grid = layer_grid(report)
    if not grid.cells:
        return '<p class="muted">No weights were measured: run verify with --source SRC for the numerical checks.</p>'
    width = ROW_LABEL_W + CELL_W * len(grid.kinds) + HEADER_H  # room for the last kind's slanted label
    height = HEADER_H + CELL_H * len(grid.rows) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="heatmap" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="SQNR per layer and module kind">']
    for j, kind in enumerate(grid.kinds):
        x, y = ROW_LABEL_W + CELL_W * j + CELL_W / 2, HEADER_H - 6
        parts.append(f'<text class="kind" x="{x:.0f}" y="{y}" transform="rotate(-40 {x:.0f} {y})">{e(kind)}</text>')
    for i, row in enumerate(grid.rows):
        y = HEADER_H + CELL_H * i
        label = row if row == OUTSIDE or not row.isdigit() else f"layer {row}"
        parts.append(f'<text class="layer" x="{ROW_LABEL_W - 6}" y="{y + CELL_H - 5}" text-anchor="end">{e(label)}</text>')
        for j, kind in enumerate(grid.kinds):
            cell = grid.cells.get((row, kind))
            if cell is None:
                continue
            x = ROW_LABEL_W + CELL_W * j
            fill = colour(cell.worst_db)
            stroke = ' stroke="#e00000" stroke-width="2.5"' if cell.failed else ' stroke="#fff" stroke-width="1"'
            tip = (f"{label} · {kind} · {cell.type_label} · worst {_db(cell.worst_db)} dB ({cell.worst}) · "
                   + plural(cell.tensors, "weight") + (f" · {cell.failed} FAILED" if cell.failed else ""))
            parts.append(f'<g class="cell" data-layer="{e(row)}" data-kind="{e(kind)}">'
                         f'<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" fill="{fill}"{stroke}>'
                         f"<title>{e(tip)}</title></rect>")
            ink = "#000" if fill in PALETTE[6:] or fill == EXACT_COLOUR else "#fff"
            parts.append(f'<text x="{x + CELL_W / 2:.0f}" y="{y + CELL_H - 5}" text-anchor="middle" fill="{ink}">'
                         f"{_db(cell.worst_db)}</text></g>")
    parts.append("</svg>")
    return "".join(parts)


def legend() -> str:
    step = (SCALE_HIGH_DB - SCALE_LOW_DB) / len(PALETTE)
    boxes = "".join(
        f'<rect x="{40 * i}" y="0" width="40" height="14" fill="{c}"/>'
        + (f'<text x="{40 * i}" y="28">{SCALE_LOW_DB + step * i:.0f}</text>' if i % 2 == 0 else "")
        for i, c in enumerate(PALETTE)
    )
    exact = f'<rect x="{40 * len(PALETTE) + 20}" y="0" width="40" height="14" fill="{EXACT_COLOUR}"/>' \
            f'<text x="{40 * len(PALETTE) + 20}" y="28">exact</text>'
    return (f'<div><svg xmlns="http://www.w3.org/2000/svg" class="legend" width="{40 * len(PALETTE) + 80}" height="32">'
            f'{boxes}<text x="{40 * len(PALETTE)}" y="28" text-anchor="end">{SCALE_HIGH_DB:.0f} dB</text>{exact}</svg></div>'
            '<p class="muted">Each cell: the worst SQNR (dB) of the weights of that layer and module kind '
            "(every expert of a MoE projection in one cell); higher is closer to the source. A red outline: a "
            "weight below its threshold. Hover a cell for its worst tensor.</p>")


def distribution(report: dict) -> str:
    figures = type_figures(report)
    if not figures:
        return ""
    rows = []
    for f in figures:
        bars = histogram(f.sqnr_db)
        svg = ""
        if bars:
            top = max(n for _, _, n in bars)
            w = 12
            rects = "".join(
                f'<rect x="{i * w}" y="{40 - 38 * n / top:.1f}" width="{w - 1}" height="{38 * n / top:.1f}" '
                f'fill="{colour((lo + hi) / 2)}"><title>{lo:.1f}-{hi:.1f} dB: {n}</title></rect>'
                for i, (lo, hi, n) in enumerate(bars)
            )
            svg = (f'<svg xmlns="http://www.w3.org/2000/svg" class="histogram" width="{w * len(bars)}" height="54">{rects}'
                   f'<text x="0" y="52">{bars[0][0]:.1f}</text>'
                   f'<text x="{w * len(bars)}" y="52" text-anchor="end">{bars[-1][1]:.1f} dB</text></svg>')
        med = f.quantile(0.5)
        rows.append(
            f"<tr><td><code>{e(f.quant_type)}</code></td><td class=num>{f.count}</td><td class=num>{f.exact}</td>"
            f"<td class=num>{_db(f.sqnr_db[0]) if f.sqnr_db else '-'}</td><td class=num>{_db(med) if med is not None else '-'}</td>"
            f"<td class=num>{_db(f.sqnr_db[-1]) if f.sqnr_db else '-'}</td>"
            f"<td class=num>{'-' if f.threshold is None else e(f.threshold)}</td><td class=num>{f.failed}</td><td>{svg}</td></tr>"
        )
    return ("<h2>Error distribution per quant type</h2><table><tr><th>type</th><th>weights</th><th>exact</th>"
            "<th>worst dB</th><th>median dB</th><th>best dB</th><th>threshold dB</th><th>failed</th><th>SQNR histogram</th></tr>"
            + "".join(rows) + "</table>")


def _table(headers: list[str], rows: list[list[str]], numeric: tuple[int, ...] = ()) -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if i in numeric else ''}>{cell}</td>" for i, cell in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _checks(report: dict) -> str:
    rows = []
    for check in report.get("checks", []):
        result = check_result(check)
        more = ""
        problems = check.get("problems") or []
        if problems:
            listed = "".join(f"<li><code>{e(p)}</code></li>" for p in problems[:PROBLEMS_LISTED])
            extra = f"<li>… and {len(problems) - PROBLEMS_LISTED} more (see --json)</li>" if len(problems) > PROBLEMS_LISTED else ""
            more += f"<details open><summary>{plural(len(problems), 'problem')}</summary><ul>{listed}{extra}</ul></details>"
        if check.get("hint"):
            more += f'<div class="muted">hint: {e(check["hint"])}</div>'
        rows.append([f"<code>{e(check['name'])}</code>", f'<span class="{result}">{result}</span>', e(check["detail"]) + more])
    return "<h2>Checks</h2>" + _table(["check", "result", "detail"], rows)


def _moe(report: dict) -> str:
    out = ""
    if report.get("moe"):
        rows = [[f"<code>{e(m['layer'])}</code>", e(m["type"]), f"{m['experts_used']}/{m['experts']}", e(m["tokens"]),
                 _num(m["rel_err_situ"]), _num(m["rel_err"]), e(m["max_rel_err"]), "yes" if m["ok"] else '<span class="FAIL">NO</span>']
                for m in report["moe"]]
        out += ("<h2>MoE layers: GroupedMatmulSituQuant chain, package vs source experts</h2>"
                + _table(["layer", "type", "experts", "tokens", "SiTU err", "out err", "limit", "ok"], rows, (2, 3, 4, 5, 6)))
    if report.get("npu"):
        rows = [[f"<code>{e(r['layer'])}</code>", e(r["experts_used"]), e(r["tokens"]), _num(r["rel_err"]),
                 f"{r['codes_equal']:.2%}", f"{r['scales_equal']:.2%}", e(r["tol"]), "yes" if r["ok"] else '<span class="FAIL">NO</span>']
                for r in report["npu"]]
        out += ("<h2>GroupedMatmulSituQuant on the NPU vs the CPU reference</h2>"
                + _table(["layer", "experts", "tokens", "rel err", "codes eq", "scales eq", "tol", "ok"], rows, (1, 2, 3, 4, 5, 6)))
    return out


def _num(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def _worst(report: dict) -> str:
    tensors = report.get("tensors", [])[:WORST_LISTED]
    if not tensors:
        return ""
    rows = [[f"<code>{e(t['name'])}</code>", e(t["type"]), _db(math.inf if t["sqnr_db"] is None else t["sqnr_db"]),
             _num(t["rel_err"]), "-" if t["max_abs"] is None else f"{t['max_abs']:.3g}", f"{t['saturated']:.2%}",
             "yes" if t["ok"] else '<span class="FAIL">NO</span>'] for t in tensors]
    return (f"<h2>Worst {len(tensors)} of {plural(len(report['tensors']), 'weight')}</h2>"
            + _table(["tensor", "type", "SQNR dB", "rel err", "max abs", "saturated", "ok"], rows, (2, 3, 4, 5)))


def _fallbacks_and_float(report: dict) -> str:
    groups = fallback_groups(report)
    out = f"<h2>Fallbacks ({sum(g[1] for g in groups)})</h2>"
    if groups:
        rows = [[f"<code>{e(p)}</code>", str(n), f"{e(req)} → {e(wr)}", e(reason)] for p, n, req, wr, reason in groups]
        out += _table(["module", "modules", "type", "reason"], rows, (1,))
    else:
        out += '<p class="muted">None recorded: every quantizable linear is written as the scheme asks.</p>'
    floats = float_modules(report)
    if floats:
        rows = [[f"<code>{e(p)}</code>", str(n), str(exact)] for p, n, exact in floats]
        out += "<h2>FLOAT modules (resolved to BF16 or copied)</h2>" + _table(["module", "weights", "exact"], rows, (1, 2))
    return out


def _cards(report: dict) -> str:
    checks = report.get("checks", [])
    passed = sum(1 for c in checks if c["ok"] and not c.get("skipped"))
    tensors = report.get("tensors", [])
    cards = [("checks passed", f"{passed} of {len(checks)}"), ("weights measured", str(len(tensors)))]
    if tensors:
        worst = tensors[0]
        cards.append(("worst weight", f"{_db(math.inf if worst['sqnr_db'] is None else worst['sqnr_db'])} dB"))
    if report.get("moe"):
        cards.append(("worst MoE out err", f"{max(m['rel_err'] or 0 for m in report['moe']):.4f}"))
    cards.append(("took", f"{report.get('seconds', 0):.2f} s"))
    return '<div class="cards">' + "".join(f'<div class="card"><span class="muted">{e(k)}</span><b>{e(v)}</b></div>'
                                           for k, v in cards) + "</div>"


def render(report: dict, out: TextIO) -> None:
    """The whole page, written to `out`."""
    ok = report.get("ok")
    worst_note = ""
    if report.get("tensors"):
        worst_note = f'<p class="muted">worst: <code>{e(report["tensors"][0]["name"])}</code></p>'
    out.write(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>ascendconv verify: {e(report.get('package'))}</title><style>{STYLE}</style></head><body>"
        f"<h1>ascendconv verify <code>{e(report.get('package'))}</code></h1>"
        f'<span class="verdict {"ok" if ok else "fail"}">{e(verdict(report))}</span>'
        f"{_cards(report)}"
        "<h2>SQNR per layer and module kind</h2>"
        f"{heat_map(report)}{legend() if report.get('tensors') else ''}{worst_note}"
        f"{distribution(report)}{_moe(report)}{_fallbacks_and_float(report)}{_checks(report)}{_worst(report)}"
        "<h2>Provenance</h2>"
        + _table(["", ""], [[e(k), f"<code>{e(v)}</code>" if k == "command" else e(v)] for k, v in provenance_rows(report)])
        + '<p class="muted">Written by <code>ascendconv verify --report</code> from the report\'s JSON data '
        "(<code>verify --json</code>).</p></body></html>\n"
    )
