"""cpu_placement on a real process tree shaped like a vLLM-CPU node: a parent (API server)
with a child (engine) whose one thread polls without pause, as NIXL's UCX thread does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from profiler.cluster import cpu_placement

# The child starts a thread that spins and one that sleeps, and says so on stdout.
CHILD = """
import threading, time
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
time.sleep(60)
"""
PARENT = f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], stdout=subprocess.PIPE)
child.stdout.readline()
print("ready", child.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def node() -> Iterator[tuple[int, int]]:
    """(parent pid, child pid) of the node-like tree, stopped afterwards."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE,
                              start_new_session=True)
    assert parent.stdout is not None
    line = parent.stdout.readline().split()
    try:
        yield parent.pid, int(line[1])
    finally:
        os.killpg(parent.pid, 9)
        parent.wait()


def test_every_thread_of_the_tree_lands_on_the_core_and_only_the_poller_is_idled(
        node: tuple[int, int]) -> None:
    parent_pid, child_pid = node
    core = max(os.sched_getaffinity(0))
    time.sleep(0.2)  # the spinner has spun
    [placed] = cpu_placement.place_nodes([(parent_pid, core)], window_s=0.5)

    threads = cpu_placement.tree_threads(parent_pid)
    assert placed.threads == len(threads) >= 4  # parent, child main, spinner, sleeper
    assert all(os.sched_getaffinity(tid) == {core} for _, tid in threads)
    assert len(placed.idled) == 1
    [spinner] = placed.idled
    assert spinner in {tid for pid, tid in threads if pid == child_pid}
    assert os.getpriority(os.PRIO_PROCESS, spinner) == cpu_placement.POLLER_NICE
    others = [tid for _, tid in threads if tid != spinner]
    inherited = os.getpriority(os.PRIO_PROCESS, 0)  # this test's own nice value
    assert all(os.getpriority(os.PRIO_PROCESS, tid) == inherited for tid in others)


def test_a_quiet_tree_is_pinned_and_nothing_is_idled() -> None:
    quiet = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        core = min(os.sched_getaffinity(0))
        [placed] = cpu_placement.place_nodes([(quiet.pid, core)], window_s=0.3)
        assert placed.idled == ()
        assert os.sched_getaffinity(quiet.pid) == {core}
    finally:
        quiet.kill()
        quiet.wait()


def test_a_node_that_is_gone_is_skipped() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    [placed] = cpu_placement.place_nodes([(gone.pid, 0)], window_s=0.1)
    assert placed.threads == 0 and placed.idled == ()
