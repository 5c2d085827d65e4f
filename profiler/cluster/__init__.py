"""Local vLLM clusters: the plan (layout, ports, flags), the processes, and `ppd cluster`."""
