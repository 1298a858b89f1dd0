"""Instruction examples (instruction / input / output) for Self-BioRAG-style training on the world.

Two families:

- **retrieval** examples ask about the world (treatment, diagnosis, mechanism, genes, trials, examination); their
  answer lives only in the world's text, so they carry one evidence passage and the oracle's reflective labels.
  Most carry a gold passage; some carry a passage about the same disease that does not state the answer
  (relevant, partially supported) or a passage about something else (irrelevant, no support), so a critic sees
  every label value.
- **no-retrieval** examples are answerable from general language or from their own input: definitions of general
  words, arithmetic on numbers given in the input, extraction of items listed in the input, rewriting a clipped
  note in full sentences and summarising a report given in the input.

Outputs are one short sentence in a fixed pattern per task ("The current first-line treatment for X is Y."), so a
135M model fine-tuned for a few minutes visibly learns them; the instruction wordings vary.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from omnimed.data.records import InstructionExample, Passage, ReflectiveLabels
from omnimed.data.world.model import WorldModel
from omnimed.data.world.oracle import Oracle
from omnimed.data.world.questions import DATASET, LETTERS, FactIndex, Item, computation_question, item_metadata

# wording templates per relation: (instruction, input) pairs; the output pattern is fixed per relation
PROMPTS: dict[str, tuple[tuple[str, str], ...]] = {
    "diagnosis": (
        (
            "What is the most likely diagnosis?",
            "A {age}-year-old patient presents with {symptoms}. On examination, {finding} is noted.",
        ),
        (
            "Name the disorder that best explains these findings.",
            "Symptoms: {symptoms}. Examination: {finding}.",
        ),
        (
            "Which disease fits this presentation?",
            "The patient reports {symptoms}; {finding} is found on examination.",
        ),
    ),
    "has_finding": (
        ("Which physical examination finding is characteristic of {disease}?", ""),
        ("What does examination typically show in {disease}?", ""),
        ("Name the examination finding that points to {disease}.", ""),
    ),
    "first_line_treatment": (
        ("What is the first-line treatment for {disease}?", ""),
        ("Which drug do current guidelines recommend first for {disease}?", ""),
        ("Name the currently recommended first-line drug for {disease}.", ""),
        (
            "A patient has just been diagnosed with {disease}. Which drug should be started first under current guidance?",
            "",
        ),
    ),
    "pathophysiology": (
        ("Which pathway is disturbed in {disease}?", ""),
        ("What is the pathophysiology of {disease}?", ""),
        ("Explain in one sentence what goes wrong in {disease}.", ""),
    ),
    "trial_result": (
        (
            "Which drug reduced {outcome} by {effect}% in a randomized trial of {n} patients with {disease}?",
            "",
        ),
        (
            "A trial enrolled {n} patients with {disease}. Which drug lowered {outcome} by {effect}% versus placebo?",
            "",
        ),
    ),
    "causal_gene": (
        ("Which gene is associated with {disease}?", ""),
        ("Name the gene whose variants are linked to {disease}.", ""),
        ("What is the causal gene of {disease}?", ""),
    ),
    "mechanism_of_action": (
        ("What is the mechanism of action of {drug}?", ""),
        ("How does {drug} work?", ""),
        ("Describe the mechanism of {drug} in one sentence.", ""),
    ),
}
OUTPUTS: dict[str, str] = {
    "diagnosis": "The most likely diagnosis is {disease}.",
    "has_finding": "The characteristic examination finding in {disease} is {finding}.",
    "first_line_treatment": "The current first-line treatment for {disease} is {drug}.",
    "pathophysiology": "{disease} results from {dysregulation} of the {pathway}.",
    "trial_result": "{drug} reduced {outcome} by {effect}% in that trial.",
    "causal_gene": "Variants in {gene} are associated with {disease}.",
    "mechanism_of_action": "The mechanism of action of {drug} is {mechanism}.",
}
MCQ_INSTRUCTIONS: tuple[str, ...] = (
    "Answer the multiple-choice question.",
    "Choose the correct option and state it.",
    "Pick the best answer to the question below.",
)

#: general words a model can define without retrieval (written for this world; plain, non-clinical wording)
GLOSSARY: tuple[tuple[str, str], ...] = (
    ("symptom", "A symptom is something a patient feels and reports, such as pain or tiredness."),
    ("sign", "A sign is something an examiner can observe or measure in a patient."),
    ("diagnosis", "A diagnosis is the identification of the disease that explains a patient's problems."),
    ("placebo", "A placebo is an inactive substance given in place of a real drug for comparison."),
    (
        "randomized trial",
        "A randomized trial assigns participants to groups by chance to compare treatments fairly.",
    ),
    ("guideline", "A guideline is a set of recommendations issued by an expert body to guide care."),
    ("dose", "A dose is the amount of a drug given at one time."),
    ("half-life", "A half-life is the time it takes for the amount of a drug in the body to fall by half."),
    (
        "prevalence",
        "Prevalence is the proportion of people in a population who have a condition at a given time.",
    ),
    (
        "incidence",
        "Incidence is the number of new cases of a condition in a population over a period of time.",
    ),
    ("gene", "A gene is a stretch of DNA that carries the instructions for making a molecule."),
    ("pathway", "A pathway is a chain of molecular steps that together carry out a function in the body."),
    ("receptor", "A receptor is a protein that binds a signal molecule and passes the message into a cell."),
    ("enzyme", "An enzyme is a protein that speeds up a chemical reaction."),
    ("inhibitor", "An inhibitor is a substance that slows or blocks a biological process."),
    ("chronic", "Chronic describes a condition that lasts a long time or keeps coming back."),
    ("acute", "Acute describes a condition that begins suddenly and lasts a short time."),
    ("prognosis", "A prognosis is the expected course and outcome of a disease."),
    ("odds ratio", "An odds ratio compares the odds of an outcome in one group with the odds in another."),
    ("first-line treatment", "A first-line treatment is the treatment tried first for a condition."),
    ("contraindication", "A contraindication is a reason not to use a particular treatment."),
    ("biomarker", "A biomarker is a measurable feature that indicates a biological state or disease."),
    ("cohort", "A cohort is a group of people followed over time in a study."),
    (
        "meta-analysis",
        "A meta-analysis combines the results of several studies to reach an overall estimate.",
    ),
    ("side effect", "A side effect is an unwanted effect of a treatment."),
    ("mechanism of action", "A mechanism of action is the specific way a drug produces its effect."),
    ("supersede", "To supersede is to replace something older, such as an earlier recommendation."),
    (
        "outcome measure",
        "An outcome measure is the quantity a study uses to judge whether a treatment works.",
    ),
)
DEFINE_PROMPTS: tuple[str, ...] = (
    "Define the term '{w}'.",
    "What does '{w}' mean?",
    "Give a one-sentence definition of {w}.",
)
EXTRACT_PROMPTS: tuple[str, ...] = (
    "List the symptoms mentioned in the note.",
    "Which symptoms does the patient report?",
)


def _retrieval_example(
    it: Item,
    ex_id: str,
    m: WorldModel,
    index: FactIndex,
    passages: list[Passage],
    by_id: dict[str, Passage],
    about_index: dict[str, list[str]],
    oracle: Oracle,
    rng: random.Random,
    split: str,
) -> InstructionExample:
    """One example about ``it`` with one evidence passage (gold, same-subject non-answer, or unrelated)."""
    slots = {**it.slots, "mechanism": it.slots.get("mechanism", ""), "pathway": it.slots.get("pathway", "")}
    output = OUTPUTS[it.relation].format(**slots)
    if rng.random() < 0.2:
        k = rng.choice((4, 5))
        order = [it.answer, *it.distractors[: k - 1]]
        rng.shuffle(order)
        instruction = rng.choice(MCQ_INSTRUCTIONS)
        opts = "\n".join(f"{LETTERS[j]}. {m.entities[e].name}" for j, e in enumerate(order))
        inp = f"{it.stem}\n{opts}"
        letter = LETTERS[order.index(it.answer)]
        output = f"The answer is {letter}: {it.answer_text}."
        task = "mcq"
    else:
        instruction, inp = rng.choice(PROMPTS[it.relation])
        instruction, inp = instruction.format(**slots), inp.format(**slots)
        task = "qa"
    meta = item_metadata(it, m)
    meta.update(needs_retrieval=True, task=task, split=split)
    draft = InstructionExample(
        id=ex_id, instruction=instruction, input=inp, output=output, dataset=DATASET, metadata=meta
    )
    gold = index.stating_all(it.facts)
    roll = rng.random()
    evidence: Passage | None = None
    kind = "gold"
    if roll < 0.15:  # a passage about the same subject that does not state the answer
        about = [
            pid for pid in about_index.get(it.subject, ()) if not any(f in index.facts[pid] for f in it.facts)
        ]
        if about:
            evidence, kind = by_id[about[rng.randrange(len(about))]], "partial"
    elif roll < 0.27:  # a passage about something else
        for _ in range(50):
            cand = passages[rng.randrange(len(passages))]
            if not oracle.is_relevant(draft, cand):
                evidence, kind = cand, "irrelevant"
                break
    if evidence is None:
        evidence, kind = by_id[gold[rng.randrange(len(gold))]], "gold"
    draft.metadata["evidence_kind"] = kind
    labels = oracle.reflective_labels(draft, output, evidence)
    return InstructionExample(
        id=ex_id,
        instruction=instruction,
        input=inp,
        output=output,
        evidence=[evidence],
        labels=labels,
        dataset=DATASET,
        metadata=draft.metadata,
    )


#: no-knowledge kinds of the easy world (``tiny``), arithmetic twice as likely; harder worlds add rewriting and
#: summarising text given in the input, and multiple-choice questions answered from their own text (a computation
#: on numbers the question states, a general definition), as real instruction sets hold: without them every
#: multiple-choice instruction needs retrieval, and a generator learns to retrieve for any multiple-choice question
GENERAL_KINDS: tuple[str, ...] = ("definition", "arithmetic", "arithmetic", "extraction")
GENERAL_KINDS_HARD: tuple[str, ...] = (*GENERAL_KINDS, "rewrite", "summary", "mcq_computation", "mcq_computation",
                                       "mcq_definition", "mcq_definition")


def _general_example(ex_id: str, m: WorldModel, rng: random.Random, split: str,
                     kinds: tuple[str, ...] = GENERAL_KINDS_HARD) -> InstructionExample:
    """One no-retrieval example: a definition, an arithmetic task on its input, or an extraction from its input."""
    kind = rng.choice(kinds)
    task = kind
    if kind.startswith("mcq_"):
        instruction, inp, output = _general_mcq(kind, m, rng)
        task = "mcq"
    elif kind in ("rewrite", "summary"):
        instruction, inp, output = (_rewrite if kind == "rewrite" else _summary)(m, rng)
    elif kind == "definition":
        word, sentence = GLOSSARY[rng.randrange(len(GLOSSARY))]
        instruction, inp, output = rng.choice(DEFINE_PROMPTS).format(w=word), "", sentence
    elif kind == "extraction":
        syms = [s.entity.name for s in rng.sample(m.symptoms, rng.choice((2, 3)))]
        listed = syms[0] if len(syms) == 1 else ", ".join(syms[:-1]) + " and " + syms[-1]
        instruction = rng.choice(EXTRACT_PROMPTS)
        inp = f"Note: the patient reports {listed} over the last {rng.randint(2, 9)} days."
        output = f"The symptoms mentioned are {listed}."
    else:
        instruction, inp, output = _arithmetic(m, rng)
    return InstructionExample(
        id=ex_id,
        instruction=instruction,
        input=inp,
        output=output,
        dataset=DATASET,
        labels=ReflectiveLabels(retrieval="[No Retrieval]", utility="[Utility:5]"),
        metadata={"fictional": True, "kind": kind, "needs_retrieval": False, "task": task, "split": split},
    )


def _general_mcq(kind: str, m: WorldModel, rng: random.Random) -> tuple[str, str, str]:
    """A multiple-choice instruction answered from its own text: ``mcq_computation`` one of the self-contained
    test questions' computations (:func:`computation_question`), ``mcq_definition`` which sentence defines a
    general word (the other options define other words)."""
    if kind == "mcq_computation":
        stem, options, answer = computation_question(m.drugs[rng.randrange(len(m.drugs))], rng.randrange(3), rng)
    else:
        picked = rng.sample(range(len(GLOSSARY)), 4)
        word, answer = GLOSSARY[picked[0]]
        options = [GLOSSARY[i][1] for i in picked]
        rng.shuffle(options)
        stem = f"Which statement defines '{word}'?"
    letter = LETTERS[options.index(answer)]
    opts = "\n".join(f"{LETTERS[j]}. {o}" for j, o in enumerate(options))
    return rng.choice(MCQ_INSTRUCTIONS), f"{stem}\n{opts}", f"The answer is {letter}: {answer.rstrip('.')}."


def _rewrite(m: WorldModel, rng: random.Random) -> tuple[str, str, str]:
    """A clipped clinical note to write out in full sentences: everything the output says is in the input."""
    s1, s2 = (s.entity.name for s in rng.sample(m.symptoms, 2))
    days = rng.randint(2, 14)
    return (
        rng.choice(("Rewrite this note in plain full sentences.", "Expand the abbreviated note into plain English.")),
        f"Pt c/o {s1} x {days}/7. Denies {s2}.",
        f"The patient has had {s1} for {days} days and does not have {s2}.",
    )


def _summary(m: WorldModel, rng: random.Random) -> tuple[str, str, str]:
    """A trial report to summarise in one sentence: the numbers come from the input, not from the world."""
    drug = m.drugs[rng.randrange(len(m.drugs))].entity.name
    n, effect, weeks = rng.randint(12, 90) * 10, rng.randint(10, 50), rng.choice((12, 24, 52))
    return (
        rng.choice(("Summarise the report in one sentence.", "Give a one-sentence summary of this abstract.")),
        (f"We randomly assigned {n} patients to {drug} or placebo for {weeks} weeks. Compared with placebo, "
         f"{drug} lowered the symptom score by {effect}%. Side effects were mild and similar in both groups."),
        f"In {n} patients over {weeks} weeks, {drug} lowered the symptom score by {effect}% compared with placebo.",
    )


def _arithmetic(m: WorldModel, rng: random.Random) -> tuple[str, str, str]:
    drug = m.drugs[rng.randrange(len(m.drugs))].entity.name
    form = rng.randrange(4)
    if form == 0:
        k, mg = rng.randint(2, 4), rng.choice((5, 10, 20, 25, 50))
        return (
            "Calculate the total daily dose.",
            f"{drug} is given as {k} doses of {mg} mg per day.",
            f"The total daily dose is {k * mg} mg.",
        )
    if form == 1:
        grams = rng.choice((0.5, 1.5, 2, 2.5, 3))
        return (
            "Convert the amount to milligrams.",
            f"{grams} g of {drug}.",
            f"{grams} g equals {int(grams * 1000)} mg.",
        )
    if form == 2:
        a, b = rng.randint(40, 400), rng.randint(40, 400)
        return (
            "How many patients did the trial enroll in total?",
            f"The {drug} arm had {a} patients and the placebo arm had {b} patients.",
            f"The trial enrolled {a + b} patients in total.",
        )
    hi = rng.randint(30, 70)
    lo = rng.randint(5, hi - 5)
    return (
        "By how many percentage points did the rate fall?",
        f"With {drug}, the relapse rate fell from {hi}% to {lo}%.",
        f"The rate fell by {hi - lo} percentage points.",
    )


def make_instructions(
    m: WorldModel,
    items: list[Item],
    index: FactIndex,
    passages: list[Passage],
    oracle: Oracle,
    rng: random.Random,
    n: int,
    split_of: Callable[[str], str],
    general_split: Callable[[random.Random], str],
    no_knowledge: float = 0.3,
    general_kinds: tuple[str, ...] = GENERAL_KINDS_HARD,
) -> list[InstructionExample]:
    """``n`` instruction examples, ``no_knowledge`` of them answerable without the world's knowledge, the rest
    needing retrieval (items cycled in shuffled order)."""
    by_id = {p.id: p for p in passages}
    about_index: dict[str, list[str]] = {}
    for p in passages:
        for a in p.metadata.get("about", ()):
            about_index.setdefault(a, []).append(p.id)
    order = list(range(len(items)))
    rng.shuffle(order)
    out: list[InstructionExample] = []
    j = 0
    for i in range(1, n + 1):
        ex_id = f"world-inst-{i:06d}"
        if rng.random() < no_knowledge:
            out.append(_general_example(ex_id, m, rng, general_split(rng), general_kinds))
        else:
            it = items[order[j % len(order)]]
            j += 1
            out.append(
                _retrieval_example(
                    it, ex_id, m, index, passages, by_id, about_index, oracle, rng, split_of(it.group)
                )
            )
    return out
