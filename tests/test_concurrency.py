"""Runs that meet at one OUT: the lock, its messages, and what readers of OUT see while a run
publishes there. Each race is held at its critical point (a process holding the lock, a hook at
the rename) instead of being left to timing."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from conftest import FIXTURES
from robust_helpers import REPO

runner = CliRunner()
DENSE = FIXTURES / "qwen3-dense-fp8"


def hold_lock(out: Path) -> subprocess.Popen:
    """Another process holding OUT's lock, as a run converting to OUT does, until its stdin closes."""
    code = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from ascendconv.io.outdir import OutputLock
        lock = OutputLock(Path({str(out)!r}))
        lock.acquire()
        print("held", flush=True)
        sys.stdin.read()
        lock.release()
        """
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_busy_output_names_the_run_that_holds_it(tmp_path):
    out = tmp_path / "out"
    holder = hold_lock(out)
    try:
        result = runner.invoke(app, ["convert", str(DENSE), str(out), "--quiet"])
        assert result.exit_code == 2, result.output
        assert f"another ascendconv run (pid {holder.pid}) is writing this output" in result.stderr
        assert "wait for it to finish" in result.stderr
        assert not out.exists()
    finally:
        holder.communicate("", timeout=30)
    assert runner.invoke(app, ["convert", str(DENSE), str(out), "--quiet"]).exit_code == 0


def test_a_busy_output_is_refused_before_the_run_reads_or_compiles_anything(tmp_path, monkeypatch):
    """A second run to a busy OUT planned, read every copied tensor for the provenance (GBs at full
    scale: 7.6 s for a header-only DeepSeek-V3), prepared its kernel and checked the free space (a
    NoSpaceError, exit 4, where OUT's disk could not hold a second package) before it met the lock.
    A dry run, which says what the run would refuse, is refused the same."""
    import ascendconv.convert as convert_module

    work: list[str] = []

    def recorded(what):
        def step(*args, **kwargs):
            work.append(what)
            raise AssertionError(f"{what} before the lock was probed")

        return step

    monkeypatch.setattr(convert_module, "provenance_record", recorded("provenance"))
    monkeypatch.setattr(convert_module.Kernel, "prepare", recorded("kernel"))
    monkeypatch.setattr(convert_module, "check_free_space", recorded("free space"))
    out = tmp_path / "out"
    holder = hold_lock(out)
    try:
        for dry_run in ([], ["--dry-run"]):
            result = runner.invoke(app, ["convert", str(DENSE), str(out), "--json", *dry_run])
            assert result.exit_code == 2, result.output
            error = json.loads(result.stdout)
            assert error["error"] == "OutputBusyError"
            assert error["message"] == (
                f"{out}: another ascendconv run (pid {holder.pid}) is writing this output "
                f"(it holds {tmp_path / '.out.ascendconv-lock'})"
            )
            assert error["hint"] == "wait for it to finish, or choose another OUT"
    finally:
        holder.communicate("", timeout=30)
    assert work == []
    assert not out.exists()
    result = runner.invoke(app, ["convert", str(DENSE), str(out), "--dry-run", "--quiet"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the probe created no lock file


def test_a_busy_output_is_refused_before_ray_is_started(tmp_path, monkeypatch):
    """convert --ray met the lock only once it had started (or joined) a Ray cluster."""
    from types import SimpleNamespace

    import ascendconv.cluster as cluster
    from ascendconv.errors import OutputBusyError
    from ascendconv.options import ConvertOptions, RayOptions

    started = []
    monkeypatch.setattr(cluster, "import_ray", lambda: SimpleNamespace(is_initialized=lambda: False, shutdown=lambda: None))
    monkeypatch.setattr(cluster, "start_ray", lambda ray, options: started.append(options))
    out = tmp_path / "out"
    holder = hold_lock(out)
    try:
        with pytest.raises(OutputBusyError) as refused:
            cluster.convert_on_ray(DENSE, out, ConvertOptions(), RayOptions())
    finally:
        holder.communicate("", timeout=30)
    assert refused.value.message == (
        f"{out}: another ascendconv run (pid {holder.pid}) is writing this output (it holds {tmp_path / '.out.ascendconv-lock'})"
    )
    assert started == [] and not out.exists()


def test_a_busy_output_is_refused_before_assemble_hashes_the_parts(tmp_path, monkeypatch):
    """assemble re-hashed every part's shards (a whole model's bytes) before it met OUT's lock."""
    import ascendconv.assemble as assemble_module

    hashed = []
    monkeypatch.setattr(assemble_module, "checked_parts", lambda *args, **kwargs: hashed.append(args))
    out = tmp_path / "out"
    holder = hold_lock(out)
    try:
        result = runner.invoke(app, ["assemble", str(out), str(tmp_path / "p1"), str(tmp_path / "p2"), "--json"])
    finally:
        holder.communicate("", timeout=30)
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)
    assert error["error"] == "OutputBusyError"
    assert error["message"] == (
        f"{out}: another ascendconv run (pid {holder.pid}) is writing this output (it holds {tmp_path / '.out.ascendconv-lock'})"
    )
    assert hashed == [] and not out.exists()


def replaced_package(tmp_path, monkeypatch) -> tuple[Path, list[bool]]:
    """An --overwrite run over a package, with OUT looked at after every rename the run makes (as a
    reader of OUT would find it at that moment): [True, ...] where a package was there."""
    out = tmp_path / "out"
    assert runner.invoke(app, ["convert", str(DENSE), str(out), "--quiet", "--scheme", "w4a8-mxfp"]).exit_code == 0
    seen: list[bool] = []
    rename = Path.rename

    def looked_at(self, target):
        moved = rename(self, target)
        seen.append((out / "quant_model_description.json").is_file())
        return moved

    monkeypatch.setattr(Path, "rename", looked_at)
    result = runner.invoke(app, ["convert", str(DENSE), str(out), "--quiet", "--overwrite"])
    assert result.exit_code == 0, result.output
    return out, seen


def test_overwrite_never_leaves_out_missing(tmp_path, monkeypatch):
    """The old package leaves and the new one arrives in one step: between the two renames of
    before, OUT did not exist, and a verify, inspect or server starting then found nothing (or,
    killed there, the old package and the new one were both left under hidden names)."""
    out, seen = replaced_package(tmp_path, monkeypatch)
    assert seen and all(seen)
    assert runner.invoke(app, ["verify", str(out), "--quiet"]).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the old package is gone, and no staging


def test_overwrite_renames_twice_where_the_system_cannot_exchange(tmp_path, monkeypatch):
    import ascendconv.io.outdir as outdir

    monkeypatch.setattr(outdir, "exchanged", lambda a, b: False)
    out, seen = replaced_package(tmp_path, monkeypatch)
    assert seen == [False, True]  # the old way: OUT missing for a moment
    assert runner.invoke(app, ["verify", str(out), "--quiet"]).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_overwrite_checks_the_package_a_run_swapped_in_while_it_was_listing_the_old_one(tmp_path, monkeypatch):
    """A run publishing at OUT (--overwrite's exchange) between another --overwrite run's listing of
    OUT and its look at each listed file made that run refuse a sound package as no package
    (UnsafeOutputError, exit 2, hinting to remove it): the old package's shards were not in the new one."""
    from ascendconv.convert import ConvertOptions, convert
    from ascendconv.io.outdir import exchanged

    out = tmp_path / "out"
    convert(DENSE, out, ConvertOptions(scheme="w4a8-mxfp", max_shard_size=100_000))  # several shards
    published = tmp_path / "other-run"  # the other run's finished staging: one shard of another name
    convert(DENSE, published, ConvertOptions())
    new_files = sorted(p.name for p in published.iterdir())
    assert not set(new_files) >= {p.name for p in out.iterdir()}
    is_file = Path.is_file
    swaps = []

    def swapped_after_the_listing(self):
        if self.parent == out and not swaps:
            swaps.append(exchanged(published, out))
        return is_file(self)

    monkeypatch.setattr(Path, "is_file", swapped_after_the_listing)
    result = runner.invoke(app, ["convert", str(DENSE), str(out), "--overwrite", "--dry-run", "--json"])
    assert swaps == [True]
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == new_files  # what the run checked, and would replace


def test_overwrite_checks_what_is_at_out_after_a_run_renamed_the_old_package_away(tmp_path, monkeypatch):
    """Where the system cannot exchange, a run publishes in two renames: OUT moved away between
    another run's look at it and its next made that run refuse it as 'exists and is not a directory'."""
    out = tmp_path / "out"
    assert runner.invoke(app, ["convert", str(DENSE), str(out), "--quiet"]).exit_code == 0
    is_dir = Path.is_dir
    moved = []

    def renamed_away_after_it_was_found(self):
        if self == out and not moved:
            moved.append(out.rename(tmp_path / ".out.ascendconv-old-0123"))  # the other run's first rename
        return is_dir(self)

    monkeypatch.setattr(Path, "is_dir", renamed_away_after_it_was_found)
    result = runner.invoke(app, ["convert", str(DENSE), str(out), "--overwrite", "--dry-run", "--json"])
    assert moved and result.exit_code == 0, result.output


def assert_replaced(result, out: Path, doing: str) -> None:
    """The error of a command that read OUT while a run published another package there."""
    assert result.exit_code == 3, result.output
    error = json.loads(result.stdout)
    assert error["error"] == "PackageReplacedError"
    assert error["message"] == (
        f"{out}: was replaced while it was being {doing} (a run published a package there); the files read may "
        "come from the old package and the new one, so nothing is reported of either"
    )
    assert error["hint"] == "run the command again once the run writing that output has finished"


def test_verify_of_a_package_replaced_while_it_reads_is_a_named_error(tmp_path, monkeypatch):
    """verify reads OUT's files one after another; a run publishing another package there meanwhile
    (--overwrite) made it compare the old provenance with the new files: failed checks that blamed
    the package ('copies', 'checksums'), or, for files alike, a pass of a mix of two packages."""
    import ascendconv.verify as verify_module
    from ascendconv.convert import ConvertOptions, convert

    out = tmp_path / "out"
    convert(DENSE, out, ConvertOptions(scheme="w4a8-mxfp"))
    scan = verify_module._scan

    def another_run_publishes(*args, **kwargs):  # after the shards are read, before the other files
        found = scan(*args, **kwargs)
        convert(DENSE, out, ConvertOptions(overwrite=True))
        return found

    monkeypatch.setattr(verify_module, "_scan", another_run_publishes)
    assert_replaced(runner.invoke(app, ["verify", str(out), "--json"]), out, "verified")
    monkeypatch.setattr(verify_module, "_scan", scan)
    assert runner.invoke(app, ["verify", str(out), "--quiet"]).exit_code == 0  # the new package, read alone


def test_inspect_of_a_package_replaced_while_it_reads_is_a_named_error(tmp_path, monkeypatch):
    """inspect reads the description, then each shard's header; a run publishing another package at
    OUT between the two (--overwrite) made it report every shard of a sound package unreadable ('No
    such file or directory'), exit 0, as if the package were broken."""
    import ascendconv.io.package as package_module
    from ascendconv.convert import ConvertOptions, convert

    out = tmp_path / "out"
    convert(DENSE, out, ConvertOptions(scheme="w4a8-mxfp", max_shard_size=100_000))  # several shards
    read_header = package_module.read_header
    published = []

    def another_run_publishes(path):  # after the description and index, before the shards
        if path.parent == out and not published:
            published.append(convert(DENSE, out, ConvertOptions(overwrite=True)))  # one shard of another name
        return read_header(path)

    monkeypatch.setattr(package_module, "read_header", another_run_publishes)
    assert_replaced(runner.invoke(app, ["inspect", str(out), "--json"]), out, "inspected")
    assert published
    monkeypatch.setattr(package_module, "read_header", read_header)
    result = runner.invoke(app, ["inspect", str(out), "--json"])  # the new package, read alone
    assert result.exit_code == 0 and json.loads(result.stdout)["problems"] == []


def test_a_resume_run_meeting_another_runs_staging_as_it_publishes_is_told_busy(tmp_path, monkeypatch):
    """Before taking the lock, --resume sizes the kept work beside OUT; a live run's staging listed
    there and renamed into place (or its ledger's temporary file replaced) before it was read made
    the run end in FileSystemError ('No such file or directory', exit 4), not the busy output it met.
    (The run writing that staging took the lock after this run's early probe found it free.)"""
    import ascendconv.convert as convert_module
    from ascendconv.io.outdir import STAGING_TAG

    out = tmp_path / "out"
    staging = tmp_path / f".out{STAGING_TAG}0123456789abcdef"
    staging.mkdir()
    (staging / "quant_model_weights-00001-of-00002.safetensors").write_bytes(b"x" * 1000)
    siblings = convert_module.stale_siblings
    holders = []

    def listed_then_published(path):
        found = siblings(path)
        holders.append(hold_lock(out))  # the run writing that staging
        staging.rename(out)  # publishes between the listing and the reads
        return found

    monkeypatch.setattr(convert_module, "stale_siblings", listed_then_published)
    try:
        result = runner.invoke(app, ["convert", str(DENSE), str(out), "--quiet", "--resume"])
    finally:
        for holder in holders:
            holder.communicate("", timeout=30)
    assert result.exit_code == 2, result.output
    assert f"another ascendconv run (pid {holders[0].pid}) is writing this output" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["quant_model_weights-00001-of-00002.safetensors"]


def test_two_runs_creating_the_same_missing_parent_both_succeed(tmp_path, monkeypatch):
    """Part jobs of one matrix write parts/1, parts/2, ... under a parent that does not exist yet;
    the job that lost the race to create it failed with OutputPathError ('File exists'), though its
    OUT was its own."""
    parent = tmp_path / "parts"
    rival = parent / "2"
    mkdir = Path.mkdir

    def another_job_first(self, *args, **kwargs):
        if self == parent and not parent.exists():
            mkdir(parent)  # the other job's mkdir lands between our exists() and our mkdir()
            mkdir(rival)
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", another_job_first)
    result = runner.invoke(app, ["convert", str(DENSE), str(parent / "1"), "--quiet"])
    assert result.exit_code == 0, result.output
    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert sorted(p.name for p in parent.iterdir()) == ["1", "2"]
