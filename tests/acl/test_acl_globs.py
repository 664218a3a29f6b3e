"""ACL rule globs, searched the way an attacker would: any file name a filesystem allows must
get the rule of the folder it sits in (issue 9, case 2: a newline in a name escaped `finance/**`).

Semantics kept from the README: the first matching rule wins, `**` spans any number of folders
(none included), `*` and `?` stay within one folder, a pattern matches the whole relative path.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from canopy.acl.policy import Policy
from canopy.settings import AclSettings

# One path component: any character Linux allows in a name (everything but "/" and NUL),
# including newlines, carriage returns, unicode, spaces, leading dashes and glob metacharacters.
NAME = st.text(
    alphabet=st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)),
    min_size=1, max_size=12,
).filter(lambda s: s not in (".", ".."))
TRICKY = st.sampled_from(["\n", "\r\n", "q3\nforecast.txt", "-rf", " ", ".hidden", "*", "**",
                          "[a]", "\\", "a\\", "?", "!x", "{a,b}", "\u2028", "\x85", "caf\u00e9",
                          "cafe\u0301"])
COMPONENT = st.one_of(NAME, TRICKY)


def finance_policy() -> Policy:
    return Policy(AclSettings(enabled=True, default=[], rules=[
        {"glob": "finance/**", "labels": ["finance"]},
        {"glob": "**", "labels": ["staff"]},
    ], principals={"bob": ["staff"]}))


@settings(max_examples=400, deadline=None)
@given(st.lists(COMPONENT, min_size=1, max_size=5))
def test_any_file_under_finance_gets_the_finance_rule(parts: list[str]) -> None:
    path = "finance/" + "/".join(parts)
    policy = finance_policy()
    assert policy.labels_for(path) == ("finance",)
    assert not policy.readable(policy.labels_for(path), policy.principal("bob"))


@settings(max_examples=300, deadline=None)
@given(COMPONENT, st.lists(COMPONENT, min_size=0, max_size=4))
def test_a_file_outside_finance_never_gets_the_finance_rule(top: str, rest: list[str]) -> None:
    if top == "finance":
        top = "finance2"
    path = "/".join([top, *rest])
    assert finance_policy().labels_for(path) == ("staff",)


@settings(max_examples=300, deadline=None)
@given(st.lists(COMPONENT, min_size=1, max_size=4), COMPONENT)
def test_double_star_spans_any_number_of_folders_and_star_stays_in_one(folders: list[str],
                                                                       name: str) -> None:
    from canopy.acl.policy import compile_glob

    deep = "/".join(["a", *folders, name])
    assert compile_glob("a/**")(deep)
    assert compile_glob("**/" + "*")(deep)
    assert compile_glob("a/*")("a/" + name)
    assert not compile_glob("a/*")(deep)  # more than one folder below a/
    assert not compile_glob("*")(deep)


def test_first_matching_rule_wins_and_unmatched_paths_get_the_default() -> None:
    policy = Policy(AclSettings(enabled=True, default=["everyone"], rules=[
        {"glob": "finance/public/**", "labels": ["staff"]},
        {"glob": "finance/**", "labels": ["finance"]},
        {"glob": "*.md", "labels": ["docs"]},
    ]))
    assert policy.labels_for("finance/public/a.txt") == ("staff",)
    assert policy.labels_for("finance/q3.txt") == ("finance",)
    assert policy.labels_for("notes.md") == ("docs",)
    assert policy.labels_for("sub/notes.md") == ("everyone",)  # `*` never crosses a folder
    assert policy.labels_for("finance") == ("everyone",)  # the folder's name alone is not inside it


def test_glob_metacharacters_in_names_are_data_not_patterns() -> None:
    from canopy.acl.policy import compile_glob

    matches = compile_glob("finance/**")
    assert matches("finance/[a]/{b,c}/!x/*.txt")
    assert not compile_glob("finance/a.txt")("finance/a.txt\n")
    assert not compile_glob("a[b]")("a[b]") and compile_glob("a[b]")("ab")


def test_a_decomposed_folder_name_meets_a_rule_written_composed() -> None:
    nfd = unicodedata.normalize("NFD", "finanças")
    rules = [{"glob": "finanças/**", "labels": ["finance"]}]
    policy = Policy(AclSettings(enabled=True, rules=rules))
    assert policy.labels_for(nfd + "/q3.txt") == ("finance",)


# ---- letter case and Unicode forms (issue 30, finding 9) ---------------------------------------


def test_a_folder_spelled_in_another_case_than_its_rule_refuses_to_index() -> None:
    """`Finance/` under a `finance/**` rule fell to the catch-all: on macOS and Windows, where
    they are one folder, a policy written for one spelling served the other to everyone. The
    indexer's labels (`labels_checked`) refuse, naming the path and the rule."""
    import pytest

    from canopy.errors import ConfigError

    policy = finance_policy()
    assert policy.labels_for("Finance/q3.md") == ("staff",)  # what the rules say as spelled
    for path in ("Finance/q3.md", "FINANCE/sub/x.txt", "ｆｉｎａｎｃｅ/q3.md"):
        with pytest.raises(ConfigError) as refused:
            policy.labels_checked(path)
        assert repr(path) in str(refused.value) and "'finance/**'" in str(refused.value)
    assert policy.labels_checked("finance/q3.md") == ("finance",)
    assert policy.labels_checked("notes/q3.md") == ("staff",)
    sharp = Policy(AclSettings(enabled=True, default=["staff"], rules=[
        {"glob": "strasse/**", "labels": ["legal"]}]))
    with pytest.raises(ConfigError):
        sharp.labels_checked("Straße/akte.md")


def test_a_rule_for_each_spelling_or_the_same_labels_either_way_index() -> None:
    both = Policy(AclSettings(enabled=True, default=[], rules=[
        {"glob": "finance/**", "labels": ["finance"]},
        {"glob": "Finance/**", "labels": ["finance"]},
        {"glob": "**", "labels": ["staff"]},
    ]))
    assert both.labels_checked("Finance/q3.md") == ("finance",)
    same = Policy(AclSettings(enabled=True, default=["staff"], rules=[
        {"glob": "public/**", "labels": ["staff"]}]))
    assert same.labels_checked("Public/a.md") == ("staff",)  # labelled alike either way
    nfd = unicodedata.normalize("NFD", "finanças")
    composed = Policy(AclSettings(enabled=True, rules=[
        {"glob": "finanças/**", "labels": ["finance"]}]))
    assert composed.labels_checked(nfd + "/q3.txt") == ("finance",)  # one name in NFC


@settings(max_examples=300, deadline=None)
@given(st.lists(COMPONENT, min_size=1, max_size=4),
       st.sampled_from(["finance", "Finance", "FINANCE", "fInance", "ｆｉｎａｎｃｅ", "finance2"]))
def test_the_indexers_labels_are_the_rules_or_a_refusal(parts: list[str], top: str) -> None:
    """Whatever the path: the labels the rules give it as spelled, or a refusal when its case
    or compatibility form would change them, never a third answer."""
    import pytest

    from canopy.errors import ConfigError

    path = "/".join([top, *parts])
    policy = finance_policy()
    if top in ("finance", "finance2"):
        assert policy.labels_checked(path) == policy.labels_for(path)
    else:
        with pytest.raises(ConfigError):
            policy.labels_checked(path)


def test_canopy_index_refuses_a_case_ambiguous_policy_in_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from canopy.health import check_database
    from canopy.server.cli import main

    docs = tmp_path / "docs"
    (docs / "Finance").mkdir(parents=True)
    (docs / "Finance" / "q3.md").write_text("Q3 revenue fell.", encoding="utf-8")
    (docs / "notes.md").write_text("Lunch is at noon.", encoding="utf-8")
    (docs / "canopy.toml").write_text(
        '[acl]\ndefault = ["staff"]\n[[acl.rules]]\nglob = "finance/**"\nlabels = ["finance"]\n',
        encoding="utf-8")
    done = CliRunner().invoke(main, ["index", str(docs), "--index-dir", str(tmp_path / "idx")])
    assert done.exit_code == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'Finance/q3.md'" in lines[0] and "'finance/**'" in lines[0]
    facts = check_database(tmp_path / "idx")
    assert not isinstance(facts, str) and facts.generation == 0  # nothing indexed
