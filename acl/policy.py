"""Source ACL policy: path globs -> labels, principals -> the labels they may read.

Precedence: rules are evaluated in file order and the first rule whose glob matches a document's
path (relative, POSIX) decides its labels; a path no rule matches gets `default`. A document is
readable by a principal holding at least one of its labels; a document with no labels is
readable by nobody (deny by default). With no `[acl]` section there is no policy: the single local
user reads everything.

Names are compared in Unicode NFC, so a name stored decomposed (as macOS writes it) is the name
written composed: every file system that tells them apart at all treats them as one name.
Letter case (and compatibility forms: full-width letters, ligatures, "ß" and "ss") is
different: `Finance/` and `finance/` are one folder on macOS and Windows and two on Linux. So
the index refuses to build when a path would be labelled otherwise if case and compatibility
forms were ignored (`labels_checked`: a `Finance/` folder under a `finance/**` rule would fall to
the catch-all), naming the path and the rule; a rule written as the path is spelled (or one
for each spelling) settles it (issue 30, finding 9).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from wcmatch import glob as wcglob

from canopy.errors import ConfigError
from canopy.settings import AclSettings

__all__ = ["Policy", "Principal", "compile_glob", "fold"]

_LABEL = re.compile(r"^[A-Za-z0-9_.:@-]+$")


@dataclass(frozen=True)
class Principal:
    name: str
    labels: frozenset[str]
    unrestricted: bool = False  # no policy: sees everything


# wcmatch's glob dialect, not gitignore's (pathspec): `*` and `?` stay within one folder, a
# pattern is matched against the whole relative path, `**` spans any number of folders. DOTGLOB:
# a rule covers dot files too; FORCEUNIX: `/` is the only separator and case counts, on every OS.
# (pathspec 1.1 compiles `**/` to `.+` without DOTALL: a newline in a folder name escapes it.)
_GLOB_FLAGS = wcglob.GLOBSTAR | wcglob.DOTGLOB | wcglob.FORCEUNIX


def fold(name: str) -> str:
    """`name` with letter case and Unicode compatibility forms ignored (NFKC, case folding)."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFKC", name).casefold())


def compile_glob(pattern: str) -> Callable[[str], bool]:
    """A matcher of relative POSIX paths for one rule glob. Both sides are compared in Unicode
    NFC, so a folder name stored decomposed (as macOS writes it) still meets the rule written
    composed; any other character of a name (newlines, spaces, leading dashes) is literal."""
    matcher = wcglob.compile(unicodedata.normalize("NFC", pattern), flags=_GLOB_FLAGS)
    return lambda path: bool(matcher.match(unicodedata.normalize("NFC", path)))


class Policy:
    def __init__(self, settings: AclSettings) -> None:
        self.settings = settings
        for label in [*settings.default, *(lab for r in settings.rules for lab in r.labels),
                      *(lab for labs in settings.principals.values() for lab in labs)]:
            if not _LABEL.match(label):
                raise ConfigError(f"invalid ACL label {label!r}: use letters, digits and _ . : @ -")
        self._rules = [(compile_glob(r.glob), tuple(sorted(set(r.labels)))) for r in settings.rules]
        self._folded = [(compile_glob(fold(r.glob)), labels)
                        for r, (_, labels) in zip(settings.rules, self._rules, strict=True)]

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def labels_for(self, path: str) -> tuple[str, ...]:
        return self._decide(self._rules, path)[0]

    def _decide(self, rules: list[tuple[Callable[[str], bool], tuple[str, ...]]],
                path: str) -> tuple[tuple[str, ...], int | None]:
        """(labels, index of the deciding rule; None: the default)."""
        if not self.enabled:
            return (), None
        for i, (matches, labels) in enumerate(rules):
            if matches(path):
                return labels, i
        return tuple(sorted(set(self.settings.default))), None

    def labels_checked(self, path: str) -> tuple[str, ...]:
        """`labels_for(path)`, or ConfigError naming the path and the rule when ignoring letter
        case and compatibility forms would label it otherwise (see the module doc): what the
        indexer labels documents with."""
        labels, rule = self._decide(self._rules, path)
        folded, other = self._decide(self._folded, fold(path))
        if folded == labels:
            return labels
        def name(i: int | None) -> str:
            if i is None:
                return "the default"
            return f"rule {i + 1} (glob {self.settings.rules[i].glob!r})"

        raise ConfigError(
            f"[acl] {name(other)} would decide the labels of {path!r} if letter case were "
            f"ignored, as macOS and Windows ignore it, but as spelled {name(rule)} does "
            f"({list(labels)} instead of {list(folded)}): write the rule as the path is "
            "spelled, or add a rule for each spelling; nothing is indexed until every path is "
            "labelled alike either way")

    def principal(self, name: str | None) -> Principal:
        """The caller's principal. Unknown names get no labels (they see nothing), which is
        indistinguishable from a known principal with no grants."""
        if not self.enabled:
            return Principal(name or "local", frozenset(), unrestricted=True)
        return Principal(name or "", frozenset(self.settings.principals.get(name or "", [])))

    def readable(self, labels: tuple[str, ...], who: Principal) -> bool:
        return who.unrestricted or bool(who.labels.intersection(labels))
