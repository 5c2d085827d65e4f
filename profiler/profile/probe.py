"""Before `ppd profile --target` measures anything: is the target a ppd proxy that forces routes?

The profiler's table is only as good as the forced route: a target that ignores `x-ppd-route`
(a bare vLLM node, a proxy under policy replica) would serve both "routes" the same way and
yield a table of look-alike cells with a verdict; a proxy that refuses the header (401: no or
the wrong admin key) would yield a table of failed cells after hours of load, and a proxy
started without an admin key ignores it (saying so in `x-ppd-route-ignored`). One forced turn,
sent before the first cell, tells them apart: a ppd proxy that honours the header answers with
the route it was told to take in its own `x-ppd-route` response header.

With `--readback`, the proxy's policy must also be one that reads back (`Needs.readback`:
readback, ppd, live, ...): under any other the proxy keeps no turn's blocks, every forced
readback falls back to P->D (readback_missing) and the readback columns would stay empty after
hours of load.
/stats names the policy (`check_keeps_blocks`).
"""

from __future__ import annotations

import httpx

from profiler.replay.request_bodies import error_message
from proxy.policies import registry
from proxy.shared.redact import redacted_url
from proxy.shared.vocabulary import RouteKind

# pd: a turn 1 can always take it (local needs a session on a decode node).
PROBE_ROUTE = RouteKind.PD
PROBE_SESSION = "ppd-profile-probe"


class TargetRefused(ValueError):
    """The target cannot be profiled; the message says why and what to do."""


async def check_forced_route(client: httpx.AsyncClient, model: str,
                             admin_key: str | None) -> None:
    """Send one tiny turn forced to PROBE_ROUTE; raise TargetRefused unless the answer is a 200
    that took that route (the `x-ppd-route` response header)."""
    url = redacted_url(str(client.base_url).rstrip("/"))
    headers = {"x-ppd-route": PROBE_ROUTE.value, "x-session-id": PROBE_SESSION}
    if admin_key:
        headers["authorization"] = f"Bearer {admin_key}"
    body = {"model": model, "max_tokens": 1, "stream": True,
            "messages": [{"role": "user", "content": "ppd profile: is the route forced?"}]}
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body,
                                 headers=headers) as response:
            status, taken = response.status_code, response.headers.get("x-ppd-route")
            ignored = response.headers.get("x-ppd-route-ignored")
            answer = await response.aread()
    except httpx.HTTPError as exc:
        raise TargetRefused(f"the probe turn to {url} failed ({type(exc).__name__}: {exc}): "
                            f"is the proxy running at {url}?") from None
    if status == 401:
        fix = ("the --admin-key given is not the proxy's: pass the key the proxy was started "
               "with (its --admin-key)" if admin_key else
               "pass the proxy's admin key with --admin-key KEY (the key it was started with)")
        raise TargetRefused(f"{url} refused the forced route ({error_message(status, answer)})"
                            f"; {fix}")
    if ignored is not None:
        raise TargetRefused(
            f"the proxy at {url} has no admin key, so it ignores x-ppd-route and no route can "
            "be forced: restart it with --admin-key KEY (`ppd cluster up --with-proxy "
            "--proxy-args '--admin-key KEY'`) and pass the same key here with --admin-key KEY")
    if status != 200:
        raise TargetRefused(f"the probe turn forced to {PROBE_ROUTE} failed at {url}: "
                            f"{error_message(status, answer)}")
    if taken != PROBE_ROUTE.value:
        seen = f"x-ppd-route: {taken}" if taken else "no x-ppd-route header"
        raise TargetRefused(
            f"{url} did not take the forced route (a turn forced to {PROBE_ROUTE} came back with "
            f"{seen}): the profiler measures both routes by forcing them, so the target must "
            "be a ppd proxy (`ppd proxy`) in front of P and D nodes, not a vLLM node, and not "
            "a proxy under --policy replica (which ignores the header)")


async def check_keeps_blocks(client: httpx.AsyncClient) -> None:
    """Raise TargetRefused when the target's policy (its /stats `policy`) never reads back:
    the proxy keeps nothing to read for it, so no turn forced to readback is served as one. A policy
    this profiler does not know (a newer proxy's) is let through."""
    url = redacted_url(str(client.base_url).rstrip("/"))
    try:
        response = await client.get("/stats")
        policy = response.json().get("policy") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        policy = None
    spec = registry.policies().get(str(policy)) if policy is not None else None
    if spec is not None and not spec.needs.readback:
        readers = ", ".join(name for name, other in registry.policies().items()
                            if other.needs.readback)
        raise TargetRefused(
            f"the proxy at {url} runs --policy {policy}, which never reads back, so it keeps "
            f"no turn's blocks to read and every turn forced to readback would be served P->D: "
            f"restart it under a policy that reads back ({readers}; e.g. --policy readback - "
            "forced routes override the policy, so pd and local are measured as before)")
