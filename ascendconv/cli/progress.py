"""Progress on stderr: a rich bar on a terminal (built only then: rich.progress costs start-up time),
plain heartbeat lines in a CI log, where a bar prints nothing and a silent job may be killed."""

from __future__ import annotations

import time
from typing import Callable

from ascendconv.cli.console import err

HEARTBEAT_SECONDS = 30.0  # a CI log gets a line at least this often, and one per finished shard


def _eta(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class Heartbeat:
    """One plain line per finished shard and at least every HEARTBEAT_SECONDS of bytes, e.g.
    'converting: shard 2/5, 1.00 GiB of 2.10 GiB (47%), 790.00 MiB/s, ETA 0m01s'. Never a carriage return:
    a CI log keeps every line."""

    def __init__(self, label: str, write: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.label, self.write, self.clock = label, write, clock
        self.last = clock()
        # the rate counts from the first report: the time before it went into start-up and compiling
        self.started: float | None = None
        self.base = 0  # what was done at `started`
        self.done, self.total = 0, 0
        self.shards: tuple[int, int] | None = None

    def bytes(self, done: int, total: int) -> None:
        if self.started is None:
            self.started, self.base = self.clock(), done
        self.done, self.total = done, total
        if self.clock() - self.last >= HEARTBEAT_SECONDS:
            self.beat()

    def shard(self, closed: int, count: int) -> None:
        self.shards = (closed, count)
        self.beat()

    def phase(self, phase: str, done: int, total: int) -> None:
        """verify's progress: a new phase gets a line at once, then every HEARTBEAT_SECONDS."""
        if phase != self.label:
            self.label, self.started, self.base, self.done, self.total = phase, self.clock(), done, done, total
            self.beat()
        else:
            self.bytes(done, total)

    def line(self, unit_bytes: bool = True) -> str:
        from ascendconv.cli.render.tables import human_bytes  # rich's tables: loaded only when a line is due

        elapsed = 0.0 if self.started is None else self.clock() - self.started
        parts = []
        if self.shards:
            parts.append(f"shard {self.shards[0]}/{self.shards[1]}")
        show = human_bytes if unit_bytes else (lambda n: f"{n:,}")
        if self.total:
            parts.append(f"{show(self.done)} of {show(self.total)} ({100 * self.done / self.total:.0f}%)")
        elif self.done:
            parts.append(show(self.done))
        if self.done > self.base and elapsed >= 1:
            rate = (self.done - self.base) / elapsed
            parts.append(f"{human_bytes(rate)}/s" if unit_bytes else f"{rate:,.1f}/s")
            if self.total > self.done:
                parts.append(f"ETA {_eta((self.total - self.done) / rate)}")
        return f"{self.label}: " + (", ".join(parts) or "starting")

    def beat(self) -> None:
        self.last = self.clock()
        self.write(self.line(unit_bytes=self.label not in COUNTED_PHASES))


def _plain_line(text: str) -> None:
    err.print(text, highlight=False, markup=False, soft_wrap=True)


def byte_progress(quiet: bool, label: str):
    """(bar or None, progress(done, total), shard(closed, count) or None): a rich bar on a terminal,
    heartbeat lines otherwise, nothing when quiet."""
    if quiet:
        return None, None, None
    if not err.is_terminal:
        beat = Heartbeat(label, _plain_line)
        return None, beat.bytes, beat.shard
    from rich.progress import BarColumn, DownloadColumn, Progress, ProgressColumn, TimeRemainingColumn
    from rich.text import Text

    from ascendconv.cli.render.tables import human_bytes

    class BinaryRateColumn(ProgressColumn):
        def render(self, task) -> Text:
            return Text(f"{human_bytes(task.speed)}/s" if task.speed else "?", style="progress.data.speed")

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(binary_units=True),  # MiB and GiB, as every size the commands print
        BinaryRateColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    )
    task = bar.add_task(label, total=None)
    return bar, lambda done, total: bar.update(task, completed=done, total=total), None


VERIFY_LABELS = {"scan": "scanning shards", "source-data": "hashing the source", "source": "comparing with source",
                 "moe": "MoE layers", "npu": "NPU"}
COUNTED_PHASES = (VERIFY_LABELS["moe"], VERIFY_LABELS["npu"])  # these count layers; the others bytes


def verify_progress(quiet: bool):
    """(bar or None, progress(phase, done, total)): a rich bar on a terminal, heartbeat lines
    otherwise, nothing when quiet."""
    if quiet:
        return None, None
    if not err.is_terminal:
        beat = Heartbeat("verifying", _plain_line)
        return None, lambda phase, done, total: beat.phase(VERIFY_LABELS.get(phase, phase), done, total)
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TimeRemainingColumn

    bar = Progress("[progress.description]{task.description}", BarColumn(), TaskProgressColumn(), TimeRemainingColumn(),
                   console=err, transient=True)
    task = bar.add_task("verifying", total=None)
    return bar, lambda phase, done, total: bar.update(
        task, description=VERIFY_LABELS.get(phase, phase), completed=done, total=total
    )
