"""Progress bars on stderr, built only when a command shows one (rich.progress costs start-up time)."""

from __future__ import annotations

from ascendconv.cli.console import err


def byte_progress(enabled: bool, label: str):
    """A rich progress bar on stderr (bytes, rate, ETA), or nothing."""
    if not enabled:
        return None, None
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    )
    task = bar.add_task(label, total=None)
    return bar, lambda done, total: bar.update(task, completed=done, total=total)


def verify_progress(enabled: bool):
    """A rich progress bar on stderr that follows verify's phases, or nothing."""
    if not enabled:
        return None, None
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TimeRemainingColumn

    labels = {"scan": "scanning shards", "source": "comparing with source", "moe": "MoE layers", "npu": "NPU"}
    bar = Progress("[progress.description]{task.description}", BarColumn(), TaskProgressColumn(), TimeRemainingColumn(),
                   console=err, transient=True)
    task = bar.add_task("verifying", total=None)
    return bar, lambda phase, done, total: bar.update(
        task, description=labels.get(phase, phase), completed=done, total=total
    )
