"""Routing policies, one module each (`pd`, `local`, `fixed`, `threshold`, `replica`, `ppd`,
`live`), found by name in `registry`; what a module declares is in `base`. `RoutingPolicy`
(`routing`) is the configured one, as the proxy and the simulator call it."""

from proxy.policies.routing import RoutingPolicy

__all__ = ["RoutingPolicy"]
