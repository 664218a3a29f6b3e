"""ACL rule globs, searched the way an attacker would: any file name a filesystem allows must
get the rule of the folder it sits in (issue 9, case 2: a newline in a name escaped `finance/**`).

Semantics kept from the README: the first matching rule wins, `**` spans any number of folders
(none included), `*` and `?` stay within one folder, a pattern matches the whole relative path.
"""

from __future__ import annotations

import unicodedata

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
