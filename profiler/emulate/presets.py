"""Named timings for emulated nodes: `--emulate HW --model M` -> an engine factory and limits.

A preset is looked up as "HW:MODEL" (e.g. "h100:llama-3.1-8b"). Engines come from the engine
model in profiler.sim when it knows the preset (aiconfigurator-core's measured kernel data,
or a preset fitted to this machine's vLLM-CPU cluster); "linear" is the small linear-cost
engine of basic.py, with no external data, for tests and for trying the machinery.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from profiler.emulate.basic import BasicConfig, BasicEngine, LinearCost
from profiler.emulate.port import NodeEngine


class PresetError(ValueError):
    """An unknown or unavailable preset."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the emulator needs of a model: KV bytes per token (K and V, all layers)."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    max_model_len: int = 8192

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


MODELS = {
    # Llama-3.1-8B's config.json: 32 layers, 8 KV heads of 128 (GQA), bf16 -> 128 KiB/token.
    "llama-3.1-8b": ModelShape("llama-3.1-8b", 32, 8, 128),
    # The tiny model `ppd model prepare tiny` builds (2 layers, 2 KV heads of 32).
    "tiny": ModelShape("tiny", 2, 2, 32, max_model_len=4096),
}


@dataclass(frozen=True, slots=True)
class Link:
    """P->D link: bandwidth per P (shared by its transfers) and a fixed per-transfer latency."""

    name: str
    bandwidth_bytes_s: float
    latency_s: float
    source: str


LINKS = {
    "nvlink": Link("nvlink", 450e9, 0.0005, "H100 NVLink 4: 900 GB/s total, 450 GB/s each way"),
    "rdma-400g": Link("rdma-400g", 50e9, 0.002, "400 Gb/s InfiniBand/RoCE NIC, line rate"),
    "tcp-25g": Link("tcp-25g", 3.125e9, 0.005, "25 Gb/s Ethernet, line rate"),
}


@dataclass(frozen=True, slots=True)
class Preset:
    """How to build the engine of one emulated node, and what to call it in metadata."""

    name: str
    description: str
    model: ModelShape
    link: Link
    make_engine: Callable[[], NodeEngine]


def _linear(model: ModelShape) -> Preset:
    def make() -> NodeEngine:
        return BasicEngine(LinearCost(), BasicConfig())

    return Preset(f"linear:{model.name}", "linear step cost (basic.py defaults), no measured "
                  "data", model, LINKS["nvlink"], make)  # fmt: skip


def resolve(hardware: str, model: str, link: str | None = None) -> Preset:
    """The preset for `--emulate hardware --model model` (PresetError when there is none)."""
    shape = MODELS.get(model)
    if shape is None:
        raise PresetError(f"no model shape for {model!r}; known: {', '.join(sorted(MODELS))}")
    if hardware == "linear":
        preset = _linear(shape)
    else:
        from profiler.emulate.sim_engine import sim_preset

        preset = sim_preset(hardware, shape)
    if link is not None:
        if link not in LINKS:
            raise PresetError(f"unknown link {link!r}; known: {', '.join(LINKS)}")
        preset = Preset(preset.name, preset.description, preset.model, LINKS[link],
                        preset.make_engine)  # fmt: skip
    return preset
