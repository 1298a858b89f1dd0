"""The W&B group and tags of an evaluation run, from its config: one rule for the evaluators that log them
(:mod:`~omnimed.evaluation.qa`, ``.retrieval``, ``.critic``) and for ``omnimed-compare``, which reads them back from
a run folder's Hydra config when the run has no W&B files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _plain(value: Any) -> str | None:
    """A config string, or None for an unset or unresolved (``${...}``) one."""
    return value if isinstance(value, str) and value and "${" not in value else None


def _get(node: Any, key: str) -> Any:
    """``node[key]`` of a mapping (a DictConfig, a YAML dict) or ``node.key`` of a config object; None if absent."""
    return node.get(key) if isinstance(node, Mapping) else getattr(node, key, None)


def group_and_tags(cfg: Any) -> tuple[str | None, list[str]]:
    """``(group, tags)`` of an ``omnimed-evaluate`` run: its config object, or the plain dict of a run folder's
    ``.hydra/config.yaml``.

    The group is ``logger.group``, else ``experiment``, else the task's default (``qa-<dataset>``,
    ``retrieval-<knowledge>``, ``critic``); the tags are ``logger.tags`` plus the task's own (its name, dataset or
    knowledge base and queries, the pipeline), each once."""
    logger, task, pipeline, knowledge = (_get(cfg, n) for n in ("logger", "task", "pipeline", "knowledge"))
    kind, dataset, kb = _plain(_get(task, "name")), _plain(_get(task, "dataset")), _plain(_get(knowledge, "name"))
    defaults: dict[str | None, tuple[str | None, list[str | None]]] = {
        "qa": (f"qa-{dataset}", ["qa", dataset, _plain(_get(pipeline, "name"))]),
        "retrieval": (f"retrieval-{kb}", ["retrieval", kb, _plain(_get(task, "queries"))]),
        "critic_accuracy": ("critic", ["critic", dataset]),
    }
    default_group, task_tags = defaults.get(kind, (kind, []))
    group = _plain(_get(logger, "group")) or _plain(_get(cfg, "experiment")) or default_group
    tags = [t for t in [*(_get(logger, "tags") or []), *task_tags] if _plain(t)]
    return group, list(dict.fromkeys(tags))
