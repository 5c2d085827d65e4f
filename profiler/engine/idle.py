"""`ppd sim idle`: what a cost preset predicts for one request on an otherwise idle engine.

    ppd sim idle --preset h100:llama-3.1-8b --prompt 2080 --cached 2048 \
        [--decoding 30 --context 2048] [--max-tokens 64]

One engine of the preset (vLLM's H100 server defaults: a 8,192-token budget, the preset's KV
cache), driven in virtual time:
- `--cached H`: the prompt's first H tokens were sent before (a history), so their full
  blocks are in the prefix cache;
- `--decoding B --context C`: B requests with C-token prompts are decoding when the request
  arrives; it arrives at four evenly spread points of a step (a client does not know where
  the engine is in its step) and the numbers are the means over the four.
TTFT is the client's: the preset's front end plus the engine's queue, steps and first-token
alignment. TPOT is the request's own over its `max_tokens` outputs, or, with `--decoding`,
the decoding requests' mean time per output token over the `max_tokens` steps that follow the
arrival (the new prompt's steps among them).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from profiler.engine.config import EngineConfig
from profiler.engine.cost import CostModel
from profiler.engine.engine import Engine
from profiler.engine.host import host_of
from profiler.engine.measured import H100_SERVER_TOKEN_BUDGET
from profiler.engine.requests import Request

ARRIVAL_PHASES = (0.125, 0.375, 0.625, 0.875)  # where in a step the request arrives
_HISTORY, _FRESH, _BATCH = 1 << 40, 1 << 41, 1 << 42  # token-id ranges that never collide


@dataclass(frozen=True, slots=True)
class IdleShape:
    prompt: int  # the request's prompt tokens, the cached ones included
    cached: int = 0  # of those, the leading tokens sent before (in the prefix cache)
    decoding: int = 0  # requests decoding when it arrives
    context: int = 0  # their prompt tokens
    max_tokens: int = 64

    def check(self, max_num_seqs: int) -> None:
        """A clear error for a shape that cannot run."""
        if self.prompt < 1:
            raise ValueError("--prompt must be at least 1 token")
        if not 0 <= self.cached < self.prompt:
            raise ValueError(f"--cached must be between 0 and --prompt - 1 ({self.prompt - 1}): "
                             "vLLM always computes a prompt's last token")
        if self.max_tokens < 2:
            raise ValueError("--max-tokens must be at least 2 (a TPOT needs two tokens)")
        if self.decoding < 0 or self.context < 0:
            raise ValueError("--decoding and --context must be >= 0")
        if self.decoding and self.context < 1:
            raise ValueError("--decoding needs --context (each decoding request's prompt)")
        if self.context and not self.decoding:
            raise ValueError("--context needs --decoding (how many requests decode)")
        if self.decoding + 1 > max_num_seqs:
            raise ValueError(f"--decoding {self.decoding} + the request exceed max_num_seqs "
                             f"{max_num_seqs}")


@dataclass(frozen=True, slots=True)
class IdlePrediction:
    ttft_ms: float
    tpot_ms: float
    # of the --decoding requests, how many were not decoding in the K steps after the arrival
    # (finished, or preempted for want of KV blocks, before it): the TPOT is the others'
    not_decoding: float = 0.0
    kv_blocks: int = 0  # the engine's KV cache, for saying why

    def line(self) -> str:
        return f"ttft_ms={self.ttft_ms:.2f} tpot_ms={self.tpot_ms:.2f}"

    def warning(self, shape: IdleShape) -> str | None:
        """Why the TPOT is not all B requests' (None when it is)."""
        if not self.not_decoding:
            return None
        return (f"{self.not_decoding:g} of the {shape.decoding} decoding requests (mean over the "
                f"{len(ARRIVAL_PHASES)} arrival points) were not decoding in the "
                f"{shape.max_tokens} steps after the request arrived: the engine's KV cache "
                f"({self.kv_blocks:,} blocks of 16 tokens) cannot hold {shape.decoding} requests "
                f"of {shape.context} tokens and their outputs at once, so vLLM's scheduler "
                "preempted some (recompute) and others finished while they waited; tpot_ms is "
                "over the rest. Lower --decoding or --context for a batch that fits.")


def engine_config(cost: CostModel) -> EngineConfig:
    base = EngineConfig(max_num_batched_tokens=H100_SERVER_TOKEN_BUDGET)
    blocks = cost.kv_blocks(base.block_size, base.max_num_batched_tokens, base.max_num_seqs)
    return EngineConfig(max_num_batched_tokens=base.max_num_batched_tokens,
                        num_kv_blocks=blocks or base.num_kv_blocks)


def predict(cost: CostModel, shape: IdleShape) -> IdlePrediction:
    config = engine_config(cost)
    shape.check(config.max_num_seqs)
    runs = [_run(cost, config, shape, phase)
            for phase in (ARRIVAL_PHASES if shape.decoding else (0.0,))]
    return IdlePrediction(statistics.fmean(r.ttft_ms for r in runs),
                          statistics.fmean(r.tpot_ms for r in runs),
                          statistics.fmean(r.not_decoding for r in runs), config.num_kv_blocks)


class _Driver:
    """One engine in virtual time; every token's time is kept per request."""

    def __init__(self, cost: CostModel, config: EngineConfig) -> None:
        self.engine = Engine(config, cost)
        self.now = 0.0
        self.token_times: dict[str, list[float]] = {}
        self.last_step = (0.0, 0.0)

    def submit(self, request: Request, at: float) -> None:
        self.token_times[request.id] = []
        self.engine.submit(request, now=at)
        self.now = max(self.now, at)

    def step(self) -> bool:
        """Run the next step; False when there is nothing to run."""
        start = self.engine.next_step_time()
        if start is None:
            return False
        result = self.engine.step(max(start, self.now))
        self.now = result.end
        self.last_step = (result.start, result.end)
        for request_id in result.tokens:
            self.token_times[request_id].append(result.end)
        return True

    def finished(self, request_id: str) -> bool:
        return self.engine.sequence(request_id).finish_time is not None


def _run(cost: CostModel, config: EngineConfig, shape: IdleShape, phase: float) -> IdlePrediction:
    driver = _Driver(cost, config)
    batch = [f"b{i}" for i in range(shape.decoding)]
    budget = config.max_num_batched_tokens
    # enough outputs to decode through the warm-up, the request's prompt and its K steps
    outputs = (shape.decoding * shape.context + shape.prompt) // budget + shape.max_tokens + 64
    for index, name in enumerate(batch):
        first = _BATCH + index * shape.context
        driver.submit(Request(name, max_tokens=outputs,
                              prompt_token_ids=list(range(first, first + shape.context))), 0.0)
    history = list(range(_HISTORY, _HISTORY + shape.cached))
    if shape.cached:
        driver.submit(Request("history", max_tokens=1, prompt_token_ids=history), 0.0)
    # warm-up: the history is cached and every batch request decodes
    while ((shape.cached and not driver.finished("history"))
           or any(len(driver.token_times[name]) < 2 for name in batch)):
        driver.step()
    frontend = host_of(cost).frontend_s(shape.prompt, driver.engine.num_running())
    if batch:  # reaches the engine at `phase` of a step
        target = driver.now + frontend
        while driver.last_step[1] < target:
            driver.step()
        start, end = driver.last_step
        at_engine = start + phase * (end - start)
    else:  # an idle engine
        driver.step()
        at_engine = driver.now + 1.0 + frontend
    arrival = at_engine - frontend
    before = {name: max((t for t in driver.token_times[name] if t <= arrival), default=arrival)
              for name in batch}
    fresh = list(range(_FRESH, _FRESH + shape.prompt - shape.cached))
    driver.submit(Request("request", max_tokens=shape.max_tokens,
                          prompt_token_ids=history + fresh), at_engine)
    while not driver.finished("request") or any(
            _after(driver.token_times[name], arrival) < shape.max_tokens for name in batch):
        if not driver.step():
            break
    times = driver.token_times["request"]
    ttft_ms = (times[0] - arrival) * 1000
    if not batch:
        return IdlePrediction(ttft_ms, (times[-1] - times[0]) * 1000 / (len(times) - 1))
    gaps = []
    for name in batch:
        after = [t for t in driver.token_times[name] if t > arrival][:shape.max_tokens]
        if after:  # none: it finished, or waited preempted, through the whole window
            gaps.append((after[-1] - before[name]) * 1000 / len(after))
    if not gaps:
        raise ValueError(f"none of the {shape.decoding} requests decoded after the request "
                         f"arrived: the KV cache ({config.num_kv_blocks:,} blocks of 16 tokens) "
                         f"cannot hold {shape.decoding} requests of {shape.context} tokens; "
                         "lower --decoding or --context")
    return IdlePrediction(ttft_ms, statistics.fmean(gaps), len(batch) - len(gaps))


def _after(times: list[float], moment: float) -> int:
    return sum(1 for t in times if t > moment)
