"""The process's garbage collector around catalogue builds: paused while one runs, and start-up objects frozen.

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
"""

from __future__ import annotations

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
