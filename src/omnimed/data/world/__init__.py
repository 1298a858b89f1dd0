"""The synthetic medical world: an entirely FICTIONAL pharmacology rendered into the five knowledge sources.

Invented diseases, symptoms, examination findings, drugs, genes, pathways and issuing bodies, so that no pretrained
model knows the answers and nobody can mistake the text for medical advice (every record is marked
``metadata["fictional"] = True``). From the ground truth come passages (book, guideline, research, wiki, graph),
multiple-choice and open questions, instruction examples with Self-RAG labels, deterministic splits, and the
:class:`Oracle`, which stands in for a teacher LLM by answering exactly what the papers ask one.

    >>> world = build_world(seed=0, size="tiny")
    >>> q = world.questions[0]
    >>> world.oracle.support(q, None, q.gold_passages[0])
    'full'

Modules: ``names`` (invented names), ``model`` (entities and facts), ``render`` (the five source styles),
``questions`` (items, MCQs, open questions), ``instructions`` (instruction examples), ``oracle`` (exact labels),
``build`` (assembly, sizes, splits), ``bench`` (build timing).
"""

from omnimed.data.world.build import SIZES, World, WorldSize, build_world
from omnimed.data.world.oracle import Oracle

__all__ = ["SIZES", "Oracle", "World", "WorldSize", "build_world"]
