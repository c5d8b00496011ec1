"""`ascendconv assemble`: join the parts of `convert --part I/N` into one package."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List

import typer

from ascendconv.cli import app, print_json, run
from ascendconv.cli.console import out
from ascendconv.cli.options import AsJson, NewPackage, Overwrite, Quiet, given_path
from ascendconv.cli.progress import byte_progress


@app.command("assemble")
def assemble_command(
    out_dir: NewPackage,
    part_dirs: Annotated[List[Path], typer.Argument(metavar="PARTDIR...", help="Every part directory of one plan.", parser=given_path)],
    as_json: AsJson = False,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
) -> None:
    """Join the parts written by `convert --part I/N` into the package (checked, then written atomically)."""
    from ascendconv.assemble import assemble
    from ascendconv.cli.render.convert import render_assemble

    def action():
        bar, progress, on_shard = byte_progress(quiet, "checking parts")
        if bar is None:
            return assemble(out_dir, part_dirs, overwrite, progress=progress, on_shard=on_shard)
        with bar:
            return assemble(out_dir, part_dirs, overwrite, progress=progress)

    result = run(action, as_json, "assemble")
    if as_json:
        print_json(result, "assemble")
    elif not quiet:
        render_assemble(result, out)
