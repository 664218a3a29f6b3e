"""`[embed] builtin = "wordllama"`: the optional static-embedding embedder (canopy.providers.
builtin.static). Offline: the model ships in the wordllama wheel (the `test` extra installs it)."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import canopy.providers.builtin.static as static
from canopy.errors import ConfigError
from canopy.providers import make_embedder
from canopy.providers.builtin import HashEmbedder
from canopy.server.cli import main
from canopy.server.engines.basic_engine import basic_search
from canopy.server.runtime import build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.settings import Settings, load_settings
from canopy.store import Store
from canopy.vectors import VectorStore
from tests.conftest import EXAMPLES

try:
    import wordllama  # noqa: F401

    HAVE = True
except ImportError:
    HAVE = False

needs_wordllama = pytest.mark.skipif(
    not HAVE, reason="wordllama is not installed (pip install -e '.[test]' or '.[static]')")


def _wordllama() -> Settings:
    return Settings(embed={"builtin": "wordllama"})  # type: ignore[arg-type]


def test_the_setting_chooses_the_builtin_embedder_and_rejects_unknown_ones(
        tmp_path: Path) -> None:
    assert Settings().embed.builtin == "hash"
    assert isinstance(make_embedder(Settings()), HashEmbedder)
    (tmp_path / "canopy.toml").write_text('[embed]\nbuiltin = "word2vec"\n')
    with pytest.raises(ConfigError, match="builtin"):
        load_settings(tmp_path)


def test_a_missing_package_is_one_line_saying_what_to_install(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "wordllama", None)  # import wordllama -> ImportError
    monkeypatch.setattr(static, "_loaded", None)
    with pytest.raises(ConfigError) as info:
        make_embedder(_wordllama())
    assert str(info.value) == static.MISSING
    assert "\n" not in static.MISSING and "pip install 'wordllama>=0.4,<0.5'" in static.MISSING
    # the command line shows it as its one-line error
    monkeypatch.setenv("CANOPY_EMBED__BUILTIN", "wordllama")
    done = CliRunner().invoke(main, ["index", str(EXAMPLES), "--index-dir",
                                     str(tmp_path / "idx")])
    assert done.exit_code == 1
    assert f"Error: {static.MISSING}\n" in done.output and "Traceback" not in done.output


@needs_wordllama
class TestWordLlama:
    def test_vectors_are_float32_unit_rows_of_the_models_width(self) -> None:
        e = make_embedder(_wordllama())
        assert isinstance(e, static.WordLlamaEmbedder) and e.lexical  # weak: see its class
        assert e.dims == 256 and e.name.startswith("builtin-wordllama-l2_supercat-256-")
        texts = ["Ferns grow in the shade.", "Die Katze schläft.", "价格上涨了", ""]
        v = e.embed_sync(texts)
        assert v.shape == (4, 256) and v.dtype == np.float32
        assert np.allclose(np.linalg.norm(v[:3], axis=1), 1.0, atol=1e-5)
        assert not v[3].any()  # no tokens: the zero vector, as the hash embedder gives
        assert np.array_equal(v, e.embed_sync(texts))  # deterministic
        assert e.embed_sync([]).shape == (0, 256)

    def test_the_same_vectors_as_wordllamas_own_embed(self) -> None:
        e = make_embedder(_wordllama())
        own = static.load_wordllama()
        texts = ["A lighthouse keeper counts the ships.", "Short."]
        ids = [own.tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
        ref = np.stack([own.table[i].mean(axis=0) for i in ids])
        ref /= np.linalg.norm(ref, axis=1, keepdims=True)
        assert np.allclose(e.embed_sync(texts), ref, atol=1e-6)

    def test_paraphrases_score_above_unrelated_sentences(self) -> None:
        """Made-up sentences that share no content word with their paraphrase: the hash
        embedder sees nothing in common, WordLlama does."""
        e = make_embedder(_wordllama())
        hashing = HashEmbedder()
        cases = [
            ("The physician treated the feverish child.",
             "A doctor cared for the sick kid with a high temperature.",
             "Quarterly revenue of the shipping firm fell sharply."),
            ("Stocks tumbled after the central bank raised interest rates.",
             "Equity markets dropped when monetary policy was tightened.",
             "The hikers reached the snowy summit at dawn."),
            ("Our cat sleeps on the sofa all afternoon.",
             "The kitten naps on the couch during the day.",
             "Parliament passed the new tax legislation."),
        ]
        for anchor, close, far in cases:
            a, c, f = e.embed_sync([anchor, close, far])
            assert float(a @ c) > float(a @ f) + 0.1, (anchor, float(a @ c), float(a @ f))
            ha, hc, _ = hashing.embed_sync([anchor, close, far])
            assert abs(float(ha @ hc)) < 0.2  # no shared terms: lexical vectors miss it

    def test_importing_it_leaves_the_applications_logging_alone(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in [m for m in sys.modules if m.split(".")[0] == "wordllama"]:
            monkeypatch.delitem(sys.modules, name)  # imported afresh below, restored after
        root = logging.getLogger()
        monkeypatch.setattr(root, "handlers", [])  # basicConfig acts on a bare root logger only
        monkeypatch.setattr(root, "level", logging.WARNING)
        static._import_wordllama()  # its __init__ calls logging.basicConfig(level=INFO)
        assert root.handlers == [] and root.level == logging.WARNING

    def test_switching_embedders_rebuilds_the_vectors_and_search_uses_them(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        index_dir = tmp_path / "idx"
        assert build_index(open_workspace(EXAMPLES, index_dir=index_dir)).stats["embedded"]
        hashed = Store(index_dir)
        try:
            assert hashed.get_meta("embedder") == HashEmbedder().name
            fingerprint = hashed.get_meta("settings_fingerprint")
        finally:
            hashed.close()
        monkeypatch.setenv("CANOPY_EMBED__BUILTIN", "wordllama")
        ws = open_workspace(EXAMPLES, index_dir=index_dir)
        svc = CanopyService(ws)
        try:  # not re-embedded yet: searches say so in one line
            with svc.context(None) as ctx, pytest.raises(ConfigError, match=(
                    r"^the index's vectors were made by the embedder builtin-hash-384-t\d+ but "
                    r"the settings now select builtin-wordllama-.*: run `canopy index`")):
                asyncio.run(basic_search(ctx, "who supplies solar cells?"))
        finally:
            svc.close()
        second = build_index(ws)
        assert not second.stats.get("noop")
        # every text embedded again (reports too: a full rebuild over an existing index keeps
        # them once branch hier's fix of the reports stage is in; not asserted here)
        assert second.stats["embedded"] >= second.stats["text_units"] + second.stats["entities"]
        assert second.stats["units_extracted"] == 0  # extractions are kept
        store = Store(index_dir)
        try:
            name = make_embedder(ws.settings).name
            assert store.get_meta("embedder") == name
            assert store.get_meta("settings_fingerprint") != fingerprint
        finally:
            store.close()
        table = VectorStore(index_dir, 256)._table("text_units")
        assert table.schema.field("vector").type.list_size == 256
        svc = CanopyService(ws)
        try:
            with svc.context(None) as ctx:
                vector = asyncio.run(ctx.reader.embed("solar cell supplier"))
                assert vector.shape == (256,)
                hits = asyncio.run(ctx.reader.search("text_units", vector=vector, text=None, k=3))
                assert len(hits) == 3
                assert asyncio.run(basic_search(ctx, "who supplies solar cells?")).citations
        finally:
            svc.close()
        assert build_index(ws).stats.get("noop")  # and then it is up to date
