"""Emulated vLLM nodes: vLLM's OpenAI API and P/D protocol, timed by an engine model.

port.py (what the runtime needs from an engine), basic.py (a linear-cost engine), link.py (KV
transfers sharing a link), runtime.py (stepping an engine on the wall clock), vocab.py
(tokenizer and synthetic replies), openai_format.py, service.py, metrics.py and app.py (one
node's HTTP server), host.py (several nodes in one process; `ppd cluster up --emulate`).
"""
