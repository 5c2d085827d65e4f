"""The host side of vLLM: what a node costs beyond its GPU kernels.

A kernel-only cost model (aiconfigurator's measured kernels, `aic.py`) times the forward pass
and nothing else. A real vLLM node also spends, per request and per step, CPU time that sits
on the critical path. Each term here is one named part of that, in vLLM's terms:

- `frontend_request_ms`, once per request a node serves, before its engine sees it (on TTFT;
  twice on a P->D turn, on P and on D): the API server's HTTP parse, chat template, tokenize,
  hand-off to the engine core process, and the first output's way back (detokenize, SSE);
- `frontend_per_token_us` x prompt tokens, with `frontend_request_ms`: what of the front end
  grows with the prompt (tokenizing its text, the token ids' way to the engine core);
- `frontend_per_running_ms` x the requests the node's engine is running when one arrives,
  with `frontend_request_ms`: the API server's one event loop also streams every running
  request's tokens (detokenize, SSE) and a new request waits its turn; on a CPU node it
  shares the core with the engine as well (`ppd cluster probe --busy` measures it);
- `frontend_node_ms`, `frontend_node_per_token_us`: of the two above, what the node itself
  spends when the preset was fitted from client-side TTFTs, which also hold the proxy's hop
  and the client (a CPU calibration's); emulated nodes sleep only this part, since the proxy
  and client in front of them pay the rest for real (`node_side`). 0: all of it is the node's
  (the GPU presets' front end is the API server alone);
- `frontend_service_ms`, of the front end above, how long the API server's one event loop is
  busy with a request (parse, preprocess, hand-off to the engine core): a node's API server
  takes requests one at a time, so a request that arrives while it is busy waits its turn
  first (`frontend.ApiServer`, a FIFO queue per node); 0: no queue, the front end is a
  delay per request;
- `frontend_finish_ms`, once per request after its last token: final detokenize, usage chunk,
  `[DONE]`;
- `step_base_ms`, every step: the scheduler (`schedule()`, `update_from_output()`), input
  preparation, the GPU->CPU copy of the sampled tokens;
- `step_per_request_ms`, per scheduled request per step: block tables, sampling metadata,
  output processing;
- `step_per_token_ms`, per scheduled token per step: input ids, positions, slot mappings;
- `step_per_prefill_ms`, per prompt chunk in a step: its attention metadata and the first
  sampling of a new request;
- `cuda_graph_sizes`: a decode-only (uniform decode) step replays the CUDA graph of the next
  captured batch size, so its kernels run at that padded size (vLLM `_set_cudagraph_sizes`);
  mixed prefill+decode steps run piecewise graphs / eager attention at their real size;
- `async_scheduling` (vLLM `--async-scheduling`): the host work of step N+1 overlaps the GPU
  work of step N; only what exceeds the kernel time, plus `async_residual_ms`, is exposed;
- `schedules_ahead` (vLLM's async scheduling as its engine core runs it,
  `EngineCore.step_with_batch_queue` in vllm/v1/engine/core.py: "fulfilling the batch queue
  has a higher priority than getting model outputs"): the next step is scheduled and launched
  before the running one's output is read, so a request that arrives while a step runs misses
  the step already queued behind it and joins the one after;
- `cold_step_host_ms`, once per step launched on an idle engine: with the batch queue empty
  nothing runs on the GPU to hide that step's host work behind (`Scheduler.schedule`, the
  model runner's `_update_states` adding the new request to the persistent input batch,
  `_prepare_inputs` and the attention metadata, the piecewise-CUDA-graph launch of a
  non-uniform batch in vllm/v1/worker/gpu_model_runner.py `execute_model`), so it is paid in
  full; a step launched behind another hides it (the steady-state part that still shows is
  `step_base_ms` / `step_per_request_ms`);
- `kv_handoff_ms`, once per P->D transfer on D: fixed connector work beyond the step
  alignment the engine already models (the pull starts after D's scheduling step, its end is
  seen by D's next step);
- `kv_per_token_us` x tokens pulled, once per P->D transfer: a connector's per-token work
  beyond the link's bandwidth (vLLM-CPU's shared-storage connector writes and reads files);
- `kv_descriptor_us` x `descriptors_per_block` x blocks, once per P->D transfer: NIXL posts
  one descriptor per (layer, K/V, block).

The last prompt token is recomputed on D (the engine model does it: one decode-shaped step
after the KV arrives) and P keeps its blocks until the transfer is done (vLLM's delayed free;
`Engine.release_kv`). Every constant of a preset names its source in `sources`.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from profiler.engine.cost import BatchShape, CostModel, check_term


def vllm_capture_sizes(max_num_seqs: int = 256) -> tuple[int, ...]:
    """vLLM's default CUDA-graph batch sizes (`VllmConfig._set_cudagraph_sizes`,
    vllm/config/vllm.py): 1, 2, 4, multiples of 8 below 256, then multiples of 16, up to
    min(2 x max_num_seqs, 512)."""
    largest = min(max_num_seqs * 2, 512)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)]
    return tuple(size for size in sizes if size <= largest)


@dataclass(frozen=True, slots=True)
class HostModel:
    """vLLM's host-side terms (see the module docstring); all zero = a kernel-only node."""

    frontend_request_ms: float = 0.0
    frontend_per_token_us: float = 0.0
    frontend_per_running_ms: float = 0.0
    frontend_node_ms: float = 0.0
    frontend_node_per_token_us: float = 0.0
    frontend_service_ms: float = 0.0
    frontend_finish_ms: float = 0.0
    step_base_ms: float = 0.0
    step_per_request_ms: float = 0.0
    step_per_token_ms: float = 0.0
    step_per_prefill_ms: float = 0.0
    cuda_graph_sizes: tuple[int, ...] = ()
    async_scheduling: bool = False
    async_residual_ms: float = 0.0
    schedules_ahead: bool = False
    cold_step_host_ms: float = 0.0
    kv_handoff_ms: float = 0.0
    kv_per_token_us: float = 0.0
    kv_descriptor_us: float = 0.0
    descriptors_per_block: int = 0
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
                raise ValueError(f"HostModel.{item.name} must be >= 0, got {value}")
        object.__setattr__(self, "cuda_graph_sizes", tuple(sorted(self.cuda_graph_sizes)))

    def frontend_s(self, prompt_tokens: int, running: int = 0) -> float:
        """The API server's time on a request of this many prompt tokens before its engine
        sees it, with `running` requests in the engine's batch."""
        return (self.frontend_request_ms + self.frontend_per_token_us * prompt_tokens / 1000
                + self.frontend_per_running_ms * running) / 1000

    def node_side(self) -> HostModel:
        """The front end the node itself spends (what an emulated node sleeps): the node's
        parts when the preset has them, never more than the whole."""
        if not (self.frontend_node_ms or self.frontend_node_per_token_us):
            return self
        return replace(self,
                       frontend_request_ms=min(self.frontend_node_ms, self.frontend_request_ms),
                       frontend_per_token_us=min(self.frontend_node_per_token_us,
                                                 self.frontend_per_token_us))

    def step_host_ms(self, shape: BatchShape) -> float:
        """Host CPU time of one step (scheduler, input preparation, sampling bookkeeping)."""
        if shape.is_empty:
            return 0.0
        requests = shape.num_prefill_requests + shape.num_decode_requests
        return (self.step_base_ms + self.step_per_request_ms * requests
                + self.step_per_prefill_ms * shape.num_prefill_requests
                + self.step_per_token_ms * shape.num_tokens)

    def exposed_host_ms(self, shape: BatchShape, kernel_ms: float) -> float:
        """The part of the host time the step's wall time includes."""
        host = self.step_host_ms(shape)
        if not self.async_scheduling or shape.is_empty:
            return host
        return max(0.0, host - kernel_ms) + self.async_residual_ms

    def cold_step_ms(self, shape: BatchShape) -> float:
        """What a step launched on an idle engine pays on top of `step_ms` (no step in flight
        hides its host work)."""
        return 0.0 if shape.is_empty else self.cold_step_host_ms

    def graph_shape(self, shape: BatchShape) -> BatchShape:
        """The batch the GPU runs: a decode-only batch padded to the next captured size
        (padding slots cost kernel time but attend to nothing extra)."""
        if not self.cuda_graph_sizes or shape.num_prefill_requests or not shape.num_decode_requests:
            return shape
        sizes = self.cuda_graph_sizes
        index = bisect.bisect_left(sizes, shape.num_decode_requests)
        if index == len(sizes):
            return shape  # larger than every captured size: eager, unpadded
        # A decode-only batch: built directly (dataclasses.replace costs ~10x, once a step).
        return BatchShape(0, 0, 0, sizes[index], shape.sum_decode_kv_tokens)

    def handoff_s(self, num_tokens: int, block_size: int) -> float:
        """D's fixed cost of one P->D pull beyond the bytes on the link."""
        blocks = -(-num_tokens // block_size)
        return (self.kv_handoff_ms + self.kv_per_token_us * num_tokens / 1000
                + self.kv_descriptor_us * self.descriptors_per_block * blocks / 1000) / 1000

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cuda_graph_sizes"] = list(self.cuda_graph_sizes)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostModel:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown host keys: {sorted(unknown)}")
        values = dict(data)
        if "cuda_graph_sizes" in values:
            sizes = values["cuda_graph_sizes"]
            if not isinstance(sizes, list) or not all(
                    isinstance(size, int) and not isinstance(size, bool) and size > 0
                    for size in sizes):
                raise ValueError("host terms: cuda_graph_sizes must be a list of batch sizes "
                                 f"(whole numbers > 0), got {sizes!r}")
            values["cuda_graph_sizes"] = tuple(sizes)
        defaults = cls()
        for key, value in values.items():
            default = getattr(defaults, key)
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"host terms: {key} must be true or false, got {value!r}")
            elif isinstance(default, int | float):
                check_term("host terms", key, value)
        return cls(**values)


NO_HOST = HostModel()


@dataclass
class HostedCost:
    """A `CostModel`: a kernel cost model plus vLLM's host side.

    step = kernels(the batch as the GPU runs it, CUDA-graph padded) + exposed host time.
    `engine` holds EngineConfig overrides the preset's hardware implies (e.g. vLLM-CPU's
    128-token blocks); `kv_blocks` comes from the kernel model when it has a memory model.
    """

    name: str
    kernel: CostModel
    host: HostModel
    source: str = ""
    engine: dict[str, int] = field(default_factory=dict)
    vllm: str = ""  # the vLLM release the host terms stand for ("" = not said)

    def step_ms(self, shape: BatchShape) -> float:
        if shape.is_empty:
            return 0.0
        kernel_ms = self.kernel.step_ms(self.host.graph_shape(shape))
        return kernel_ms + self.host.exposed_host_ms(shape, kernel_ms)

    def kv_blocks(self, block_size: int = 16, max_num_batched_tokens: int = 8192,
                  max_num_seqs: int = 256) -> int | None:
        if "num_kv_blocks" in self.engine:
            return int(self.engine["num_kv_blocks"])
        return self.kernel.kv_blocks(block_size, max_num_batched_tokens, max_num_seqs)


def host_of(cost: CostModel) -> HostModel:
    """The host terms of a cost model (none for a kernel-only or fitted linear one)."""
    host = getattr(cost, "host", None)
    return host if isinstance(host, HostModel) else NO_HOST
