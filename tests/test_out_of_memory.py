"""Running out of memory is this machine's problem, not the input's: OutOfMemoryError (exit 4),
naming what was being done and how to fix it; never a traceback, never "damaged input"."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from ascendconv import pipeline
from ascendconv.cli import app
from ascendconv.errors import OutOfMemoryError
from conftest import FIXTURES, write_large_checkpoint

runner = CliRunner()
DENSE = FIXTURES / "qwen3-dense-fp8"


def failing_copy(name: str):
    def copy(data):
        raise MemoryError("Unable to allocate 64.0 MiB for an array with shape (67108864,) and data type uint8")

    return copy


def test_a_worker_out_of_memory_names_the_tensor_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "_copy_op", failing_copy)
    result = runner.invoke(app, ["convert", str(DENSE), str(tmp_path / "out"), "--quiet"])
    assert result.exit_code == 4, result.output
    assert "Traceback" not in result.output and (result.exception is None or isinstance(result.exception, SystemExit))
    assert "error: no memory left to convert tensor 'lm_head.weight' of " in result.stderr
    assert f"{DENSE / 'model.safetensors'} (Unable to allocate 64.0 MiB" in result.stderr
    assert "hint: free memory, raise the limit (ulimit -v), or use fewer --workers" in result.stderr
    assert "damaged" not in result.stderr and "cut short" not in result.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())

    as_json = runner.invoke(app, ["convert", str(DENSE), str(tmp_path / "out"), "--json"])
    error = json.loads(as_json.stdout.strip().splitlines()[0])
    assert (error["error"], error["exit_code"]) == ("OutOfMemoryError", 4) and "lm_head.weight" in error["message"]


def test_out_of_memory_anywhere_else_is_the_same_named_error(converted, monkeypatch):
    """verify and assemble reach no pipeline: the CLI's one net names the command."""
    from ascendconv.verify import layout

    pkg = converted("qwen3-dense-fp8")

    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(layout._Layout, "__init__", no_memory)
    result = runner.invoke(app, ["verify", str(pkg), "--quiet"])
    assert result.exit_code == 4 and "error: no memory left to verify" in result.stderr, result.output
    assert "Traceback" not in result.output and "hint: free memory" in result.stderr


LIMITED = """
import resource, sys
import numpy  # before the limit: what is limited is the conversion's own allocations
from ascendconv.cli import app
size = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmSize:"))) * 1024
limit = size + int(sys.argv[1]) * 2**20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
app(sys.argv[2:])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status are Linux's")
def test_a_real_process_under_an_address_space_limit_fails_named(tmp_path):
    """convert under RLIMIT_AS a little above what it has mapped once started: numpy's allocations
    (or, where the mappings fall otherwise, a worker thread's stack) fail inside the conversion,
    which must end with exit 4 and the named error."""
    src = write_large_checkpoint(tmp_path / "src")
    env = {**os.environ, "MALLOC_ARENA_MAX": "1", "COLUMNS": "200"}  # one malloc arena: threads map no 64 MB each
    codes = []
    for headroom_mb in (96, 128, 160):
        out = tmp_path / f"out-{headroom_mb}"
        done = subprocess.run([sys.executable, "-c", LIMITED, str(headroom_mb), "convert", str(src), str(out),
                               "--kernel", "reference", "--workers", "1", "--quiet"],
                              capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode in (0, 4), done.stderr[-2000:]
        assert "Traceback" not in done.stderr and "cut short" not in done.stderr and "damaged" not in done.stderr
        if done.returncode == 4:  # an allocation fails first, or a thread's stack does not fit: both named
            allocation = "error: no memory left to convert" in done.stderr and "hint: free memory" in done.stderr
            stack = "error: cannot start another thread: this process's address-space limit" in done.stderr
            assert allocation or stack, done.stderr
            assert not out.exists()
        codes.append(done.returncode)
    assert 4 in codes, "no limit made the conversion run out of memory: the test measured nothing"



# --- the compiled kernels' libraries under `ulimit -v` -----------------------------------------

KERNELS_LIMITED = """
import resource, sys
# all but numba before the limit: what is limited is the kernels' load (llvmlite maps 150 MiB)
import numpy, ascendconv.convert, ascendconv.pipeline, ascendconv.cli.render.convert
from ascendconv.cli import app
size = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmSize:"))) * 1024
limit = size + int(sys.argv[1]) * 2**20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
print("LIMIT", limit, file=sys.stderr)
app(sys.argv[2:])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status are Linux's")
def test_an_address_space_too_small_for_the_kernels_is_out_of_memory_not_a_file_error(tmp_path):
    """dlopen of llvmlite's library (or of an extension numba imports) failing under `ulimit -v`:
    FileSystemError 'a file: Could not find/load shared object file ...' with the hint to check the
    disk, or, inside numba's import, a traceback and exit 1."""
    env = {**os.environ, "MALLOC_ARENA_MAX": "1", "COLUMNS": "200"}
    seen = []
    for headroom_mb in (128, 96, 160, 64, 192):  # what the run maps before the kernels varies by machine
        out = tmp_path / f"out-{headroom_mb}"
        done = subprocess.run([sys.executable, "-c", KERNELS_LIMITED, str(headroom_mb), "convert", str(DENSE), str(out),
                               "--json"], capture_output=True, text=True, timeout=300, env=env)
        error = json.loads(done.stdout) if done.stdout.startswith("{") else {}
        seen.append((headroom_mb, done.returncode, error.get("error"), error.get("message", done.stderr[-300:])))
        if "too small for the compiled kernels" not in error.get("message", ""):
            continue
        limit = int(next(line.split()[1] for line in done.stderr.splitlines() if line.startswith("LIMIT ")))
        assert (done.returncode, error["error"], error["exit_code"]) == (4, "OutOfMemoryError", 4)
        assert error["message"].startswith(
            f"this process's address-space limit (ulimit -v {limit // 1024}: {limit / 2**20:.1f} MiB) is too small "
            "for the compiled kernels: ")
        assert ".so did not load, and the " in error["message"] and "MiB it maps do not fit in what is left" in error["message"]
        assert error["hint"] == "raise the limit (ulimit -v unlimited, or higher) and run the command again"
        assert "error: this process's address-space limit" in done.stderr and "FileSystemError" not in done.stderr
        assert [p.name for p in tmp_path.iterdir() if out.name in p.name] == []  # no OUT, no staging beside it
        return
    pytest.fail(f"no limit stopped the run at the kernels' load: {seen}")


def elf_with_loads(path, *loads: tuple[int, int]) -> None:
    """A 64-bit little-endian ELF header and program headers alone: PT_LOAD (vaddr, memsz) each."""
    import struct

    header = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 64, 0, 0, 64, 56, len(loads), 0, 0, 0)
    table = b"".join(struct.pack("<IIQQQQQQ", 1, 5, 0, vaddr, vaddr, 0, memsz, 4096) for vaddr, memsz in loads)
    path.write_bytes(header + table)


@pytest.fixture
def address_space_left():
    """Lower this process's soft RLIMIT_AS to what it has mapped plus N MiB, for the test's body."""
    import resource

    kept = resource.getrlimit(resource.RLIMIT_AS)

    def limit(mib: int) -> int:
        size = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmSize:"))) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + mib * 2**20, kept[1]))
        return size + mib * 2**20

    yield limit
    resource.setrlimit(resource.RLIMIT_AS, kept)


def dlopen_failure(path) -> OSError:
    """llvmlite's OSError, raised while ctypes' dlopen's one (naming the library) was handled."""
    try:
        try:
            raise OSError(f"{path}: failed to map segment from shared object")
        except OSError:
            raise OSError("Could not find/load shared object file 'libllvmlite.so' from resource location: 'llvmlite.binding'.")
    except OSError as exc:
        return exc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status are Linux's")
def test_only_a_library_the_address_space_cannot_hold_is_blamed_on_the_limit(tmp_path, address_space_left):
    """The same dlopen words come from a noexec mount, a missing file, a library that fits: those
    stay the errors they were (FileSystemError, the ImportError), never 'ulimit -v'."""
    from ascendconv.io.libraries import address_space_too_small, loaded_span

    library = tmp_path / "libbig.so"
    elf_with_loads(library, (0, 4096), (256 * 2**20, 4096))  # a 4 KiB file spanning 256 MiB
    assert loaded_span(str(library)) == 256 * 2**20 + 4096
    assert address_space_too_small(dlopen_failure(library), "the compiled kernels") is None  # no limit in effect

    limit = address_space_left(64)
    named = address_space_too_small(dlopen_failure(library), "the compiled kernels")
    as_import = address_space_too_small(ImportError("failed to map segment", path=str(library)), "the compiled kernels")
    missing = address_space_too_small(dlopen_failure(tmp_path / "gone.so"), "the compiled kernels")
    (tmp_path / "script.so").write_text("not ELF")
    not_elf = address_space_too_small(dlopen_failure(tmp_path / "script.so"), "the compiled kernels")
    address_space_left(1024)
    fits = address_space_too_small(dlopen_failure(library), "the compiled kernels")

    assert isinstance(named, OutOfMemoryError) and named.exit_code == 4
    assert named.message == (
        f"this process's address-space limit (ulimit -v {limit // 1024}: {limit / 2**20:.1f} MiB) is too small for the "
        f"compiled kernels: {library} did not load, and the 256.0 MiB it maps do not fit in what is left")
    assert as_import is not None and as_import.message == named.message
    assert (missing, not_elf, fits) == (None, None, None)


def failing_start(monkeypatch, fails):
    """threading.Thread.start raising CPython's RuntimeError for the threads `fails(thread)` picks, as
    pthread_create's EAGAIN does (ulimit -v, ulimit -u); every other thread starts."""
    import threading

    real = threading.Thread.start

    def start(thread):
        if fails(thread):
            raise RuntimeError("can't start new thread")
        return real(thread)

    monkeypatch.setattr(threading.Thread, "start", start)


PIPELINE_THREADS = {
    "reader": lambda t: getattr(t, "_target", None) is not None and t._target.__name__ == "read_ahead",
    "source hasher": lambda t: t.name == "ascendconv-source-hash",
    "worker": lambda t: t.name.startswith("ThreadPoolExecutor"),
}


THREAD_LIMITS = ["address space", "processes"]


def thread_limit_in_effect(monkeypatch, limit: str) -> None:
    """The limit the named error finds for a thread that did not start: `ulimit -v 500000`, too small
    for its stack, or `ulimit -u 6` with 6 of this user's processes and threads running."""
    from ascendconv.io import threads

    if limit == "address space":
        monkeypatch.setattr(threads, "address_space_limit", lambda: 500000 * 1024)
        monkeypatch.setattr(threads, "mappable", lambda size: size != threads.thread_stack_bytes())
    else:
        monkeypatch.setattr(threads, "address_space_limit", lambda: None)
        monkeypatch.setattr(threads, "process_limit", lambda: 6)
        monkeypatch.setattr(threads, "user_threads", lambda uid: 6)


def assert_thread_limit_named(result, command: str, limit: str, fewer_workers: str) -> None:
    """`command --json` ended with exit 4 and the envelope of the limit `thread_limit_in_effect` set;
    `fewer_workers` ends the hint (", or use fewer --workers" where the command has that option)."""
    from ascendconv.io import threads

    assert result.exit_code == 4, result.output
    assert "Traceback" not in result.output
    error = json.loads(result.stdout)
    assert (error["ok"], error["command"], error["exit_code"]) == (False, command, 4)
    stack = threads.thread_stack_bytes() / 2**20
    if limit == "address space":
        assert error["error"] == "OutOfMemoryError"
        assert error["message"] == (
            "cannot start another thread: this process's address-space limit (ulimit -v 500000: 488.3 MiB) leaves no "
            f"room for its {stack:.1f} MiB stack"
        )
        assert error["hint"] == f"raise the limit (ulimit -v unlimited, or higher){fewer_workers}"
    else:
        assert error["error"] == "TooManyThreadsError"
        assert error["message"] == (
            "cannot start another thread: this user may run 6 processes and threads at once (ulimit -u 6), and 6 are running"
        )
        assert error["hint"] == f"raise the limit (ulimit -u){fewer_workers}"


@pytest.mark.parametrize("thread", PIPELINE_THREADS)
@pytest.mark.parametrize("limit", THREAD_LIMITS)
def test_a_pipeline_thread_that_cannot_start_is_the_named_limit_and_nothing_is_written(tmp_path, monkeypatch, thread, limit):
    """Under `ulimit -v 500000` or `650000` (here) a convert of the dense fixture ended in a traceback,
    'RuntimeError: can't start new thread', exit 1, from the reader's start or the pool's submit;
    under `ulimit -u 6` as a user other than root, the same from the source hasher's."""
    thread_limit_in_effect(monkeypatch, limit)
    failing_start(monkeypatch, PIPELINE_THREADS[thread])
    result = runner.invoke(app, ["convert", str(DENSE), str(tmp_path / "out"), "--workers", "2", "--json"])
    assert_thread_limit_named(result, "convert", limit, ", or use fewer --workers")
    assert list(tmp_path.iterdir()) == []  # no OUT, no staging, no lock


def is_read_ahead(thread) -> bool:
    return thread.name == "ascendconv-read-ahead"


def is_pool_worker(thread) -> bool:
    return thread.name.startswith("ThreadPoolExecutor")


VERIFY_THREADS = {  # the options that start it, and the thread
    "shard hash read-ahead": ([], is_read_ahead),
    "source comparison worker": (["--source", str(DENSE)], is_pool_worker),
}


@pytest.mark.parametrize("thread", VERIFY_THREADS)
@pytest.mark.parametrize("limit", THREAD_LIMITS)
def test_a_verify_thread_that_cannot_start_is_the_named_limit(converted, monkeypatch, thread, limit):
    """verify ended in a traceback, 'RuntimeError: can't start new thread', exit 1, where the thread
    that reads a shard ahead of its hash or a worker comparing it with --source could not start. Its
    hint offers no fewer --workers: verify has no such option."""
    pkg = converted("qwen3-dense-fp8")
    options, fails = VERIFY_THREADS[thread]
    thread_limit_in_effect(monkeypatch, limit)
    failing_start(monkeypatch, fails)
    result = runner.invoke(app, ["verify", str(pkg), *options, "--json"])
    assert_thread_limit_named(result, "verify", limit, "")


@pytest.fixture(scope="module")
def dense_part(tmp_path_factory):
    """The dense fixture converted as part 1/1: all there is to assemble."""
    from ascendconv.convert import ConvertOptions, convert

    part = tmp_path_factory.mktemp("part") / "p1"
    convert(DENSE, part, ConvertOptions(part=(1, 1)))
    return part


ASSEMBLE_THREADS = {"shard hash worker": is_pool_worker, "shard hash read-ahead": is_read_ahead}


@pytest.mark.parametrize("thread", ASSEMBLE_THREADS)
@pytest.mark.parametrize("limit", THREAD_LIMITS)
def test_an_assemble_thread_that_cannot_start_is_the_named_limit_and_nothing_is_written(
    dense_part, tmp_path, monkeypatch, thread, limit
):
    """assemble ended in a traceback, 'RuntimeError: can't start new thread', exit 1, where a worker
    checking the parts' shards, or the thread reading a shard ahead of its hash, could not start."""
    thread_limit_in_effect(monkeypatch, limit)
    failing_start(monkeypatch, ASSEMBLE_THREADS[thread])
    result = runner.invoke(app, ["assemble", str(tmp_path / "pkg" / "out"), str(dense_part), "--json"])
    assert_thread_limit_named(result, "assemble", limit, "")
    assert list(tmp_path.iterdir()) == []  # no OUT, no staging, no lock, not even OUT's parent


def test_a_thread_that_cannot_start_under_no_limit_names_the_system_s(monkeypatch):
    from ascendconv.errors import TooManyThreadsError
    from ascendconv.io import threads

    monkeypatch.setattr(threads, "address_space_limit", lambda: None)
    monkeypatch.setattr(threads, "process_limit", lambda: None)
    error = threads.thread_limit_error()
    assert isinstance(error, TooManyThreadsError) and error.exit_code == 4
    assert error.message == (
        "cannot start another thread: the system refused it, and no limit of this process is what stopped it; "
        "the system's threads-max (sysctl kernel.threads-max) or a cgroup's pids.max may be reached"
    )
    assert error.hint == "raise the limit that is reached, or use fewer --workers"
    assert threads.thread_limit_error(workers_option=False).hint == "raise the limit that is reached"


def test_only_can_t_start_new_thread_is_taken_for_a_limit():
    from ascendconv.io.threads import threads_started

    with pytest.raises(RuntimeError, match="^cannot schedule new futures after shutdown$"):
        with threads_started():
            raise RuntimeError("cannot schedule new futures after shutdown")


def test_a_direct_shard_sink_whose_write_thread_cannot_start_stops_its_checksum_thread(tmp_path, monkeypatch):
    """The checksum thread started first was left waiting for ever, the shard file open."""
    import threading

    from ascendconv.io import threads
    from ascendconv.io.writer import _DirectSink

    monkeypatch.setattr(threads, "address_space_limit", lambda: 500000 * 1024)
    monkeypatch.setattr(threads, "mappable", lambda size: False)
    failing_start(monkeypatch, lambda t: t.name.startswith("write "))
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OutOfMemoryError, match="^cannot start another thread: this process's address-space limit"):
        _DirectSink(tmp_path / "shard.safetensors")
    assert [t.name for t in threading.enumerate() if t.name.endswith(" shard.safetensors")] == []
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_real_address_space_limit_too_small_for_a_thread_s_stack_is_named(tmp_path):
    """A real limit, set just above what the process maps, for the proof that its stack cannot be mapped."""
    code = (
        "import json, resource, threading\n"
        "from ascendconv.io.threads import threads_started\n"
        "from ascendconv.errors import AscendconvError\n"
        "size = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize:')).split()[1]) * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size + 2**20, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    with threads_started():\n"
        "        threading.Thread(target=print).start()\n"
        "except AscendconvError as exc:\n"
        "    print(json.dumps([type(exc).__name__, exc.exit_code, exc.message, size + 2**20]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(FIXTURES.parent)})
    name, code_, message, limit = json.loads(done.stdout)
    assert (name, code_) == ("OutOfMemoryError", 4), done.stderr
    assert message.startswith(
        f"cannot start another thread: this process's address-space limit (ulimit -v {limit // 1024}: "
    ) and message.endswith(" MiB stack")


THREADS_LIMITED = """
import resource, sys, threading
import numpy, ascendconv.verify, ascendconv.assemble, ascendconv.cli.verify, ascendconv.cli.assemble
from ascendconv.cli import app
if sys.argv[1] == "processes":  # one process and no thread more for this user
    resource.setrlimit(resource.RLIMIT_NPROC, (1, resource.getrlimit(resource.RLIMIT_NPROC)[1]))
else:  # a thread's stack the limit cannot hold, where all else the command maps fits
    threading.stack_size(1024 * 2**20)
    size = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmSize:"))) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + 512 * 2**20, size + 512 * 2**20))
app(sys.argv[2:])
"""

THREADS_OF = {  # the arguments after the package or part (assemble: OUT first), and the thread that does not start
    "verify": ["--json"],  # the shard hash's read-ahead
    "verify --source": ["--source", str(DENSE), "--no-checksums", "--json"],  # a comparison worker
    "assemble": ["--json"],  # a worker hashing the part's shards
}


# Not verify --source under `ulimit -u 1`: it hashes the source's sampled windows before its workers
# start, and BLAKE3's own thread pool (Rust's, not CPython's) cannot start either, a panic of blake3.
REAL_THREAD_LIMITS = [(limit, command) for limit in THREAD_LIMITS for command in THREADS_OF
                      if (limit, command) != ("processes", "verify --source")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status are Linux's")
@pytest.mark.parametrize(("limit", "command"), REAL_THREAD_LIMITS)
def test_verify_and_assemble_under_a_real_thread_limit_fail_named(converted, dense_part, tmp_path, limit, command):
    """The same commands in a process under a real `ulimit -v` (with a stack it cannot hold) or
    `ulimit -u 1`: a traceback and exit 1 before. The kernel holds root to no `ulimit -u`."""
    if limit == "processes" and os.getuid() == 0:
        pytest.skip("root is held to no limit of processes (ulimit -u)")
    out = tmp_path / "pkg" / "out"
    given = [str(out), str(dense_part)] if command == "assemble" else [str(converted("qwen3-dense-fp8"))]
    done = subprocess.run([sys.executable, "-c", THREADS_LIMITED, limit, command.split()[0], *given, *THREADS_OF[command]],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "MALLOC_ARENA_MAX": "1"})
    assert done.returncode == 4 and "Traceback" not in done.stderr, done.stderr[-2000:]
    error = json.loads(done.stdout)
    assert (error["command"], error["exit_code"]) == (command.split()[0], 4)
    if limit == "address space":
        assert error["error"] == "OutOfMemoryError"
        assert error["message"].startswith("cannot start another thread: this process's address-space limit (ulimit -v ")
        assert error["message"].endswith(" leaves no room for its 1024.0 MiB stack")
        assert error["hint"] == "raise the limit (ulimit -v unlimited, or higher)"
    else:
        assert error["error"] == "TooManyThreadsError"
        assert error["message"].startswith(
            "cannot start another thread: this user may run 1 processes and threads at once (ulimit -u 1), and ")
        assert error["hint"] == "raise the limit (ulimit -u)"
    assert not (tmp_path / "pkg").exists()
