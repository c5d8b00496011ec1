"""Text from an untrusted checkpoint (tensor names, config values, directory names, a package's
provenance) as Markdown that shows it literally: the package's model card and verify's Markdown
report write it through these, so that a renderer (GitHub, the Hugging Face hub) never reads it as
markup, a link, HTML, a table's column bar or the end of a code block."""

from __future__ import annotations

import re

_SPECIAL = re.compile(r"([\\`*_\[\]|~])")  # what can start markup inside a line or a table cell
# GFM's autolinks (extension) link a 'www.' and a 'scheme://' as they read the line's source, so a
# backslash before the '.' or the ':' (dropped when rendered) leaves them text; an email address they
# find in the text as rendered, after its escapes, so only a code span keeps one from being a link.
_WWW_DOT = re.compile(r"(?i)(?<=www)\.")
_EMAIL = re.compile(r"([A-Za-z0-9.+_-]+@[A-Za-z0-9._-]+)")  # GFM's characters of an address, either side of '@'


def text(value: object) -> str:
    """Text as Markdown text, in a line or a table cell: one line, markup characters escaped, HTML
    as entities, no autolink (a 'www.', a 'scheme://' or an email address stays text)."""
    parts = _EMAIL.split(" ".join(str(value).split()))
    return "".join(code(part) if i % 2 else _escaped(part) for i, part in enumerate(parts))


def _escaped(flat: str) -> str:
    flat = flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _WWW_DOT.sub(r"\\.", _SPECIAL.sub(r"\\\1", flat)).replace("://", "\\://")


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


# --- YAML front matter: the few scalar forms a card's carried keys are read in and written as ---------

_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/+-]*")  # a plain scalar that is the same in every YAML reader
_INDICATORS = tuple("!&*[]{}|>%@`#,?:-\"'")  # what a plain scalar may not start with (or starts another form)


def read_scalar(value: str) -> tuple[str, bool] | None:
    """(the string, whether it was plain) of a one-line YAML scalar as a card's front matter writes
    one: plain (a trailing ' # comment' dropped), 'single-' or "double-quoted" (JSON's escapes); None
    for any other form (a multi-line, flow, block, anchored or tagged value), which is not carried."""
    value = value.strip()
    if value.startswith('"'):
        import json

        try:
            parsed, stop = json.JSONDecoder().raw_decode(value)
        except ValueError:
            return None
        if not isinstance(parsed, str) or not _only_comment(value[stop:]) or re.search("[\ud800-\udfff]", parsed):
            return None  # not a string, more after it, or a lone surrogate (a '\\ud800' escape)
        return parsed, False
    if value.startswith("'"):
        match = re.match(r"'((?:[^']|'')*)'", value)
        if match is None or not _only_comment(value[match.end():]):
            return None
        return match[1].replace("''", "'"), False
    value = value.split(" #", 1)[0].rstrip()
    if not value or value.startswith(_INDICATORS) or ": " in value or value.endswith(":") or "\t" in value:
        return None
    return value, True


def _only_comment(rest: str) -> bool:
    return not rest.strip() or rest[:1] in " \t" and rest.strip().startswith("#")


def yaml_scalar(value: str, plain: bool = False) -> str:
    """A string as one line of YAML that every reader takes as that string: plain when it was plain
    and needs no quoting, else double-quoted with '"', '\\' and every character that is not printable
    (line breaks, controls, U+2028) escaped."""
    if plain and _PLAIN.fullmatch(value):
        return value
    import unicodedata

    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == " " or unicodedata.category(ch)[0] not in "CZ":
            out.append(ch)
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'
