"""Threads the commands start, and which limit it is when one cannot start.

CPython says only "can't start new thread" (a RuntimeError) for whatever pthread_create refused
(EAGAIN): an address space too small for another thread's stack (ulimit -v) and this user's count
of processes and threads reached (ulimit -u) alike. A stack that cannot be mapped now proves the
first; this user's threads, counted in /proc, at the limit prove the second.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from pathlib import Path
from typing import Iterator

from ascendconv.errors import OutOfMemoryError, TooManyThreadsError
from ascendconv.io.libraries import address_space_limit, address_space_words, mappable

CANNOT_START = "can't start new thread"  # CPython's words (threading.Thread.start)
# glibc's thread stack where ulimit -s is unlimited (x86-64's default; no platform's is smaller)
UNLIMITED_STACK_BYTES = 2 * 2**20
FEWER_WORKERS = "or use fewer --workers"


@contextlib.contextmanager
def threads_started(workers_option: bool = True) -> Iterator[None]:
    """Raise the named error of the limit in effect for a thread the block could not start.
    `workers_option`: the command has --workers, which the hint then offers (verify and assemble
    have none)."""
    try:
        yield
    except RuntimeError as exc:
        if str(exc) != CANNOT_START:
            raise
        raise thread_limit_error(workers_option) from exc


def thread_limit_error(workers_option: bool = True) -> OutOfMemoryError | TooManyThreadsError:
    """The named error for a thread that did not start, naming the limit that stopped it."""
    fewer = f", {FEWER_WORKERS}" if workers_option else ""
    address_space = address_space_limit()
    stack = thread_stack_bytes()
    if address_space is not None and not mappable(stack):
        return OutOfMemoryError(
            f"cannot start another thread: {address_space_words(address_space)} leaves no room for its "
            f"{stack / 2**20:.1f} MiB stack",
            f"raise the limit (ulimit -v unlimited, or higher){fewer}",
        )
    processes = process_limit()
    if processes is not None:
        running = user_threads(os.getuid())
        if running is None or running >= processes:
            return TooManyThreadsError(
                f"cannot start another thread: this user may run {processes} processes and threads at once "
                f"(ulimit -u {processes})" + (f", and {running} are running" if running is not None else ""),
                f"raise the limit (ulimit -u){fewer}",
            )
    limits = [f"ulimit -v {address_space // 1024}"] if address_space is not None else []
    limits += [f"ulimit -u {processes}"] if processes is not None else []
    return TooManyThreadsError(
        "cannot start another thread: the system refused it, and no limit of this process"
        + (f" ({', '.join(limits)})" if limits else "") + " is what stopped it; the system's threads-max "
        "(sysctl kernel.threads-max) or a cgroup's pids.max may be reached",
        f"raise the limit that is reached{fewer}",
    )


def process_limit() -> int | None:
    """The processes and threads this user may run at once (RLIMIT_NPROC, ulimit -u), or None where
    none holds: unlimited, or root, whom the kernel does not hold to it."""
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    return None if soft == resource.RLIM_INFINITY or os.getuid() == 0 else soft


def thread_stack_bytes() -> int:
    """The stack a new thread maps: the size Python was told, else glibc's default, ulimit -s."""
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    return threading.stack_size() or (UNLIMITED_STACK_BYTES if soft == resource.RLIM_INFINITY else soft)


def user_threads(uid: int) -> int | None:
    """Threads of the processes whose real user is `uid` that this system shows (/proc), or None
    without /proc."""
    proc = Path("/proc")
    if not (proc / "self" / "status").is_file():
        return None
    total = 0
    for status in proc.glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            owner, threads = int(fields["Uid"].split()[0]), int(fields["Threads"])
        except (OSError, KeyError, IndexError, ValueError):  # ended meanwhile, or fields of another kernel
            continue
        if owner == uid:
            total += threads
    return total
