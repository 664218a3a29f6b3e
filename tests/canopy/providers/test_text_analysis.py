"""The one text-analysis module, canopy.providers.builtin.text, as a specification: the terms
the lexical index counts and the builtin embedder hashes (`lexical_terms`), the terms the builtin
provider scores relevance with (`terms`), the stemmer both share (`stem`), and the two sentence
splitters (`split_sentences` for reading, `split_at_stops` for local_search's scoring windows).

Every text here is made up for these tests (places such as Vellmore and Kestrel do not exist)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from canopy.ids import KEYS_VERSION, entity_id, fold_accents, normalize_name
from canopy.indexer import pipeline
from canopy.providers.builtin import BuiltinProvider, HashEmbedder, lexicon
from canopy.providers.builtin.text import (
    TERMS_VERSION,
    lexical_terms,
    split_at_stops,
    split_sentences,
    stem,
    terms,
)
from canopy.settings import Settings


class TestStem:
    @pytest.mark.parametrize(("word", "expected"), [
        ("harbours", "harbour"), ("ferries", "ferry"), ("taxes", "tax"), ("buses", "bus"),
        ("wishes", "wish"), ("benches", "bench"), ("quays", "quay"), ("says", "say"),
    ])
    def test_plurals_become_their_singular(self, word: str, expected: str) -> None:
        assert stem(word) == expected

    @pytest.mark.parametrize("word", ["glass", "cactus", "thesis", "gas", "yes"])
    def test_words_that_only_look_plural_are_kept(self, word: str) -> None:
        assert stem(word) == word

    @pytest.mark.parametrize(("word", "expected"), [
        ("drafting", "draft"), ("harvested", "harvest"), ("painted", "paint"),
        ("anchoring", "anchor"),
    ])
    def test_ing_and_ed_are_cut_when_four_letters_remain(self, word: str, expected: str) -> None:
        assert stem(word) == expected

    @pytest.mark.parametrize("word", ["based", "baked", "making", "riding", "sing", "used", "red"])
    def test_short_words_keep_their_ing_and_ed(self, word: str) -> None:
        """Cutting them would join unrelated words ("based" and "bas", "riding" and "rid")."""
        assert stem(word) == word

    def test_a_plural_and_its_singular_are_one_term_in_both_analyses(self) -> None:
        for analysis in (lexical_terms, terms):
            assert analysis("Lanterns") == analysis("lantern") == ["lantern"]
            assert analysis("ferries") == analysis("Ferry") == ["ferry"]


class TestWords:
    def test_stop_words_and_the_words_of_instructions_are_never_terms(self) -> None:
        assert lexical_terms("Tell me about the lighthouse keepers of Vellmore, please.") == [
            "lighthouse", "keeper", "vellmore"]

    def test_no_word_of_the_stop_list_is_a_term(self) -> None:
        stop = sorted(lexicon.STOPWORDS)
        assert [w for w in stop if lexical_terms(w) or terms(w)] == []
        assert [w for w in stop if lexical_terms(w.capitalize())] == []

    def test_single_letters_are_dropped_but_single_digits_kept(self) -> None:
        assert lexical_terms("Pier 7, berth B and crane x") == ["pier", "7", "berth", "crane"]

    def test_runs_of_letters_and_runs_of_digits_are_separate_words(self) -> None:
        assert lexical_terms("Harbor2030 moved 12,500 tonnes") == [
            "harbor", "2030", "moved", "12", "500", "tonne"]

    def test_words_of_any_script_are_terms(self) -> None:
        assert lexical_terms("Straßenbahn nach Łódź, Пристань") == [
            "straßenbahn", "nach", "lodz", "пристань"]  # accents folded (TestAccents)


class TestAccents:
    def test_a_word_with_and_without_its_accents_is_one_term(self) -> None:
        assert lexical_terms("Brünnwald Čelakov Ørsby Żelno") == lexical_terms(
            "Brunnwald Celakov Orsby Zelno")
        assert terms("Brünnwald") == terms("Brunnwald")

    def test_marks_that_belong_to_letters_of_other_scripts_stay(self) -> None:
        assert lexical_terms("ガス") != lexical_terms("カス")


class TestApostrophes:
    def test_a_possessive_s_is_dropped_in_either_spelling(self) -> None:
        assert lexical_terms("Vellmore's harbour") == ["vellmore", "harbour"]
        assert lexical_terms("Vellmore’s harbour") == ["vellmore", "harbour"]

    def test_a_plural_possessive_becomes_the_singular(self) -> None:
        assert lexical_terms("the pilots' union") == ["pilot", "union"]

    def test_a_possessive_of_a_stop_word_is_no_term(self) -> None:
        assert lexical_terms("It's hers, not his") == []

    def test_an_apostrophe_inside_a_name_keeps_it_whole_in_either_spelling(self) -> None:
        assert lexical_terms("O'Tallis") == lexical_terms("O’Tallis") == ["o'tallis"]
        assert terms("O’Tallis") == ["o'tallis"]

    def test_contractions_are_stop_words_in_either_spelling(self) -> None:
        assert lexical_terms("They don't, and won’t, aren't they?") == []


class TestCjk:
    def test_index_terms_are_character_bigrams_of_each_run(self) -> None:
        assert lexical_terms("码头扩建") == ["码头", "头扩", "扩建"]
        assert lexical_terms("码头。扩建") == ["码头", "扩建"]  # no bigram across punctuation

    def test_a_single_cjk_character_is_an_index_term(self) -> None:
        assert lexical_terms("港") == ["港"]

    def test_relevance_terms_are_dictionary_words_without_stop_words(self) -> None:
        found = terms("港口的集装箱码头明年扩建")
        assert {"港口", "集装箱", "码头", "扩建"} <= set(found)
        assert "的" not in found and "口的" not in found and "箱码" not in found
        assert "口的" in lexical_terms("港口的集装箱码头明年扩建")

    def test_a_latin_name_written_against_cjk_is_a_term_of_its_own(self) -> None:
        assert lexical_terms("Kestrel项目") == terms("Kestrel项目") == ["kestrel", "项目"]
        assert lexical_terms("Kestrel项目由Vellmore负责") == [
            "kestrel", "项目", "目由", "vellmore", "负责"]
        assert terms("Kestrel项目由Vellmore负责") == ["kestrel", "项目", "vellmore", "负责"]

    def test_latin_words_against_cjk_are_stemmed_and_stop_words_dropped(self) -> None:
        assert lexical_terms("Ferries的码头") == ["ferry", "的码", "码头"]
        assert lexical_terms("the码头") == ["码头"]


def test_relevance_and_index_terms_agree_on_text_without_cjk() -> None:
    text = "Ilse Varga's crews were repainting Vellmore's ferries in 2031; nobody objected."
    assert terms(text) == lexical_terms(text) == [
        "ilse", "varga", "crew", "repaint", "vellmore", "ferry", "2031", "nobody", "object"]


class TestSplitSentences:
    def test_abbreviations_and_initials_do_not_end_a_sentence(self) -> None:
        text = ("Dr. Ilse Varga met J. R. Pellow at the quay. They agreed on fees, e.g. the "
                "mooring fee. Prof. Odum left.")
        assert split_sentences(text) == [
            "Dr. Ilse Varga met J. R. Pellow at the quay.",
            "They agreed on fees, e.g. the mooring fee.", "Prof. Odum left."]

    def test_a_persons_dotted_initials_end_no_sentence(self) -> None:
        text = ("Critics compare it to H.P. Quillane and W.E.B. Tarrow. It was filmed by George "
                "A. Dunmere.")
        assert split_sentences(text) == [
            "Critics compare it to H.P. Quillane and W.E.B. Tarrow.",
            "It was filmed by George A. Dunmere."]

    def test_initials_before_a_function_word_or_title_of_a_place_or_a_unit_end_one(self) -> None:
        text = ("It sold well in the U.S. The next year it sold in the U.K. President Odum "
                "wrote to the N.V. Board. The dose doubled at 660 V. Underground cables failed.")
        assert split_sentences(text) == [
            "It sold well in the U.S.", "The next year it sold in the U.K.",
            "President Odum wrote to the N.V.", "Board.", "The dose doubled at 660 V.",
            "Underground cables failed."]

    def test_initials_before_a_word_the_text_writes_in_lower_case_end_a_sentence(self) -> None:
        text = "Its plant is in Vellmore S.A. Lymphoma wards grew; lymphoma is rarer now."
        assert split_sentences(text) == [
            "Its plant is in Vellmore S.A.", "Lymphoma wards grew; lymphoma is rarer now."]

    def test_a_stop_ends_a_sentence_only_before_a_capital_or_a_digit(self) -> None:
        assert split_sentences("Fares rose 3 p.c. last year. 2031 was worse. see below.") == [
            "Fares rose 3 p.c. last year.", "2031 was worse. see below."]

    def test_markdown_markers_go_and_each_heading_or_item_stands_alone(self) -> None:
        text = ("# Vellmore harbour\n\n**Keeper:** Ilse Varga\n- Crane 4 is [out of order](x.md)\n"
                "- Berths are full\n\n| berth | ship |\n| 7 | Tallis |")
        assert split_sentences(text) == [
            "Vellmore harbour", "Keeper: Ilse Varga", "Crane 4 is out of order",
            "Berths are full", "berth ; ship", "7 ; Tallis"]

    def test_wrapped_prose_lines_join_into_one_sentence(self) -> None:
        text = ("The last ferry of the season leaves Vellmore at dawn and,\n"
                "weather permitting, reaches the outer islands by noon. It returns empty.")
        assert split_sentences(text) == [
            ("The last ferry of the season leaves Vellmore at dawn and, weather permitting, "
             "reaches the outer islands by noon."), "It returns empty."]

    def test_cjk_full_stops_end_a_sentence_without_a_space(self) -> None:
        assert split_sentences("港口明年扩建。码头开放吗？是的！") == [
            "港口明年扩建。", "码头开放吗？", "是的！"]


class TestSplitAtStops:
    TEXT = ('Dr. Varga met J. R. Pellow. "The quay is closed." Work (all of it.) stops\n'
            "**Keeper:** Ilse Varga\n港口扩建。码头开放！")

    def test_every_stop_before_a_space_and_every_line_break_cuts(self) -> None:
        assert split_at_stops(self.TEXT) == [
            "Dr.", "Varga met J.", "R.", "Pellow.", '"The quay is closed."', "Work (all of it.)",
            "stops", "**Keeper:** Ilse Varga", "港口扩建。码头开放！"]

    def test_the_pieces_are_the_text_as_written(self) -> None:
        """Nothing is removed but the whitespace between pieces: not markup, not quotes."""
        pieces = split_at_stops(self.TEXT)
        assert re.sub(r"\s", "", "".join(pieces)) == re.sub(r"\s", "", self.TEXT)
        assert all(p == p.strip() and "\n" not in p for p in pieces)

    def test_a_stop_without_a_following_space_does_not_cut(self) -> None:
        assert split_at_stops("Version 2.5 of vellmore.md shipped.") == [
            "Version 2.5 of vellmore.md shipped."]

    def test_empty_and_blank_text_has_no_pieces(self) -> None:
        assert split_at_stops("") == split_at_stops(" \n\n ") == []


class TestTermsVersion:
    """Stored statistics and builtin vectors are derived from `lexical_terms`: an index built
    with another analysis of the terms must be rebuilt, not reused."""

    def test_the_builtin_embedder_is_named_for_the_analysis_its_vectors_hash(self) -> None:
        assert HashEmbedder(384).name == f"builtin-hash-384-t{TERMS_VERSION}"

    def test_the_settings_fingerprint_changes_with_the_analysis_whatever_the_embedder(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        class Endpoint:
            name = "openai:some-embedding-model"
            dims = 8

        settings, provider = Settings(), BuiltinProvider()
        endpoint: Any = Endpoint()
        before = pipeline.settings_fingerprint(settings, provider, endpoint)
        monkeypatch.setattr(pipeline, "TERMS_VERSION", TERMS_VERSION + 1)
        assert pipeline.settings_fingerprint(settings, provider, endpoint) != before

    def test_both_fingerprints_change_with_the_merge_keys_of_names(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Entity ids derive from canopy.ids.normalize_name: other keys re-extract and rebuild."""
        settings, provider = Settings(), BuiltinProvider()
        embedder = HashEmbedder(384)
        before = (pipeline.settings_fingerprint(settings, provider, embedder),
                  pipeline.extraction_fingerprint(settings, provider))
        monkeypatch.setattr(pipeline, "KEYS_VERSION", KEYS_VERSION + 1)
        after = (pipeline.settings_fingerprint(settings, provider, embedder),
                 pipeline.extraction_fingerprint(settings, provider))
        assert before[0] != after[0] and before[1] != after[1]


class TestNameKeys:
    def test_names_written_with_and_without_accents_share_a_key(self) -> None:
        assert normalize_name("Brünnwald-Čelakov") == normalize_name("BRUNNWALD CELAKOV")
        assert normalize_name("Ørsby Åkerlund") == normalize_name("Orsby Akerlund")
        assert entity_id("Żelno") == entity_id("Zelno")

    def test_accents_fold_in_latin_greek_and_cyrillic_only(self) -> None:
        assert fold_accents("Vélez Ἀθῆναι Йорск") == "Velez Αθηναι Иорск"
        assert fold_accents("ガス 가스") == "ガス 가스"  # kana's voicing mark, Hangul: letters
