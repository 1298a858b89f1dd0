"""Invented, pronounceable names for the synthetic world.

Every name is built from syllables drawn with the world's own ``random.Random``, so the same seed gives the same
names, and no name belongs to a real disease, drug or gene: no pretrained model can know the answers, and nobody can
mistake the world for medical advice. Uniqueness is checked case-insensitively across all kinds of names, so a name
never means two things and an answer string never appears inside another concept's name by accident.
"""

from __future__ import annotations

import random

ONSETS: tuple[str, ...] = (
    "b",
    "br",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "k",
    "kl",
    "l",
    "m",
    "n",
    "p",
    "pl",
    "r",
    "s",
    "sk",
    "st",
    "t",
    "tr",
    "v",
    "z",
    "th",
    "sh",
)
VOWELS: tuple[str, ...] = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ou")
CODAS: tuple[str, ...] = ("", "", "", "n", "r", "l", "s", "m", "x")

DISEASE_SUFFIXES: tuple[str, ...] = ("osis", "itis", "emia", "opathy", "algia", "ectasis")
DISEASE_WORDS: tuple[str, ...] = ("syndrome", "disease", "fever", "palsy")
DRUG_SUFFIXES: tuple[str, ...] = (
    "oxane",
    "avrel",
    "idrin",
    "umast",
    "elvor",
    "aprine",
    "ostrel",
    "ivane",
    "ezol",
    "atrix",
    "orane",
    "ulide",
)
PROTEIN_KINDS: tuple[str, ...] = ("kinase", "receptor", "channel", "transporter", "protease", "synthase")
PATHWAY_WORDS: tuple[str, ...] = ("pathway", "cascade", "signalling axis")
SYMPTOM_NOUNS: tuple[str, ...] = (
    "cough",
    "rash",
    "tremor",
    "fatigue",
    "headache",
    "joint pain",
    "thirst",
    "itching",
    "dizziness",
    "palpitations",
    "night sweats",
    "hoarseness",
    "nausea",
    "back pain",
    "muscle cramps",
    "blurred vision",
    "chest tightness",
    "ankle swelling",
    "weight loss",
    "fever",
    "hiccups",
    "tinnitus",
)
ADJECTIVE_ENDINGS: tuple[str, ...] = ("ic", "ar", "ine", "oid", "al", "ish")
FINDING_TEMPLATES: tuple[str, ...] = (
    "{Person} sign",
    "{adj} heart murmur",
    "{adj} skin nodules",
    "{adj} retinal streaks",
    "{Person} reflex",
    "{adj} nail ridges",
    "{adj} tongue plaques",
    "{adj} lung crackles",
    "{Person} phenomenon",
    "{adj} gum lines",
)
PLACE_ENDINGS: tuple[str, ...] = ("ia", "mark", "land", "ora", "avia", "eth")


class NameForge:
    """Draws unique invented names of each kind from one seeded generator."""

    def __init__(self, rng: random.Random, used: set[str] | None = None) -> None:
        self.rng = rng
        # only ever tested for membership, never iterated; shared by forges that name concepts of one world
        self._used: set[str] = set() if used is None else used

    @property
    def used(self) -> set[str]:
        return self._used

    def claim(self, name: str) -> str:
        """Reserve a name made elsewhere (a systematic name); fails if it is taken."""
        return self._claim(lambda: name, tries=1)

    # ------------------------------------------------------------------ building blocks
    def _syllable(self) -> str:
        r = self.rng
        return r.choice(ONSETS) + r.choice(VOWELS) + r.choice(CODAS)

    def stem(self, syllables: int) -> str:
        """A lower-case pronounceable stem of ``syllables`` syllables."""
        return "".join(self._syllable() for _ in range(syllables))

    def _claim(self, make, tries: int = 10_000) -> str:
        """Call ``make`` until it returns a name not used before (case-insensitively); reserve and return it."""
        for _ in range(tries):
            name = make()
            key = name.lower()
            if key not in self._used:
                self._used.add(key)
                return name
        raise RuntimeError("name space exhausted; raise the syllable count" if tries > 1 else
                           f"name {make()!r} is already taken")

    @staticmethod
    def join(stem: str, suffix: str) -> str:
        """Glue a suffix to a stem, dropping the stem's final vowels when the suffix starts with one."""
        if suffix[:1] in "aeiou":
            stem = stem.rstrip("aeiou") or stem
        return stem + suffix

    def _adjective(self) -> str:
        def make() -> str:
            return self.join(self.stem(self.rng.choice((1, 2))), self.rng.choice(ADJECTIVE_ENDINGS))

        adj = make()
        while len(adj) < 6:  # short ones too often spell real words ("near")
            adj = make()
        return adj

    # ------------------------------------------------------------------ kinds of names
    def disease(self) -> str:
        def make() -> str:
            if self.rng.random() < 0.7:
                return self.join(self.stem(2), self.rng.choice(DISEASE_SUFFIXES)).capitalize()
            return f"{self.stem(2).capitalize()} {self.rng.choice(DISEASE_WORDS)}"

        return self._claim(make)

    def twin(self, name: str) -> str:
        """A near-namesake of a disease name: the same first word with another disease word ("Brakel fever" ->
        "Brakel palsy"), or the same stem with another suffix ("Brakosis" -> "Brakitis")."""

        def make() -> str:
            if " " in name:
                return f"{name.split(' ', 1)[0]} {self.rng.choice(DISEASE_WORDS)}"
            stem = next((name[: -len(x)] for x in DISEASE_SUFFIXES if name.endswith(x)), name)
            return self.join(stem.lower(), self.rng.choice(DISEASE_SUFFIXES)).capitalize()

        try:
            return self._claim(make, tries=50)
        except RuntimeError:  # every variant taken: an unrelated name
            return self.disease()

    def abbreviation(self, name: str) -> str:
        """An upper-case abbreviation of three of a name's consonants, with a number once the short ones are
        taken."""
        letters = [c for c in name.upper() if c.isalpha() and c not in "AEIOU"] or list(name.upper())
        tries = [0]

        def make() -> str:
            tries[0] += 1
            picked = sorted(self.rng.sample(range(len(letters)), min(3, len(letters))))
            short = "".join(letters[i] for i in picked)
            return short if tries[0] <= 5 else f"{short}-{self.rng.randint(2, 99)}"

        return self._claim(make)

    def eponym(self) -> str:
        return self._claim(lambda: f"{self.stem(2).capitalize()}'s {self.rng.choice(DISEASE_WORDS)}")

    def drug_code(self) -> str:
        """A development code ("KX-4417")."""
        return self._claim(lambda: "".join(self.rng.choice("BCDFGKLMNPRSTVXZ") for _ in range(2))
                           + f"-{self.rng.randint(100, 9999)}")

    def brand(self) -> str:
        return self._claim(lambda: self.join(self.stem(2), self.rng.choice(("ex", "ia", "on", "yl"))).capitalize())

    def drug(self) -> str:
        return self._claim(lambda: self.join(self.stem(2), self.rng.choice(DRUG_SUFFIXES)).capitalize())

    def drug_class(self) -> str:
        return self._claim(lambda: self.join(self.stem(2), "oid agents"))

    def gene(self) -> str:
        def make() -> str:
            letters = [c for c in self.stem(3).upper() if c not in "AEIOU"]
            return "".join(letters[:4]) + str(self.rng.randint(1, 9))

        return self._claim(make)

    def protein(self) -> str:
        return self._claim(lambda: f"{self.stem(2).capitalize()} {self.rng.choice(PROTEIN_KINDS)}")

    def pathway(self) -> str:
        return self._claim(lambda: f"{self.stem(2).capitalize()} {self.rng.choice(PATHWAY_WORDS)}")

    def symptom(self) -> str:
        return self._claim(lambda: f"{self._adjective()} {self.rng.choice(SYMPTOM_NOUNS)}")

    def finding(self) -> str:
        def make() -> str:
            tpl = self.rng.choice(FINDING_TEMPLATES)
            return tpl.format(Person=self.stem(2).capitalize(), adj=self._adjective())

        return self._claim(make)

    def person(self) -> str:
        return self._claim(lambda: self.stem(2).capitalize())

    def place(self) -> str:
        return self._claim(lambda: self.join(self.stem(2), self.rng.choice(PLACE_ENDINGS)).capitalize())

    def outcome(self, finding: str) -> str:
        """An outcome measure; not reserved (several trials may share a measure)."""
        return self.rng.choice(
            (
                "relapse rate",
                "symptom score",
                "hospital admissions",
                "time to recovery",
                f"{finding} severity",
            )
        )
