"""The objective registry: the seam where a training objective plugs in (``task.objective``).

An objective is a Lightning module with its data module. It registers itself under one name with
:func:`register_objective`; the engine (strategies, loggers, checkpoints, resume, export) asks this registry and
knows no objective by name, and no objective knows a paper. Built-in objectives live in
``omnimed.training.<name>`` and are imported when first asked for: ``sft`` (prompt/completion examples, loss on
the completion), ``dpo`` (preference pairs, TRL's sigmoid loss against a reference model) and ``distill``
(listwise KL of a bi-encoder to a teacher's scores), one module each. Objectives outside the package
come from ``OMNIMED_PLUGINS`` (:mod:`omnimed.plugins`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: the objectives this package ships, each in ``omnimed.training.<name>``
BUILTIN: tuple[str, ...] = ("sft", "dpo", "distill")


@dataclass(frozen=True)
class Objective:
    """``datamodule(cfg, records, tokenizer)`` and ``module(cfg, tokenizer)`` build the Lightning pair from the
    run's :class:`~omnimed.training.config.TrainConfig`; the data module may expose ``dropped_too_long``,
    ``num_examples``, ``truncated`` and ``needed_length``, which the run reports. ``export(module, tokenizer,
    folder, cfg)``: writes the trained model into ``hf/`` when it is not a causal LM (default: the engine's
    Hugging Face export of ``module.model``)."""

    name: str
    datamodule: Callable[[Any, list, Any], Any]
    module: Callable[[Any, Any], Any]
    export: Callable[[Any, Any, Any, Any], None] | None = None


_OBJECTIVES: dict[str, Objective] = {}


def register_objective(objective: Objective) -> Objective:
    known = _OBJECTIVES.get(objective.name)
    if known is not None and known != objective:
        raise ValueError(f"objective {objective.name!r} is registered twice")
    _OBJECTIVES[objective.name] = objective
    return objective


def _load() -> None:
    from omnimed.plugins import load_plugins

    for name in BUILTIN:
        if name not in _OBJECTIVES:
            importlib.import_module(f"omnimed.training.{name}")
    load_plugins()


def objective_names() -> list[str]:
    _load()
    return sorted(_OBJECTIVES)


def get_objective(name: str, task: str | None = None) -> Objective:
    """The objective ``task.objective`` names; an unknown one fails naming it and the built objectives."""
    _load()
    if name not in _OBJECTIVES:
        raise ValueError(f"task.objective={name!r}" + (f" (task {task})" if task else "")
                         + f" is not built in the training engine; built objectives: {', '.join(sorted(_OBJECTIVES))}")
    return _OBJECTIVES[name]
