"""Random-weight models built locally and deterministically: tiny ones for unit tests, and full-size shapes for
benchmarks on machines with no model hub.

``tiny-llama`` is a 2-layer Llama with tied embeddings (like SmolLM2) and a byte-level BPE tokenizer trained
here on a short built-in text. It shares SmolLM2's ChatML markers, bos/eos/pad choice and chat-template
shape, so formatting, tokenisation, LoRA and training code exercised on it behaves the same on the real
model. ``tiny-llama-untied`` is the same with a separate ``lm_head`` (like Llama-2-7B and Qwen2.5-7B), so the
untied code paths are tested too. ``tiny-xlm-roberta`` and ``bge-m3-shape`` are encoders (``kind="encoder"``), saved as
sentence-transformers folders with BGE-M3's [CLS] pooling and normalisation: the first a 2-layer one for tests, the
second XLM-RoBERTa-large's shape as BGE-M3 has it (24 layers, width 1024, 16 heads, 250,002 embedding rows, 8,194
positions; 568M parameters), the utility embedder of PolyRAG's paper preset on a GPU without the hub.
``qwen2.5-1.5b-shape`` has Qwen2.5-1.5B's architecture and size (28 layers,
hidden 1536, 12 query / 2 key-value heads, 151,936 embedding rows, tied; 1.54B parameters) with random weights and
the same small tokenizer (only its first rows are ever looked up): a GPU benchmark's model when the hub is out of
reach, where what counts is the compute per token, not what the model says; ``llama3.2-1b-shape`` (Llama-3.2-1B,
1.24B parameters) and ``smollm2-135m-shape`` are the same idea for the GPU checks of issue 18. Each is saved as an
ordinary HF folder in the cache and then loaded through the same code path as any local checkpoint.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

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
    """Shape of one random-weight model; ``recipe`` changes whenever the build output would change.

    ``vocab_size`` is the trained tokenizer's; ``embedding_rows`` (None: the tokenizer's length) pads the embedding
    as real checkpoints do. ``family`` picks the transformers config class (``llama`` | ``qwen2`` | ``xlm-roberta``)."""

    name: str
    kind: str  # causal_lm | encoder
    tie_word_embeddings: bool
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 1024
    seed: int = 0
    family: str = "llama"
    embedding_rows: int | None = None
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    save_dtype: str = "float32"

    @property
    def recipe(self) -> str:
        return f"tiny-v1:{self!r}"


TINY_MODELS: dict[str, TinySpec] = {
    "tiny-llama": TinySpec(name="tiny-llama", kind="causal_lm", tie_word_embeddings=True),
    "tiny-llama-untied": TinySpec(name="tiny-llama-untied", kind="causal_lm", tie_word_embeddings=False),
    # Qwen2.5-1.5B-Instruct's config.json values; weights saved in bf16 (3 GB) as the hub checkpoint is
    "qwen2.5-1.5b-shape": TinySpec(
        name="qwen2.5-1.5b-shape", kind="causal_lm", tie_word_embeddings=True, hidden_size=1536,
        intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        family="qwen2", embedding_rows=151936, max_position_embeddings=32768, rope_theta=1000000.0,
        save_dtype="bfloat16",
    ),
    # Llama-3.2-1B's config.json values (rope scaling left out: it only matters beyond 8k positions); the GPU
    # benchmark's full fine-tuning model (issue 18: "a ~1B Llama-shaped model")
    "llama3.2-1b-shape": TinySpec(
        name="llama3.2-1b-shape", kind="causal_lm", tie_word_embeddings=True, hidden_size=2048,
        intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        embedding_rows=128256, max_position_embeddings=8192, rope_theta=500000.0, save_dtype="bfloat16",
    ),
    # SmolLM2-135M's config.json values: its architecture where the packaged weights cannot travel (a GPU machine
    # with no registry and a 64 MiB upload; the bf16-against-fp32 loss check)
    "smollm2-135m-shape": TinySpec(
        name="smollm2-135m-shape", kind="causal_lm", tie_word_embeddings=True, hidden_size=576,
        intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        embedding_rows=49152, max_position_embeddings=8192, rope_theta=100000.0,
    ),
    # encoders: sentence-transformers folders ([CLS] pooling + normalisation, as BGE-M3's own folder)
    "tiny-xlm-roberta": TinySpec(name="tiny-xlm-roberta", kind="encoder", tie_word_embeddings=True,
                                 family="xlm-roberta", num_key_value_heads=4, max_position_embeddings=514),
    # BGE-M3's config.json values (XLM-RoBERTa-large with 8k positions)
    "bge-m3-shape": TinySpec(
        name="bge-m3-shape", kind="encoder", tie_word_embeddings=True, hidden_size=1024, intermediate_size=4096,
        num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16, family="xlm-roberta",
        embedding_rows=250002, max_position_embeddings=8194,
    ),
}
_CONFIG_CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}
# XLM-RoBERTa's special tokens and their ids (<s> 0, <pad> 1, </s> 2, <unk> 3), then <mask>
_ENCODER_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def _trained_bpe(vocab_size: int, special_tokens: list[str], unk_token: str | None = None):
    """A byte-level BPE (GPT-2/SmolLM2 style) trained on the built-in corpus, ``special_tokens`` first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE(unk_token=unk_token))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    return bpe


def _train_tokenizer(vocab_size: int, model_max_length: int = 512):
    """The causal models' tokenizer: :func:`_trained_bpe` with ChatML's markers, wrapped for transformers."""
    from transformers import PreTrainedTokenizerFast

    bpe = _trained_bpe(vocab_size, [ENDOFTEXT, BOS, EOS])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=EOS,
        unk_token=ENDOFTEXT,
        padding_side="right",
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def _build_causal_lm(spec: TinySpec, folder: Path) -> None:
    """Write tokenizer, config, generation config and random-but-seeded weights into ``folder``."""
    import torch
    import transformers

    tokenizer = _train_tokenizer(spec.vocab_size, spec.max_position_embeddings)
    tokenizer.save_pretrained(folder)
    config_name, model_name = _CONFIG_CLASSES[spec.family]
    config = getattr(transformers, config_name)(
        vocab_size=spec.embedding_rows or len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = getattr(transformers, model_name)(config)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.to(getattr(torch, spec.save_dtype)).save_pretrained(folder)


def _build_encoder(spec: TinySpec, folder: Path) -> None:
    """A sentence-transformers folder: a random-but-seeded XLM-RoBERTa with a byte-level BPE trained on the built-in
    corpus (RoBERTa's ``<s> ... </s>`` framing), [CLS] pooling and normalisation."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast, XLMRobertaConfig, XLMRobertaModel

    bpe = _trained_bpe(spec.vocab_size, _ENCODER_SPECIALS, unk_token="<unk>")
    bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    positions = spec.max_position_embeddings - 2  # XLM-RoBERTa's positions start after the padding index
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                        cls_token="<s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>",
                                        model_max_length=positions, clean_up_tokenization_spaces=False)
    config = XLMRobertaConfig(
        vocab_size=spec.embedding_rows or len(tokenizer), hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        intermediate_size=spec.intermediate_size, max_position_embeddings=spec.max_position_embeddings,
        type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    hf = folder / "hf-model"
    with torch.random.fork_rng(devices=[]):  # seeded: the pooler the loader adds (unused: [CLS] pooling) too
        torch.manual_seed(spec.seed)
        XLMRobertaModel(config).to(getattr(torch, spec.save_dtype)).save_pretrained(hf)
        tokenizer.save_pretrained(hf)
        transformer = Transformer(str(hf), max_seq_length=positions)
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode="cls")
    SentenceTransformer(modules=[transformer, pooling, Normalize()]).save(str(folder), safe_serialization=True)
    shutil.rmtree(hf)


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
    build = _build_encoder if spec.kind == "encoder" else _build_causal_lm
    return ensure_built(name, spec.recipe, lambda folder: build(spec, folder))
