"""The proxy as an HTTP server: `app` (`create_app`: the Quart app for every route but the
completions, and `serve`), `endpoints` (the completion endpoints as a bare ASGI app: the hot
path), `server` and `http_server` (uvicorn on a socket it binds, with request deadlines),
`lifespan`, `heap` (the GC settings of a serving process) and `workers` with `embedded_store`
(`--workers N` processes on one port).
"""
