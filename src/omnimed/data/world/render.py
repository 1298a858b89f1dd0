"""Render the world's facts into passages of the five source kinds, each in its own style.

Which facts go where is the point of the world: a source planner must learn that

- **book** (textbook prose) holds drug pharmacology (class, mechanism, target, half-life, clearance), pathway
  physiology and disease pathophysiology;
- **guideline** (dated, issued by bodies of different authority) holds treatment recommendations, their
  supersession ("X is no longer advised") and review intervals;
- **research** (dated abstracts) holds trial results with numbers and gene association studies;
- **wiki** (encyclopedic entries) holds presentation (symptoms, examination finding), history and prevalence;
- **graph** (one passage per concept: a definition, then ``A | relation | B`` lines) holds typed relations and
  definitions, restating some facts of the other sources in structured form.

Every passage lists the ids of the facts it states in ``metadata["facts"]``, its topic entities in
``metadata["about"]`` and every entity it names in ``metadata["entities"]``; guideline passages also say which
recommendation they make, which drugs they mark as outdated or no longer advised, and what they supersede. That
metadata is what the oracle reads, so its judgements need no text matching.
"""

from __future__ import annotations

import random
from typing import Any

from omnimed.data.records import Passage
from omnimed.data.world.model import TIERS, Disease, Drug, Guideline, WorldModel

FICTIONAL_NOTE = "fictional: invented by the omnimed synthetic world; not medical knowledge or advice"


class _Sink:
    """Collects passages of one source with per-document numbering."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[Passage] = []
        self._docs = 0

    def new_doc(self, prefix: str) -> str:
        self._docs += 1
        return f"{self.source}:{prefix}{self._docs:06d}"

    def add(
        self,
        doc: str,
        part: int,
        title: str,
        text: str,
        facts: list[str],
        about: list[str],
        entities: list[str],
        *,
        date: str | None = None,
        authority: str | None = None,
        **extra: Any,
    ) -> Passage:
        meta: dict[str, Any] = {"fictional": True, "facts": facts, "about": about, "entities": entities}
        meta.update(extra)
        p = Passage(
            id=f"{doc}#{part}",
            source=self.source,
            title=title,
            text=text,
            date=date,
            authority=authority,
            parent_id=doc,
            metadata=meta,
        )
        self.items.append(p)
        return p


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


# ---------------------------------------------------------------------------------------------------------- book
def render_book(m: WorldModel, rng: random.Random) -> list[Passage]:
    """Textbook chapters: pharmacology per drug class, physiology of pathways, disorders per organ system."""
    out = _Sink("book")
    pathways = {p.entity.id: p for p in m.pathways}
    proteins = {p.entity.id: p for p in m.proteins}
    by_class: dict[str, list[Drug]] = {}
    for d in m.drugs:
        by_class.setdefault(d.drug_class.id, []).append(d)
    for cls in m.drug_classes:
        doc = out.new_doc("ch")
        for k, d in enumerate(by_class.get(cls.id, []), start=1):
            prot = proteins[d.target.id]
            pw = pathways[prot.pathway.id]
            name, mech, target = d.entity.name, d.mechanism.name, prot.entity.name
            pk = "excretion" if d.clearance == "renal" else "metabolism"
            physiology = (
                f"{target}, the molecular target of {name}, is {_article(prot.kind)} {prot.kind} of the "
                f"{pw.entity.name}, which controls {pw.function} in the {pw.system.name}."
            )
            kinetics = f"The drug has a plasma half-life of about {d.half_life} hours and is cleared mainly by {d.clearance} {pk}."
            if rng.random() < 0.5:
                text = f"{name} is one of the {cls.name}. Its mechanism of action is {mech}. {physiology} {kinetics}"
            else:
                text = (
                    f"Among the {cls.name}, {name} acts on a single molecular target: its mechanism of action is {mech}. "
                    f"{physiology} {kinetics}"
                )
            out.add(
                doc,
                k,
                f"Pharmacology of the {cls.name}: {name}",
                text,
                [
                    d.facts["class"],
                    d.facts["moa"],
                    d.facts["target"],
                    d.facts["half_life"],
                    d.facts["clearance"],
                    prot.fact,
                    pw.fact,
                ],
                [d.entity.id],
                [d.entity.id, cls.id, d.mechanism.id, prot.entity.id, pw.entity.id],
            )
    members: dict[str, list[str]] = {}
    for prot in m.proteins:
        members.setdefault(prot.pathway.id, []).append(prot.entity.id)
    doc = out.new_doc("ch")
    for k, pw in enumerate(m.pathways, start=1):
        comps = members.get(pw.entity.id, [])[:4]
        text = f"The {pw.entity.name} controls {pw.function} in the {pw.system.name}."
        facts = [pw.fact]
        if comps:
            text += f" Its known components include {_and([m.entities[c].name for c in comps])}."
            facts += [proteins[c].fact for c in comps]
        text += " When the pathway is disturbed, the tissues that depend on it lose their normal balance."
        out.add(
            doc, k, f"Physiology: the {pw.entity.name}", text, facts, [pw.entity.id], [pw.entity.id, *comps]
        )
    chapters: dict[str, str] = {}
    counts: dict[str, int] = {}
    for dis in m.diseases:
        sys_id = dis.system.id
        if sys_id not in chapters:
            chapters[sys_id] = out.new_doc("ch")
        counts[sys_id] = counts.get(sys_id, 0) + 1
        pw = pathways[dis.pathway.id]
        name = dis.entity.name
        text = (
            f"{name} is a disorder of the {dis.system.name}. Its pathophysiology centres on {dis.dysregulation} of the "
            f"{pw.entity.name}, which normally controls {pw.function}. As this control is lost, the affected tissue "
            f"cannot keep its {pw.function} in balance, and the clinical picture of {name} follows."
        )
        out.add(
            chapters[sys_id],
            counts[sys_id],
            f"Disorders of the {dis.system.name}: {name}",
            text,
            [dis.facts["pathophysiology"], dis.facts["system"], pw.fact],
            [dis.entity.id],
            [dis.entity.id, dis.system.id, pw.entity.id],
        )
    return out.items


# ---------------------------------------------------------------------------------------------------------- guideline
def render_guidelines(m: WorldModel) -> list[Passage]:
    """One document per guideline: the recommendation (with supersession), then the review interval."""
    out = _Sink("guideline")
    for dis in m.diseases:
        for g in dis.guidelines:
            g.doc = out.new_doc("G")
        for g in dis.guidelines:
            _guideline_doc(out, dis, g)
    return out.items


def _guideline_doc(out: _Sink, dis: Disease, g: Guideline) -> None:
    name, drug, tier = dis.entity.name, g.drug.name, TIERS[g.tier]
    year = g.date[:4]
    title = f"{g.issuer.name}: management of {name} ({year})"
    common = {"authority_level": g.tier, "authority_tier": tier, "status": g.status, "recommends": g.drug.id}
    superseded_by = next((h.doc for h in dis.guidelines if h.replaces is g), None)
    if superseded_by:
        common["superseded_by"] = superseded_by
    if g.status == "adoption":
        cur = dis.current
        text = (
            f"{g.issuer.name} ({tier}), {g.date}. The panel adopts the {cur.date[:4]} recommendation of the "
            f"{cur.issuer.name}: {drug} remains the first-line treatment for adults with {name}."
        )
        out.add(
            g.doc,
            1,
            title,
            text,
            [g.first_line_fact],
            [dis.entity.id],
            [dis.entity.id, g.drug.id, cur.issuer.id],
            date=g.date,
            authority=g.issuer.name,
            section="recommendation",
            endorses=cur.doc,
            **common,
        )
        return
    text = (
        f"{g.issuer.name} ({tier}), {g.date}. Recommendation 1: in adults with {name}, {drug} is recommended as "
        f"first-line treatment."
    )
    facts = [g.rec_fact] + ([g.first_line_fact] if g.first_line_fact else [])
    entities = [dis.entity.id, g.drug.id]
    extra: dict[str, Any] = {
        "section": "recommendation",
        "outdated": [g.drug.id] if g.status == "superseded" else [],
    }
    if g.replaces is not None:
        old = g.replaces
        text += (
            f" This replaces the {old.date[:4]} guidance of the {old.issuer.name}: {old.drug.name} is no longer "
            f"advised for {name}."
        )
        facts.append(g.not_advised_fact)
        entities.append(old.drug.id)
        extra.update(supersedes=old.doc, not_advised=[old.drug.id])
    out.add(
        g.doc,
        1,
        title,
        text,
        facts,
        [dis.entity.id],
        entities,
        date=g.date,
        authority=g.issuer.name,
        **extra,
        **common,
    )
    text = (
        f"{g.issuer.name}, {g.date}. Recommendation 2: patients with {name} who receive {drug} should be reviewed "
        f"every {g.review_weeks} weeks, with {dis.finding.name} re-assessed at each visit."
    )
    out.add(
        g.doc,
        2,
        title,
        text,
        [g.monitoring_fact],
        [dis.entity.id],
        [dis.entity.id, g.drug.id, dis.finding.id],
        date=g.date,
        authority=g.issuer.name,
        section="monitoring",
        **common,
    )


# ---------------------------------------------------------------------------------------------------------- research
def render_research(m: WorldModel, rng: random.Random) -> list[Passage]:
    """Dated abstracts: randomized trials with numbers, and gene association studies."""
    out = _Sink("research")
    for dis in m.diseases:
        name = dis.entity.name
        for t in dis.trials:
            t.doc = out.new_doc("A")
            drug = t.drug.name
            if t.positive:
                title = f"{drug} versus placebo in {name}: a randomized trial"
                result = f"Results: {drug} reduced {t.outcome} by {t.effect}% compared with placebo (p = {t.p_value})."
                concl = f"Conclusions: {drug} improved outcomes in patients with {name}."
            else:
                title = f"A randomized trial of {drug} in {name}"
                result = f"Results: {drug} did not significantly change {t.outcome} ({t.effect}% difference, p = {t.p_value})."
                concl = f"Conclusions: {drug} showed no benefit in {name}."
            text = (
                f"Background: {name} has few proven treatments. Methods: we randomly assigned {t.n} patients with "
                f"{name} to {drug} or placebo for {t.weeks} weeks; the primary outcome was {t.outcome}. {result} {concl}"
            )
            date = f"{t.year:04d}-{rng.randint(1, 12):02d}"
            out.add(
                t.doc,
                1,
                title,
                text,
                [t.fact],
                [dis.entity.id],
                [dis.entity.id, t.drug.id],
                date=date,
                study="trial",
                positive=t.positive,
            )
        gs = dis.gene_study
        assert gs is not None
        gs.doc = out.new_doc("A")
        gene = dis.gene.name
        text = (
            f"Background: the genetic basis of {name} is poorly understood. Methods: we genotyped {gs.cases} cases of "
            f"{name} and matched controls in a genome-wide association study. Results: variants in {gene} were "
            f"associated with {name} (odds ratio {gs.odds_ratio}); {gene} lies on chromosome {dis.chromosome}. "
            f"Conclusions: {gene} is a causal gene for {name}."
        )
        out.add(
            gs.doc,
            1,
            f"Genome-wide association study of {name}",
            text,
            [dis.facts["gene"], dis.facts["locus"]],
            [dis.entity.id, dis.gene.id],
            [dis.entity.id, dis.gene.id],
            date=f"{gs.year:04d}-{rng.randint(1, 12):02d}",
            study="gene association",
        )
    return out.items


# ---------------------------------------------------------------------------------------------------------- wiki
def render_wiki(m: WorldModel) -> list[Passage]:
    """Encyclopedic entries: disease overview and history per disease, one entry per symptom."""
    out = _Sink("wiki")
    for dis in m.diseases:
        doc = out.new_doc("W")
        name = dis.entity.name
        syms = [s.name for s in dis.symptoms]
        text = (
            f"{name} is a rare disorder of the {dis.system.name}. Signs and symptoms include {_and(syms)}. "
            f"On physical examination, {dis.finding.name} is characteristic."
        )
        out.add(
            doc,
            1,
            name,
            text,
            [*dis.facts["symptoms"], dis.facts["finding"], dis.facts["system"]],
            [dis.entity.id],
            [dis.entity.id, *[s.id for s in dis.symptoms], dis.finding.id, dis.system.id],
            section="overview",
        )
        text = (
            f"{name} was first described in {dis.described_year} by {dis.described_by} in {dis.described_in}. "
            f"Its prevalence is estimated at {dis.prevalence} per 100,000 people."
        )
        out.add(
            doc,
            2,
            f"{name}: history and epidemiology",
            text,
            [dis.facts["prevalence"], dis.facts["history"]],
            [dis.entity.id],
            [dis.entity.id],
            section="history",
        )
    for sym in m.symptoms:
        doc = out.new_doc("W")
        text = (
            f"{sym.entity.name} is a symptom: {sym.noun} that is {sym.quality}. It is reported in several disorders "
            f"and is not specific to any one of them."
        )
        out.add(
            doc, 1, sym.entity.name, text, [sym.fact], [sym.entity.id], [sym.entity.id], section="overview"
        )
    return out.items


# ---------------------------------------------------------------------------------------------------------- graph
def render_graph(m: WorldModel, restate: float = 1.0, rng: random.Random | None = None) -> list[Passage]:
    """One passage per concept: a definition line, then typed triples ``A | relation | B``; a second passage per
    disease and drug lists its other names (``A | also known as | B``).

    ``restate``: the chance that a disease's, gene's or drug's entry restates the facts the wiki, research and book
    state (symptoms, finding, gene, mechanism, target); the others keep their definition and plain relations.
    """
    out = _Sink("graph")
    rng = rng or random.Random(0)

    def concept(
        ent_id: str,
        definition: str,
        triples: list[tuple[str, str, str]],
        facts: list[str],
        entities: list[str],
    ) -> None:
        ent = m.entities[ent_id]
        lines = [f"{ent.name}: {definition}"] + [f"{a} | {r} | {b}" for a, r, b in triples]
        out.add(
            f"graph:{ent_id}",
            1,
            ent.name,
            "\n".join(lines),
            facts,
            [ent_id],
            [ent_id, *entities],
            concept_type=ent.type,
        )
        if ent.aliases:
            out.add(f"graph:{ent_id}", 2, f"{ent.name}: names",
                    "\n".join(f"{ent.name} | also known as | {alias}" for alias in ent.aliases),
                    [], [ent_id], [ent_id], concept_type=ent.type, section="names", names=list(ent.aliases))

    for dis in m.diseases:
        n, g = dis.entity.name, dis.gene.name
        restated = restate >= 1.0 or rng.random() < restate
        triples = [(n, "is a", "disease"), (n, "affects", dis.system.name)]
        facts, entities = [dis.facts["system"]], [dis.system.id]
        if restated:
            triples += [(n, "has symptom", s.name) for s in dis.symptoms]
            triples += [(n, "has finding", dis.finding.name), (n, "associated gene", g)]
            facts += [*dis.facts["symptoms"], dis.facts["finding"], dis.facts["gene"]]
            entities += [*[s.id for s in dis.symptoms], dis.finding.id, dis.gene.id]
        concept(dis.entity.id, f"a disorder of the {dis.system.name}.", triples, facts, entities)
        concept(
            dis.gene.id,
            f"a gene on chromosome {dis.chromosome}.",
            [(g, "is a", "gene"), (g, "located on", f"chromosome {dis.chromosome}")]
            + ([(g, "associated with", n)] if restated else []),
            [dis.facts["locus"]] + ([dis.facts["gene"]] if restated else []),
            [dis.entity.id] if restated else [],
        )
    for f in m.findings:
        n = f.entity.name
        concept(
            f.entity.id,
            f"an examination finding {f.quality}.",
            [(n, "is a", "physical examination finding")],
            [f.fact],
            [],
        )
    for s in m.symptoms:
        n = s.entity.name
        concept(s.entity.id, f"{s.noun} that is {s.quality}.", [(n, "is a", "symptom")], [s.fact], [])
    for d in m.drugs:
        n = d.entity.name
        triples = [(n, "is a", "drug"), (n, "member of", d.drug_class.name)]
        if restate >= 1.0 or rng.random() < restate:
            triples += [(n, "mechanism of action", d.mechanism.name), (n, "targets", d.target.name)]
            concept(d.entity.id, f"a drug of the {d.drug_class.name}.", triples,
                    [d.facts["class"], d.facts["moa"], d.facts["target"]],
                    [d.drug_class.id, d.mechanism.id, d.target.id])
        else:
            concept(d.entity.id, f"a drug of the {d.drug_class.name}.", triples, [d.facts["class"]],
                    [d.drug_class.id])
    for p in m.proteins:
        n = p.entity.name
        concept(
            p.entity.id,
            f"{_article(p.kind)} {p.kind} in the {p.pathway.name}.",
            [(n, "is a", p.kind), (n, "part of", p.pathway.name)],
            [p.fact],
            [p.pathway.id],
        )
    for pw in m.pathways:
        n = pw.entity.name
        concept(
            pw.entity.id,
            f"a signalling route that controls {pw.function}.",
            [(n, "regulates", pw.function), (n, "active in", pw.system.name)],
            [pw.fact],
            [pw.system.id],
        )
    members: dict[str, list[Drug]] = {}
    for d in m.drugs:
        members.setdefault(d.drug_class.id, []).append(d)
    for cls in m.drug_classes:
        ds = members.get(cls.id, [])
        concept(
            cls.id,
            "a class of drugs grouped by shared chemistry.",
            [(cls.name, "has member", d.entity.name) for d in ds],
            [d.facts["class"] for d in ds],
            [d.entity.id for d in ds],
        )
    return out.items


def render_all(m: WorldModel, seed: int, restate: float = 1.0) -> list[Passage]:
    """All passages, grouped by source in the fixed order book, guideline, research, wiki, graph."""
    rng = random.Random(f"render-{seed}")
    return (
        render_book(m, rng)
        + render_guidelines(m)
        + render_research(m, rng)
        + render_wiki(m)
        + render_graph(m, restate, random.Random(f"restate-{seed}"))
    )
