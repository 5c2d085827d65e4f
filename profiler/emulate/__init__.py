"""Emulated vLLM nodes: vLLM's OpenAI API and P/D protocol, timed by profiler.engine's engine model.

port.py (what the runtime needs from an engine) and sim_engine.py (profiler.engine behind it),
runtime.py (stepping an engine on the wall clock), link.py (KV transfers sharing a link),
vocab.py (tokenizer and synthetic replies), openai_format.py, service.py, metrics.py and app.py
(one node's HTTP server), host.py (several nodes in one process), presets.py, cluster.py
(`ppd cluster up --emulate`) and label.py (run metadata). See docs/emulated-nodes.md.
"""
