"""A new policy is one module: docs/architecture.md's example - a least-loaded-D policy that
names the node itself - dropped into a copy of the repository with no other change, is
accepted by `ppd sim run` and `ppd proxy`, and spreads turns 2+ over the decode nodes."""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^(?P<indent> *)```python\n(?P<code>.*?)^(?P=indent)```", re.S | re.M)
# The policies' package may move inside proxy/ (`proxy/routing/policies/`): any depth.
_FIRST_LINE = re.compile(r"# (?P<file>proxy/(?:\w+/)*policies/\w+\.py)\n")
# Three turns of each of two conversations through the proxy built from `ppd proxy`'s own
# arguments, over one fake P and two fake Ds; prints each turn's route and D, the startup
# line and /stats.
_PROXY_SCRIPT = '''
import asyncio, json, sys
import httpx
from proxy import create_app, running
from proxy.config.settings import config_from_args
from proxy.config.startup_line import startup_line
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import chat_body


async def main(policy):
    async with FakeVLLM("p") as p, FakeVLLM("d0") as d0, FakeVLLM("d1") as d1:
        config = config_from_args(["--policy", policy, "--prefill", p.url, "--decode", d0.url,
                                   "--decode", d1.url, "--port", "0"])
        app = create_app(config)
        turns = []
        async with running(app) as server, httpx.AsyncClient(base_url=server.url) as client:
            for opening in ("Hello", "Bye"):
                history = [opening]
                for turn in (1, 2, 3):
                    answer = await client.post("/v1/chat/completions",
                                               json=chat_body(*history))
                    assert answer.status_code == 200, answer.text
                    turns.append({"turn": int(answer.headers["x-ppd-turn"]),
                                  "route": answer.headers["x-ppd-route"],
                                  "decode": answer.headers["x-ppd-decode"]})
                    history += [answer.json()["choices"][0]["message"]["content"], "And then?"]
            stats = (await client.get("/stats")).json()
        print(json.dumps({"turns": turns, "decodes": [d0.url, d1.url],
                          "startup": startup_line(config, server.url), "stats": stats}))

asyncio.run(main(sys.argv[1]))
'''


def _example() -> tuple[str, str, str]:
    """(path of the file, code, NAME) of the policy in "Where to add X"."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("- **A policy**"):]
    match = _BLOCK.search(section)
    assert match is not None, "docs/architecture.md shows no `# proxy/.../policies/FILE.py` block"
    code = textwrap.dedent(match["code"])
    first = _FIRST_LINE.match(code)
    assert first is not None, "the example's first line must be `# proxy/.../policies/FILE.py`"
    name = re.search(r'^NAME = "(?P<name>[^"]+)"$', code, re.M)
    assert name is not None, "the example policy sets no NAME"
    return first["file"], code, name["name"]


@pytest.fixture(scope="module")
def copy_with_policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The packages a `ppd` command needs, copied, with the example dropped in."""
    root = tmp_path_factory.mktemp("repo")
    ignore = shutil.ignore_patterns("__pycache__")
    for package in ("proxy", "profiler", "tests/fakes"):
        shutil.copytree(ROOT / package, root / package, ignore=ignore)
    shutil.copy(ROOT / "tests" / "__init__.py", root / "tests" / "__init__.py")
    (root / "tests" / "proxy").mkdir()
    for name in ("__init__.py", "helpers.py"):
        shutil.copy(ROOT / "tests" / "proxy" / name, root / "tests" / "proxy" / name)
    file, code, name = _example()
    target = root / file
    assert target.parent.is_dir(), f"{file}: the policies' package is not there"
    assert not target.exists(), "the example must be a new file"
    target.write_text(code)
    return root, name


def _run(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, *argv], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def test_ppd_sim_run_accepts_the_dropped_in_policy(copy_with_policy: tuple[Path, str]) -> None:
    root, name = copy_with_policy
    cost = root / "hand.json"
    cost.write_text(json.dumps({"kind": "linear", "name": "hand", "source": "tests",
                                "base_ms": 10.0, "per_prefill_token_ms": 0.1,
                                "per_decode_seq_ms": 1.0}))
    out = root / "run"
    done = _run(root, "-m", "profiler.cli", "sim", "run", "--layout", "1P3D", "--cost",
                str(cost), "--model", "llama-3.1-8b", "--dataset", "synthetic:small-mid_bal",
                "--qps", "2", "--duration", "4", "--policy", name, "--out", str(out))
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["label"] == f"{name}@2" and summary["config"]["policy"]["kind"] == name
    with (out / "requests.csv").open() as rows:
        records = [row for row in csv.DictReader(rows) if row["success"] == "True"]
    assert {row["route"] for row in records} == {"pd"}
    later = [row for row in records if int(row["turn"]) > 1]
    # Turns 2+ are spread over the decode nodes, not kept on their session's D.
    assert len({row["decode"] for row in later}) >= 2, later
    home = {(row["conversation_id"], int(row["turn"])): row["decode"] for row in records}
    moved = [row for row in later
             if home.get((row["conversation_id"], int(row["turn"]) - 1)) not in
             (None, row["decode"])]
    assert moved, "no later turn left its session's D"


def test_ppd_proxy_accepts_and_routes_with_the_dropped_in_policy(
        copy_with_policy: tuple[Path, str]) -> None:
    root, name = copy_with_policy
    done = _run(root, "-c", _PROXY_SCRIPT, name)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert {turn["route"] for turn in result["turns"]} == {"pd"}
    # Sequential turns, so no D runs anything: the least picked D takes each, in rotation -
    # every turn 2+ leaves the D its session's previous turn used (the pool would keep it).
    turns = result["turns"]
    later = [(before["decode"], turn["decode"]) for before, turn in itertools.pairwise(turns)
             if turn["turn"] > 1]
    assert len(later) == 4 and all(before != now for before, now in later), turns
    assert {now for _, now in later} == set(result["decodes"])
    assert f"policy {name}" in result["startup"]
    assert result["stats"]["policy"] == name and result["stats"]["reasons"] == {
        "turn1": 2, "policy": 4}
