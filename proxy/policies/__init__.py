"""Routing policies, one module each (`pd`, `local`, `fixed`, `threshold`, `replica`, `ppd`,
`live`, ...), found by name in `registry`; what a module declares is in `base`;
`routing.RoutingPolicy` is the configured one, as the proxy and the simulator call it.

This package exports nothing: `registry` imports the policy modules by name, and an
`__init__` that imported `routing` (which imports `registry`) would close a loop.
"""
