"""PolyRAG (polyrag.txt): documents judged from several views (relevance, utility, supplement, authority,
timeliness), mixed under a composability constraint. Its stages (utility labels, judge data) and the pipeline."""

from omnimed.methods.polyrag import method  # noqa: F401 (registers the method, its stages and oracle tasks)
