"""Golden tests for realm_jax.evaluation.metrics (REALM_SPEC items 31-33).

Every expected value below was worked out by hand from ORQA's ``eval_utils`` and DPR's
``qa_validation`` semantics (the working is in the comments); none is produced by the code under
test.
"""

import random
import unicodedata

import numpy as np
import pytest

from realm_jax.evaluation import metrics

# ----------------------------------------------------------------------------------------------
# normalize_answer / exact_match (item 31).
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        # NFD keeps the accent as a combining mark (U+0301); it is neither dropped nor merged.
        ("Café", "cafe\u0301"),
        ("Cafe\u0301", "cafe\u0301"),
        # Ü = U + U+0308, ï = i + U+0308.
        ("Ünïcode", "u\u0308ni\u0308code"),
        # Articles go as whole words only.
        ("The Beatles", "beatles"),
        ("theatre", "theatre"),
        ("an apple a day", "apple day"),
        ("Another Brick", "another brick"),
        # ASCII punctuation is deleted, not replaced by a space: "A-ha" -> "aha", which is no
        # longer the article "a".
        ("U.S.A.", "usa"),
        ("A-ha", "aha"),
        ("rock & roll", "rock roll"),
        # Non-ASCII punctuation is not in string.punctuation and stays.
        ("\u201cquoted\u201d \u2014 yes", "\u201cquoted\u201d \u2014 yes"),
        # Whitespace of every kind collapses to single spaces and is trimmed.
        ("  New\t\nYork  City ", "new york city"),
        # ORQA's quirk, kept: in NFD "Thé" is "The" + U+0301, and a combining mark is not a word
        # character for \b, so "the" is removed as an article and only the accent remains.
        ("Thé", "\u0301"),
        ("", ""),
    ],
)
def test_normalize_answer_golden(text, expected):
  assert metrics.normalize_answer(text) == expected


def test_exact_match_nfd_forms_are_equal_but_accents_count():
  assert metrics.exact_match("Café", ["Cafe\u0301"])
  # "cafe\u0301" != "cafe": normalisation decomposes accents, it does not strip them.
  assert not metrics.exact_match("Café", ["cafe"])


def test_exact_match_multiple_references_matches_the_second():
  assert metrics.exact_match("the Beatles", ["Rolling Stones", "Beatles"])
  assert not metrics.exact_match("the Beatles", ["Rolling Stones", "Beatles tribute"])


def test_exact_match_empty_prediction():
  # normalize("") == "" and normalize("The") == "" (the article is removed).
  assert metrics.exact_match("", ["The"])
  assert not metrics.exact_match("", ["Paris"])


def test_exact_match_single_string_reference_and_empty_list():
  assert metrics.exact_match("Paris", "paris")  # one reference, not the characters p,a,r,i,s
  assert not metrics.exact_match("p", "paris")
  with pytest.raises(ValueError, match="empty"):
    metrics.exact_match("Paris", [])


# ----------------------------------------------------------------------------------------------
# regex_match (item 32) and has_answer's regex mode (item 33).
# ----------------------------------------------------------------------------------------------


def test_regex_match_is_anchored_match_but_has_answer_searches():
  # .match anchors at position 0: "1990" does not match "in 1990" ...
  assert not metrics.regex_match("in 1990", ["1990"])
  # ... but DPR's has_answer uses .search.
  assert metrics.has_answer("in 1990", ["1990"], match="regex")
  # Not a full match: text after the matched prefix is allowed.
  assert metrics.regex_match("1990 was the year", ["1990"])


def test_regex_match_multiline_does_not_unanchor_match():
  # MULTILINE lets ^ match after a newline, but .match still only tries position 0.
  assert not metrics.regex_match("foo\nbar", ["^bar"])
  assert metrics.has_answer("foo\nbar", ["^bar"], match="regex")


def test_regex_match_ignorecase_and_raw_prediction():
  assert metrics.regex_match("PARIS", ["paris"])
  # The prediction is not normalised: the leading "The" blocks an anchored match ...
  assert not metrics.regex_match("The Beatles", ["beatles"])
  # ... where exact match (which drops articles) succeeds.
  assert metrics.exact_match("The Beatles", ["beatles"])


def test_invalid_regex_is_a_miss_not_a_crash():
  assert not metrics.regex_match("anything", ["(unclosed"])
  assert metrics.regex_match("paris", ["(unclosed", "par.s"])
  assert not metrics.has_answer("(unclosed", ["(unclosed"], match="regex")


def test_regex_match_empty_prediction():
  assert not metrics.regex_match("", ["1990"])
  assert metrics.regex_match("", ["x?"])  # matches the empty string at position 0


def test_has_answer_regex_mode_normalises_nfd():
  # Text and pattern are both NFD-normalised, so precomposed and decomposed forms meet.
  assert metrics.has_answer("Le Café de Flore", ["caf\u00e9"], match="regex")
  assert metrics.has_answer("Le Cafe\u0301 de Flore", ["CAFÉ"], match="regex")


# ----------------------------------------------------------------------------------------------
# SimpleTokenizer / has_answer string mode (item 33).
# ----------------------------------------------------------------------------------------------


def test_simple_tokenizer_golden():
  tokens = metrics.SimpleTokenizer().tokenize("Don't stop, U.S.A.! 5:30pm Café_au_lait")
  # Alphanumeric runs and single other non-space characters; "_" is punctuation (Pc), not a
  # letter, so it splits "Café_au_lait". "Café" (NFC here) stays one token.
  assert tokens == ["Don", "'", "t", "stop", ",", "U", ".", "S", ".", "A", ".", "!", "5", ":",
                    "30pm", "Café", "_", "au", "_", "lait"]


def test_simple_tokenizer_keeps_combining_marks_and_drops_controls():
  tokenizer = metrics.SimpleTokenizer()
  # NFD "Café": the combining acute (category Mn) belongs to the run, unlike with \w.
  assert tokenizer.tokenize("Cafe\u0301 noir") == ["Cafe\u0301", "noir"]
  # Zero-width space (Cf) and tab (Cc) are C*, no-break space is Z*: all separate, none a token.
  assert tokenizer.tokenize("a\u200bb\tc\u00a0d") == ["a", "b", "c", "d"]
  assert tokenizer.tokenize("ABC", uncased=True) == ["abc"]


def test_has_answer_string_mode_respects_token_boundaries():
  assert not metrics.has_answer("We had a great party", ["art"])
  assert metrics.has_answer("the modern art museum", ["art"])
  assert metrics.has_answer("Barack Obama was president", ["barack obama"])
  assert not metrics.has_answer("Barack Obama was president", ["obama barack"])
  # Punctuation is tokenised on both sides: u . s . a . occurs in the text ...
  assert metrics.has_answer("He visited the U.S.A. twice", ["U.S.A."])
  # ... "usa" does not.
  assert not metrics.has_answer("He visited the U.S.A. twice", ["USA"])
  assert metrics.has_answer("it's 5:30 pm", ["5:30"])
  # Multiple answers: the second one is found.
  assert metrics.has_answer("born in Ulm", ["Munich", "ulm"])


def test_has_answer_string_mode_unicode():
  # NFD on both sides: the precomposed answer finds the decomposed text.
  assert metrics.has_answer("Le Cafe\u0301 de Flore", ["CAFÉ"])
  # The accent is part of the token "cafe\u0301", so "cafe" is a different token.
  assert not metrics.has_answer("Le Café de Flore", ["cafe"])
  # A CJK run (letters, no spaces) is a single token, so a substring of it is not found.
  assert not metrics.has_answer("東京は日本の首都", ["東京"])
  assert metrics.has_answer("首都は 東京 です", ["東京"])


def test_has_answer_edge_cases():
  # A token-less answer matches nothing (DPR's loop would match every text).
  assert not metrics.has_answer("anything at all", [" "])
  with pytest.raises(ValueError, match="empty"):
    metrics.has_answer("text", [])
  with pytest.raises(ValueError, match="match"):
    metrics.has_answer("text", ["a"], match="substring")
  assert metrics.has_answer("Paris, France", "paris")  # a lone string is one answer


def test_simple_tokenizer_equals_dpr_regex_module():
  """Cross-check against DPR's own pattern with the third-party ``regex`` module, on code points
  assigned in Python's Unicode database (the two Unicode versions differ on newer ones)."""
  import regex  # installed with the test extra (transformers depends on it)
  dpr = regex.compile(r"([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])",
                      flags=regex.IGNORECASE + regex.UNICODE + regex.MULTILINE)
  tokenizer = metrics.SimpleTokenizer()
  rng = random.Random(1234)

  def random_char():
    while True:
      code_point = rng.choice([rng.randrange(0x300), rng.randrange(0x3000),
                               rng.randrange(0x30000)])
      if unicodedata.category(chr(code_point)) != "Cn":
        return chr(code_point)

  samples = ["Hello, wörld! Cafe\u0301 1990s U.S.A. don't _x_ \u200b\t\n日本語 😀 a—b"]
  samples += ["".join(random_char() for _ in range(24)) for _ in range(1500)]
  for text in samples:
    assert tokenizer.tokenize(text) == [m.group() for m in dpr.finditer(text)], repr(text)


# ----------------------------------------------------------------------------------------------
# top_k_recall.
# ----------------------------------------------------------------------------------------------


def test_top_k_recall_hand_example():
  hits = np.array([
      [1, 0, 0, 0, 0, 0],  # first hit at rank 0
      [0, 0, 1, 0, 0, 1],  # first hit at rank 2
      [0, 0, 0, 0, 0, 1],  # first hit at rank 5 (the 6th block)
      [0, 0, 0, 0, 0, 0],  # never
  ], dtype=bool)
  # k=1: q0 -> 1/4. k=3: q0, q1 -> 2/4. k=5: still 2/4 (q2's hit is 6th). k=10 > 6 uses all
  # six blocks: q0, q1, q2 -> 3/4.
  assert metrics.top_k_recall(hits, ks=(1, 3, 5, 10)) == {
      "recall@1": 0.25, "recall@3": 0.5, "recall@5": 0.5, "recall@10": 0.75}


def test_top_k_recall_defaults_and_integer_input():
  hits = np.zeros((2, 100), dtype=np.int32)
  hits[0, 7] = 1  # inside 10, outside 5
  hits[1, 99] = 1  # the 100th block
  assert metrics.top_k_recall(hits) == {
      "recall@5": 0.0, "recall@10": 0.5, "recall@50": 0.5, "recall@100": 1.0}


@pytest.mark.parametrize(
    "hits, ks, message",
    [
        (np.zeros(5, bool), (5,), "shape"),
        (np.zeros((0, 5), bool), (5,), "no questions"),
        (np.full((2, 3), 2), (1,), "0/1"),
        (np.zeros((2, 3), bool), (0,), "positive"),
    ],
)
def test_top_k_recall_rejects_bad_input(hits, ks, message):
  with pytest.raises(ValueError, match=message):
    metrics.top_k_recall(hits, ks=ks)


# ----------------------------------------------------------------------------------------------
# seqio metric functions.
# ----------------------------------------------------------------------------------------------


def test_orqa_exact_match_percent():
  targets = [["Paris"], ["the Beatles", "Fab Four"], {"answers": ["1990"]}, "Einstein"]
  predictions = ["paris", "Fab four", "1991", "Albert Einstein"]
  # Correct: yes, yes (2nd reference), no, no -> 2 of 4.
  assert metrics.orqa_exact_match(targets, predictions) == {"exact_match": 50.0}
  assert metrics.orqa_exact_match([[b"Paris"]], [b"paris"]) == {"exact_match": 100.0}


def test_curated_trec_regex_match_percent():
  targets = [["19[89]0"], ["paris|london"], ["(unclosed"]]
  predictions = ["1990s", "Rome", "x"]
  # "1990s" matches at the start; "Rome" matches neither; the broken pattern is a miss -> 1 of 3.
  result = metrics.curated_trec_regex_match(targets, predictions)
  assert result == {"regex_match": pytest.approx(100.0 / 3.0)}


def test_metric_fns_reject_mismatched_or_bad_input():
  with pytest.raises(ValueError, match="2 targets but 1 predictions"):
    metrics.orqa_exact_match([["a"], ["b"]], ["a"])
  with pytest.raises(ValueError, match="1 targets but 2 predictions"):
    metrics.curated_trec_regex_match([["a"]], ["a", "b"])
  with pytest.raises(ValueError, match="no examples"):
    metrics.orqa_exact_match([], [])
  with pytest.raises(ValueError, match="target 1"):
    metrics.orqa_exact_match([["a"], []], ["a", "b"])
  with pytest.raises(ValueError, match="'answers'"):
    metrics.orqa_exact_match([{"answer": ["a"]}], ["a"])
