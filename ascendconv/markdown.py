"""Text from an untrusted checkpoint (tensor names, config values, directory names, a package's
provenance) as Markdown that shows it literally: the package's model card and verify's Markdown
report write it through these, so that a renderer (GitHub, the Hugging Face hub) never reads it as
markup, a link, HTML, a table's column bar or the end of a code block."""

from __future__ import annotations

import re

_SPECIAL = re.compile(r"([\\`*_\[\]|~])")  # what can start markup inside a line or a table cell


def text(value: object) -> str:
    """Text as Markdown text, in a line or a table cell: one line, markup characters escaped, HTML
    as entities."""
    flat = " ".join(str(value).split())
    flat = flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _SPECIAL.sub(r"\\\1", flat)


def code(value: object) -> str:
    """A name as a code span, in a line or a table cell: one line, a fence longer than any run of
    backticks in it, '|' escaped (GitHub splits table cells on it even inside code)."""
    flat = " ".join(str(value).split()).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", flat)), default=0) + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


def code_block(*lines: str) -> list[str]:
    """Lines as a fenced code block whose fence no line of theirs can close: longer than any run of
    backticks they hold, and each a single line (a line break inside a name starts a line of its own,
    never a line of Markdown)."""
    body = [part for line in lines for part in str(line).splitlines() or [""]]
    fence = "`" * max(3, max((len(run) for line in body for run in re.findall(r"`+", line)), default=0) + 1)
    return [fence, *body, fence]
