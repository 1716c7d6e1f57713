"""The process's garbage collector: paused while a catalogue is built, start-up objects frozen, and, while
clients are served, run on a clock rather than by allocation counts.

CPython's cyclic collector runs a full collection whenever the objects that survived to its oldest generation
grew by a quarter since the last one, and a full collection walks every tracked object in the process. Building a
catalogue view allocates a few tens of containers per tool, nearly all of them long-lived (the view) or freed by
reference counting, so a first build of 2,000 tools set off two full collections over a growing heap: about 0.07
ms of CPU per tool and the longest event-loop stalls of the build (up to 80 ms of CPU each, measured with
``bench/bench_catalogue_build.py``). Two measures, each measured against the alternatives (raising the thresholds
for the whole process, ``gc.disable()`` plus a full ``gc.collect()`` after each build, freezing at each publish):

- ``paused``: no automatic collection while a view is built. What the build allocated is then examined once, by the
  first young collection after it (about 30 ms of CPU at 2,000 tools, against up to 80 ms for one full collection
  in the middle of the build), and only those objects, not the whole heap. Not a full ``gc.collect()`` after each
  build: that would walk the whole heap every time.
- ``start_up``: no automatic collection while the gateway starts (the first build included); then, once, after the
  first catalogue is published and before the gateway listens, one full collection, and every surviving object
  (imports, configuration, the first view) moves to the permanent generation. The full collections that later run
  while clients are served then skip them: after a first build of 2,000 tools a full collection walks about
  168,000 containers for 90 to 100 ms of CPU, and takes about 2 ms once they are frozen (even after a build with
  changed lists, whose view shares most objects with the first). The one collection costs those 90 to 100 ms once,
  before any client is served, in place of the collections the start-up would have run.
  Only once: a frozen object that later becomes part of unreachable cycles is never freed, so freezing at every
  publish would leak what every request in flight holds; frozen once, at most what start-up held leaks (a
  connection replaced later, say), and only once. Views are freed by reference counting (tests/core/test_views.py
  checks that an old view dies after the freeze), so a frozen first view is still freed when a later one replaces
  it.
- ``Periodic``: while clients are served, no automatic collection; the young generations are collected once a
  second and everything once a minute. CPython starts a young collection every 700 net allocations of container
  objects, and a forwarded call allocates a few hundred: most calls paid for a collection that walked the objects
  of every call in flight (they are alive, so they are walked again one generation up), about 4% of a call's CPU
  under load, and found nothing, because what a call allocates is freed by reference counting when it ends. On a
  clock, a collection walks only what is alive at that moment. The cost is memory: reference cycles a call leaves
  behind (an exception's traceback, say) live up to a second longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No automatic collection inside the block; re-enabled on the way out, however it is left (unless it was off
    before: then it stays off)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def start_up() -> Iterator[None]:
    """No automatic collection while the gateway starts; when it has started, collect once and exempt everything
    alive then from every later collection (see the module's note). Left by an exception: only re-enabled."""
    with paused():
        yield
        gc.collect()
        gc.freeze()


class Periodic:
    """Collection on a clock while clients are served (see the module's note): ``run`` until cancelled."""

    def __init__(self, every_s: float = 1.0, full_every: int = 60) -> None:
        if every_s <= 0 or full_every < 1:
            raise ValueError("every_s must be positive and full_every at least 1")
        self.every_s = every_s
        self.full_every = full_every
        self.collections = 0  # clock ticks so far (for tests)

    async def run(self) -> None:
        """Disable automatic collection and collect on the clock; on cancellation, automatic collection is back
        (unless it was off before)."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            while True:
                await asyncio.sleep(self.every_s)
                self.collections += 1
                gc.collect(2 if self.collections % self.full_every == 0 else 1)
        finally:
            if enabled:
                gc.enable()
