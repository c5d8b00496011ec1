"""Hostile and unlucky inputs named in issue 12: each ends in a named error (or a failed check), at
once, with nothing left behind. Random mutations of the same files are in test_fuzz.py."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import FIXTURES, load_shard, write_large_checkpoint
from robust_helpers import (
    assert_clean,
    dumps_any,
    edit_header,
    edit_json,
    invoke,
    json_error,
    read_raw_header,
    run_cli,
    save_tensors,
    tree_snapshot,
    write_raw_header,
)

DENSE = "qwen3-dense-fp8"
MOE = "qwen3-moe-fp8"
Q = "model.layers.0.self_attn.q_proj"
DESCRIPTION = "quant_model_description.json"
PKG_INDEX = "quant_model_weights.safetensors.index.json"
PROVENANCE = "ascendconv_provenance.json"


@pytest.fixture
def package_copy(converted, tmp_path):
    """A writable copy of a converted fixture package."""

    def make(fixture: str = MOE, scheme: str = "w8a8-mxfp8", **options):
        target = tmp_path / "pkg"
        shutil.copytree(converted(fixture, scheme, **options), target)
        return target

    return make


def convert_json(src, out, *extra):
    result = invoke("convert", src, out, "--quiet", "--json", *extra)
    assert_clean(result, "convert")
    return result


# --- hangs: FIFOs and devices are never opened for reading -----------------------------------------


def test_fifo_shard_of_a_source_is_refused_at_once(fixture_copy, tmp_path):
    src = fixture_copy(MOE)
    shard = src / "model-00002-of-00003.safetensors"
    shard.unlink()
    os.mkfifo(shard)
    for args in (("convert", src, tmp_path / "out", "--json"), ("inspect", src, "--json")):
        started = time.monotonic()
        result = run_cli(*args, timeout=60)
        assert time.monotonic() - started < 60
        assert result.returncode == 3, result.stderr
        error = json.loads(result.stdout.splitlines()[0])
        assert error["error"] == "MissingShardError" and "not a regular file" in error["message"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_device_as_package_shard_and_stray_file(package_copy, device):
    pkg = package_copy()
    shard = next(pkg.glob("quant_model_weights-*.safetensors"))
    shard.unlink()
    shard.symlink_to(device)
    (pkg / "extra.safetensors").symlink_to(device)
    os.mkfifo(pkg / "pipe.safetensors")
    result = run_cli("verify", pkg, "--json", timeout=60)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert {"files", "headers", "checksums"} <= set(report["failed"])
    headers = next(c for c in report["checks"] if c["name"] == "headers")
    assert any("character device, not a regular file" in p for p in headers["problems"])
    files = next(c for c in report["checks"] if c["name"] == "files")
    assert any("pipe.safetensors" in p for p in files["problems"])
    result = run_cli("inspect", pkg, "--json", timeout=60)
    assert result.returncode == 0, result.stderr
    assert any("not a regular file" in p for p in json.loads(result.stdout)["problems"])


def test_fifo_json_files_are_refused(package_copy):
    pkg = package_copy()
    (pkg / PROVENANCE).unlink()
    os.mkfifo(pkg / PROVENANCE)
    os.mkfifo(pkg / "config.json.tmp")
    (pkg / "config.json").unlink()
    (pkg / "config.json").symlink_to(pkg / "config.json.tmp")
    result = run_cli("verify", pkg, "--json", timeout=60)
    # a FIFO is not a file: the package has no provenance (so no checksums) and no config.json
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["failed"] == ["files", "checksums"], report["failed"]
    files = next(c for c in report["checks"] if c["name"] == "files")
    assert any("config.json is missing" in p for p in files["problems"])
    result = run_cli("inspect", pkg, "--json", timeout=60)
    assert result.returncode == 0 and json.loads(result.stdout)["package"]["provenance"] is None


def test_header_larger_than_the_safetensors_limit(fixture_copy, tmp_path):
    from ascendconv.io.safetensors import MAX_HEADER_BYTES

    src = fixture_copy(DENSE)
    shard = src / "model.safetensors"
    with open(shard, "r+b") as f:
        f.write((MAX_HEADER_BYTES + 8).to_bytes(8, "little"))
        f.truncate(MAX_HEADER_BYTES + 64)  # sparse: the length fits the file, not the limit
    result = convert_json(src, tmp_path / "out")
    assert result.exit_code == 3
    assert json_error(result)["error"] == "TruncatedFileError" and "at most" in json_error(result)["message"]


def test_json_file_larger_than_the_limit(fixture_copy, tmp_path, monkeypatch):
    import ascendconv.io.files as files

    monkeypatch.setattr(files, "MAX_JSON_BYTES", 1000)
    monkeypatch.setattr(files.read_json, "__defaults__", (1000,))
    src = fixture_copy(DENSE)
    edit_json(src / "config.json", lambda c: c.update(padding="x" * 2000))
    result = convert_json(src, tmp_path / "out")
    assert result.exit_code == 3
    assert json_error(result)["error"] == "ConfigError" and "more than" in json_error(result)["message"]


# --- long values in messages -----------------------------------------------------------------------


def test_long_label_is_elided_and_rendered_fast(package_copy):
    pkg = package_copy()
    label = "L" * 4_000_000
    edit_json(pkg / DESCRIPTION, lambda d: d.update({next(iter(d)): label}))
    started = time.monotonic()
    result = invoke("verify", pkg)
    seconds = time.monotonic() - started
    assert_clean(result, "verify")
    assert result.exit_code == 1
    assert seconds < 20, seconds
    assert len(result.stdout) < 50_000
    assert "(4000002 chars)" in result.stdout  # the repr of the label, with its length


def test_long_tensor_name_in_an_error_is_elided(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    name = "n" * 100_000
    edit_header(src / "model.safetensors", lambda h: h.update({name: {"dtype": ["F32"], "shape": [0], "data_offsets": [0, 0]}}))
    result = convert_json(src, tmp_path / "out")
    assert result.exit_code == 3
    message = json_error(result)["message"]
    assert json_error(result)["error"] == "HeaderError" and len(message) < 1000 and "(100002 chars)" in message


# --- hostile JSON that parses ----------------------------------------------------------------------


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


HOSTILE_HEADERS = {
    "huge integer offset": (lambda h, n: h[n].update(data_offsets=[0, 10**5000]), "HeaderError"),
    "deep nesting": (None, "HeaderError"),
    "dtype a list": (lambda h, n: h[n].update(dtype=["F32"]), "HeaderError"),
    "dtype null": (lambda h, n: h[n].update(dtype=None), "HeaderError"),
    "shape of booleans": (lambda h, n: h[n].update(shape=[True, True]), "HeaderError"),
    "shape 2**64": (lambda h, n: h[n].update(shape=[0, 2**64]), "HeaderError"),
    "shape overflowing": (lambda h, n: h[n].update(shape=[2**63, 2, 0]), "HeaderError"),
    "offsets of booleans": (lambda h, n: h[n].update(data_offsets=[False, True]), "HeaderError"),
    "metadata a list": (lambda h, n: h.update(__metadata__=["x"]), "HeaderError"),
    "metadata a string": (lambda h, n: h.update(__metadata__="x"), "HeaderError"),
    "entry a string": (lambda h, n: h.update({n: "x"}), "HeaderError"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_HEADERS))
def test_hostile_source_header(fixture_copy, tmp_path, case):
    edit, error = HOSTILE_HEADERS[case]
    src = fixture_copy(DENSE)
    shard = src / "model.safetensors"
    if edit is None:
        _, data = read_raw_header(shard)
        write_raw_header(shard, _deep(100_000).encode(), data)
    else:
        header, data = read_raw_header(shard)
        parsed = json.loads(header)
        edit(parsed, Q + ".weight")
        write_raw_header(shard, dumps_any(parsed), data)
    before = tree_snapshot(src)
    for command in (("convert", src, tmp_path / "out", "--json"), ("inspect", src, "--json")):
        result = invoke(*command)
        assert_clean(result, command[0])
        assert result.exit_code == 3 and json_error(result)["error"] == error, result.output
    assert tree_snapshot(src) == before and not (tmp_path / "out").exists()


HOSTILE_INDEX = {
    "weight_map values numbers": lambda i: i["weight_map"].update({k: 1 for k in list(i["weight_map"])[:3]}),
    "weight_map value null": lambda i: i["weight_map"].update({next(iter(i["weight_map"])): None}),
    "weight_map value a list": lambda i: i["weight_map"].update({next(iter(i["weight_map"])): ["a"]}),
    "weight_map a list": lambda i: i.update(weight_map=[1, 2]),
    "index a list": lambda i: [i],
    "weight_map value a path outside": lambda i: i["weight_map"].update({next(iter(i["weight_map"])): "../x/model.safetensors"}),
    "huge integer": lambda i: i.update(metadata={"total_size": 10**4000}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_INDEX))
def test_hostile_source_index(fixture_copy, tmp_path, case):
    src = fixture_copy(MOE)
    edit_json(src / "model.safetensors.index.json", HOSTILE_INDEX[case])
    for command in (("convert", src, tmp_path / "out", "--json"), ("inspect", src, "--json")):
        result = invoke(*command)
        assert_clean(result, command[0])
        if case != "huge integer":  # total_size is not read
            assert result.exit_code == 3 and json_error(result)["error"] == "IndexMismatchError", result.output


HOSTILE_QUANT = {
    "block 2**64": {"weight_block_size": [2**64, 128]},
    "block 2**62": {"weight_block_size": [128, 2**62]},
    "block booleans": {"weight_block_size": [True, True]},
    "block of three": {"weight_block_size": [128, 128, 128]},
    "modules_to_not_convert a number": {"modules_to_not_convert": 5},
    "modules_to_not_convert a string": {"modules_to_not_convert": "lm_head"},
    "modules_to_not_convert of numbers": {"modules_to_not_convert": [1, 2]},
}


@pytest.mark.parametrize("case", sorted(HOSTILE_QUANT))
def test_hostile_quantization_config(fixture_copy, tmp_path, case):
    src = fixture_copy(DENSE)
    edit_json(src / "config.json", lambda c: c["quantization_config"].update(HOSTILE_QUANT[case]))
    for command in (("convert", src, tmp_path / "out", "--json"), ("inspect", src, "--json")):
        result = invoke(*command)
        assert_clean(result, command[0])
        assert result.exit_code == 3 and json_error(result)["error"] == "ConfigError", result.output
        # it had no hint
        assert json_error(result)["hint"] == "fix the file named (config.json, or the quantization config beside it), or download the checkpoint again"


def test_config_nested_too_deep(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    (src / "config.json").write_text('{"a": ' + _deep(100_000) + "}")
    result = convert_json(src, tmp_path / "out")
    assert result.exit_code == 3 and "nested too deeply" in json_error(result)["message"]


HOSTILE_PACKAGE_JSON = {
    (DESCRIPTION, "metadata a list"): lambda d: d.update(metadata=[1]),
    (DESCRIPTION, "metadata a string"): lambda d: d.update(metadata="x"),
    (DESCRIPTION, "labels of every type"): lambda d: d.update({k: v for k, v in zip(list(d)[:5], [1, None, [], {}, 2.5])}),
    (DESCRIPTION, "huge group_size"): lambda d: d.update(group_size=10**4000),
    (DESCRIPTION, "version a dict"): lambda d: d.update(version={"a": 1}),
    (PKG_INDEX, "weight_map values numbers"): lambda i: i["weight_map"].update({k: 7 for k in i["weight_map"]}),
    (PKG_INDEX, "weight_map null"): lambda i: i.update(weight_map=None),
    (PKG_INDEX, "metadata a list"): lambda i: i.update(metadata=[1]),
    (PKG_INDEX, "total_size a string"): lambda i: i.update(metadata={"total_size": "1"}),
    (PROVENANCE, "shards a list"): lambda p: p.update(shards=[1]),
    (PROVENANCE, "shard entry a number"): lambda p: p["shards"].update({k: 1 for k in p["shards"]}),
    (PROVENANCE, "sha256 a number"): lambda p: p["shards"].update({k: {"sha256": 5} for k in p["shards"]}),
    (PROVENANCE, "source files of numbers"): lambda p: p["source"].update(files=[1, None]),
    (PROVENANCE, "source a string"): lambda p: p.update(source="x"),
    (PROVENANCE, "fallbacks a number"): lambda p: p.update(fallbacks=3),
    (PROVENANCE, "version huge"): lambda p: p.update(version=10**4000),
    ("config.json", "text_config a list"): lambda c: c.update(text_config=[1]),
    ("config.json", "num_experts a string"): lambda c: c.update(num_experts="4"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_PACKAGE_JSON), ids=lambda c: f"{c[0]}-{c[1]}")
def test_hostile_package_json(package_copy, case):
    pkg = package_copy()
    file, _ = case
    edit_json(pkg / file, HOSTILE_PACKAGE_JSON[case])
    for command in (("verify", pkg, "--json"), ("verify", pkg), ("inspect", pkg, "--json"), ("inspect", pkg)):
        result = invoke(*command)
        assert_clean(result, command[0])
    if file != "config.json" and case[1] not in ("sha256 a number", "shard entry a number"):  # checksum module
        assert invoke("verify", pkg).exit_code in (1, 3)


# --- absurd numbers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("convert", "SRC", "OUT", "--workers", "-1"),
        ("verify", "PKG", "--seed", "-1"),
        ("verify", "PKG", "--moe-tokens", "1e9"),
        ("verify", "PKG", "--moe-tokens", "1000000000"),
        ("verify", "PKG", "--min-sqnr-mxfp8", "nan"),
        ("verify", "PKG", "--min-sqnr-mxfp4", "inf"),
    ],
)
def test_absurd_options_are_usage_errors(fixture_copy, package_copy, tmp_path, args):
    names = {"SRC": fixture_copy(DENSE), "OUT": tmp_path / "out", "PKG": package_copy()}
    result = invoke(*(names.get(a, a) for a in args))
    assert_clean(result, args[0])
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "out").exists()


def test_workers_beyond_cores_are_clamped():
    from ascendconv.convert import worker_count

    cores = len(os.sched_getaffinity(0))
    assert worker_count(1000) == cores and worker_count(0) == cores and worker_count(1) == 1


@pytest.mark.parametrize("shape", [(0, 256), (256, 0), (2**40, 0)], ids=["N=0", "K=0", "N=2**40,K=0"])
def test_zero_size_fp8_weight_is_refused_up_front(fixture_copy, tmp_path, converted, shape):
    """A linear without elements is no model's; refused by convert and by verify --source alike
    (verify --exact crashed on K=0, and N=2**40 made it allocate 8 TiB for its row sample)."""
    src = fixture_copy(DENSE)
    shard = src / "model.safetensors"
    tensors = load_shard(shard)
    dtype, _, _ = tensors[Q + ".weight_scale_inv"]
    tensors[Q + ".weight"] = ("F8_E4M3", shape, b"")
    tensors[Q + ".weight_scale_inv"] = (dtype, (-(-shape[0] // 128), -(-shape[1] // 128)), b"")
    save_tensors(shard, tensors)
    result = convert_json(src, tmp_path / "out")
    assert result.exit_code == 3 and json_error(result)["error"] == "UnsupportedTensorError", result.output
    assert "without elements" in json_error(result)["message"]
    result = invoke("verify", converted(DENSE), "--source", src, "--exact", "--json")
    assert_clean(result, "verify")
    assert result.exit_code == 3 and json_error(result)["error"] == "UnsupportedTensorError"


def test_mx_reference_takes_empty_rows_and_columns():
    from ascendconv.formats import mx
    from ascendconv.formats.constants import E2M1, E4M3

    for shape in ((0, 32), (4, 0), (0, 0)):
        values = np.zeros(shape, np.float32)
        for fmt in (E4M3, E2M1):
            for rule in ("floor", "rceil", "mse"):
                codes, scales = mx.quantize_mx(values, fmt, rule)
                assert codes.shape == shape and scales.shape == (shape[0], shape[1] // 32)
                assert mx.dequantize_mx(codes, scales, fmt).shape == shape


# --- sources convert would accept and verify reject ------------------------------------------------


def _add_tensor(name, dtype="BF16", shape=(4,)):
    def edit(tensors):
        size = int(np.prod(shape)) * {"BF16": 2, "I32": 4, "F32": 4, "F8_E8M0": 1}[dtype]
        tensors[name] = (dtype, shape, bytes(size))

    return edit


@pytest.mark.parametrize(
    "edit,error,words",
    [
        (_add_tensor("version"), "UnsupportedTensorError", ["'version'", "quant_model_description.json"]),
        (_add_tensor("metadata"), "UnsupportedTensorError", ["'metadata'"]),
        (_add_tensor(Q + ".weight_scale", "F32", (1, 2)), "UnsupportedTensorError", [Q + ".weight_scale'"]),
        (_add_tensor(Q + ".bias", "I32", (256,)), "UnsupportedTensorError", [Q + ".bias", "I32"]),
        (_add_tensor("model.extra", "F8_E8M0", (4,)), "UnsupportedTensorError", ["model.extra", "F8_E8M0"]),
        (lambda t: t.clear(), "UnrecognizedCheckpointError", ["no tensors"]),
    ],
)
def test_sources_verify_would_reject_are_refused_up_front(fixture_copy, tmp_path, edit, error, words):
    src = fixture_copy(DENSE)
    shard = src / "model.safetensors"
    tensors = load_shard(shard)
    edit(tensors)
    save_tensors(shard, tensors)
    for command in (("convert", src, tmp_path / "out", "--json"), ("inspect", src, "--json")):
        result = invoke(*command)
        assert_clean(result, command[0])
        assert result.exit_code == 3, result.output
        report = json_error(result)
        assert report["error"] == error, report
        for word in words:
            assert word in report["message"], (word, report["message"])
    assert not (tmp_path / "out").exists()


# --- output paths ----------------------------------------------------------------------------------


def test_output_symlink_is_refused(fixture_copy, tmp_path):
    target = tmp_path / "real"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    result = convert_json(fixture_copy(DENSE), link, "--overwrite")
    assert result.exit_code == 2 and json_error(result)["error"] == "UnsafeOutputError"
    assert "symbolic link" in json_error(result)["message"]
    assert link.is_symlink() and list(target.iterdir()) == []


@pytest.mark.parametrize("name", [".", ".."])
def test_output_dot_and_dotdot_are_refused(fixture_copy, tmp_path, name, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    result = convert_json(fixture_copy(DENSE), name, "--overwrite")
    assert result.exit_code == 2 and json_error(result)["error"] in ("OutputPathError", "OutputExistsError")
    assert list(work.iterdir()) == []


def test_output_name_too_long_is_refused(fixture_copy, tmp_path):
    src = fixture_copy(DENSE)
    result = convert_json(src, tmp_path / ("o" * 250))
    assert result.exit_code == 2 and json_error(result)["error"] == "OutputPathError"
    assert "bytes" in json_error(result)["message"] and "shorter" in json_error(result)["hint"]
    result = convert_json(src, tmp_path / ("d" * 300) / "out")
    assert result.exit_code == 2 and json_error(result)["error"] == "OutputPathError"
    assert [p.name for p in tmp_path.iterdir()] == ["src"]


def test_not_enough_space_is_refused_before_writing(fixture_copy, tmp_path, monkeypatch):
    import ascendconv.io.output as output

    class Tiny:
        f_bavail, f_bfree, f_frsize, f_flag = 10, 10, 4096, 0

    monkeypatch.setattr(output.os, "statvfs", lambda path: Tiny())
    result = convert_json(fixture_copy(DENSE), tmp_path / "out")
    assert result.exit_code == 4 and json_error(result)["error"] == "NoSpaceError"
    message = json_error(result)["message"]
    assert "needs" in message and "40960 bytes" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "errno_name,error", [("ENOSPC", "NoSpaceError"), ("EFBIG", "OutputWriteError"), ("EIO", "OutputWriteError")]
)
def test_write_failure_is_a_named_error(fixture_copy, tmp_path, monkeypatch, errno_name, error):
    import errno

    import ascendconv.convert as convert

    def fail(*args, **kwargs):
        raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)), str(tmp_path / "x"))

    monkeypatch.setattr(convert, "write_package_files", fail)
    result = convert_json(fixture_copy(DENSE), tmp_path / "out")
    assert result.exit_code == 4 and json_error(result)["error"] == error
    assert [p.name for p in tmp_path.iterdir()] == ["src"]


def test_a_file_system_out_of_inodes_is_named_as_such(tmp_path, monkeypatch):
    """A tmpfs of nr_inodes=4 with 20 MiB free: 'the file system is full (20.00 MiB free now)', a
    contradiction. Tried on such a tmpfs the lock file fails first; here the file system is
    stood in by statvfs's answer."""
    import errno

    import ascendconv.io.output as output

    exc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / ".out.ascendconv-lock"))
    full = os.statvfs(tmp_path)
    no_inodes = os.statvfs_result((*full[:5], 4, 0, 0, *full[8:]))  # f_files, f_ffree, f_favail
    monkeypatch.setattr(output.os, "statvfs", lambda path: no_inodes)
    error = output.output_error(exc, tmp_path / "out")
    monkeypatch.setattr(output.os, "statvfs", lambda path: full)
    other = output.output_error(exc, tmp_path / "out")
    assert type(error).__name__ == "NoSpaceError"
    assert error.message.startswith(f"{tmp_path}/.out.ascendconv-lock: the file system has no free inodes left: it can hold no more files, though ")
    assert error.hint == "delete files there (df -i shows the inodes), or choose an OUT on another file system"
    assert "the file system is full" in other.message and "inodes" not in other.message


def test_file_size_limit_in_a_real_process(tmp_path):
    """`ulimit -f`: Python ignores SIGXFSZ, so the write fails with EFBIG: a named error."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    src = tmp_path / "src"
    shutil.copytree(FIXTURES / DENSE, src)
    result = run_cli("convert", src, tmp_path / "out", "--json", "--quiet", preexec_fn=limit)
    assert result.returncode == 4, result.stderr
    assert json.loads(result.stdout.splitlines()[0])["error"] == "OutputWriteError"
    assert "ulimit" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("limit", [12, 16])
def test_open_file_limit_in_a_real_process(tmp_path, limit):
    """`ulimit -n`: out of descriptors, a source shard's open (or mmap's duplicate) failing was
    TruncatedFileError ('download it again', exit 3) or OutputWriteError ('free space'), and with the
    source's descriptors still held the staging could not be removed: left beside OUT."""
    import resource

    def limited():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    src = write_large_checkpoint(tmp_path / "src", shards=40, linears_per_shard=1, n=256, k=512)
    result = run_cli("convert", src, tmp_path / "out", "--json", "--quiet", preexec_fn=limited)
    assert result.returncode == 4, result.stderr
    error = json.loads(result.stdout.splitlines()[0])
    assert error["error"] == "TooManyOpenFilesError", error
    assert error["message"].endswith(f": cannot be opened: Too many open files; this process may have {limit} open (ulimit -n)")
    assert error["hint"] == (
        "raise the open-file limit (ulimit -n 4096; the system's: sysctl fs.file-max), then run the command again"
    )
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def mounted(mount_args: list[str], mount: Path, what: str):
    """Mount (`mount *mount_args mount`), yield the mount point, unmount; skip where not allowed."""
    import subprocess

    done = subprocess.run(["mount", *mount_args, str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount {what} here: {done.stderr.decode().strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs mounted under tmp_path; skipped where mounting is not allowed."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    yield from mounted(["-t", "tmpfs", "-o", "size=1m", "tmpfs"], mount, "a tmpfs")


@pytest.fixture
def ext4_fs(tmp_path):
    """An 8 MiB ext4 file system loop-mounted under tmp_path (O_DIRECT works there, unlike tmpfs);
    skipped where that is not allowed."""
    import subprocess

    image, mount = tmp_path / "ext4.img", tmp_path / "ext4"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(8 * 2**20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot make an ext4 image here: {made.stderr.decode().strip() or made.returncode}")
    yield from mounted(["-o", "loop", str(image)], mount, "an ext4 image")


def test_disk_filling_under_direct_io_writes(ext4_fs, tmp_path, monkeypatch):
    """ENOSPC raised in the O_DIRECT sink's writer thread reaches the caller as NoSpaceError."""
    import ascendconv.convert as convert
    import ascendconv.io.writer as writer_io

    monkeypatch.setattr(convert, "check_free_space", lambda out, needed: None)  # filled meanwhile
    monkeypatch.setattr(writer_io, "DIRECT_IO_MIN_BYTES", 0)  # the small fixture's shard goes through _DirectSink
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / DENSE, src)
    st = os.statvfs(ext4_fs)
    (ext4_fs / "filler").write_bytes(b"\0" * (st.f_bfree * st.f_frsize - 200_000))  # root: reserved blocks too
    result = convert_json(src, ext4_fs / "out")
    assert result.exit_code == 4 and json_error(result)["error"] == "NoSpaceError", result.output
    assert sorted(p.name for p in ext4_fs.iterdir()) == ["filler", "lost+found"]


def test_full_file_system_is_refused_with_sizes(small_fs, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / DENSE, src)
    (small_fs / "filler").write_bytes(b"\0" * 700_000)
    result = convert_json(src, small_fs / "out")
    assert result.exit_code == 4 and json_error(result)["error"] == "NoSpaceError"
    assert "needs" in json_error(result)["message"] and "free" in json_error(result)["message"]
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler"]


def test_disk_filling_during_the_write(small_fs, tmp_path, monkeypatch):
    import ascendconv.convert as convert

    monkeypatch.setattr(convert, "check_free_space", lambda out, needed: None)  # filled meanwhile
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / DENSE, src)
    (small_fs / "filler").write_bytes(b"\0" * 900_000)
    result = convert_json(src, small_fs / "out")
    assert result.exit_code == 4 and json_error(result)["error"] == "NoSpaceError", result.output
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler"]


def test_mount_point_and_read_only_file_system(small_fs, tmp_path):
    import subprocess

    src = tmp_path / "src"
    shutil.copytree(FIXTURES / DENSE, src)
    result = convert_json(src, small_fs, "--overwrite")
    assert result.exit_code == 2 and "mount point" in json_error(result)["message"]
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    result = convert_json(src, small_fs / "out")
    assert result.exit_code == 2 and "read-only file system" in json_error(result)["message"]


def test_read_only_parent_without_privileges(fixture_copy, tmp_path, monkeypatch):
    import ascendconv.io.output as output

    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(stat.S_IRUSR | stat.S_IXUSR)
    monkeypatch.setattr(output.os, "access", lambda path, mode: False)  # root passes every access test
    result = convert_json(fixture_copy(DENSE), parent / "out")
    assert result.exit_code == 2 and json_error(result)["error"] == "OutputPathError"
    assert "not writable" in json_error(result)["message"]


def test_expert_count_disagreeing_with_config_is_refused_up_front(fixture_copy, tmp_path):
    src = fixture_copy(MOE)
    edit_json(src / "config.json", lambda c: c.update(num_experts=5))
    result = convert_json(src, tmp_path / "out")
    assert result.exit_code == 3 and json_error(result)["error"] == "IncompleteMoEError"
    assert "has 4 experts but config.json says 5" in json_error(result)["message"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key,value,shown", [
    ("num_experts", "4", "'4' (str)"),
    ("num_experts", 4.0, "4.0 (float)"),
    ("num_experts", True, "True (bool)"),
    ("num_local_experts", "4", "'4' (str)"),
])
def test_an_expert_count_that_is_no_integer_is_refused_up_front(fixture_copy, tmp_path, key, value, shown):
    """It was passed over as if absent: the experts were held to no count and the package, exit 0,
    verify passing it, carried a config.json by which vLLM cannot size the MoE layers."""
    src = fixture_copy(MOE)
    edit_json(src / "config.json", lambda c: c.update({key: value}))
    for command in (("convert", src, tmp_path / "out", "--json"), ("convert", src, tmp_path / "out", "--dry-run", "--json"),
                    ("inspect", src, "--json")):
        result = invoke(*command)
        assert_clean(result, command[0])
        assert result.exit_code == 3, result.output
        error = json_error(result)
        assert (error["error"], error["message"], error["hint"]) == (
            "ConfigError",
            f"config.json's {key} is {shown}, not a count of routed experts: model.layers.0.mlp has 4 experts",
            "write the count as an integer, as vLLM reads it (it sizes each MoE layer by it)",
        )
    assert not (tmp_path / "out").exists()


def test_verify_fails_a_package_whose_expert_count_is_no_integer(package_copy):
    pkg = package_copy()
    edit_json(pkg / "config.json", lambda c: c.update(num_experts="4"))
    result = invoke("verify", pkg, "--json")
    assert result.exit_code == 1, result.output
    coverage = next(c for c in json.loads(result.stdout)["checks"] if c["name"] == "coverage")
    assert coverage["ok"] is False
    assert "config.json's num_experts is '4' (str), not a count of routed experts: model.layers.0.mlp has 4 experts" in coverage["problems"]


def test_huge_expert_number_in_a_description_is_checked_at_once(package_copy):
    pkg = package_copy()
    name = "model.layers.0.mlp.experts.999999999.gate_proj.weight"
    edit_json(pkg / DESCRIPTION, lambda d: d.update({name: "FLOAT"}))
    started = time.monotonic()
    result = invoke("verify", pkg, "--json")
    assert time.monotonic() - started < 20
    assert_clean(result, "verify")
    coverage = next(c for c in json.loads(result.stdout)["checks"] if c["name"] == "coverage")
    assert any("999999995 of 1000000000 experts missing" in p for p in coverage["problems"]), coverage


def _nan_in_norm(tensors, count=3):
    name = "model.norm.weight"
    dtype, shape, data = tensors[name]
    values = np.frombuffer(data, np.uint16).copy()
    values[:count] = 0x7FC0  # BF16 NaN
    values[count] = 0xFF80  # BF16 -Inf
    tensors[name] = (dtype, shape, values.tobytes())
    return name


def test_nan_in_a_copied_float_tensor_is_carried_and_recognised(fixture_copy, tmp_path):
    """Decision: convert copies FLOAT tensors as they are, NaN included (a real checkpoint may hold
    them), records them in the provenance, and verify accepts exactly those (and no others)."""
    src = fixture_copy(DENSE)
    tensors = load_shard(src / "model.safetensors")
    name = _nan_in_norm(tensors)
    save_tensors(src / "model.safetensors", tensors)
    out = tmp_path / "out"
    assert convert_json(src, out).exit_code == 0
    provenance = json.loads((out / PROVENANCE).read_text())
    assert provenance["source_nonfinite"] == {name: 4}
    for extra in ((), ("--source", src, "--exact")):
        result = invoke("verify", out, "--json", *extra)
        assert result.exit_code == 0, result.stdout
        payload = next(c for c in json.loads(result.stdout)["checks"] if c["name"] == "payload")
        assert "the 4 NaN/Inf values in 1 FLOAT tensor the source held" in payload["detail"]

    # one more NaN in the package, checksum resealed: no longer what the source held
    from ascendconv.io.safetensors import read_header

    shard = next(out.glob("quant_model_weights*.safetensors"))
    entry = read_header(shard).tensors[name]
    raw = bytearray(shard.read_bytes())
    raw[entry.offset + 8 : entry.offset + 10] = b"\xc0\x7f"
    shard.write_bytes(bytes(raw))
    import hashlib

    provenance["shards"][shard.name] = {"sha256": hashlib.sha256(bytes(raw)).hexdigest()}
    provenance["checksum"] = "sha256"
    (out / PROVENANCE).write_text(json.dumps(provenance))
    result = invoke("verify", out, "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 1 and "payload" in report["failed"]
    payload = next(c for c in report["checks"] if c["name"] == "payload")
    assert any("holds 5 NaN/Inf values; the source held 4" in p for p in payload["problems"])


def test_nonfinite_count_reads_bits():
    import ml_dtypes

    from ascendconv.io.safetensors import nonfinite_count

    for dtype, np_dtype in (("BF16", ml_dtypes.bfloat16), ("F16", np.float16), ("F32", np.float32), ("F64", np.float64)):
        values = np.array([0.0, -1.5, np.nan, np.inf, -np.inf, 3.0, -np.nan], dtype=np_dtype)
        assert nonfinite_count(values.tobytes(), dtype) == 4, dtype
    assert nonfinite_count(bytes([0xFF] * 8), "U8") == 0


@pytest.mark.parametrize("depth", [65, 900])
def test_json_nested_past_the_bound_is_refused(fixture_copy, package_copy, tmp_path, depth):
    """Deep enough to parse, too deep to trust every later walk of it (repr, dumps, rendering)."""
    src = fixture_copy(DENSE)
    (src / "config.json").write_text(json.dumps({**json.loads((src / "config.json").read_text()), "x": 0})[:-1] + ', "y": ' + _deep(depth) + "}")
    result = convert_json(src, tmp_path / "out")
    assert result.exit_code == 3 and json_error(result)["error"] == "ConfigError"
    assert "nested more than 64 levels deep" in json_error(result)["message"]
    pkg = package_copy()
    (pkg / PROVENANCE).write_text('{"version": ' + _deep(depth) + "}")
    for command in ("verify", "inspect"):
        result = invoke(command, pkg, "--json")
        assert_clean(result, command)
        assert result.exit_code == 3 and json_error(result)["error"] == "PackageError"


def test_json_nesting_of_real_files_is_far_below_the_bound():
    from ascendconv.io.files import MAX_JSON_DEPTH, json_depth

    for path in FIXTURES.rglob("*.json"):
        assert json_depth(json.loads(path.read_text())) <= 6 < MAX_JSON_DEPTH, path


@given(st.lists(st.sampled_from([b"{", b"[", b"}", b"a", b"\"", b"{["]), max_size=40).map(b"".join), st.integers(0, 12))
def test_more_brackets_than_counts_both_openers_against_the_limit(data, limit):
    """The early-stopping search says what counting every '{' and '[' says."""
    from ascendconv.io.files import more_brackets_than

    assert more_brackets_than(data, limit) == (data.count(b"{") + data.count(b"[") > limit)


def test_output_under_a_file_is_refused(fixture_copy, tmp_path):
    (tmp_path / "afile").write_text("x")
    result = convert_json(fixture_copy(DENSE), tmp_path / "afile" / "sub" / "out")
    assert result.exit_code == 2 and json_error(result)["error"] == "OutputPathError"
    assert "afile is not a directory" in json_error(result)["message"]
    assert (tmp_path / "afile").read_text() == "x"
