"""The policies `ppd sim compare` sets side by side, named by their own modules: the fixed
routes, the rules other routers ship (docs/anchor-policies.md), ppd's table and live."""

from __future__ import annotations

from proxy.policies import (
    dynamo,
    live,
    llm_d,
    llm_d_sticky,
    local,
    readback,
    vllm_example,
    vllm_router,
)
from proxy.policies import pd as pd_policy
from proxy.policies import ppd as ppd_policy

FIXED = (pd_policy.NAME, local.NAME, readback.NAME)
ANCHORS = (llm_d.NAME, llm_d_sticky.NAME, dynamo.NAME, vllm_router.NAME, vllm_example.NAME)
PPD = ppd_policy.NAME
LIVE = live.NAME
POLICIES = (*FIXED, *ANCHORS, PPD, LIVE)
