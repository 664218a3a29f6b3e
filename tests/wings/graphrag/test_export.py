"""`canopy export` (canopy.server.wings.graphrag.export): GraphRAG-shaped tables and a GraphML
graph, with provenance, and for a restricted caller nothing derived from a document they cannot
read.

The formats are checked on the bundled examples (no policy: the export is the whole index, row
for row what `canopy status` counts); permissions on a copy of examples/multi-tenant with an
`admin` principal added, whose export holds the finance and HR secrets that bob's must not, in
any file and any format."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from canopy.errors import ConfigError
from canopy.server.api import Index
from canopy.server.cli import main
from canopy.server.runtime import build_index, open_workspace
from canopy.server.wings.graphrag.export.columns import TABLES
from tests.conftest import EXAMPLES, REPO, offline_env

MULTI = REPO / "examples" / "multi-tenant"

# Microsoft GraphRAG's output columns (its docs, "Outputs"), which each table must carry.
GRAPHRAG = {
    "entities": ["id", "human_readable_id", "title", "type", "description", "text_unit_ids",
                 "frequency", "degree"],
    "relationships": ["id", "human_readable_id", "source", "target", "description", "weight",
                      "combined_degree", "text_unit_ids"],
    "communities": ["id", "human_readable_id", "community", "level", "parent", "children",
                    "title", "entity_ids", "relationship_ids", "text_unit_ids", "size"],
    "community_reports": ["id", "human_readable_id", "community", "level", "parent", "children",
                          "title", "summary", "full_content", "rank", "rating_explanation",
                          "findings", "full_content_json", "size"],
    "text_units": ["id", "human_readable_id", "text", "n_tokens", "document_ids", "entity_ids",
                   "relationship_ids", "covariate_ids"],
    "documents": ["id", "human_readable_id", "title", "text", "text_unit_ids", "metadata"],
    "covariates": ["id", "human_readable_id", "covariate_type", "type", "description",
                   "subject_id", "object_id", "status", "start_date", "end_date", "source_text",
                   "text_unit_id"],
}
# status field -> export table
COUNTED = {"documents": "documents", "text_units": "text_units", "entities": "entities",
           "relationships": "relationships", "communities": "communities",
           "reports": "community_reports", "claims": "covariates"}
SECRETS = ("11.07", "64.8 million", "212,400", "Juniper")  # finance and HR facts only



@pytest.fixture(scope="module")
def examples(examples_index: Path) -> tuple[Path, Path]:
    """The bundled examples and their index (conftest's, shared: read only): (docs, index)."""
    return EXAMPLES, examples_index


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A copy of examples/multi-tenant, with `admin` reading every label and claims extracted
    (covariates), indexed."""
    root = tmp_path_factory.mktemp("export-tenants")
    shutil.copytree(MULTI, root / "multi-tenant", ignore=shutil.ignore_patterns(".canopy"))
    docs = root / "multi-tenant" / "docs"
    toml = docs / "canopy.toml"
    toml.write_text(toml.read_text(encoding="utf-8").replace(
        "[acl.principals]\n", '[acl.principals]\nadmin = ["staff", "finance", "hr"]\n')
        + "\n[extract]\nclaims = true\n", encoding="utf-8")
    with offline_env():
        build_index(open_workspace(docs, root / "index"))
    return docs, root / "index"


def export(docs: Path, index: Path, out: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["export", str(docs), str(out), "--index-dir", str(index),
                                     *args])


def exported(docs: Path, index: Path, out: Path, *args: str) -> Path:
    done = export(docs, index, out, *args)
    assert done.exit_code == 0, done.output
    return out


def parquet(out: Path) -> dict[str, list[dict[str, Any]]]:
    return {t: pq.read_table(out / f"{t}.parquet").to_pylist() for t in TABLES}


def csv_tables(out: Path) -> dict[str, list[dict[str, Any]]]:
    parse = pa_csv.ParseOptions(newlines_in_values=True)
    return {t: pa_csv.read_csv(out / f"{t}.csv", parse_options=parse).to_pylist() for t in TABLES}


def all_bytes(out: Path) -> bytes:
    return b"\n".join(p.read_bytes() for p in sorted(out.iterdir()))


class TestFormats:
    def test_parquet_tables_have_graphrag_columns_and_status_counts(
            self, examples: tuple[Path, Path], tmp_path: Path) -> None:
        docs, index = examples
        out = exported(docs, index, tmp_path / "out")
        status = CliRunner().invoke(main, ["status", str(docs), "--index-dir", str(index),
                                           "--json"])
        counts = json.loads(status.stdout)
        for table in TABLES:
            names = pq.read_schema(out / f"{table}.parquet").names
            assert names == TABLES[table].names
            assert names[:len(GRAPHRAG[table])] == GRAPHRAG[table], table
        tables = parquet(out)
        for field, table in COUNTED.items():
            assert len(tables[table]) == counts[field], field
        assert counts["entities"] and counts["reports"]
        manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
        assert manifest["rows"] == {t: len(r) for t, r in tables.items()}
        assert manifest["principal"] is None and manifest["generation"] == counts["generation"]

    def test_every_row_carries_its_provenance(self, examples: tuple[Path, Path],
                                              tmp_path: Path) -> None:
        t = parquet(exported(*examples, tmp_path / "out"))
        units = {u["id"]: u for u in t["text_units"]}
        docs = {d["id"]: d for d in t["documents"]}
        for table in ("entities", "relationships", "communities", "community_reports"):
            for row in t[table]:
                assert row["text_unit_ids"] and set(row["text_unit_ids"]) <= set(units), table
                assert row["document_ids"] == sorted({units[u]["document_id"]
                                                      for u in row["text_unit_ids"]}), table
        for u in units.values():
            assert u["document_ids"] == [u["document_id"]] and u["document_id"] in docs
        for d in docs.values():
            assert d["text_unit_ids"] and all(units[u]["document_id"] == d["id"]
                                              for u in d["text_unit_ids"])
        by_unit = {u: set(units[u]["entity_ids"]) for u in units}
        for e in t["entities"]:
            assert all(e["id"] in by_unit[u] for u in e["text_unit_ids"])
            assert e["frequency"] == len(e["text_unit_ids"])

    def test_relationships_and_communities_are_consistent(self, examples: tuple[Path, Path],
                                                          tmp_path: Path) -> None:
        t = parquet(exported(*examples, tmp_path / "out"))
        titles = {e["id"]: e["title"] for e in t["entities"]}
        degree = {e["id"]: e["degree"] for e in t["entities"]}
        for r in t["relationships"]:
            assert (r["source"], r["target"]) == (titles[r["source_id"]], titles[r["target_id"]])
            assert r["combined_degree"] == degree[r["source_id"]] + degree[r["target_id"]]
        communities = {c["community"]: c for c in t["communities"]}
        for c in communities.values():
            assert c["size"] == len(c["entity_ids"]) and set(c["entity_ids"]) <= set(titles)
            if c["parent"] != -1:
                assert c["community"] in communities[c["parent"]]["children"]
                assert set(c["entity_ids"]) <= set(communities[c["parent"]]["entity_ids"])
        for r in t["community_reports"]:
            assert r["full_content"].startswith(f"# {r['title']}")
            assert r["level"] == communities[r["community"]]["level"]

    def test_csv_holds_the_same_rows_with_lists_as_json(self, examples: tuple[Path, Path],
                                                        tmp_path: Path) -> None:
        want = parquet(exported(*examples, tmp_path / "parquet"))
        got = csv_tables(exported(*examples, tmp_path / "csv", "--format", "csv"))
        for table, rows in want.items():
            assert len(got[table]) == len(rows), table
            for a, b in zip(rows, got[table], strict=True):
                assert a["id"] == b["id"]
                for column in ("text_unit_ids", "document_ids", "entity_ids", "findings"):
                    if column in a:
                        assert json.loads(b[column]) == a[column], (table, column)
                if "text" in a:
                    assert a["text"] == b["text"]

    def test_graphml_loads_as_the_entity_graph(self, examples: tuple[Path, Path],
                                               tmp_path: Path) -> None:
        tables = parquet(exported(*examples, tmp_path / "tables"))
        out = exported(*examples, tmp_path / "graph", "-f", "graphml")
        assert sorted(p.name for p in out.iterdir()) == ["graph.graphml", "manifest.json"]
        entities = {e["id"]: e for e in tables["entities"]}
        levels = {c["level"] for c in tables["communities"]}
        try:
            import networkx as nx
        except ImportError:
            nx = None
        if nx is not None:
            g = nx.read_graphml(out / "graph.graphml")
            assert g.number_of_nodes() == len(entities)
            assert g.number_of_edges() == len(tables["relationships"])
            for node, data in g.nodes(data=True):
                e = entities[node]
                assert (data["title"], data["type"], data["degree"]) == (
                    e["title"], e["type"], e["degree"])
                assert data["description"] == e["description"]
                assert all(f"community_level_{lv}" in data for lv in levels)
            for _, _, data in g.edges(data=True):
                assert isinstance(data["weight"], float) and "description" in data
        else:  # the standard library's parser: the structure networkx would read
            import xml.etree.ElementTree as ET

            ns = {"g": "http://graphml.graphdrawing.org/xmlns"}
            root = ET.parse(out / "graph.graphml").getroot()
            assert len(root.findall("g:graph/g:node", ns)) == len(entities)
            assert len(root.findall("g:graph/g:edge", ns)) == len(tables["relationships"])


class TestPermissions:
    def test_a_restricted_export_holds_nothing_from_hidden_documents(
            self, tenants: tuple[Path, Path], tmp_path: Path) -> None:
        docs, index = tenants
        admin = csv_tables(exported(docs, index, tmp_path / "admin", "-f", "csv",
                                    "--principal", "admin"))
        outs = [exported(docs, index, tmp_path / f"bob-{f}", "-f", f, "--principal", "bob")
                for f in ("csv", "parquet", "graphml")]
        # parquet is compressed: search its decoded values, and every byte of the others
        decoded = json.dumps(parquet(outs[1]), ensure_ascii=False).encode()
        bob = all_bytes(outs[0]) + all_bytes(outs[2]) + decoded
        admin_bytes = all_bytes(tmp_path / "admin")

        paths = {d["id"]: d["path"] for d in admin["documents"]}
        hidden_docs = {i for i, p in paths.items() if not p.startswith("public/")}
        assert len(hidden_docs) == 3
        hidden_units = {u["id"] for u in admin["text_units"] if u["document_id"] in hidden_docs}
        public_text = "\n".join(p.read_text(encoding="utf-8")
                                for p in (docs / "public").rglob("*.*"))
        hidden_only = [e for e in admin["entities"]
                       if set(json.loads(e["document_ids"])) <= hidden_docs]
        secret_names = [e["title"] for e in hidden_only if e["title"] not in public_text]
        assert secret_names, "the restricted documents name something the public ones do not"
        hidden_claims = [c["id"] for c in admin["covariates"] if c["text_unit_id"] in hidden_units]
        assert hidden_claims and len(hidden_claims) < len(admin["covariates"])
        secrets = [*SECRETS, *secret_names, *hidden_docs, *hidden_units, *hidden_claims,
                   *(e["id"] for e in hidden_only)]
        for secret in secrets:
            assert secret.encode() in admin_bytes, secret
            assert secret.encode() not in bob, secret

        mine = csv_tables(outs[0])
        readable_units = {u["id"] for u in mine["text_units"]}
        assert {d["path"].split("/")[0] for d in mine["documents"]} == {"public"}
        for table in ("entities", "relationships", "communities", "community_reports"):
            for row in mine[table]:
                assert set(json.loads(row["text_unit_ids"])) <= readable_units, table
        assert mine["covariates"] and {c["text_unit_id"] for c in mine["covariates"]} <= (
            readable_units)

    def test_a_restricted_export_counts_what_index_status_counts_for_them(
            self, tenants: tuple[Path, Path], tmp_path: Path) -> None:
        docs, index = tenants
        with Index.open(docs, index_dir=index) as canopy:
            for who in ("bob", "carol"):
                result = canopy.export(tmp_path / who, principal=who)
                status = canopy.status(principal=who).model_dump()
                for field, table in COUNTED.items():
                    assert result.rows[table] == status[field], (who, field)
                assert result.principal == who
            with pytest.raises(ConfigError, match="name the caller"):
                canopy.export(tmp_path / "nobody")
        assert not (tmp_path / "nobody").exists()


class TestArguments:
    def one_line_error(self, done: Result, *expected: str) -> None:
        assert done.exit_code == 1, done.output
        lines = [ln for ln in done.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: "), done.output
        for text in expected:
            assert text in lines[0]

    def test_a_policy_needs_a_known_principal(self, tenants: tuple[Path, Path],
                                              tmp_path: Path) -> None:
        docs, index = tenants
        self.one_line_error(export(docs, index, tmp_path / "a"), "--principal")
        self.one_line_error(export(docs, index, tmp_path / "b", "--principal", "mallory"),
                            "unknown principal 'mallory'")
        assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()

    def test_the_folder_must_be_new_empty_or_overwritten(self, tenants: tuple[Path, Path],
                                                         tmp_path: Path) -> None:
        docs, index = tenants
        out = exported(docs, index, tmp_path / "out", "-f", "csv", "--principal", "admin")
        self.one_line_error(export(docs, index, out, "--principal", "bob"), "not empty",
                            "--overwrite")
        (out / "notes.txt").write_text("mine", encoding="utf-8")
        exported(docs, index, out, "--principal", "bob", "--overwrite")
        names = sorted(p.name for p in out.iterdir())
        assert "entities.parquet" in names and "notes.txt" in names
        assert not [n for n in names if n.endswith(".csv")]  # admin's tables are gone
        self.one_line_error(export(docs, index, docs / "export", "--principal", "bob"),
                            "inside the documents folder")
        assert not (docs / "export").exists()
        (tmp_path / "file").write_text("", encoding="utf-8")
        self.one_line_error(export(docs, index, tmp_path / "file", "--principal", "bob"),
                            "is a file")

    def test_an_unknown_format_or_a_missing_index_is_refused(self, tmp_path: Path) -> None:
        done = export(EXAMPLES, tmp_path / "index", tmp_path / "out", "--format", "xml")
        assert done.exit_code == 2 and "Invalid value for '--format'" in done.output
        self.one_line_error(export(EXAMPLES, tmp_path / "index", tmp_path / "out"), "no index")
