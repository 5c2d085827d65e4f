"""Emulated vLLM nodes: vLLM's OpenAI API and P/D protocol, timed by profiler.engine's model.

engine_interface.py (what the runtime needs from an engine) and modelled_engine.py
(profiler.engine behind it), runtime.py (stepping an engine on the wall clock), link.py (KV
transfers sharing a link), tokenizer.py (the tokenizer and synthetic replies), openai_format.py (the
one encoder of vLLM's answers), service.py, metrics.py and app.py (one node's HTTP server),
host.py (several nodes in one process), presets.py and label.py (run metadata);
`ppd cluster up --emulate` is profiler/cluster/emulated.py. See docs/emulated-nodes.md.
"""
