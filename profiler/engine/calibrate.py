"""`ppd sim calibrate`: a kernels + host preset fitted to a real cluster's replay runs.

Input: replay run directories (requests.csv / .parquet) that also hold each node's vLLM
`/metrics` taken before and after the run, as `metrics-before-NODE.txt` and
`metrics-after-NODE.txt` (NODE starting with `prefill`, `decode` or `replica`;
`scripts/calibration_runs.sh` takes them). The fit works on server-side histograms and on
medians, so bursty client-side streams (tokens arriving in clumps on a loaded machine) do not
move it:

1. **Prefill step** (P nodes, or replicas): per run, the mean of
   `vllm:request_prefill_time_seconds` against the mean prompt tokens a request computed
   there ((prompt - prefix-cache hits) / requests); a Huber line over runs gives the step's
   constant and its per-token slope.
2. **Decode step** (D nodes, or replicas): per run, the mean of
   `vllm:inter_token_latency_seconds`, less the prompt tokens computed on that node per step
   at the prefill slope, against the mean number of requests decoding there (from the rows'
   [first token, end] intervals); a Huber line gives the per-step base (the host's
   `step_base_ms`) and the per-decode slope.
3. **Front end**: the median over local turn-2 rows of client TTFT - the modelled prefill of
   the tokens the node does not cache - half a decode step (a request waits for the step in
   flight), with the proxy and HTTP folded in.
4. **P->D hand-off**: a Huber line, over P->D rows (turn 1, and turn 2 when forced P->D),
   of client TTFT - two front ends - the modelled prefill on P - D's step alignment (three
   decode steps, `D_ALIGNMENT_STEPS`, which the engine model produces itself), against
   the tokens D pulls: a fixed part per transfer and a per-token part. With NixlConnector
   D pulls only the blocks it lacks (on turn 2, the new tokens past the history it holds);
   with the shared-storage connector (`whole_prompt_transfer`) it loads the whole prompt's
   file, so the prompt is the size.

With a shape probe (`ppd cluster probe`, `probe=`), step 1 is fitted on the probe's rows
instead: the node's prefill time per request against the steps it took (chunks of the token
budget), the tokens it computed and their attention over earlier context (tokens x mean
context), by least squares - the one fit in which the per-token and the attention terms can
be told apart (`fit_probe`).

On a CPU the host and the compute of a step cannot be told apart (the same cores do both),
so the compute terms go into the `LinearCost` kernel and the step constant into the host.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler.engine.cost import LinearCost
from profiler.engine.fit import _mean_overlap, numeric_column, read_frame, read_runs
from profiler.engine.host import HostedCost, HostModel
from proxy.observability.prometheus_text import sample_sums
from proxy.shared.vocabulary import Role, RouteKind

HISTOGRAMS = ("time_to_first_token_seconds", "request_queue_time_seconds",
              "request_prefill_time_seconds", "inter_token_latency_seconds")
COUNTERS = ("prompt_tokens_total", "prefix_cache_hits_total",
            "external_prefix_cache_hits_total", "generation_tokens_total")
MIN_RUNS = 2
# What the engine model itself puts between a P->D request reaching a busy D and its first
# token, in D's decode steps: half a step waiting for the step in flight, the step that
# admits it (its pull starts at that step's end), half a step until D sees the KV, the step
# that recomputes the last prompt token. The fitted hand-off is what is left beyond them.
D_ALIGNMENT_STEPS = 3
# The metrics the fit reads; a NaN in one would reach the least-squares solver.
READ_METRICS = frozenset({*(f"{h}_{part}" for h in HISTOGRAMS for part in ("sum", "count")),
                          *COUNTERS})
# What `ppd cluster probe` writes to probe.csv (shape_probe.ProbeRow); `running` came later
# and `node` is not read.
PROBE_COLUMNS = ("kind", "prompt_tokens", "computed_tokens", "prefill_ms", "queue_ms",
                 "client_ms")
PROBE_KINDS = ("cold", "hit", "append", "text", "chat-via-proxy", "busy-text")


@dataclass(frozen=True, slots=True)
class NodeDelta:
    """One node's vLLM counters over one run (after - before)."""

    role: Role
    values: dict[str, float]

    def mean_ms(self, histogram: str) -> float | None:
        count = self.values.get(f"{histogram}_count", 0.0)
        return self.values.get(f"{histogram}_sum", 0.0) / count * 1000 if count > 0 else None

    @property
    def requests(self) -> float:
        return self.values.get("time_to_first_token_seconds_count", 0.0)

    @property
    def computed_prompt_tokens(self) -> float:
        """Prompt tokens this node computed (not hit in its cache, not received from a P)."""
        v = self.values
        return max(v.get("prompt_tokens_total", 0.0) - v.get("prefix_cache_hits_total", 0.0)
                   - v.get("external_prefix_cache_hits_total", 0.0), 0.0)


@dataclass(slots=True)
class CalibrationRun:
    path: Path
    rows: pd.DataFrame
    nodes: list[NodeDelta] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Calibration:
    cost: HostedCost
    n_runs: int
    prefill_points: int
    decode_points: int
    frontend_rows: int
    handoff_rows: int
    # Share of turn 1's reply that turn 2 found in D's prefix cache (None: no local turn 2).
    reply_hit_share: float | None = None

    @property
    def reply_retokenized(self) -> bool:
        """Replies come back as other token ids: simulate with `--reply-retokenized`."""
        return self.reply_hit_share is not None and self.reply_hit_share < 0.5


def parse_metrics(text: str) -> dict[str, float]:
    """vLLM's /metrics text -> {name without `vllm:`: value}, summed over label sets (one
    engine per node); histogram buckets and `_created` samples left out."""
    return {name.removeprefix("vllm:"): value for name, value in sample_sums(text).items()
            if name.startswith("vllm:") and not name.endswith(("_bucket", "_created"))}


def read_run(path: Path) -> CalibrationRun:
    rows = read_runs([path])
    directory = path if path.is_dir() else path.parent
    run = CalibrationRun(directory, rows)
    for after in sorted(directory.glob("metrics-after-*.txt")):
        node = after.name.removeprefix("metrics-after-").removesuffix(".txt")
        before = directory / f"metrics-before-{node}.txt"
        end = read_metrics(after)
        start = read_metrics(before) if before.is_file() else {}
        role = next((r for r in Role if node.startswith(r.value)), None)
        if role is None:
            raise ValueError(f"{after}: node name {node!r} must start with prefill, decode or "
                             "replica")
        run.nodes.append(NodeDelta(role, {k: v - start.get(k, 0.0) for k, v in end.items()}))
    if not run.nodes:
        raise ValueError(f"{directory}: no metrics-after-NODE.txt: take each node's /metrics "
                         "before and after the run (see scripts/calibration_runs.sh)")
    return run


def read_metrics(path: Path) -> dict[str, float]:
    """A node's /metrics file, parsed; a metric the fit reads that is NaN or infinite is a
    ValueError naming the file (a NaN would only surface as a solver failure later)."""
    try:
        values = parse_metrics(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    bad = sorted(name for name in READ_METRICS & values.keys() if not math.isfinite(values[name]))
    if bad:
        raise ValueError(f"{path}: metric(s) {', '.join('vllm:' + name for name in bad)} "
                         "are not finite numbers")
    return values


def read_probe(path: Path) -> pd.DataFrame:
    """A shape probe (`ppd cluster probe`'s probe.csv), checked before any fit: its columns,
    its kinds of row, and its numbers (every cell filled, finite, not negative)."""
    rows = read_frame(path)
    missing = [name for name in PROBE_COLUMNS if name not in rows.columns]
    if missing:
        raise ValueError(f"{path}: not a shape probe from `ppd cluster probe` (missing "
                         f"column(s) {missing})")
    unknown = sorted(set(rows["kind"].astype(str)) - set(PROBE_KINDS))
    if unknown:
        raise ValueError(f"{path}: column kind: unknown kind(s) {unknown}; known: "
                         f"{', '.join(PROBE_KINDS)}")
    for column in (*PROBE_COLUMNS[1:], *(["running"] if "running" in rows.columns else [])):
        rows[column] = numeric_column(rows, column, path, allow_empty=False)
    return rows


def huber_line(x: Sequence[float], y: Sequence[float], delta: float = 1.345,
               iterations: int = 50) -> tuple[float, float]:
    """Intercept and slope of a Huber regression (IRLS; the scale from the residuals' MAD):
    least squares for most points, absolute error for outliers."""
    xs, ys = np.asarray(x, float), np.asarray(y, float)
    if len(xs) < 2 or np.ptp(xs) == 0:
        return float(np.median(ys)), 0.0
    weights = np.ones_like(xs)
    slope = intercept = 0.0
    for _ in range(iterations):
        design = np.column_stack([np.ones_like(xs), xs]) * np.sqrt(weights)[:, None]
        (intercept, slope), *_ = np.linalg.lstsq(design, ys * np.sqrt(weights), rcond=None)
        residuals = ys - intercept - slope * xs
        scale = 1.4826 * float(np.median(np.abs(residuals - np.median(residuals)))) or 1e-9
        scaled = np.abs(residuals) / (delta * scale)
        new = np.where(scaled <= 1, 1.0, 1.0 / np.maximum(scaled, 1e-12))
        if np.allclose(new, weights):
            break
        weights = new
    return float(intercept), float(slope)


def fit_probe(rows: pd.DataFrame, token_budget: int) -> tuple[float, float, float]:
    """(constant per step, ms per computed token, ms per computed token per thousand tokens
    of mean context) of the prefill step, least squares over a shape probe's rows (medians
    per shape first, so a stray slow request does not move the fit)."""
    ids = rows[rows["kind"].isin(("cold", "hit", "append"))]
    shapes = ids.groupby(["kind", "prompt_tokens", "computed_tokens"], as_index=False)[
        "prefill_ms"].median()
    features, times = [], []
    for shape in shapes.itertuples():
        computed = max(int(shape.computed_tokens), 1)
        context = max(int(shape.prompt_tokens) - computed, 0)
        steps = tokens = pairs = 0.0
        while computed > 0:  # chunked prefill: a step takes at most the budget
            chunk = min(computed, token_budget)
            steps, tokens = steps + 1, tokens + chunk
            pairs += chunk * (context + chunk / 2) / 1000
            context, computed = context + chunk, computed - chunk
        features.append((steps, tokens, pairs))
        times.append(float(shape.prefill_ms))
    if len(features) < 3:
        raise ValueError("the probe has fewer than 3 shapes: run `ppd cluster probe` with "
                         "more --lengths")
    coefficients, *_ = np.linalg.lstsq(np.asarray(features), np.asarray(times), rcond=None)
    constant, per_token, attention = (max(float(c), 0.0) for c in coefficients)
    return constant, per_token, attention


def probe_frontend_per_token_us(rows: pd.DataFrame) -> float:
    """The front end's per-prompt-token time (us) from a shape probe's text prompts: a Huber
    line of what each took outside the engine (client - queue - prefill) against its tokens.
    The prompts sent through the proxy when the probe has them (the path replayed turns take),
    else those sent to the node."""
    through_proxy = rows[rows["kind"] == "chat-via-proxy"]
    text = through_proxy if len(through_proxy) else rows[rows["kind"] == "text"]
    if len(text) < MIN_RUNS or text["prompt_tokens"].nunique() < 2:
        return 0.0
    outside = text["client_ms"] - text["queue_ms"] - text["prefill_ms"]
    _, slope = huber_line(text["prompt_tokens"].tolist(), outside.tolist())
    return max(slope * 1000, 0.0)


def probe_frontend_per_running_ms(rows: pd.DataFrame) -> float:
    """What a request waits outside the engine per request its node is running (ms), from a
    shape probe's busy-text rows: least squares of the time outside the engine (client -
    queue - prefill) on prompt tokens and running requests, over the medians of each
    (running, prompt length) cell so that one stray request does not move it. 0 without
    busy-text rows at two or more levels."""
    if "running" not in rows:
        return 0.0
    busy = rows[rows["kind"] == "busy-text"].assign(
        outside=lambda d: d["client_ms"] - d["queue_ms"] - d["prefill_ms"],
        size=lambda d: d["prompt_tokens"].round(-2))
    if busy["running"].nunique() < 2 or len(busy) < MIN_RUNS:
        return 0.0
    cells = busy.groupby(["running", "size"], as_index=False)[["prompt_tokens",
                                                                "outside"]].median()
    design = np.column_stack([np.ones(len(cells)), cells["prompt_tokens"], cells["running"]])
    (_, _, per_running), *_ = np.linalg.lstsq(design, cells["outside"].to_numpy(), rcond=None)
    return max(float(per_running), 0.0)


def probe_node_frontend(rows: pd.DataFrame) -> tuple[float, float]:
    """(ms per request, us per prompt token) a node itself spends outside its engine, from a
    shape probe's text prompts sent straight to it (no proxy, no replay client): a Huber line
    of client - queue - prefill against the prompt's tokens. (0, 0) without them."""
    text = rows[rows["kind"] == "text"]
    if len(text) < MIN_RUNS or text["prompt_tokens"].nunique() < 2:
        return 0.0, 0.0
    outside = text["client_ms"] - text["queue_ms"] - text["prefill_ms"]
    constant, per_token = huber_line(text["prompt_tokens"].tolist(), outside.tolist())
    return max(constant, 0.0), max(per_token * 1000, 0.0)


def calibrate(paths: Sequence[Path], *, name: str, block_size: int = 128,
              engine: dict[str, int] | None = None,
              whole_prompt_transfer: bool = False,
              probe: pd.DataFrame | None = None) -> Calibration:
    runs = [read_run(path) for path in paths]
    if len(runs) < MIN_RUNS:
        raise ValueError(f"give at least {MIN_RUNS} runs (different loads or workloads): "
                         "one run cannot separate a step's constant from its slopes")
    # 1. prefill step from the nodes that prefill whole prompts (P, or replicas), or from a
    # shape probe of one
    px, py = [], []
    for run in runs:
        for node in run.nodes:
            mean = node.mean_ms("request_prefill_time_seconds")
            if node.role in (Role.PREFILL, Role.REPLICA) and mean is not None and node.requests:
                px.append(node.computed_prompt_tokens / node.requests)
                py.append(mean)
    attention = frontend_per_token_us = frontend_per_running_ms = 0.0
    node_frontend = (0.0, 0.0)
    if probe is not None:
        frontend_per_token_us = probe_frontend_per_token_us(probe)
        frontend_per_running_ms = probe_frontend_per_running_ms(probe)
        node_frontend = probe_node_frontend(probe)
        budget = (engine or {}).get("max_num_batched_tokens", 2048)
        prefill_base, per_token, attention = fit_probe(probe, budget)
    elif len(px) < MIN_RUNS:
        raise ValueError("no prefill timings: the runs need a P (or replica) node's metrics")
    else:
        prefill_base, per_token = huber_line(px, py)
        per_token = max(per_token, 0.0)
    # 2. decode step from the nodes that decode
    dx, dy = [], []
    for run in runs:
        batch = _decode_batch(run.rows)
        for node in run.nodes:
            itl = node.mean_ms("inter_token_latency_seconds")
            if node.role not in (Role.DECODE, Role.REPLICA) or itl is None or batch is None:
                continue
            steps = node.values.get("inter_token_latency_seconds_count", 0.0) / batch
            # (the attention of these prompt tokens is left in: D's counters do not say
            # what context they attended to)
            prompt_per_step = node.computed_prompt_tokens / steps if steps else 0.0
            dx.append(batch)
            dy.append(itl - per_token * prompt_per_step)
    if len(dx) < MIN_RUNS:
        raise ValueError("no decode timings: the runs need a D (or replica) node's metrics")
    step_base, per_decode = huber_line(dx, dy)
    step_base, per_decode = max(step_base, 0.0), max(per_decode, 0.0)
    # the prefill step's constant beyond a decode step's base: per prompt in the step
    per_prefill_request = max(prefill_base - step_base, 0.0)
    kernel = LinearCost(name=f"{name}-kernel", source="ppd sim calibrate (CPU: host and "
                        "compute share the cores; compute terms)", base_ms=0.0,
                        per_prefill_token_ms=per_token, per_decode_seq_ms=per_decode,
                        per_prefill_attention_ms=attention)

    def step_ms(prompt_tokens: float, decodes: float, context: float = 0.0) -> float:
        prefill = (per_prefill_request + per_token * prompt_tokens
                   + attention * prompt_tokens * (context + prompt_tokens / 2) / 1000
                   if prompt_tokens else 0.0)
        return step_base + per_decode * decodes + prefill

    reply_share = reply_hit_share(runs, block_size)
    reply_held = reply_share is None or reply_share >= 0.5
    # 3. front end: medians of per-row residuals of local turn-2 rows
    frontend_res: list[float] = []
    # (tokens D pulls, TTFT left after the model)
    pd_rows: list[tuple[float, float]] = []
    for run in runs:
        batch = _decode_batch(run.rows) or 1.0
        turns = _turns(run.rows[run.rows["ttft_s"].notna()])
        for (conversation, turn), row in turns.items():
            ttft_ms = float(row.ttft_s) * 1000
            previous = turns.get((conversation, turn - 1))
            # the front ends' per-token part (each node tokenizes the whole prompt), and D's
            # front end's wait behind the requests D runs (P runs few: left out)
            per_token_frontend = frontend_per_token_us * row.n_input_tokens / 1000
            busy_frontend = frontend_per_running_ms * batch
            if turn == 1 and row.route == RouteKind.PD:
                pd_rows.append((row.n_input_tokens, ttft_ms - step_ms(row.n_input_tokens, 0)
                                - D_ALIGNMENT_STEPS * step_ms(0, batch)
                                - 2 * per_token_frontend - busy_frontend))
            if turn < 2 or previous is None:
                continue
            held_d = _held_by_d(previous, block_size, reply_held)
            uncached_d = row.n_input_tokens - held_d
            if row.route == RouteKind.LOCAL:
                frontend_res.append(ttft_ms - step_ms(max(uncached_d, 1), batch, held_d)
                                    - step_ms(0, batch) / 2 - per_token_frontend
                                    - busy_frontend)
            elif row.route == RouteKind.PD:
                held_p = (previous.n_input_tokens // block_size) * block_size
                pulled = row.n_input_tokens if whole_prompt_transfer else max(uncached_d, 1)
                on_p = step_ms(row.n_input_tokens - held_p, 0, held_p)
                pd_rows.append((pulled, ttft_ms - on_p - D_ALIGNMENT_STEPS * step_ms(0, batch)
                                - 2 * per_token_frontend - busy_frontend))
    if not frontend_res:
        raise ValueError("no local turn-2 rows: include a run with turn 2 forced local "
                         "(`ppd replay --force-route local`) to fit the front end")
    frontend = max(float(np.median(frontend_res)), 0.0)
    # 4. P->D hand-off: what a P->D TTFT holds beyond two front ends and the two steps,
    # as a line in the tokens D pulls
    handoff = per_token_us = 0.0
    if pd_rows:
        pulled, left = zip(*pd_rows, strict=True)
        handoff, per_token_ms = huber_line(pulled, [v - 2 * frontend for v in left])
        if handoff < 0 or per_token_ms < 0:  # noise: keep the robust fixed part only
            handoff, per_token_ms = float(np.median(left)) - 2 * frontend, 0.0
        handoff, per_token_us = max(handoff, 0.0), per_token_ms * 1000
    described = ", ".join(str(run.path) for run in runs)
    host = HostModel(
        frontend_request_ms=round(frontend, 3),
        frontend_per_token_us=round(frontend_per_token_us, 3),
        frontend_per_running_ms=round(frontend_per_running_ms, 4),
        frontend_node_ms=round(node_frontend[0], 3),
        frontend_node_per_token_us=round(node_frontend[1], 3),
        step_base_ms=round(step_base, 4),
        step_per_prefill_ms=round(per_prefill_request, 4), kv_handoff_ms=round(handoff, 3),
        kv_per_token_us=round(per_token_us, 3),
        sources={"frontend_request_ms": f"median of {len(frontend_res)} local turn-2 rows",
                 **({"frontend_per_token_us": "shape probe's text prompts (through the "
                                              "proxy when it has them)"}
                    if frontend_per_token_us else {}),
                 **({"frontend_per_running_ms": "shape probe's busy-text prompts (a D "
                                                "decoding 0-N other requests)"}
                    if frontend_per_running_ms else {}),
                 **({"frontend_node_ms": "shape probe's text prompts sent straight to the "
                                         "node (Huber line: constant)",
                     "frontend_node_per_token_us": "the same line's slope"}
                    if any(node_frontend) else {}),
                 "step_base_ms": f"Huber line over {len(dx)} runs' decode ITL",
                 "step_per_prefill_ms": ("shape probe's constant" if probe is not None
                                         else "prefill line's constant") + " - the decode base",
                 "kv_handoff_ms": f"Huber line over {len(pd_rows)} P->D rows",
                 "kv_per_token_us": f"Huber line over {len(pd_rows)} P->D rows"})
    cost = HostedCost(name=name, kernel=kernel, host=host,
                      source=f"ppd sim calibrate on {described}",
                      engine={"block_size": block_size, **(engine or {})})
    return Calibration(cost, len(runs), len(px), len(dx), len(frontend_res), len(pd_rows),
                       reply_share)


def _turns(rows: pd.DataFrame) -> dict[tuple[str, int], Any]:
    """The successful rows by (conversation, turn)."""
    ok = rows[rows["success"].astype(bool)]
    return {(r.conversation_id, int(r.turn)): r for r in ok.itertuples()}


def _held_by_d(previous: Any, block_size: int, reply_held: bool) -> int:
    """Tokens of a turn-2 prompt D holds in full blocks: turn 1's prompt, and its reply but
    the last token (never fed back) when replies come back as the ids D generated."""
    held = previous.n_input_tokens + (previous.n_output_tokens - 1 if reply_held else 0)
    return (held // block_size) * block_size


def reply_hit_share(runs: Sequence[CalibrationRun], block_size: int) -> float | None:
    """How much of turn 1's reply turn 2 found in D's prefix cache, from D's counters on the
    runs with turn 2 forced local: 1 when the reply's blocks hit, 0 when the next turn's prompt
    carries the reply as other token ids (text that re-tokenizes differently: a model whose
    output is not text the tokenizer would produce, or a template that rewrites history)."""
    measured = with_reply = without_reply = 0.0
    for run in runs:
        turns = _turns(run.rows)
        local = [(row, turns.get((cid, turn - 1))) for (cid, turn), row in turns.items()
                 if turn >= 2 and row.route == RouteKind.LOCAL]
        local = [(row, previous) for row, previous in local if previous is not None]
        decode = [node for node in run.nodes if node.role == Role.DECODE]
        if not local or len(decode) != 1:
            continue
        measured += decode[0].computed_prompt_tokens
        for row, previous in local:
            with_reply += row.n_input_tokens - _held_by_d(previous, block_size, True)
            without_reply += row.n_input_tokens - _held_by_d(previous, block_size, False)
    if without_reply - with_reply <= 0:
        return None
    return float(np.clip((without_reply - measured) / (without_reply - with_reply), 0.0, 1.0))


def _decode_batch(rows: pd.DataFrame) -> float | None:
    """Mean number of requests decoding beside a decoding request (itself included), from the
    rows' [first token, end] intervals, weighted by each request's decode time."""
    ok = rows[rows["success"].astype(bool) & rows["ttft_s"].notna()
              & (rows["n_output_tokens"] > 1)]
    if ok.empty:
        return None
    firsts = (ok["start_s"] + ok["ttft_s"]).to_numpy(float)
    ends = (ok["start_s"] + ok["e2e_s"]).to_numpy(float)
    spans = ends - firsts
    means = np.array([_mean_overlap(f, e, firsts, ends) for f, e in zip(firsts, ends,
                                                                          strict=True)])
    return float((means * spans).sum() / spans.sum()) if spans.sum() > 0 else None
