"""Pause Python's cyclic garbage collector around code that builds many objects and no cycles.

A full-scale checkpoint means about 100,000 header entries and as many planned tensors per scheme.
Allocating them triggers the collector's generational passes, which rescan every live object (all
the entries already parsed) again and again: on a DeepSeek-V3 header set that was two thirds of the
time spent making a plan. Header parsing and planning make no reference cycles, so nothing is lost
by collecting once afterwards instead.
"""

from __future__ import annotations

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
