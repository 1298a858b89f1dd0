"""The miniature reader's training data: the world's training questions as reading exercises in the reader's own
prompt (gold among retrieved near misses), stored as TRL conversational records and trained on exactly as asked."""

from __future__ import annotations

import json
import random

import pytest
from recording import RecordingBackend

from omnimed.data import PromptCompletion, RecordError, load_record_set, read_records
from omnimed.data.records import MultipleChoiceQuestion, Passage
from omnimed.generation.render import render_with
from omnimed.generation.types import Request
from omnimed.knowledge.config import KnowledgeConfig
from omnimed.methods import prompts
from omnimed.methods.baselines.reader_data import ReaderDataConfig, build_reader_data, evidence_for
from omnimed.models.config import ModelConfig
from omnimed.models.loading import load_tokenizer
from omnimed.training.tokenize import IGNORE_INDEX, format_conversation, tokenize_prompt_completion

KNOWLEDGE = KnowledgeConfig(name="world_tiny", world_size="tiny", indexes=["bm25"], retriever="bm25")


@pytest.fixture(scope="module")
def built(world_tiny, kb_tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("reader_data")
    cfg = ReaderDataConfig(out=str(root / "out"))
    result = build_reader_data(cfg, kb=kb_tiny, world=world_tiny, knowledge=KNOWLEDGE, root=str(root), log=lambda m: None)
    return cfg, root, result


def test_exercises_are_the_readers_prompts_with_gold_among_distractors(built, world_tiny):
    _, _, result = built
    records = load_record_set(result.path, PromptCompletion)
    questions = {q.id: q for q in world_tiny.questions}
    train = [q for q in world_tiny.questions if q.split == "train"]
    assert not result.reused and len(records) == len(train) == result.counts["examples"]
    passages = {p.id: p for p in world_tiny.passages}
    first_gold_at = set()
    for r in records:
        q = questions[r.metadata["question_id"]]
        shown = r.metadata["passage_ids"]
        system, user = (m.content for m in r.prompt)
        reference = prompts.mcq_messages(q, [passages[pid] for pid in q.gold_passages])
        assert q.split == "train" and system == reference[0]["content"] == prompts.READER_SYSTEM
        # the user turn is the reader's: evidence numbered [1..n] with every gold passage, question, options, ask
        assert set(q.gold_passages) <= set(shown) and len(shown) == 3
        assert user.count("] source: ") == len(shown) and f"[{len(shown)}] source: " in user
        assert all(passages[pid].text[:120] in user for pid in q.gold_passages)
        assert user.split("Question: ", 1)[1] == reference[1]["content"].split("Question: ", 1)[1]
        assert [m.model_dump() for m in r.completion] == [{"role": "assistant",
                                                          "content": f"<answer>{','.join(q.answer)}</answer>"}]
        first_gold_at.add(shown.index(q.gold_passages[0]))
    assert len(first_gold_at) > 1  # shuffled: the gold passage is not always first


def test_a_rerun_reuses_the_stage_and_other_settings_get_their_own_folder(built, world_tiny, kb_tiny):
    cfg, root, result = built
    before = (result.path / "records.jsonl").read_bytes()
    again = build_reader_data(cfg, kb=kb_tiny, world=world_tiny, knowledge=KNOWLEDGE, root=str(root), log=lambda m: None)
    assert again.reused and (result.path / "records.jsonl").read_bytes() == before
    other = build_reader_data(ReaderDataConfig(passages=2, n_examples=5), kb=kb_tiny, world=world_tiny,
                              knowledge=KNOWLEDGE, root=str(root), log=lambda m: None)
    assert other.path != result.path and other.counts["examples"] == 5
    gold = {q.id: q.gold_passages for q in world_tiny.questions}
    assert all(len(r.metadata["passage_ids"]) == max(2, len(gold[r.metadata["question_id"]]))
               for r in load_record_set(other.path, PromptCompletion))


def _q(gold: list[str]) -> MultipleChoiceQuestion:
    return MultipleChoiceQuestion(id="q", question="Which?", options={"A": "x", "B": "y"}, answer="A", dataset="t",
                                  gold_passages=gold)


def test_evidence_keeps_every_gold_passage_and_tops_up_with_retrieved_ones():
    p = {i: Passage(id=f"wiki:{i}", source="wiki", text=f"text {i}") for i in range(6)}
    retrieved = [p[0], p[3], p[4], p[5]]
    shown = evidence_for(_q(["wiki:0", "wiki:1", "wiki:2"]), retrieved, p_by_id := {x.id: x for x in p.values()}, 2,
                         random.Random(0), True)
    assert sorted(x.id for x in shown) == ["wiki:0", "wiki:1", "wiki:2"]  # a multi-hop question keeps all its gold
    shown = evidence_for(_q(["wiki:0"]), retrieved, p_by_id, 3, random.Random(0), True)
    assert sorted(x.id for x in shown) == ["wiki:0", "wiki:3", "wiki:4"]  # the retrieved gold is not shown twice
    assert evidence_for(_q([]), retrieved, p_by_id, 3, random.Random(0), False) == []
    assert [x.id for x in evidence_for(_q([]), retrieved, p_by_id, 2, random.Random(0), True)] == ["wiki:0", "wiki:3"]


def test_bad_stage_values_name_their_key(world_tiny, kb_tiny, tmp_path):
    for bad, key in ((ReaderDataConfig(passages=0), "stage.passages"),
                     (ReaderDataConfig(self_contained_evidence_share=1.5), "stage.self_contained_evidence_share"),
                     (ReaderDataConfig(split="holdout"), "stage.split='holdout'")):
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            build_reader_data(bad, kb=kb_tiny, world=world_tiny, knowledge=KNOWLEDGE, root=str(tmp_path),
                              log=lambda m: None)


def test_training_text_starts_with_what_the_reader_sends_and_supervises_only_the_answer(built):
    """The reader in logprob mode reads the next token after ``<answer>``: training must see the same text."""
    _, _, result = built
    record = load_record_set(result.path, PromptCompletion)[0]
    tok = load_tokenizer(ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama"))
    messages = [m.model_dump() for m in record.prompt]
    pair = format_conversation(messages, [m.model_dump() for m in record.completion], tok)
    asked = render_with(Request(messages, {"assistant_prefix": "<answer>"}), tok)
    assert (pair["prompt"] + pair["completion"]).startswith(asked)
    feats = tokenize_prompt_completion({"prompt": [pair["prompt"]], "completion": [pair["completion"]]}, tok, 2048)
    supervised = tok.decode([t for t in feats["labels"][0] if t != IGNORE_INDEX])
    assert supervised.startswith(record.completion[0].content) and len(supervised) < 40
    with pytest.raises(ValueError, match="chat template"):
        format_conversation(messages, [m.model_dump() for m in record.completion], tok, template="plain")


def test_conversational_records_train_through_the_sft_data_module(built):
    from omnimed.training.config import DataConfig, TaskConfig
    from omnimed.training.data import SFTDataModule

    _, _, result = built
    records = load_record_set(result.path, PromptCompletion)[:6]
    tok = load_tokenizer(ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama"))
    dm = SFTDataModule(records, tok, DataConfig(batch_size=2, val_fraction=0.0),
                       TaskConfig(max_length=2048, mask_spans=[]))
    dm.setup("fit")
    assert dm.dropped_too_long == 0 and len(dm.train_dataset) == 6
    answers = sorted(tok.decode([t for t in row["labels"] if t != IGNORE_INDEX]).split("</answer>")[0] + "</answer>"
                     for row in dm.train_dataset)
    assert answers == sorted(r.completion[0].content for r in records)


def test_a_malformed_conversation_is_rejected_with_its_line(tmp_path):
    good = {"kind": "prompt_completion", "id": "a", "prompt": [{"role": "user", "content": "q"}],
            "completion": [{"role": "assistant", "content": "<answer>A</answer>"}]}
    bad = {**good, "id": "b", "completion": [{"role": "user", "content": "A"}]}
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RecordError, match=r"records\.jsonl.*2.*assistant"):
        read_records(path, PromptCompletion)


def test_reply_layout_exercises_are_what_self_biorag_reads_after_its_evidence(world_tiny, kb_tiny, tmp_path):
    """With ``reply_layout_share`` the reader also practises reading where Self-BioRAG's generator (trained from it)
    reads: the training text is, reflective tokens aside, the text the few-shot pipeline sends before the answer letter
    after retrieving the gold passage (the same demonstrations included), and only the answer is supervised (the
    evidence span is masked)."""
    from types import SimpleNamespace

    from omnimed.generation.hf import HFBackend
    from omnimed.methods.selfbiorag import tokens as T
    from omnimed.methods.selfbiorag.inference import SelfBioRAGConfig
    from omnimed.methods.selfbiorag.method import SelfBioRAGMethod
    from omnimed.training.config import TaskConfig

    # one demonstration (the tiny model reads at most 512 tokens; the stage's default is the tables' 3)
    cfg = ReaderDataConfig(reply_layout_share=1.0, reply_shots=1, out=str(tmp_path / "out"))
    result = build_reader_data(cfg, kb=kb_tiny, world=world_tiny, knowledge=KNOWLEDGE, root=str(tmp_path),
                               log=lambda m: None)
    records = load_record_set(result.path, PromptCompletion)
    train = [q for q in world_tiny.questions if q.split == "train"]
    one_passage = {q.id for q in train if len(q.answer) == 1 and len(q.gold_passages) <= 1}
    reply = [r for r in records if r.metadata["layout"] == "reply"]
    assert {r.metadata["question_id"] for r in reply} == one_passage and len(one_passage) < len(train)
    assert len(records) == len(train) + len(reply) and result.counts["reply_layout"] == len(reply)
    assert build_reader_data(ReaderDataConfig(), kb=kb_tiny, world=world_tiny, knowledge=KNOWLEDGE,
                             root=str(tmp_path), log=lambda m: None).counts["reply_layout"] == 0

    questions, passages = {q.id: q for q in train}, {p.id: p for p in world_tiny.passages}
    record = next(r for r in reply if questions[r.metadata["question_id"]].gold_passages)
    q = questions[record.metadata["question_id"]]
    model = ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama",
                        special_tokens=list(T.SPECIAL_TOKENS))
    method = SelfBioRAGMethod(SelfBioRAGConfig(retrieval="always", top_k=1, answer_mode="logprob", shots=1))
    method.demonstrations = train  # what the evaluation passes: the dataset's training split
    _, served = method.serve(SimpleNamespace(model=None), model)
    backend = RecordingBackend(HFBackend(served, batch_size=2))

    class Gold:
        def search_sources(self, queries, k, **kwargs):
            return [[passages[q.gold_passages[0]]] for _ in queries]

    method.answer([q], backend, Gold(), seed=0)
    (sent,) = backend.sent("answer_mcq")
    for token in (T.RETRIEVE, *T.RELEVANCE_LABELS):
        sent = sent.replace(token, "")
    tok = load_tokenizer(model)
    pair = format_conversation([m.model_dump() for m in record.prompt], [m.model_dump() for m in record.completion],
                               tok)
    assert (pair["prompt"] + pair["completion"]).startswith(sent) and sent.endswith("</paragraph>The answer is")
    assert sent.count("The answer is") == 2  # a solved question, then the one asked
    task = TaskConfig(max_length=2048, mask_spans=[["<paragraph>", "</paragraph>"]])
    feats = tokenize_prompt_completion({"prompt": [pair["prompt"]], "completion": [pair["completion"]]}, tok,
                                       task.max_length, task.mask_spans)
    supervised = tok.decode([t for t in feats["labels"][0] if t != IGNORE_INDEX], skip_special_tokens=True)
    letter = q.answer[0]
    assert supervised.strip() == f"The answer is {letter}: {q.options[letter]}."
