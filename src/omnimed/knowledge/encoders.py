"""Text encoders for dense retrieval: one model for queries and documents (MiniLM, BGE-M3) or two (MedCPT).

``TextEncoder`` wraps the ``SentenceTransformer``s that ``omnimed.models.loading.load_encoder`` builds, so every
encoder goes through the project's one loading path (packaged, tiny or hub, safetensors only). Its
``fingerprint`` describes everything that changes the vectors (models, revision, dim, prefixes, normalisation,
truncation); indexes and embedding caches store it and refuse to mix vectors of two encoders.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from omnimed.knowledge.types import IndexMismatchError
from omnimed.models.config import ModelConfig

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)


class Encoder(Protocol):
    """What indexes, caches and rerankers need from an encoder (``TextEncoder`` or a test double).

    Deliberately not ``runtime_checkable``: an ``isinstance`` check would read ``dim`` and load the model.
    """

    @property
    def dim(self) -> int: ...

    @property
    def fingerprint(self) -> dict[str, Any]: ...

    @property
    def fingerprint_id(self) -> str: ...

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray: ...

    def encode_docs(self, texts: Sequence[str], progress: bool = False) -> np.ndarray: ...


def fingerprint_id_of(fingerprint: dict[str, Any]) -> str:
    """Short, stable id of a fingerprint: the first 16 hex digits of the sha256 of its canonical JSON."""
    canonical = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def describe_fingerprint(fingerprint: dict[str, Any] | None) -> str:
    """A one-line human name for a fingerprint, e.g. ``minilm-l6 (minilm-l6), dim 384``."""
    if not fingerprint:
        return "an unknown encoder (no fingerprint stored)"

    def model(entry: Any) -> str:
        if isinstance(entry, dict):
            name, where = entry.get("name"), entry.get("name_or_path")
            revision = f"@{entry['revision']}" if entry.get("revision") else ""
            return f"{name} ({where}{revision})" if where and where != name else f"{name}{revision}"
        return str(entry)

    doc, query = fingerprint.get("doc_model"), fingerprint.get("query_model")
    models = model(doc) if query in (None, doc) else f"query {model(query)} + docs {model(doc)}"
    extras = [f"dim {fingerprint.get('dim')}"]
    for key in ("query_prefix", "doc_prefix"):
        if fingerprint.get(key):
            extras.append(f"{key} {fingerprint[key]!r}")
    if "normalize" in fingerprint and not fingerprint["normalize"]:
        extras.append("unnormalised")
    if fingerprint.get("max_length"):
        extras.append(f"max_length {fingerprint['max_length']}")
    return f"{models}, {', '.join(extras)}"


def check_fingerprint(stored: dict[str, Any] | None, expected: dict[str, Any] | None, where: str) -> None:
    """Raise ``IndexMismatchError`` when the encoder that built ``where`` is not the one asked for.

    ``expected=None`` skips the check (the caller does not know its encoder). An index stored without a
    fingerprint is refused when one is expected: nothing proves its vectors are comparable.
    """
    if expected is None or stored == expected:
        return
    if stored is not None and stored.get("dim") != expected.get("dim"):
        reason = f"dimension {stored.get('dim')} != {expected.get('dim')}"
    else:
        reason = "different encoder fingerprint"
    raise IndexMismatchError(
        f"{where} was built with encoder [{describe_fingerprint(stored)}], but encoder "
        f"[{describe_fingerprint(expected)}] was asked for ({reason}); rebuild the index with the new encoder "
        f"or point at the index of this one"
    )


def _weights_digest(folder: Path) -> str:
    """The first 16 hex digits of the weight files' digest (names and contents) of a local model folder."""
    from omnimed.data.artifacts import files_digest

    weights = (p for p in folder.rglob("*") if p.suffix in (".safetensors", ".bin") and p.is_file())
    return files_digest(folder, weights)[:16]


def _model_entry(cfg: ModelConfig) -> dict[str, Any]:
    """The parts of a ModelConfig that change its embeddings (no machine-specific resolved paths)."""
    entry: dict[str, Any] = {
        "name": cfg.name,
        "source": cfg.source,
        "name_or_path": cfg.name_or_path,
        "revision": cfg.revision,
        "dtype": cfg.dtype,
    }
    local = Path(cfg.name_or_path).expanduser() if cfg.source == "hub" and cfg.name_or_path else None
    if local is not None and local.is_dir():  # a trained export: same path, new weights must not reuse vectors
        entry["weights"] = _weights_digest(local)
    if cfg.source == "packaged":
        from omnimed.models.errors import UnknownModelError
        from omnimed.models.packaged import get_packaged

        try:
            entry["version"] = get_packaged(cfg.name_or_path).version
        except UnknownModelError:
            log.debug("No packaged model %r; loading will report it", cfg.name_or_path)
    return entry


class TextEncoder:
    """Query and document encoder over one or two sentence-transformers models, loaded lazily and once.

    ``query_model=None`` uses ``doc_model`` for both sides. Prefixes are prepended verbatim (e.g. E5's
    ``"query: "``/``"passage: "``); ``normalize`` L2-normalises outputs so inner product is cosine;
    ``max_length`` caps the token length of both models (``None``: each model's own limit).
    """

    def __init__(
        self,
        doc_model: ModelConfig,
        query_model: ModelConfig | None = None,
        *,
        query_prefix: str = "",
        doc_prefix: str = "",
        batch_size: int = 64,
        normalize: bool = True,
        max_length: int | None = None,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.doc_config = doc_model
        self.query_config = query_model
        self.query_prefix = query_prefix
        self.doc_prefix = doc_prefix
        self.batch_size = batch_size
        self.normalize = normalize
        self.max_length = max_length
        self._doc: SentenceTransformer | None = None
        self._query: SentenceTransformer | None = None
        self._fingerprint: dict[str, Any] | None = None

    def __repr__(self) -> str:
        query = f", query_model={self.query_config.name!r}" if self.query_config else ""
        return f"TextEncoder(doc_model={self.doc_config.name!r}{query})"

    # -- loading ---------------------------------------------------------------------------------------------

    def _load(self, cfg: ModelConfig) -> SentenceTransformer:
        from omnimed.models.loading import load_encoder

        log.info("Loading encoder %s (%s)", cfg.name, cfg.name_or_path)
        model = load_encoder(cfg)
        if self.max_length is not None:
            model.max_seq_length = self.max_length
        model.eval()
        return model

    @property
    def doc_model(self) -> SentenceTransformer:
        """The document-side model (loaded on first use)."""
        if self._doc is None:
            self._doc = self._load(self.doc_config)
        return self._doc

    @property
    def query_model(self) -> SentenceTransformer:
        """The query-side model: the document model unless a separate query model was given."""
        if self.query_config is None:
            return self.doc_model
        if self._query is None:
            self._query = self._load(self.query_config)
        return self._query

    def _dim_of(self, side: str) -> int:
        """The dimension a model's folder declares (no weights loaded: a BM25-only run over a knowledge base with a
        dense index needs the fingerprint, not the model), else the loaded model's."""
        cfg, loaded = (self.doc_config, self._doc) if side == "doc" else (self.query_config, self._query)
        if loaded is None:
            declared = declared_dim(cfg)
            if declared is not None:
                return declared
        return _model_dim(self.doc_model if side == "doc" else self.query_model)

    @property
    def dim(self) -> int:
        """Embedding dimension; raises when the query and document models disagree."""
        doc_dim = self._dim_of("doc")
        if self.query_config is None:
            return doc_dim
        query_dim = self._dim_of("query")
        if doc_dim != query_dim:
            raise IndexMismatchError(
                f"Query model {self.query_config.name!r} gives {query_dim}-d vectors but document model "
                f"{self.doc_config.name!r} gives {doc_dim}-d; pair encoders of one dimension"
            )
        return doc_dim

    # -- identity --------------------------------------------------------------------------------------------

    @property
    def fingerprint(self) -> dict[str, Any]:
        """Everything that determines the vectors; stored next to indexes and caches (JSON-serialisable)."""
        if self._fingerprint is None:
            doc = _model_entry(self.doc_config)
            self._fingerprint = {
                "doc_model": doc,
                "query_model": _model_entry(self.query_config) if self.query_config else doc,
                "dim": self.dim,
                "query_prefix": self.query_prefix,
                "doc_prefix": self.doc_prefix,
                "normalize": self.normalize,
                "max_length": self.max_length,
            }
        return self._fingerprint

    @property
    def fingerprint_id(self) -> str:
        """Short sha256 of ``fingerprint``: the cache namespace and a cheap equality check."""
        return fingerprint_id_of(self.fingerprint)

    # -- encoding --------------------------------------------------------------------------------------------

    def _encode(self, model: SentenceTransformer, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = model.encode(
            texts,
            batch_size=self.batch_size,
            show_progress_bar=False,
            convert_to_numpy=True,
            normalize_embeddings=self.normalize,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Embed queries (with ``query_prefix``) as a float32 ``(len(texts), dim)`` array."""
        return self._encode(self.query_model, [self.query_prefix + t for t in _as_list(texts)])

    def encode_docs(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        """Embed documents (with ``doc_prefix``) batch by batch; ``progress`` shows a rich progress bar."""
        items = [self.doc_prefix + t for t in _as_list(texts)]
        if not progress or len(items) <= self.batch_size:
            return self._encode(self.doc_model, items)
        from rich.progress import Progress

        parts = []
        with Progress(transient=True) as bar:
            task = bar.add_task(f"Embedding with {self.doc_config.name}", total=len(items))
            for start in range(0, len(items), self.batch_size):
                batch = items[start : start + self.batch_size]
                parts.append(self._encode(self.doc_model, batch))
                bar.advance(task, len(batch))
        return np.concatenate(parts, axis=0)


def _as_list(texts: Sequence[str] | str) -> list[str]:
    """Accept any sequence of strings; refuse a bare string (it would be embedded character by character)."""
    if isinstance(texts, str):
        raise TypeError("Pass a list of texts, not a single string")
    return list(texts)


def declared_dim(cfg: ModelConfig) -> int | None:
    """The embedding dimension ``cfg``'s local folder declares in its config files, for the layouts whose output is
    the transformer's width: a sentence-transformers folder of a transformer, one pooling mode and optionally
    normalisation, or a plain HF folder (``load_encoder`` adds one pooling mode). None for anything else (a Dense
    projection, concatenated pooling modes, a model not on this machine yet): the model is loaded then."""
    from omnimed.models.resolve import resolve_model_path

    local = Path(cfg.name_or_path).expanduser()
    if cfg.source == "hub" and not local.is_dir():
        return None  # resolving would download: loading does that, once
    try:
        folder = resolve_model_path(cfg)
        modules = json.loads((folder / "modules.json").read_text()) if (folder / "modules.json").is_file() else []
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        if kinds not in ([], ["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            return None
        if kinds:
            pooling = json.loads((folder / modules[1]["path"] / "config.json").read_text())
            modes = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v is True]
            listed = pooling.get("pooling_mode")
            if len(modes) > 1 or (isinstance(listed, list) and len(listed) > 1):
                return None
        width = json.loads((folder / (modules[0]["path"] if modules else "") / "config.json").read_text()).get(
            "hidden_size")
    except (OSError, ValueError, KeyError, IndexError):
        return None
    return width if isinstance(width, int) and width > 0 else None


def _model_dim(model: SentenceTransformer) -> int:
    """Output dimension of a sentence-transformers model (probing with one text when it does not say)."""
    dim = model.get_embedding_dimension()
    if dim is None:
        dim = model.encode(["dimension probe"], show_progress_bar=False).shape[1]
    return int(dim)
