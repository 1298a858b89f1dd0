"""The ground truth of the synthetic world: entities, facts and the profiles that tie them together.

A *fact* is one atomic statement (``relation(subject, object)`` plus attributes) with a stable id. Rendering states
facts in passages and records their ids in the passage metadata; questions name the facts that make their gold
answer correct. The oracle compares the two, which is why its judgements are exact rather than guessed.

Everything here is fictional: the diseases, drugs, genes, pathways and issuing bodies are invented. Nothing in this
world is medical knowledge or advice.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from omnimed.data.world.difficulty import DEFAULT, Difficulty
from omnimed.data.world.names import NameForge

SYSTEMS: tuple[str, ...] = (
    "renal",
    "cardiac",
    "pulmonary",
    "hepatic",
    "neural",
    "dermal",
    "gastric",
    "skeletal",
    "endocrine",
    "haematic",
)
#: guideline authority tiers, higher outranks lower
TIERS: dict[int, str] = {3: "national board", 2: "regional society", 1: "local panel"}
PATHWAY_FUNCTIONS: tuple[str, ...] = (
    "fluid balance",
    "cell repair",
    "inflammatory signalling",
    "energy storage",
    "membrane transport",
    "tissue growth",
    "nerve conduction",
    "mineral handling",
    "mucus clearance",
    "pigment turnover",
)
SYMPTOM_QUALITIES: tuple[str, ...] = (
    "worse in the morning",
    "intermittent",
    "triggered by exertion",
    "relieved by rest",
    "worse at night",
    "persistent",
    "worse after meals",
    "brought on by cold",
)
FINDING_QUALITIES: tuple[str, ...] = (
    "elicited by firm pressure",
    "seen on close inspection",
    "heard with a stethoscope",
    "felt on palpation",
    "provoked by passive movement",
)
ACTIONS: dict[str, tuple[str, ...]] = {
    "kinase": ("inhibition",),
    "receptor": ("blockade", "activation"),
    "channel": ("blockade", "opening"),
    "transporter": ("inhibition",),
    "protease": ("inhibition",),
    "synthase": ("inhibition", "activation"),
}
DYSREGULATION: tuple[str, ...] = ("overactivity", "underactivity", "loss of regulation")
CLEARANCE: tuple[str, ...] = ("renal", "hepatic")


@dataclass(slots=True)
class Entity:
    """A named concept of the world (``type`` in disease, symptom, finding, gene, protein, pathway, drug,
    drug_class, mechanism, system, issuer)."""

    id: str
    type: str
    name: str
    #: other names of the concept (abbreviation, synonym, systematic name); only the graph's names entry uses them
    aliases: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Fact:
    """One atomic statement ``relation(subject, object)``; ``object`` is an entity id or a literal string."""

    id: str
    relation: str
    subject: str
    object: str
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Guideline:
    """One guideline document recommending one drug for one disease.

    ``status`` is ``current`` (the newest recommendation of the highest authority), ``superseded`` (replaced by a
    newer guideline of equal or higher authority) or ``adoption`` (a lower-authority body endorsing the current one).
    """

    doc: str
    issuer: Entity
    tier: int
    date: str
    drug: Entity
    status: str
    replaces: Guideline | None
    review_weeks: int
    rec_fact: str = ""
    first_line_fact: str = ""
    not_advised_fact: str = ""
    monitoring_fact: str = ""


@dataclass(slots=True)
class Trial:
    """A randomized trial of a drug against placebo in one disease; ``positive`` when the drug helped."""

    doc: str
    drug: Entity
    n: int
    weeks: int
    outcome: str
    effect: int
    p_value: str
    year: int
    positive: bool
    fact: str = ""


@dataclass(slots=True)
class GeneStudy:
    doc: str
    cases: int
    odds_ratio: str
    year: int


@dataclass(slots=True)
class Disease:
    """A disease and everything true about it; ``facts`` maps a role name to fact id(s)."""

    entity: Entity
    system: Entity
    symptoms: list[Entity]
    finding: Entity
    gene: Entity
    chromosome: str
    pathway: Entity
    dysregulation: str
    prevalence: int
    described_year: int
    described_by: str
    described_in: str
    guidelines: list[Guideline] = field(default_factory=list)
    trials: list[Trial] = field(default_factory=list)
    gene_study: GeneStudy | None = None
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def chain(self) -> list[Guideline]:
        """Guidelines that recommend (not merely endorse), oldest first; the last one is current."""
        return [g for g in self.guidelines if g.status != "adoption"]

    @property
    def current(self) -> Guideline:
        return self.chain[-1]


@dataclass(slots=True)
class Drug:
    entity: Entity
    drug_class: Entity
    target: Entity
    mechanism: Entity
    half_life: int
    clearance: str
    facts: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Pathway:
    entity: Entity
    function: str
    system: Entity
    fact: str = ""


@dataclass(slots=True)
class Protein:
    entity: Entity
    kind: str
    pathway: Entity
    fact: str = ""


@dataclass(slots=True)
class Symptom:
    entity: Entity
    noun: str
    quality: str
    fact: str = ""


@dataclass(slots=True)
class Finding:
    entity: Entity
    quality: str
    fact: str = ""


@dataclass
class WorldModel:
    """All entities and facts of one world, in creation order (which is what makes rendering deterministic)."""

    seed: int
    systems: list[Entity] = field(default_factory=list)
    pathways: list[Pathway] = field(default_factory=list)
    proteins: list[Protein] = field(default_factory=list)
    drug_classes: list[Entity] = field(default_factory=list)
    drugs: list[Drug] = field(default_factory=list)
    issuers: dict[int, list[Entity]] = field(default_factory=dict)
    symptoms: list[Symptom] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    diseases: list[Disease] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    entities: dict[str, Entity] = field(default_factory=dict)
    fact_index: dict[str, Fact] = field(default_factory=dict)
    #: (disease id, its near-namesake twin's id)
    twins: list[tuple[str, str]] = field(default_factory=list)

    counters: dict[str, int] = field(default_factory=dict)

    def entity(self, type_: str, prefix: str, name: str) -> Entity:
        """Create and register an entity with the next id of its prefix (``DIS00001``, ``DRG00002``, ...)."""
        self.counters[prefix] = self.counters.get(prefix, 0) + 1
        ent = Entity(f"{prefix}{self.counters[prefix]:05d}", type_, name)
        self.entities[ent.id] = ent
        return ent

    def fact(self, relation: str, subject: str, obj: str, **attrs: Any) -> str:
        f = Fact(f"F{len(self.facts) + 1:07d}", relation, subject, obj, attrs)
        self.facts.append(f)
        self.fact_index[f.id] = f
        return f.id


def _date(rng: random.Random, year: int) -> str:
    return f"{year:04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def build_model(seed: int, n_diseases: int, difficulty: Difficulty = DEFAULT) -> WorldModel:
    """Create the ground truth of a world with ``n_diseases`` diseases (and proportional drugs, pathways, ...),
    plus ``difficulty.twins`` near-namesake twins per disease and every disease's and drug's aliases.

    Twins and aliases draw from their own generators, so the knobs at zero leave the rest of the world unchanged.
    """
    rng = random.Random(seed)
    names = NameForge(rng)
    m = WorldModel(seed=seed)

    n_drugs = max(8, round(n_diseases * 0.55))
    n_classes = max(3, n_drugs // 6)
    n_pathways = max(5, n_diseases // 6)
    n_symptoms = max(14, n_diseases // 2)

    for s in SYSTEMS:
        m.systems.append(m.entity("system", "SYS", f"{s} system"))

    for _ in range(n_pathways):
        ent = m.entity("pathway", "PWY", names.pathway())
        pw = Pathway(ent, rng.choice(PATHWAY_FUNCTIONS), rng.choice(m.systems))
        pw.fact = m.fact("regulates", ent.id, pw.function, system=pw.system.id)
        m.pathways.append(pw)

    for _ in range(n_classes):
        m.drug_classes.append(m.entity("drug_class", "CLS", names.drug_class()))

    for _ in range(n_drugs):
        drug_ent = m.entity("drug", "DRG", names.drug())
        prot_name = names.protein()
        kind = prot_name.rsplit(" ", 1)[1]
        prot = Protein(m.entity("protein", "PRT", prot_name), kind, rng.choice(m.pathways).entity)
        prot.fact = m.fact("part_of", prot.entity.id, prot.pathway.id)
        m.proteins.append(prot)
        action = rng.choice(ACTIONS[kind])
        mech = m.entity("mechanism", "MEC", f"{action} of {prot_name}")
        drug = Drug(
            drug_ent, rng.choice(m.drug_classes), prot.entity, mech, rng.randint(2, 48), rng.choice(CLEARANCE)
        )
        drug.facts["class"] = m.fact("member_of", drug_ent.id, drug.drug_class.id)
        drug.facts["moa"] = m.fact("mechanism_of_action", drug_ent.id, mech.id)
        drug.facts["target"] = m.fact("targets", drug_ent.id, prot.entity.id)
        drug.facts["half_life"] = m.fact("half_life_hours", drug_ent.id, str(drug.half_life))
        drug.facts["clearance"] = m.fact("cleared_by", drug_ent.id, drug.clearance)
        m.drugs.append(drug)

    n_national = min(12, 2 + n_diseases // 150)
    places = [names.place() for _ in range(n_national * 6)]
    m.issuers[3] = [
        m.entity("issuer", "ISS", f"National Health Board of {places[i]}") for i in range(n_national)
    ]
    m.issuers[2] = [
        m.entity(
            "issuer",
            "ISS",
            f"{places[n_national + i]} Regional Society of {SYSTEMS[i % 10].capitalize()} Medicine",
        )
        for i in range(2 * n_national)
    ]
    m.issuers[1] = [
        m.entity("issuer", "ISS", f"{places[3 * n_national + i]} Local Formulary Panel")
        for i in range(3 * n_national)
    ]

    for _ in range(n_symptoms):
        name = names.symptom()
        noun = name.split(" ", 1)[1]  # a symptom name is one invented adjective and a plain noun phrase
        sym = Symptom(m.entity("symptom", "SYM", name), noun, rng.choice(SYMPTOM_QUALITIES))
        sym.fact = m.fact("defined_as", sym.entity.id, f"{noun} that is {sym.quality}")
        m.symptoms.append(sym)

    pathway_of_protein = {p.entity.id: p.pathway.id for p in m.proteins}
    drugs_by_pathway: dict[str, list[Drug]] = {}
    for d in m.drugs:
        drugs_by_pathway.setdefault(pathway_of_protein[d.target.id], []).append(d)

    for i in range(n_diseases):
        _add_disease(m, rng, names, drugs_by_pathway, force_chain=(i == 0), superseded=difficulty.superseded)

    twin_rng = random.Random(f"twins-{seed}")
    twin_names = NameForge(twin_rng, used=names.used)
    n_twins = round(difficulty.twins * n_diseases)
    # two-word names first: a twin of "Brakel fever" is "Brakel palsy", sharing a word a lexical search matches
    bases = sorted(m.diseases, key=lambda d: (" " not in d.entity.name, twin_rng.random()))[:n_twins]
    for base in bases:
        twin = _add_disease(m, twin_rng, twin_names, drugs_by_pathway, force_chain=False,
                            superseded=difficulty.superseded, twin_of=base)
        m.twins.append((base.entity.id, twin.entity.id))
    if difficulty.aliases > 0:
        _add_aliases(m, NameForge(random.Random(f"aliases-{seed}"), used=names.used))
    return m


def _add_aliases(m: WorldModel, names: NameForge) -> None:
    """Give every disease an abbreviation, an eponym and a systematic name, and every drug a code and a brand."""
    per_system: dict[str, int] = {}
    for d in m.diseases:
        system = d.system.name.removesuffix(" system")
        per_system[system] = per_system.get(system, 0) + 1
        d.entity.aliases = [names.abbreviation(d.entity.name), names.eponym(),
                            names.claim(f"{system} disorder type {per_system[system]}")]
    for dr in m.drugs:
        dr.entity.aliases = [names.drug_code(), names.brand()]


def _add_disease(
    m: WorldModel,
    rng: random.Random,
    names: NameForge,
    drugs_by_pathway: dict[str, list[Drug]],
    force_chain: bool,
    superseded: float,
    twin_of: Disease | None = None,
) -> Disease:
    """Add one disease with its presentation, genetics, pathophysiology, guideline history and trials.

    ``superseded``: the chance that its current recommendation replaced an older one. ``twin_of``: make it the
    near-namesake of that disease (a shared name word, the same organ system, two of its three symptoms).
    """
    ent = m.entity("disease", "DIS", names.twin(twin_of.entity.name) if twin_of else names.disease())
    pathway = rng.choice(m.pathways)
    finding_ent = m.entity("finding", "FND", names.finding())
    finding = Finding(finding_ent, rng.choice(FINDING_QUALITIES))
    finding.fact = m.fact("defined_as", finding_ent.id, f"an examination finding {finding.quality}")
    m.findings.append(finding)
    gene = m.entity("gene", "GEN", names.gene())
    d = Disease(
        entity=ent,
        system=pathway.system if rng.random() < 0.6 else rng.choice(m.systems),
        symptoms=[s.entity for s in rng.sample(m.symptoms, 3)],
        finding=finding_ent,
        gene=gene,
        chromosome=f"{rng.randint(1, 22)}{rng.choice('pq')}{rng.randint(11, 36)}",
        pathway=pathway.entity,
        dysregulation=rng.choice(DYSREGULATION),
        prevalence=rng.randint(2, 400),
        described_year=rng.randint(1890, 1985),
        described_by=names.person(),
        described_in=names.place(),
    )
    if twin_of is not None:
        d.system = twin_of.system
        others = [s.entity for s in m.symptoms if s.entity not in twin_of.symptoms]
        d.symptoms = [*rng.sample(twin_of.symptoms, 2), rng.choice(others)]
    f = d.facts
    f["symptoms"] = [m.fact("has_symptom", ent.id, s.id) for s in d.symptoms]
    f["finding"] = m.fact("has_finding", ent.id, finding_ent.id)
    f["system"] = m.fact("affects", ent.id, d.system.id)
    f["pathophysiology"] = m.fact("pathophysiology", ent.id, pathway.entity.id, dysregulation=d.dysregulation)
    f["prevalence"] = m.fact("prevalence_per_100k", ent.id, str(d.prevalence))
    f["history"] = m.fact(
        "first_described", ent.id, str(d.described_year), by=d.described_by, place=d.described_in
    )
    f["locus"] = m.fact("located_on", gene.id, d.chromosome)

    # --- guideline history: a chain where each newer guideline (equal or higher authority) replaces the older
    # at the default 0.7 these are the weights (3, 5, 2): chains of two are the commonest
    length = rng.choices((1, 2, 3), weights=(1 - superseded, superseded * 5 / 7, superseded * 2 / 7))[0]
    if force_chain:
        length = max(length, 2)
    same_pathway = drugs_by_pathway.get(pathway.entity.id, [])
    current_drug = rng.choice(same_pathway) if same_pathway and rng.random() < 0.7 else rng.choice(m.drugs)
    picked = [current_drug]
    while len(picked) < length + 1:  # older drugs of the chain, plus one for a negative trial
        cand = rng.choice(m.drugs)
        if all(cand is not p for p in picked):
            picked.append(cand)
    chain_drugs = list(reversed(picked[:length]))  # oldest first, current last
    negative_drug = picked[length]

    year = rng.randint(1998, 2012)
    tier = rng.choices((1, 2, 3), weights=(2, 3, 3))[0]
    prev: Guideline | None = None
    for k, drug in enumerate(chain_drugs):
        if k:
            year += rng.randint(3, 6)
            tier = rng.randint(tier, 3)
        g = Guideline(
            doc="",
            issuer=rng.choice(m.issuers[tier]),
            tier=tier,
            date=_date(rng, year),
            drug=drug.entity,
            status="current" if k == length - 1 else "superseded",
            replaces=prev,
            review_weeks=rng.choice((4, 6, 8, 12)),
        )
        d.guidelines.append(g)
        prev = g
    current = d.guidelines[-1]
    if current.tier >= 2 and rng.random() < 0.35:
        d.guidelines.append(
            Guideline(
                doc="",
                issuer=rng.choice(m.issuers[1]),
                tier=1,
                date=_date(rng, year + rng.randint(1, 2)),
                drug=current.drug,
                status="adoption",
                replaces=None,
                review_weeks=current.review_weeks,
            )
        )
    f["first_line"] = m.fact(
        "first_line_treatment", ent.id, current.drug.id, issuer=current.issuer.id, date=current.date
    )
    for g in d.guidelines:
        if g.status != "adoption":
            g.rec_fact = m.fact(
                "recommends", ent.id, g.drug.id, issuer=g.issuer.id, date=g.date, tier=g.tier, status=g.status
            )
        if g.status in ("current", "adoption"):
            g.first_line_fact = f["first_line"]
        if g.replaces is not None:
            g.not_advised_fact = m.fact(
                "no_longer_advised", ent.id, g.replaces.drug.id, issuer=g.issuer.id, date=g.date
            )
        g.monitoring_fact = m.fact(
            "review_interval_weeks", ent.id, str(g.review_weeks), drug=g.drug.id, issuer=g.issuer.id
        )

    # --- research: a positive trial of the current drug, sometimes of the oldest drug, sometimes a negative one
    outcome = names.outcome(finding_ent.name)
    trials = [(chain_drugs[-1], int(current.date[:4]) - 1, True)]
    if length > 1 and rng.random() < 0.6:
        trials.append((chain_drugs[0], int(d.guidelines[0].date[:4]) - 1, True))
    if rng.random() < 0.5:
        trials.append((negative_drug, rng.randint(2000, 2022), False))
    for drug, tyear, positive in trials:
        t = Trial(
            doc="",
            drug=drug.entity,
            n=rng.randint(12, 90) * 10,
            weeks=rng.choice((12, 24, 26, 48, 52)),
            outcome=outcome,
            effect=rng.randint(18, 55) if positive else rng.randint(0, 4),
            p_value=f"0.0{rng.randint(1, 4)}" if positive else f"0.{rng.randint(31, 89)}",
            year=tyear,
            positive=positive,
        )
        t.fact = m.fact(
            "trial_result",
            ent.id,
            drug.entity.id,
            n=t.n,
            outcome=outcome,
            effect=t.effect,
            positive=positive,
            year=tyear,
        )
        d.trials.append(t)
    d.gene_study = GeneStudy(
        "", rng.randint(15, 120) * 20, f"{rng.randint(15, 48) / 10:.1f}", rng.randint(2005, 2023)
    )
    f["gene"] = m.fact("causal_gene", ent.id, gene.id, odds_ratio=d.gene_study.odds_ratio)
    m.diseases.append(d)
    return d
