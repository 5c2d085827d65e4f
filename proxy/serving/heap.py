"""The cyclic garbage collector's settings for a serving process.

CPython frees almost everything by reference counting; the cyclic collector only exists for
reference cycles, which the data path hardly creates. Yet it runs a young-generation pass every
700 net allocations of container objects, and each pass walks every young object still alive:
with 64 streams in flight, the in-flight requests' own state, again and again. perf on the
proxy under load (benchmarks/proxy_overhead, P->D at concurrency 64) put 6.7% of its CPU in
the collector (gc_collect_main, visit_decref, visit_reachable).

So once the server is up: what start-up built (modules, the app, tables, the tokenizer) is
frozen out of the collector's sight for good (`gc.freeze`), and the young pass runs every
YOUNG_THRESHOLD allocations instead of 700 - cycles are still collected, a few MB later.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
# The older generations keep CPython's defaults: collected every 10 young passes each.
OLDER_THRESHOLDS = (10, 10)


def settle() -> None:
    """Collect start-up's garbage, freeze what is left, and space out the young passes."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
