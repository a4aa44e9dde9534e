"""Masked queries (REALM_SPEC 9-11): salient-span masking over byte spans, skips, target
limits, and the random-span / random-token ablations. Expected ids and positions are written
by hand from the vocabulary's wordpieces."""

import numpy as np
import pytest

from realm_jax.data import masking
from realm_jax.data.vocab import CLS_ID, MASK_ID, SEP_ID, default_vocabulary

TEXT = "Zoë Müller was born in Tessavar. She moved to Ærø in 1843."
# Bytes: "Zoë " = 5 (ë is 2), "Müller" = 7 -> 5..12; "Tessavar" 25..33; "." 33..34;
# sentence 2 starts at 35; "She moved to " -> "Ærø" = Æ(2) r ø(2) at 48..53; "1843" 57..61.
SENTENCE_STARTS, SENTENCE_LIMITS = [0, 35], [34, 62]


@pytest.fixture(scope="module")
def vocab():
  return default_vocabulary()


def record(spans, text=TEXT, starts=SENTENCE_STARTS, limits=SENTENCE_LIMITS):
  return {"title": "Zoë", "text": text, "sentence_byte_start": list(starts),
          "sentence_byte_limit": list(limits), "span_byte_start": [s for s, _ in spans],
          "span_byte_limit": [l for _, l in spans]}


def ids(vocab, tokens, length):
  out = [vocab.token_to_id(t) for t in tokens]
  # token_to_id falls back to [UNK]: check every expected wordpiece really is in the vocabulary.
  assert [vocab.id_to_token(i) for i in out] == tokens
  return out + [0] * (length - len(out))


def slots(values, length=10):
  return list(values) + [0] * (length - len(values))


def test_multibyte_span_masks_the_right_wordpiece(vocab):
  skips = masking.SkipCounter()
  query = masking.make_masked_query(record([(5, 12)]), strategy="salient_span",
                                    rng=np.random.default_rng(0), vocab=vocab, source_uid=77,
                                    skips=skips)
  # Sentence 1: zoe muller was born in tessa ##var . ; "Müller" is the single wordpiece
  # "muller" at sentence index 1 -> query position 2 (after [CLS]).
  expected = ids(vocab, ["[CLS]", "zoe", "[MASK]", "was", "born", "in", "tessa", "##var", ".",
                         "[SEP]"], 96)
  assert query.query_ids.tolist() == expected
  assert query.query_mask.tolist() == [1] * 10 + [0] * 86
  assert query.mlm_positions.tolist() == slots([2])
  assert query.mlm_targets.tolist() == slots([vocab.token_to_id("muller")])
  assert query.mlm_weights.tolist() == slots([1.0])  # padding slots: (0, 0, 0.0)
  assert (query.span_byte_start, query.span_byte_limit, query.sentence_index) == (5, 12, 0)
  assert query.source_uid == np.uint64(77) and not skips
  features = query.to_dict()
  assert {k: v.dtype for k, v in features.items()} == {
      "query_ids": np.int32, "query_mask": np.int32, "mlm_positions": np.int32,
      "mlm_targets": np.int32, "mlm_weights": np.float32, "source_uid": np.uint64,
      "span_byte_start": np.int64, "span_byte_limit": np.int64, "sentence_index": np.int32}


def test_span_of_several_multibyte_wordpieces(vocab):
  query = masking.make_masked_query(record([(48, 53)]), strategy="salient_span",
                                    rng=np.random.default_rng(0), vocab=vocab)
  # Sentence 2: she moved to æ ##r ##ø in 1843 . ; "Ærø" is sentence indices 3, 4, 5.
  assert query.query_ids.tolist() == ids(
      vocab, ["[CLS]", "she", "moved", "to", "[MASK]", "[MASK]", "[MASK]", "in", "1843", ".",
              "[SEP]"], 96)
  assert query.mlm_positions.tolist() == slots([4, 5, 6])
  assert query.mlm_targets.tolist() == slots(
      [vocab.token_to_id("æ"), vocab.token_to_id("##r"), vocab.token_to_id("##ø")])
  assert query.mlm_weights.tolist() == slots([1.0, 1.0, 1.0])
  assert query.sentence_index == 1


def test_partial_word_span_coverage_rules(vocab):
  rng = np.random.default_rng(0)
  overlap = masking.SalientSpanMasker(coverage="overlap")
  # "ller" (bytes 8..12) lies inside the wordpiece "muller": overlap masks all of it.
  query = masking.make_masked_query(record([(8, 12)]), strategy=overlap, rng=rng, vocab=vocab)
  assert query.mlm_positions.tolist() == slots([2])
  # "ø" (51..53) is exactly the wordpiece ##ø: both rules mask it.
  for strategy in (overlap, "salient_span"):
    query = masking.make_masked_query(record([(51, 53)]), strategy=strategy, rng=rng,
                                      vocab=vocab)
    assert query.mlm_positions.tolist() == slots([6])
  # The release's rule, the default (wordpieces entirely inside the span), masks nothing for
  # "ller".
  skips = masking.SkipCounter()
  assert masking.make_masked_query(record([(8, 12)]), rng=rng, vocab=vocab,
                                   skips=skips) is None
  assert skips == {"span_covers_no_token": 1}


def test_span_crossing_a_sentence_boundary_is_dropped(vocab):
  skips = masking.SkipCounter()
  crossing = (25, 38)  # "Tessavar. She"
  assert masking.make_masked_query(record([crossing]), rng=np.random.default_rng(0),
                                   vocab=vocab, skips=skips) is None
  assert skips == {"no_span_in_sentence": 1}
  # With a valid span next to it, the valid one is always drawn.
  for seed in range(20):
    query = masking.make_masked_query(record([crossing, (57, 61)]),
                                      rng=np.random.default_rng(seed), vocab=vocab)
    assert (query.span_byte_start, query.span_byte_limit) == (57, 61)
  assert masking.spans_by_sentence(record([crossing, (57, 61), (5, 12)])) == [
      ((57, 61), 1), ((5, 12), 0)]


def test_span_maps_to_the_first_sentence_containing_it(vocab):
  # Overlapping sentence lists are allowed by the schema: the first one that contains wins.
  rec = record([(5, 12)], starts=[35, 0, 0], limits=[62, 34, 62])
  assert masking.spans_by_sentence(rec) == [((5, 12), 1)]
  query = masking.make_masked_query(rec, rng=np.random.default_rng(0), vocab=vocab)
  assert query.sentence_index == 1 and query.mlm_positions[0] == 2


def test_span_longer_than_ten_wordpieces(vocab):
  text = ("The United Nations Educational Scientific and Cultural Organization Headquarters "
          "Building Complex Annex opened today.")
  # "United" .. "Annex" = bytes 4..103, eleven single wordpieces at sentence indices 1..11.
  span_words = ["united", "nations", "educational", "scientific", "and", "cultural",
                "organization", "headquarters", "building", "complex", "annex"]
  query = masking.make_masked_query(record([(4, 103)], text=text, starts=[0], limits=[117]),
                                    rng=np.random.default_rng(0), vocab=vocab)
  assert query.query_ids.tolist() == ids(
      vocab, ["[CLS]", "the", *["[MASK]"] * 11, "opened", "today", ".", "[SEP]"], 96)
  # The first ten get targets; the eleventh (position 12) stays [MASK] with none.
  assert query.mlm_positions.tolist() == list(range(2, 12))
  assert query.mlm_targets.tolist() == [vocab.token_to_id(w) for w in span_words[:10]]
  assert query.mlm_weights.tolist() == [1.0] * 10


def test_span_cut_by_truncation_is_skipped(vocab):
  text = ("one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
          "fifteen sixteen.")
  # query_len 16 keeps 14 wordpieces: "one" .. "fourteen" (indices 0..13).
  rec = lambda span: record([span], text=text, starts=[0], limits=[97])
  skips = masking.SkipCounter()
  rng = np.random.default_rng(0)
  # "fourteen" (bytes 72..80, index 13) is the last kept wordpiece: position 14, kept.
  query = masking.make_masked_query(rec((72, 80)), rng=rng, vocab=vocab, query_len=16,
                                    skips=skips)
  assert query.mlm_positions.tolist() == slots([14])
  assert query.query_ids.tolist() == ids(
      vocab, ["[CLS]", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
              "ten", "eleven", "twelve", "thirteen", "[MASK]", "[SEP]"], 16)
  assert query.query_mask.tolist() == [1] * 16
  # "fifteen" (81..88, index 14) and "fourteen fifteen" (72..88) would be cut: skipped.
  assert masking.make_masked_query(rec((81, 88)), rng=rng, vocab=vocab, query_len=16,
                                   skips=skips) is None
  assert masking.make_masked_query(rec((72, 88)), rng=rng, vocab=vocab, query_len=16,
                                   skips=skips) is None
  assert skips == {"span_truncated": 2}
  assert skips.summary() == "skipped 2: span_truncated=2"


def test_deterministic_given_the_seed(vocab):
  rec = record([(5, 12), (25, 33), (48, 53), (57, 61)])
  for strategy in masking.MASKERS:
    first = [masking.make_masked_query(rec, strategy=strategy, rng=np.random.default_rng(3),
                                       vocab=vocab).to_dict() for _ in range(2)]
    for key in first[0]:
      np.testing.assert_array_equal(first[0][key], first[1][key])


def test_span_sentence_pairs_are_drawn_uniformly(vocab):
  # Three distinct spans (one listed twice: duplicates count once, as in the release).
  rec = record([(5, 12), (25, 33), (48, 53), (5, 12)])
  rng = np.random.default_rng(1234)
  counts = {}
  for _ in range(2000):
    query = masking.make_masked_query(rec, rng=rng, vocab=vocab)
    counts[query.span_byte_start] = counts.get(query.span_byte_start, 0) + 1
  assert set(counts) == {5, 25, 48}
  for count in counts.values():
    assert 0.25 <= count / 2000 <= 0.42, counts


def check_invariants(query, max_masks=10):
  """[CLS]/[SEP]/padding never masked; targets point at [MASK]s; slots padded with zeros."""
  n = int(query.query_mask.sum())
  assert query.query_ids[0] == CLS_ID and query.query_ids[n - 1] == SEP_ID
  assert (query.query_ids[n:] == 0).all() and (query.query_mask[:n] == 1).all()
  k = int(query.mlm_weights.sum())
  assert 1 <= k <= max_masks
  positions = query.mlm_positions[:k]
  assert (np.diff(positions) > 0).all() and positions.min() >= 1 and positions.max() <= n - 2
  assert (query.query_ids[positions] == MASK_ID).all()
  assert (query.mlm_targets[:k] != MASK_ID).all() and (query.mlm_targets[:k] > 0).all()
  assert (query.mlm_positions[k:] == 0).all() and (query.mlm_targets[k:] == 0).all()
  assert (query.mlm_weights[:k] == 1.0).all() and (query.mlm_weights[k:] == 0.0).all()
  return positions


LONG_TEXT = " ".join(["alpha", "beta", "gamma", "delta"] * 15) + "."  # 61 wordpieces


def test_one_wordpiece_span_per_query(vocab):
  """The one-span, wordpiece variant (`unit="wordpiece"`, `mask_budget=None`)."""
  rec = record([], text=LONG_TEXT, starts=[0], limits=[len(LONG_TEXT)])
  one_span = masking.RandomSpanMasker([0.2] * 5, unit="wordpiece", mask_budget=None)
  lengths = set()
  for seed in range(200):
    query = masking.make_masked_query(rec, strategy=one_span, rng=np.random.default_rng(seed),
                                      vocab=vocab, query_len=32)
    positions = check_invariants(query)
    assert (np.diff(positions) == 1).all()  # contiguous
    assert int((query.query_ids == MASK_ID).sum()) == len(positions)
    lengths.add(len(positions))
    assert positions.max() <= 30  # within the truncated sentence
  assert lengths == {1, 2, 3, 4, 5}  # uniform over 1..5
  # A given length distribution (always 12): 12 [MASK]s, the first 10 with targets.
  masker = masking.RandomSpanMasker(length_probs=[0] * 11 + [1], unit="wordpiece",
                                    mask_budget=None)
  query = masking.make_masked_query(rec, strategy=masker, rng=np.random.default_rng(0),
                                    vocab=vocab)
  positions = check_invariants(query)
  assert int((query.query_ids == MASK_ID).sum()) == 12 and len(positions) == 10
  # A run longer than the sentence is cut to it: "Zoë" sentence has 8 wordpieces.
  short = record([], starts=[0], limits=[34])
  query = masking.make_masked_query(short, strategy=masker, rng=np.random.default_rng(0),
                                    vocab=vocab)
  assert check_invariants(query).tolist() == list(range(1, 9))


def test_spanbert_length_probs_by_hand():
  # Geometric(0.2) over 1..3, renormalised: 0.2, 0.16, 0.128 over 0.488.
  np.testing.assert_allclose(masking.spanbert_length_probs(0.2, 3),
                             np.array([0.2, 0.16, 0.128]) / 0.488)
  # SpanBERT's figure: mean 3.8 words for p = 0.2 and at most 10.
  probs = masking.spanbert_length_probs()
  assert abs(float(np.arange(1, 11) @ probs) - 3.8) < 0.01
  with pytest.raises(ValueError, match="p must be"):
    masking.spanbert_length_probs(0.0)


def test_word_starts_by_hand(vocab):
  # zoe muller was born in tessa ##var . : "tessavar" is one word of two pieces.
  pieces = ["zoe", "muller", "was", "born", "in", "tessa", "##var", "."]
  starts = vocab.word_start_table[[vocab.token_to_id(t) for t in pieces]]
  assert starts.tolist() == [True] * 6 + [False, True]


def test_spanbert_spans_are_whole_words_until_the_budget(vocab):
  # "tessavar ." repeated: words of two pieces (tessa ##var) and one (".").
  text = " ".join(["Tessavar ."] * 20)
  rec = record([], text=text, starts=[0], limits=[len(text)])
  tessa, var = vocab.token_to_id("tessa"), vocab.token_to_id("##var")
  several = 0
  for seed in range(200):
    query = masking.make_masked_query(rec, strategy="random_span",
                                      rng=np.random.default_rng(seed), vocab=vocab)
    check_invariants(query)
    masked = np.flatnonzero(query.query_ids == MASK_ID)
    # [query_len]: the ids before masking where known (the first 10 [MASK]s have targets).
    original = query.query_ids.copy()
    original[query.mlm_positions[:len(masked)]] = query.mlm_targets[:len(masked)]
    # Whole words: "tessa" is masked with its "##var", and "##var" with its "tessa".
    for position in masked:
      assert original[position] != tessa or position + 1 in masked
      assert original[position] != var or position - 1 in masked
    # The budget: 15% of 60 wordpieces is 9; the last span may overshoot it, and the longest
    # span (10 words) is at most 20 wordpieces.
    assert 9 <= len(masked) < 9 + 20, len(masked)
    several += bool((np.diff(masked) > 1).any())
  assert several > 100  # most queries hold more than one span


def test_random_span_rejects_bad_options():
  with pytest.raises(ValueError, match="unit"):
    masking.RandomSpanMasker(unit="char")
  with pytest.raises(ValueError, match="mask_budget"):
    masking.RandomSpanMasker(mask_budget=0.0)


def test_random_token_masker(vocab):
  rec = record([], text=LONG_TEXT, starts=[0], limits=[len(LONG_TEXT)])
  counts = []
  for seed in range(200):
    query = masking.make_masked_query(rec, strategy="random_token",
                                      rng=np.random.default_rng(seed), vocab=vocab)
    positions = check_invariants(query)
    # Every [MASK] has a target (over-long draws are subsampled to max_masks).
    assert int((query.query_ids == MASK_ID).sum()) == len(positions)
    assert (query.span_byte_start, query.span_byte_limit) == (-1, -1)
    counts.append(len(positions))
  assert 7 <= np.mean(counts) <= 10  # 0.15 * 61 = 9.2 before the cap of 10
  assert max(counts) == 10
  # At least one mask even when the coin never comes up.
  rare = masking.RandomTokenMasker(mask_probability=1e-9)
  query = masking.make_masked_query(record([]), strategy=rare, rng=np.random.default_rng(0),
                                    vocab=vocab)
  assert len(check_invariants(query)) == 1


# Wordpieces of TEXT's sentences inside the spans Müller, Ærø and 1843, by hand:
# "zoe muller was born in tessa ##var ." -> {1}; "she moved to æ ##r ##ø in 1843 ." -> {3, 4, 5, 7}.
KNOWLEDGE_SPANS = [(5, 12), (48, 53), (57, 61)]
SALIENT_BY_SENTENCE = {0: {1}, 1: {3, 4, 5, 7}}


def test_salient_wordpieces_by_hand(vocab):
  rec = record(KNOWLEDGE_SPANS)
  for index, expected in SALIENT_BY_SENTENCE.items():
    sentence = masking._tokenize_sentence(rec, index, vocab)  # pylint: disable=protected-access
    assert set(np.flatnonzero(masking.salient_wordpieces(rec, sentence))) == expected
  # A span covering part of a wordpiece ("ülle" of "muller") contains none of it.
  sentence = masking._tokenize_sentence(record([(6, 11)]), 0, vocab)  # pylint: disable=protected-access
  assert not masking.salient_wordpieces(record([(6, 11)]), sentence).any()


def test_random_token_knowledge_is_random_token_conditioned_on_a_salient_mask(vocab):
  """The knowledge-only query equals the first plain random-token query, drawn from the same
  generator, that masks a wordpiece of SALIENT_BY_SENTENCE (rejection sampling)."""
  rec = record(KNOWLEDGE_SPANS)
  plain = masking.RandomTokenMasker()
  redrawn = 0
  for seed in range(100):
    rng = np.random.default_rng(seed)
    for draws in range(1, 101):
      expected = masking.make_masked_query(rec, strategy=plain, rng=rng, vocab=vocab)
      masked = {int(p) - 1 for p in expected.mlm_positions[expected.mlm_weights > 0]}
      if masked & SALIENT_BY_SENTENCE[expected.sentence_index]:
        break
    redrawn += draws > 1
    got = masking.make_masked_query(rec, strategy="random_token_knowledge",
                                    rng=np.random.default_rng(seed), vocab=vocab)
    for key, value in expected.to_dict().items():
      np.testing.assert_array_equal(got.to_dict()[key], value)
  assert redrawn > 20  # the condition rejected draws, so the test compares more than one draw


def test_random_token_knowledge_skips(vocab):
  skips = masking.SkipCounter()
  knowledge = masking.get_masker("random_token_knowledge")
  assert masking.make_masked_query(record([]), strategy=knowledge,
                                   rng=np.random.default_rng(0), vocab=vocab, skips=skips) is None
  # A span inside one wordpiece: no draw can mask a salient wordpiece.
  assert masking.make_masked_query(record([(6, 11)]), strategy=knowledge,
                                   rng=np.random.default_rng(0), vocab=vocab, skips=skips) is None
  assert skips == {"no_salient_span": 1, "no_salient_mask": 1}


def test_records_without_sentences_are_skipped(vocab):
  skips = masking.SkipCounter()
  empty = record([], starts=[], limits=[])
  for strategy in masking.MASKERS:
    assert masking.make_masked_query(empty, strategy=strategy, rng=np.random.default_rng(0),
                                     vocab=vocab, skips=skips) is None
  assert skips == {"no_span_in_sentence": 1, "no_sentence": 2, "no_salient_span": 1}


def test_span_length_distribution(vocab):
  # "Müller" is 1 wordpiece, "Ærø" 3, "1843" 1; the crossing span is not counted.
  rec = record([(5, 12), (48, 53), (57, 61), (25, 38)])
  np.testing.assert_allclose(masking.span_length_distribution([rec], vocab, max_length=4),
                             [2 / 3, 0, 1 / 3, 0])


def test_annotate_record_feeds_the_masker(vocab):
  rec = masking.annotate_record("Zoë", TEXT, "dates")
  assert (rec["span_byte_start"], rec["span_byte_limit"]) == ([57], [61])
  query = masking.make_masked_query(rec, rng=np.random.default_rng(0), vocab=vocab)
  assert query.mlm_targets[0] == vocab.token_to_id("1843") and query.mlm_positions[0] == 8


def test_registry_and_arguments(vocab):
  assert set(masking.MASKERS) == {"salient_span", "random_span", "random_token",
                                  "random_token_knowledge"}
  with pytest.raises(ValueError, match="Unknown masking strategy 'bert'"):
    masking.make_masked_query(record([(5, 12)]), strategy="bert",
                              rng=np.random.default_rng(0), vocab=vocab)
  with pytest.raises(ValueError, match="query_len"):
    masking.make_masked_query(record([(5, 12)]), rng=np.random.default_rng(0), query_len=2)
