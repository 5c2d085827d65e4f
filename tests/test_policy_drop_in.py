"""A new policy is one module: docs/architecture.md's example, dropped into a copy of the
repository with no other change, is accepted by `ppd sim run` and `ppd proxy`."""

from __future__ import annotations

import csv
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
_FIRST_LINE = re.compile(r"# proxy/policies/(?P<file>\w+\.py)\n")
# Two turns of one conversation through the proxy built from `ppd proxy`'s own arguments, over
# two fake vLLM nodes; prints the routes, the startup line and /stats.
_PROXY_SCRIPT = '''
import asyncio, json, sys
import httpx
from proxy import create_app, running
from proxy.config import config_from_args
from proxy.startup_line import startup_line
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import chat_body


async def main(policy):
    async with FakeVLLM("p") as p, FakeVLLM("d") as d:
        config = config_from_args(["--policy", policy, "--prefill", p.url, "--decode", d.url,
                                   "--port", "0"])
        app = create_app(config)
        async with running(app) as server, httpx.AsyncClient(base_url=server.url) as client:
            first = await client.post("/v1/chat/completions", json=chat_body("Hello"))
            reply = first.json()["choices"][0]["message"]["content"]
            second = await client.post("/v1/chat/completions",
                                       json=chat_body("Hello", reply, "And then?"))
            stats = (await client.get("/stats")).json()
        print(json.dumps({"routes": [first.headers["x-ppd-route"],
                                     second.headers["x-ppd-route"]],
                          "startup": startup_line(config, server.url), "stats": stats}))

asyncio.run(main(sys.argv[1]))
'''


def _example() -> tuple[str, str, str]:
    """(file name, code, NAME) of the policy in "Where to add X"."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("- **A policy**"):]
    match = _BLOCK.search(section)
    assert match is not None, "docs/architecture.md shows no `# proxy/policies/FILE.py` block"
    code = textwrap.dedent(match["code"])
    first = _FIRST_LINE.match(code)
    assert first is not None, "the example's first line must be `# proxy/policies/FILE.py`"
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
    assert not (root / "proxy" / "policies" / file).exists(), "the example must be a new file"
    (root / "proxy" / "policies" / file).write_text(code)
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
    done = _run(root, "-m", "profiler.cli", "sim", "run", "--layout", "1P1D", "--cost",
                str(cost), "--model", "llama-3.1-8b", "--dataset", "synthetic:small-mid_bal",
                "--qps", "2", "--duration", "2", "--policy", name, "--out", str(out))
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["label"] == f"{name}@2" and summary["config"]["policy"]["kind"] == name
    with (out / "requests.csv").open() as rows:
        by_turn = {(row["turn"], row["route"]) for row in csv.DictReader(rows)}
    # The example's routes: turn 1 P->D, turn 2 (even) local.
    assert {("1", "pd"), ("2", "local")} <= by_turn and ("2", "pd") not in by_turn


def test_ppd_proxy_accepts_and_routes_with_the_dropped_in_policy(
        copy_with_policy: tuple[Path, str]) -> None:
    root, name = copy_with_policy
    done = _run(root, "-c", _PROXY_SCRIPT, name)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # The example keeps turn 2 (even) on D.
    assert result["routes"] == ["pd", "local"]
    assert f"policy {name};" in result["startup"]
    assert result["stats"]["policy"] == name and result["stats"]["reasons"] == {
        "turn1": 1, "policy": 1}
