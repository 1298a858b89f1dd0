"""The baselines every paper compares against, registered as methods: the reader alone (``closed_book``), the
reader given passages retrieved with the original question and fused across sources (``rag``), and Omni-RAG's
table 4 query baselines, searched source by source as Omni-RAG plans: the question per source
(``original_question``), pseudo-documents (``query2doc``), a plan revised after self-review (``reflexion``) and a
tree search over reviewed plans (``serts``)."""

from omnimed.methods.baselines import closed_book, query2doc, rag, reflexion, serts  # noqa: F401 (registers them)
