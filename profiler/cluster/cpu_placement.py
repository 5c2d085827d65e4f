"""Keep each vLLM-CPU node on its own core after NIXL has started (CPU clusters only).

`ppd cluster up` gives every node one core (`VLLM_CPU_OMP_THREADS_BIND`). Two things NIXL does
on the CPU undo that, both seen here with `ps`/gdb on a 1P1D cluster of vLLM-CPU 0.32 and
nixl-cu12 1.5.1:

1. vLLM's NixlConnector worker, on the CPU, moves the thread that creates it to the last core
   of each NUMA node (`os.sched_setaffinity(0, ...)` in vllm/.../nixl/base_worker.py: "reserve
   different cores for start_load_kv() from model_forward()"). That thread is the engine
   worker's main thread, the one that runs the model: every node's model ends up on the same
   last core and the others sit idle.
2. NIXL's UCX progress thread calls `ucp_worker_progress` in a loop with no pause (nixl's Python
   API fixes `pthrDelay` at 0 and vLLM does not expose `enable_prog_thread`): each node burns
   one core, idle or not.

So after the nodes start, every thread of a node's process tree is pinned to the node's core,
and the threads that burn a core while the node has no request get the lowest priority, nice
19: they still run whenever their core has nothing else to do (on an idle core, all the time),
and get ~1.5% of it (CFS weight 15 against 1024) while the model computes. Threads created
later inherit the corrected affinity.

Measured (1P1D, tiny model, synthetic:large-mid_bal at 1 conversation/s, both routes forced):
as launched, P->D turn-2 TTFT mean 23.2 s and turn-1 9.7 s; pinned only, 152 ms and 96 ms with
TPOT 10.2 ms (the poller takes half of D's core); pinned and the poller under SCHED_IDLE, 133 ms /
148 ms with TPOT 4.6 ms (local route: 54 ms turn-2 TTFT, 4.9 ms TPOT). SCHED_IDLE was the first
choice and is not kept: any other work on the machine, even at nice 19, then starves the poller
outright, and a pull waits for the core to go idle (P->D turn-2 TTFT p99 983 and 1,058 ms under
SCHED_IDLE against 203 and 482 ms at nice 19, alternating runs of `synthetic:small-short_gen`
at 0.5 conversations/s beside a nice-19 simulator; TPOT 4.5-4.9 ms either way).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

# A thread that used more than this share of a core over the sampling window while its node
# had no request is a poll loop; the NIXL poller measures 0.99 (about half when it shares its
# core with another), every other thread of an idle node 0.00.
POLLER_CORE_SHARE = 0.2
SAMPLE_WINDOW_S = 1.0
POLLER_NICE = 19

ThreadId = tuple[int, int]  # (process id, thread id)


@dataclass(frozen=True)
class Placement:
    """What `place_nodes` did to one node."""

    pid: int
    core: int
    threads: int
    idled: tuple[int, ...]  # poll-loop thread ids set to nice 19


def tree_threads(pid: int) -> list[ThreadId]:
    """Every thread of `pid` and of its descendants (API server, engine core, worker)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    threads: list[ThreadId] = []
    for process in processes:
        try:
            threads += [(process.pid, t.id) for t in process.threads()]
        except psutil.NoSuchProcess:
            continue  # a helper process that ended meanwhile
    return threads


def _cpu_seconds(thread: ThreadId) -> float | None:
    """User + system time of one thread, or None once it has ended."""
    pid, tid = thread
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the command name: state is field 3, utime 14 and stime 15 (proc(5)), in ticks.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pollers(threads: Sequence[ThreadId], window_s: float = SAMPLE_WINDOW_S) -> list[ThreadId]:
    """The threads that used more than POLLER_CORE_SHARE of a core over `window_s`."""
    before = {t: _cpu_seconds(t) for t in threads}
    time.sleep(window_s)
    busy = []
    for thread, start in before.items():
        end = _cpu_seconds(thread)
        if start is not None and end is not None and end - start > POLLER_CORE_SHARE * window_s:
            busy.append(thread)
    return busy


def place_nodes(nodes: Sequence[tuple[int, int]],
                window_s: float = SAMPLE_WINDOW_S) -> list[Placement]:
    """Pin each (pid, core) node's threads to its core and idle its pollers.

    Call it while the nodes serve nothing: a thread busy with a real request would be taken
    for a poller. One sampling window covers all nodes."""
    threads = {pid: tree_threads(pid) for pid, _ in nodes}
    for pid, core in nodes:
        for _, tid in threads[pid]:
            _pin(tid, core)
    busy = set(pollers([t for ts in threads.values() for t in ts], window_s))
    placements = []
    for pid, core in nodes:
        idled = tuple(tid for owner, tid in threads[pid]
                      if (owner, tid) in busy and _idle(tid))
        placements.append(Placement(pid, core, len(threads[pid]), idled))
    return placements


def _pin(tid: int, core: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
        os.sched_setaffinity(tid, {core})


def _idle(tid: int) -> bool:
    """Nice 19 for one thread (Linux applies PRIO_PROCESS to a thread id alone); False if it
    ended meanwhile."""
    try:
        os.setpriority(os.PRIO_PROCESS, tid, POLLER_NICE)
    except ProcessLookupError:
        return False
    return True
