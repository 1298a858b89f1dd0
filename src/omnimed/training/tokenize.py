"""Prompt/completion features for causal-LM SFT: formatting an example, tokenizing it, masking the loss.

Two steps, both pure functions so that ``datasets.Dataset.map`` can fingerprint and cache them:

1. :func:`format_example` turns an :class:`~omnimed.data.records.InstructionExample` into TRL's
   prompt-completion format ``{"prompt": str, "completion": str}``, using the tokenizer's chat template when it
   has one and a plain ``### Instruction / ### Input / ### Response`` layout otherwise. Evidence passages go into
   the prompt as ``<paragraph>TEXT</paragraph>`` segments.
2. :func:`tokenize_prompt_completion` tokenizes ``prompt + completion`` *as one string* and decides per token
   whether it is supervised by looking at its character offsets. Tokenizing the joined text (rather than the two
   parts separately) gives exactly the ids the model sees at inference, even where a BPE merge crosses the
   prompt/completion boundary or the edge of a masked span; the offsets then say which characters each token
   covers, and a token is supervised only when it covers no prompt character and no masked character.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from omnimed.data.hf import from_hf_row
from omnimed.data.records import InstructionExample
from omnimed.models.layout import check_layout, plain_prompt, user_text

IGNORE_INDEX = -100
"""Label value ignored by the cross-entropy loss of HF causal LMs (and by ``torch.nn.CrossEntropyLoss``)."""

TemplateMode = Literal["auto", "chat", "plain"]

#: Bumped whenever the text produced by :func:`format_example` or the features of
#: :func:`tokenize_prompt_completion` change, so cached tokenized datasets are not reused across versions.
FORMAT_VERSION = "sft-format-v2"


# ----------------------------------------------------------------------------------------------- formatting
def template_mode(prompt_layout: str) -> TemplateMode:
    """The formatting mode of a model's ``prompt_layout``: ``chat`` lets the tokenizer decide (``auto``),
    ``plain`` forces the plain layout."""
    return "plain" if check_layout(prompt_layout) == "plain" else "auto"


def uses_chat_template(tokenizer: Any, template: TemplateMode = "auto") -> bool:
    """Whether :func:`format_example` will use the chat template: ``auto`` uses it when the tokenizer has one."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if template == "chat" and not has_template:
        raise ValueError("template='chat' but the tokenizer has no chat_template")
    if template not in ("auto", "chat", "plain"):
        raise ValueError(f"template must be auto | chat | plain, got {template!r}")
    return template == "chat" or (template == "auto" and has_template)


def format_example(
    example: InstructionExample, tokenizer: Any, template: TemplateMode = "auto"
) -> dict[str, str]:
    """``{"prompt", "completion"}`` of one example (TRL's prompt-completion format, as plain strings).

    With a chat template the prompt is the rendered conversation up to and including the generation prompt
    (``<|im_start|>assistant\\n`` for ChatML), and the completion is what the template adds for the assistant
    turn (the output and its end-of-turn marker), trailing whitespace removed so the end-of-turn token is last.
    Without one, the plain layout ends the prompt with ``### Response:\\n`` and the completion is the output.
    """
    if uses_chat_template(tokenizer, template):
        user = [{"role": "user", "content": user_text(example.instruction, example.input, example.evidence)}]
        prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(
            user + [{"role": "assistant", "content": example.output}], tokenize=False
        )
        if not full.startswith(prompt):
            raise ValueError(
                "the chat template renders the conversation differently from its prompt prefix; "
                "cannot split it into prompt and completion"
            )
        return {"prompt": prompt, "completion": full[len(prompt) :].rstrip()}
    return {"prompt": plain_prompt(example.instruction, example.input, example.evidence),
            "completion": example.output}


def format_conversation(
    prompt: Sequence[Mapping[str, str]], completion: Sequence[Mapping[str, str]], tokenizer: Any,
    template: TemplateMode = "auto",
) -> dict[str, str]:
    """``{"prompt", "completion"}`` strings of a conversational example (TRL's format: message lists), split as
    :func:`format_example` splits a chat: the prompt ends with the generation prompt, the completion is what the
    template adds for the assistant turn. Needs a chat template: a conversation has no plain layout."""
    if not uses_chat_template(tokenizer, template):
        raise ValueError("conversational prompt/completion examples need the tokenizer's chat template "
                         f"(template={template!r}, chat_template set: {bool(getattr(tokenizer, 'chat_template', None))})")
    head = [dict(m) for m in prompt]
    rendered = tokenizer.apply_chat_template(head, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(head + [dict(m) for m in completion], tokenize=False)
    if not full.startswith(rendered):
        raise ValueError("the chat template renders the conversation differently from its prompt prefix; "
                         "cannot split it into prompt and completion")
    return {"prompt": rendered, "completion": full[len(rendered):].rstrip()}


def is_conversational(batch: Mapping[str, list[Any]]) -> bool:
    """Whether a batch of rows holds TRL's conversational examples (``prompt`` as a message list)."""
    prompts = batch.get("prompt")
    return bool(prompts) and isinstance(prompts[0], list)


def format_batch(
    batch: Mapping[str, list[Any]], tokenizer: Any, template: TemplateMode = "auto"
) -> dict[str, list[str]]:
    """Batched :func:`format_example` over HF rows of instruction examples (:mod:`omnimed.data.hf`), or
    :func:`format_conversation` over rows whose ``prompt`` and ``completion`` are message lists."""
    n = len(next(iter(batch.values())))
    rows = [{k: v[i] for k, v in batch.items()} for i in range(n)]
    if is_conversational(batch):
        formatted = [format_conversation(r["prompt"], r["completion"], tokenizer, template) for r in rows]
    else:
        formatted = [format_example(from_hf_row(InstructionExample, row), tokenizer, template) for row in rows]
    return {"prompt": [f["prompt"] for f in formatted], "completion": [f["completion"] for f in formatted]}


# ----------------------------------------------------------------------------------------------- masking
def find_masked_char_spans(text: str, mask_spans: Sequence[Sequence[str]]) -> list[tuple[int, int]]:
    """Character intervals ``[start, end)`` of every ``open ... close`` span in ``text``, markers included.

    Every occurrence of each pair is found, left to right, wherever it is (prompt or completion). An opening
    marker without a closing one masks up to the end of the text: that is what truncated evidence looks like,
    and supervising half a passage would be worse than losing a few output tokens. Overlapping intervals of
    different pairs are merged.
    """
    spans: list[tuple[int, int]] = []
    for pair in mask_spans:
        if len(pair) != 2 or not pair[0] or not pair[1]:
            raise ValueError(f"each mask span must be a non-empty [open, close] pair, got {pair!r}")
        open_, close = pair
        pos = 0
        while (start := text.find(open_, pos)) != -1:
            end = text.find(close, start + len(open_))
            end = len(text) if end == -1 else end + len(close)
            spans.append((start, end))
            pos = end
    spans.sort()
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _covers_masked(start: int, end: int, masked: Sequence[tuple[int, int]]) -> bool:
    """Whether the token at characters ``[start, end)`` touches a masked interval (an empty token: its position)."""
    for a, b in masked:
        if a >= max(end, start + 1):
            break
        if (start < b and end > a) if end > start else (a <= start < b):
            return True
    return False


def special_prefix_ids(tokenizer: Any) -> list[int]:
    """Ids the tokenizer itself puts before a text (Llama's BOS; nothing for byte-level BPE like SmolLM2)."""
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    without = tokenizer("a", add_special_tokens=False)["input_ids"]
    for i in range(len(with_special) - len(without) + 1):
        if with_special[i : i + len(without)] == without:
            return list(with_special[:i])
    return []


def tokenize_prompt_completion(
    batch: Mapping[str, Sequence[str]],
    tokenizer: Any,
    max_length: int,
    mask_spans: Sequence[Sequence[str]] = (),
) -> dict[str, list[list[int]] | list[int]]:
    """Tokenize a batch of ``prompt``/``completion`` strings into ``input_ids``, ``attention_mask``, ``labels``,
    ``length`` (tokens per example) and ``full_length`` (tokens before the cut at ``max_length``: what
    ``max_length`` must be to keep the example whole), for ``Dataset.map(batched=True)``.

    ``labels`` equal ``input_ids`` except for :data:`IGNORE_INDEX` on

    * every token covering a prompt character (a token straddling the prompt/completion boundary after a BPE
      merge is treated as prompt: it cannot be produced by the model from the prompt alone);
    * every token covering a character of a ``[open, close]`` span of ``mask_spans`` (see
      :func:`find_masked_char_spans`), in the prompt or in the completion. A token merged across a span edge
      (byte-level BPE turns ``]<`` of ``[Retrieval]<paragraph>`` into one token when the markers are not special
      tokens) is masked too: supervising it would teach the model to begin the evidence block itself. Register
      the markers as special tokens (``ModelConfig.special_tokens``) and no token crosses a span edge.

    The markers themselves are masked along with the text between them. In Self-RAG the retriever, not the model,
    inserts ``<paragraph>...</paragraph>`` after the model has emitted ``[Retrieval]``: at inference the model
    never writes either marker, so training it to predict ``<paragraph>`` would teach it to start fabricating
    evidence, and ``</paragraph>`` is part of the inserted block. What follows the block (``[Relevant]``, the
    answer) stays supervised, conditioned on the evidence. (The original Self-RAG code keeps the markers in the
    loss; with the markers added as special tokens that difference is two tokens per passage.)

    The labels are *not* shifted: HF causal LMs shift them internally. The tokenizer's own leading special
    tokens (Llama's BOS) are prepended when the text does not already start with them; EOS is appended (and
    supervised) unless the completion already ends with it; then everything is cut to ``max_length`` from the
    right. Needs a fast tokenizer (``return_offsets_mapping``).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("tokenize_prompt_completion needs a fast tokenizer (character offsets)")
    if max_length < 1:
        raise ValueError(f"max_length must be positive, got {max_length}")
    prompts, completions = list(batch["prompt"]), list(batch["completion"])
    texts = [p + c for p, c in zip(prompts, completions)]
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    prefix = special_prefix_ids(tokenizer)
    eos = tokenizer.eos_token_id

    out: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": [], "length": [], "full_length": []}
    for prompt, text, ids, offsets in zip(prompts, texts, enc["input_ids"], enc["offset_mapping"]):
        masked = [(0, len(prompt))] if prompt else []
        masked = sorted(masked + find_masked_char_spans(text, mask_spans))
        labels = [IGNORE_INDEX if _covers_masked(s, e, masked) else tok for tok, (s, e) in zip(ids, offsets)]
        ids = list(ids)
        if prefix and ids[: len(prefix)] != prefix:
            ids = prefix + ids
            labels = [IGNORE_INDEX] * len(prefix) + labels
        if eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)
            labels.append(eos)
        out["full_length"].append(len(ids))
        ids, labels = ids[:max_length], labels[:max_length]
        out["input_ids"].append(ids)
        out["attention_mask"].append([1] * len(ids))
        out["labels"].append(labels)
        out["length"].append(len(ids))
    return out
