"""Source ACL policy: path globs -> labels, principals -> the labels they may read.

Precedence: rules are evaluated in file order and the first rule whose glob matches a document's
path (relative, POSIX) decides its labels; a path no rule matches gets `default`. A document is
readable by a principal holding at least one of its labels; a document with no labels is
readable by nobody (deny by default). With no `[acl]` section there is no policy: the single local
user reads everything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

from canopy.errors import ConfigError
from canopy.settings import AclSettings

__all__ = ["Principal", "Policy"]

_LABEL = re.compile(r"^[A-Za-z0-9_.:@-]+$")


@dataclass(frozen=True)
class Principal:
    name: str
    labels: frozenset[str]
    unrestricted: bool = False  # no policy: sees everything


def _glob_match(path: str, pattern: str) -> bool:
    """`**` matches any number of folders (including none); `*` stays within one folder."""
    regex = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            regex += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            regex += ".*"
            i += 2
        elif pattern[i] == "*":
            regex += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            regex += "[^/]"
            i += 1
        else:
            regex += re.escape(pattern[i])
            i += 1
    return re.fullmatch(regex, path) is not None or fnmatchcase(path, pattern) and "/" not in pattern


class Policy:
    def __init__(self, settings: AclSettings) -> None:
        self.settings = settings
        for label in [*settings.default, *(lab for r in settings.rules for lab in r.labels),
                      *(lab for labs in settings.principals.values() for lab in labs)]:
            if not _LABEL.match(label):
                raise ConfigError(f"invalid ACL label {label!r}: use letters, digits and _ . : @ -")

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def labels_for(self, path: str) -> tuple[str, ...]:
        if not self.enabled:
            return ()
        for rule in self.settings.rules:
            if _glob_match(path, rule.glob):
                return tuple(sorted(set(rule.labels)))
        return tuple(sorted(set(self.settings.default)))

    def principal(self, name: str | None) -> Principal:
        """The caller's principal. Unknown names get no labels (they see nothing), which is
        indistinguishable from a known principal with no grants."""
        if not self.enabled:
            return Principal(name or "local", frozenset(), unrestricted=True)
        return Principal(name or "", frozenset(self.settings.principals.get(name or "", [])))

    def readable(self, labels: tuple[str, ...], who: Principal) -> bool:
        return who.unrestricted or bool(who.labels.intersection(labels))
