"""The one JSON shape of every command's --json output, success or error (docs/json.md).

Success: `{"ok": <the command's verdict>, "schema": 1, "command": NAME, ...its fields}`; an error:
`{"ok": false, "schema": 1, "command": NAME, "error": CODE, "message", "hint", "exit_code"}`, where
`hint` is a sentence or null, never an empty string.
"""

from __future__ import annotations

import json
import re

import typer

from ascendconv.cli.console import write_stdout

ENVELOPE_SCHEMA = 1


def envelope(command: str, data: dict) -> dict:
    """A command's result inside the envelope; `ok` is the result's own verdict where it has one
    (verify: every check passed), else true (the command did what it was asked)."""
    return {"ok": data.get("ok", True), "schema": ENVELOPE_SCHEMA, "command": command,
            **{k: v for k, v in data.items() if k not in ("ok", "schema")}}


def error_envelope(command: str | None, code: str, message: str, hint: str | None, exit_code: int) -> dict:
    return {"ok": False, "schema": ENVELOPE_SCHEMA, "command": command, "error": code, "message": message,
            "hint": hint or None, "exit_code": exit_code}


def dump_envelope(document: dict, indent: int | None = None) -> None:
    write_stdout(json.dumps(document, indent=indent))


def closest(value: str, choices) -> str | None:
    """The choice `value` most likely meant (a typo, another case), or None."""
    import difflib

    choices = [str(c) for c in choices]
    folded = {c.lower(): c for c in choices}
    if value.lower() in folded:
        return folded[value.lower()]
    match = difflib.get_close_matches(value.lower(), list(folded), n=1, cutoff=0.6)
    return folded[match[0]] if match else None


def did_you_mean(value: str, choices) -> str | None:
    match = closest(value, choices)
    return f"did you mean {match!r}?" if match else None


def usage_hint(exc: typer.TyperException) -> str | None:
    """A "did you mean" for a value outside an option's choices, where --json goes when it came
    before the command, else None."""
    context = getattr(exc, "ctx", None)
    if getattr(exc, "option_name", None) == "--json" and context is not None and context.parent is None:
        return "--json is an option of each command: give it after the command's name, e.g. ascendconv convert --json SRC OUT"
    choices = getattr(getattr(getattr(exc, "param", None), "type", None), "choices", None)
    if isinstance(exc, typer.BadParameter) and choices:
        found = re.search(r"'([^']*)' is not one of", exc.format_message())
        if found:
            return did_you_mean(found[1], choices)
    return None  # Click's own message already suggests for an unknown option
