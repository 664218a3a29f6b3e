"""The rules of entity resolution (canopy.aliases, canopy.ids.entity_key), on tiny inputs."""

from __future__ import annotations

from collections import Counter

import pytest

from canopy.aliases import alias_rule, display_name, merged_names, unit_aliases
from canopy.ids import entity_id, entity_key
from canopy.model import EntityInstance, Extraction, RelationshipInstance
from canopy.store.instances import extraction_rows


class TestNameForms:
    @pytest.mark.parametrize(("a", "b"), [
        ("Open AI", "OpenAI"), ("Helio Cells, Ltd.", "HELIO CELLS"), ("Zürich", "Zurich"),
        ("Apple Inc.", "Apple"), ("Deutsche Bank AG", "Deutsche Bank"), ("Hans-Adam", "Hans Adam"),
    ])
    def test_forms_of_one_name_share_a_key(self, a: str, b: str) -> None:
        assert entity_key(a) == entity_key(b) and entity_id(a) == entity_id(b)

    @pytest.mark.parametrize(("a", "b"), [
        ("Lothair II", "Hans-Adam II"), ("Amazon", "Amazon Web Services"), ("Co", "Inc"),
    ])
    def test_other_names_do_not(self, a: str, b: str) -> None:
        assert entity_key(a) != entity_key(b)

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
                if short.key in al._initials(long.words):
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
