"""Named timings for emulated nodes: `--emulate HW --model M` -> engine, KV size and link.

- `h100`, `h200`, `b200`: profiler.engine's aiconfigurator cost preset "HW:MODEL" (NVIDIA's
  measured vLLM kernel data), with a KV cache sized like vLLM's on that GPU (aiconfigurator's
  memory model);
- a JSON file written by `ppd sim fit` (e.g. this machine's vLLM-CPU cluster);
- `linear`: round numbers (2 ms per step, 20 us per prompt token, 50 us per decode
  sequence), for tests and for trying the machinery without aiconfigurator-core.
KV bytes per token and link presets come from profiler.engine.transfer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from profiler.emulate.cache_events import CacheEvents
from profiler.emulate.engine_interface import NodeEngine
from profiler.emulate.modelled_engine import SimNodeEngine
from profiler.engine import Engine, EngineConfig, LinearCost, load_cost
from profiler.engine.batch import BatchShape
from profiler.engine.cost import CostModel
from profiler.engine.transfer import Link, ModelShape, load_link, load_model_shape
from proxy.shared.vocabulary import Role


class PresetError(ValueError):
    """An unknown or unavailable preset."""


LINEAR = LinearCost("linear", "round numbers for tests (ppd emulator)", base_ms=2.0,
                    per_prefill_token_ms=0.02, per_decode_seq_ms=0.05)
DEFAULT_LINK = "nvlink"
CPU_BLOCK_SIZE = 128
# Tiny models (tests, CPU presets) have no shape in profiler.engine; the tiny model's own.
TINY = ModelShape("tiny", 2, 2, 32, source="ppd model prepare tiny (LlamaConfig)")


@dataclass(frozen=True, slots=True)
class Preset:
    """How to build the engine of one emulated node, and what to call it in metadata."""

    name: str
    model: ModelShape
    link: Link
    cost: CostModel
    config: EngineConfig

    def make_engine(self, role: Role = Role.REPLICA, *,
                    kv_events: bool = False) -> NodeEngine:
        """A node's engine; with kv_events its steps carry the prefix cache's changes."""
        events = CacheEvents(self.config.block_size) if kv_events else None
        return SimNodeEngine(Engine(replace(self.config, role=role), self.cost, events), events)

    def warm(self) -> None:
        """Load the cost model now (aiconfigurator takes ~2 s), not on the first request."""
        self.cost.step_ms(BatchShape(1, self.config.block_size, 0, 0, 0))

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len


def _kv_blocks(cost: CostModel, config: EngineConfig) -> int | None:
    """vLLM's KV blocks on the preset's GPU (aiconfigurator's memory model), if it has one."""
    return cost.kv_blocks(config.block_size, config.max_num_batched_tokens, config.max_num_seqs)


def resolve(hardware: str, model: str, link: str | None = None,
            max_model_len: int | None = None, num_gpu_blocks: int | None = None) -> Preset:
    """The preset for `--emulate hardware --model model` (PresetError when there is none).

    num_gpu_blocks: the KV cache's size in blocks instead of the preset's (vLLM's
    --num-gpu-blocks-override: a small cache makes evictions happen)."""
    if num_gpu_blocks is not None and num_gpu_blocks < 1:
        raise PresetError(f"the KV cache needs at least one block, not {num_gpu_blocks}")
    try:
        shape = TINY if model == "tiny" else load_model_shape(model)
        cost = _cost(hardware, model)
        chosen = load_link(link or DEFAULT_LINK)
    except (ValueError, ImportError) as exc:
        raise PresetError(str(exc)) from None
    config = EngineConfig(max_model_len=max_model_len or 32768)
    if _is_file(hardware):
        # A fitted CPU preset: vLLM-CPU's 128-token blocks, whole prompts in one step (the
        # launcher disables chunked prefill on CPU and sets the budget to the model length).
        config = replace(config, block_size=CPU_BLOCK_SIZE,
                         max_num_batched_tokens=config.max_model_len)
    blocks = _kv_blocks(cost, config)
    if num_gpu_blocks is not None:
        blocks = num_gpu_blocks
    if blocks is not None:
        config = replace(config, num_kv_blocks=blocks)
    return Preset(cost.name, shape, chosen, cost, config)


def _is_file(hardware: str) -> bool:
    return hardware.endswith(".json") or Path(hardware).is_file()


def _cost(hardware: str, model: str) -> CostModel:
    if hardware == "linear":
        return replace(LINEAR, name=f"linear:{model}")
    if _is_file(hardware):
        return load_cost(hardware)
    return load_cost(f"{hardware}:{model}")
