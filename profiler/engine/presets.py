"""Cost presets by name or file: the registry `load_cost` reads.

- `GPU:MODEL[:tpN][@vllm-X.Y]` (`h100:llama-3.1-8b`, ...): aiconfigurator's measured kernels
  plus vLLM's host side (`host.py`) of one vLLM release (`vllm_versions.py`): by default vLLM
  0.24, fitted on real vLLM 0.24 on an H100 (`measured.py`); `@vllm-0.13` the PPD paper's
  engine, fitted on its micro-benchmark and public measurements (`public.py`);
- `GPU:MODEL[:tpN]:kernels`: the kernels alone (what the presets were before the host side);
- `FILE.json`: a `LinearCost` (`ppd sim fit`) or a kernels + host preset (`ppd sim calibrate`);
- anything `register()`ed by name (a calibrated preset a caller wants to plug in).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from profiler.engine.config import EngineConfig
from profiler.engine.cost import CostModel, LinearCost
from profiler.engine.host import HostedCost, HostModel
from profiler.engine.vllm_versions import (
    DEFAULT_VERSION,
    VERSION_MARK,
    VERSIONS,
    VllmVersion,
    split_version,
)

KERNELS_SUFFIX = "kernels"
REFERENCE = "h100:llama-3.1-8b"  # the kernels every version's host terms are fitted against
_REGISTRY: dict[str, Callable[[], CostModel]] = {}


def register(name: str, factory: Callable[[], CostModel]) -> None:
    """Make `load(name)` build a preset with factory (later registrations win)."""
    _REGISTRY[name] = factory


def preset_names() -> list[str]:
    from profiler.engine import aic

    gpu = aic.preset_names()
    versioned = [f"{name}{VERSION_MARK}{v}" for name in gpu for v in VERSIONS
                 if v != DEFAULT_VERSION]
    return [*gpu, *versioned, *(f"{name}:{KERNELS_SUFFIX}" for name in gpu),
            *sorted(_REGISTRY)]


def load(spec: str) -> CostModel:
    if spec in _REGISTRY:
        return _REGISTRY[spec]()
    path = Path(spec)
    if spec.endswith(".json") or path.is_file():
        if not path.is_file():
            raise ValueError(f"cost preset file not found: {spec}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"cost preset {spec} is not JSON: {exc}") from None
        try:
            return from_dict(data)
        except ValueError as exc:
            raise ValueError(f"cost preset {spec}: {exc}") from None
    return _gpu_preset(spec)


def from_dict(data: dict[str, Any]) -> CostModel:
    if not isinstance(data, dict):
        raise ValueError("a cost preset is a JSON object (`\"kind\": \"linear\"` or "
                         f"`\"hosted\"`, as `ppd sim fit` writes), not a {type(data).__name__}")
    kind = data.get("kind", "linear")
    if kind == "linear":
        return LinearCost.from_dict(data)
    if kind == "hosted":
        missing = {"name", "kernel", "host"} - set(data)
        if missing:
            raise ValueError(f"hosted cost preset: missing {sorted(missing)}")
        for key in ("kernel", "host"):
            if not isinstance(data[key], dict):
                raise ValueError(f"hosted cost preset: {key} must be a JSON object, got "
                                 f"{data[key]!r}")
        return HostedCost(name=str(data["name"]), kernel=from_dict(data["kernel"]),
                          host=HostModel.from_dict(data["host"]),
                          source=str(data.get("source", "")),
                          engine=_engine_overrides(data.get("engine", {})),
                          vllm=str(data.get("vllm", "")))
    raise ValueError(f"unknown cost preset kind {kind!r} (linear or hosted)")


def _engine_overrides(engine: object) -> dict[str, int]:
    """A hosted preset's EngineConfig overrides (block_size, num_kv_blocks, ...): whole
    numbers > 0, each named when it is not one."""
    if not isinstance(engine, dict):
        raise ValueError(f"hosted cost preset: engine must be a JSON object, got {engine!r}")
    known = {field.name for field in fields(EngineConfig)} - {"seed"}
    unknown = sorted(set(engine) - known)
    if unknown:  # else EngineConfig(**engine) fails at the first run, in Python's words
        raise ValueError(f"hosted cost preset: unknown engine key(s) {unknown}; known: "
                         f"{sorted(known)}")
    bad = [key for key, value in engine.items()
           if isinstance(value, bool) or not isinstance(value, int) or value < 1]
    if bad:
        raise ValueError(f"hosted cost preset: engine {', '.join(bad)} must be whole numbers > 0 "
                         f"(got {', '.join(repr(engine[key]) for key in bad)})")
    return dict(engine)


def to_dict(cost: HostedCost) -> dict[str, Any]:
    kernel = cost.kernel
    if not isinstance(kernel, LinearCost):
        raise ValueError("only a hosted preset over a LinearCost can be written to a file")
    return {"kind": "hosted", "name": cost.name, "source": cost.source,
            "kernel": kernel.to_dict(), "host": cost.host.to_dict(), "engine": cost.engine,
            **({"vllm": cost.vllm} if cost.vllm else {})}


def _gpu_preset(spec: str) -> CostModel:
    from profiler.engine import aic

    parts = spec.split(":")
    kernels_only = parts[-1] == KERNELS_SUFFIX
    named = ":".join(parts[:-1]) if kernels_only else spec
    base, version = split_version(named)
    if kernels_only and version is not None:
        raise ValueError(f"cost preset {spec!r}: :{KERNELS_SUFFIX} is the kernels alone, "
                         "which have no vLLM host side to version")
    kernel = aic.load_preset(base)  # raises the "unknown preset" error with the known names
    if kernels_only:
        kernel.name = spec
        return kernel
    version = version or VERSIONS[DEFAULT_VERSION]
    return HostedCost(name=spec, kernel=kernel, host=_gpu_host(base, kernel, version),
                      source=f"{kernel.source} + vLLM {version.version} host side "
                             f"({version.sources})", vllm=version.version)


_FITTED: dict[str, HostModel] = {}  # the fitted terms, once per process per version


def _gpu_host(base: str, kernel: CostModel, version: VllmVersion) -> HostModel:
    """The host terms are CPU-side: fitted once per vLLM version against H100 +
    Llama-3.1-8B's kernels and carried to every GPU and model (an assumption the docs
    state), with the model's own layer count for NIXL's descriptors."""
    from profiler.engine import aic
    from profiler.engine.transfer import load_model_shape

    if version.version not in _FITTED:
        reference = kernel if base == REFERENCE else aic.load_preset(REFERENCE)
        _FITTED[version.version] = version.fit(reference)
    host = _FITTED[version.version]
    layers = load_model_shape(base.split(":")[1]).num_layers
    return HostModel.from_dict({**host.to_dict(), "sources": host.sources,
                                "descriptors_per_block": 2 * layers})


def load_cost(spec: str) -> CostModel:
    """A cost model by preset name (`h100:llama-3.1-8b`, see `ppd sim presets`) or from a
    JSON file written by `ppd sim fit` / `ppd sim calibrate`."""
    return load(spec)


@lru_cache(maxsize=8)
def cached_cost(spec: str) -> CostModel:
    """`load_cost`, once per process per spec (aiconfigurator takes seconds to load)."""
    return load(spec)
