"""Records, loaders for real benchmark and corpus formats, and the synthetic medical world."""

from omnimed.data.errors import LoadReport, RecordError
from omnimed.data.hf import from_hf_dataset, to_hf_dataset
from omnimed.data.io import (
    iter_jsonl,
    load_record_set,
    read_records,
    save_record_set,
    write_records,
)
from omnimed.data.records import (
    SOURCE_KINDS,
    InstructionExample,
    Message,
    MultipleChoiceQuestion,
    OpenQuestion,
    Passage,
    Plan,
    PreferencePair,
    PromptCompletion,
    ReflectiveLabels,
    UtilityExample,
)

__all__ = [
    "SOURCE_KINDS",
    "InstructionExample",
    "LoadReport",
    "Message",
    "MultipleChoiceQuestion",
    "OpenQuestion",
    "Passage",
    "Plan",
    "PreferencePair",
    "PromptCompletion",
    "RecordError",
    "ReflectiveLabels",
    "UtilityExample",
    "from_hf_dataset",
    "iter_jsonl",
    "load_record_set",
    "read_records",
    "save_record_set",
    "to_hf_dataset",
    "write_records",
]
