"""T5 span corruption with BERT's [unused*] sentinels (`realm_jax.data.sentinels`): the sentinel
ids read from the vocabulary file, inputs and targets of hand-worked spans, the span counts of
hand-worked lengths, the draw's statistics against exact references (stars and bars, and a
brute-force enumeration of every mask), whole-word units, and the sentinel-reading vocabulary
that turns a corrupted text back into exactly its ids."""

import collections
import itertools
import math

import numpy as np
import pytest

from realm_jax.data import sentinels
from realm_jax.data import vocab as vocab_lib


@pytest.fixture(scope="module")
def vocab():
  return vocab_lib.default_vocabulary()


def ids(vocab, tokens):
  out = [vocab.token_to_id(t) for t in tokens]
  assert [vocab.id_to_token(i) for i in out] == tokens  # every wordpiece is in the vocabulary
  return out


def test_sentinels_are_the_unused_tokens_of_the_vocabulary_file():
  with open(vocab_lib.bundled_vocab_path(), encoding="utf-8") as f:
    lines = f.read().splitlines()
  # The file's line i (0-based) is id i: [PAD], then [unused0] .. [unused98], then [UNK].
  assert lines[0] == "[PAD]" and lines[100] == "[UNK]"
  expected = [lines.index(f"[unused{k}]") for k in range(99)]
  assert expected == list(range(1, 100))
  assert sentinels.sentinel_ids() == tuple(expected)
  assert sentinels.NUM_SENTINELS == 99


def test_hand_worked_spans_give_exact_inputs_and_targets(vocab):
  the, cat, sat, on, mat, dot = ids(vocab, ["the", "cat", "sat", "on", "mat", "."])
  sentence = [the, cat, sat, on, the, mat, dot]
  assert vocab.encode("the cat sat on the mat .") == sentence
  out = sentinels.corrupt(sentence, [(1, 2), (4, 6)])
  # the [unused0] sat on [unused1] .   /   [unused0] cat [unused1] the mat
  np.testing.assert_array_equal(out.inputs, [the, 1, sat, on, 2, dot])
  np.testing.assert_array_equal(out.targets, [1, cat, 2, the, mat])
  assert out.spans == ((1, 2), (4, 6))
  # A span at either end of the sequence.
  out = sentinels.corrupt(sentence, [(0, 1), (6, 7)])
  np.testing.assert_array_equal(out.inputs, [1, cat, sat, on, the, mat, 2])
  np.testing.assert_array_equal(out.targets, [1, the, 2, dot])
  # Other sentinel ids, as given.
  out = sentinels.corrupt(sentence, [(2, 4)], sentinels=[7])
  np.testing.assert_array_equal(out.inputs, [the, cat, 7, the, mat, dot])
  np.testing.assert_array_equal(out.targets, [7, sat, on])


@pytest.mark.parametrize("spans", [[(2, 2)], [(1, 3), (3, 4)], [(3, 4), (1, 2)], [(5, 9)]])
def test_bad_spans_are_refused(spans):
  with pytest.raises(ValueError, match="spans"):
    sentinels.corrupt([5000, 5001, 5002, 5003, 5004], spans)


def test_ids_that_hold_a_sentinel_are_refused():
  with pytest.raises(ValueError, match="sentinel"):
    sentinels.corrupt([5000, 1, 5002], [(0, 1)])


@pytest.mark.parametrize("num_units,noise,spans", [
    # round(n * 0.15) noise units (at least 1, at most n - 1), round(noise / 3) spans (>= 1);
    # Python's and TensorFlow's round both round half to even.
    (2, 1, 1), (7, 1, 1), (10, 2, 1), (20, 3, 1), (30, 4, 1), (40, 6, 2), (100, 15, 5),
    (110, 16, 5), (200, 30, 10)])
def test_span_counts_of_hand_worked_lengths(num_units, noise, spans):
  assert sentinels.span_counts(num_units) == (noise, spans)
  mask = sentinels.random_spans_noise_mask(num_units, np.random.default_rng(num_units))
  assert mask.sum() == noise and len(sentinels.noise_spans(mask)) == spans


def test_a_single_span_lands_anywhere_with_equal_probability():
  """n = 20: 3 noise units in 1 span, so its start is uniform over the 18 places 0..17 (T5's own
  draw always ends the sequence with it: start 17)."""
  rng = np.random.default_rng(0)
  draws = 18 * 400
  starts = collections.Counter()
  for _ in range(draws):
    (start, limit), = sentinels.noise_spans(sentinels.random_spans_noise_mask(20, rng))
    assert limit - start == 3
    starts[start] += 1
  assert sorted(starts) == list(range(18))
  counts = np.array([starts[s] for s in range(18)])
  # Each ~ Binomial(7200, 1/18): mean 400, sd 19.4.
  assert np.all(np.abs(counts - 400) < 5 * 19.4), counts


def test_span_positions_follow_the_exact_distribution_of_every_mask():
  """Every mask of 14 units with 4 noise units in 2 spans (density 0.3, mean length 2) is
  equally likely: the per-position noise frequency of many draws matches the one enumerated
  over all 2^14 masks."""
  n = 14
  assert sentinels.span_counts(n, 0.3, 2.0) == (4, 2)
  valid = [m for m in itertools.product([0, 1], repeat=n)
           if sum(m) == 4 and len(sentinels.noise_spans(m)) == 2]
  # Compositions: noise 4 into 2 non-empty spans (3 ways) x kept 10 into 3 runs, the outer two
  # possibly empty (12 into 3 non-empty: C(11, 2) = 55 ways).
  assert len(valid) == 3 * math.comb(11, 2)
  exact = np.mean(np.array(valid, float), axis=0)  # [14]
  assert exact[0] == pytest.approx(exact[-1]) and exact[0] < 0.3 < exact[n // 2]
  rng = np.random.default_rng(1)
  draws = 20000
  seen = collections.Counter()
  total = np.zeros(n)
  for _ in range(draws):
    mask = sentinels.random_spans_noise_mask(n, rng, noise_density=0.3, mean_span_length=2.0)
    seen[tuple(int(x) for x in mask)] += 1
    total += mask
  assert set(seen) == set(valid)
  np.testing.assert_allclose(total / draws, exact, atol=0.015)


def test_noise_density_and_span_lengths_over_many_draws():
  """n = 100: always exactly 15 noise units (density 0.15) in 5 spans (mean length 3); a span's
  length is distributed as one part of a uniform composition of 15 into 5, P(l) =
  C(14 - l, 3) / C(14, 4); the runs before the first and after the last span average
  87 / 6 - 1 = 13.5 (T5's draw: at least 1, and 0)."""
  rng = np.random.default_rng(2)
  draws = 4000
  lengths = collections.Counter()
  first, last = [], []
  for _ in range(draws):
    mask = sentinels.random_spans_noise_mask(100, rng)
    spans = sentinels.noise_spans(mask)
    assert mask.sum() == 15 and len(spans) == 5
    for start, limit in spans:
      lengths[limit - start] += 1
    first.append(spans[0][0])
    last.append(100 - spans[-1][1])
  assert sum(lengths.values()) == 5 * draws
  assert sum(l * c for l, c in lengths.items()) / (5 * draws) == 3.0
  for length in range(1, 12):
    expected = math.comb(14 - length, 3) / math.comb(14, 4)
    observed = lengths[length] / (5 * draws)
    sd = math.sqrt(expected * (1 - expected) / (5 * draws))
    assert abs(observed - expected) < 5 * sd + 1e-3, (length, observed, expected)
  assert max(lengths) <= 11
  assert abs(np.mean(first) - 13.5) < 1.0 and abs(np.mean(last) - 13.5) < 1.0
  assert min(first) == 0 and min(last) == 0  # a span may start or end the sequence


def test_spans_cover_whole_units(vocab):
  # "aive esbro was a physician at the vrurnvron press ." -> 14 wordpieces, 10 words.
  tokens = ["ai", "##ve", "es", "##bro", "was", "a", "physician", "at", "the", "vr", "##urn",
            "##vron", "press", "."]
  sentence = ids(vocab, tokens)
  starts = sentinels.word_starts(sentence, vocab)
  np.testing.assert_array_equal(starts, [not t.startswith("##") for t in tokens])
  rng = np.random.default_rng(3)
  for _ in range(300):
    out = sentinels.span_corruption(sentence, rng, unit_starts=starts, noise_density=0.3)
    # 10 units: 3 noise units in 1 span; whole words, so a span starts and ends at a word.
    assert len(out.spans) == 1
    (start, limit), = out.spans
    assert starts[start] and (limit == len(sentence) or starts[limit])
    # Inputs and targets put back together are the sentence.
    restored = list(out.inputs[:start]) + list(out.targets[1:]) + list(out.inputs[start + 1:])
    assert restored == sentence
  with pytest.raises(ValueError, match="first True"):
    sentinels.span_corruption(sentence, rng, unit_starts=[False] + [True] * 13)
  with pytest.raises(ValueError, match="at least 2 units"):
    sentinels.span_corruption(sentence[:2], rng, unit_starts=[True, False])


def test_the_sentinel_vocabulary_reads_sentinel_names_as_their_ids(vocab):
  sentinel_vocab = sentinels.sentinel_vocabulary()
  alpha, beta, dot = ids(vocab, ["alpha", "beta", "."])
  # WordPiece splits a sentinel's name as text: the reason the targets are built from ids.
  assert vocab.encode("alpha [unused0] beta") == [
      alpha, *ids(vocab, ["[", "unused", "##0", "]"]), beta]
  assert sentinel_vocab.encode("alpha [unused0] beta [unused98].") == [alpha, 1, beta, 99, dot]
  assert sentinel_vocab.encode("alpha[unused1]beta") == [alpha, 2, beta]
  # [unused99] is no sentinel (its id is 104): read as WordPiece reads it.
  assert sentinel_vocab.encode("[unused99]") == vocab.encode("[unused99]")
  # The rest is the vocabulary's: decoding writes a sentinel's name.
  assert sentinel_vocab.decode([alpha, 1, beta]) == "alpha [unused0] beta"
  assert sentinel_vocab.tokenize_with_offsets("alpha beta") == vocab.tokenize_with_offsets(
      "alpha beta")
  assert sentinel_vocab != vocab and sentinel_vocab == sentinels.SentinelVocabulary()


def test_a_corrupted_text_reads_back_to_its_ids(vocab):
  text = "Aive Esbro was a physician at the Vrurnvron Press."
  sentence, starts, limits = vocab.tokenize_with_offsets(text)
  # Spans: "aive esbro" (wordpieces 0..3) and "vrurnvron press" (9..12).
  out = sentinels.corrupt(sentence, [(0, 4), (9, 13)])
  corrupted = sentinels.corrupted_text(text, starts, limits, out.spans)
  assert corrupted == "[unused0] was a physician at the [unused1] ."
  assert sentinels.sentinel_vocabulary().encode(corrupted) == out.inputs.tolist()
  np.testing.assert_array_equal(out.targets, [1, *sentence[0:4], 2, *sentence[9:13]])
