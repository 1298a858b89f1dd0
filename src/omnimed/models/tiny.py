"""Tiny random-weight models for unit tests, built locally and deterministically.

``tiny-llama`` is a 2-layer Llama with tied embeddings (like SmolLM2) and a byte-level BPE tokenizer trained
here on a short built-in text. It shares SmolLM2's ChatML markers, bos/eos/pad choice and chat-template
shape, so formatting, tokenisation, LoRA and training code exercised on it behaves the same on the real
model. ``tiny-llama-untied`` is the same with a separate ``lm_head`` (like Llama-2-7B and Qwen2.5-7B), so the
untied code paths are tested too. Each is saved as an ordinary HF folder in the cache and then loaded
through the same code path as any local checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from omnimed.models.cache import ensure_built
from omnimed.models.errors import UnknownModelError

BOS = "<|im_start|>"
EOS = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"

# ChatML, same structure as SmolLM2-Instruct's template (default system turn when none is given).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful medical assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Our own short training text for the tokenizer: plain clinical prose plus chat turns, so frequent
# words and the role names become single tokens. It only has to be stable, not large.
_CORPUS = """\
<|im_start|>system
You are a helpful medical assistant.<|im_end|>
<|im_start|>user
What is the first-line treatment for type 2 diabetes?<|im_end|>
<|im_start|>assistant
Metformin is usually the first-line drug, together with diet and exercise.<|im_end|>
<|im_start|>user
Which evidence supports this answer? Cite the retrieved passage.<|im_end|>
<|im_start|>assistant
The retrieved guideline states that metformin lowers glucose and is safe for most patients.<|im_end|>
A 54-year-old man presents with chest pain radiating to the left arm and shortness of breath.
The electrocardiogram shows ST elevation in the anterior leads; troponin is elevated.
Question: what is the most likely diagnosis? Answer: acute myocardial infarction.
Hypertension is defined as a blood pressure of 140/90 mmHg or higher on repeated measurements.
Common symptoms of influenza include fever, cough, sore throat, muscle aches and fatigue.
Antibiotics do not treat viral infections; they are used for bacterial infections such as pneumonia.
The patient was given 500 mg of amoxicillin three times a day for seven days.
Options: A. aspirin B. heparin C. insulin D. warfarin. The correct option is B.
Retrieval-augmented generation finds relevant documents from PubMed, guidelines and textbooks,
then the model reads the evidence and writes an answer that is supported by the documents.
Is the passage relevant? Yes, the passage is relevant. Is the answer supported? Fully supported.
Kidney function is assessed with serum creatinine and the estimated glomerular filtration rate.
Asthma causes wheezing, and inhaled corticosteroids reduce inflammation in the airways.
Vitamin D deficiency may lead to weak bones; calcium and vitamin D supplements are often advised.
The study enrolled 1200 patients in a randomized controlled trial with a placebo group.
Results: the treatment reduced mortality by 12 percent (95% CI 8-16, p < 0.001).
"""


@dataclass(frozen=True)
class TinySpec:
    """Shape of one tiny model; ``recipe`` changes whenever the build output would change."""

    name: str
    kind: str  # causal_lm
    tie_word_embeddings: bool
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 1024
    seed: int = 0

    @property
    def recipe(self) -> str:
        return f"tiny-v1:{self!r}"


TINY_MODELS: dict[str, TinySpec] = {
    "tiny-llama": TinySpec(name="tiny-llama", kind="causal_lm", tie_word_embeddings=True),
    "tiny-llama-untied": TinySpec(name="tiny-llama-untied", kind="causal_lm", tie_word_embeddings=False),
}


def _train_tokenizer(vocab_size: int):
    """Train a byte-level BPE (GPT-2/SmolLM2 style) on the built-in corpus and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=[ENDOFTEXT, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=EOS,
        unk_token=ENDOFTEXT,
        padding_side="right",
        chat_template=CHAT_TEMPLATE,
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )


def _build_causal_lm(spec: TinySpec, folder: Path) -> None:
    """Write tokenizer, config, generation config and random-but-seeded weights into ``folder``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _train_tokenizer(spec.vocab_size)
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=512,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)


def tiny_model_path(name: str) -> Path:
    """Build (once) and return the cached folder of the tiny model ``name``.

    Raises ``UnknownModelError`` listing the known names when ``name`` is not one.
    """
    try:
        spec = TINY_MODELS[name]
    except KeyError:
        raise UnknownModelError(
            f"Unknown tiny model {name!r}; known tiny models: {sorted(TINY_MODELS)}"
        ) from None
    return ensure_built(name, spec.recipe, lambda folder: _build_causal_lm(spec, folder))
