"""Per-GPU memory of a multi-GPU training recipe, by the usual arithmetic: what to expect before renting 8 GPUs.

Model states under bf16 mixed precision with Adam take 16 bytes per trained parameter (bf16 weights 2, bf16
gradients 2, fp32 master weights, momentum and variance 12; ZeRO, Rajbhandari et al. 2020), and a frozen parameter
2 bytes; ZeRO-3 divides all of it by the number of GPUs. Activations per transformer layer take 34 s b h bytes with
an attention that never materialises the s x s scores (SDPA / flash; Korthikanti et al. 2022, Table 2 without the
5 a s / h term); gradient checkpointing keeps each layer's 2 s b h input and recomputes one layer at a time. The
logits add s b V x 6 bytes (bf16, and the fp32 copy the loss takes), or c V x 6 bytes with the LM head computed c
positions at a time (``task.head_chunk_positions``). Estimates, not measurements: allocator slack,
communication buffers (a few GB with ZeRO-3's buckets) and fragmentation come on top.

``python -m omnimed.training.memory_plan`` prints the README's table.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Shape:
    """A Llama-shaped decoder: parameter count, hidden size, FFN size, layers, vocabulary."""

    name: str
    params: float
    hidden: int
    ffn: int
    layers: int
    vocab: int

    def lora_params(self, r: int) -> float:
        """LoRA parameters with rank ``r`` on every projection (q, k, v, o: h -> h; gate, up: h -> ffn; down)."""
        per_layer = 4 * r * (2 * self.hidden) + 3 * r * (self.hidden + self.ffn)
        return float(per_layer * self.layers)


#: the papers' 7B / 13B models (Llama-2 shapes; Self-RAG's and Self-BioRAG's are Llama-2 fine-tunes)
SHAPES = {
    "7B": Shape("Llama-2-7B", 6.74e9, 4096, 11008, 32, 32000),
    "13B": Shape("Llama-2-13B", 13.02e9, 5120, 13824, 40, 32000),
}


def per_gpu(shape: Shape, *, gpus: int, micro_batch: int, seq: int, lora_r: int | None = None,
            checkpointing: bool = False, head_chunk: int | None = None) -> dict[str, float]:
    """Bytes per GPU under ZeRO-3 (states divided by ``gpus``), by part, with their ``total``; ``head_chunk``: the
    LM head's positions at a time (``task.head_chunk_positions``; None: all of the micro-batch's)."""
    trained = shape.lora_params(lora_r) if lora_r else shape.params
    frozen = shape.params if lora_r else 0.0
    sbh = seq * micro_batch * shape.hidden
    act = (2 * sbh * shape.layers + 34 * sbh) if checkpointing else 34 * sbh * shape.layers
    parts = {
        "weights": 2 * (trained + frozen) / gpus,
        "gradients": 2 * trained / gpus,
        "optimizer": 12 * trained / gpus,
        "activations": float(act),
        "logits": 6.0 * min(seq * micro_batch, head_chunk or seq * micro_batch) * shape.vocab,
    }
    parts["total"] = sum(parts.values())
    return parts


#: the README's recipes: (label, shape, lora rank or None, gradient checkpointing, head chunk or None)
RECIPES = [
    ("7B full (Self-BioRAG generator)", "7B", None, False, None),
    ("7B full, checkpointing", "7B", None, True, None),
    ("7B LoRA r16, checkpointing", "7B", 16, True, None),
    ("7B LoRA r16, checkpointing, head 1,024 positions at a time", "7B", 16, True, 1024),
    ("13B full, checkpointing", "13B", None, True, None),
    ("13B LoRA r16, checkpointing", "13B", 16, True, None),
]


def table(gpus: int = 8, micro_batch: int = 4, seq: int = 2048) -> str:
    """The README's table: GB per GPU for each recipe on ``gpus`` GPUs."""
    head = f"| recipe ({gpus} GPUs, ZeRO-3, bf16, micro batch {micro_batch}, seq {seq}) | weights | gradients | " \
           "optimizer | activations | logits | total |"
    rows = [head, "|---|---|---|---|---|---|---|"]
    for label, key, r, ckpt, chunk in RECIPES:
        p = per_gpu(SHAPES[key], gpus=gpus, micro_batch=micro_batch, seq=seq, lora_r=r, checkpointing=ckpt,
                    head_chunk=chunk)
        cells = " | ".join(f"{p[k] / GB:.1f}" for k in ("weights", "gradients", "optimizer", "activations", "logits",
                                                          "total"))
        rows.append(f"| {label} | {cells} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
