"""The table-fitting engine and the small text helpers every renderer shares.

On a terminal a table is fitted to its width (names elided in the middle, keeping their layer and
expert numbers; sentences wrapped); in a pipe or a CI log nothing is cut, wrapped or padded: a
tensor name is the one thing its reader needs whole, and grep or diff should see no trailing spaces.
Every cell and value is printed with its control characters as escapes (`console.terminal_safe`): a table's
own line breaks are those of its cells, a name's are shown as '\\n' by the renderer that puts it in.
"""

from __future__ import annotations

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ascendconv.cli.console import has_unshown, terminal_safe, terminal_safe_lines

_GAP = 2  # cells between two columns of a table
MAX_LISTED = 10  # items a summary lists before '… and N more'


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def section(console: Console, title: str) -> None:
    console.print()
    console.print(Text(terminal_safe(title), style="bold"))


def deployment_flags(deployment: dict) -> str:
    """--tp T [--ep] [--shared-experts-as-routed] [--no-mtp-heads] of a recorded deployment."""
    return f"--tp {deployment['tp']}" + (" --ep" if deployment["ep"] else "") + (
        " --shared-experts-as-routed" if deployment["shared_experts_as_routed"] else ""
    ) + ("" if deployment.get("mtp_heads", True) else " --no-mtp-heads")


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


def fitted(console: Console, text: str, width: int) -> str:
    """`text` elided to `width` cells on a terminal; whole in a pipe or a log (docs/ci.md)."""
    return elide_middle(text, width) if console.is_terminal else text


def elide_name(name: str, width: int) -> str:
    """A dotted module or tensor name cut to `width` cells keeping every layer and expert number and
    the last words, which say what it is: words that precede no number go first ('…'), then the words
    before numbers shrink to their initial: model.layers.12.mlp.experts.37.down_proj.weight at 28
    cells is '…l.12…e.37.down_proj.weight'. Other text, or a name even that leaves too long, is cut
    in the middle (`elide_middle`)."""
    if cell_len(name) <= width:
        return name
    tokens = name.split(".")
    if len(tokens) < 3 or not any(t.isdigit() for t in tokens):
        return elide_middle(name, width)
    whole_from = len(tokens) - (1 if tokens[-2].isdigit() else 2)  # the last words stay whole
    state = ["keep"] * len(tokens)

    def shown() -> str:
        text = ""
        for token, how in zip(tokens, state):
            if how == "drop":
                text += "" if text.endswith("…") else "…"
                continue
            if text and not text.endswith("…"):
                text += "."
            text += token[0] if how == "short" else token
        return text

    words = [i for i in range(whole_from) if not tokens[i].isdigit()]
    steps = [(i, "drop") for i in words if not tokens[i + 1].isdigit()] + [(i, "short") for i in words if tokens[i + 1].isdigit()]
    for i, how in steps:
        state[i] = how
        if cell_len(shown()) <= width:
            return shown()
    return elide_middle(name, width)


def _plain_line(console: Console, line: str) -> None:
    console.print(line.rstrip(), markup=False, highlight=False, soft_wrap=True, crop=False)


def _print_plain(console: Console, headers: list[str] | None, rows: list[list[str]], widths: list[int],
                 right: tuple[int, ...], gap: int) -> None:
    """A table as a pipe receives it: every cell whole, columns aligned, no line padded past its
    last cell (a cell's second line is a line of its own, under its column)."""
    last = len(widths) - 1

    def emit(cells: list[str]) -> None:
        split = [cell.split("\n") for cell in cells]
        for j in range(max(len(lines) for lines in split)):
            texts = [lines[j] if j < len(lines) else "" for lines in split]
            padded = [
                t.rjust(widths[i]) if i in right else (t if i == last else t + " " * (widths[i] - cell_len(t)))
                for i, t in enumerate(texts)
            ]
            _plain_line(console, (" " * gap).join(padded))

    if headers is not None:
        emit(headers)
        rule = "-" if console.options.ascii_only else "─"  # an ASCII stdout would get "\u2500" escapes
        _plain_line(console, rule * (sum(widths) + gap * last))
    for row in rows:
        emit(row)


def print_grid(console: Console, rows: list[tuple[str, str]], gap: int = 2, label_style: str | None = "dim",
               value_style: str | None = None) -> None:
    """Label-value lines. On a terminal the value wraps under its own column; elsewhere each line
    is whole and unpadded."""
    rows = [(terminal_safe(label), terminal_safe(value)) for label, value in rows]
    if not console.is_terminal:
        width = max((cell_len(label) for label, _ in rows), default=0)
        for label, value in rows:
            _plain_line(console, label + " " * (width - cell_len(label) + gap) + value)
        return
    grid = Table.grid(padding=(0, gap))
    grid.add_column(no_wrap=True)
    grid.add_column()  # sentences wrap at word boundaries, under their own column
    for label, value in rows:
        grid.add_row(Text(label, style=label_style or ""), Text(value, style=value_style or ""))
    console.print(grid)


def print_table(
    console: Console,
    headers: list[str],
    rows: list[list[str]],
    right: tuple[int, ...] = (),
    elide: int | None = 0,
    wrap: int | None = None,
    gap: int = _GAP,
    lead: int | None = None,
    name_width: int | None = None,
) -> None:
    """Print a borderless table. On a terminal it is no wider than the console: column `elide` is cut
    in the middle to the room the other columns leave; column `wrap` (if any) wraps its words; the
    rest keep their width. A table with `lead` columns that name its rows (one column per scheme
    after them) is printed in parts that each fit, every part repeating the lead columns: a number
    or a type is never cut. Elsewhere every cell is printed whole, on one line per cell line."""
    # one search of the whole table first: nearly every table holds no control character, and a
    # listing of 200,000 tensors would otherwise cost a second of escaping cell by cell
    if has_unshown("\n".join("\n".join(row) for row in rows)):
        rows = [[terminal_safe_lines(cell) for cell in row] for row in rows]
    widths = [
        max([cell_len(h)] + [cell_len(line) for row in rows for line in row[i].split("\n")])
        for i, h in enumerate(headers)
    ]
    if not console.is_terminal:
        _print_plain(console, headers, rows, widths, right, gap)
        return
    if lead is not None:
        parts = _column_parts(widths, lead, console.width, gap, elide)
        if len(parts) > 1:
            if elide is not None:  # the same names in every part: the room the widest part leaves
                others = max(sum(widths[i] for i in range(lead) if i != elide) + sum(widths[i] for i in part) for part in parts)
                name_width = min(widths[elide], max(12, console.width - gap * (lead + max(map(len, parts)) - 1) - others))
            for number, part in enumerate(parts):
                if number:
                    console.print()
                columns = [*range(lead), *part]
                print_table(
                    console,
                    [headers[i] for i in columns],
                    [[row[i] for i in columns] for row in rows],
                    right=tuple(j for j, i in enumerate(columns) if i in right),
                    elide=elide,
                    gap=gap,
                    name_width=name_width,
                )
            return
    room_left = console.width - gap * (len(headers) - 1)
    fixed = sum(w for i, w in enumerate(widths) if i not in (elide, wrap))
    if wrap is not None:
        wrap_min = min(widths[wrap], 24)
        if elide is not None:
            widths[elide] = min(widths[elide], max(12, room_left - fixed - wrap_min))
        widths[wrap] = max(8, min(widths[wrap], room_left - fixed - (widths[elide] if elide is not None else 0)))
    elif elide is not None:
        widths[elide] = min(widths[elide], max(12, room_left - fixed), name_width or widths[elide])
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
                "\n".join(elide_name(line, widths[i]) for line in cell.split("\n")) if i == elide else cell
            )
            for i, cell in enumerate(row)
        ]
        table.add_row(*cells)
    console.print(table)


_NAME_ROOM = 30  # cells a part of a split table leaves its elided name column at least


def _column_parts(widths: list[int], lead: int, room: int, gap: int, elide: int | None) -> list[list[int]]:
    """The columns after the first `lead`, in runs that fit `room` cells beside the lead columns
    (the elided one at its width or `_NAME_ROOM`, whichever is less); one run when all fit."""
    lead_width = sum(min(w, _NAME_ROOM) if i == elide else w for i, w in enumerate(widths[:lead]))
    if sum(widths) + gap * (len(widths) - 1) <= room:
        return [list(range(lead, len(widths)))]
    parts: list[list[int]] = [[]]
    used = lead_width
    for i in range(lead, len(widths)):
        if parts[-1] and used + gap + widths[i] > room:
            parts.append([])
            used = lead_width
        parts[-1].append(i)
        used += gap + widths[i]
    return parts
