"""The output directory is never a way to lose data: no deletion of what is not a package, no leak of
files outside the source, a lock against concurrent runs, true messages and clean exits on signals."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import ascendconv.io.outdir as outdir
from ascendconv.cli import app
from ascendconv.convert import ConvertOptions, convert
from ascendconv.errors import Interrupted, NotFoundError, OutputExistsError, OutputPathError, OutputWriteError, UnsafeOutputError
from ascendconv.io.hfcache import resolve_source
from ascendconv.io.outdir import OLD_TAG, STAGING_TAG, OutputLock
from conftest import FIXTURES, write_large_checkpoint

runner = CliRunner()
DENSE = "qwen3-dense-fp8"


def run_convert(src, out, *extra):
    return runner.invoke(app, ["convert", str(src), str(out), "--quiet", *extra])


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def hidden_siblings(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_overwrite_refuses_an_ancestor_of_the_source_at_any_depth(tmp_path):
    models = tmp_path / "models"
    src = models / "org" / "src"
    src.parent.mkdir(parents=True)
    import shutil

    shutil.copytree(FIXTURES / DENSE, src)
    (models / "other-model.txt").write_text("keep me")
    before = tree(models)
    for out in (models, models / "org", tmp_path):
        result = run_convert(src, out, "--overwrite")
        assert result.exit_code == 2 and "contains the source" in result.stderr, result.output
    assert tree(models) == before


def test_output_inside_the_source_is_refused(fixture_copy):
    src = fixture_copy(DENSE)
    before = tree(src)
    result = run_convert(src, src / "converted")
    assert result.exit_code == 2 and "inside the source" in result.stderr
    assert tree(src) == before and not (src / "converted").exists()


def test_home_and_root_are_refused(fixture_copy, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("mine")
    monkeypatch.setenv("HOME", str(home))
    src = fixture_copy(DENSE)
    for out in (home, Path("/")):
        result = run_convert(src, out, "--overwrite")
        assert result.exit_code == 2 and "root or the home directory" in result.stderr
    assert (home / ".bashrc").read_text() == "mine"


def test_overwrite_replaces_only_a_flat_earlier_package(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    out = tmp_path / "out"
    assert run_convert(src, out).exit_code == 0
    (out / "sub").mkdir()  # a package is flat: a directory inside says this is something else
    (out / "sub" / "work.txt").write_text("mine")
    result = run_convert(src, out, "--overwrite")
    assert result.exit_code == 2 and "only an earlier package" in result.stderr
    assert (out / "sub" / "work.txt").read_text() == "mine"
    (out / "sub" / "work.txt").unlink()
    (out / "sub").rmdir()
    assert run_convert(src, out, "--overwrite").exit_code == 0


def test_output_symlink_is_refused(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "out").symlink_to(target)
    result = run_convert(src, tmp_path / "out")
    assert result.exit_code == 2 and "symbolic link" in result.stderr
    assert list(target.iterdir()) == []


def test_links_out_of_the_source_and_package_names_are_never_copied(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    outside = tmp_path / "secret.txt"
    outside.write_text("TOKEN=hunter2")
    (src / "environ.txt").symlink_to("/proc/self/environ")
    (src / "notes.md").symlink_to(outside)
    (src / "template.jinja").symlink_to(src / "tokenizer_config.json")  # inside the source: fine
    (src / "quant_model_description.json").write_text('{"stale": "FLOAT"}')
    (src / "ascendconv_provenance.json").write_text("{}")
    out = tmp_path / "out"
    result = run_convert(src, out, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    skipped = report["skipped_files"]
    assert "links outside the source" in skipped["environ.txt"] and "links outside" in skipped["notes.md"]
    assert "writes a file of this name" in skipped["quant_model_description.json"]
    assert not (out / "environ.txt").exists() and not (out / "notes.md").exists()
    assert b"hunter2" not in b"".join(tree(out).values())
    assert (out / "template.jinja").read_bytes() == (src / "tokenizer_config.json").read_bytes()
    assert not (out / "template.jinja").is_symlink()
    assert "stale" not in json.loads((out / "quant_model_description.json").read_text())
    # every file left out is a warning, in --json and in the text on stderr
    assert [w for w in report["warnings"] if "not carried" in w] == [
        f"{name} is not carried into the package: {skipped[name]}" for name in skipped
    ] and len(skipped) == 4
    text = run_convert(src, out, "--overwrite")
    assert text.exit_code == 0 and "warning: notes.md is not carried into the package: it links outside" in " ".join(text.stderr.split())


def link_farm(checkpoint: Path, farm: Path) -> Path:
    """`cp -rs checkpoint farm`: a directory of links, one to each file of the checkpoint."""
    farm.mkdir()
    for path in checkpoint.iterdir():
        (farm / path.name).symlink_to(path)
    return farm


def test_a_link_farm_of_a_checkpoint_carries_the_files_it_links_beside_the_shards(fixture_copy, tmp_path):
    """Files that link to the file of their name beside the shards the source reads (the real
    checkpoint) are carried, config.json and the tokenizer with them; verify accepts the package."""
    from ascendconv.verify import VerifyOptions, verify

    real = fixture_copy(DENSE)
    (tmp_path / "secret.txt").write_text("TOKEN=hunter2")
    (real / "notes.md").symlink_to(tmp_path / "secret.txt")  # beside the shards, but to another file
    src = link_farm(real, tmp_path / "farm")
    (src / "vocab.txt").symlink_to(real / "tokenizer.json")  # beside them, under another name
    out = tmp_path / "out"
    result = run_convert(src, out, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert {"config.json", "tokenizer.json", "generation_config.json", "chat_template.jinja"} <= set(report["copied_files"])
    assert sorted(report["skipped_files"]) == ["notes.md", "vocab.txt"]
    assert [w.split(" ", 1)[0] for w in report["warnings"]] == ["notes.md", "vocab.txt"]
    assert (out / "tokenizer.json").read_bytes() == (real / "tokenizer.json").read_bytes()
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert b"hunter2" not in b"".join(tree(out).values())
    assert verify(out, VerifyOptions()).ok


def test_a_config_json_linking_out_of_the_source_is_refused_before_writing(fixture_copy, tmp_path):
    """config.json is read to plan, but a link out of the source is never carried (it may be any
    file): without it vLLM cannot build the model, so convert refuses, naming the file and the fix."""
    src = fixture_copy(DENSE)
    (src / "config.json").rename(tmp_path / "config.json")
    (src / "config.json").symlink_to(tmp_path / "config.json")
    for extra in ([], ["--dry-run"]):
        result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out"), "--json", *extra])
        assert result.exit_code == 3, result.output
        error = json.loads(result.stdout)
        assert error["error"] == "CopiedFileError"
        assert error["message"] == (
            f"{src / 'config.json'}: the package needs it (vLLM builds the model from it) but cannot carry it: it links "
            f"outside the source directory (to {tmp_path / 'config.json'})"
        )
        assert error["hint"].startswith(f'copy the file into the source directory (cp --remove-destination "$(realpath {src / "config.json"})"')
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("revision", ["../../x", "/etc", "..", "main/../../x", "a//b"])
def test_repo_revision_cannot_leave_the_cache(tmp_path, monkeypatch, revision):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    (cache / "models--org--model" / "snapshots").mkdir(parents=True)
    (tmp_path / "x").mkdir()
    with pytest.raises(NotFoundError, match="not a revision name"):
        resolve_source(f"org/model@{revision}")


def test_a_ref_naming_a_path_outside_the_cache_is_refused(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    repo = cache / "models--org--model"
    (repo / "snapshots").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("../../../x")
    (tmp_path / "x").mkdir()
    (repo / "snapshots" / "abc").symlink_to(tmp_path / "x")
    with pytest.raises(Exception, match="commit hash"):
        resolve_source("org/model")
    (repo / "refs" / "main").write_text("abc")  # a snapshot that is a link out of the cache
    with pytest.raises(Exception, match="not a snapshot directory"):
        resolve_source("org/model")


def test_a_second_run_to_the_same_output_fails_at_once(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    out = tmp_path / "out"
    lock = OutputLock(out)
    lock.acquire()  # as another process converting to OUT would
    try:
        result = run_convert(src, out)
        assert result.exit_code == 2 and f"another ascendconv run (pid {os.getpid()}) is writing" in result.stderr
        assert not out.exists()
    finally:
        lock.release()
    assert run_convert(src, out).exit_code == 0
    assert hidden_siblings(tmp_path) == []  # no lock file, no staging


def plant_lock(out: Path, kind: str, victim: Path) -> Path:
    """The lock file's name beside OUT, made into something a hostile neighbour could leave there."""
    lock = out.parent / f".{out.name}.ascendconv-lock"
    if kind == "symlink":
        lock.symlink_to(victim)
    elif kind == "dangling symlink":
        lock.symlink_to(out.parent / "nowhere")
    elif kind == "hard link":
        os.link(victim, lock)
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    return lock


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "hard link", "fifo", "directory"])
@pytest.mark.parametrize("command", ["convert", "assemble"])
def test_a_planted_lock_file_is_refused_and_nothing_is_clobbered(fixture_copy, tmp_path, kind, command):
    src = fixture_copy(DENSE)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious\n")
    out = tmp_path / "out"
    lock = plant_lock(out, kind, victim)
    if command == "convert":
        result = run_convert(src, out)
    else:
        part = tmp_path / "part"
        assert run_convert(src, part, "--part", "1/1").exit_code == 0
        result = runner.invoke(app, ["assemble", str(out), str(part), "--quiet"])
    assert result.exit_code == 2, result.output
    assert "lock file" in result.stderr and str(lock) in result.stderr
    assert victim.read_bytes() == b"precious\n"
    assert not (tmp_path / "nowhere").exists()
    assert not out.exists()
    assert [n for n in hidden_siblings(tmp_path) if "staging" in n] == []


def test_stale_staging_of_a_dead_run_is_removed(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    out = tmp_path / "out"
    for tag in (STAGING_TAG + "0123456789abcdef", OLD_TAG + "feed", ".ascendconv-partial-4242"):
        (tmp_path / f".out{tag}").mkdir()
        (tmp_path / f".out{tag}" / "quant_model_weights-00001-of-00002.safetensors").write_bytes(b"x" * 100)
    (tmp_path / ".other.ascendconv-staging-1").mkdir()  # another OUT's: not ours to touch
    # the staging of an OUT named 'out.ascendconv-staging-x', which begins as ours would: its own lock guards it
    (tmp_path / f".out{STAGING_TAG}x{STAGING_TAG}0123456789abcdef").mkdir()
    assert run_convert(src, out).exit_code == 0
    assert hidden_siblings(tmp_path) == [".other.ascendconv-staging-1", f".out{STAGING_TAG}x{STAGING_TAG}0123456789abcdef"]


def test_failed_run_removes_the_directories_it_created(fixture_copy, tmp_path):
    def failing(done, total):
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        convert(fixture_copy(DENSE), tmp_path / "a" / "b" / "c" / "out", ConvertOptions(), failing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_interrupt_while_removing_the_old_package_says_what_is_true(fixture_copy, tmp_path, monkeypatch):
    src = fixture_copy(DENSE)
    out = tmp_path / "out"
    assert run_convert(src, out).exit_code == 0
    real_rmtree = outdir.shutil.rmtree

    def rmtree(path, *args, **kwargs):
        if OLD_TAG in str(path):
            raise Interrupted(signal.SIGTERM)
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(outdir.shutil, "rmtree", rmtree)
    result = run_convert(src, out, "--overwrite")
    assert result.exit_code == 143
    assert "new package is complete" in result.stderr and "nothing was written" not in result.stderr
    assert (out / "quant_model_description.json").exists()
    assert any(OLD_TAG in name for name in hidden_siblings(tmp_path))
    monkeypatch.setattr(outdir.shutil, "rmtree", real_rmtree)
    assert run_convert(src, out, "--overwrite").exit_code == 0
    assert hidden_siblings(tmp_path) == []  # the next run removed the remains


@pytest.fixture(scope="module")
def large_source(tmp_path_factory):
    return write_large_checkpoint(tmp_path_factory.mktemp("large") / "src")


def start_convert(src: Path, out: Path) -> subprocess.Popen:
    """A real `ascendconv convert` process, slow enough (reference kernel) to be caught mid-run.
    SIGHUP is reset to its default in the child: under `nohup` it arrives ignored, and convert
    rightly keeps ignoring it, which would leave the SIGHUP case nothing to test."""
    return subprocess.Popen(
        [sys.executable, "-m", "ascendconv", "convert", str(src), str(out), "--kernel", "reference", "--quiet",
         "--max-shard-size", "40MB"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )


def wait_for_first_shard(out: Path, process: subprocess.Popen, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and process.poll() is None:
        staging = [p for p in out.parent.glob(f".{out.name}{STAGING_TAG}*") if any(p.iterdir())]
        if staging:
            return
        time.sleep(0.05)
    raise AssertionError(f"no staging with a shard appeared (exit {process.poll()})")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_end_a_real_run_cleanly(large_source, tmp_path, signum):
    out = tmp_path / "out"
    process = start_convert(large_source, out)
    wait_for_first_shard(out, process)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, stderr
    assert f"interrupted by {signal.Signals(signum).name}: nothing was written" in stderr
    assert "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_sigkill_leaves_staging_that_the_next_run_removes(large_source, tmp_path):
    out = tmp_path / "out"
    process = start_convert(large_source, out)
    wait_for_first_shard(out, process)
    process.kill()
    process.communicate(timeout=60)
    assert any(STAGING_TAG in name for name in hidden_siblings(tmp_path))
    result = runner.invoke(app, ["convert", str(large_source), str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert hidden_siblings(tmp_path) == [] and (out / "quant_model_description.json").exists()


# What a --ray task does in its driver's staging (cluster.convert_part: a part run into a part directory
# there, holding that directory's lock), writing on after its driver was killed with SIGKILL.
ORPHAN_TASK = """
import sys, time
from pathlib import Path
from ascendconv.io.outdir import OutputLock
part = Path(sys.argv[1])
OutputLock(part).acquire()
print("locked", flush=True)
for i in range(100_000):
    (part.parent / f"written-{i}").write_bytes(b"x")
    time.sleep(0.02)
"""


def orphan_task(tmp_path: Path) -> tuple[Path, subprocess.Popen]:
    stale = tmp_path / f".out{STAGING_TAG}0123456789abcdef"
    stale.mkdir()
    task = subprocess.Popen([sys.executable, "-c", ORPHAN_TASK, str(stale / ".part-1-of-2")], stdout=subprocess.PIPE, text=True)
    assert task.stdout.readline() == "locked\n"
    return stale, task


def test_the_staging_of_a_killed_ray_driver_is_removed_once_its_tasks_have_ended(fixture_copy, tmp_path):
    """A --ray driver killed with SIGKILL leaves its tasks running until Ray stops them (0.1 to 1.2 s
    measured), writing in its staging: the next run removed that staging under them at once, so their
    files went as they wrote (and the removal can fail, should one create a file in between). It waits for
    them now, saying so, as Ray's SIGKILL ends them."""
    src = fixture_copy(DENSE)
    stale, task = orphan_task(tmp_path)
    notices: list[str] = []

    def notice(text: str) -> None:
        notices.append(text)
        threading.Timer(0.3, task.kill).start()  # Ray stopping the task

    try:
        convert(src, tmp_path / "out", ConvertOptions(), notice=notice)
        task.wait(timeout=30)
    finally:
        task.kill()
    assert notices == [
        f"waiting for the part runs (pid {task.pid}) still writing in {stale}, left by an earlier run to {tmp_path / 'out'}, "
        "to end (30 s at most)"
    ]
    assert task.returncode == -signal.SIGKILL  # it wrote on until it was stopped: its directory was there
    assert hidden_siblings(tmp_path) == [] and (tmp_path / "out" / "quant_model_description.json").exists()


def test_a_task_still_writing_in_a_dead_runs_staging_is_named_after_the_wait(fixture_copy, tmp_path, monkeypatch):
    src = fixture_copy(DENSE)
    monkeypatch.setattr(outdir, "WRITER_WAIT_SECONDS", 0.5, raising=False)
    stale, task = orphan_task(tmp_path)
    try:
        result = run_convert(src, tmp_path / "out", "--json")
        assert task.poll() is None
    finally:
        task.kill()
        task.wait()
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)
    assert error["error"] == "OutputBusyError" and error["message"] == (
        f"{stale}: an ascendconv part run (pid {task.pid}) is still writing in this staging directory of an earlier run "
        f"to {tmp_path / 'out'} (a --ray task outliving its driver), after 0.5 s"
    )
    assert error["hint"] == "wait for it to end or stop it, then run the same command again"
    assert stale.is_dir() and not (tmp_path / "out").exists()


@contextlib.contextmanager
def attribute_set(directory: Path, letter: str):
    """chattr +LETTER on `directory` for the block, and always -LETTER after; skipped where it cannot be
    set (not root, or a file system without the attributes)."""
    made = subprocess.run(["chattr", f"+{letter}", str(directory)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +{letter} {directory}: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", f"-{letter}", str(directory)], check=True)


def command_to(out: Path, command: str, fixture_copy, tmp_path: Path) -> list[str]:
    """The arguments of `command` (convert, its dry run, or assemble of a one-part run) writing OUT."""
    src = fixture_copy(DENSE)
    if command == "assemble":
        part = tmp_path / "part"
        assert run_convert(src, part, "--part", "1/1").exit_code == 0
        return ["assemble", str(out), str(part)]
    return ["convert", str(src), str(out)] + (["--dry-run"] if command == "dry run" else [])


@pytest.mark.parametrize("letter, name", [("i", "immutable"), ("a", "append-only")])
@pytest.mark.parametrize("command", ["convert", "dry run", "assemble"])
@pytest.mark.parametrize("where", ["OUT", "OUT's directory"])
def test_an_immutable_or_append_only_out_or_directory_is_refused_before_anything_is_written(
    fixture_copy, tmp_path, letter, name, command, where
):
    """An empty OUT that no rename can replace (chattr +i, +a: not even root's) passed every check,
    so the whole conversion ran and failed only at the end, 'the finished package could not be
    renamed into place (Operation not permitted)', and a dry run said it would succeed. OUT's
    directory with chattr +a let convert create its lock and staging there, convert the whole model,
    then fail ('.out.ascendconv-lock: Operation not permitted') and leave both behind for good (an
    append-only directory lets nothing be removed); with chattr +i it was 'not writable', which the
    permissions do not explain."""
    parent = tmp_path / "models"
    parent.mkdir()
    out = parent / "out"
    if where == "OUT":
        out.mkdir()
    args = command_to(out, command, fixture_copy, tmp_path)
    with attribute_set(out if where == "OUT" else parent, letter):
        result = runner.invoke(app, [*args, "--json"])
        assert result.exit_code == 2, result.output
        error = json.loads(result.stdout)
        assert error["error"] == "OutputPathError"
        if where == "OUT":
            assert error["message"] == (
                f"{out}: has the {name} attribute (chattr +{letter}), so no package can be renamed into its place, not even by root"
            )
            assert error["hint"] == f"remove the {name} attribute: chattr -{letter} {out}, or choose another OUT"
            assert list(out.iterdir()) == [] and hidden_siblings(parent) == []
        else:
            assert error["message"] == f"{out}: cannot create the package there: {parent} has the {name} attribute (chattr +{letter})" + (
                "" if name == "immutable" else ", so the finished package could not be renamed into place nor its staging removed"
            )
            assert error["hint"] == f"remove the {name} attribute: chattr -{letter} {parent}, or choose another OUT"
            assert list(parent.iterdir()) == []


def spy_on_reading(monkeypatch) -> list[str]:
    """The names of the functions that read a source (open_source) or the parts (checked_parts), as
    convert, --ray and assemble call them, listed as each is called."""
    import ascendconv.assemble
    import ascendconv.cluster
    import ascendconv.convert

    read = []
    for module, name in [(ascendconv.convert, "open_source"), (ascendconv.cluster, "open_source"),
                         (ascendconv.assemble, "checked_parts")]:
        def reading(*args, _real=getattr(module, name), _name=name, **kwargs):
            read.append(_name)
            return _real(*args, **kwargs)
        monkeypatch.setattr(module, name, reading)
    return read


@pytest.mark.parametrize("command, where", [
    ("convert", "OUT"), ("convert", "OUT's directory"), ("dry run", "OUT"), ("dry run", "OUT's directory"),
    ("ray", "OUT"), ("ray", "OUT's directory"), ("assemble", "OUT"),
])
def test_an_out_no_package_can_replace_is_refused_before_the_source_is_read(
    fixture_copy, tmp_path, monkeypatch, command, where
):
    """The refusal of an immutable OUT (or OUT's directory) came only once the source's every header
    was read and the plan made (seconds for a large checkpoint: 9 s for Kimi-K3's 497,052 tensors),
    and assemble's once every part's shards were hashed."""
    parent = tmp_path / "models"
    parent.mkdir()
    out = parent / "out"
    if where == "OUT":
        out.mkdir()
    args = command_to(out, command if command != "ray" else "convert", fixture_copy, tmp_path)
    read = spy_on_reading(monkeypatch)
    with attribute_set(out if where == "OUT" else parent, "i"):
        result = runner.invoke(app, [*args, *(["--ray"] if command == "ray" else []), "--json"])
    assert result.exit_code == 2, result.output
    assert json.loads(result.stdout)["error"] == "OutputPathError"
    assert read == []


@pytest.mark.parametrize("command, extra", [
    ("convert", []), ("dry run", []), ("convert", ["--part", "1/1"]), ("convert", ["--resume"]),
    ("convert", ["--ray"]), ("assemble", []),
])
@pytest.mark.parametrize("refusal, error, words", [
    ("not empty", "OutputExistsError", "exists and is not empty"),
    ("a file", "OutputExistsError", "exists and is not a directory"),
    ("not a package under --overwrite", "UnsafeOutputError", "--overwrite replaces only an earlier package"),
    ("busy", "OutputBusyError", f"another ascendconv run (pid {os.getpid()}) is writing this output"),
])
def test_an_out_refused_for_what_is_there_or_a_run_holding_it_is_refused_before_the_source_is_read(
    fixture_copy, tmp_path, monkeypatch, command, extra, refusal, error, words
):
    """A non-empty OUT (without --overwrite), a file, a non-package under --overwrite and an OUT another
    run holds were refused only once every header was read and the plan made (8.7 s for Kimi-K3's
    headers, 0.35 s now), assemble's non-empty OUT once every part's shards were hashed; a dry run is
    refused them as the run is."""
    parent = tmp_path / "models"
    parent.mkdir()
    out = parent / "out"
    args = command_to(out, command, fixture_copy, tmp_path)
    if refusal == "a file":
        out.write_text("mine")
    elif refusal != "busy":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    before = tree(parent)
    read = spy_on_reading(monkeypatch)
    lock = OutputLock(out)
    if refusal == "busy":
        lock.acquire()  # as another process converting to OUT would
    try:
        overwrite = ["--overwrite"] if refusal == "not a package under --overwrite" else []
        result = runner.invoke(app, [*args, *extra, *overwrite, "--json"])
    finally:
        lock.release()
    assert result.exit_code == 2, result.output
    assert json.loads(result.stdout)["error"] == error
    assert json.loads(result.stdout)["message"].startswith(f"{out}: ") and words in json.loads(result.stdout)["message"]
    assert read == []
    assert tree(parent) == before and hidden_siblings(parent) == []


def test_a_new_out_below_an_append_only_directory_is_converted(fixture_copy, tmp_path):
    """Where convert makes OUT's directory itself, inside an append-only one, the package is renamed in
    the new directory, which has no attribute: nothing to refuse."""
    src = fixture_copy(DENSE)
    parent = tmp_path / "models"
    parent.mkdir()
    with attribute_set(parent, "a"):
        assert run_convert(src, parent / "new" / "out").exit_code == 0
        assert (parent / "new" / "out" / "quant_model_description.json").is_file()
        assert sorted(p.name for p in (parent / "new").iterdir()) == ["out"]


def test_refusals_are_checked_before_anything_is_created(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    with pytest.raises(UnsafeOutputError):
        convert(src, src / "a" / "b" / "out", ConvertOptions())
    assert not (src / "a").exists()


def test_a_source_shard_cut_short_mid_run_is_a_named_error(tmp_path):
    """Truncating a mapped file would kill the process with SIGBUS; the read lease turns it into a
    SourceChangedError naming the shard, and the truncation waits until the mappings are gone."""
    src = write_large_checkpoint(tmp_path / "src")
    out = tmp_path / "out"
    process = start_convert(src, out)
    wait_for_first_shard(out, process)
    shard = src / "model-00002-of-00002.safetensors"
    os.truncate(shard, 1_000_000)  # blocks until the converter has let go of the file
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 3, stderr
    assert f"{shard}: another process opened it for writing or truncated it" in stderr
    assert "Traceback" not in stderr and "Bus error" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    assert shard.stat().st_size == 1_000_000


def test_a_source_shard_replaced_after_planning_is_a_named_error(fixture_copy, tmp_path, monkeypatch):
    """A copy renamed over a shard after its header was read (a download finishing): its tensors
    are elsewhere in the new file (a longer header moves them), and reading them at the planned
    offsets made a package of header bytes and shifted data, exit 0 (verify --source refused it)."""
    import ascendconv.convert as convert_module
    from robust_helpers import read_raw_header, write_raw_header

    src = fixture_copy("qwen3-moe-fp8")
    shard = src / "model-00003-of-00003.safetensors"
    planned = convert_module.plan_for

    def plan_then_replace(source, options):
        plan = planned(source, options)
        header, data = read_raw_header(shard)
        fields = json.loads(header)
        fields["__metadata__"] = {"padding": "x" * 4000}
        write_raw_header(shard.with_suffix(".new"), json.dumps(fields).encode(), data)
        os.rename(shard.with_suffix(".new"), shard)
        return plan

    monkeypatch.setattr(convert_module, "plan_for", plan_then_replace)
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out"), "--quiet", "--json"])
    assert result.exit_code == 3, result.output
    error = json.loads(result.stdout.splitlines()[0])
    assert error["error"] == "SourceChangedError"
    assert error["message"] == (
        f"{shard}: replaced or rewritten since its header was read (another file, size or modification time), "
        "so its tensors are no longer where that header put them"
    )
    assert error["hint"] == "let whatever writes the checkpoint finish, then run again"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_mapped_reads_guard_names_the_file_a_writer_takes(tmp_path):
    from ascendconv.errors import SourceChangedError
    from ascendconv.io.files import mapped_reads_guarded
    from ascendconv.io.safetensors import TensorReader, read_header

    src = write_large_checkpoint(tmp_path / "src", shards=1, linears_per_shard=1, n=256, k=1024)
    shard = src / "model-00001-of-00001.safetensors"
    entry = next(iter(read_header(shard).tensors.values()))
    writer = None
    with pytest.raises(SourceChangedError, match=f"{shard}: another process opened it for writing"):
        with mapped_reads_guarded(), TensorReader() as reader:
            data = reader.map_range(entry, 0, entry.nbytes)
            writer = subprocess.Popen([sys.executable, "-c", f"import os; os.truncate({str(shard)!r}, 10)"])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the SIGIO handler raises here
                time.sleep(0.01)
            del data
    assert writer.wait(timeout=30) == 0  # the truncation went ahead once the lease was released
    assert shard.stat().st_size == 10


def test_what_appears_at_out_during_a_run_is_never_replaced(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    out = tmp_path / "out"

    def someone_writes_there(closed, count):  # told as each shard closes, before the publish
        (out / "precious").mkdir(parents=True, exist_ok=True)
        (out / "precious" / "data.txt").write_text("important\n")

    with pytest.raises(OutputExistsError) as caught:
        convert(src, out, ConvertOptions(), on_shard=someone_writes_there)
    assert str(out) in caught.value.message and "changed while the package was being written" in caught.value.message
    assert (out / "precious" / "data.txt").read_text() == "important\n"
    assert sorted(p.name for p in out.iterdir()) == ["precious"] and hidden_siblings(tmp_path) == []


def test_a_symlink_that_appears_at_out_during_a_run_is_left_alone(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    out, victim = tmp_path / "out", tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")

    def someone_links_there(closed, count):
        if not out.is_symlink():
            out.symlink_to(victim)

    with pytest.raises(UnsafeOutputError, match="changed while the package was being written"):
        convert(src, out, ConvertOptions(), on_shard=someone_links_there)
    assert out.is_symlink() and sorted(p.name for p in victim.iterdir()) == ["keep"]
    assert hidden_siblings(tmp_path) == []


@pytest.mark.parametrize("publish", ["exchange", "two renames"])
def test_a_failed_final_rename_puts_the_old_package_back(fixture_copy, tmp_path, monkeypatch, publish):
    src = fixture_copy(DENSE)
    out = tmp_path / "out"
    convert(src, out, ConvertOptions())
    before = tree(out)
    real_rename = Path.rename

    def rename(self, target):
        if STAGING_TAG in self.name:
            raise PermissionError(1, "Operation not permitted", str(self))
        return real_rename(self, target)

    def exchanged(a, b):  # where the system cannot exchange, publish renames twice
        if publish == "two renames":
            return False
        raise PermissionError(1, "Operation not permitted", str(a))

    monkeypatch.setattr(outdir, "exchanged", exchanged)
    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OutputPathError) as caught:
        convert(src, out, ConvertOptions(overwrite=True, scale_rule="floor"))
    assert caught.value.message.startswith(f"{out}: the finished package could not be renamed into place")
    assert tree(out) == before and hidden_siblings(tmp_path) == []


def test_old_remains_that_cannot_be_removed_leave_the_new_package_a_success(fixture_copy, tmp_path, monkeypatch):
    src = fixture_copy(DENSE)
    out = tmp_path / "out"
    convert(src, out, ConvertOptions())
    real_rmtree = outdir.shutil.rmtree

    def rmtree(path, ignore_errors=False, **kwargs):  # an immutable file in the old package
        if OLD_TAG in str(path):
            return None if ignore_errors else real_rmtree("/nonexistent/path")
        return real_rmtree(path, ignore_errors=ignore_errors, **kwargs)

    monkeypatch.setattr(outdir.shutil, "rmtree", rmtree)
    notices: list[str] = []
    result = convert(src, out, ConvertOptions(overwrite=True, scale_rule="floor"), notice=notices.append)
    assert json.loads((out / "ascendconv_provenance.json").read_text())["scale_rule"] == "floor"
    (old,) = [p for p in tmp_path.iterdir() if OLD_TAG in p.name]
    assert notices == [
        f"the new package is complete at {out}; the old one's remains at {old} are removed by the next run to "
        "that output (or remove them yourself)"
    ]
    assert result.output == out


@pytest.mark.parametrize("where", ["source", "file", "symlink"])
def test_a_dry_run_refuses_the_outputs_the_run_refuses(fixture_copy, tmp_path, where):
    src = fixture_copy(DENSE)
    out = {"source": src, "file": tmp_path / "afile", "symlink": tmp_path / "link"}[where]
    if where == "file":
        out.write_text("x")
    if where == "symlink":
        out.symlink_to(src)
    real = run_convert(src, out)
    dry = runner.invoke(app, ["convert", str(src), str(out), "--dry-run", "--json"])
    assert real.exit_code == dry.exit_code == 2
    assert json.loads(dry.stdout)["error"] == json.loads(runner.invoke(app, ["convert", str(src), str(out), "--json"]).stdout)["error"]


def test_a_file_at_out_is_not_told_to_pass_overwrite(fixture_copy, tmp_path):
    (tmp_path / "afile").write_text("x")
    result = runner.invoke(app, ["convert", str(fixture_copy(DENSE)), str(tmp_path / "afile"), "--overwrite", "--json"])
    envelope = json.loads(result.stdout)
    assert result.exit_code == 2 and envelope["message"].endswith("afile: exists and is not a directory")
    assert "--overwrite" not in envelope["hint"]


def test_an_interrupt_before_the_output_is_staged_says_nothing_was_written(fixture_copy, tmp_path):
    # in a process of its own: the signal is real, and a test runner's handlers stay out of it
    src, out = fixture_copy(DENSE), tmp_path / "out"
    code = (
        "import os, signal, sys, time\n"
        "import ascendconv.convert as convert_module\n"
        "def prepare(self, plan, source, notice):  # SIGTERM arrives while the kernels compile\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
        "convert_module.Kernel.prepare = prepare\n"
        "from ascendconv.cli import app\n"
        f"sys.argv = ['ascendconv', 'convert', {str(src)!r}, {str(out)!r}, '--json']\n"
        "app()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 143, done.stderr
    envelope = json.loads(done.stdout)
    assert envelope["error"] == "Interrupted" and envelope["hint"] == f"nothing was written at {out}"
    assert "Traceback" not in done.stderr and not out.exists() and hidden_siblings(tmp_path) == []


def test_a_second_interrupt_while_threads_wind_down_exits_at_once_without_a_traceback():
    code = (
        "import os, signal, threading, time\n"
        "from ascendconv.cli import exit_quietly_if_interrupted_again\n"
        "exit_quietly_if_interrupted_again()\n"
        "def worker():\n"
        "    time.sleep(0.5)\n"
        "    os.kill(os.getpid(), signal.SIGINT)  # while the main thread waits for this one at exit\n"
        "    time.sleep(30)\n"
        "threading.Thread(target=worker).start()\n"
        "print('reported', flush=True)\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (130, "reported\n", "")
    assert time.monotonic() - started < 20


@pytest.mark.parametrize(
    "options, words", [(["--resume"], "cannot be combined with --part or --resume"), (["--ray-cpus", "0"], "--ray-cpus 0: must be a whole number 1 or more")]
)
def test_a_dry_run_checks_the_ray_options_as_the_run_does(fixture_copy, tmp_path, options, words):
    src = fixture_copy(DENSE)
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "out"), "--dry-run", "--ray", *options, "--json"])
    assert result.exit_code == 2 and words in json.loads(result.stdout)["message"]


def test_out_s_directory_removed_during_the_run_is_named_as_such(fixture_copy, tmp_path):
    """OUT's directory removed while the package was written: 'OutputWriteError ... No such file or
    directory' with the hint 'free space, raise the file-size limit', which were not the cause."""
    src = fixture_copy(DENSE)
    parent = tmp_path / "models"
    parent.mkdir()
    removed = []

    def progress(done, total):
        if not removed:
            removed.append(shutil.rmtree(parent))

    with pytest.raises(OutputWriteError) as caught:
        convert(src, parent / "out", ConvertOptions(max_shard_size=100_000), progress=progress)
    error = caught.value
    assert "No such file or directory: the directory it was written in was removed or renamed during the run" in error.message
    assert error.message.endswith("; the package was not written")
    assert error.hint == "leave OUT's directory in place until convert ends, then run it again"
    assert not parent.exists()


def test_an_interrupt_whose_exception_was_lost_still_ends_the_run_before_publishing(fixture_copy, tmp_path):
    """Ctrl-C while Python ran an import lock's callback: our handler's Interrupted was 'Exception
    ignored in: <function _get_module_lock.<locals>.cb>', and the run went on to exit 0 with the
    package published. The signal the handler saw is checked before the rename."""
    from ascendconv.errors import Interrupted

    src = fixture_copy(DENSE)
    lost = []

    def progress(done, total):
        if not lost:
            try:
                outdir._raise_interrupt(signal.SIGINT, None)  # as the handler does...
            except Interrupted as exc:
                lost.append(exc)  # ...inside a callback whose exceptions Python ignores

    with outdir.signals_interrupt():
        with pytest.raises(Interrupted) as caught:
            convert(src, tmp_path / "out", ConvertOptions(), progress=progress)
    assert lost and caught.value.signum == signal.SIGINT
    assert not (tmp_path / "out").exists() and hidden_siblings(tmp_path) == []



def everything_below(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


GONE_MESSAGE = "No such file or directory: the directory it was written in was removed or renamed during the run"
GONE_HINT = "leave OUT's directory in place until convert ends, then run it again"


@pytest.mark.parametrize("change, left", [
    ("OUT's directory renamed", ["moved"]),
    ("OUT's directory, made by the run, renamed", []),
    ("the staging moved out of OUT's directory", ["models"]),
])
def test_out_s_directory_renamed_during_the_run_leaves_nothing_of_the_run(fixture_copy, tmp_path, change, left):
    """OUT's directory renamed (or the staging moved) while the package was written: the run failed,
    but removed its staging and lock by their old paths, so both stayed in the renamed directory (or
    the moved staging stayed where it was moved), and a directory the run had made stayed too. (OUT's
    directory removed left nothing before either: test_out_s_directory_removed_during_the_run_is_named_as_such.)"""
    src = fixture_copy(DENSE)
    work = tmp_path / "work"
    work.mkdir()
    parent = work / "models"
    if change != "OUT's directory, made by the run, renamed":
        parent.mkdir()
    changed = []

    def progress(done, total):
        if changed:
            return
        changed.append(change)
        if change == "the staging moved out of OUT's directory":
            next(parent.glob(f".out{STAGING_TAG}*")).rename(work / "staging")
        else:
            parent.rename(work / "moved")

    with pytest.raises(OutputWriteError) as caught:
        convert(src, parent / "out", ConvertOptions(max_shard_size=100_000), progress=progress)
    error = caught.value
    assert error.exit_code == 4
    assert f"{parent}/.out{STAGING_TAG}" in error.message and GONE_MESSAGE in error.message
    assert error.message.endswith("; the package was not written") and error.hint == GONE_HINT
    assert everything_below(work) == left


def test_out_s_directory_renamed_and_made_again_keeps_the_new_one(fixture_copy, tmp_path):
    """Where the run made OUT's directory, and it was renamed and a directory made at its old path:
    the run removed that new directory (not its own) and left its own, with its staging and lock in it."""
    src = fixture_copy(DENSE)
    parent = tmp_path / "work" / "models"
    changed = []

    def progress(done, total):
        if not changed:
            changed.append(parent.rename(tmp_path / "work" / "moved"))
            parent.mkdir()

    with pytest.raises(OutputWriteError, match=GONE_MESSAGE):
        convert(src, parent / "out", ConvertOptions(max_shard_size=100_000), progress=progress)
    assert everything_below(tmp_path / "work") == ["models"]


def test_out_s_directory_renamed_just_before_the_package_is_renamed_into_place(fixture_copy, tmp_path, monkeypatch):
    """Renamed once the package was complete: the rename into place failed as 'could not be renamed
    into place (No such file or directory)', an OutputPathError (exit 2) whose hint was to make OUT
    replaceable, and the staging stayed in the renamed directory."""
    src = fixture_copy(DENSE)
    parent = tmp_path / "work" / "models"
    parent.mkdir(parents=True)
    publish = outdir.StagedOutput.publish

    def renamed_first(staged):
        parent.rename(tmp_path / "work" / "moved")
        publish(staged)

    monkeypatch.setattr(outdir.StagedOutput, "publish", renamed_first)
    with pytest.raises(OutputWriteError) as caught:
        convert(src, parent / "out", ConvertOptions())
    error = caught.value
    assert error.message.startswith(f"{parent}/.out{STAGING_TAG}") and GONE_MESSAGE in error.message
    assert error.exit_code == 4 and error.hint == GONE_HINT
    assert everything_below(tmp_path / "work") == ["moved"]
