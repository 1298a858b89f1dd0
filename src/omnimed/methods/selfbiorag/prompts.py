"""Self-BioRAG's prompts, in our own words, following the formats of self-biorag.txt Appendix 7 (Tables 11-14).

Two audiences:

- the **teacher** (GPT-4 in the paper; any backend here, the world's oracle in miniature) rates one token type of
  an (instruction, output, evidence) triple and ends with ``Rating: [TOKEN]``; its prompts explain the scale and,
  as the paper's do, show worked examples first (:data:`TEACHER_EXAMPLES`: 3 for USE, 2 for RET, 1 each for REL
  and SUP; ``few_shot=False`` asks zero-shot);
- the **critic** LM learns to answer the *same* question with the token alone. Its prompt is short (a small model
  reads it thousands of times) and names the choices, so one trained critic serves all four types.

The generator sees an instruction exactly as training formatted it: the instruction, then its input, separated by a
blank line (:func:`omnimed.models.layout.user_text`), as a chat user turn.

Bump :data:`PROMPT_VERSION` when wording changes: prompts are part of every cached call's key and of each build's
manifest.
"""

from __future__ import annotations

from omnimed.data.records import Passage
from omnimed.generation.types import Messages
from omnimed.methods.selfbiorag.tokens import CRITIC_CHOICES

PROMPT_VERSION = "selfbiorag-prompts-v2"

TEACHER_SYSTEM = ("You grade training data for a biomedical assistant. Give a short reason, then the rating on the "
                  "last line as `Rating: [TOKEN]`, using exactly one of the tokens offered.")

TEACHER_TASKS: dict[str, str] = {
    "retrieval": (
        "Decide whether the task below can be done well from general knowledge alone, or whether it needs facts "
        "that would have to be looked up in documents (a specific disease, drug, gene, trial or guideline). Answer "
        "[Retrieval] when looking facts up is needed and [No Retrieval] when it is not."
    ),
    "retrieval_three_way": (
        "You see a task, the evidence quoted so far, the sentences of the response written so far (if any) and the "
        "next output sentence. Decide what that sentence needs. [Continue to Use Evidence]: everything it states "
        "can be checked against the evidence shown. [No Retrieval]: it states nothing that needs checking (common "
        "knowledge, a restatement of the task, an opinion). [Retrieval]: it states facts the evidence shown does "
        "not cover, so more documents would have to be looked up."
    ),
    "relevance": (
        "Decide whether the evidence passage is about the subject of the task and gives information that helps "
        "complete it. Answer [Relevant] or [Irrelevant]."
    ),
    "support": (
        "Judge only from the evidence, not from what you know, how much of the response the evidence backs up. "
        "[Fully supported]: every claim of the response is stated in the evidence. [Partially supported]: the "
        "evidence backs some of it but a main claim is missing from it. [No support / Contradictory]: the evidence "
        "does not back the response, is about something else, or says the opposite."
    ),
    "utility": (
        "Rate how useful the response is as an answer to the task, whatever its sources. [Utility:5]: complete, "
        "correct and clearly stated. [Utility:4]: correct but terse or missing a small detail. [Utility:3]: "
        "acceptable but needs a major addition. [Utility:2]: on the topic but wrong or incomplete. [Utility:1]: "
        "off topic or empty."
    ),
}

CRITIC_QUESTIONS: dict[str, str] = {
    "retrieval": "Does this task need facts looked up in documents?",
    "retrieval_three_way": "Does the next sentence need new documents, or does the evidence cover it?",
    "relevance": "Is the evidence relevant to the task?",
    "support": "How well does the evidence support the response?",
    "utility": "How useful is the response?",
}

#: which parts of the triple each type reads (Table 3: RET x or x+y, REL x+e, SUP x+e+y, USE x+y); the three-way
#: RET and SUP also read the sentences written before the judged one, when there are any
NEEDS: dict[str, tuple[str, ...]] = {
    "retrieval": (),
    "retrieval_three_way": ("evidence", "output"),
    "relevance": ("evidence",),
    "support": ("evidence", "output"),
    "utility": ("output",),
}


def evidence_text(passage: Passage) -> str:
    """A passage as the generator and critic read it: its title line (when it has one), then its text."""
    return f"{passage.title}\n{passage.text}" if passage.title else passage.text


def passage_ref(passage: Passage) -> str:
    """The id a teacher knows a passage by: the source passage of a chunk that is its only chunk, else the id."""
    meta = passage.metadata
    return str(meta.get("chunk_of") or passage.id) if meta.get("n_chunks", 1) == 1 else passage.id


def _triple(kind: str, task: str, output: str | None, evidence: str | None, preceding: str | None = None) -> str:
    parts = [f"Task: {task}"]
    if preceding and kind in ("retrieval_three_way", "support"):
        parts.append(f"Preceding sentences: {preceding}")
    if "evidence" in NEEDS[kind]:
        if evidence is None:
            raise ValueError(f"a {kind} judgement needs evidence")
        parts.append(f"Evidence: {evidence}")
    if "output" in NEEDS[kind]:
        if output is None:
            raise ValueError(f"a {kind} judgement needs the response")
        parts.append(f"Response: {output}")
    return "\n\n".join(parts)


#: worked examples shown to the teacher before the triple it rates, as many per type as the paper's prompts show
#: (Tables 11-14); written by us about invented cases: (task, output, evidence, preceding, reason, rating)
TEACHER_EXAMPLES: dict[str, tuple[tuple[str | None, ...], ...]] = {
    "utility": (
        ("Name the enzyme that converts angiotensin I to angiotensin II.",
         ("Angiotensin-converting enzyme (ACE), mainly on pulmonary endothelium, converts angiotensin I to the "
         "vasoconstrictor angiotensin II."), None, None,
         "Correct, complete and adds the useful detail of where the enzyme acts.", "[Utility:5]"),
        ("List two common side effects of metformin.", "Diarrhoea.", None, None,
         "Correct but gives one of the two effects asked for.", "[Utility:3]"),
        ("What is the normal range of serum sodium in adults?", "Sodium is an electrolyte found in table salt.",
         None, None, "On the topic but does not give the range that was asked for.", "[Utility:2]"),
    ),
    "retrieval": (
        ("Rewrite this note in plain English: 'Pt c/o SOB on exertion x2 wks.'", None, None, None,
         "Everything needed is in the note; no document lookup helps.", "[No Retrieval]"),
        ("Which gene is most often mutated in familial adenomatous polyposis?", None, None, None,
         "A specific genetic fact that should be checked in the literature.", "[Retrieval]"),
    ),
    "retrieval_three_way": (
        ("What causes the yellow colour of jaundiced skin?",
         "Bilirubin accumulates in the skin when its clearance by the liver fails.",
         ("Jaundice. Yellow discolouration of skin and sclera results from raised serum bilirubin, which deposits in "
         "tissues when hepatic uptake, conjugation or excretion is impaired."), None,
         "The sentence restates what the evidence says about bilirubin.", "[Continue to Use Evidence]"),
        ("What causes the yellow colour of jaundiced skin?",
         "Phototherapy with blue light is used to treat it in newborns.",
         "Jaundice. Yellow discolouration of skin and sclera results from raised serum bilirubin.",
         "Bilirubin accumulates in the skin when its clearance by the liver fails.",
         "The treatment claim is not in the evidence and would need another source.", "[Retrieval]"),
    ),
    "relevance": (
        ("Which antibiotic class is first choice for uncomplicated cystitis in women?", None,
         ("Urinary tract infection guidelines. For acute uncomplicated cystitis in non-pregnant women, a short "
         "course of nitrofurantoin or fosfomycin is recommended first."), None,
         "The passage is about the condition asked about and names the recommended drugs.", "[Relevant]"),
    ),
    "support": (
        ("Which vitamin deficiency causes scurvy?", "Scurvy is caused by a lack of vitamin C.",
         ("Scurvy. A disease resulting from prolonged deficiency of ascorbic acid (vitamin C), with bleeding gums "
         "and poor wound healing."), None,
         "The evidence states exactly the claim of the response.", "[Fully supported]"),
    ),
}


def _example_text(kind: str, example: tuple[str | None, ...]) -> str:
    task, output, evidence, preceding, reason, rating = example
    return f"{_triple(kind, task or '', output, evidence, preceding)}\n\nReason: {reason}\nRating: {rating}"


def teacher_messages(kind: str, task: str, output: str | None = None, evidence: str | None = None,
                     preceding: str | None = None, few_shot: bool = True) -> Messages:
    """The teacher's request for one judgement of one triple; ``few_shot``: show the worked examples first."""
    shots = [f"Example:\n{_example_text(kind, ex)}" for ex in TEACHER_EXAMPLES[kind]] if few_shot else []
    body = "\n\n".join([TEACHER_TASKS[kind], *shots,
                         f"Now rate this one.\n{_triple(kind, task, output, evidence, preceding)}\n\nRating:"])
    return [{"role": "system", "content": TEACHER_SYSTEM}, {"role": "user", "content": body}]


def critic_instruction(kind: str, task: str, output: str | None = None, evidence: str | None = None,
                       preceding: str | None = None) -> str:
    """The critic's instruction for one judgement of one triple; it answers with one of the judgement's tokens."""
    choices = " ".join(CRITIC_CHOICES[kind])
    return f"{CRITIC_QUESTIONS[kind]} Answer with one of: {choices}\n\n{_triple(kind, task, output, evidence, preceding)}"
