"""The output directory's life: checks, a lock, a private staging directory, the atomic publish.

A package appears at OUT only whole: it is built in a hidden sibling `.NAME.ascendconv-staging-<random>`
and renamed into place (with --overwrite, exchanged with the old package in one step where Linux can:
OUT is never missing). A lock file beside OUT (`.NAME.ascendconv-lock`, held with flock) makes a
second run to the same OUT fail at once instead of silently replacing the first one's work; flock
works across PID namespaces and dies with its holder. Whoever holds the lock may remove staging and
old-package remains that a dead process left (SIGKILL, power loss), once no part run still writes in
them: the --ray tasks of a driver killed with SIGKILL go on in its staging, holding their part
directories' locks, until Ray stops them.

`--overwrite` never deletes what it does not recognise: OUT must be empty or an earlier package
(flat, regular files, a package description), and must neither contain nor lie inside the source.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import re
import secrets
import shutil
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, NoReturn

from ascendconv.errors import (
    AscendconvError,
    Interrupted,
    OutputBusyError,
    OutputExistsError,
    OutputPathError,
    OutputWriteError,
    UnsafeOutputError,
    shown,
)
from ascendconv.io.files import identity, is_within
from ascendconv.io.output import LEAVE_IN_PLACE, check_output_path, check_replaceable, directory_gone

STAGING_TAG = ".ascendconv-staging-"
OLD_TAG = ".ascendconv-old-"
LOCK_TAG = ".ascendconv-lock"
LEGACY_TAGS = (".ascendconv-partial-",)  # staging names of 0.1.0, which used the PID
INTERRUPTING_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def check_output_early(out: Path, check: Callable[[], None]) -> None:
    """Refuse OUT before the input is read (convert's source, its dry run's and --ray's, assemble's
    parts): a path that cannot be made or replaced first (names too long for the file system make
    stat() itself fail in the rest), then a run holding OUT's lock, then `check` of what is there.
    Each is decided again under the lock; this only spares a run the work before a refusal."""
    check_output_path(out)
    OutputLock(out).probe()
    check()


def looks_like_package(path: Path, marker: str) -> bool:
    """An earlier package: flat, regular files only, with its description `marker` among them."""
    entries = list(path.iterdir())
    return any(e.name == marker for e in entries) and all(e.is_file() and not e.is_symlink() for e in entries)


def check_output(out: Path, source_root: Path, overwrite: bool, marker: str, source: str = "source") -> None:
    """Refuse an OUT that would lose data: the source (what the messages call `source`: assemble's
    are parts), its ancestors or descendants, a mount point, the filesystem root or home, a symlink,
    or (with --overwrite) a directory that is not a package; and one that no package can replace
    (immutable or append-only)."""
    real_out = Path(os.path.realpath(out))
    real_src = Path(os.path.realpath(source_root))
    shown = f"{out}" + (f" (= {real_out})" if str(real_out) != str(out.absolute()) else "")
    if real_out == Path(real_out.anchor) or real_out == Path(os.path.realpath(Path.home())):
        raise UnsafeOutputError(f"{shown}: the output directory is the filesystem root or the home directory")
    if real_out == real_src:  # --overwrite cannot help: the source is never replaced
        raise OutputExistsError(f"{shown}: the output directory is the {source} directory", f"choose an OUT other than the {source}")
    if is_within(real_src, real_out):
        raise UnsafeOutputError(f"{shown}: the output directory contains the {source} {source_root}",
                                 f"choose a new or empty directory outside the {source}")
    if is_within(real_out, real_src):
        raise UnsafeOutputError(f"{shown}: the output directory lies inside the {source} {source_root}",
                                 f"choose a new or empty directory outside the {source}")
    # What is at OUT is checked as one directory: a run publishing there meanwhile (--overwrite swaps
    # its package in) made the steps below read the old package and the new one by turns, and refuse
    # a sound package as none (a file listed in the old one missing from the new), so a step whose
    # OUT was replaced under it is checked again against what is there now.
    while True:
        was = identity(out, follow=False)
        try:
            _check_present(out, overwrite, marker)
        except (AscendconvError, OSError):
            if identity(out, follow=False) != was:
                continue
            raise
        if identity(out, follow=False) == was:
            return


def _check_present(out: Path, overwrite: bool, marker: str) -> None:
    """check_output's refusals of what is at OUT, one after another."""
    if out.is_symlink():
        raise UnsafeOutputError(f"{out}: is a symbolic link to {os.readlink(out)}", "pass the real path as OUT")
    if not out.exists():
        return
    if not out.is_dir():  # --overwrite replaces only a package, never a file
        raise OutputExistsError(f"{out}: exists and is not a directory", "choose a new or empty directory as OUT")
    if os.path.ismount(out):
        raise UnsafeOutputError(f"{out}: is a mount point", "write the package into a new directory inside it")
    check_replaceable(out)  # the finished package replaces OUT: refused now, not then
    if not any(out.iterdir()):
        return
    if not overwrite:
        raise OutputExistsError(f"{out}: exists and is not empty")
    if not looks_like_package(out, marker):
        raise UnsafeOutputError(
            f"{out}: --overwrite replaces only an earlier package (flat, with {marker}), and this directory is not one",
            "remove it yourself if it should go, or choose another OUT",
        )


# --- signals ----------------------------------------------------------------------------------

_deferred: list[int] | None = None  # signals held back while a rename pair must not be split


_received: list[int] = []  # the last interrupting signal our handler saw


def _raise_interrupt(signum: int, frame) -> None:
    _received[:] = [signum]
    if _deferred is not None:
        _deferred.append(signum)
        return
    raise Interrupted(signum)


def raise_unheard_interrupt() -> None:
    """Interrupted if our handler saw a signal whose exception never reached the run: raised while
    Python ran a callback whose exceptions it ignores (an import lock's, a finalizer: "Exception
    ignored in ..."), it was lost, and the run went on to publish as if never interrupted."""
    if _received:
        raise Interrupted(_received[0])


def as_interrupt(exc: KeyboardInterrupt) -> Interrupted:
    """Our Interrupted for a KeyboardInterrupt that a library raised in its place (Ray's waits turn
    the one our handler raised into a plain one): the signal our handler last saw, else SIGINT."""
    if isinstance(exc, Interrupted):
        return exc
    return Interrupted(_received[0] if _received else signal.SIGINT)


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (what CI runners and `timeout` send) end the run the way SIGINT does: as an
    exception, so staging is removed and the message is true. Only the main thread can install signal
    handlers; elsewhere the caller's handling stays as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    _received.clear()
    for name in INTERRUPTING_SIGNALS:
        number = getattr(signal, name)
        current = signal.getsignal(number)
        if current in (signal.SIG_DFL, signal.default_int_handler):
            previous[number] = signal.signal(number, _raise_interrupt)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def interruptible(out: Path) -> Iterator[None]:
    """signals_interrupt around a whole command that writes OUT: an interrupt before its StagedOutput
    exists (while planning, or compiling kernels) ends the run as a later one does, saying that
    nothing was written."""
    with signals_interrupt():
        try:
            yield
        except KeyboardInterrupt as exc:
            if getattr(exc, "outcome", None) is None:
                exc.outcome = f"nothing was written at {out}"  # type: ignore[attr-defined]
            raise


@contextlib.contextmanager
def signals_kept() -> Iterator[None]:
    """Whatever a library installs for the interrupting signals inside (Ray's driver puts its own
    SIGTERM handler, which exits 1 with a dump), ours are back on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {getattr(signal, name): signal.getsignal(getattr(signal, name)) for name in INTERRUPTING_SIGNALS}
    try:
        yield
    finally:
        for number, handler in kept.items():
            if handler is not None:
                signal.signal(number, handler)


@contextlib.contextmanager
def signals_deferred(deliver: bool = True) -> Iterator[None]:
    """Hold interrupting signals back for a few system calls, then deliver the first one (or, while
    already failing, drop them: the run is ending anyway)."""
    global _deferred
    if _deferred is not None:
        yield
        return
    _deferred = []
    try:
        yield
    finally:
        held, _deferred = _deferred, None
        if held and deliver:
            raise Interrupted(held[0])


# --- the staged output --------------------------------------------------------------------------


def _make_parents(directory: Path) -> list[tuple[Path, tuple[int, int] | None]]:
    """mkdir -p, returning the directories it created, outermost first, each with its identity (so
    that it is removed only while it is the one made). One that another process creates meanwhile (a
    run to a sibling OUT: the part jobs of one matrix) is used, not ours to remove."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    created = []
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            if path.is_dir() and not path.is_symlink():
                continue
            raise
        created.append((path, identity(path, follow=False)))
    return created


def where_now(fd: int, recorded: Path) -> Path | None:
    """The path naming the file or directory open as `fd`: `recorded` while it still does, else the
    one Linux's /proc gives (it was renamed or moved, or a directory above it was); None once it is
    removed, or moved where this system cannot tell."""
    st = os.fstat(fd)
    for path in (recorded, _proc_path(fd)):
        if path is not None and identity(path, follow=False) == (st.st_dev, st.st_ino):
            return path
    return None


def _proc_path(fd: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:  # no /proc
        return None


class OutputLock:
    """An exclusive, non-blocking flock on `.NAME.ascendconv-lock` beside OUT (`probe` only looks)."""

    def __init__(self, out: Path):
        self.path = out.parent / f".{out.name}{LOCK_TAG}"
        self.fd: int | None = None

    def acquire(self) -> None:
        while True:
            fd = self._open(os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                busy = self._busy(fd)
                os.close(fd)
                raise busy from None
            # A holder that finished between our open and our flock has unlinked the file we hold:
            # then the lock is on a dead inode, and we try again with the path's current file.
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {os.uname().nodename}\n".encode())
        self.fd = fd

    def probe(self) -> None:
        """OutputBusyError, as `acquire` would raise it, if a run holds the lock now; nothing is
        created or written. Advisory, so that a run is refused before its work rather than after it:
        the lock may be taken a moment later, and `acquire` decides. The shared lock held for that
        moment conflicts with a holder's exclusive one, not with another run's probe."""
        try:
            fd = self._open(os.O_RDONLY)
        except FileNotFoundError:  # no lock file (a holder's stays until it releases), or no parent yet
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise self._busy(fd) from None
        finally:
            os.close(fd)

    def _busy(self, fd: int) -> OutputBusyError:
        return OutputBusyError(
            f"{self.path.parent / self.path.name[1:-len(LOCK_TAG)]}: another ascendconv run{self.holder(fd)} is "
            f"writing this output (it holds {self.path})",
            "wait for it to finish, or choose another OUT",
        )

    @staticmethod
    def holder(fd: int) -> str:
        """' (pid P on HOST)' as the holder recorded it in the lock file, or '' (not written yet,
        or not what a run writes)."""
        try:
            words = os.pread(fd, 300, 0).decode("utf-8", "replace").split()
        except OSError:
            return ""
        if len(words) != 2 or not words[0].isdigit():
            return ""
        pid, host = words
        return f" (pid {pid}" + ("" if host == os.uname().nodename else f" on {shown(host)}") + ")"

    def _open(self, flags: int) -> int:
        """The lock file, opened without following a symlink and refused unless it is a regular file
        of ours alone: OUT's parent may be shared (/tmp, /models), and whoever can write there could
        otherwise point the lock's name at any file, which the truncate and write below would clobber.
        O_NONBLOCK keeps a FIFO planted under the name from blocking the open."""
        try:
            fd = os.open(self.path, flags | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self._refuse(f"a symbolic link (to {os.readlink(self.path)})")
            if exc.errno == errno.EISDIR:
                self._refuse("a directory")
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            if stat.S_ISDIR(st.st_mode):  # read-only (a probe), a directory opens without EISDIR
                self._refuse("a directory")
            self._refuse("not a regular file" if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} hard links")
        return fd

    def _refuse(self, what: str) -> NoReturn:
        raise UnsafeOutputError(
            f"{self.path}: the lock file is {what}, which a run never writes to",
            f"remove {self.path} if no ascendconv run is writing this output, or choose another OUT",
        )

    def release(self) -> None:
        if self.fd is None:
            return
        path = where_now(self.fd, self.path)  # beside OUT, or where OUT's directory was renamed to meanwhile
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        os.close(self.fd)
        self.fd = None


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def exchanged(a: Path, b: Path) -> bool:
    """Swap the directories `a` and `b` in one step (Linux renameat2 RENAME_EXCHANGE), so that
    neither name is ever missing: True, or False where the system or file system cannot (then the
    caller renames twice). Other failures are the OSError of the call."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


@functools.lru_cache(maxsize=1)
def _renameat2():
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library without it (glibc < 2.28, some musl)
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def stale_siblings(out: Path) -> list[Path]:
    """Staging and old-package directories of OUT that a dead run left behind."""
    tags = (STAGING_TAG, OLD_TAG, *LEGACY_TAGS)
    prefixes = tuple(f".{out.name}{tag}" for tag in tags)
    if not out.parent.is_dir():
        return []

    def ours(name: str) -> bool:
        # the tag and then only the random hex (or a legacy PID): a prefix alone would also take the
        # staging of another OUT whose name holds a tag ('a.ascendconv-staging-x'), which its own lock guards
        prefix = next((p for p in prefixes if name.startswith(p)), None)
        return prefix is not None and _RANDOM_PART.fullmatch(name[len(prefix):]) is not None

    return sorted(p for p in out.parent.iterdir() if ours(p.name) and p.is_dir() and not p.is_symlink())


_RANDOM_PART = re.compile("[0-9a-f]+")

# How long a run waits for the part runs still writing in a dead run's staging: the tasks of a --ray
# driver killed with SIGKILL go on until Ray stops them (measured: 0.1 s on a cluster the driver
# joined, 1.2 s where the driver had started Ray itself).
WRITER_WAIT_SECONDS = 30.0


def lock_holders(directory: Path) -> list[str]:
    """The runs holding the OUT locks inside `directory` (a --ray run's staging, whose part
    directories its tasks lock), each as ' (pid P on HOST)' or ''; a lock file nobody holds is left out."""
    holders = []
    for path in directory.glob(f".*{LOCK_TAG}"):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # gone meanwhile, or not a file
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holders.append(OutputLock.holder(fd))
        finally:
            os.close(fd)  # and with it the shared lock, if it was had
    return holders


class StagedOutput:
    """Build a package beside OUT and publish it whole; on any failure leave OUT as it was.

    with StagedOutput(out, check) as staged:
        ... write into staged.staging ...
        staged.publish()

    `check` runs under the lock (so that two runs cannot both find OUT free). `outcome` says, in words,
    what is at OUT after an interruption, for the message the user sees.

    With `resume` (a callable), the staging directory is kept when the run fails, and the next run
    adopts a kept one: the first stale staging sibling for which `resume(path)` is true becomes
    `staging` again (`resumed` says so); the others are removed as usual. `resume` may raise to refuse.
    `ledger` names the bookkeeping file of kept work (never part of the published package), and
    `notice` is told what the user would not otherwise see: kept work removed, old remains left.

    With `inside` (a directory's identity, `staging_identity` of the run a --ray task belongs to),
    OUT's directory must be that directory, and is never made: once the run has ended and its
    staging is gone, a task starting late writes nothing rather than make it again.
    """

    def __init__(
        self,
        out: Path,
        check,
        resume: Callable[[Path], bool] | None = None,
        ledger: str | None = None,
        notice: Callable[[str], None] | None = None,
        inside: tuple[int, int] | None = None,
    ):
        self.out = out
        self.inside = inside
        self.check = check
        self.resume = resume
        self.ledger = ledger
        self.notice = notice
        self.lock = OutputLock(out)
        self.created: list[tuple[Path, tuple[int, int] | None]] = []
        self.staging: Path | None = None
        self.staging_fd: int | None = None  # open on the staging, so that where_now finds it wherever it is moved
        self.resumed = False
        self.trash: Path | None = None
        self.published = False

    def __enter__(self) -> "StagedOutput":
        try:
            if self.inside is None:
                self.created = _make_parents(self.out.parent)
            elif identity(self.out.parent, follow=False) != self.inside:
                raise OutputWriteError(
                    f"{self.out.parent}: the staging directory of the run this part belongs to is gone (that run "
                    "ended, or OUT's directory was removed or renamed during it); the part was not written",
                    LEAVE_IN_PLACE,
                )
            self.lock.acquire()
            self.check()
            for stale in stale_siblings(self.out):
                self._wait_for_writers(stale)
                if self._adopt(stale):
                    self._stage(stale)
                    self.resumed = True
                else:
                    self._remove_stale(stale)
            if self.staging is None:
                staging = self.out.parent / f".{self.out.name}{STAGING_TAG}{secrets.token_hex(8)}"
                staging.mkdir()
                self._stage(staging)
        except BaseException as exc:
            self._clean_up(exc)
            raise
        return self

    def _stage(self, staging: Path) -> None:
        self.staging = staging
        self.staging_fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    @property
    def staging_identity(self) -> tuple[int, int]:
        """(device, inode) of the staging directory, whatever its path becomes."""
        assert self.staging_fd is not None
        st = os.fstat(self.staging_fd)
        return st.st_dev, st.st_ino

    def _wait_for_writers(self, stale: Path) -> None:
        """A dead run's staging may still be written: its --ray tasks outlive a driver killed with
        SIGKILL until Ray stops them. Removed under them, its files went as they wrote them (and the
        removal itself fails, ENOTEMPTY, should one create a file in between), so wait for them to end,
        WRITER_WAIT_SECONDS at most."""
        deadline = time.monotonic() + WRITER_WAIT_SECONDS
        told = False
        while holders := lock_holders(stale):
            if time.monotonic() >= deadline:
                raise OutputBusyError(
                    f"{stale}: an ascendconv part run{holders[0]} is still writing in this staging directory of an "
                    f"earlier run to {self.out} (a --ray task outliving its driver), after {WRITER_WAIT_SECONDS:g} s",
                    "wait for it to end or stop it, then run the same command again",
                )
            if not told and self.notice is not None:
                self.notice(f"waiting for the part runs{', '.join(holders)} still writing in {stale}, left by an earlier "
                            f"run to {self.out}, to end ({WRITER_WAIT_SECONDS:g} s at most)")
                told = True
            time.sleep(0.1)

    def _remove_stale(self, stale: Path) -> None:
        """Remove what a dead run left; kept --resume work (its ledger inside) not without saying so."""
        kept = self.ledger is not None and STAGING_TAG in stale.name and (stale / self.ledger).is_file()
        shutil.rmtree(self._set_aside(stale))  # a dead --ray run's task may yet start
        if kept and self.notice is not None:
            self.notice(
                f"removed {stale}: unfinished work an earlier --resume run kept for {self.out}"
                + ("; with --resume this run would have reused it" if self.resume is None else "")
            )

    def _adopt(self, stale: Path) -> bool:
        return (
            self.resume is not None and self.staging is None and STAGING_TAG in stale.name and self.resume(stale)
        )

    def publish(self) -> None:
        """Rename staging to OUT, if OUT is still as `check` found it when the run began: what was put
        there since is never replaced. The ledger is removed only once the package is in place, so
        that a failed rename leaves kept work resumable."""
        assert self.staging is not None
        try:
            self.check()
        except AscendconvError as exc:
            changed = f"{exc.message}: it changed while the package was being written, and is left as it is"
            raise type(exc)(changed, exc.hint) from None
        replacing = self.out.is_dir() and any(self.out.iterdir())
        raise_unheard_interrupt()
        with signals_deferred():  # the two renames: both or neither
            swapped = False
            trash = self.out.parent / f".{self.out.name}{OLD_TAG}{secrets.token_hex(8)}"
            try:
                if replacing:
                    # one step where the system can: OUT is never missing, so a reader of it (verify,
                    # inspect, a server starting) finds the old package or the new one, whole
                    swapped = exchanged(self.staging, self.out)
                    if not swapped:
                        self.out.rename(trash)
                    self.trash = trash
                if not swapped:
                    self.staging.rename(self.out)
            except OSError as exc:
                self._restore_old()
                raise self._not_published(exc) from exc
            if swapped:
                self._set_aside_old()
            self.published = True
            if self.ledger is not None:
                with contextlib.suppress(FileNotFoundError):
                    (self.out / self.ledger).unlink()
        if self.trash is not None:
            shutil.rmtree(self.trash, ignore_errors=True)
            if self.trash.exists():  # the new package is complete all the same: say what is left
                if self.notice is not None:
                    self.notice(self.outcome)
            else:
                self.trash = None

    def _set_aside_old(self) -> None:
        """After the exchange the old package has staging's name: give it its own (or, failing that,
        leave it there, where the next run to OUT removes it as well)."""
        try:
            self.staging.rename(self.trash)
        except OSError:
            self.trash = self.staging

    def _restore_old(self) -> None:
        if self.trash is not None:
            with contextlib.suppress(OSError):
                self.trash.rename(self.out)
                self.trash = None

    def _not_published(self, exc: OSError) -> AscendconvError:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return OutputExistsError(f"{self.out}: appeared while the package was being written, and is left as it is")
        if exc.errno == errno.ENOENT:  # the staging, or OUT's directory with it, renamed or removed meanwhile
            return directory_gone(self.staging, exc)
        return OutputPathError(
            f"{self.out}: the finished package could not be renamed into place ({exc.strerror})",
            f"make {self.out} replaceable (or remove it), then run the same command again",
        )

    def __exit__(self, exc_type, exc, tb) -> None:
        self._clean_up(exc)

    def _clean_up(self, exc: BaseException | None) -> None:
        # what the run made is removed where it is now: OUT's directory (or the staging) may have been
        # renamed during the run, and what is at the old paths then is not the run's
        staging = None
        if self.staging_fd is not None:
            staging = where_now(self.staging_fd, self.staging)
            os.close(self.staging_fd)  # first: out of descriptors (ulimit -n), the removal needs one
            self.staging_fd = None
        if not self.published and staging is not None and self.resume is None:
            with signals_deferred(deliver=False):
                shutil.rmtree(self._set_aside(staging), ignore_errors=True)
        self.lock.release()
        if not self.published:
            self._remove_created(staging.parent if staging is not None else None)
        if isinstance(exc, KeyboardInterrupt):
            exc.outcome = self.outcome  # type: ignore[attr-defined]
        elif isinstance(exc, AscendconvError) and self._kept():
            kept = f"finished shards are kept in {self.staging}: the same command with --resume reuses them"
            exc.hint = f"{exc.hint}; {kept}" if exc.hint else kept

    def _set_aside(self, staging: Path) -> Path:
        """A staging directory (this run's, or a dead run's) under an old-package name, before it is
        removed: a --ray task still starting then finds no staging at its path and writes nothing
        (StagedOutput `inside`), where it could otherwise create files in it as they were being
        removed, and leave them there."""
        aside = staging.parent / f".{self.out.name}{OLD_TAG}{secrets.token_hex(8)}"
        try:
            staging.rename(aside)
        except OSError:  # then removed under its own name
            return staging
        return aside

    def _remove_created(self, parent: Path | None) -> None:
        """rmdir the directories the run made, innermost first, each where it is now: below `parent`
        (OUT's directory as the staging found it, renamed with it perhaps), else where it was made;
        each only while it is the directory made."""
        for made, made_identity in reversed(self.created):
            for path in (parent, made):
                if path is not None and identity(path, follow=False) == made_identity:
                    with contextlib.suppress(OSError):
                        path.rmdir()
                    break
            parent = parent.parent if parent is not None else None

    def _kept(self) -> bool:
        return not self.published and self.resume is not None and self.staging is not None and self.staging.is_dir()

    @property
    def outcome(self) -> str:
        if self._kept():
            return f"nothing was written at {self.out}; finished shards are kept in {self.staging} for --resume"
        if not self.published:
            return f"nothing was written at {self.out}"
        if self.trash is not None:
            return (
                f"the new package is complete at {self.out}; the old one's remains at {self.trash} "
                "are removed by the next run to that output (or remove them yourself)"
            )
        return f"the new package is complete at {self.out}"
