"""What every subsystem of the proxy (and the profiler) shares, importing nothing else of ppd:
the vocabulary (`vocabulary`: roles, a node, a layout, route kinds, a turn's workload, a
decision; `routes`: every route declared once; `explain`: how a reply names its decision),
the errors a client can see (`errors`), request validation (`validate`), JSON on the hot path
(`json_codec`), the reading of a completion answer (`completion`), the one token definition
(`tokens`), the cells of the decision tables (`discretize`), one declaration per option
(`options`, `limits`, `suggest`) and secrets kept out of records (`redact`).
"""
