"""Source ACL policy: path globs -> labels, principals -> the labels they may read.

Precedence: rules are evaluated in file order and the first rule whose glob matches a document's
path (relative, POSIX) decides its labels; a path no rule matches gets `default`. A document is
readable by a principal holding at least one of its labels; a document with no labels is
readable by nobody (deny by default). With no `[acl]` section there is no policy: the single local
user reads everything.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from wcmatch import glob as wcglob

from canopy.errors import ConfigError
from canopy.settings import AclSettings

__all__ = ["Policy", "Principal", "compile_glob"]

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

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def labels_for(self, path: str) -> tuple[str, ...]:
        if not self.enabled:
            return ()
        for matches, labels in self._rules:
            if matches(path):
                return labels
        return tuple(sorted(set(self.settings.default)))

    def principal(self, name: str | None) -> Principal:
        """The caller's principal. Unknown names get no labels (they see nothing), which is
        indistinguishable from a known principal with no grants."""
        if not self.enabled:
            return Principal(name or "local", frozenset(), unrestricted=True)
        return Principal(name or "", frozenset(self.settings.principals.get(name or "", [])))

    def readable(self, labels: tuple[str, ...], who: Principal) -> bool:
        return who.unrestricted or bool(who.labels.intersection(labels))
