"""Measure the conversion error of every scheme and scale rule on the bundled fixtures.

Converts each fixture under each scheme and rule into a temporary directory, runs
`verify --source --moe-check` on the result, and prints a markdown table of the relative L2 error
of the quantized weights against the BF16-resolved source, per written type (mean over tensors, and
the worst tensor), with the worst MoE layer's output error (the chain each expert type runs: MXFP8,
BF16 or MXFP4 activations), then a summary per type and rule. docs/accuracy.md holds the output,
docs/scale-rules.md the summary. It exits 1 when a package fails verify:

    python scripts/measure_errors.py [--fixtures DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from ascendconv.convert import ConvertOptions, convert
from ascendconv.ascendv1 import MX_TYPES, RANK
from ascendconv.formats.constants import SCALE_RULES
from ascendconv.decide import SCHEMES
from ascendconv.verify import VerifyOptions, verify

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def measure(fixture: Path, scheme: str, rule: str, workdir: Path) -> dict:
    out = workdir / f"{fixture.name}-{scheme}-{rule}"
    convert(fixture, out, ConvertOptions(scheme=scheme, scale_rule=rule))
    report = verify(out, VerifyOptions(source=fixture, moe_check=True, moe_layers=0))
    row = {"fixture": fixture.name, "scheme": scheme, "rule": rule, "ok": report.ok}
    for quant_type in TYPES:
        errors = [t.rel_err for t in report.tensors if t.type == quant_type]
        row[quant_type] = {"mean": statistics.fmean(errors), "max": max(errors), "tensors": len(errors)} if errors else None
    worst = max(report.moe, key=lambda m: m.rel_err, default=None)
    row["moe"] = None if worst is None else {
        "type": worst.type, "rel_err": worst.rel_err, "situ": worst.rel_err_situ, "bf16": max(m.rel_err_bf16 for m in report.moe)
    }
    return row


TYPES = sorted(MX_TYPES, key=RANK.__getitem__)


def cell(stats: dict | None) -> str:
    return "-" if stats is None else f"{stats['mean']:.4f} (max {stats['max']:.4f})"


def moe_cell(moe: dict | None) -> str:
    return "-" if moe is None else f"{moe['rel_err']:.4f} / {moe['bf16']:.4f} ({moe['type']})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=FIXTURES)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    fixtures = sorted(p for p in args.fixtures.iterdir() if (p / "config.json").is_file())
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(f, s, r, Path(tmp)) for f in fixtures for s in SCHEMES for r in SCALE_RULES]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows)
    sys.exit(0 if all(row["ok"] for row in rows) else 1)  # a FAIL printed is a failed run


def print_table(rows: list[dict]) -> None:
    print("| fixture | scheme | rule | " + " | ".join(f"{t} rel. L2" for t in TYPES) + " | MoE out rel. err / vs BF16 | verify |")
    print("|---|---|---|" + "---|" * len(TYPES) + "---|---|")
    for row in rows:
        print(
            f"| {row['fixture']} | {row['scheme']} | {row['rule']} | "
            + " | ".join(cell(row[t]) for t in TYPES)
            + f" | {moe_cell(row['moe'])} | {'pass' if row['ok'] else 'FAIL'} |"
        )
    print()
    print_summary(rows)


def worst(moe: list[dict], key: str) -> str:
    return f"{max(m[key] for m in moe):.4f}" if moe else "-"


def print_summary(rows: list[dict]) -> None:
    """Per type and rule over every fixture and scheme: the mean of the per-package mean weight
    errors, the worst weight, and the worst MoE output error of the layers whose experts are that type
    (against the source chain on the same activations, and against the BF16 one)."""
    print("| type | rule | weight rel. L2, mean (worst) | MoE out rel. err, worst | MoE out vs BF16, worst | packages |")
    print("|---|---|---|---|---|---:|")
    for quant_type in TYPES:
        for rule in SCALE_RULES:
            stats = [row[quant_type] for row in rows if row["rule"] == rule and row[quant_type]]
            if not stats:
                continue
            moe = [row["moe"] for row in rows if row["rule"] == rule and row["moe"] and row["moe"]["type"] == quant_type]
            mean = statistics.fmean(s["mean"] for s in stats)
            print(
                f"| {quant_type} | {rule} | {mean:.4f} ({max(s['max'] for s in stats):.4f}) | "
                f"{worst(moe, 'rel_err')} | {worst(moe, 'bf16')} | {len(stats)} |"
            )


if __name__ == "__main__":
    main()
