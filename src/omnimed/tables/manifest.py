"""Paper-table manifests (``experiments/<paper>/<table>.yaml``, format in ``experiments/SCHEMA.md``), validated.

A manifest declares a table's rows (each a list of overrides and the published numbers), its dataset columns, its
metric and the scale presets. Validation happens before anything runs and names the file and the field.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_validator,
)

#: a row that scores the knowledge base's retrievers themselves (task=retrieval), not a method's answers
RETRIEVAL = "retrieval"
#: a row we do not run (a closed model's published number, say)
EXTERNAL = "external"
#: a column's dataset that is not run: the mean of the row's other columns
AVERAGE = "average"
#: the console scripts a prepare step may run
PREPARE_COMMANDS: frozenset[str] = frozenset({"omnimed-build", "omnimed-train", "omnimed-index", "omnimed-data"})
DEFAULT_TRAINING_SEED = 0  # conf/train.yaml's seed: what a table trains with unless --training-seeds says otherwise
SEED_FIELD, SEED_TAG_FIELD = "{train_seed}", "{seed_tag}"  # template fields a manifest or recipe may use


def seed_tag(seed: int) -> str:
    """The suffix of what is trained with ``seed``: none for the default seed, so a table's usual run and its
    seed-spread run share that seed's models."""
    return "" if seed == DEFAULT_TRAINING_SEED else f"-seed{seed}"


def fill_seed(text: str, seed: int) -> str:
    """``text`` with ``{train_seed}`` and ``{seed_tag}`` filled in for ``seed``."""
    return text.replace(SEED_FIELD, str(seed)).replace(SEED_TAG_FIELD, seed_tag(seed))


def runnable_methods() -> frozenset[str]:
    """Row methods whose runs exist: every registered method, and the retrieval rows."""
    from omnimed.methods.registry import method_names

    return frozenset({*method_names(), RETRIEVAL})


def eval_tasks() -> dict:
    """The evaluation tasks a table may name (``task:``), each with the metrics it writes."""
    from omnimed.evaluation.tasks import EVAL_TASKS

    return EVAL_TASKS


def produces(task: str, metric: str, method: str | None = None) -> bool:
    """Whether a run of evaluation task ``task`` writes ``metric``: the task's own metrics, or on a ``qa`` run those
    the row's registered ``method`` declares (:attr:`~omnimed.methods.registry.Method.metric_names`)."""
    from fnmatch import fnmatchcase

    known = eval_tasks().get(task)
    if known is not None and known.produces(metric):
        return True
    if task != "qa" or method not in runnable_methods() - {RETRIEVAL}:
        return False
    from omnimed.methods.registry import get_method

    return any(fnmatchcase(metric, pattern) for pattern in get_method(method).metric_names)


class ManifestError(ValueError):
    """A manifest that cannot be used; the message names the file, and the row or field."""


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    method: str
    overrides: list[str] = Field(default_factory=list)
    # preset -> overrides of this row at that preset only (e.g. which trained checkpoint stands in at miniature)
    preset_overrides: dict[str, list[str]] = Field(default_factory=dict)
    # column -> overrides of this row's run of that column only (PolyRAG's weights per domain): run on its own
    column_overrides: dict[str, list[str]] = Field(default_factory=dict)
    published: dict[str, Optional[float]] = Field(default_factory=dict)
    note: str = ""
    # preset -> why the row is not run at that preset (a measured cost, say) unless ``--rows`` names it; its cells
    # state the reason, so the table is whole without a run that no one can afford there
    not_run: dict[str, str] = Field(default_factory=dict)
    # set by the table: why a row whose method is built still cannot run (a metric its task does not produce)
    _blocked: str = PrivateAttr(default="")

    @property
    def status(self) -> str:
        """runnable | missing (method not built yet, or a metric its task does not produce) | external (a row
        we do not run)."""
        if self.method == EXTERNAL:
            return "external"
        return "runnable" if self.method in runnable_methods() and not self._blocked else "missing"

    @property
    def reason(self) -> str:
        """Why the row does not run ("" when it does)."""
        if self.method == EXTERNAL:
            return "external: not run here"
        if self.method not in runnable_methods():
            return f"method {self.method} not built yet"
        return self._blocked


class PrepareStep(BaseModel):
    """One command a table needs before its rows run (build data, train a model). ``creates``: the path (relative
    to ``paths.root``) that exists once the step is done; a step whose path exists is skipped."""

    model_config = ConfigDict(extra="forbid")

    name: str
    command: list[str] = Field(min_length=1)
    creates: str

    @model_validator(mode="after")
    def _known_command(self) -> PrepareStep:
        if self.command[0] not in PREPARE_COMMANDS:
            raise ValueError(f"prepare step {self.name!r}: command {self.command[0]!r} is not one of "
                             f"{sorted(PREPARE_COMMANDS)}")
        return self


class TableManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    paper: str
    table: str
    title: str
    source: str
    metric: str
    metrics: dict[str, str] = Field(default_factory=dict)  # column -> metric, where a column differs from `metric`
    task: Optional[str] = None  # the omnimed-evaluate task of every row (default: retrieval rows retrieval, others qa)
    prepare: dict[str, list[PrepareStep]] = Field(default_factory=dict)  # preset -> steps run before the rows
    scale: float = 100.0
    scales: dict[str, float] = Field(default_factory=dict)  # column -> scale, where a column differs (counts: 1)
    digits: dict[str, int] = Field(default_factory=dict)  # column -> decimals printed, where not 1 (a fraction: 3)
    columns: list[str]
    # column -> overrides of every row's run of that column (a restriction the paper makes per column, e.g. one
    # retrieval source); such a column runs on its own instead of in the row's sweep over datasets
    column_overrides: dict[str, list[str]] = Field(default_factory=dict)
    datasets: dict[str, dict[str, str]]
    presets: dict[str, list[str]]
    rows: list[Row]
    note: str = ""
    # a table of ours that the paper describes but does not print (an ablation): no row may carry a published number
    unpublished: bool = False
    # the row the report compares every other row with, question by question (the paper's method, usually)
    paired_against: Optional[str] = None

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> TableManifest:
        # a method not built yet is known when a paper folder of that name exists (one spelling per paper)
        known = runnable_methods() | {EXTERNAL, *((info.context or {}).get("papers", ()))}
        for row in self.rows:
            if row.method not in known:
                raise ValueError(f"row {row.name!r}: unknown method {row.method!r}; known: {sorted(known)}")
            extra = set(row.published) - set(self.columns)
            if extra:
                raise ValueError(f"row {row.name!r}: published numbers for unknown columns {sorted(extra)}; "
                                 f"columns are {self.columns}")
        if self.task is not None and self.task not in eval_tasks():
            raise ValueError(f"task={self.task!r}; expected one of {sorted(eval_tasks())}")
        for row in self.rows:
            for field in ("preset_overrides", "not_run"):
                odd = set(getattr(row, field)) - set(self.presets)
                if odd:
                    raise ValueError(f"row {row.name!r}: {field} for unknown presets {sorted(odd)}; presets are "
                                     f"{sorted(self.presets)}")
            blank = [preset for preset, why in row.not_run.items() if not why.strip()]
            if blank:
                raise ValueError(f"row {row.name!r}: not_run.{blank[0]} is empty; say why the row is not run there")
        stray = set(self.prepare) - set(self.presets)
        if stray:
            raise ValueError(f"prepare: presets {sorted(stray)} are not among presets {sorted(self.presets)}")
        odd_columns = set(self.column_overrides) - set(self.columns)
        if odd_columns:
            raise ValueError(f"column_overrides: unknown columns {sorted(odd_columns)}; columns are {self.columns}")
        for row in self.rows:
            odd = set(row.column_overrides) - set(self.columns)
            if odd:
                raise ValueError(f"row {row.name!r}: column_overrides for unknown columns {sorted(odd)}; columns are "
                                 f"{self.columns}")
        if self.unpublished and any(v is not None for r in self.rows for v in r.published.values()):
            raise ValueError("unpublished: true, but rows carry published numbers; an unpublished table has none")
        if self.paired_against is not None and self.paired_against not in {r.name for r in self.rows}:
            raise ValueError(f"paired_against={self.paired_against!r}: no row of that name; rows are "
                             f"{[r.name for r in self.rows]}")
        for field_name in ("scales", "digits"):
            if odd := set(getattr(self, field_name)) - set(self.columns):
                raise ValueError(f"{field_name}: unknown columns {sorted(odd)}; columns are {self.columns}")
        unknown = set(self.metrics) - set(self.columns)
        if unknown:
            raise ValueError(f"metrics: unknown columns {sorted(unknown)}; columns are {self.columns}")
        for preset, mapping in self.datasets.items():
            missing = [c for c in self.columns if c not in mapping]
            if missing:
                raise ValueError(f"datasets.{preset}: no dataset for columns {missing}")
        measured = [c for c in self.columns if any(m[c] != "average" for m in self.datasets.values())]
        for row in self.rows:
            task = self.task_of(row)
            lacking = list(dict.fromkeys(m for m in map(self.metric_for, measured)
                                         if not produces(task, m, row.method)))
            writes = eval_tasks()[task].metrics if task in eval_tasks() else ()
            row._blocked = (f"metric{'s' if len(lacking) > 1 else ''} {', '.join(lacking)} not produced yet "
                            f"(task={task} writes {', '.join(sorted(writes))})"
                            if lacking else "")
        return self

    def metric_for(self, column: str) -> str:
        return self.metrics.get(column, self.metric)

    def scale_for(self, column: str) -> float:
        return self.scales.get(column, self.scale)

    def digits_for(self, column: str) -> int:
        """Decimals a report prints in ``column``."""
        return self.digits.get(column, 1)

    def task_of(self, row: Row) -> str:
        """The ``omnimed-evaluate`` task a row runs: the table's ``task`` if it names one, else by the row's
        method (retrieval rows ``retrieval``, the others ``qa``)."""
        if self.task:
            return self.task
        return "retrieval" if row.method == RETRIEVAL else "qa"

    @property
    def group(self) -> str:
        """The W&B group of every run of this table."""
        return f"{self.paper}-{self.table}"

    def counts(self) -> dict[str, int]:
        out = {"runnable": 0, "missing": 0, "external": 0}
        for row in self.rows:
            out[row.status] += 1
        return out

    def missing_reasons(self) -> dict[str, int]:
        """Why rows are missing -> how many rows."""
        return dict(Counter(row.reason for row in self.rows if row.status == "missing"))

    def not_run_reasons(self) -> dict[tuple[str, str], int]:
        """Why rows are not run at a preset (``not_run``): (preset, reason) -> how many rows."""
        return dict(Counter(item for row in self.rows for item in row.not_run.items()))


def load_manifest(path: str | Path) -> TableManifest:
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"{path}: no such manifest")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: not valid YAML: {exc}") from exc
    folder = path.parent.name
    if isinstance(raw, dict) and raw.get("paper") != folder:
        raise ManifestError(f"{path}: paper: {raw.get('paper')!r}, but the manifest is in the folder {folder!r}; a "
                            "paper has one spelling, its folder's name")
    try:
        _expand_recipes(raw, path)
        papers = {p.name for p in path.parent.parent.iterdir() if p.is_dir()}
        return TableManifest.model_validate(raw, context={"papers": papers})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'manifest'}: {e['msg']}" for e in exc.errors())
        raise ManifestError(f"{path}: {problems}") from exc


def _expand_recipes(raw: dict, path: Path) -> None:
    """A ``prepare`` entry that is a string names a YAML file (relative to the manifest) holding a list of steps,
    so tables that share a training recipe name it once. An entry ``{recipe: <file>, seed: N}`` takes the recipe's
    steps at training seed N whatever seed the table runs at (a row that compares a trained part at the run's seed
    with the same part at seed 0 needs both), each step's name ending in " at seed N"."""
    if not isinstance(raw, dict) or not isinstance(raw.get("prepare"), dict):
        return
    for preset, items in raw["prepare"].items():
        steps = []
        for i, item in enumerate(items or []):
            if isinstance(item, str):
                steps.extend(_read_recipe(path, f"prepare.{preset}", item))
            elif isinstance(item, dict) and "recipe" in item:
                where = f"prepare.{preset}.{i}"
                if set(item) != {"recipe", "seed"} or not isinstance(item["seed"], int) or item["seed"] < 0:
                    raise ManifestError(f"{path}: {where}: a pinned recipe is {{recipe: <file>, seed: <seed >= 0>}}, "
                                        f"got {item!r}")
                seed = item["seed"]
                steps.extend({**step, "name": f"{step['name']} at seed {seed}"}
                             if isinstance(step, dict) and "name" in step else step
                             for step in _read_recipe(path, where, item["recipe"], seed))
            else:
                steps.append(item)
        raw["prepare"][preset] = steps


def _read_recipe(path: Path, where: str, item: object, seed: int | None = None) -> list:
    """The steps of the recipe ``item`` names; with ``seed``, its ``{train_seed}`` / ``{seed_tag}`` fields are
    filled in for that seed before the YAML is read (a pinned recipe)."""
    recipe = path.parent / str(item)
    if not recipe.is_file():
        raise ManifestError(f"{path}: {where}: recipe {item!r} not found ({recipe})")
    text = recipe.read_text()
    loaded = yaml.safe_load(text if seed is None else fill_seed(text, seed))
    if not isinstance(loaded, list):
        raise ManifestError(f"{recipe}: a recipe is a list of prepare steps")
    return loaded


def find_manifests(root: str | Path = "experiments") -> list[Path]:
    """Every ``<paper>/<table>.yaml`` under ``root`` (results folders excluded)."""
    return sorted(p for p in Path(root).glob("*/*.yaml") if p.parent.name != "results")
