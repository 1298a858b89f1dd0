"""Corpus loaders (book, guideline, wiki, graph): our fixtures in the realdata layout, malformed input, real files.

Fixtures under tests/fixtures/corpora are invented text laid out like shared/realdata. The real-data tests read the
folder named by OMNIMED_REALDATA and skip when it is unset.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from omnimed.data.errors import LoadReport, RecordError
from omnimed.data.loaders.graph_corpus import load_graph
from omnimed.data.loaders.hetionet import read_hetionet
from omnimed.data.loaders.ngc_dates import DateEvent, parse_ngc_date
from omnimed.data.loaders.obo import parse_obo
from omnimed.data.loaders.realdata import load_realdata
from omnimed.data.loaders.realdata_layout import (
    BOOK_FILE,
    DO_OBO,
    GUIDELINE_FILE,
    HETIONET_EDGES,
    HETIONET_NODES,
    WIKI_FILE,
)
from omnimed.data.loaders.text_corpora import EMPTY_TEXT, load_book, load_guideline, load_wiki

FIX = Path(__file__).parent / "fixtures" / "corpora"


def by_id(passages):
    return {p.id: p for p in passages}


def write_lines(path: Path, lines: list[str], newline: str = "\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("".join(line + newline for line in lines).encode("utf-8"))
    return path


# ---------------------------------------------------------------------------------------------- book
def test_book_passages_carry_kind_title_parent_authority():
    report = LoadReport()
    passages = by_id(load_book(FIX, report=report))
    assert sorted(passages) == ["m1001-0", "m1001-1", "m1003-0"]
    compact = passages["m1001-0"]
    assert compact.source == "book"
    assert compact.title == "Bone Structure — Compact Bone"
    assert compact.parent_id == "m1001"
    assert compact.authority == "OpenStax"
    assert compact.date is None
    assert compact.metadata["chapter"] == "Bone Tissue"
    assert passages["m1003-0"].title == "Neurons"  # module and section titles equal: said once


def test_book_line_with_u2028_stays_one_record():
    passages = by_id(load_book(FIX))
    text = passages["m1001-0"].text
    assert "\u2028" in text and text.endswith("along the shaft.")
    assert len(passages) == 3  # the U+2028 did not split a line into two broken records


def test_book_empty_section_is_left_out_and_counted_not_an_error():
    report = LoadReport()
    load_book(FIX, report=report)
    assert report.read == 3 and report.n_skipped == 0
    assert report.excluded == {EMPTY_TEXT: 1}


@pytest.mark.parametrize(
    "where",
    ["", "book", "book/osbooks-anatomy-physiology", "book/osbooks-anatomy-physiology/derived", BOOK_FILE],
)
def test_book_accepts_file_or_any_folder_of_the_layout(where):
    assert len(load_book(FIX / where)) == 3


def test_missing_corpus_names_what_was_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="ap2e_sections.jsonl"):
        load_book(tmp_path)


# ---------------------------------------------------------------------------------------------- guideline
def test_guideline_passages():
    passages = by_id(load_guideline(FIX))
    first = passages["ngc-1"]
    assert first.source == "guideline"
    assert first.title == "Screening adults for raised blood pressure."
    assert first.date == "2013-11"
    assert first.authority == "Example Society of Cardiology"
    assert first.text == (
        "Summary\nMeasure blood pressure in every adult at least once a year.\n"
        "Confirm a raised reading outside the clinic."
    )
    assert first.metadata["developers"][1] == {
        "name": "Example Nurses Network",
        "type": "Professional Association",
    }
    assert first.metadata["category"] == ["Screening", "Prevention"]
    assert first.metadata["conditions"] == "Hypertension"


def test_guideline_date_is_the_version_date_and_history_is_kept():
    second = by_id(load_guideline(FIX))["ngc-2"]
    assert second.date == "2009-10"  # revised 2009 Oct-Dec; the 2014 reaffirmation did not change the text
    assert second.metadata["date_history"] == [
        ["released", "2005-03-14"],
        ["revised", "2009-10"],
        ["reaffirmed", "2014"],
    ]
    assert second.authority == "Head - and - Neck Example Foundation"  # only the last " - " ends the name


def test_guideline_unparseable_date_is_kept_not_an_error():
    undated = by_id(load_guideline(FIX))["ngc-3"]
    assert undated.date is None
    assert undated.metadata["date_released"] == "sometime in spring"
    assert undated.authority is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2013 Nov", [("released", "2013-11")]),
        ("2013", [("released", "2013")]),
        ("2013 Feb 7", [("released", "2013-02-07")]),
        ("2017 Sept 12", [("released", "2017-09-12")]),
        ("2014 Apr-Jun", [("released", "2014-04")]),
        ("2011 May (revised 2013 Aug)", [("released", "2011-05"), ("revised", "2013-08")]),
        (
            "1998 Mar (revised Aug 2010; republished 2011 Jun)",
            [("released", "1998-03"), ("revised", "2010-08"), ("republished", "2011-06")],
        ),
        (
            "2010 Aug 10; addenda released 2014 Jul 20 and 2016 May 10",
            [
                ("released", "2010-08-10"),
                ("addenda released", "2014-07-20"),
                ("addenda released", "2016-05-10"),
            ],
        ),
    ],
)
def test_parse_ngc_date(raw, expected):
    assert parse_ngc_date(raw) == [DateEvent(e, d) for e, d in expected]


@pytest.mark.parametrize("raw", ["", "spring 2013", "2013 Feb 30", "2013 Novembre", "13 Nov"])
def test_parse_ngc_date_is_strict(raw):
    assert parse_ngc_date(raw) is None


# ---------------------------------------------------------------------------------------------- wiki
def test_wiki_passages():
    report = LoadReport()
    passages = by_id(load_wiki(FIX, report=report))
    gout = passages["0000001-1"]
    assert gout.source == "wiki"
    assert gout.title == "Gout"
    assert gout.parent_id == "0000001"
    assert gout.authority == "ExampleHealth"
    assert gout.url == "https://example.org/gout"
    assert "\u2028" in gout.text and gout.text.endswith("big toe.")
    assert gout.metadata["cui"] == ["C0018099"]
    assert gout.metadata["qtype"] == "information"
    assert report.read == 3 and report.n_skipped == 0 and report.excluded == {EMPTY_TEXT: 1}


def test_wiki_normalises_cui_strings_and_repeated_ids():
    passages = by_id(load_wiki(FIX))
    treatment = passages["0000001-2"]
    assert treatment.metadata["cui"] == []  # the string "[]"
    assert treatment.metadata["semantic_type"] == ["T047", "T033"]
    repeat = passages["0000001-1#2"]  # MedQuAD reuses ids; the later one is suffixed, the raw id kept
    assert repeat.metadata["medquad_id"] == "0000001-1"
    assert repeat.title == "what is gout?"  # empty focus falls back to the question
    assert repeat.authority == "OtherSite"


# ---------------------------------------------------------------------------------------------- malformed JSONL
def test_missing_field_names_file_line_field(tmp_path):
    good = {"id": "a", "module": "m", "module_title": "T", "section_title": "S", "text": "ok"}
    file = write_lines(tmp_path / BOOK_FILE, [json.dumps(good), json.dumps({"id": "b", "module": "m"})])
    with pytest.raises(RecordError) as err:
        load_book(tmp_path)
    assert (err.value.path, err.value.line, err.value.field) == (str(file), 2, "text")
    assert "expected a string" in str(err.value) and f"{file}:2" in str(err.value)


def test_wrong_type_names_field_and_expectation(tmp_path):
    row = {"id": "1", "doc_id": "d", "source": "S", "url": "u", "focus": "F", "cui": 7, "answer": "x"}
    write_lines(tmp_path / WIKI_FILE, [json.dumps(row)])
    with pytest.raises(RecordError, match=r":1: field 'cui': expected a list of strings"):
        load_wiki(tmp_path)


def test_skip_invalid_counts_bad_records_and_bad_json_and_goes_on(tmp_path):
    ok = {
        "id": "g1",
        "title": "T",
        "recommendations": "Do this.",
        "date_released": "2001",
        "developer": "D - X",
    }
    lines = [
        json.dumps(ok),
        "{not json",
        json.dumps({**ok, "id": "g2", "recommendations": ["a list"]}),
        json.dumps([1, 2]),
        json.dumps({**ok, "id": "g3"}),
    ]
    write_lines(tmp_path / GUIDELINE_FILE, lines)
    with pytest.raises(RecordError, match=":2: invalid JSON"):
        load_guideline(tmp_path)
    report = LoadReport()
    passages = load_guideline(tmp_path, skip_invalid=True, report=report)
    assert [p.id for p in passages] == ["g1", "g3"]
    assert [(s.line, s.field) for s in report.skipped] == [(2, None), (3, "recommendations"), (4, None)]
    assert report.read == 2


def test_unknown_option_is_refused():
    with pytest.raises(TypeError, match="max_relations"):
        load_book(FIX, max_relations=3)


# ---------------------------------------------------------------------------------------------- graph structures
def test_parse_obo_terms_escapes_obsolete_and_aliases():
    onto = parse_obo(FIX / "graph")
    assert sorted(c.id for c in onto.concepts.values()) == ["DOID:4", "DOID:9000", "DOID:9003", "DOID:9006"]
    assert onto.info["obsolete"] == 1 and onto.info["date"] == "2020-02-03"
    heart = onto.concepts["Disease::DOID:9000"]
    assert heart.definition == 'A "made-up" disease of the heart\\muscle, written for tests.'
    assert heart.synonyms == ["EHD", 'cardio "example" syndrome']
    assert heart.xrefs == ["MESH:D000000", "UMLS_CUI:C0000000"]
    assert onto.concepts["Disease::DOID:9003"].definition is None
    assert onto.aliases == {
        "Disease::DOID:9001": "Disease::DOID:9000",
        "Disease::DOID:9005": "Disease::DOID:9006",
    }
    assert [(t.subject, t.relation, t.object) for t in onto.triples] == [
        ("Disease::DOID:9000", "is_a", "Disease::DOID:4"),
        ("Disease::DOID:9003", "is_a", "Disease::DOID:9000"),
        ("Disease::DOID:9006", "is_a", "Disease::DOID:4"),
    ]


def test_read_hetionet_nodes_and_edges():
    graph = read_hetionet(FIX)
    assert len(graph.concepts) == 7
    assert graph.concepts["Gene::1234"].name == "EXG1"
    rels = {(t.subject, t.relation, t.object) for t in graph.triples}
    assert ("Compound::DB00001", "treats", "Disease::DOID:9000") in rels  # CRLF file, relation from its name
    assert ("Disease::DOID:9000", "localizes", "Anatomy::UBERON:0000948") in rels
    assert len(graph.triples) == 5


def test_graph_passage_has_definition_and_typed_relations():
    passages = by_id(load_graph(FIX / "graph"))
    heart = passages["Disease::DOID:9000"]
    assert heart.source == "graph" and heart.title == "example heart disease"
    lines = heart.text.split("\n")
    assert lines[0] == 'A "made-up" disease of the heart\\muscle, written for tests.'
    assert lines[1:] == [
        "example heart disease | is_a | disease",
        "Examplazole | treats | example heart disease",
        "Samplomycin | treats | example heart disease",
        "example heart disease | localizes | heart",
        "example heart disease | associates | EXG1",
        "example valve disease | is_a | example heart disease",
    ]
    meta = heart.metadata
    assert meta["concept_id"] == "DOID:9000" and meta["kind"] == "Disease"
    assert meta["synonyms"] == ["EHD", 'cardio "example" syndrome']
    assert ["treated_by", "Compound::DB00001", "Examplazole"] in meta["relations"]
    assert ["has_subtype", "Disease::DOID:9003", "example valve disease"] in meta["relations"]
    assert meta["n_relations"] == 6
    assert heart.authority == "Disease Ontology; Hetionet"
    assert heart.date == "2020-02-03"
    assert heart.url == "http://purl.obolibrary.org/obo/DOID_9000"


def test_graph_matches_hetionet_disease_through_do_alt_id():
    passages = by_id(load_graph(FIX))
    fever = passages["Disease::DOID:9006"]
    assert "Disease::DOID:9005" not in passages
    assert fever.metadata["alt_ids"] == ["DOID:9005"]
    assert "Examplazole | treats | example fever" in fever.text
    assert fever.text.startswith("A fever with no cause")


def test_graph_skips_obsolete_and_unrelated_concepts():
    passages = by_id(load_graph(FIX))
    assert "Disease::DOID:9002" not in passages  # obsolete
    assert "Symptom::D000001" not in passages  # no definition, no relations
    assert passages["Compound::DB00001"].text.split("\n") == [
        "Examplazole | treats | example fever",
        "Examplazole | treats | example heart disease",
    ]
    assert (
        passages["Compound::DB00001"].authority == "Hetionet" and passages["Compound::DB00001"].date is None
    )


def test_graph_relation_cap_is_deterministic():
    one = by_id(load_graph(FIX, max_relations=2))["Disease::DOID:9000"]
    assert one.text.split("\n")[1:] == [
        "example heart disease | is_a | disease",
        "Examplazole | treats | example heart disease",
    ]
    assert len(one.metadata["relations"]) == 2 and one.metadata["n_relations"] == 6
    assert load_graph(FIX, max_relations=2) == load_graph(FIX, max_relations=2)


# ---------------------------------------------------------------------------------------------- malformed graph
def copy_graph(tmp_path: Path) -> Path:
    """A writable copy of the fixture graph folder."""
    for src in (FIX / "graph").rglob("*"):
        if src.is_file():
            dst = tmp_path / "graph" / src.relative_to(FIX / "graph")
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    return tmp_path / "graph"


def test_obo_unterminated_def_names_line_and_field(tmp_path):
    obo = write_lines(
        tmp_path / "doid.obo", ["[Term]", "id: DOID:1", "name: x", 'def: "never closed [url:a]']
    )
    with pytest.raises(RecordError) as err:
        parse_obo(obo)
    assert (err.value.line, err.value.field) == (4, "def")
    assert "expected a quoted string" in str(err.value)


def test_obo_term_without_name_is_skippable(tmp_path):
    obo = write_lines(
        tmp_path / "doid.obo", ["[Term]", "id: DOID:1", "", "[Term]", "id: DOID:2", "name: two"]
    )
    with pytest.raises(RecordError, match=r"doid.obo:1: field 'name': missing"):
        parse_obo(obo)
    report = LoadReport()
    onto = parse_obo(obo, skip_invalid=True, report=report)
    assert list(onto.concepts) == ["Disease::DOID:2"] and report.n_skipped == 1


def test_edge_to_unknown_node_names_file_line_column(tmp_path):
    graph = copy_graph(tmp_path)
    edges = graph / HETIONET_EDGES / "Disease_Associates_Gene.tsv"
    write_lines(edges, [":START_ID(Disease)\t:END_ID(Gene)", "DOID:9000\t1234", "DOID:9000\t999"], "\r\n")
    with pytest.raises(RecordError) as err:
        load_graph(graph)
    assert (err.value.path, err.value.line, err.value.field) == (str(edges), 3, ":END_ID(Gene)")
    report = LoadReport()
    passages = load_graph(graph, skip_invalid=True, report=report)
    assert report.n_skipped == 1 and "Disease::DOID:9000" in by_id(passages)


def test_short_node_row_is_an_error(tmp_path):
    graph = copy_graph(tmp_path)
    nodes = graph / HETIONET_NODES
    write_lines(nodes, ["id\tname\tkind", "Gene::1234\tEXG1"])
    with pytest.raises(RecordError, match=r"hetionet-v1.0-nodes.tsv:2: expected 3 tab-separated columns"):
        read_hetionet(graph)


# ---------------------------------------------------------------------------------------------- all at once
def test_load_realdata_on_fixtures():
    reports: dict[str, LoadReport] = {}
    corpora = load_realdata(FIX, reports=reports)
    assert {k: len(v) for k, v in corpora.items()} == {"book": 3, "guideline": 3, "wiki": 3, "graph": 8}
    assert all(p.source == kind for kind, ps in corpora.items() for p in ps)
    assert reports["book"].excluded == reports["wiki"].excluded == {EMPTY_TEXT: 1}
    assert all(r.n_skipped == 0 for r in reports.values())


# ---------------------------------------------------------------------------------------------- real data
REALDATA = os.environ.get("OMNIMED_REALDATA")
real = pytest.mark.skipif(not REALDATA, reason="OMNIMED_REALDATA is not set (point it at shared/realdata)")


@pytest.fixture(scope="module")
def realdata() -> Path:
    root = Path(REALDATA or "")
    if not (root / "MANIFEST.md").exists():
        pytest.skip(f"OMNIMED_REALDATA={REALDATA!r} has no MANIFEST.md")
    return root


@pytest.fixture(scope="module")
def real_graph(realdata):
    return by_id(load_graph(realdata))


@real
@pytest.mark.realdata
def test_real_book(realdata):
    report = LoadReport()
    passages = load_book(realdata, report=report)
    assert len(passages) + report.excluded.get(EMPTY_TEXT, 0) == 965 and report.n_skipped == 0
    assert len({p.id for p in passages}) == len(passages)
    first = passages[0]
    assert (first.title, first.parent_id, first.authority) == (
        "Preface — About OpenStax",
        "m46844",
        "OpenStax",
    )


@real
@pytest.mark.realdata
def test_real_guidelines(realdata):
    passages = by_id(load_guideline(realdata))
    assert len(passages) == 1416
    first = passages["ngc-10000"]
    assert first.date == "2013-08"  # "2011 May (revised 2013 Aug)"
    assert first.authority == "British Society for Haematology Guidelines"
    assert sum(p.date is not None for p in passages.values()) == 1416


@real
@pytest.mark.realdata
def test_real_wiki(realdata):
    report = LoadReport()
    passages = load_wiki(realdata, report=report)
    assert len(passages) + report.excluded.get(EMPTY_TEXT, 0) == 16407 and report.n_skipped == 0
    assert len({p.id for p in passages}) == len(passages)
    first = passages[0]
    assert first.title == "Adult Acute Lymphoblastic Leukemia" and first.authority == "CancerGov"
    assert all(isinstance(p.metadata["cui"], list) for p in passages)


@real
@pytest.mark.realdata
def test_real_graph_sources(realdata):
    onto = parse_obo(realdata / "graph" / DO_OBO)
    assert len(onto.concepts) + onto.info["obsolete"] == 9344 and onto.info["obsolete"] == 2373
    het = read_hetionet(realdata / "graph")
    assert len(het.concepts) == 47031 and len(het.triples) == 51324


@real
@pytest.mark.realdata
def test_real_graph_concept_has_definition_and_treats(real_graph):
    t2d = real_graph["Disease::DOID:9352"]
    assert t2d.title == "type 2 diabetes mellitus"
    assert t2d.text.startswith("A diabetes mellitus that involves high blood glucose")
    assert "Metformin | treats | type 2 diabetes mellitus" in t2d.text.split("\n")
    assert "NIDDM" in t2d.metadata["synonyms"]
    assert len(t2d.metadata["relations"]) == 30 < t2d.metadata["n_relations"]
    assert real_graph["Compound::DB00331"].title == "Metformin"
    # Hetionet's DOID:9917 is an alt_id of DO's DOID:5158 (pleural cancer): one concept
    assert (
        "Disease::DOID:9917" not in real_graph
        and "DOID:9917" in real_graph["Disease::DOID:5158"].metadata["alt_ids"]
    )
    treated = [p for p in real_graph.values() if any(r[0] == "treated_by" for r in p.metadata["relations"])]
    assert (
        len(treated) == 77
    )  # Hetionet: "Compound - treats - Disease" reaches 77 diseases; none lost to the cap


def test_edge_file_without_neo4j_header_is_an_error(tmp_path):
    graph = copy_graph(tmp_path)
    write_lines(graph / HETIONET_EDGES / "Disease_Associates_Gene.tsv", ["source\ttarget", "DOID:9000\t1234"])
    with pytest.raises(
        RecordError, match=r"Disease_Associates_Gene.tsv:1: field ':START_ID': expected the header"
    ):
        read_hetionet(graph)
