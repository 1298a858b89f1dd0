"""``pipeline=serts``: Omni-RAG's SeRTS baseline (Hu et al., 2024: self-rewarding tree search; appendix D.3).
Reflexion's plans and reviews (:mod:`.reflexion`) become the nodes of a Monte Carlo tree search: each iteration
selects a node by UCT from the root, expands it with ``children`` sibling plans sampled from the planner given the
reviews along the node's path (E.8), scores each new plan's documents (E.9, the self-reward) and backpropagates
the rewards (score / 5) to the root. The search ends at the maximum score or after ``max_iterations`` iterations
(the root's plan is the first); the best-scored plan of the tree (the later one on a tie) is read.

The paper gives no width, temperature or exploration constant; ``children``, ``child_temperature`` and
``exploration`` are ours (config values).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from omnimed.generation.types import SamplingParams
from omnimed.methods.baselines.reflexion import (
    Reflexion,
    ReflexionConfig,
    Reviewed,
    chosen,
    finished,
    write_and_review,
)
from omnimed.methods.omnirag.method import Planned
from omnimed.methods.omnirag.prompts import MAX_FEEDBACK_SCORE
from omnimed.methods.registry import register_method


@dataclass
class SeRTSConfig(ReflexionConfig):
    """Reflexion's settings (``max_iterations``: search iterations, the root's plan included; the paper: 8) and
    the tree's: ``children`` plans per expansion, sampled at ``child_temperature``; ``exploration``: UCT's
    constant."""

    name: str = "serts"
    children: int = 2
    child_temperature: float = 0.7
    exploration: float = 1.0


@dataclass(eq=False)
class Node:
    """A reviewed plan in the search tree, with its visit count and summed reward."""

    reviewed: Reviewed
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    visits: int = 0
    value: float = 0.0

    def path(self) -> list[Node]:
        """The nodes from the root down to this one."""
        return ([*self.parent.path()] if self.parent else []) + [self]


def reward(r: Reviewed) -> float:
    """The self-reward of a reviewed plan: its score over the maximum (0 without a review)."""
    return r.feedback.score / MAX_FEEDBACK_SCORE if r.feedback is not None else 0.0


def select(root: Node, exploration: float) -> Node:
    """Descend from the root by UCT (the first child on a tie) to a node not yet expanded."""
    node = root
    while node.children:
        parent = node
        node = max(parent.children, key=lambda c: c.value / c.visits
                   + exploration * math.sqrt(math.log(parent.visits) / c.visits))
    return node


def backpropagate(node: Node, value: float) -> None:
    """Add one visit and ``value`` to ``node`` and each of its ancestors."""
    while node is not None:
        node.visits += 1
        node.value += value
        node = node.parent


@register_method
class SeRTS(Reflexion):
    """Monte Carlo tree search over reviewed plans; at most ``max_iterations`` iterations."""

    name = "serts"
    config = SeRTSConfig
    stages = ()

    def plan(self, questions: Sequence[Any], planner: Any, sources: Sequence[str], kb: Any,
             seed: int) -> list[Planned]:
        cfg = self.cfg
        if cfg.max_iterations < 1 or cfg.children < 1:
            raise ValueError(f"pipeline.max_iterations={cfg.max_iterations}, pipeline.children={cfg.children}: "
                             "expected at least 1 each")
        greedy = SamplingParams(max_new_tokens=cfg.planner_max_new_tokens, temperature=0.0, seed=seed)
        first = write_and_review(self, questions, [[] for _ in questions], planner, kb, sources, greedy, seed)
        trees = [[Node(r)] for (r,) in first]
        for tree in trees:
            backpropagate(tree[0], reward(tree[0].reviewed))
        done = [finished(tree[0].reviewed) for tree in trees]
        for iteration in range(1, cfg.max_iterations):
            active = [i for i, d in enumerate(done) if not d]
            if not active:
                break
            leaves = [select(trees[i][0], cfg.exploration) for i in active]
            params = SamplingParams(max_new_tokens=cfg.planner_max_new_tokens, temperature=cfg.child_temperature,
                                    n=cfg.children, seed=seed + iteration)
            written = write_and_review(self, [questions[i] for i in active],
                                       [[n.reviewed for n in leaf.path()] for leaf in leaves], planner, kb, sources,
                                       params, seed)
            for i, leaf, siblings in zip(active, leaves, written):
                for r in siblings:
                    child = Node(r, parent=leaf)
                    leaf.children.append(child)
                    trees[i].append(child)
                    backpropagate(child, reward(r))
                    done[i] = done[i] or finished(r)
        return [chosen([n.reviewed for n in tree], {"tree_depth": max(len(n.path()) for n in tree) - 1})
                for tree in trees]
