"""Building many small records fast: the cyclic garbage collector paused, and frozen records made
without their generated __init__.

A full-scale checkpoint means about 100,000 header entries and as many planned tensors per scheme.
Allocating them triggers the collector's generational passes, which rescan every live object (all
the entries already parsed) again and again: on a DeepSeek-V3 header set that was two thirds of the
time spent making a plan. Header parsing and planning make no reference cycles, so nothing is lost
by collecting once afterwards instead.
"""

from __future__ import annotations

import dataclasses
import gc
from contextlib import contextmanager


@contextmanager
def gc_paused():
    """`with gc_paused():` or `@gc_paused()`: the collector is off inside and back as it was after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def record_builder(cls: type):
    """`build(*fields)`, every field of the frozen, slotted dataclass `cls` given in order: the same
    record as `cls(*fields)`, made by setting its slots directly. The generated __init__ of a frozen
    dataclass sets each field through object.__setattr__, 2-3 times slower (Python 3.11), and a
    full-scale source makes a few hundred thousand header entries and linears."""
    names = [f.name for f in dataclasses.fields(cls)]
    scope = {"new": object.__new__, "cls": cls} | {f"set_{n}": getattr(cls, n).__set__ for n in names}
    body = "".join(f"\n    set_{n}(record, {n})" for n in names)
    exec(f"def build({', '.join(names)}):\n    record = new(cls){body}\n    return record", scope)  # noqa: S102
    return scope["build"]
