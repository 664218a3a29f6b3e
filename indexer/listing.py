"""Which files of a folder are documents, under which path, and how to open them safely.

Links: symbolic links are never followed, to files or folders, inside the folder or out. Each one
whose name could be a document (an indexed extension), and each link to a folder, is recorded as
a skip; its reason never names the target (that would leak what the link points at). A file
inside the folder is indexed once, under its own path and labels; a link to it adds nothing, and
a link elsewhere cannot bring anything in. Only the folder itself is resolved once: indexing a
folder reached through a link is the user's choice. Every file is opened one path component at a
time from the folder with O_NOFOLLOW, so a folder swapped for a link between listing and reading
(or any link in the middle of a path) fails the open instead of escaping; chains and loops are
never walked. Hard links are not links but further names of one file: each name is indexed under
its own path and labels, like a copy (whoever can write into the folder can copy a file anyway).
Non-regular files (FIFOs, sockets, devices) are never opened.

Where the OS has no `openat` with O_NOFOLLOW (Windows), the same rules hold by checking instead
of opening relative to a descriptor: every component is `lstat`ed and refused if it is a link
or any other reparse point (junctions too), and the opened file must be the very file that was
checked (same device and file id), so a swap between the check and the open is refused after
the fact. `BY_DESCRIPTOR` says which way this OS takes.

Names: a document's path is its relative POSIX path as text. A name that is not valid UTF-8
(Linux allows any byte but NUL and "/") is shown with each undecodable byte as `\\xNN` and each
backslash doubled, so the form is lossless and unique, stores as UTF-8 and keeps its folders:
ACL rules match it like any other path. The real bytes are used to open the file.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from canopy.model import Skip
from canopy.settings import CONFIG_FILENAME, INDEX_DIRNAME, InputSettings

__all__ = ["BY_DESCRIPTOR", "FileEntry", "FileRefused", "LinkRefused", "display_name",
           "file_suffix", "list_files", "read_beneath"]

# openat(2) with O_NOFOLLOW: POSIX. Elsewhere each path is checked with lstat (module doc).
BY_DESCRIPTOR = (os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd
                 and hasattr(os, "O_NOFOLLOW") and hasattr(os, "O_DIRECTORY"))
_REPARSE_POINT = 0x400  # FILE_ATTRIBUTE_REPARSE_POINT: Windows links and junctions

LINK_REASON = ("symbolic link, not followed (links are never indexed; the target is indexed "
               "under its own path)")
FOLDER_LINK_REASON = "symbolic link to a folder, not followed (links are never indexed)"
PATH_LINK_REASON = "a folder on its path became a symbolic link; not followed"


def file_suffix(path: str) -> str:
    """The file type of a path, lower case, as pathlib reads it: `....txt` is a text file
    (os.path.splitext skips leading dots and would see no extension), `.txt` alone has none."""
    return PurePosixPath(path).suffix.lower()


@dataclass(frozen=True)
class FileEntry:
    """A regular file to load: `path` names it (storage, ACL, display); `real_path` opens it."""

    path: str  # relative POSIX display path
    real_path: Path  # root / the real name bytes (surrogate-escaped)
    size: int
    mtime_ns: int
    root: Path  # the resolved folder; opening walks from here without following links


class FileRefused(Exception):
    """The listed file cannot be read safely; the message is the skip reason."""


class LinkRefused(FileRefused):
    """A symbolic link met while opening a file beneath the folder."""


def display_name(raw: bytes) -> str:
    """The text form of one name: itself when valid UTF-8 without backslashes, else each
    undecodable byte as `\\xNN` and each backslash as `\\\\` (injective, always UTF-8)."""
    text = raw.decode("utf-8", "surrogateescape")
    if "\\" not in text and not any("\udc80" <= c <= "\udcff" for c in text):
        return text
    out = []
    for c in text:
        if c == "\\":
            out.append("\\\\")
        elif "\udc80" <= c <= "\udcff":
            out.append(f"\\x{ord(c) - 0xDC00:02x}")
        else:
            out.append(c)
    return "".join(out)


def list_files(root: Path, settings: InputSettings, index_dir: Path | None = None,
               ignored: Counter[str] | None = None) -> Iterator[FileEntry | Skip]:
    """Every candidate document under root in path order, and a `Skip` for each link, special
    file or oversized file that would otherwise have been one. Excluded paths, the index folder,
    `canopy.toml` and other extensions are left out (they are not documents); files of other
    extensions are counted in `ignored` by extension, hidden files (".name") aside, so that
    `canopy status` can say what was not indexed."""
    root = root.resolve()
    index_dir = Path(index_dir) if index_dir is not None else root / INDEX_DIRNAME
    try:
        index_st: os.stat_result | None = os.stat(index_dir)
    except OSError:
        index_st = None
    exts = {e.lower() for e in settings.extensions}
    # Depth-first in path order without recursion (a folder tree may be deeper than Python's
    # stack): one iterator per open folder level, each over that folder's sorted entries.
    try:
        top = _list_dir(root, ())
    except OSError:
        return  # no folder, no documents (the CLI says so before it gets here)
    stack: list[Iterator[tuple[tuple[bytes, ...], os.stat_result]]] = [iter(top)]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
            continue
        parts, st = item
        rel = _display(parts)
        if stat.S_ISDIR(st.st_mode):
            if (index_st and os.path.samestat(st, index_st)) or _pruned(rel, settings):
                continue
            try:
                stack.append(iter(_list_dir(root, parts)))
            except LinkRefused:
                yield Skip(rel, PATH_LINK_REASON)
            except FileNotFoundError:
                pass  # vanished since its parent was listed
            except OSError as exc:  # unreadable: its files would silently be missing
                yield Skip(rel, f"folder could not be listed ({type(exc).__name__})")
            continue
        suffix = file_suffix(rel)
        if _excluded(rel, settings):
            continue
        if stat.S_ISLNK(st.st_mode):
            if suffix in exts:
                yield Skip(rel, LINK_REASON)
            elif _points_to_folder(root, parts):
                yield Skip(rel, FOLDER_LINK_REASON)
        elif suffix not in exts or rel == CONFIG_FILENAME:
            if ignored is not None and rel != CONFIG_FILENAME and not parts[-1].startswith(b"."):
                ignored[suffix or "(none)"] += 1
            continue
        elif not stat.S_ISREG(st.st_mode):
            yield Skip(rel, f"not a regular file ({_kind(st.st_mode)})")
        elif st.st_size > settings.max_file_bytes:
            limit = settings.max_file_bytes
            yield Skip(rel, f"larger than max_file_bytes ({st.st_size} > {limit})")
        else:
            real = Path(os.fsdecode(os.path.join(os.fsencode(root), *parts)))
            yield FileEntry(rel, real, st.st_size, st.st_mtime_ns, root)


def _display(parts: tuple[bytes, ...]) -> str:
    return "/".join(display_name(p) for p in parts)


def _excluded(rel: str, settings: InputSettings) -> bool:
    return any(fnmatch.fnmatchcase(rel, pat) or fnmatch.fnmatchcase("/" + rel, pat)
               for pat in settings.exclude)


def _pruned(rel: str, settings: InputSettings) -> bool:
    """A folder whose every file an exclude pattern covers: a pattern ending in `*` (which
    fnmatch lets span folders) that matches the folder's path plus "/"."""
    return any(pat.endswith("*") and (fnmatch.fnmatchcase(rel + "/", pat)
                                      or fnmatch.fnmatchcase("/" + rel + "/", pat))
               for pat in settings.exclude)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"


def _is_link(st: os.stat_result) -> bool:
    return stat.S_ISLNK(st.st_mode) or bool(getattr(st, "st_file_attributes", 0) & _REPARSE_POINT)


def _checked_dir(root: Path, parts: tuple[bytes, ...]) -> bytes:
    """root/parts as a path, every component checked to be a folder and no link (the
    path-walking way: `BY_DESCRIPTOR` is False)."""
    path = os.fsencode(root)
    for part in parts:
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise
        if _is_link(st) or not stat.S_ISDIR(st.st_mode):
            raise LinkRefused(PATH_LINK_REASON)
    return path


def _open_dir(root: Path, parts: tuple[bytes, ...]) -> int:
    """A descriptor of root/parts, every component opened without following links."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise LinkRefused(PATH_LINK_REASON) from exc
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _list_dir(root: Path, parts: tuple[bytes, ...]
              ) -> list[tuple[tuple[bytes, ...], os.stat_result]]:
    """The entries of root/parts sorted by name, each with its own (never followed) stat."""
    if not BY_DESCRIPTOR:
        path = _checked_dir(root, parts)
        found = []
        for raw in os.listdir(path):
            try:
                found.append(((*parts, raw), os.lstat(os.path.join(path, raw))))
            except OSError:
                continue  # vanished between listing and stat
        return sorted(found, key=lambda item: item[0][-1])
    fd = _open_dir(root, parts)
    try:
        out = []
        for name in os.listdir(fd):
            raw = os.fsencode(name)
            try:
                out.append(((*parts, raw), os.stat(raw, dir_fd=fd, follow_symlinks=False)))
            except OSError:
                continue  # vanished between listing and stat
        return sorted(out, key=lambda item: item[0][-1])
    finally:
        os.close(fd)


def _points_to_folder(root: Path, parts: tuple[bytes, ...]) -> bool:
    try:
        return stat.S_ISDIR(os.stat(os.path.join(os.fsencode(root), *parts)).st_mode)
    except OSError:
        return False


def read_beneath(entry: FileEntry, max_bytes: int) -> bytes:
    """The file's bytes, opened from the folder without following any link; raises
    `LinkRefused` on a link, `FileRefused` when it is not a regular file or holds more than
    max_bytes (it may have grown since it was listed)."""
    parts = tuple(os.fsencode(p) for p in entry.real_path.relative_to(entry.root).parts)
    if not BY_DESCRIPTOR:
        return _read_checked(entry.root, parts, max_bytes)
    dir_fd = _open_dir(entry.root, parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY,
                         dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise LinkRefused(LINK_REASON) from exc
            raise
    finally:
        os.close(dir_fd)
    return _read_open(fd, max_bytes)


# A writer that rewrites a file in place (most scripts and many editors) truncates it, then
# writes: a read in between sees no bytes, and the document would leave the index until the next
# update. An empty file this recently changed is read again once it has been still this long.
SETTLE_S = 0.5
_READS = 4  # reads of one file at most, when it keeps changing while it is read


def _read_open(fd: int, max_bytes: int, checked: os.stat_result | None = None) -> bytes:
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if checked is not None and not os.path.samestat(st, checked):
            raise LinkRefused(LINK_REASON)  # swapped between the check and the open
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"not a regular file ({_kind(st.st_mode)})")
        data = _settled(fh, st, max_bytes)
    if len(data) > max_bytes:
        raise FileRefused(f"larger than max_file_bytes (> {max_bytes})")
    return data


def _settled(fh: BinaryIO, st: os.stat_result, max_bytes: int) -> bytes:
    """The file's bytes as of a moment it was not being written: read again when its size or
    modification time changed during the read, or when it is empty and changed less than
    SETTLE_S ago (a rewrite in progress), up to _READS times."""
    for _ in range(_READS - 1):
        fh.seek(0)
        data = fh.read(max_bytes + 1)
        now = os.fstat(fh.fileno())
        if (now.st_size, now.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            st = now  # written to while it was read
            continue
        age = time.time() - st.st_mtime_ns / 1e9
        if data.strip() or not 0 <= age < SETTLE_S:
            return data
        time.sleep(SETTLE_S - age)
        st = os.fstat(fh.fileno())
    fh.seek(0)
    return fh.read(max_bytes + 1)


def _read_checked(root: Path, parts: tuple[bytes, ...], max_bytes: int) -> bytes:
    """`read_beneath` the path-walking way: folders and the file checked with lstat, then the
    opened file compared with the checked one."""
    path = os.path.join(_checked_dir(root, parts[:-1]), parts[-1])
    st = os.lstat(path)
    if _is_link(st):
        raise LinkRefused(LINK_REASON)
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"not a regular file ({_kind(st.st_mode)})")
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LinkRefused(LINK_REASON) from exc
        raise
    return _read_open(fd, max_bytes, checked=st)
