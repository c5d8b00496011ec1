"""The table-fitting engine and the small text helpers every renderer shares.

On a terminal a table is fitted to its width (names elided in the middle, sentences wrapped);
in a pipe or a CI log nothing is cut: a tensor name is the one thing its reader needs whole.
"""

from __future__ import annotations

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

_GAP = 2  # cells between two columns of a table
MAX_LISTED = 10  # items a summary lists before '… and N more'
_UNBOUNDED = 10**6


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def section(console: Console, title: str) -> None:
    console.print()
    console.print(Text(title, style="bold"))


def types_cell(counts: dict[str, int]) -> str:
    """One type as it is; several as 'TYPE n' lines."""
    if len(counts) == 1:
        return next(iter(counts))
    return "\n".join(f"{t} {n}" for t, n in counts.items())


def elide_middle(text: str, width: int) -> str:
    """`text` cut to `width` cells by replacing its middle with '…', so both ends stay readable.

    A dotted name keeps its start through its first number or '*' ('model.layers.12') and gives the
    rest of the room to its end, which says what the tensor is; other text is cut in the middle.
    A number is never cut in two (a partial 'layers.1' of 'layers.12' would mislead), so the result
    can be a cell or two shorter than `width`.
    """
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return "…"[:max(width, 0)]
    head = (width - 1) // 2
    parts = text.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit() or part == "*":
            head = min(head, len(".".join(parts[: i + 1])))
            break
    while 0 < head < len(text) and text[head - 1].isdigit() and text[head].isdigit():
        head -= 1
    start = len(text) - (width - 1 - head)
    while 0 < start < len(text) and text[start - 1].isdigit() and text[start].isdigit():
        start += 1
    if start < len(text) and text[start] == ".":  # '…' already marks the cut
        start += 1
    tail = len(text) - start
    return text[:head] + "…" + (text[-tail:] if tail else "")


class _NaturalWidth:
    """A table rendered at its own width rather than the console's (printed uncropped)."""

    def __init__(self, table: Table):
        self.table = table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = Measurement.get(console, options.update(max_width=_UNBOUNDED), self.table).maximum
        yield from console.render(self.table, options.update(width=width))


def print_table(
    console: Console,
    headers: list[str],
    rows: list[list[str]],
    right: tuple[int, ...] = (),
    elide: int | None = 0,
    wrap: int | None = None,
    gap: int = _GAP,
) -> None:
    """Print a borderless table. On a terminal it is no wider than the console: column `elide` is cut
    in the middle to the room the other columns leave; column `wrap` (if any) wraps its words; the
    rest keep their width. Elsewhere every cell is printed whole, on one line per cell line."""
    widths = [
        max([cell_len(h)] + [cell_len(line) for row in rows for line in row[i].split("\n")])
        for i, h in enumerate(headers)
    ]
    if not console.is_terminal:
        elide = wrap = None
    room_left = console.width - gap * (len(headers) - 1)
    fixed = sum(w for i, w in enumerate(widths) if i not in (elide, wrap))
    if wrap is not None:
        wrap_min = min(widths[wrap], 24)
        if elide is not None:
            widths[elide] = min(widths[elide], max(12, room_left - fixed - wrap_min))
        widths[wrap] = max(8, min(widths[wrap], room_left - fixed - (widths[elide] if elide is not None else 0)))
    elif elide is not None:
        widths[elide] = min(widths[elide], max(12, room_left - fixed))
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, gap - 1, 0, 0), header_style="bold")
    for i, header in enumerate(headers):
        table.add_column(
            header,
            justify="right" if i in right else "left",
            no_wrap=i != wrap,
            overflow="fold" if i == wrap else "ellipsis",
            max_width=widths[i],
        )
    for row in rows:
        cells = [
            Text(
                "\n".join(elide_middle(line, widths[i]) for line in cell.split("\n")) if i == elide else cell
            )
            for i, cell in enumerate(row)
        ]
        table.add_row(*cells)
    if console.is_terminal:
        console.print(table)
    else:
        console.print(_NaturalWidth(table), crop=False)
