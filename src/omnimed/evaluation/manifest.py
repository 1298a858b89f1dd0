"""Paper-table manifests (``experiments/<paper>/<table>.yaml``, format in ``experiments/SCHEMA.md``), validated.

A manifest declares a table's rows (each a list of overrides and the published numbers), its dataset columns, its
metric and the scale presets. Validation happens before anything runs and names the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

#: pipelines whose runs exist; a row naming another method is reported as missing, never filled in
RUNNABLE_METHODS: frozenset[str] = frozenset({"closed_book", "rag", "retrieval"})
KNOWN_METHODS: frozenset[str] = RUNNABLE_METHODS | {
    "selfbiorag", "omnirag", "polyrag", "biomedsearch", "medsraf", "external",
}


class ManifestError(ValueError):
    """A manifest that cannot be used; the message names the file, and the row or field."""


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    method: str
    overrides: list[str] = Field(default_factory=list)
    published: dict[str, Optional[float]] = Field(default_factory=dict)
    note: str = ""

    @property
    def status(self) -> str:
        """runnable | missing (method not built yet) | external (a row we do not run)."""
        if self.method == "external":
            return "external"
        return "runnable" if self.method in RUNNABLE_METHODS else "missing"


class TableManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    paper: str
    table: str
    title: str
    source: str
    metric: str
    metrics: dict[str, str] = Field(default_factory=dict)  # column -> metric, where a column differs from `metric`
    scale: float = 100.0
    columns: list[str]
    datasets: dict[str, dict[str, str]]
    presets: dict[str, list[str]]
    rows: list[Row]
    note: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> TableManifest:
        for row in self.rows:
            if row.method not in KNOWN_METHODS:
                raise ValueError(f"row {row.name!r}: unknown method {row.method!r}; known: {sorted(KNOWN_METHODS)}")
            extra = set(row.published) - set(self.columns)
            if extra:
                raise ValueError(f"row {row.name!r}: published numbers for unknown columns {sorted(extra)}; "
                                 f"columns are {self.columns}")
        unknown = set(self.metrics) - set(self.columns)
        if unknown:
            raise ValueError(f"metrics: unknown columns {sorted(unknown)}; columns are {self.columns}")
        for preset, mapping in self.datasets.items():
            missing = [c for c in self.columns if c not in mapping]
            if missing:
                raise ValueError(f"datasets.{preset}: no dataset for columns {missing}")
        return self

    def metric_for(self, column: str) -> str:
        return self.metrics.get(column, self.metric)

    @property
    def group(self) -> str:
        """The W&B group of every run of this table."""
        return f"{self.paper}-{self.table}"

    def counts(self) -> dict[str, int]:
        out = {"runnable": 0, "missing": 0, "external": 0}
        for row in self.rows:
            out[row.status] += 1
        return out


def load_manifest(path: str | Path) -> TableManifest:
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"{path}: no such manifest")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: not valid YAML: {exc}") from exc
    try:
        return TableManifest.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'manifest'}: {e['msg']}" for e in exc.errors())
        raise ManifestError(f"{path}: {problems}") from exc


def find_manifests(root: str | Path = "experiments") -> list[Path]:
    """Every ``<paper>/<table>.yaml`` under ``root`` (results folders excluded)."""
    return sorted(p for p in Path(root).glob("*/*.yaml") if p.parent.name != "results")
