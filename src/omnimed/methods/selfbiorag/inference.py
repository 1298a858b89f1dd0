"""Self-BioRAG inference: adaptive retrieval and critique-weighted evidence selection (sections 3.4 and 5.2,
appendix 4), through any generation backend (``hf``, ``vllm``, ``openai``; the world's oracle for checks).

For each question the generator M is asked, in its own output layout (:mod:`~omnimed.methods.selfbiorag.tokens`):

1. **when to retrieve**: ``adaptive`` retrieves when p([Retrieval]) / (p([Retrieval]) + p([No Retrieval])) > delta
   (Eq. 1, read from the next-token distribution after the question); ``always`` / ``never`` force it;
2. **without evidence**: the answer follows ``[No Retrieval]``;
3. **with evidence**: the top ``top_k`` passages are retrieved; for each, the reply is started with
   ``[Retrieval]<paragraph>EVIDENCE</paragraph>``, M's REL token distribution is read, M answers after its most
   likely REL token, then its SUP (only after ``[Relevant]``, as in the training layout; 0 otherwise) and USE
   distributions after the answer are read, and the passage's score is
   S = s_seq + w_rel s_rel + w_sup s_sup + w_use s_use with the normalised probabilities of appendix 4 (Eqs. 2-4)
   and, with ``use_seqscore`` (the reference's runs), the answer's geometric-mean token probability s_seq. The
   answer given with the best-scoring passage is kept.

In ``generate`` mode M writes its whole reply, sentence by sentence with its reflective tokens, as the reference's
decoder lets it; SUP and USE are read where M writes its first support and utility token (a reply without one
scores 0 there, as in the reference; one that ends without a utility token has its USE read where it ends). A
reply that asks for ``[Retrieval]`` again ends its segment there; with ``max_depth`` > 1 the segment tree of
Self-RAG's long-form decoder continues it: each of the ``beam_width`` best open paths (by the product of their
segments' S) is continued with each of the question's passages, for at most ``max_depth`` segments. The reference's
multiple-choice decoder takes ``--beam_width 2 --max_depth 2`` but writes one segment per passage, so
``max_depth: 1`` is the paper's run.

Each question is asked in the generator model's ``prompt_layout`` (its chat template, or the plain
``### Instruction:`` text the released Self-RAG weights know), after ``shots`` solved questions of the dataset's
training split chosen by BM25 (Table 4's 3-shot).

Answers to multiple-choice questions are read in one of two ways (``answer_mode``): ``logprob`` starts the answer
with ``answer_prefix`` and takes the most likely option letter (small models, and exact scoring), ``generate`` lets
M write until its next reflective token and finds the option it names. The weights default to Self-RAG's
(w_rel 1.0, w_sup 1.0, w_use 0.5), which Self-BioRAG keeps.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from omnimed.data.records import MultipleChoiceQuestion, Passage
from omnimed.generation.types import Request, SamplingParams
from omnimed.methods.selfbiorag import prompts
from omnimed.methods.selfbiorag.tokens import (
    NO_RETRIEVE,
    PARAGRAPH_CLOSE,
    PARAGRAPH_OPEN,
    REFLECTIVE_TOKENS,
    RELEVANCE_LABELS,
    RELEVANT,
    RETRIEVE,
    SUPPORT_LABELS,
    UTILITY_LABELS,
    relevance_score,
    retrieval_score,
    support_score,
    utility_score,
)
from omnimed.models.layout import request_prompt

MODES = ("adaptive", "always", "never")
#: questions whose branches are judged together: a backend that keeps the key/value caches of recent rows (the hf
#: backend, up to backend.prefix_cache_mb) then continues each branch's REL row for its answer, SUP and USE calls
QUESTIONS_PER_PASS = 6


@dataclass
class SelfBioRAGConfig:
    """``pipeline=selfbiorag``. The ablation switches of Tables 5 and 6:

    - ``retrieval`` (adaptive | always | never), ``delta`` (Eq. 1 threshold, 0.2), ``top_k`` (10 passages);
    - ``shots``: solved questions shown before each one (Table 4: 3; chosen by BM25 from the dataset's training
      split), ``use_seqscore``: add the answer's sequence score to each passage's S (the reference's runs);
    - ``beam_width`` / ``max_depth``: the segment tree in ``generate`` mode (max_depth 1: one segment per passage);
    - ``domain_corpus``: search ``domain_sources`` (true; PubMed, PMC, CPG, textbooks in the paper) or
      ``general_sources`` (false; Wikipedia);
    - ``domain_retriever``: search with ``domain_method`` (true; MedCPT in the paper, the knowledge base's dense
      encoder here) or ``general_method`` (false; a general retriever: Contriever-MSMARCO in the paper);
    - ``domain_instructions``: the generator (and critic) tuned on the domain instruction sets (true:
      ``generator`` / ``critic``) or without them (false: ``baseline_generator`` / ``baseline_critic``, Self-RAG's
      released weights in the paper). A null model is the run's ``model``.
    """

    name: str = "selfbiorag"
    retrieval: str = "adaptive"
    delta: float = 0.2
    top_k: int = 10
    per_source_k: Optional[int] = None
    w_rel: float = 1.0
    w_sup: float = 1.0
    w_use: float = 0.5
    use_seqscore: bool = True
    beam_width: int = 2
    max_depth: int = 1
    shots: int = 0  # conf/pipeline/selfbiorag.yaml sets the paper's 3; built in code, a pipeline shows none
    domain_corpus: bool = True
    domain_sources: list[str] = field(default_factory=lambda: ["book", "guideline", "research"])
    general_sources: list[str] = field(default_factory=lambda: ["wiki"])
    domain_retriever: bool = True
    domain_method: str = "dense"
    general_method: str = "bm25"
    domain_instructions: bool = True
    generator: Optional[str] = None
    baseline_generator: Optional[str] = None
    critic: Optional[str] = None
    baseline_critic: Optional[str] = None
    mcq_instruction: str = "Choose the correct option and state it."
    answer_mode: str = "generate"
    answer_prefix: str = "The answer is"
    max_new_tokens: int = 128
    temperature: float = 0.0

    def check(self) -> None:
        if self.shots < 0:
            raise ValueError(f"pipeline.shots={self.shots}; expected 0 or more demonstrations")
        if self.retrieval not in MODES:
            raise ValueError(f"pipeline.retrieval={self.retrieval!r}; expected one of {', '.join(MODES)}")
        if self.answer_mode not in ("logprob", "generate"):
            raise ValueError(f"pipeline.answer_mode={self.answer_mode!r}; expected logprob or generate")
        for key in ("top_k", "beam_width", "max_depth"):
            if getattr(self, key) < 1:
                raise ValueError(f"pipeline.{key}={getattr(self, key)}; expected at least 1")

    @property
    def sources(self) -> list[str]:
        return list(self.domain_sources if self.domain_corpus else self.general_sources)

    @property
    def method(self) -> str:
        return self.domain_method if self.domain_retriever else self.general_method

    @property
    def generator_model(self) -> Optional[str]:
        return self.generator if self.domain_instructions else self.baseline_generator

    @property
    def critic_model(self) -> Optional[str]:
        return self.critic if self.domain_instructions else self.baseline_critic


@dataclass
class Candidate:
    """One passage's branch (in the segment tree, one finished path that starts with that passage): its critique
    scores, the answer's sequence score (its tokens' geometric-mean probability), the combined score S (a path's:
    the product of its segments') and the answer given with it."""

    passage_id: str
    relevance: str
    s_rel: float
    s_sup: float
    s_use: float
    s_seq: float
    score: float
    letter: str | None
    text: str
    depth: int = 1  # segments on its path (generate mode with max_depth > 1); the critiques are its last one's


@dataclass
class SelfBioRAGOutput:
    """What the pipeline decided for one question (``prediction`` None with a ``problem`` when no option could be
    read, which counts as wrong)."""

    question_id: str
    prediction: str | None
    correct: bool
    retrieved: bool
    p_retrieve: float | None
    raw: str
    problem: str | None = None
    candidates: list[Candidate] = field(default_factory=list)
    passage_ids: list[str] = field(default_factory=list)
    error: str | None = None  # a generation call for this question failed (the backend's error)


#: the ways an answer names its option: "the answer is (B)", "Answer: (B)", "<answer>B</answer>"
_ANSWER_IS = re.compile(r"answer\s*(?:is\s*:?|:)\s*\(?([A-Z])\b|<answer>\s*([A-Z])\s*</answer>", re.IGNORECASE)
_REFLECTIVE = re.compile("|".join(re.escape(t) for t in sorted(REFLECTIVE_TOKENS, key=len, reverse=True)))


def read_option(text: str, options: dict[str, str]) -> str | None:
    """The option a free-text answer names: ``answer is X`` first, else the one option whose text it contains."""
    match = _ANSWER_IS.search(text)
    letter = (match.group(1) or match.group(2)).upper() if match else None
    if letter in options:
        return letter
    low = text.lower()
    named = [k for k, v in options.items() if v.lower() in low]
    return named[0] if len(named) == 1 else None


def _probs(logprobs: dict[str, float]) -> dict[str, float]:
    return {t: math.exp(v) for t, v in logprobs.items()}


def _best(logprobs: dict[str, float], tokens: Sequence[str]) -> str:
    return max(tokens, key=lambda t: logprobs.get(t, float("-inf")))


def question_block(q: MultipleChoiceQuestion) -> str:
    """A question as the generator reads it: the question, then one ``X. option`` line per option."""
    return q.question + "\n" + "\n".join(f"{k}. {v}" for k, v in q.options.items())


def demonstration(q: MultipleChoiceQuestion, answer_prefix: str) -> str:
    """A solved question shown before the one asked: its block, then its answer in the form both answer modes read
    (``The answer is C.``)."""
    return f"{question_block(q)}\n{answer_prefix} {q.answer[0]}."


def question_prompt(q: MultipleChoiceQuestion, shown: Sequence[MultipleChoiceQuestion], cfg: SelfBioRAGConfig,
                    prompt_layout: str = "chat") -> str | list[dict[str, str]]:
    """What the generator is sent for ``q``: the instruction, then the solved questions ``shown`` and ``q``."""
    blocks = [*(demonstration(d, cfg.answer_prefix) for d in shown), question_block(q)]
    return request_prompt(cfg.mcq_instruction, "\n\n".join(blocks), prompt_layout)


def reply_reading(q: MultipleChoiceQuestion, passage: Passage | None, shown: Sequence[MultipleChoiceQuestion] = (),
                  prompt_layout: str = "chat", cfg: SelfBioRAGConfig | None = None
                  ) -> tuple[str | list[dict[str, str]], str]:
    """A reading exercise in the generator's own layout, for a base model that should read where Self-BioRAG's
    generator reads (the miniature reader, standing in for a base LM that reads evidence wherever it is shown):
    the prompt :class:`SelfBioRAG` sends for ``q`` after the solved questions ``shown``, and the reply written
    after ``passage`` was retrieved (``<paragraph>EVIDENCE</paragraph>``; the reflective tokens left out, as the
    base model has not learnt them) or with none, ending in the answer as both answer modes read it
    (``The answer is X: option.``)."""
    cfg = cfg or SelfBioRAGConfig()
    letter = q.answer[0]
    evidence = f"{PARAGRAPH_OPEN}{prompts.evidence_text(passage)}{PARAGRAPH_CLOSE}" if passage is not None else ""
    answer = f"{cfg.answer_prefix} {letter}: {q.options[letter]}."
    return question_prompt(q, shown, cfg, prompt_layout), evidence + answer


def pick_demonstrations(questions: Sequence[MultipleChoiceQuestion], pool: Sequence[Any], k: int
                        ) -> dict[str, list[MultipleChoiceQuestion]]:
    """For each question, the ``k`` solved questions of ``pool`` most similar to it (BM25 over the question texts,
    the knowledge base's analyser; the reference picks nearest neighbours of the training split), most similar
    first, never the question itself."""
    from omnimed.knowledge.sparse import BM25Index

    solved = [p for p in pool if isinstance(p, MultipleChoiceQuestion) and len(p.answer) == 1]
    if k < 1 or not solved:
        return {q.id: [] for q in questions}
    index = BM25Index.build([p.question for p in solved])
    rankings = index.search([q.question for q in questions], k + 1)
    return {q.id: [solved[row] for row, _ in ranking if solved[row].id != q.id][:k]
            for q, ranking in zip(questions, rankings)}


@dataclass(frozen=True)
class _Said:
    """What M said after one prefix: the option it names, its answer text (reflective tokens removed), the
    sequence score, the raw reply (tokens kept; logprob mode: the templated answer) and whether it ran out of
    tokens."""

    letter: str | None
    text: str
    seq: float
    raw: str
    cut: bool = False


@dataclass
class _Path:
    """A path of the segment tree: the question, M's reply so far (prompt continuation, tokens and evidence
    included) and the candidate it stands for so far (its first passage, the product of its segments' S, its
    answer text and depth; None before its first segment)."""

    qi: int
    options: dict[str, str]
    reply: str = ""
    candidate: Candidate | None = None


def _first(text: str, tokens: Sequence[str]) -> int | None:
    """Where the first of ``tokens`` starts in ``text`` (None if none is there)."""
    found = [text.find(t) for t in tokens if t in text]
    return min(found) if found else None


class SelfBioRAG:
    """Answer multiple-choice questions as Self-BioRAG does; ``backend`` serves the generator, ``kb`` is the
    knowledge base (needed unless ``retrieval=never``), ``demonstrations`` the solved questions the ``shots``
    shown before each question are chosen from."""

    def __init__(self, cfg: SelfBioRAGConfig, backend, kb=None, prompt_layout: str = "chat",
                 demonstrations: Sequence[Any] = ()) -> None:
        cfg.check()
        if cfg.shots and not demonstrations:
            raise ValueError(f"pipeline.shots={cfg.shots} needs solved questions to choose demonstrations from "
                             "(the evaluation passes the dataset's training split); set pipeline.shots=0")
        self.prompt_layout = prompt_layout  # the generator model's (chat template, or Self-RAG's plain text)
        self.pool = demonstrations
        self._shown: dict[str, list[MultipleChoiceQuestion]] = {}
        if cfg.retrieval != "never" and kb is None:
            raise ValueError(f"pipeline.retrieval={cfg.retrieval} needs a knowledge base")
        self.cfg, self.backend, self.kb = cfg, backend, kb
        self._errors: dict[str, str] = {}
        # M writes its whole reply; one that asks for [Retrieval] again stops there (the segment tree's cut)
        self.params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                     stop=(RETRIEVE,))

    # ------------------------------------------------------------------------------------------- requests
    def _prompt(self, q: MultipleChoiceQuestion) -> str | list[dict[str, str]]:
        return question_prompt(q, self._shown.get(q.id, []), self.cfg, self.prompt_layout)

    def _request(self, q: MultipleChoiceQuestion, prefix: str, task: str, **meta: Any) -> Request:
        return Request(self._prompt(q), {"task": task, "question_id": q.id, "assistant_prefix": prefix, **meta})

    # ------------------------------------------------------------------------------------------- steps
    def retrieval_probabilities(self, questions: Sequence[MultipleChoiceQuestion]) -> list[float]:
        """Eq. 1's ratio for each question, from the generator's first-token distribution."""
        lps = self.backend.next_token_logprobs([self._request(q, "", "retrieval") for q in questions],
                                               [RETRIEVE, NO_RETRIEVE])
        return [retrieval_score(_probs(lp)) for lp in lps]

    def _answers(self, items: list[tuple[MultipleChoiceQuestion, str, dict[str, Any]]]) -> list[_Said]:
        """What M says for each (question, assistant prefix, meta) in the configured answer mode. The sequence
        score is the answer tokens' geometric-mean probability, exp(mean log-prob), as Self-RAG adds it to a
        segment's score: in ``logprob`` mode the chosen letter's probability, in ``generate`` mode that of the
        reply M wrote (its reflective tokens included), scored after its prefix."""
        if not items:
            return []
        if self.cfg.answer_mode == "logprob":
            out: list[_Said] = [_Said(None, "", 0.0, "")] * len(items)
            groups: dict[tuple[str, ...], list[int]] = {}
            for i, (q, _, _) in enumerate(items):
                groups.setdefault(tuple(q.options), []).append(i)
            for letters, idx in groups.items():
                reqs = [self._request(items[i][0], items[i][1] + self.cfg.answer_prefix, "answer_mcq", **items[i][2])
                        for i in idx]
                for i, lp in zip(idx, self.backend.next_token_logprobs(reqs, [f" {x}" for x in letters])):
                    q = items[i][0]
                    letter = max(letters, key=lambda x: lp.get(f" {x}", float("-inf")))
                    text = f"{self.cfg.answer_prefix} {letter}: {q.options[letter]}."
                    out[i] = _Said(letter, text, math.exp(lp.get(f" {letter}", float("-inf"))), text)
            return out
        reqs = [self._request(q, prefix, "answer_mcq", **meta) for q, prefix, meta in items]
        gens = self.backend.generate(reqs, self.params)
        raws, counts, cut = [], [], []
        for (q, _, _), g in zip(items, gens):
            if g and g[0].error is not None:
                self._errors.setdefault(q.id, g[0].error)
            raws.append(g[0].text if g and g[0].error is None else "")
            counts.append(g[0].tokens if g else 0)
            cut.append(bool(g) and g[0].finish_reason == "length")
        seqs = [0.0] * len(items)
        scored = [i for i, t in enumerate(raws) if t.strip()] if self.cfg.use_seqscore else []
        for i, total in zip(scored, self.backend.score([reqs[i] for i in scored], [raws[i] for i in scored])
                            if scored else []):
            seqs[i] = math.exp(total / max(counts[i], 1))
        texts = [" ".join(_REFLECTIVE.sub(" ", r).split()) for r in raws]
        return [_Said(read_option(t, q.options), t, s, r, c)
                for (q, _, _), t, s, r, c in zip(items, texts, seqs, raws, cut)]

    def _judge(self, questions: Sequence[MultipleChoiceQuestion], steps: Sequence[tuple[_Path, Passage]],
               last: bool = True) -> list[tuple[_Path, bool]]:
        """Write one more segment on each (path, passage) step: REL after the evidence, the answer, SUP and USE
        each take one batched call. Returns each step's extended path and whether M asks to retrieve again (only
        read when the segment is not the ``last`` the tree allows)."""
        c = self.cfg
        heads = [path.reply + RETRIEVE + PARAGRAPH_OPEN + prompts.evidence_text(p) + PARAGRAPH_CLOSE
                 for path, p in steps]
        metas = [{"passage_id": prompts.passage_ref(p)} for _, p in steps]
        qs = [questions[path.qi] for path, _ in steps]
        rel = self.backend.next_token_logprobs(
            [self._request(q, h, "relevance", **m) for q, h, m in zip(qs, heads, metas)], list(RELEVANCE_LABELS))
        rel_tok = [_best(lp, RELEVANCE_LABELS) for lp in rel]
        said = self._answers([(q, h + t, m) for q, h, t, m in zip(qs, heads, rel_tok, metas)])
        after = [h + t + a.raw for h, t, a in zip(heads, rel_tok, said)]
        n = len(steps)
        # SUP: in generate mode where M wrote its first support token (none written: 0, as the reference); in
        # logprob mode after the answer, only after evidence found relevant (the training layout writes no SUP
        # after [Irrelevant])
        sup_at: list[str | None] = [None] * n
        for i, (h, t, a) in enumerate(zip(heads, rel_tok, said)):
            if c.answer_mode == "generate":
                pos = _first(a.raw, SUPPORT_LABELS)
                sup_at[i] = None if pos is None else h + t + a.raw[:pos]
            elif t == RELEVANT:
                sup_at[i] = after[i]
        sup = self._read(qs, sup_at, "support", said, metas, SUPPORT_LABELS)
        # USE: where M wrote its first utility token, else where its reply ended; a reply that stopped to ask for
        # [Retrieval] again writes none (s_use = 0) and, below the depth limit, is continued
        use_at: list[str | None] = []
        for i, (h, t, a) in enumerate(zip(heads, rel_tok, said)):
            if c.answer_mode == "generate":
                pos = _first(a.raw, UTILITY_LABELS)
                use_at.append(after[i] if pos is None else h + t + a.raw[:pos])
            else:
                use_at.append(after[i] + (_best(sup[i], SUPPORT_LABELS) if sup[i] is not None else ""))
        open_end = [c.answer_mode == "generate" and not last and _first(a.raw, UTILITY_LABELS) is None and not a.cut
                    for a in said]
        labels = list(UTILITY_LABELS)
        use = self._read(qs, use_at, "utility", said, metas, labels, extra=[RETRIEVE] if any(open_end) else [])
        out: list[tuple[_Path, bool]] = []
        for i, ((path, p), r, rt, a, s, u) in enumerate(zip(steps, rel, rel_tok, said, sup, use)):
            asks = open_end[i] and u is not None and _best(u, (RETRIEVE, *UTILITY_LABELS)) == RETRIEVE
            s_sup = support_score(_probs(s)) if s is not None else 0.0
            s_rel = relevance_score(_probs(r))
            s_use = utility_score(_probs(u)) if u is not None and not asks else 0.0
            score = (a.seq if c.use_seqscore else 0.0) + c.w_rel * s_rel + c.w_sup * s_sup + c.w_use * s_use
            before = path.candidate
            text = f"{before.text} {a.text}".strip() if before else a.text
            letter = read_option(text, path.options) if c.answer_mode == "generate" else a.letter
            cand = Candidate(before.passage_id if before else p.id, rt, s_rel, s_sup, s_use, a.seq,
                             (before.score if before else 1.0) * score, letter, text, before.depth + 1 if before else 1)
            out.append((_Path(path.qi, path.options, after[i], cand), asks))
        return out

    def _read(self, qs: Sequence[MultipleChoiceQuestion], at: Sequence[str | None], task: str,
              said: Sequence[_Said], metas: Sequence[dict[str, Any]], labels: Sequence[str],
              extra: Sequence[str] = ()) -> list[dict[str, float] | None]:
        """M's distribution over ``labels`` (and ``extra``) after each prefix; None where there is no prefix."""
        idx = [i for i, prefix in enumerate(at) if prefix is not None]
        got = self.backend.next_token_logprobs(
            [self._request(qs[i], at[i], task, answer=said[i].text, **metas[i]) for i in idx],
            [*labels, *extra]) if idx else []
        out: list[dict[str, float] | None] = [None] * len(at)
        for i, lp in zip(idx, got):
            out[i] = lp
        return out

    def _search(self, questions: Sequence[MultipleChoiceQuestion], passages: Sequence[Sequence[Passage]]
                ) -> list[list[Candidate]]:
        """Every finished path's candidate for each question: one segment per passage, and in ``generate`` mode
        with ``max_depth`` > 1 the paths that ask for more evidence continued, the ``beam_width`` best of each
        question's at each depth, with each of its passages (the same ones: the reference's static decoder)."""
        c = self.cfg
        limit = c.max_depth if c.answer_mode == "generate" else 1
        ends: list[list[Candidate]] = [[] for _ in questions]
        frontier = [(_Path(qi, questions[qi].options), p) for qi, ps in enumerate(passages) for p in ps]
        for depth in range(1, limit + 1):
            open_paths: dict[int, list[_Path]] = {}
            for path, asks in self._judge(questions, frontier, last=depth == limit):
                if asks:
                    open_paths.setdefault(path.qi, []).append(path)
                else:
                    ends[path.qi].append(path.candidate)  # type: ignore[arg-type]
            frontier = [(path, p) for qi, paths in open_paths.items()
                        for path in sorted(paths, key=lambda x: x.candidate.score, reverse=True)[:c.beam_width]
                        for p in passages[qi]]
            if not frontier:
                break
        return ends

    # ------------------------------------------------------------------------------------------- answer
    def answer(self, questions: Sequence[MultipleChoiceQuestion]) -> list[SelfBioRAGOutput]:
        """One output per question, in order."""
        c = self.cfg
        self._errors = {}  # question id -> the first failed generation call's error
        self._shown = pick_demonstrations(questions, self.pool, c.shots)
        p_ret: list[float | None] = [None] * len(questions)
        if c.retrieval == "adaptive":
            p_ret = list(self.retrieval_probabilities(questions))
            retrieve = [p > c.delta for p in p_ret]  # type: ignore[operator]
        else:
            retrieve = [c.retrieval == "always"] * len(questions)
        with_ev = [i for i, r in enumerate(retrieve) if r]
        without = [i for i, r in enumerate(retrieve) if not r]
        outs: list[SelfBioRAGOutput | None] = [None] * len(questions)
        for i, a in zip(without, self._answers([(questions[i], NO_RETRIEVE, {}) for i in without])):
            outs[i] = self._output(questions[i], a.letter, a.text, False, p_ret[i], [], [])
        for start in range(0, len(with_ev), QUESTIONS_PER_PASS):
            part = with_ev[start:start + QUESTIONS_PER_PASS]
            passages = self.kb.search_sources([questions[i].question for i in part], c.top_k, sources=c.sources,
                                              per_source_k=c.per_source_k, method=c.method)
            for i, ps, cands in zip(part, passages, self._search([questions[i] for i in part], passages)):
                if not cands:  # nothing retrieved: answer as without evidence, and say so
                    (a,) = self._answers([(questions[i], NO_RETRIEVE, {})])
                    out = self._output(questions[i], a.letter, a.text, True, p_ret[i], [], [])
                    out.problem = out.problem or "retrieval returned no passage"
                    outs[i] = out
                    continue
                best = max(cands, key=lambda cand: cand.score)  # ties: the retriever's order
                outs[i] = self._output(questions[i], best.letter, best.text, True, p_ret[i], cands, [p.id for p in ps])
        for o in outs:
            if o is not None and o.question_id in self._errors:
                o.error = self._errors[o.question_id]
                o.problem = f"generation failed: {o.error}"
        return [o for o in outs if o is not None]

    @staticmethod
    def _output(q: MultipleChoiceQuestion, letter: str | None, text: str, retrieved: bool, p: float | None,
                cands: list[Candidate], passage_ids: list[str]) -> SelfBioRAGOutput:
        problem = None if letter is not None else f"no option could be read from the answer {text[:80]!r}"
        if letter is not None and len(q.answer) > 1:
            problem = f"one option was chosen; the question has {len(q.answer)} correct options"
        correct = letter is not None and problem is None and letter in q.answer
        return SelfBioRAGOutput(q.id, letter, correct, retrieved, p, text, problem, cands, passage_ids)
