"""Loaders that turn public benchmark and corpus layouts into omnimed records.

One module per family of formats:

* benchmarks: :mod:`.multiple_choice` (MIRAGE, MedQA, MedMCQA, MMLU, BioMedMCQs), :mod:`.pubmedqa_bioasq`
  (PubMedQA, BioASQ and their PubMed passages), :mod:`.instructions` (Self-BioRAG instruction files),
  :mod:`.longform` (long-form QA); their shared helpers are :mod:`.record_locations` (file, line and key of a raw
  record) and :mod:`.record_fields` (typed field checks);
* knowledge corpora of ``shared/realdata``: :mod:`.text_corpora` (book, guideline, wiki), :mod:`.graph_corpus`
  (graph passages) built from :mod:`.obo` (Disease Ontology), :mod:`.hetionet` and :mod:`.knowledge_graph`
  (concepts, triples, merging); :mod:`.ngc_dates` reads NGC dates, :mod:`.realdata_layout` finds the files and
  :mod:`.realdata` loads all corpora at once.

The benchmark loaders share one contract:

* a malformed record raises :class:`~omnimed.data.errors.RecordError` naming the file, the line (JSONL line, CSV
  row, or the line where the record starts in a whole-JSON file) and the field, and saying what was expected. In
  whole-JSON files the field path starts with the record's key (``medqa/0001.answer``, ``[12].gold``) so the
  record is named even where the line is ambiguous;
* with ``skip_invalid=True`` bad records are skipped and counted in ``report`` instead;
* JSONL is read line by line with :func:`~omnimed.data.io.iter_jsonl` (real files hold U+2028 inside strings).
* every file is opened through :func:`~omnimed.data.io.text_lines` / :func:`~omnimed.data.io.read_text` (or
  functions built on them), so a folder given for a file, or a byte that is not UTF-8, is a one-line error
  naming the file (and the line) rather than a bare ``IsADirectoryError`` / ``UnicodeDecodeError``.

Loader options are keyword-only; an unknown option is a ``TypeError`` rather than being silently ignored.
"""
