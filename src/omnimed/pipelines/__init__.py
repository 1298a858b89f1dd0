"""Pipelines shared by the papers: the reader (:mod:`.reader`, prompts in :mod:`.prompts`), closed-book and
retrieve-then-read (:mod:`.rag`)."""

from omnimed.pipelines.prompts import PROMPT_VERSION
from omnimed.pipelines.reader import (
    Reader,
    ReaderOutput,
    parse_mcq_answer,
    parse_mcq_answers,
    parse_open_answer,
)

__all__ = ["PROMPT_VERSION", "Reader", "ReaderOutput", "parse_mcq_answer", "parse_mcq_answers", "parse_open_answer"]
