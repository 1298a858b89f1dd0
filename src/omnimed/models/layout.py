"""How prompts are laid out for a model (``model.prompt_layout``), one definition for training and inference, so
a model is asked in the text it was trained on.

- ``chat``: the tokenizer's chat template (a user turn: the instruction, then the input, blank-line separated);
- ``plain``: Self-RAG's ``### Instruction: / ### Input: / ### Response:`` text, the layout the released Self-RAG
  and Self-BioRAG weights were trained with (also what training uses for a tokenizer without a chat template).
"""

from __future__ import annotations

from collections.abc import Sequence

from omnimed.data.records import Passage
from omnimed.data.text import render_evidence, user_text

LAYOUTS: tuple[str, ...] = ("chat", "plain")
PLAIN_LAYOUT = "### Instruction:\n{instruction}\n\n{input_block}{evidence_block}### Response:\n"


def check_layout(prompt_layout: str) -> str:
    """``prompt_layout`` if it is one of :data:`LAYOUTS`; otherwise an error naming the config key."""
    if prompt_layout not in LAYOUTS:
        raise ValueError(f"model.prompt_layout={prompt_layout!r}; expected chat or plain")
    return prompt_layout


def plain_prompt(instruction: str, input_text: str = "", evidence: Sequence[Passage] = ()) -> str:
    """The plain layout's prompt (Self-RAG's ``### Instruction: / ### Input: / ### Response:`` text), shared by
    training and by inference for models whose ``prompt_layout`` is ``plain``."""
    input_block = f"### Input:\n{input_text}\n\n" if input_text else ""
    evidence_block = f"### Evidence:\n{render_evidence(evidence)}\n\n" if evidence else ""
    return PLAIN_LAYOUT.format(instruction=instruction, input_block=input_block, evidence_block=evidence_block)


def request_prompt(instruction: str, input_text: str = "", prompt_layout: str = "chat") -> str | list[dict[str, str]]:
    """What a backend is sent for an instruction at inference, laid out as training lays it out for a model of
    this ``prompt_layout``: a chat user turn (instruction, then the input, blank-line separated) or the plain
    layout's text up to ``### Response:\\n``."""
    if check_layout(prompt_layout) == "plain":
        return plain_prompt(instruction, input_text)
    return [{"role": "user", "content": user_text(instruction, input_text)}]
