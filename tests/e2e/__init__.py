"""End-to-end tests against real vLLM servers on the CPU (marker `vllm`)."""
