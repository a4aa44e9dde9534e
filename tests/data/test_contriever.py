"""Contriever's crop pairs (realm_jax.data.contriever): hand-worked crops, rows and truncation;
the crops' length and position bounds; the two crops' independence against the exact
probabilities of independent crops (enumerated here, not sampled); ICT's example layout; the
errors. Expected ids are written by hand from the vocabulary's wordpieces."""

import hashlib
import math

import numpy as np
import pytest

from realm_jax.data import contriever
from realm_jax.data import ict
from realm_jax.data.masking import SkipCounter
from realm_jax.data.vocab import default_vocabulary

TITLE = "Tessavar"  # wordpieces: tessa ##var
WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
         "eighteen", "nineteen", "twenty", "."]
BODY = " ".join(WORDS[:-1]).capitalize() + "."  # 21 wordpieces, one per word and the period


@pytest.fixture(scope="module")
def vocab():
  return default_vocabulary()


def ids(vocab, tokens, length):
  out = [vocab.token_to_id(t) for t in tokens]
  assert [vocab.id_to_token(i) for i in out] == tokens  # no [UNK] fallback
  return out + [0] * (length - len(out))


def expected_uid(title, body):
  # content_uid's definition: first 8 bytes, big-endian, of sha256(title \0 body).
  return int.from_bytes(hashlib.sha256(f"{title}\x00{body}".encode()).digest()[:8], "big")


def test_the_body_is_one_wordpiece_per_word(vocab):
  assert [vocab.id_to_token(i) for i in vocab.encode(BODY)] == WORDS


def test_hand_example_disjoint_crops(vocab):
  # The draws, in order (numpy default_rng(0)): ratio 0.3548 -> floor(0.3548 * 21) = 7
  # wordpieces, start 7: crop 1 = [7, 14) "eight .. fourteen"; ratio 0.1164 -> floor(2.44) = 2,
  # start 5: crop 2 = [5, 7) "six seven". Disjoint.
  example = contriever.make_contriever_example(TITLE, BODY, rng=np.random.default_rng(0),
                                               vocab=vocab, query_len=12, block_len=16)
  assert example["query_span"].tolist() == [7, 14]
  assert example["block_span"].tolist() == [5, 7]
  assert example["query_ids"].tolist() == ids(vocab, ["[CLS]", *WORDS[7:14], "[SEP]"], 12)
  assert example["query_mask"].tolist() == [1] * 9 + [0] * 3
  block = ["[CLS]", "tessa", "##var", "[SEP]", "six", "seven", "[SEP]"]
  assert example["block_ids"].tolist() == ids(vocab, block, 16)
  # Types as ICT's: 0 on [CLS] title [SEP] (4), 1 on the crop and its [SEP] (3), 0 on padding.
  assert example["block_type_ids"].tolist() == [0] * 4 + [1] * 3 + [0] * 9
  assert example["block_mask"].tolist() == [1] * 7 + [0] * 9
  # The uid is the whole block's, the one the index knows it by.
  assert example["block_uid"] == np.uint64(expected_uid(TITLE, BODY))


def test_hand_example_overlapping_and_nested_crops(vocab):
  # default_rng(2): 0.2046 -> 4 wordpieces at 1, [1, 5); 0.4257 -> 8 at 4, [4, 12): they share
  # "five". default_rng(3): 0.1343 -> 2 at 3, [3, 5); 0.4205 -> 8 at 3, [3, 11): crop 1 lies
  # inside crop 2.
  overlap = contriever.make_contriever_example(TITLE, BODY, rng=np.random.default_rng(2),
                                               vocab=vocab, query_len=16, block_len=24)
  assert overlap["query_ids"].tolist() == ids(vocab, ["[CLS]", "two", "three", "four", "five",
                                                      "[SEP]"], 16)
  assert overlap["block_ids"].tolist() == ids(
      vocab, ["[CLS]", "tessa", "##var", "[SEP]", *WORDS[4:12], "[SEP]"], 24)
  nested = contriever.make_contriever_example(TITLE, BODY, rng=np.random.default_rng(3),
                                              vocab=vocab, query_len=16, block_len=24)
  assert nested["query_span"].tolist() == [3, 5] and nested["block_span"].tolist() == [3, 11]


def test_crops_longer_than_their_rows_are_cut_at_their_end(vocab):
  # default_rng(4): 0.4772 -> 10 at 10, [10, 20); 0.4905 -> 10 at 6, [6, 16). Query row of 8:
  # 6 wordpieces of crop 1; block row of 10: [CLS] tessa ##var [SEP] + 5 of crop 2 + [SEP].
  example = contriever.make_contriever_example(TITLE, BODY, rng=np.random.default_rng(4),
                                               vocab=vocab, query_len=8, block_len=10)
  assert example["query_span"].tolist() == [10, 20]  # as drawn, before the cut
  assert example["query_ids"].tolist() == ids(vocab, ["[CLS]", *WORDS[10:16], "[SEP]"], 8)
  assert example["query_mask"].tolist() == [1] * 8
  assert example["block_ids"].tolist() == ids(
      vocab, ["[CLS]", "tessa", "##var", "[SEP]", *WORDS[6:11], "[SEP]"], 10)
  assert example["block_type_ids"].tolist() == [0] * 4 + [1] * 6


def test_the_example_has_icts_layout(vocab):
  """Same keys, shapes and dtypes as an ICT example of the block (IctModel reads either)."""
  crops = contriever.make_contriever_example(TITLE, BODY, rng=np.random.default_rng(0),
                                             vocab=vocab)
  ict_example = ict.make_ict_example(TITLE, BODY, rng=np.random.default_rng(0), vocab=vocab,
                                     remove_probability=0.0)
  for key in ("query_ids", "query_mask", "block_ids", "block_type_ids", "block_mask",
              "block_uid"):
    assert crops[key].shape == ict_example[key].shape, key
    assert crops[key].dtype == ict_example[key].dtype, key
  assert crops["query_ids"].shape == (64,) and crops["block_ids"].shape == (288,)
  assert crops["block_uid"] == ict_example["block_uid"]


def _length_probabilities(n, lo, hi):
  """{length: probability} of one crop of n wordpieces, worked out from the definition:
  ratio ~ U[lo, hi], length = max(1, floor(ratio * n)); floor(r n) = l on [l/n, (l+1)/n)."""
  probs = {}
  for l in range(0, n + 1):
    width = min(hi, (l + 1) / n) - max(lo, l / n)
    if width > 0:
      probs[max(1, l)] = probs.get(max(1, l), 0.0) + width / (hi - lo)
  return probs


def _exact_disjoint_probability(n, lo, hi):
  """P(two independent crops share no wordpiece), enumerated over lengths and starts."""
  spans = [(p / (n - l + 1), s, s + l) for l, p in _length_probabilities(n, lo, hi).items()
           for s in range(n - l + 1)]
  return sum(p1 * p2 for p1, s1, e1 in spans for p2, s2, e2 in spans if e1 <= s2 or e2 <= s1)


def test_crop_bounds_and_length_distribution():
  for n in (1, 2, 7, 21, 57, 125):
    lengths = []
    starts, ends = set(), set()
    rng = np.random.default_rng(n)
    for _ in range(2000):
      start, end = contriever.random_crop(n, rng, 0.1, 0.5)
      assert 0 <= start < end <= n
      # 10%-50% of the body, at least one wordpiece.
      assert max(1, math.floor(0.1 * n)) <= end - start <= max(1, math.floor(0.5 * n)), (n, end)
      lengths.append(end - start)
      starts.add(start)
      ends.add(end)
    assert 0 in starts and n in ends  # both ends of the body are reached
    expected = _length_probabilities(n, 0.1, 0.5)
    for length, p in expected.items():
      assert abs(lengths.count(length) / 2000 - p) < 0.04, (n, length)


def test_the_two_crops_are_independent(vocab):
  """Over many blocks' draws both overlapping and disjoint pairs occur, at the rate that two
  independent crops have (exact), and crop 1 says nothing about where crop 2 lies."""
  spans = []
  for seed in range(3000):
    example = contriever.make_contriever_example(TITLE, BODY, rng=np.random.default_rng(seed),
                                                 vocab=vocab, query_len=32, block_len=32)
    spans.append((*example["query_span"], *example["block_span"]))
  spans = np.array(spans)  # [draws, 4]: start1, end1, start2, end2
  disjoint = (spans[:, 1] <= spans[:, 2]) | (spans[:, 3] <= spans[:, 0])
  assert 0 < disjoint.sum() < len(spans)
  exact = _exact_disjoint_probability(21, 0.1, 0.5)
  assert 0.3 < exact < 0.7  # neither outcome rare: the check below has power
  assert abs(disjoint.mean() - exact) < 0.03, (disjoint.mean(), exact)
  identical = np.all(spans[:, :2] == spans[:, 2:], axis=1)
  assert identical.mean() < 0.05  # not one crop used twice
  # Neither the start, the end nor the length of crop 2 follows crop 1's.
  for a, b in ((0, 2), (1, 3)):
    assert abs(np.corrcoef(spans[:, a], spans[:, b])[0, 1]) < 0.06
  lengths = spans[:, [1, 3]] - spans[:, [0, 2]]
  assert abs(np.corrcoef(lengths[:, 0], lengths[:, 1])[0, 1]) < 0.06


def test_other_ratio_bounds_hold():
  rng = np.random.default_rng(0)
  for _ in range(500):
    start, end = contriever.random_crop(100, rng, 0.3, 0.3)
    assert end - start == 30
  for _ in range(500):
    start, end = contriever.random_crop(100, rng, 1.0, 1.0)
    assert (start, end) == (0, 100)


def test_skips_and_errors(vocab):
  skips = SkipCounter()
  assert contriever.make_contriever_example(TITLE, "  ", rng=np.random.default_rng(0),
                                            vocab=vocab, skips=skips) is None
  # A title filling the block row leaves no room for crop 2.
  assert contriever.make_contriever_example("a b c d e", BODY, rng=np.random.default_rng(0),
                                            vocab=vocab, block_len=8, skips=skips) is None
  assert skips == {"no_tokens": 1, "empty_block_body": 1}
  for lo, hi in ((0.0, 0.5), (0.6, 0.5), (0.1, 1.5), (-0.1, 0.2)):
    with pytest.raises(ValueError, match=r"0 < min_ratio <= max_ratio <= 1, got "
                                         rf"min_ratio={lo}, max_ratio={hi}"):
      contriever.make_contriever_example(TITLE, BODY, rng=np.random.default_rng(0), vocab=vocab,
                                         min_ratio=lo, max_ratio=hi)
  with pytest.raises(ValueError, match="must be numbers"):
    contriever.random_crop(10, np.random.default_rng(0), "0.1", 0.5)
  with pytest.raises(ValueError, match="at least one token"):
    contriever.random_crop(0, np.random.default_rng(0))
  with pytest.raises(ValueError, match="query_len must be >= 3"):
    contriever.make_contriever_example(TITLE, BODY, rng=np.random.default_rng(0), vocab=vocab,
                                       query_len=2)
