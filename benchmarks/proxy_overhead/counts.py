"""What one request costs a proxy process, counted: syscalls, event-loop turns, allocations.

    python -m benchmarks.proxy_overhead.counts --policy pd --turns 1 --concurrency 1 \
        [--seconds 4] [--peer vllm-router]

Starts the fake backend and one proxy (as runner.py does) and runs the load generator on it
three times, each time under one counter, over the proxy's whole process:
- `strace -c -f`: syscalls by name per request; `epoll_wait`/`epoll_pwait` calls are the
  event loop's turns (uvloop's libuv polls once a turn);
- `perf stat` on a uprobe of libpython's `PyObject_Malloc`: Python object allocations per
  request (free lists - small tuples, floats, frames - are not counted);
- psutil: CPU microseconds per request, with no tracer attached.
Counts are divided by the requests the load generator finished in that job (warm-up
included, as the tracer saw them all). A tracer slows the proxy, so only the plain job's CPU
is a time; the counts do not depend on speed. With `--peer vllm-router` the Rust router gets
the syscall count too (its allocations are not Python's). Needs strace, perf and ptrace
rights (root).

    python -m benchmarks.proxy_overhead.counts --baseline TREE --rounds 6 [--policy ...]

With `--baseline` (another checkout, as in runner.py) no tracer runs: both proxies are up at
once behind the same fakes and generator, and their CPU microseconds per request are measured
job by job, alternated (the order flips every round), so a loaded machine's swings fall on
both; the median and minimum of the rounds are printed.
"""

from __future__ import annotations

import argparse
import functools
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil

from benchmarks.proxy_overhead import peers, runner
from benchmarks.proxy_overhead.proxy_process import STACKS
from proxy.policies import pd as pd_policy

_PROBE = "PyObject_Malloc"
_POLLS = ("epoll_wait", "epoll_pwait", "epoll_pwait2")


def _libpython() -> Path | None:
    """The shared libpython this interpreter runs on (None: a static build)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "libpython" in line:
            return Path(line.split()[-1])
    return None


def _job(url: str, args: argparse.Namespace) -> dict[str, Any]:
    return {"url": url, "warmup": 0.2, "duration": args.seconds, "tokens": 16,
            "turns": args.turns, "concurrency": args.concurrency}


def _traced(command: Callable[[Path], list[str]], run: Callable[[], dict[str, Any]]
            ) -> tuple[str, int]:
    """Run the job under a tracer (`command(output file)`, stopped with SIGINT after it); its
    output and the requests the job finished."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.txt"
        tracer = subprocess.Popen(command(out),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # The tracer is attached once the job's warm-up is over (0.2 s, and strace attaches
            # in milliseconds); the requests counted are all of the job's.
            result = run()
        finally:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(30)
        return out.read_text(), int(result["requests_total"])


def syscalls(pid: int, run: Callable[[], dict[str, Any]]) -> tuple[dict[str, int], int]:
    """Syscalls by name over one job (strace -c -f), and the requests it finished."""
    text, requests = _traced(lambda out: ["strace", "-o", str(out), "-c", "-f", "-p", str(pid)],
                             run)
    return strace_calls(text), requests


def strace_calls(summary: str) -> dict[str, int]:
    """Calls by syscall name from `strace -c`'s table (its total line left out)."""
    calls: dict[str, int] = {}
    for line in summary.splitlines():
        fields = line.split()
        # % time, seconds, usecs/call, calls, [errors], syscall
        if len(fields) >= 5 and fields[3].isdigit() and fields[-1] != "total":
            calls[fields[-1]] = int(fields[3])
    return calls


def perf_count(output: str, event: str) -> int | None:
    """The count of event in `perf stat -x ,`'s output (None: not counted)."""
    match = re.search(rf"^(\d+),[^,]*,{re.escape(event)}(,|$)", output, re.MULTILINE)
    return int(match[1]) if match else None


def allocations(pid: int, run: Callable[[], dict[str, Any]]) -> tuple[int | None, int]:
    """PyObject_Malloc calls over one job (perf stat on a uprobe), and the requests."""
    text, requests = _traced(lambda out: ["perf", "stat", "-o", str(out), "-x", ",", "-e",
                                          f"probe_libpython3:{_PROBE}", "-p", str(pid)], run)
    return perf_count(text, f"probe_libpython3:{_PROBE}"), requests


def cpu_us(pid: int, run: Callable[[], dict[str, Any]]) -> tuple[float, float, int]:
    """User and system CPU microseconds of pid's process tree over one job (no tracer), and
    the requests."""
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    before = [p.cpu_times() for p in tree]
    result = run()
    after = [p.cpu_times() for p in tree]
    user = sum(a.user - b.user for a, b in zip(after, before, strict=True))
    system = sum(a.system - b.system for a, b in zip(after, before, strict=True))
    return 1e6 * user, 1e6 * system, int(result["requests_total"])


def _report(name: str, pid: int, run: Callable[[], dict[str, Any]], python: bool) -> None:
    user, system, n = cpu_us(pid, run)
    print(f"{name}: {n} requests, CPU us/request {(user + system) / n:.0f}: user {user / n:.0f}, "
          f"system {system / n:.0f} (no tracer)")
    calls, n = syscalls(pid, run)
    total = sum(calls.values())
    polls = sum(calls.get(name, 0) for name in _POLLS)
    print(f"  syscalls/request {total / n:.1f}; event-loop turns (epoll waits) {polls / n:.1f}")
    for call, count in sorted(calls.items(), key=lambda kv: -kv[1])[:10]:
        print(f"    {count / n:6.2f}  {call}")
    if python:
        mallocs, n = allocations(pid, run)
        shown = "n/a (no uprobe)" if mallocs is None else f"{mallocs / n:.0f}"
        print(f"  PyObject_Malloc/request {shown}")


def _alternated(args: argparse.Namespace) -> None:
    """CPU us/request of the baseline tree's proxy and this one's, job by job, alternated."""
    spent: dict[str, list[float]] = {"baseline": [], "this checkout": []}
    gen = runner.LoadGenerator()
    try:
        with ExitStack() as stack:
            prefill, decode = stack.enter_context(runner.backend(16))
            proxies = {name: stack.enter_context(runner.proxy(
                args.policy, "baseline" if name == "baseline" else args.stack, prefill, decode,
                args.baseline.resolve())) for name in spent}
            for url, _ in proxies.values():
                gen.run({**_job(url, args), "duration": 1.0})
            for round_ in range(args.rounds):
                for name in (list(spent) if round_ % 2 == 0 else list(spent)[::-1]):
                    url, pid = proxies[name]
                    user, system, n = cpu_us(pid, functools.partial(gen.run, _job(url, args)))
                    spent[name].append((user + system) / n)
    finally:
        gen.close()
    print(f"policy {args.policy}, {args.turns}-turn, concurrency {args.concurrency}, "
          f"{args.rounds} alternated jobs of {args.seconds:g} s: CPU us/request")
    for name, values in spent.items():
        print(f"  {name:>14}: median {statistics.median(values):6.0f}  min {min(values):6.0f}"
              f"  rounds {' '.join(f'{v:.0f}' for v in values)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", choices=runner.POLICIES, default=pd_policy.NAME)
    parser.add_argument("--stack", choices=STACKS, default="default")
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--peer", choices=peers.PEERS, action="append", default=[])
    parser.add_argument("--baseline", type=Path, metavar="TREE",
                        help="compare CPU per request with this checkout's proxy instead")
    parser.add_argument("--rounds", type=int, default=6, help="alternated jobs (--baseline)")
    args = parser.parse_args(argv)
    if args.baseline is not None:
        _alternated(args)
        return 0
    if shutil.which("strace") is None or shutil.which("perf") is None:
        parser.error("needs strace and perf")
    library = _libpython()
    probe_added = False
    if library is not None:
        listed = subprocess.run(["perf", "probe", "--list"], capture_output=True, text=True)
        if _PROBE not in listed.stdout:
            probe_added = subprocess.run(["perf", "probe", "-x", str(library), "--add", _PROBE],
                                         capture_output=True).returncode == 0
    gen = runner.LoadGenerator()
    try:
        with ExitStack() as stack:
            prefill, decode = stack.enter_context(runner.backend(16))
            url, pid = stack.enter_context(runner.proxy(args.policy, args.stack, prefill, decode))
            gen.run({**_job(url, args), "duration": 1.0})  # warm: pools, caches, imports
            print(f"policy {args.policy}, stack {args.stack}, {args.turns}-turn, "
                  f"concurrency {args.concurrency}, {args.seconds:g} s a job")
            _report(f"ppd {args.policy}", pid,
                    lambda: gen.run(_job(url, args)), python=library is not None)
            for name in args.peer:
                peer_url, peer_pid = stack.enter_context(runner.peer(name, prefill, decode))
                gen.run({**_job(peer_url, args), "duration": 1.0})
                _report(name, peer_pid, functools.partial(gen.run, _job(peer_url, args)),
                        python=False)
    finally:
        gen.close()
        if probe_added:
            subprocess.run(["perf", "probe", "--del", f"probe_libpython3:{_PROBE}"],
                           capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
