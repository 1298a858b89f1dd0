"""The method registry: the one seam where a paper (or a baseline) plugs in.

A method is a :class:`Method` subclass registered under one name with :func:`register_method`. It declares its
pipeline config (a dataclass: the Hydra option ``pipeline=<name>``), how it answers a list of questions (a list of
:class:`~omnimed.methods.answer.Answer`), whether it needs the knowledge base, which model a backend serves for it,
its own metrics, its data-construction stages (``omnimed-build stage=<name>``) and, for methods with a judge or
critic LM, the label types that LM predicts. The evaluators, the build CLI, the table manifests and config
registration read this registry; nothing outside a method's package compares against its name.

Built-in methods are the subpackages of :mod:`omnimed.methods` (each registers itself when imported); others come
from the modules named in ``OMNIMED_PLUGINS`` (see :mod:`omnimed.plugins`).
"""

from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from omnimed.methods.answer import Answer

#: question kinds a method may answer: multiple-choice, open (long-form)
QUESTION_KINDS = ("mcq", "open")


@dataclass(frozen=True)
class Stage:
    """A data-construction stage: ``omnimed-build stage=<name>``. ``config``: its dataclass (the Hydra option's
    schema, with the paper's defaults); ``run(stage_cfg, ctx)``: does the work in a stage folder and returns a
    :class:`~omnimed.data.artifacts.StageResult` (``ctx``: a :class:`~omnimed.methods.stages.StageContext`).
    ``calls_backend``: whether it asks the run's backend (a teacher, a critic), whose calls can fail and are then
    resumed item by item; a stage that only reads the world and the knowledge base has nothing to resume."""

    name: str
    config: type
    run: Callable[[Any, Any], Any]
    calls_backend: bool = True


class Method(ABC):
    """One way of answering questions, built from its pipeline config.

    Subclasses set ``name`` and ``config`` and implement :meth:`answer`; the rest has defaults that suit a method
    that answers with the run's model and no retrieval.
    """

    name: ClassVar[str]
    config: ClassVar[type]
    #: the question kinds it answers (a dataset of another kind is refused before any work)
    question_kinds: ClassVar[tuple[str, ...]] = QUESTION_KINDS
    stages: ClassVar[tuple[Stage, ...]] = ()
    #: for a method with a judge / critic LM: label type -> the label tokens it chooses among (the accuracy
    #: evaluation scores each type, e.g. Self-BioRAG's Table 9)
    labels: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: fnmatch patterns of the keys :meth:`metrics` writes, which a table's column may read (Omni-RAG's
    #: ``words_per_query/<source>``, ...)
    metric_names: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def needs_knowledge(self) -> bool:
        """Whether :meth:`answer` searches the knowledge base (it is built or loaded only then)."""
        return False

    def reads(self) -> bool:
        """Whether :meth:`answer` answers the questions; else it only plans and searches (its answers carry no
        prediction) and a run reports the method's own metrics without an accuracy."""
        return True

    #: solved questions of the dataset's training split, set by the runner when :meth:`shots` asks for some
    demonstrations: Sequence[Any] = ()
    #: where the run's backend calls are cached (``paths.cache``), set by the runner: a backend the method serves
    #: itself (a planner) caches there too
    cache_root: Any = None

    def shots(self) -> int:
        """How many solved questions :meth:`answer` shows before each question (chosen from
        :attr:`demonstrations`); none by default."""
        return 0

    def serve(self, backend_cfg: Any, model: Any, role: str = "generator") -> tuple[Any, Any]:
        """The backend config and model config that serve this method's ``role`` (``generator``, or ``critic`` for
        the label evaluation): by default the run's own."""
        return backend_cfg, model

    @abstractmethod
    def answer(self, questions: Sequence[Any], backend: Any, kb: Any, *, seed: int) -> list[Answer]:
        """One :class:`Answer` per question, in order. ``kb`` is None unless :meth:`needs_knowledge`."""

    def retrieve(self, kb: Any, source: str, queries: Sequence[tuple[str, str]], k: int, *,
                 candidates: Sequence[Sequence[Any]] | None = None) -> list[list[Any]]:
        """For a method that ranks passages itself (a reranker, PolyRAG): the top ``k`` hits
        (:class:`~omnimed.knowledge.types.Hit`) of ``source`` for each (question id, query text), or of each
        query's given ``candidates`` (a candidate-pool run). The retrieval task scores such a method as
        ``task.methods=[<name>]``; the others do not retrieve on their own."""
        raise NotImplementedError(f"pipeline={self.name} does not rank passages on its own")

    def retrieves(self) -> bool:
        """Whether :meth:`retrieve` is implemented."""
        return type(self).retrieve is not Method.retrieve

    def metrics(self, answers: Sequence[Answer]) -> dict[str, float]:
        """The method's own metrics over one seed's answers (beside accuracy), e.g. a retrieval rate."""
        return {}

    def undefined_metrics(self, answers: Sequence[Answer]) -> dict[str, str]:
        """Metrics of :meth:`metrics` that these answers leave without a value, each with why (a per-source mean
        where no plan queried the source), so a table states the reason instead of calling the run failed."""
        return {}

    def read_label(self, text: str, kind: str) -> str | None:
        """The label of type ``kind`` a judge's free output starts with (whitespace before it allowed), None when
        it starts with anything else: a prediction outside the defined labels."""
        stripped = text.lstrip()
        return next((t for t in sorted(self.labels[kind], key=len, reverse=True) if stripped.startswith(t)), None)


_METHODS: dict[str, type[Method]] = {}
_STAGES: dict[str, Stage] = {}
_discovered = False


def register_method(cls: type[Method]) -> type[Method]:
    """Class decorator: make ``cls`` available as ``pipeline=<cls.name>`` and its stages as ``stage=<name>``.
    Registering a second, different class under a taken name is an error (a plugin shadowing a paper)."""
    for attr in ("name", "config"):
        if not hasattr(cls, attr):
            raise TypeError(f"{cls.__qualname__}: a method declares `{attr}`")
    known = _METHODS.get(cls.name)
    if known is not None and known.__qualname__ != cls.__qualname__:
        raise ValueError(f"method {cls.name!r} is registered twice ({known.__module__}.{known.__qualname__} and "
                         f"{cls.__module__}.{cls.__qualname__})")
    odd = set(cls.question_kinds) - set(QUESTION_KINDS)
    if odd:
        raise ValueError(f"method {cls.name}: question_kinds {sorted(odd)}; expected some of {QUESTION_KINDS}")
    _METHODS[cls.name] = cls
    for stage in cls.stages:
        owner = _STAGES.get(stage.name)
        if owner is not None and owner.run is not stage.run:
            raise ValueError(f"stage {stage.name!r} is registered twice")
        _STAGES[stage.name] = stage
    return cls


def _discover() -> None:
    """Import every subpackage of :mod:`omnimed.methods` and every plugin module, once."""
    global _discovered
    if _discovered:
        return
    import omnimed.methods as package
    from omnimed.plugins import load_plugins

    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg:
            importlib.import_module(f"{package.__name__}.{info.name}")
    load_plugins()
    _discovered = True


def method_names() -> list[str]:
    _discover()
    return sorted(_METHODS)


def get_method(name: str) -> type[Method]:
    """The method registered as ``name``; an unknown name fails listing the registered ones."""
    _discover()
    if name not in _METHODS:
        raise KeyError(f"pipeline={name!r}: no such method; registered methods: {', '.join(sorted(_METHODS))}")
    return _METHODS[name]


def build_method(cfg: Any) -> Method:
    """The method a pipeline config (``cfg.name``) names, built from that config."""
    return get_method(cfg.name)(cfg)


def stage_names() -> list[str]:
    _discover()
    return sorted(_STAGES)


def get_stage(name: str) -> Stage:
    _discover()
    if name not in _STAGES:
        raise KeyError(f"stage={name!r}: no such stage; stages: {', '.join(sorted(_STAGES)) or '(none)'}")
    return _STAGES[name]
