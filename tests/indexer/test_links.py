"""Symbolic links are never followed (issue 9, case 1): not to files or folders, inside the
folder or out, not in the middle of a path, not when a folder is swapped for a link between
listing and reading. Each link that could have been a document is a recorded skip.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from canopy.indexer.loaders import LoadedDocument, scan_folder
from canopy.model import Skip
from canopy.settings import InputSettings

pytestmark = pytest.mark.skipif(not hasattr(os, "O_NOFOLLOW"), reason="POSIX only")

LINK = "symbolic link, not followed"


@pytest.fixture(autouse=True, params=["descriptors", "checked paths"])
def walk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs both ways of walking the folder: openat with O_NOFOLLOW (POSIX), and
    the lstat-checked paths an OS without it (Windows) takes."""
    from canopy.indexer import listing

    monkeypatch.setattr(listing, "BY_DESCRIPTOR", request.param == "descriptors")
    return str(request.param)


def scanned(root: Path) -> tuple[dict[str, LoadedDocument], dict[str, Skip]]:
    docs: dict[str, LoadedDocument] = {}
    skips: dict[str, Skip] = {}
    for item in scan_folder(root, InputSettings()):
        (skips if isinstance(item, Skip) else docs)[item.path] = item  # type: ignore[index]
    return docs, skips


def test_a_link_to_a_restricted_file_is_skipped_not_indexed_under_its_labels(tmp_path: Path
                                                                            ) -> None:
    (tmp_path / "finance").mkdir()
    (tmp_path / "public").mkdir()
    (tmp_path / "finance" / "acquisition.txt").write_text("We will acquire Helio Cells for $40M.")
    (tmp_path / "public" / "q3.txt").symlink_to("../finance/acquisition.txt")
    docs, skips = scanned(tmp_path)
    assert set(docs) == {"finance/acquisition.txt"}
    assert skips["public/q3.txt"].reason.startswith(LINK)
    assert "finance" not in skips["public/q3.txt"].reason  # the reason never names the target


def test_links_to_files_and_folders_outside_the_folder_are_never_read(tmp_path: Path) -> None:
    root, outside = tmp_path / "docs", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("OUTSIDE-CANARY")
    (root / "a.txt").write_text("inside text")
    (root / "passwd.txt").symlink_to("/etc/passwd")
    (root / "status.txt").symlink_to("/proc/self/status")
    (root / "secret.txt").symlink_to(outside / "secret.txt")
    (root / "mirror").symlink_to(outside, target_is_directory=True)
    (root / "loop").symlink_to("loop")
    docs, skips = scanned(root)
    assert set(docs) == {"a.txt"}
    linked = {p for p, s in skips.items() if s.reason.startswith(LINK)}
    assert linked == {"passwd.txt", "status.txt", "secret.txt"}
    assert skips["mirror"].reason.startswith("symbolic link to a folder")
    assert "loop" not in skips  # no indexed extension, not a folder: not a document either way


def test_a_folder_swapped_for_a_link_after_listing_is_not_read(tmp_path: Path) -> None:
    from canopy.indexer.loaders import list_files, load_entry

    root, outside = tmp_path / "docs", tmp_path / "outside"
    (root / "public").mkdir(parents=True)
    outside.mkdir()
    (root / "public" / "a.txt").write_text("public text")
    (outside / "a.txt").write_text("OUTSIDE-CANARY")
    entries = [e for e in list_files(root, InputSettings()) if not isinstance(e, Skip)]
    (root / "public" / "a.txt").unlink()
    (root / "public").rmdir()
    (root / "public").symlink_to(outside, target_is_directory=True)
    result = load_entry(entries[0], InputSettings())
    assert isinstance(result, Skip) and "symbolic link" in result.reason
    (root / "public").unlink()
    (root / "public").mkdir()
    (root / "public" / "a.txt").symlink_to(outside / "a.txt")  # now the file itself is a link
    result = load_entry(entries[0], InputSettings())
    assert isinstance(result, Skip) and result.reason.startswith(LINK)


def test_a_folder_reached_through_a_link_is_indexed_relative_to_itself(tmp_path: Path) -> None:
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "real" / "sub" / "a.txt").write_text("text")
    (tmp_path / "via").symlink_to(tmp_path / "real", target_is_directory=True)
    docs, skips = scanned(tmp_path / "via")
    assert set(docs) == {"sub/a.txt"} and not skips


def test_special_files_are_skipped_and_hard_links_are_separate_names(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.txt")
    (tmp_path / "a.txt").write_text("shared text")
    os.link(tmp_path / "a.txt", tmp_path / "b.txt")
    docs, skips = scanned(tmp_path)
    assert skips["pipe.txt"].reason == "not a regular file (FIFO)"
    assert docs["a.txt"].text == docs["b.txt"].text == "shared text"


def test_canopy_status_shows_link_skips(tmp_path: Path) -> None:
    from canopy.server.cli import main

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Maria Okafor leads Project Kestrel.")
    (docs / "b.txt").symlink_to("a.txt")
    runner = CliRunner()
    assert runner.invoke(main, ["index", str(docs)]).exit_code == 0
    out = runner.invoke(main, ["status", str(docs)]).output
    assert "b.txt" in out and LINK in out


# ---- property: any shape of links, no text from outside and no path through a link --------------

NAMES = ["a", "b", "c.txt", "d.txt", "e.md"]
TARGETS = st.one_of(
    st.tuples(st.just("inside"), st.lists(st.sampled_from(NAMES), min_size=1, max_size=3)),
    st.tuples(st.just("outside"), st.lists(st.sampled_from(NAMES), min_size=0, max_size=2)),
    st.tuples(st.just("abs-outside"), st.just(["secret.txt"])),
    st.tuples(st.just("dangling"), st.just(["nowhere.txt"])),
)
NODES = st.lists(st.tuples(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3),
                           st.sampled_from(["file", "dir", "link"]), TARGETS), max_size=14)


def _build(root: Path, outside: Path, nodes: list) -> None:
    for parts, kind, (where, target) in nodes:
        path = root.joinpath(*parts)
        if os.path.lexists(path) or (len(parts) > 1 and _has_link_component(
                root, "/".join(parts[:-1]))):
            continue  # never write through a link made earlier (the node or a parent folder)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if kind == "file":
                path.write_text("INSIDE " + "/".join(parts))
            elif kind == "dir":
                path.mkdir(exist_ok=True)
            elif where == "inside":
                path.symlink_to(os.path.relpath(root.joinpath(*target), path.parent))
            elif where == "outside":
                path.symlink_to(outside.joinpath(*target))
            elif where == "abs-outside":
                path.symlink_to(outside / "secret.txt")
            else:
                path.symlink_to(root / "nowhere.txt")
        except OSError:
            continue  # a name already taken by another node, or a parent that is a file/link


def _has_link_component(root: Path, rel: str) -> bool:
    path = root
    for part in rel.split("/"):
        path = path / part
        if path.is_symlink():
            return True
    return False


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(NODES)
def test_no_link_shape_reads_outside_the_folder_or_through_a_link(nodes: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root, outside = Path(tmp) / "root", Path(tmp) / "outside"
        root.mkdir()
        for sub in ["", "a", "b", "a/c.txt"]:
            (outside / sub).parent.mkdir(parents=True, exist_ok=True)
        for name in NAMES:
            if "." in name:
                (outside / name).write_text("OUTSIDE")
            else:
                (outside / name).mkdir(exist_ok=True)
        (outside / "a" / "c.txt").write_text("OUTSIDE")
        (outside / "secret.txt").write_text("OUTSIDE")
        _build(root, outside, nodes)
        docs, skips = scanned(root)
        expected = {str(p.relative_to(root)) for p in root.rglob("*")
                    if p.suffix in (".txt", ".md") and p.is_file()
                    and not _has_link_component(root, str(p.relative_to(root)))}
        assert set(docs) == expected
        for path, doc in docs.items():
            assert "OUTSIDE" not in doc.text and doc.text == "INSIDE " + path
        links = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_symlink()
                 and not _has_link_component(root, str(p.parent.relative_to(root)))
                 and (p.suffix in (".txt", ".md") or p.is_dir())}
        assert {p for p, s in skips.items() if "symbolic link" in s.reason} == links


def test_checked_paths_refuse_a_file_swapped_between_the_check_and_the_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without openat, the file opened must be the one checked: a swap in between (here, the
    checked file renamed away and another put in its place) is refused. (The descriptor walk
    opens what it checks; this runs the path walk under both parameters.)"""
    from canopy.indexer import listing
    from canopy.indexer.loaders import list_files, load_entry

    monkeypatch.setattr(listing, "BY_DESCRIPTOR", False)
    (tmp_path / "a.txt").write_text("checked text")
    (tmp_path / "other.txt").write_text("OTHER-CANARY")
    entry = next(e for e in list_files(tmp_path, InputSettings()) if not isinstance(e, Skip))
    real_lstat = os.lstat

    def swap_after_check(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        st = real_lstat(path, *args, **kwargs)
        if os.fsdecode(path).endswith("a.txt"):
            os.replace(tmp_path / "other.txt", tmp_path / "a.txt")
        return st

    monkeypatch.setattr(listing.os, "lstat", swap_after_check)
    result = load_entry(entry, InputSettings())
    assert isinstance(result, Skip) and result.reason.startswith(LINK)
