"""The PPD paper's published figures, printed beside the simulator's (`ppd sim paper`).

From "Not All Prefills Are Equal: PPD Disaggregation for Multi-turn LLM Serving", arXiv
2603.13358: Llama-3.1-8B on 4x H100 80GB (NVLink), vLLM with P2pNccl KV transfer, 18
two-turn synthetic workloads, Poisson arrivals for 10 s per QPS point, failure = a request
slower than 30 s. x is the share of turn-2+ append-prefills run on the session's D (x=0:
P->D every turn; x=1: turn 2+ local). docs/paper-reproduction.md shows them beside ours.
"""

from __future__ import annotations

# Table 1: turn-2 TTFT change (%) from x=0 to x=1 (negative = better), per P/D layout, at
# low (0.5-2), medium (4-8) and high (12-20) QPS.
PAPER_TABLE1 = {"1P3D": (-57.8, -65.2, -73.3), "2P2D": (-47.7, -51.6, -56.2),
                "3P1D": (-44.3, -38.1, -24.9)}
# Table 2: share (%) of (workload, QPS) points each mode wins on turn-2 TTFT, TPOT and
# throughput, and their average. The paper adds: 92.2% of the points have different best
# layouts for turn-2 TTFT and for TPOT.
PAPER_TABLE2 = {"replica": (63.3, 0.6, 0.0, 21.3), "x=0": (0.0, 38.3, 4.4, 14.2),
                "0<x<1": (3.3, 33.3, 27.8, 21.5), "x=1": (27.2, 15.6, 38.3, 27.0)}
# Table 4: failure rates (%, timeout > 30 s) at QPS 8, 12, 16 and 20; pd is x=0, local x=1.
PAPER_TABLE4 = {("3P1D", "pd"): (11, 44, 61, 89), ("3P1D", "local"): (6, 22, 44, 67),
                ("2P2D", "pd"): (0, 6, 11, 22), ("2P2D", "local"): (0, 0, 6, 11),
                ("4R", "replica"): (0, 0, 0, 0)}
