"""Omni-RAG (Chen et al., 2025): Source Planning Optimisation. Its stages (exploration, judging, pairs), the
oracle's stand-ins for its expert and judge, and the planner + frozen reader pipeline."""

from omnimed.methods.omnirag import method  # noqa: F401 (registers the method and its stages)
