"""The flags every simulator command shares (`ppd sim run`, `ppd sim grid`)."""

from __future__ import annotations

import argparse

from proxy.live.load_meter import DEFAULT_LOAD_WINDOW_S
from proxy.readback.protocol import VLLM_DECODER_BLOCKS_TTL_S

# Here, not in run.py: the parsers need them before the simulator (numpy, pandas) is imported.
DEFAULT_COST = "h100:llama-3.1-8b"
DEFAULT_LINK = "nvlink"


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """Flags every simulator command shares: the cost preset, model, link, engine seed."""
    parser.add_argument("--cost", default=DEFAULT_COST,
                        help="cost preset (`ppd sim presets`) or a JSON file from `ppd sim fit` "
                        f"(default {DEFAULT_COST})")
    parser.add_argument("--model", help="model whose KV size the transfers move (default: the "
                        "model part of --cost, e.g. llama-3.1-8b)")
    parser.add_argument("--link", default=DEFAULT_LINK,
                        help=f"P->D link preset: nvlink, rdma-400g, tcp-25g (default "
                        f"{DEFAULT_LINK})")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="per-request timeout in seconds; a slower turn fails (default 30, "
                        "the paper's)")
    parser.add_argument("--seed", type=int, default=0, help="arrivals, workload and engine seed")
    parser.add_argument("--load-window", type=float, default=DEFAULT_LOAD_WINDOW_S,
                        help="the proxy's --load-window: seconds its turns-per-second meter "
                        "averages over (default 30, the proxy's)")
    parser.add_argument("--client-connections", type=int, default=None, metavar="N",
                        help="model the PPD paper's benchmark client: at most N requests in "
                        "flight, a turn due while all are busy waits and its TTFT counts the "
                        "wait (default: the ideal client, as ppd replay)")
    parser.add_argument("--client", choices=("ideal", "paper"), default="ideal",
                        help="ideal: every turn sent when due, replies back as their own ids "
                        "(as ppd replay); paper: the PPD paper's benchmark client - 50 "
                        "connections, its clock, replies sent back as text of which only a "
                        "measured share still hits the prefix cache; with its proxy's "
                        "placement of conversations by hash (docs/simulator.md)")
    parser.add_argument("--fresh-arrivals", action="store_true",
                        help="each run draws its own arrival times, as the PPD paper's unseeded "
                        "script did (default: every layout and policy replays the same draw, "
                        "so configurations are compared on the same arrivals)")
    readback = parser.add_mutually_exclusive_group()
    readback.add_argument("--kv-readback-ttl", type=float, default=None, metavar="S",
                          help="D keeps each finished turn's blocks pinned S seconds for a "
                          "readback (vLLM's bidirectional NIXL; docs/readback.md). Default: "
                          f"{VLLM_DECODER_BLOCKS_TTL_S:g}, vLLM's and `ppd cluster up`'s; off "
                          "with --client paper (the paper's testbed had no such transfer)")
    readback.add_argument("--no-kv-readback", action="store_true",
                          help="D keeps nothing: no readback route, no pinned blocks")
    parser.add_argument("--reply-retokenized", action="store_true",
                        help="each reply comes back in the next turn as text the server "
                        "tokenizes into other ids, so it misses the prefix cache (the tiny "
                        "CPU model's replies do; default: replies hit, as on a real model)")


def readback_ttl(args: argparse.Namespace) -> float | None:
    """How long the simulated Ds keep a finished turn's blocks (None: not at all)."""
    if args.no_kv_readback:
        return None
    if args.kv_readback_ttl is not None:
        if not args.kv_readback_ttl > 0:
            raise ValueError("--kv-readback-ttl must be > 0")
        return float(args.kv_readback_ttl)
    return None if args.client == "paper" else VLLM_DECODER_BLOCKS_TTL_S


def add_trace_window_flags(parser: argparse.ArgumentParser,
                           rate: argparse._MutuallyExclusiveGroup) -> None:
    """A timed block-hash trace's load and window: --time-scale (in the rate group: it is
    the load of such a trace) and --start (docs/production-traces.md)."""
    rate.add_argument("--time-scale", type=float, metavar="F",
                      help="a timed block-hash trace (Mooncake's format) arrives as "
                      "recorded, F times faster (2: twice the rate); its --duration is "
                      "seconds of the trace from --start")
    parser.add_argument("--start", type=float, default=0.0, metavar="S",
                        help="a timed trace's window starts S seconds into it (default 0)")


def load_of(args: argparse.Namespace) -> float:
    """The run's load: --conversation-rate for conversations, --time-scale for a timed trace
    (RunSpec.qps holds either); the other one is refused with the reason."""
    from profiler.simulator.workload import is_timed_dataset

    timed = is_timed_dataset(args.dataset)
    if timed and args.time_scale is None:
        raise ValueError(f"{args.dataset} is a timed trace: it arrives as recorded, so its "
                         "load is --time-scale F (1: the recorded rate), not a conversation "
                         "rate")
    if not timed and args.time_scale is not None:
        raise ValueError("--time-scale is for a timed block-hash trace (Mooncake's format); "
                         f"{args.dataset} is conversations: give --conversation-rate R")
    return float(args.time_scale if timed else args.qps)
