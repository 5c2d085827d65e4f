"""`--help` and usage errors answer before any heavy module is imported: pandas, numpy,
matplotlib, torch, vLLM and aiconfigurator come with the work, not with the flags (the time
it saves is measured in benchmarks/cli_startup.py, not here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("pandas", "numpy", "matplotlib", "torch", "vllm", "aiconfigurator_core", "pyarrow")
PROBE = """
import json, sys
from profiler.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))
"""


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["cluster", "up"],
    ["cluster", "--help"],
    ["cluster", "up", "--model", "tiny", "--layout", "1P1D", "--with-proxy", "--policy",
     "lcoal"],
    ["sim", "grid", "--bogus"],
    ["sim", "run"],
    ["sim", "paper"],
    ["profile"],
    ["profile", "--help"],
    ["proxy", "--help"],
    ["proxy", "--policy", "lcoal"],
])
def test_usage_errors_and_help_import_no_heavy_module(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                          text=True, cwd=REPO, timeout=60)
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert not loaded & set(HEAVY), (argv, sorted(loaded & set(HEAVY)), done.stderr[-500:])
    assert "usage:" in done.stdout + done.stderr
