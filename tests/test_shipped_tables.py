"""The paper tables this repository ships (experiments/<paper>/<table>.yaml): every manifest is valid, every
runnable row composes at every preset as `omnimed-reproduce` would run it, what a row or prepare step reads is made
by the table's own prepare steps, and each miniature column holds a question kind of its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from omnimed.tables.manifest import find_manifests, load_manifest


def test_every_shipped_manifest_is_valid():
    root = Path(__file__).resolve().parents[1] / "experiments"
    paths = find_manifests(root)
    for path in paths:
        m = load_manifest(path)
        assert m.rows and m.columns, path
        # a transcribed table has published numbers; an ablation of ours the paper does not print says so
        assert m.unpublished or any(v is not None for r in m.rows for v in r.published.values()), \
            f"{path}: no published number (a table the paper does not print: unpublished: true)"


# the miniature preset is what runs on a CPU; the paper preset's composes (GPU runs) are in the second tier
@pytest.mark.parametrize("preset", ["miniature", pytest.param("paper", marks=pytest.mark.slow)])
def test_every_runnable_row_of_every_shipped_table_composes_at_every_preset(preset):
    """What `omnimed-reproduce` checks before it runs anything: a row naming a model, corpus or key that has no
    config, or a dataset key its task does not know, would stop its table; none of the shipped tables may. A
    paper benchmark that no loader reads yet is not run: its cells are missing, with the reason."""
    from omnimed.evaluation.datasets import PENDING, dataset_status
    from omnimed.tables.manifest import AVERAGE
    from omnimed.tables.reproduce import DEFAULT_TRAINING_SEED, for_training_seed, plan_rows, validate

    root = Path(__file__).resolve().parents[1] / "experiments"
    presets = set()
    for path in find_manifests(root):
        m = for_training_seed(load_manifest(path), DEFAULT_TRAINING_SEED)
        presets |= set(m.presets)
        if preset in m.presets:
            plans = plan_rows(m, preset)
            validate(plans, m)
            for plan in plans:
                task = m.task_of(plan.row)
                for col in m.columns:
                    key = m.datasets[preset][col]
                    status, why = dataset_status(task, key)
                    assert key == AVERAGE or status in ("known", "pending"), (path, preset, col, key, why)
                    if status == "pending":
                        assert plan.pending[col] == f"missing: dataset {key}: {PENDING[key]}"
                        assert key not in plan.datasets
                    elif col in m.column_overrides or col in plan.row.column_overrides:  # on its own, with them
                        assert plan.alone[col] == key and col not in plan.datasets.get(key, [])
                    elif key != AVERAGE:
                        assert col in plan.datasets[key]
    assert presets == {"miniature", "paper"}, f"a preset this test does not compose: {sorted(presets)}"


_ARTIFACT = re.compile(r"\$\{paths\.root\}/((?:checkpoints|builds)/[^\s\"',\]]+)")


def _made_by(path: str, created: list[str]) -> bool:
    """Whether one of the ``created`` paths makes ``path``: the path itself, a folder holding it, or, for a created
    manifest, anything in that manifest's folder (``{source}`` stands for any source's name)."""
    pattern = re.escape(path).replace(re.escape("{source}"), "[a-z]+")
    return any(re.fullmatch(pattern + "(/.*)?", c) or re.fullmatch(re.escape(c.rsplit("/", 1)[0]) + "/.+", path)
               for c in created if c.endswith("manifest.json") or re.fullmatch(pattern + "(/.*)?", c))


@pytest.mark.parametrize("seed", [0, 1])
def test_what_a_miniature_row_or_step_reads_is_made_by_the_tables_own_prepare_steps(seed):
    """A row (or prepare step) reading a checkpoint or build that no earlier step creates fails only when it runs,
    hours into a table; a row reading a trained planner must name that seed's export, or `--training-seeds`
    would read seed 0's planner beside another seed's reader."""
    from omnimed.methods.omnirag.method import OmniRAGConfig
    from omnimed.tables.reproduce import for_training_seed, plan_rows

    root = Path(__file__).resolve().parents[1] / "experiments"
    for path in find_manifests(root):
        m = for_training_seed(load_manifest(path), seed)
        for preset, steps in m.prepare.items():
            created: list[str] = []
            for step in steps:
                for found in _ARTIFACT.findall(" ".join(step.command)):
                    assert _made_by(found, [*created, step.creates]), (path.name, step.name, found)
                created.append(step.creates)
            for plan in plan_rows(m, preset):
                extra = [o for col in plan.column_extra.values() for o in col]
                effective = dict(o.lstrip("+").split("=", 1) for o in [*plan.overrides, *extra] if "=" in o)
                for found in _ARTIFACT.findall(" ".join(effective.values())):
                    assert _made_by(found, created), (path.name, plan.row.name, found)
                planner = effective.get("pipeline.planner")
                if planner in OmniRAGConfig().checkpoints:  # a trained planner
                    assert f"pipeline.checkpoints.{planner}" in effective, (path.name, plan.row.name)


def test_table10_runs_one_mmlu_subject_per_column_at_both_presets():
    from omnimed.evaluation.datasets import PAPER_DATASETS, REALDATA_FILES
    from omnimed.tables.reproduce import plan_rows

    m = load_manifest(Path(__file__).resolve().parents[1] / "experiments" / "selfbiorag" / "table10.yaml")
    for preset in ("miniature", "paper"):
        keys = [m.datasets[preset][c] for c in m.columns]
        assert len(set(keys)) == 6, (preset, keys)
        for plan in plan_rows(m, preset):
            assert sorted(plan.datasets) == sorted(keys) and not plan.pending
    assert [REALDATA_FILES[k].rsplit("/", 1)[1] for k in m.datasets["miniature"].values()] == [
        "anatomy_val.csv", "clinical_knowledge_val.csv", "college_biology_val.csv", "college_medicine_val.csv",
        "medical_genetics_val.csv", "professional_medicine_val.csv"]
    assert {PAPER_DATASETS[k].where[1] for k in m.datasets["paper"].values()} == {
        "anatomy", "clinical_knowledge", "college_biology", "college_medicine", "medical_genetics",
        "professional_medicine"}


def test_miniature_columns_are_labelled_by_what_they_hold_and_world_columns_are_distinct():
    """Each paper column a miniature table fills with world questions is its own question kind (the same set
    twice would make two 'datasets' one), and the report labels it by that content."""
    from omnimed.evaluation.datasets import dataset_holds
    from omnimed.tables.report import column_holds

    root = Path(__file__).resolve().parents[1] / "experiments"
    for path in find_manifests(root):
        m = load_manifest(path)
        if m.table in ("table12", "table13") and m.paper == "omnirag":
            continue  # one pooled test set in the paper too: its columns are the sources, not datasets
        paper_keys = {c: m.datasets["paper"][c] for c in m.columns}
        mini = {c: m.datasets["miniature"][c] for c in m.columns}
        for a in m.columns:
            for b in m.columns:
                if a < b and paper_keys[a] != paper_keys[b] and mini[a].startswith("world"):
                    assert mini[a] != mini[b], f"{path.name}: {a} and {b} are distinct datasets in the paper"
    t6 = load_manifest(root / "selfbiorag" / "table6.yaml")
    assert column_holds(t6, "miniature", "MedQA") == "world treatment + self-contained MCQs in turn"
    assert column_holds(t6, "miniature", "MedMCQA") == "world mechanism MCQs"
    assert column_holds(t6, "paper", "MedQA") is None
    assert dataset_holds("world", "retrieval") == "world question -> gold passage"
