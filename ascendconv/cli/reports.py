"""verify's report files: --report FILE.html / FILE.md and --step-summary, each written from
`VerifyReport.to_dict()` by one renderer of `cli/render/` (docs/verify.md, "Reports")."""

from __future__ import annotations

import errno
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


def check_report_path(path: Path, package: Path) -> str:
    """The report's format, from FILE's suffix; FILE refused before any check runs when it could not
    be written at the end (or would land in the package being checked)."""
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise BadOptionError(f"--report {path}: the name must end in .html or .md", "e.g. --report verify.html")
    if os.path.isdir(path):  # not Path.is_dir: it raises for a name too long to exist
        raise BadOptionError(f"--report {path}: is a directory", "name a file, e.g. --report verify.html")
    if Path(os.path.realpath(path)).parent == Path(os.path.realpath(package)):
        raise BadOptionError(
            f"--report {path}: is inside the package it reports on, which it would change (or replace one of its "
            "files, as README.md)",
            f"write it beside the package, e.g. --report {package.name}.verify{path.suffix}",
        )
    probe_writable(path, f"--report {path}")
    return kind


def check_report_paths(paths: list[Path], package: Path) -> list[tuple[Path, str]]:
    """Each --report FILE with its format (check_report_path); one file named twice, in any
    spelling, is refused: the second report would silently replace the first."""
    seen: dict[str, Path] = {}
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            same = "is given twice" if path == seen[real] else f"names the same file as --report {seen[real]}"
            raise BadOptionError(f"--report {path}: {same}", "give each report file once")
        seen[real] = path
    return [(path, check_report_path(path, package)) for path in paths]


def check_step_summary(step_summary: bool) -> None:
    """$GITHUB_STEP_SUMMARY, when --step-summary asks for it and it is set, checked before any check runs."""
    target = os.environ.get(STEP_SUMMARY) if step_summary else None
    if target:
        probe_writable(Path(target), f"--step-summary: ${STEP_SUMMARY} ({target})")


def probe_writable(path: Path, what: str) -> None:
    """OutputPathError unless `path` can be written, tried without changing it: an existing file is
    opened for appending and closed, a new one created and removed."""
    try:
        if os.path.lexists(path):
            if not path.is_file():
                raise OutputPathError(f"{what}: is not a regular file", REPORT_HINT)
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.unlink(path)
    except OSError as exc:
        hint = "choose a shorter name" if exc.errno == errno.ENAMETOOLONG else REPORT_HINT  # not a matter of rights
        raise OutputPathError(f"{what}: cannot be written ({exc.strerror or exc})", hint) from None


REPORT_HINT = "choose a file in a directory you may write to"


def write_reports(data: dict, reports: list[tuple[Path, str]], step_summary: bool) -> list[str]:
    """Write the reports ((file, format) each); what could not be written, in words (the destinations
    were checked before the checks ran, so this is rare: the verdict stands all the same)."""
    failed = []
    for path, kind in reports:
        text = io.StringIO()
        renderer(kind)(data, text)
        try:
            path.write_text(text.getvalue(), encoding="utf-8")
        except OSError as exc:
            failed.append(f"--report {path}: cannot write ({exc.strerror or exc}); that report was not written")
    if step_summary:
        target = os.environ.get(STEP_SUMMARY)
        if not target:
            notice(f"--step-summary: ${STEP_SUMMARY} is not set (not a GitHub Actions job); nothing appended")
            return failed
        text = io.StringIO()
        renderer("markdown")(data, text)
        try:
            with open(target, "a", encoding="utf-8") as summary:
                summary.write(text.getvalue() + "\n")
        except OSError as exc:
            failed.append(f"--step-summary: cannot append to {target} ({exc.strerror or exc})")
    return failed
