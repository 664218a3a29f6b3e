"""Merging extraction instances into entity and relationship rows
(canopy.indexer.operations.merging), on a handful of instance rows."""

from __future__ import annotations

from canopy.ids import entity_id
from canopy.indexer.operations.merging import (
    entity_row,
    merge_entities,
    merge_relationships,
    relationship_row,
)
from canopy.store.reads import EntityInstanceRow, RelationshipInstanceRow


def ent(unit: str, name: str, description: str, acl: int = 1, kind: str = "person"
        ) -> EntityInstanceRow:
    return EntityInstanceRow(unit, unit, acl, name.lower(), name, kind, description)


def rel(unit: str, a: str, b: str, description: str, strength: float, acl: int = 1
        ) -> RelationshipInstanceRow:
    return RelationshipInstanceRow(unit, unit, acl, f"{a}|{b}", a, b, description, strength)


class TestEntities:
    def test_instances_of_one_name_merge_with_distinct_descriptions_in_merge_order(self) -> None:
        drafts = merge_entities([ent("u1", "Ada", "a mathematician"),
                                 ent("u2", "Ada", "a writer"),
                                 ent("u3", "Ada", "a mathematician")])
        d = drafts["ada"]
        assert d.id == entity_id("ada")
        assert d.descriptions == ("a mathematician", "a writer")
        assert d.unit_acl == (("u1", 1), ("u2", 1), ("u3", 1))

    def test_the_most_frequent_form_and_type_win_ties_to_the_smallest(self) -> None:
        d = merge_entities([ent("u1", "Ada", "", kind="person"), ent("u2", "Ada", "",
                            kind="org"), ent("u3", "Ada", "", kind="org")])["ada"]
        assert d.type == "org"
        tie = merge_entities([ent("u1", "Bob", "", kind="b"), ent("u2", "Bob", "", kind="a")])
        assert tie["bob"].type == "a"

    def test_the_visit_order_does_not_change_the_row(self) -> None:
        rows = [ent("u1", "Ada", "x", acl=1), ent("u2", "Ada", "y", acl=2)]
        one = entity_row(merge_entities(rows)["ada"], "x y", 2)
        other = entity_row(merge_entities(rows[::-1])["ada"], "x y", 2)
        assert one.entity.text_unit_ids == other.entity.text_unit_ids == ("u1", "u2")
        assert one.gate == other.gate and one.hash == other.hash

    def test_a_relabelled_unit_changes_the_access_but_not_the_content_hash(self) -> None:
        before = entity_row(merge_entities([ent("u1", "Ada", "x", acl=1)])["ada"], "x", 0)
        after = entity_row(merge_entities([ent("u1", "Ada", "x", acl=2)])["ada"], "x", 0)
        assert before.hash == after.hash
        assert before.gate.acl != after.gate.acl and before.gate.sig != after.gate.sig


class TestRelationships:
    def test_weight_is_the_summed_strength_of_the_instances(self) -> None:
        drafts = merge_relationships([rel("u1", "ada", "bob", "met", 2.0),
                                      rel("u2", "ada", "bob", "worked with", 3.0)])
        d = drafts["ada|bob"]
        assert d.weight == 5.0
        assert (d.source, d.target) == (entity_id("ada"), entity_id("bob"))
        assert d.descriptions == ("met", "worked with")

    def test_a_changed_weight_changes_the_row_hash(self) -> None:
        one = merge_relationships([rel("u1", "ada", "bob", "met", 2.0)])["ada|bob"]
        two = merge_relationships([rel("u1", "ada", "bob", "met", 4.0)])["ada|bob"]
        assert relationship_row(one, "met").hash != relationship_row(two, "met").hash
