"""Everything the proxy sends to its nodes, through one seam (`legs.Legs`): the legs' bodies
and answers (`forward`, `pd_protocol`), their transports (`transport` over `http1` and
`http1_connection`, `aiohttp_legs`, `httpx_legs`; `bounded_legs` caps what comes back), a
streamed body passed back to the client (`relay`), what a request holds (`lease`, `deadline`),
and the node pool (`backends`, `breaker`, `health`, `discovery` and `register` for nodes that
announce themselves).
"""
