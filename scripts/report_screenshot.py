#!/usr/bin/env python3
"""The README's picture of `verify --report FILE.html`: a synthetic 12-layer DeepSeek-like checkpoint
(scripts/synthetic_checkpoint.py, 0.1 GB) converted with w4a8-mxfp-moe, verified with --source and
--moe-check, and the page photographed by a headless Chromium.

    python scripts/report_screenshot.py [PNG]        # default: docs/verify-report.png

Needs a Chromium (`apt-get install chromium` on Debian) and ascendconv on the path of this Python.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from synthetic_checkpoint import Shape, build

REPO = Path(__file__).resolve().parent.parent
SHAPE = Shape(hidden=1024, vocab=1024, dense_intermediate=1408, experts=8, moe_intermediate=256, q_lora_rank=384,
              kv_lora_rank=256)
LAYERS = 12
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def browser() -> str | None:
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


def headless(chromium: str, *args: str) -> list[str]:
    """A headless Chromium command line that needs no display, GPU or user profile."""
    return [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run", *args]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("png", nargs="?", type=Path, default=REPO / "docs" / "verify-report.png")
    parser.add_argument("--width", type=int, default=1100)
    parser.add_argument("--height", type=int, default=980)
    args = parser.parse_args(argv)
    chromium = browser()
    if chromium is None:
        parser.error("no Chromium found (looked for " + ", ".join(BROWSERS) + ")")
    ascendconv = [sys.executable, "-m", "ascendconv"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build(work / "src", SHAPE, LAYERS, log=lambda line: None)
        subprocess.run([*ascendconv, "convert", work / "src", work / "pkg", "--scheme", "w4a8-mxfp-moe", "--quiet"], check=True)
        page = work / "report.html"
        subprocess.run([*ascendconv, "verify", work / "pkg", "--source", work / "src", "--moe-check", "--moe-layers", "0",
                        "--quiet", "--report", page], check=True)
        subprocess.run(headless(chromium, f"--window-size={args.width},{args.height}", f"--screenshot={args.png}",
                                page.as_uri()), check=True, capture_output=True, cwd=tmp)
    print(f"{args.png}: {args.png.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
