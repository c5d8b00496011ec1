"""Measure the conversion error of every scheme and scale rule on the bundled fixtures.

Converts each fixture under each scheme and rule into a temporary directory, runs
`verify --source` on the result, and prints a markdown table of the relative L2 error of the
quantized weights against the BF16-resolved source, per written type (mean over tensors, and the
worst tensor). The README's table is this script's output. It exits 1 when a package fails verify:

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
from ascendconv.formats.constants import SCALE_RULES, W4A8_MXFP, W8A8_MXFP8
from ascendconv.decide import SCHEMES
from ascendconv.verify import VerifyOptions, verify

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def measure(fixture: Path, scheme: str, rule: str, workdir: Path) -> dict:
    out = workdir / f"{fixture.name}-{scheme}-{rule}"
    convert(fixture, out, ConvertOptions(scheme=scheme, scale_rule=rule))
    report = verify(out, VerifyOptions(source=fixture))
    row = {"fixture": fixture.name, "scheme": scheme, "rule": rule, "ok": report.ok}
    for quant_type in (W8A8_MXFP8, W4A8_MXFP):
        errors = [t.rel_err for t in report.tensors if t.type == quant_type]
        row[quant_type] = {"mean": statistics.fmean(errors), "max": max(errors), "tensors": len(errors)} if errors else None
    return row


def cell(stats: dict | None) -> str:
    return "-" if stats is None else f"{stats['mean']:.4f} (max {stats['max']:.4f})"


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
    print("| fixture | scheme | rule | W8A8_MXFP8 rel. L2 | W4A8_MXFP rel. L2 | verify |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['fixture']} | {row['scheme']} | {row['rule']} | {cell(row[W8A8_MXFP8])} "
            f"| {cell(row[W4A8_MXFP])} | {'pass' if row['ok'] else 'FAIL'} |"
        )


if __name__ == "__main__":
    main()
