"""The rules of entity resolution (canopy.aliases, canopy.ids.entity_key), on tiny inputs."""

from __future__ import annotations

from collections import Counter

import pytest

from canopy.aliases import (
    Alias,
    alias_rule,
    display_name,
    document_links,
    merged_names,
    unit_aliases,
)
from canopy.ids import entity_id, entity_key, fold_key, relationship_id
from canopy.model import EntityInstance, Extraction, RelationshipInstance
from canopy.store.instances import extraction_rows, rekeyed


class TestNameForms:
    @pytest.mark.parametrize(("a", "b"), [
        ("Open AI", "OpenAI"), ("Helio Cells, Ltd.", "HELIO CELLS LTD"), ("Zürich", "Zurich"),
        ("Apple Inc.", "Apple Inc"), ("The Beatles", "Beatles"), ("Hans-Adam", "Hans Adam"),
    ])
    def test_forms_of_one_name_share_a_key(self, a: str, b: str) -> None:
        assert entity_key(a) == entity_key(b) and entity_id(a) == entity_id(b)

    @pytest.mark.parametrize(("a", "b"), [
        ("Lothair II", "Hans-Adam II"), ("Amazon", "Amazon Web Services"), ("Co", "Inc"),
    ])
    def test_other_names_do_not(self, a: str, b: str) -> None:
        assert entity_key(a) != entity_key(b)

    def test_a_legal_form_is_part_of_the_key_but_not_of_the_fold_key(self) -> None:
        """"SoftBank Corp" is not the "SoftBank" of SoftBank Group: a document links the two."""
        assert entity_key("Apple Inc.") != entity_key("Apple")
        assert entity_key("Deutsche Bank AG") == "deutschebankag"
        assert fold_key("Apple Inc.") == fold_key("Apple") == "apple"
        assert fold_key("JPMorgan Chase & Co") == fold_key("JPMorgan Chase") == "jpmorganchase"
        assert fold_key("India Inc") != fold_key("India")

    def test_a_leading_article_is_no_part_of_the_name(self) -> None:
        assert entity_key("Johnson & Johnson") == "johnsonandjohnson"
        assert entity_key("The Project Gutenberg Literary Archive Foundation") == entity_key(
            "Project Gutenberg Literary Archive Foundation")
        assert entity_key("The") == "the"

    def test_a_country_keeps_its_legal_suffix_and_an_ampersand_reads_as_and(self) -> None:
        assert entity_key("India Inc") != entity_key("India")
        assert entity_key("Johnson & Johnson") == entity_key("Johnson and Johnson")
        assert entity_key("S&P") != entity_key("SP")

    def test_a_key_is_its_own_key_and_a_legal_form_alone_is_a_name(self) -> None:
        assert entity_key(entity_key("Sam Altman")) == entity_key("Sam Altman") == "samaltman"
        assert entity_key("Ltd") == "ltd"


class TestLinksWithinAUnit:
    def test_a_surname_stands_for_the_one_person_of_the_unit_with_it(self) -> None:
        got = unit_aliases([("Sam Altman", "person"), ("Altman", "person")])
        assert got["altman"].canonical == "samaltman" and got["altman"].rule == "surname"

    def test_a_surname_two_people_of_the_unit_share_is_left_alone(self) -> None:
        assert unit_aliases([("Travis Kelce", "person"), ("Jason Kelce", "person"),
                             ("Kelce", "person")]) == {}

    def test_a_regnal_number_or_a_place_is_no_surname(self) -> None:
        assert unit_aliases([("Lothair II", "person"), ("II", "person")]) == {}
        assert unit_aliases([("George Washington", "person"), ("Washington", "geo")]) == {}

    def test_an_initialism_of_the_one_name_it_abbreviates(self) -> None:
        got = unit_aliases([("Federal Bureau of Investigation", "organization"),
                            ("FBI", "organization"), ("U.S.", "geo"), ("United States", "geo")])
        assert {k: (a.canonical, a.rule) for k, a in got.items()} == {
            "fbi": ("federalbureauofinvestigation", "initialism"),
            "us": ("unitedstates", "initialism")}

    def test_an_initialism_is_written_in_capitals(self) -> None:
        assert unit_aliases([("Us", "organization"), ("United States", "geo")]) == {}

    def test_two_undotted_capitals_are_no_initialism(self) -> None:
        """"AI", "TD", "RW" abbreviate common words as often as a name of the unit."""
        assert unit_aliases([("Amnesty International", "organization"),
                             ("AI", "organization")]) == {}

    def test_an_honorific_and_a_surname_are_no_full_name(self) -> None:
        assert unit_aliases([("Mrs. Fezziwig", "person"), ("Fezziwig", "person")]) == {}

    def test_a_typed_organization_with_a_first_name_is_a_persons_name(self) -> None:
        got = unit_aliases([("Brian Cummins", "organization"), ("Cummins", "organization")])
        assert got["cummins"].rule == "surname"

    def test_a_first_name_stands_for_the_one_person_of_the_unit_with_it(self) -> None:
        got = unit_aliases([("Alicia Huberman", "person"), ("Alicia", "person")])
        assert got["alicia"].canonical == "aliciahuberman" and got["alicia"].rule == "given name"

    def test_a_clipped_first_word_links_only_when_one_name_has_it(self) -> None:
        fed = unit_aliases([("Federal Reserve", "organization"), ("Fed", "organization")])
        assert fed["fed"].canonical == "federalreserve" and fed["fed"].rule == "abbreviation"
        assert unit_aliases([("Federal Reserve", "organization"), ("Fed", "organization"),
                             ("Federal Bureau of Investigation", "organization")]) == {}
        assert unit_aliases([("Apple", "organization"), ("Applebee's Grill", "organization")]) == {}

    def test_a_word_in_capitals_gives_all_its_letters_to_an_initialism(self) -> None:
        assert unit_aliases([("CLL Tests", "organization"), ("CLT", "organization")]) == {}
        names = [("CLL Tests", "organization"), ("CLLT", "organization")]
        assert unit_aliases(names)["cllt"].canonical == "clltests"

    def test_a_hyphenated_word_is_no_full_name(self) -> None:
        assert unit_aliases([("High-grade", "person"), ("Grade", "person")]) == {}
        assert unit_aliases([("Catherine Zeta-Jones", "person"), ("Jones", "person")]) == {}

    def test_a_two_word_name_is_a_persons_when_its_surname_alone_is_typed_one(self) -> None:
        # the extractor typed the full name an organization; no known first name
        names = [("Shohei Ohtani", "organization"), ("Ohtani", "person")]
        assert unit_aliases(names)["ohtani"].canonical == "shoheiohtani"
        # but not a longer one, nor when neither is typed a person
        assert unit_aliases([("Early-Stage Prostate Cancer", "organization"),
                             ("Cancer", "person")]) == {}
        assert unit_aliases([("Crystal Palace", "organization"),
                             ("Palace", "organization")]) == {}

    def test_a_surname_typed_otherwise_still_stands_for_a_person_typed_so(self) -> None:
        names = [("Dick Wilkins", "person"), ("Wilkins", "organization")]
        assert unit_aliases(names)["wilkins"].canonical == "dickwilkins"

    def test_the_rule_that_linked_a_name_is_recomputed_from_the_pair(self) -> None:
        assert alias_rule("Altman", "Sam Altman", "person", "person") == "surname"
        assert alias_rule("Open AI", "OpenAI") == "form"
        assert alias_rule("Altman", "Lisbon", "person", "geo") == ""


class TestInstanceRows:
    def test_a_units_instances_relationships_and_claims_take_the_linked_key(self) -> None:
        ex = Extraction("tu-1", (EntityInstance("Sam Altman", "person", "CEO"),
                                 EntityInstance("Altman", "person", "spoke"),
                                 EntityInstance("Lisbon", "geo", "city")),
                        (RelationshipInstance("Altman", "Lisbon", "visited"),
                         RelationshipInstance("Sam Altman", "Altman", "same")))
        rows = extraction_rows(ex)
        assert [(r[2], r[3]) for r in rows.entities] == [
            ("samaltman", "Sam Altman"), ("samaltman", "Altman"), ("lisbon", "Lisbon")]
        # the self-loop the link makes is dropped; the other ends on the linked key
        assert [(r[3], r[4]) for r in rows.relationships] == [("lisbon", "samaltman")]

    def test_the_entity_keeps_its_own_name_and_lists_the_merged_one(self) -> None:
        assert display_name(Counter({"Altman": 5, "Sam Altman": 1}), "samaltman") == "Sam Altman"
        got = merged_names("samaltman", [("Sam Altman", "person", "tu-1"),
                                         ("Altman", "person", "tu-1"),
                                         ("Altman", "person", "tu-2")])
        assert [(m.name, m.rule, m.text_unit_ids) for m in got] == [
            ("Altman", "surname", ("tu-1", "tu-2"))]


class TestLinksWithinADocument:
    def test_a_short_form_links_to_the_long_name_of_another_unit_of_its_document(self) -> None:
        links = document_links([
            ("tu-1", [("Federal Bureau of Investigation", "organization",
                       "federalbureauofinvestigation"), ("Maria Okafor", "person", "mariaokafor")]),
            ("tu-2", [("FBI", "organization", "fbi"), ("Okafor", "person", "okafor"),
                      ("Oslo", "geo", "oslo")])])
        assert {u: {k: (a.canonical, a.rule) for k, a in ls.items()}
                for u, ls in links.items()} == {
            "tu-2": {"fbi": ("federalbureauofinvestigation", "initialism"),
                     "okafor": ("mariaokafor", "surname")}}

    def test_a_short_form_with_two_candidates_in_the_document_is_left_alone(self) -> None:
        # each unit's own link stands; the unit naming neither brother links to neither
        links = document_links([
            ("tu-1", [("Travis Kelce", "person", "traviskelce"),
                      ("Kelce", "person", "traviskelce")]),
            ("tu-2", [("Jason Kelce", "person", "jasonkelce"),
                      ("Kelce", "person", "jasonkelce")]),
            ("tu-3", [("Kelce", "person", "kelce")])])
        assert links == {}

    def test_a_units_own_link_wins_over_its_documents(self) -> None:
        # "FBI" of tu-2 is linked by its unit (a confirmed pair): the document leaves it
        links = document_links([
            ("tu-1", [("Federal Bureau of Investigation", "organization",
                       "federalbureauofinvestigation")]),
            ("tu-2", [("FBI", "organization", "fbiagents")])])
        assert links == {}

    def test_rows_take_the_documents_keys_and_a_self_loop_is_set_aside(self) -> None:
        links = document_links([
            ("tu-1", [("Maria Okafor", "person", "mariaokafor")]),
            ("tu-2", [("Okafor", "person", "okafor"), ("Maria Okafor", "person", "mariaokafor"),
                      ("Oslo", "geo", "oslo")])])
        rid = relationship_id("okafor", "oslo")
        loop = relationship_id("mariaokafor", "okafor")
        got = rekeyed(links,
                      [("tu-2", 0, "okafor", "okafor"), ("tu-2", 2, "oslo", "oslo")],
                      [("tu-2", 0, rid, "okafor", "oslo", "okafor", "oslo"),
                       ("tu-2", 1, loop, "mariaokafor", "okafor", "mariaokafor", "okafor")],
                      [("tu-2", 0, "okafor", "", "okafor", "")])
        assert got.entities == [("mariaokafor", "tu-2", 0)]
        assert got.relationships == [
            (relationship_id("mariaokafor", "oslo"), "mariaokafor", "oslo", "tu-2", 0),
            ("", "mariaokafor", "mariaokafor", "tu-2", 1)]  # not merged while the link holds
        assert got.claims == [("mariaokafor", "", "tu-2", 0)]
        assert got.units == {"tu-2"} and {"okafor", "mariaokafor"} <= got.keys
        assert got.rids == {rid, loop, relationship_id("mariaokafor", "oslo")}
        # without the link (the long name's unit edited away) the unit keys come back
        back = rekeyed({}, [("tu-2", 0, "mariaokafor", "okafor")],
                       [("tu-2", 1, "", "mariaokafor", "mariaokafor", "mariaokafor", "okafor")],
                       [])
        assert back.entities == [("okafor", "tu-2", 0)]
        assert back.relationships == [(loop, "mariaokafor", "okafor", "tu-2", 1)]

    def test_a_short_form_in_use_before_the_long_name_is_written_stays_apart(self) -> None:
        # tu-2's unit links its own "PCP"; the document leaves tu-1's, written before the name
        units = [("tu-1", [("PCP", "organization", "pcp")]),
                 ("tu-2", [("Primary Care Physician", "organization", "primarycarephysician"),
                           ("PCP", "organization", "primarycarephysician")])]
        assert unit_aliases([(n, t) for n, t, _ in units[1][1]])["pcp"].rule == "initialism"
        assert document_links(units) == {}
        # written after the name, it stands for it
        got = document_links(units[::-1])
        assert {u: ls["pcp"].canonical for u, ls in got.items()} == {
            "tu-1": "primarycarephysician"}

    def test_two_capitals_stand_for_a_name_only_where_every_unit_writing_them_writes_it(
            self) -> None:
        eu = [("tu-1", [("European Union", "organization", "europeanunion"), ("EU", "geo", "eu")]),
              ("tu-2", [("EU", "geo", "eu"), ("European Union", "organization", "europeanunion")])]
        got = document_links(eu)
        assert {u: ls["eu"].canonical for u, ls in got.items()} == {
            "tu-1": "europeanunion", "tu-2": "europeanunion"}
        # a unit writing "AI" without the name: the common abbreviation, everywhere
        ai = [("tu-1", [("Amnesty International", "organization", "amnestyinternational"),
                        ("AI", "organization", "ai")]),
              ("tu-2", [("AI", "organization", "ai")])]
        assert document_links(ai) == {}
        # the unit rules alone never take two capitals for an initialism
        assert unit_aliases([(n, t) for n, t, _ in eu[0][1]]) == {}
        assert alias_rule("EU", "European Union") == "initialism"

    def test_a_name_and_its_legal_form_are_one_company_in_a_document_writing_both(self) -> None:
        units = [("tu-1", [("Intel Corp", "organization", "intelcorp")]),
                 ("tu-2", [("Intel", "organization", "intel"),
                           ("Intel Corporation", "organization", "intelcorporation")])]
        got = document_links(units)
        assert {u: {k: (a.canonical, a.rule) for k, a in ls.items()}
                for u, ls in got.items()} == {
            "tu-1": {"intelcorp": ("intel", "legal form")},
            "tu-2": {"intelcorporation": ("intel", "legal form")}}
        # without the bare name, the legal forms are one name, the shortest
        got = document_links([units[0], ("tu-2", units[1][1][1:])])
        assert got == {"tu-2": {"intelcorporation": Alias("intelcorporation", "intelcorp",
                                                          "legal form")}}
        # a document writing one form only links nothing: another's "Intel" stays apart
        assert document_links([units[0]]) == {}
        assert alias_rule("Intel Corp", "Intel") == "legal form"

    def test_a_bare_name_beside_its_parent_company_is_left_alone(self) -> None:
        """"SoftBank" beside "SoftBank Corp" and "SoftBank Group" could be either company."""
        units = [("tu-1", [("SoftBank Corp", "organization", "softbankcorp"),
                           ("SoftBank Group", "organization", "softbankgroup"),
                           ("SoftBank", "organization", "softbank")])]
        assert document_links(units) == {}

    def test_a_generational_suffix_is_one_person_in_a_document_writing_both(self) -> None:
        units = [("tu-1", [("Floyd Mayweather Jr.", "person", "floydmayweatherjr")]),
                 ("tu-2", [("Floyd Mayweather", "person", "floydmayweather")])]
        assert document_links(units) == {"tu-1": {"floydmayweatherjr": Alias(
            "floydmayweatherjr", "floydmayweather", "generational suffix")}}
        assert alias_rule("Floyd Mayweather Jr", "Floyd Mayweather") == "generational suffix"
        # written with one form only, another document's "Floyd Mayweather" stays apart
        assert document_links(units[:1]) == {}
        # beside "Floyd Mayweather Sr" the bare name could be the father or the son
        sr = ("tu-3", [("Floyd Mayweather Sr", "person", "floydmayweathersr")])
        assert document_links([*units, sr]) == {}
        # a numeral is no generational suffix: a sequel, or a king of his own
        assert document_links([("tu-1", [("Exorcist III", "other", "exorcistiii"),
                                         ("Exorcist", "other", "exorcist")])]) == {}
        assert alias_rule("Exorcist III", "Exorcist") == ""

    def test_a_link_to_a_legal_form_ends_on_the_bare_name(self) -> None:
        # tu-2's "HCL" was linked by its unit (a confirmed pair) to the legal form
        units = [("tu-1", [("Helio Cells Ltd", "organization", "heliocellsltd")]),
                 ("tu-2", [("Helio Cells", "organization", "heliocells"),
                           ("HCL", "organization", "heliocellsltd")])]
        got = document_links(units)
        assert {u: {k: a.canonical for k, a in ls.items()} for u, ls in got.items()} == {
            "tu-1": {"heliocellsltd": "heliocells"}, "tu-2": {"heliocellsltd": "heliocells"}}

    def test_a_link_of_the_document_lists_the_units_holding_the_long_name(self) -> None:
        instances = [("Maria Okafor", "person", "tu-1"), ("Okafor", "person", "tu-2"),
                     ("Maria Okafor", "person", "tu-9"), ("Okafor", "person", "tu-9")]
        documents = {"tu-1": "doc-a", "tu-2": "doc-a", "tu-9": "doc-b"}
        got = merged_names("mariaokafor", instances, documents)
        # tu-2's link is its document's: its evidence is tu-1; tu-9 is its own evidence
        assert [(m.name, m.rule, m.text_unit_ids) for m in got] == [
            ("Okafor", "surname", ("tu-1", "tu-2", "tu-9"))]
        # a caller who cannot read doc-b sees the link doc-a supports, with its evidence
        got = merged_names("mariaokafor", instances[:2], documents)
        assert [m.text_unit_ids for m in got] == [("tu-1", "tu-2")]


def _every_pair(names: list[tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """unit_aliases by brute force: every short form against every long form of the unit
    (what its index of long forms by word must agree with)."""
    from canopy import aliases as al

    forms: dict[str, al._Form] = {}
    for pos, (name, type_) in enumerate(names):
        key = entity_key(name)
        if key:
            f = forms.setdefault(key, al._Form(key, al.key_words(name), name.strip(), Counter(),
                                               pos))
            f.types[type_.strip().lower()] += 1
    out = {}
    for short in forms.values():
        initialism = al._is_initialism(short.written)
        if len(short.words) != 1 and not initialism:
            continue
        found = {}
        for long in forms.values():
            if len(long.words) < 2 or long.key == short.key:
                continue
            if initialism:
                if short.key in al._initials(long.words, long.written):
                    found[long.key] = al.INITIALISM
            elif al._surname(short, long):
                found[long.key] = al.SURNAME
            elif al._given_name(short, long):
                found[long.key] = al.GIVEN_NAME
            elif al._abbreviation(short, long):
                found[long.key] = al.ABBREVIATION
        if len(found) == 1:
            out[short.key] = next(iter(found.items()))
    return out


_WORDS = ["Sam", "Altman", "Federal", "Fed", "Reserve", "Bureau", "of", "Investigation", "FBI",
          "Mrs.", "Alicia", "Huberman", "II", "Jr", "Bank", "America", "BoA", "Travis", "Kelce",
          "Jason", "Ltd", "Fede", "U.S.", "United", "States"]


def test_the_indexed_rules_link_what_testing_every_pair_links() -> None:
    import random

    rng = random.Random(7)
    for _ in range(3000):
        names = [(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 4))),
                  rng.choice(["person", "organization", "geo", "event"]))
                 for _ in range(rng.randint(2, 12))]
        got = {k: (a.canonical, a.rule) for k, a in unit_aliases(names).items()}
        assert got == _every_pair(names), names
