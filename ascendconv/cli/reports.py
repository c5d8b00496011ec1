"""verify's report files: --report FILE.html / FILE.md and --step-summary, each written from
`VerifyReport.to_dict()` by one renderer of `cli/render/` (docs/verify.md, "Reports")."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Callable, TextIO

from ascendconv.cli.console import notice
from ascendconv.errors import BadOptionError, OutputPathError

Renderer = Callable[[dict, TextIO], None]
SUFFIXES = {".html": "html", ".htm": "html", ".md": "markdown", ".markdown": "markdown"}
STEP_SUMMARY = "GITHUB_STEP_SUMMARY"


def renderer(kind: str) -> Renderer:
    if kind == "html":
        from ascendconv.cli.render.report_html import render
    else:
        from ascendconv.cli.render.report_md import render
    return render


def check_report_path(path: Path) -> str:
    """The report's format, from FILE's suffix; refused before any check runs otherwise."""
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise BadOptionError(f"--report {path}: the name must end in .html or .md", "e.g. --report verify.html")
    if path.is_dir():
        raise BadOptionError(f"--report {path}: is a directory", "name a file, e.g. --report verify.html")
    return kind


def write_reports(data: dict, path: Path | None, kind: str | None, step_summary: bool) -> None:
    if path is not None:
        text = io.StringIO()
        renderer(kind)(data, text)
        try:
            path.write_text(text.getvalue(), encoding="utf-8")
        except OSError as exc:
            raise OutputPathError(f"--report {path}: cannot write ({exc.strerror or exc})") from None
    if step_summary:
        target = os.environ.get(STEP_SUMMARY)
        if not target:
            notice(f"--step-summary: ${STEP_SUMMARY} is not set (not a GitHub Actions job); nothing appended")
            return
        text = io.StringIO()
        renderer("markdown")(data, text)
        try:
            with open(target, "a", encoding="utf-8") as summary:
                summary.write(text.getvalue() + "\n")
        except OSError as exc:
            raise OutputPathError(f"--step-summary: cannot append to {target} ({exc.strerror or exc})") from None
