"""Where the proxy's CPU goes under load: py-spy samples of a proxy process, summed.

    python -m benchmarks.proxy_overhead.spy --policy pd --turns 1 --concurrency 64 \
        [--stack default] [--seconds 8] [--raw out.txt]

Starts the fake backend and one proxy (as runner.py does), keeps the load generator on it for
`--seconds`, and records the proxy with `py-spy record --format raw` (the `bench` extra
installs py-spy; it needs ptrace rights over the proxy, e.g. root). Prints the share of samples
per function (self time) and per file (inclusive: any frame of the file on the stack), so a
part's cost reads as a percentage of the proxy's CPU, before and after a change.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

from benchmarks.proxy_overhead import runner
from benchmarks.proxy_overhead.proxy_process import STACKS
from proxy.policies import pd as pd_policy

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def summarize(raw: str, top: int = 25) -> str:
    """Self time per function and inclusive time per file, from py-spy's raw output."""
    own: Counter[str] = Counter()
    files: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        own[_short(frames[-1])] += count
        for name in {_file(frame) for frame in frames}:
            files[name] += count
    if not total:
        return "no samples"
    out = [f"{total} samples", "", "self time by function:"]
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    out += ["", "inclusive time by file:"]
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in files.most_common(top)]
    return "\n".join(out)


def _file(frame: str) -> str:
    match = _FRAME.match(frame)
    path = match["file"] if match else frame
    for marker in ("site-packages/", "python3.11/", "/proxy/"):
        if marker in path:
            return ("proxy/" if marker == "/proxy/" else "") + path.split(marker, 1)[1]
    return path


def _short(frame: str) -> str:
    match = _FRAME.match(frame)
    return f"{match['func']} ({_file(frame)})" if match else frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", choices=runner.POLICIES, default=pd_policy.NAME)
    parser.add_argument("--stack", choices=STACKS, default="default")
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--raw", type=Path, help="also keep py-spy's raw output here")
    args = parser.parse_args(argv)
    # The venv's own copy first: `make bench` runs the venv's python without its bin on PATH.
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        parser.error("py-spy is not installed: pip install -e '.[bench]'")
    gen = runner.LoadGenerator()
    try:
        with runner.backend(16) as (prefill, decode), \
                runner.proxy(args.policy, args.stack, prefill, decode) as (url, pid), \
                tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "raw.txt"
            job = {"warmup": 0.5, "duration": args.seconds + 1.5, "tokens": 16,
                   "turns": args.turns, "concurrency": args.concurrency}
            load = threading.Thread(target=gen.run, args=({"url": url, **job},))
            load.start()
            subprocess.run([spy, "record", "--pid", str(pid), "--duration",
                            str(round(args.seconds)), "--rate", "250", "--format", "raw",
                            "--nonblocking", "--output", str(out)],
                           check=True, capture_output=True)
            load.join()
            raw = out.read_text()
    finally:
        gen.close()
    if args.raw:
        args.raw.write_text(raw)
    print(f"policy {args.policy}, stack {args.stack}, {args.turns}-turn, "
          f"concurrency {args.concurrency}, {args.seconds:g} s")
    print(summarize(raw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
