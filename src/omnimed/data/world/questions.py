"""Questions about the world: question *items* (what is asked, which facts make the answer true, plausible wrong
answers), multiple-choice questions and long-form open questions built from them.

An item is the common source of MCQs and of retrieval-needing instruction examples, so both are labelled from the
same ground truth. Gold passages are not chosen by hand: they are every passage whose metadata states *all* the
facts the item requires, which is exactly the oracle's definition of full support.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from omnimed.data.records import SOURCE_KINDS, MultipleChoiceQuestion, OpenQuestion, Passage
from omnimed.data.world.difficulty import Difficulty
from omnimed.data.world.model import Disease, Drug, WorldModel

DATASET = "omnimed-world"
#: single-fact kinds, round-robin in every world; the last two come with the difficulty knobs
KINDS: tuple[str, ...] = ("diagnosis", "treatment", "mechanism", "research finding", "examination")
ALL_KINDS: tuple[str, ...] = (*KINDS, "multi-hop", "self-contained")
LETTERS = "ABCDE"


@dataclass(slots=True)
class Item:
    """One answerable question about the world, before it is worded as an MCQ or an instruction.

    ``relation`` names what is asked (``first_line_treatment``, ``causal_gene``, ...); ``facts`` are the fact ids
    that together make ``answer`` correct; ``distractors`` are wrong answers of the same type, most plausible first;
    ``slots`` hold the names used by wording templates.
    """

    key: str
    kind: str
    relation: str
    subject: str
    group: str
    answer: str
    answer_text: str
    facts: list[str]
    distractors: list[str]
    stem: str
    slots: dict[str, str] = field(default_factory=dict)


class FactIndex:
    """Which passages state which facts (built once from passage metadata)."""

    def __init__(self, passages: list[Passage]) -> None:
        self.by_fact: dict[str, list[str]] = {}
        self.source: dict[str, str] = {}
        self.facts: dict[str, frozenset[str]] = {}
        for p in passages:
            self.source[p.id] = p.source
            fs = p.metadata.get("facts", [])
            self.facts[p.id] = frozenset(fs)
            for f in fs:
                self.by_fact.setdefault(f, []).append(p.id)

    def stating_all(self, facts: list[str]) -> list[str]:
        """Passages (in world order) that state every one of ``facts``."""
        if not facts:
            return []
        first = self.by_fact.get(facts[0], [])
        return [pid for pid in first if all(f in self.facts[pid] for f in facts[1:])]

    def cover(self, facts: list[str]) -> list[str]:
        """A small set of passages that together state all ``facts`` (greedy: most new facts first)."""
        todo = list(facts)
        chosen: list[str] = []
        while todo:
            candidates: list[str] = []
            for f in todo:
                for pid in self.by_fact.get(f, []):
                    if pid not in candidates:
                        candidates.append(pid)
            if not candidates:
                break
            best = max(candidates, key=lambda pid: sum(f in self.facts[pid] for f in todo))
            chosen.append(best)
            todo = [f for f in todo if f not in self.facts[best]]
        return chosen

    def sources_of(self, pids: list[str]) -> list[str]:
        present = {self.source[p] for p in pids}
        return [s for s in SOURCE_KINDS if s in present]


# ---------------------------------------------------------------------------------------------------------- items
def wrong_answers(rng: random.Random, first: list[str], pool: list[str], exclude: str, k: int = 6) -> list[str]:
    """``k`` distinct wrong answers: the plausible ones (``first``) first, then random ones from ``pool`` (at most
    200 draws, so a small pool gives fewer)."""
    out: list[str] = []
    for x in first:
        if x != exclude and x not in out:
            out.append(x)
    tries = 0
    while len(out) < k and tries < 200:
        tries += 1
        x = pool[rng.randrange(len(pool))]
        if x != exclude and x not in out:
            out.append(x)
    return out[:k]


def build_items(m: WorldModel, rng: random.Random) -> list[Item]:
    """Every item of the world, disease by disease (six each), then one mechanism item per drug."""
    ents = m.entities
    symptom_index: dict[str, list[Disease]] = {}
    for d in m.diseases:
        for s in d.symptoms:
            symptom_index.setdefault(s.id, []).append(d)
    items: list[Item] = []
    all_drugs = [d.entity.id for d in m.drugs]
    all_genes = [d.gene.id for d in m.diseases]
    all_findings = [d.finding.id for d in m.diseases]
    all_pathways = [p.entity.id for p in m.pathways]
    all_diseases = [d.entity.id for d in m.diseases]
    disease_by_id = {d.entity.id: d for d in m.diseases}

    fill = partial(wrong_answers, rng)

    for d in m.diseases:
        did, name = d.entity.id, d.entity.name
        sym_names = [s.name for s in d.symptoms]
        # diseases sharing a symptom are plausible; one with all three symptoms and the finding would be ambiguous
        sharing: list[str] = []
        for s in d.symptoms:
            for other in symptom_index[s.id]:
                if other is not d and other.entity.id not in sharing:
                    same = {x.id for x in other.symptoms} >= {
                        x.id for x in d.symptoms
                    } and other.finding is d.finding
                    if not same:
                        sharing.append(other.entity.id)
        rng.shuffle(sharing)
        age = rng.randint(19, 78)
        items.append(
            Item(
                f"diagnosis:{did}",
                "diagnosis",
                "diagnosis",
                did,
                did,
                did,
                name,
                [*d.facts["symptoms"], d.facts["finding"]],
                fill(sharing, all_diseases, did),
                f"A {age}-year-old patient presents with {sym_names[0]}, {sym_names[1]} and {sym_names[2]}. On examination, "
                f"{d.finding.name} is noted. What is the most likely diagnosis?",
                {
                    "disease": name,
                    "symptoms": f"{sym_names[0]}, {sym_names[1]} and {sym_names[2]}",
                    "finding": d.finding.name,
                    "age": str(age),
                },
            )
        )
        near = [disease_by_id[x].finding.id for x in sharing[:4]]
        items.append(
            Item(
                f"examination:{did}",
                "examination",
                "has_finding",
                did,
                did,
                d.finding.id,
                d.finding.name,
                [d.facts["finding"]],
                fill(near, all_findings, d.finding.id),
                f"Which physical examination finding is characteristic of {name}?",
                {"disease": name, "finding": d.finding.name},
            )
        )
        cur = d.current
        old = [g.drug.id for g in d.chain[:-1]]
        negative = [t.drug.id for t in d.trials if not t.positive]
        items.append(
            Item(
                f"treatment:{did}",
                "treatment",
                "first_line_treatment",
                did,
                did,
                cur.drug.id,
                cur.drug.name,
                [d.facts["first_line"]],
                fill(list(reversed(old)) + negative, all_drugs, cur.drug.id),
                f"According to current guidelines, which drug is recommended as first-line treatment for {name}?",
                {"disease": name, "drug": cur.drug.name, "issuer": cur.issuer.name, "year": cur.date[:4]},
            )
        )
        items.append(
            Item(
                f"pathophysiology:{did}",
                "mechanism",
                "pathophysiology",
                did,
                did,
                d.pathway.id,
                d.pathway.name,
                [d.facts["pathophysiology"]],
                fill([], all_pathways, d.pathway.id),
                f"Dysregulation of which pathway underlies {name}?",
                {"disease": name, "pathway": d.pathway.name, "dysregulation": d.dysregulation},
            )
        )
        trial = d.trials[0]  # the positive trial of the current drug
        others = [t.drug.id for t in d.trials[1:]] + old
        items.append(
            Item(
                f"trial:{did}",
                "research finding",
                "trial_result",
                did,
                did,
                trial.drug.id,
                trial.drug.name,
                [trial.fact],
                fill(others, all_drugs, trial.drug.id),
                f"In a randomized trial of {trial.n} patients with {name}, which drug reduced {trial.outcome} by "
                f"{trial.effect}% compared with placebo?",
                {
                    "disease": name,
                    "drug": trial.drug.name,
                    "n": str(trial.n),
                    "outcome": trial.outcome,
                    "effect": str(trial.effect),
                },
            )
        )
        items.append(
            Item(
                f"gene:{did}",
                "research finding",
                "causal_gene",
                did,
                did,
                d.gene.id,
                d.gene.name,
                [d.facts["gene"]],
                fill([], all_genes, d.gene.id),
                f"A genome-wide association study of {name} identified variants in which gene?",
                {"disease": name, "gene": d.gene.name},
            )
        )
    by_class: dict[str, list[str]] = {}
    for dr in m.drugs:
        by_class.setdefault(dr.drug_class.id, []).append(dr.mechanism.id)
    all_mechs = [dr.mechanism.id for dr in m.drugs]
    for dr in m.drugs:
        items.append(
            Item(
                f"moa:{dr.entity.id}",
                "mechanism",
                "mechanism_of_action",
                dr.entity.id,
                dr.entity.id,
                dr.mechanism.id,
                dr.mechanism.name,
                [dr.facts["moa"]],
                fill(by_class[dr.drug_class.id], all_mechs, dr.mechanism.id),
                f"What is the mechanism of action of {dr.entity.name}?",
                {"drug": dr.entity.name, "mechanism": dr.mechanism.name},
            )
        )
    for it in items:  # every entity id named above exists
        assert it.answer in ents and all(x in ents for x in it.distractors)
    return items


def build_multihop_items(m: WorldModel, rng: random.Random) -> list[Item]:
    """Two-fact items whose facts lie in two sources, three per disease: the mechanism of the current first-line
    drug (guideline + book), the gene of the disease a finding points to (wiki + research), the target of the drug
    a trial tested (research + book)."""
    drug_by_id = {dr.entity.id: dr for dr in m.drugs}
    all_mechs = [dr.mechanism.id for dr in m.drugs]
    all_genes = [d.gene.id for d in m.diseases]
    all_targets = [dr.target.id for dr in m.drugs]

    fill = partial(wrong_answers, rng)

    twin_of = {a: b for a, b in m.twins} | {b: a for a, b in m.twins}
    genes = {d.entity.id: d.gene.id for d in m.diseases}
    items: list[Item] = []
    for d in m.diseases:
        did, name = d.entity.id, d.entity.name
        cur = drug_by_id[d.current.drug.id]
        old = [drug_by_id[g.drug.id].mechanism.id for g in d.chain[:-1]]
        items.append(Item(
            f"hop-moa:{did}", "multi-hop", "first_line_mechanism", did, did, cur.mechanism.id, cur.mechanism.name,
            [d.facts["first_line"], cur.facts["moa"]], fill(list(reversed(old)), all_mechs, cur.mechanism.id),
            f"What is the mechanism of action of the drug that current guidelines recommend as first-line "
            f"treatment for {name}?", {"disease": name, "mechanism": cur.mechanism.name}))
        near = [genes[twin_of[did]]] if did in twin_of else []
        items.append(Item(
            f"hop-gene:{did}", "multi-hop", "finding_gene", did, did, d.gene.id, d.gene.name,
            [d.facts["finding"], d.facts["gene"]], fill(near, all_genes, d.gene.id),
            f"{d.finding.name} is characteristic of one disease of the {d.system.name}. Variants in which gene are "
            f"associated with that disease?", {"finding": d.finding.name, "gene": d.gene.name}))
        trial = d.trials[0]
        target = drug_by_id[trial.drug.id].target
        others = [drug_by_id[t.drug.id].target.id for t in d.trials[1:]]
        items.append(Item(
            f"hop-target:{did}", "multi-hop", "trial_target", did, did, target.id, target.name,
            [trial.fact, drug_by_id[trial.drug.id].facts["target"]], fill(others, all_targets, target.id),
            f"In a randomized trial of {trial.n} patients with {name}, one drug reduced {trial.outcome} by "
            f"{trial.effect}% compared with placebo. Which molecular target does that drug act on?",
            {"disease": name, "target": target.name}))
    return items


# ---------------------------------------------------------------------------------------------------------- MCQs
def item_metadata(it: Item, m: WorldModel) -> dict:
    """What the oracle needs to judge answers to an item, stored with the record so saved records stay judgeable."""
    return {
        "fictional": True,
        "kind": it.kind,
        "relation": it.relation,
        "subject": it.subject,
        "facts": list(it.facts),
        "answer_entity": it.answer,
        "candidates": {e: m.entities[e].name for e in [it.answer, *it.distractors]},
        "item": it.key,
    }


def pick_balanced(items: list[Item], n: int, rng: random.Random) -> list[Item]:
    """``n`` items, round-robin over the five kinds so every kind is represented, each kind in shuffled order."""
    pools: dict[str, list[Item]] = {k: [] for k in KINDS}
    for it in items:
        pools[it.kind].append(it)
    for k in KINDS:
        rng.shuffle(pools[k])
    out: list[Item] = []
    while len(out) < n and any(pools[k] for k in KINDS):
        for k in KINDS:
            if pools[k] and len(out) < n:
                out.append(pools[k].pop())
    return out


def make_mcqs(
    items: list[Item],
    m: WorldModel,
    index: FactIndex,
    rng: random.Random,
    split_of: Callable[[str], str],
    *,
    aliases: float = 0.0,
    alias_rng: random.Random | None = None,
) -> list[MultipleChoiceQuestion]:
    """Word items as 4- or 5-option MCQs; gold passages are all passages fully stating the item's facts (the
    fewest passages that together state them, for multi-hop items).

    ``aliases``: the chance that a question names its subject by one of its aliases instead of the name the
    passages use (``metadata["subject_name"]`` says which name it uses, ``metadata["named_by"]`` whether an alias).
    """
    alias_rng = alias_rng or random.Random(0)
    # drugs whose recommendation for a disease was superseded: wrong options of its treatment question
    outdated = {d.entity.id: [g.drug.id for g in d.chain[:-1]] for d in m.diseases}
    finding_of = {f.entity.name: f for f in m.findings}
    disease_of = {d.entity.id: d for d in m.diseases}
    noun_of = {x.entity.id: x.noun for x in m.symptoms}
    out: list[MultipleChoiceQuestion] = []
    for i, it in enumerate(items, start=1):
        subject = m.entities[it.subject]
        stem, subject_name, named_by = it.stem, subject.name, "name"
        if aliases > 0 and subject.aliases and subject.name in stem and alias_rng.random() < aliases:
            subject_name = subject.aliases[alias_rng.randrange(len(subject.aliases))]
            stem, named_by = stem.replace(subject.name, subject_name), "alias"
        elif aliases > 0 and it.relation == "diagnosis" and alias_rng.random() < aliases:
            # the vignette says what the patient and the examiner notice, not the invented names the passages use
            finding = finding_of[it.slots["finding"]]
            d = disease_of[it.subject]
            nouns = [noun_of[x.id] for x in d.symptoms]
            stem = stem.replace(it.slots["symptoms"], f"{nouns[0]}, {nouns[1]} and {nouns[2]}").replace(
                f"{finding.entity.name} is noted", f"a finding {finding.quality} is noted")
            named_by = "description"
        k = rng.choice((4, 5))
        chosen = [it.answer, *it.distractors[: k - 1]]
        order = list(chosen)
        rng.shuffle(order)
        options = {LETTERS[j]: m.entities[e].name for j, e in enumerate(order)}
        letter = LETTERS[order.index(it.answer)]
        gold = index.cover(it.facts) if it.kind == "multi-hop" else index.stating_all(it.facts)
        meta = item_metadata(it, m)
        meta["option_entities"] = {LETTERS[j]: e for j, e in enumerate(order)}
        if it.relation == "first_line_treatment":
            meta["outdated_entities"] = [e for e in order if e in outdated[it.subject] and e != it.answer]
        if subject.type in ("disease", "drug") and subject.name in it.stem:
            meta["subject_name"] = subject_name
        if aliases > 0:
            meta["named_by"] = named_by
        out.append(
            MultipleChoiceQuestion(
                id=f"world-mcq-{i:06d}",
                question=stem,
                options=options,
                answer=[letter],
                dataset=DATASET,
                split=split_of(it.group),
                gold_passages=gold,
                gold_sources=index.sources_of(gold),
                metadata=meta,
            )
        )
    return out


def pick_mixed(single: list[Item], multihop: list[Item], n: int, difficulty: Difficulty,
               rng: random.Random) -> tuple[list[Item], int]:
    """``n`` questions' items: ``multihop`` x n multi-hop ones, the single-fact rest balanced over the kinds, and
    the number of self-contained questions to add (``self_contained`` x n)."""
    n_self = round(difficulty.self_contained * n)
    n_hop = min(round(difficulty.multihop * n), len(multihop))
    picked = pick_balanced(single, n - n_self - n_hop, rng)
    if n_hop:
        hop_rng = random.Random(rng.random())
        picked += hop_rng.sample(multihop, n_hop)
    return picked, n_self


# ---------------------------------------------------------------------------------------------------------- self-contained
SELF_CONTAINED_RANGE = ("above the reference range", "within the reference range", "below the reference range",
                        "cannot be judged without the guideline")


def computation_question(dr: Drug, form: int, rng: random.Random) -> tuple[str, list[str], str]:
    """(stem, options, answer) of a question answered from numbers it states about drug ``dr``: ``form`` 0 a
    result against its stated reference range, 1 what remains of a dose after whole half-lives, 2 a total daily
    dose. Four options or fewer, shuffled, the answer among them."""
    drug = dr.entity.name
    if form == 0:
        lo = rng.randint(5, 40)
        hi = lo + rng.randint(20, 80)
        value = rng.choice((rng.randint(hi + 5, hi * 2), rng.randint(lo, hi), rng.randint(1, max(1, lo - 2))))
        answer = SELF_CONTAINED_RANGE[0 if value > hi else 1 if value >= lo else 2]
        stem = (f"A patient taking {drug} has a serum {dr.target.name} activity of {value} U/L. The "
                f"laboratory's reference range is {lo}-{hi} U/L. How is this result best described?")
        options = list(SELF_CONTAINED_RANGE)
    elif form == 1:
        k = rng.randint(1, 4)
        answer = f"{100 / 2 ** k:g}%"
        stem = (f"{drug} has a plasma half-life of {dr.half_life} hours. If a single dose is taken and nothing "
                f"more, what percentage of it is still in the body {k * dr.half_life} hours later?")
        options = [f"{100 / 2 ** j:g}%" for j in range(5)]
    else:
        doses, mg = rng.randint(2, 4), rng.choice((5, 10, 20, 25, 50))
        answer = f"{doses * mg} mg"
        stem = f"{drug} is prescribed as {doses} doses of {mg} mg per day. What total daily dose is that?"
        options = [f"{x} mg" for x in dict.fromkeys((doses * mg, (doses + 1) * mg, (doses - 1) * mg, mg,
                                                     2 * doses * mg))]
    rng.shuffle(options)
    options = options[:4] if answer in options[:4] else [answer, *options[:3]]
    rng.shuffle(options)
    return stem, options, answer


def make_self_contained(m: WorldModel, n: int, rng: random.Random, split_of: Callable[[str], str],
                        first_number: int) -> list[MultipleChoiceQuestion]:
    """``n`` MCQs whose answer follows from numbers stated in the question (:func:`computation_question`, the
    three forms in turn): no passage is needed, and the drug they name only makes retrieval bring noise."""
    out: list[MultipleChoiceQuestion] = []
    for i in range(n):
        dr = m.drugs[rng.randrange(len(m.drugs))]
        stem, options, answer = computation_question(dr, i % 3, rng)
        letter = LETTERS[options.index(answer)]
        values = {f"value:{o}": o for o in options}
        out.append(MultipleChoiceQuestion(
            id=f"world-mcq-{first_number + i:06d}",
            question=stem,
            options={LETTERS[j]: o for j, o in enumerate(options)},
            answer=[letter],
            dataset=DATASET,
            split=split_of(dr.entity.id),
            gold_passages=[],
            gold_sources=[],
            metadata={"fictional": True, "kind": "self-contained", "relation": "computation",
                      "subject": dr.entity.id, "facts": [], "needs_retrieval": False,
                      "answer_entity": f"value:{answer}", "candidates": values,
                      "option_entities": {LETTERS[j]: f"value:{o}" for j, o in enumerate(options)},
                      "item": f"computation:{first_number + i}"},
        ))
    return out


# ---------------------------------------------------------------------------------------------------------- open
def make_open_questions(
    m: WorldModel,
    index: FactIndex,
    rng: random.Random,
    n: int,
    split_of: Callable[[str], str],
) -> list[OpenQuestion]:
    """Long-form questions whose reference answers combine facts from several sources.

    Three templates: a disease summary (wiki/graph + research + guideline), a guidance change (guideline only,
    for diseases whose recommendation was superseded) and a drug profile (book + guideline).
    """
    drug_by_id = {x.entity.id: x for x in m.drugs}
    current_for: dict[str, Disease] = {}
    for d in m.diseases:
        current_for.setdefault(d.current.drug.id, d)
    order = list(range(len(m.diseases)))
    rng.shuffle(order)
    out: list[OpenQuestion] = []
    for j, di in enumerate(order):
        if len(out) >= n:
            break
        d = m.diseases[di]
        name, cur = d.entity.name, d.current
        template = j % 3
        if template == 1 and len(d.chain) < 2:
            template = 0
        if template == 0:
            syms = ", ".join(s.name for s in d.symptoms[:2]) + f" and {d.symptoms[2].name}"
            question = (
                f"Summarise {name}: how it presents, what examination shows, its genetic basis and its current "
                f"first-line treatment."
            )
            ref = (
                f"{name} presents with {syms}, and examination shows {d.finding.name}. Variants in {d.gene.name} are "
                f"associated with it. The current first-line treatment is {cur.drug.name}, recommended by the "
                f"{cur.issuer.name} in {cur.date[:4]}."
            )
            facts = [*d.facts["symptoms"], d.facts["finding"], d.facts["gene"], d.facts["first_line"]]
            terms = [d.finding.name, d.gene.name, cur.drug.name]
            kind, subject = "disease summary", d.entity.id
        elif template == 1:
            old = cur.replaces
            assert old is not None
            question = (
                f"How has the recommended first-line treatment for {name} changed, and what is advised now?"
            )
            ref = (
                f"In {cur.date[:4]} the {cur.issuer.name} replaced {old.drug.name} with {cur.drug.name} as first-line "
                f"treatment for {name}; {old.drug.name} is no longer advised."
            )
            facts = [d.facts["first_line"], cur.not_advised_fact]
            terms = [cur.drug.name, old.drug.name]
            kind, subject = "guidance change", d.entity.id
        else:
            dr = drug_by_id[cur.drug.id]
            d0 = current_for[dr.entity.id]
            question = f"Explain how {dr.entity.name} works and name a disease for which it is the first-line treatment."
            ref = (
                f"{dr.entity.name} is one of the {dr.drug_class.name}; its mechanism of action is {dr.mechanism.name}. "
                f"It is the current first-line treatment for {d0.entity.name}."
            )
            facts = [dr.facts["moa"], d0.facts["first_line"]]
            terms = [dr.mechanism.name, d0.entity.name]
            kind, subject = "drug profile", dr.entity.id
        gold = index.cover(facts)
        out.append(
            OpenQuestion(
                id=f"world-open-{len(out) + 1:06d}",
                question=question,
                reference_answer=ref,
                dataset=DATASET,
                split=split_of(subject),
                gold_passages=gold,
                metadata={
                    "fictional": True,
                    "kind": kind,
                    "relation": kind,
                    "subject": subject,
                    "facts": facts,
                    "key_terms": terms,
                    "gold_sources": index.sources_of(gold),
                },
            )
        )
    return out
