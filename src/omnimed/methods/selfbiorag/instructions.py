"""Where Self-BioRAG's build stages take their instruction examples from, and which of them they keep."""

from __future__ import annotations

import hashlib
from pathlib import Path

from omnimed.data.records import InstructionExample

#: ``subset`` values: every example, those whose task needs domain knowledge, those that do not (general ones)
SUBSETS = ("all", "domain", "general")


def load_instructions(source: str, *, knowledge=None, splits: tuple[str, ...] | None = ("train",)) -> list[InstructionExample]:
    """Instruction examples from ``source``: ``world`` (the synthetic world of the ``knowledge`` config) or a path
    to an ``omnimed-data`` output folder / ``records.jsonl`` holding instruction records. ``splits``: keep examples
    whose ``metadata['split']`` is one of these (examples without a split are kept); None keeps all."""
    if source == "world":
        if knowledge is None:
            raise ValueError("instructions=world needs a world knowledge config (knowledge=world_small, ...)")
        from omnimed.knowledge.corpus import world_of

        examples = list(world_of(knowledge).instructions)
    else:
        from omnimed.data.io import read_records

        path = Path(source)
        jsonl = path / "records.jsonl" if path.is_dir() else path
        if not jsonl.is_file():
            raise FileNotFoundError(f"instructions={source}: expected 'world', a records.jsonl or an omnimed-data "
                                    "output folder holding one")
        examples = read_records(jsonl, InstructionExample)
    if splits is not None:
        examples = [e for e in examples if e.metadata.get("split") in (*splits, None)]
    if not examples:
        raise ValueError(f"instructions={source}: no instruction examples (splits {splits})")
    return examples


def stage_inputs(source: str, backend, kb) -> dict:
    """What a Self-BioRAG stage's output depends on beyond its own settings: the instructions (a file's content
    hash; the world is covered by the knowledge config), the model behind ``backend``, the knowledge base's
    settings, and the versions of the token contract and the prompts."""
    import dataclasses

    from omnimed.methods.selfbiorag import prompts
    from omnimed.methods.selfbiorag.tokens import CONTRACT_VERSION

    origin = source
    if source != "world":
        path = Path(source)
        jsonl = path / "records.jsonl" if path.is_dir() else path
        origin = hashlib.sha256(jsonl.read_bytes()).hexdigest() if jsonl.is_file() else source
    return {"instructions_origin": origin, "backend": backend.model_id,
            "knowledge": dataclasses.asdict(kb.cfg) if kb is not None else None,
            "contract": CONTRACT_VERSION, "prompts": prompts.PROMPT_VERSION}


def in_subset(example: InstructionExample, subset: str) -> bool:
    """``domain``: examples marked as needing domain knowledge (``metadata['needs_retrieval']``, or a gold
    ``[Retrieval]`` label); ``general``: the others; ``all``: every example."""
    if subset not in SUBSETS:
        raise ValueError(f"subset={subset!r}; expected one of {', '.join(SUBSETS)}")
    if subset == "all":
        return True
    needs = example.metadata.get("needs_retrieval")
    if needs is None:
        needs = example.labels.retrieval == "[Retrieval]"
    return bool(needs) == (subset == "domain")


def draw(key: str) -> float:
    """A number in [0, 1) fixed by ``key``: the data stages' random choices (splits, down-sampling) come out the
    same in every run and do not depend on which other examples were drawn."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 2**32


def split_of(example_id: str, dev_fraction: float, seed: int = 0) -> str:
    """``train`` or ``dev`` for an example, stable across runs and independent of the sample it was drawn in."""
    return "dev" if draw(f"{seed}:{example_id}") < dev_fraction else "train"
