"""The OpenAI Responses API on the proxy: stored state, routed by identity (docs/responses.md).

`proxy.responses.install` adds the routes to the proxy's app. Modules: `items` (the request
and its items), `chain` (a chain as one chat request), `objects` (the response object),
`events` (the stream's events), `store` and `redis_store` (where responses live),
`service` (one turn), `conversations`, `endpoints` (the routes).
"""
