"""Self-BioRAG's instruction-tuning files as :class:`~omnimed.data.records.InstructionExample` records.

The files hold one ``{id, name, instruction, instances}`` object per line even when named ``.json``; each
instance becomes one example.

They follow the benchmark-loader contract described in :mod:`omnimed.data.loaders`: a malformed record raises
:class:`RecordError` naming file, line and field, or with ``skip_invalid=True`` is skipped and counted in
``report``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnimed.data.errors import LoadReport
from omnimed.data.loaders.record_fields import (
    as_object,
    build_record,
    collect_groups,
    optional_text,
    required_text,
    type_name,
)
from omnimed.data.loaders.record_locations import At, iter_list_or_jsonl
from omnimed.data.records import InstructionExample, Record

__all__ = ["load_selfbiorag_instructions"]


# ----------------------------------------------------------------------------------------------- Self-BioRAG
def _selfbiorag_instructions_instances(raw: dict[str, Any], at: At) -> list[dict[str, Any]]:
    instances = raw.get("instances")
    if isinstance(instances, dict):
        return [instances]
    if isinstance(instances, list) and instances and all(isinstance(x, dict) for x in instances):
        return instances
    raise at.error(
        "instances", f"expected {{input, output}} or a non-empty list of them, got {type_name(instances)}"
    )


def load_selfbiorag_instructions(
    path: str | Path,
    *,
    skip_invalid: bool = False,
    report: LoadReport | None = None,
) -> list[InstructionExample]:
    """Read Self-BioRAG instruction files: one ``{id, name, instruction, instances: {input, output}}`` object per
    line, even when the file is named ``.json`` (a file that is one JSON list is read too).

    ``instances`` may be a list of ``{input, output}``: each becomes its own example, with id ``<id>/<i>``.
    ``dataset`` = ``name``; other top-level keys go to ``metadata``. A bad instance invalidates its whole line.
    """
    path = Path(path)

    def convert(item: tuple[At, Any]) -> list[Record]:
        at, raw = item
        raw = as_object(raw, at)
        raw_id = raw.get("id")
        if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool) or str(raw_id).strip() == "":
            raise at.error("id", f"expected a string id, got {type_name(raw_id)}")
        instruction = required_text(raw, "instruction", at)
        name = optional_text(raw, "name", at) or ""
        metadata = {k: v for k, v in raw.items() if k not in ("id", "name", "instruction", "instances")}
        instances = _selfbiorag_instructions_instances(raw, at)
        examples: list[Record] = []
        for i, inst in enumerate(instances):
            field = "instances" if isinstance(raw["instances"], dict) else f"instances[{i}]"
            inst_at = At(path, at.line, at.field(field))
            rec = {
                "id": str(raw_id) if len(instances) == 1 else f"{raw_id}/{i}",
                "instruction": instruction,
                "input": required_text(inst, "input", inst_at, allow_empty=True),
                "output": required_text(inst, "output", inst_at, allow_empty=True),
                "dataset": name,
                "metadata": {**metadata, **{k: v for k, v in inst.items() if k not in ("input", "output")}},
            }
            examples.append(build_record(InstructionExample, rec, at))
        return examples

    return collect_groups(  # type: ignore[return-value]
        iter_list_or_jsonl(path), report, skip_invalid, convert
    )
