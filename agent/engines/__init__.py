"""Inference engines of our own, for what vLLM cannot serve on a host (see :mod:`agent.runtimes.vllm`)."""
