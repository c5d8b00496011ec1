"""convert --resume: a run stopped by a signal or a failure keeps its finished shards, the next run of
the same plan reuses exactly those (same inodes, same mtimes, not counted in the progress total) and
converts the rest, and the package is byte-identical to one written without interruption."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.convert import ConvertOptions, convert, plan_for
from ascendconv.errors import OutputExistsError, OutputWriteError, ResumeMismatchError
from ascendconv.io.outdir import STAGING_TAG
from ascendconv.io.checksum import CHECKSUM, file_digest
from ascendconv.io.writer import ShardWriter, TensorSpec
from ascendconv.sources import Source
from ascendconv.resume import LEDGER_NAME
from conftest import write_large_checkpoint

runner = CliRunner()
# reference kernel: slow enough to stop mid-run; 10 MB shards: one linear (8.3 MiB out) per shard
SLOW = ("--kernel", "reference", "--max-shard-size", "10MB")


def tree(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def stagings(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}{STAGING_TAG}*"))


def ledger_of(out: Path) -> dict:
    (staging,) = stagings(out)
    return json.loads((staging / LEDGER_NAME).read_text())


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """A 6-linear checkpoint and its package written in one uninterrupted run (reference kernel)."""
    root = tmp_path_factory.mktemp("resume")
    src = write_large_checkpoint(root / "src", shards=2, linears_per_shard=3, n=1024)
    golden = root / "golden"
    result = runner.invoke(app, ["convert", str(src), str(golden), "--quiet", *SLOW])
    assert result.exit_code == 0, result.output
    return src, golden


# In-process runs stopped by their progress callback need no slow kernel.
FAST = ConvertOptions(max_shard_size=10 * 10**6, resume=True)


@pytest.fixture(scope="module")
def fast_golden(large, tmp_path_factory):
    out = tmp_path_factory.mktemp("golden") / "out"
    convert(large[0], out, ConvertOptions(max_shard_size=FAST.max_shard_size))
    return out


def with_options(options: ConvertOptions, **changes) -> ConvertOptions:
    return ConvertOptions(**{**options.__dict__, **changes})


def test_file_digest_is_what_the_shard_writer_returns(tmp_path):
    # resume and assemble re-read shards with file_digest: it must agree with the writer's checksum
    for nbytes in (10, 3 * 2**20 + 5):  # small (buffered) and large (O_DIRECT) shards
        writer = ShardWriter(tmp_path / "s.safetensors", [TensorSpec("t", "U8", (nbytes,))])
        writer.write("t", bytes(range(256)) * (nbytes // 256) + bytes(nbytes % 256))
        assert writer.close() == file_digest(tmp_path / "s.safetensors", CHECKSUM)


def start(src: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ascendconv", "convert", str(src), str(out), "--quiet", "--resume", *SLOW],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_for_finished_shard(out: Path, process: subprocess.Popen, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and process.poll() is None:
        for staging in stagings(out):
            try:
                if json.loads((staging / LEDGER_NAME).read_text())["shards"]:
                    return
            except (OSError, ValueError):
                pass  # not written yet
        time.sleep(0.02)
    raise AssertionError(f"no shard was recorded (exit {process.poll()})")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_a_killed_run_resumes_converting_only_the_unfinished_shards(large, tmp_path, signum):
    src, golden = large
    out = tmp_path / "out"
    process = start(src, out)
    wait_for_finished_shard(out, process)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode in (128 + signum, -signum), stderr
    if signum != signal.SIGKILL:
        assert "finished shards are kept in" in stderr and "Traceback" not in stderr
    assert not out.exists()
    ledger = ledger_of(out)
    finished = sorted(ledger["shards"])
    assert ledger["checksum"] == CHECKSUM and 1 <= len(finished) < 6
    (staging,) = stagings(out)
    before = {name: ((staging / name).stat().st_ino, (staging / name).stat().st_mtime_ns) for name in finished}

    result = runner.invoke(app, ["convert", str(src), str(out), "--resume", "--json", *SLOW])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    all_shards = sorted(s["file"] for s in summary["shards"])
    assert summary["reused_shards"] == finished
    assert summary["written_shards"] == sorted(set(all_shards) - set(finished))
    # the reused files are the very files the first run wrote: renamed with staging, never rewritten
    after = {name: ((out / name).stat().st_ino, (out / name).stat().st_mtime_ns) for name in finished}
    assert after == before
    assert tree(out) == tree(golden)
    assert stagings(out) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def interrupted_half_way(src: Path, out: Path, options: ConvertOptions = FAST) -> list[str]:
    """Stop a run once half the source is read; return the shards its ledger records as finished."""

    def stop(done, total):
        if done > total // 2 and options.resume:
            # shards are closed by the writer thread, behind the progress: let one finish first
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not ledger_of(out)["shards"]:
                time.sleep(0.01)
        if done > total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(src, out, options, stop)
    return sorted(ledger_of(out)["shards"]) if options.resume else []


def test_progress_of_a_resumed_run_counts_only_the_remaining_bytes(large, fast_golden, tmp_path):
    src, _ = large
    out = tmp_path / "out"
    options = FAST
    finished = set(interrupted_half_way(src, out))
    assert finished
    totals = []
    result = convert(src, out, options, lambda done, total: totals.append((done, total)))
    source = Source.open(src)
    try:
        plan = plan_for(source, options)
        remaining = sum(
            source.tensors[t.source].nbytes
            for shard in plan.shards if shard.file not in finished
            for t in shard.tensors if t.kind != "mx_scale"
        )
    finally:
        source.close()
    assert sorted(result.reused_shards) == sorted(finished)
    assert {total for _, total in totals} == {remaining} and totals[-1][0] == remaining
    assert remaining < source.total_bytes
    assert tree(out) == tree(fast_golden)


def test_a_damaged_finished_shard_is_converted_again(large, fast_golden, tmp_path):
    src, _ = large
    out = tmp_path / "out"
    finished = interrupted_half_way(src, out)
    (staging,) = stagings(out)
    damaged = staging / finished[0]
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))
    result = convert(src, out, FAST)
    assert sorted(result.reused_shards) == finished[1:]
    assert tree(out) == tree(fast_golden)


def test_work_of_another_plan_is_refused_not_mixed(large, tmp_path):
    src, _ = large
    out = tmp_path / "out"
    interrupted_half_way(src, out)
    (staging,) = stagings(out)
    kept = tree(staging)
    other = with_options(FAST, scale_rule="floor")
    with pytest.raises(ResumeMismatchError, match=r"scale_rule: 'floor' now, 'mse' there"):
        convert(src, out, other)
    assert stagings(out) == [staging] and tree(staging) == kept and not out.exists()
    result = runner.invoke(
        app, ["convert", str(src), str(out), "--resume", "--quiet", "--scale-rule", "floor", "--max-shard-size", "10MB"]
    )
    assert result.exit_code == 2 and "another plan" in result.stderr and "--overwrite" in result.stderr
    # --overwrite discards the other plan's work and starts afresh
    result = convert(src, out, with_options(other, overwrite=True))
    assert result.reused_shards == [] and stagings(out) == []
    assert json.loads((out / "ascendconv_provenance.json").read_text())["scale_rule"] == "floor"


def test_a_long_value_or_key_in_another_plans_ledger_is_clipped_not_the_whole_message(large, tmp_path):
    """A ledger's identity is anyone's JSON: a value of 4,000 digits filled the message, which was then
    cut in its middle ("holds unfinished work ... from another plan" lost); each is clipped now."""
    src, _ = large
    out = tmp_path / "out"
    interrupted_half_way(src, out)
    (staging,) = stagings(out)
    ledger = json.loads((staging / LEDGER_NAME).read_text())
    ledger["identity"]["options"]["scale_rule"] = 10**3999
    ledger["identity"]["options"]["k" * 5000] = 1
    (staging / LEDGER_NAME).write_text(json.dumps(ledger))
    result = runner.invoke(app, ["convert", str(src), str(out), "--resume", "--max-shard-size", "10MB", "--json"])
    data = json.loads(result.stdout)
    assert (result.exit_code, data["error"]) == (2, "ResumeMismatchError") and "Traceback" not in result.output
    key = "options." + "k" * 126 + "…" + "k" * 134 + " (5008 chars)"  # clipped whole: 134 chars each side
    assert data["message"] == (
        f"{staging}: holds unfinished work for {out} from another plan, which this run will not mix with its own "
        f"(options.scale_rule: 'mse' now, {'1' + '0' * 17}...{'0' * 19} there; {key}: '(absent)' now, 1 there)"
    )


def test_without_resume_a_failed_run_leaves_nothing_and_discards_kept_work(large, fast_golden, tmp_path):
    src, _ = large
    out = tmp_path / "out"
    plain = with_options(FAST, resume=False)
    interrupted_half_way(src, out, plain)
    assert sorted(tmp_path.iterdir()) == []
    interrupted_half_way(src, out)
    assert len(stagings(out)) == 1
    (kept,) = stagings(out)
    notices: list[str] = []
    result = convert(src, out, plain, notice=notices.append)  # stale staging is removed, all converted
    assert result.reused_shards == [] and stagings(out) == []
    assert tree(out) == tree(fast_golden)
    assert notices == [
        f"removed {kept}: unfinished work an earlier --resume run kept for {out}; with --resume this run would have reused it"
    ]


def test_a_failed_final_rename_keeps_the_work_resumable(large, fast_golden, tmp_path):
    src, _ = large
    out = tmp_path / "out"

    def a_file_appears(closed, count):
        if closed == count:
            out.write_text("oops\n")

    with pytest.raises(OutputExistsError) as caught:
        convert(src, out, FAST, on_shard=a_file_appears)
    assert caught.value.message.startswith(f"{out}: exists and is not a directory: it changed while")
    (kept,) = stagings(out)
    assert f"finished shards are kept in {kept}" in caught.value.hint
    assert out.read_text() == "oops\n"
    out.unlink()
    result = convert(src, out, FAST)
    assert sorted(result.reused_shards) == sorted(ledger_names(fast_golden)) and result.shard_checksums
    assert tree(out) == tree(fast_golden) and stagings(out) == []


def ledger_names(package: Path) -> list[str]:
    return [p.name for p in package.glob("quant_model_weights-*.safetensors")]


def test_a_write_error_says_the_finished_shards_are_kept(large, tmp_path, monkeypatch):
    import ascendconv.convert as convert_module

    def full(*args, **kwargs):
        raise OSError(errno.EFBIG, "File too large", "README.md")

    monkeypatch.setattr(convert_module, "write_package_files", full)
    out = tmp_path / "out"
    with pytest.raises(OutputWriteError) as caught:
        convert(large[0], out, FAST)
    (kept,) = stagings(out)
    assert "ulimit -f" in caught.value.hint and f"finished shards are kept in {kept}" in caught.value.hint


def test_a_part_resumes_too(large, fast_golden, tmp_path):
    src, _ = large
    out = tmp_path / "part"
    options = with_options(FAST, part=(1, 2))
    finished = interrupted_half_way(src, out, options)
    result = convert(src, out, options)
    assert finished and sorted(result.reused_shards) == finished
    manifest = json.loads((out / "ascendconv_part.json").read_text())
    assert set(finished) < set(manifest["shards"])
    for name in manifest["shards"]:
        assert (out / name).read_bytes() == (fast_golden / name).read_bytes()
