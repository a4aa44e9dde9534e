"""Inverse Cloze Task examples (REALM_SPEC 14): query sentence, removal, block layout,
truncation, drops. Expected ids are written by hand from the vocabulary's wordpieces."""

import hashlib

import numpy as np
import pytest

from realm_jax.data import ict
from realm_jax.data.masking import SkipCounter
from realm_jax.data.vocab import default_vocabulary

TITLE = "Tessavar"  # wordpieces: tessa ##var
BODY = "Zoë moved to Ærø. She was born in 1843. Her name was Müller."
SENTENCES = [["zoe", "moved", "to", "æ", "##r", "##ø", "."],
             ["she", "was", "born", "in", "1843", "."],
             ["her", "name", "was", "muller", "."]]


@pytest.fixture(scope="module")
def vocab():
  return default_vocabulary()


def ids(vocab, tokens, length):
  out = [vocab.token_to_id(t) for t in tokens]
  # token_to_id falls back to [UNK]: check every expected wordpiece really is in the vocabulary.
  assert [vocab.id_to_token(i) for i in out] == tokens
  return out + [0] * (length - len(out))


def expected_uid(title, body):
  # content_uid's definition: first 8 bytes, big-endian, of sha256(title \0 body).
  return int.from_bytes(hashlib.sha256(f"{title}\x00{body}".encode()).digest()[:8], "big")


def test_hand_example_with_the_default_coin(vocab):
  # The draws, in order: rng.integers(3) picks the sentence, rng.random() < 0.9 removes it.
  # Seed 6 draws sentence 1 and 0.343 (removed); seed 1 draws sentence 1 and 0.950 (kept).
  removed = ict.make_ict_example(TITLE, BODY, rng=np.random.default_rng(6), vocab=vocab,
                                 query_len=12, block_len=32)
  query = ids(vocab, ["[CLS]", *SENTENCES[1], "[SEP]"], 12)
  assert removed["query_ids"].tolist() == query
  assert removed["query_mask"].tolist() == [1] * 8 + [0] * 4
  assert removed["query_sentence_index"] == 1 and removed["sentence_removed"]
  block = ["[CLS]", "tessa", "##var", "[SEP]", *SENTENCES[0], *SENTENCES[2], "[SEP]"]
  assert removed["block_ids"].tolist() == ids(vocab, block, 32)
  # Types: 0 on [CLS] title [SEP] (4), 1 on body + [SEP] (13), 0 on padding.
  assert removed["block_type_ids"].tolist() == [0] * 4 + [1] * 13 + [0] * 15
  assert removed["block_mask"].tolist() == [1] * 17 + [0] * 15
  # The uid is the original block's (with the sentence), whatever was removed.
  assert removed["block_uid"] == np.uint64(expected_uid(TITLE, BODY))
  assert removed["block_uid"].dtype == np.uint64

  kept = ict.make_ict_example(TITLE, BODY, rng=np.random.default_rng(1), vocab=vocab,
                              query_len=12, block_len=32)
  assert kept["query_ids"].tolist() == query and not kept["sentence_removed"]
  block = ["[CLS]", "tessa", "##var", "[SEP]", *sum(SENTENCES, []), "[SEP]"]
  assert kept["block_ids"].tolist() == ids(vocab, block, 32)
  assert kept["block_type_ids"].tolist() == [0] * 4 + [1] * 19 + [0] * 9
  for key in ("query_ids", "query_mask", "block_ids", "block_type_ids", "block_mask"):
    assert removed[key].dtype == np.int32 and kept[key].dtype == np.int32


def test_remove_probability_forces_removal_on_and_off(vocab):
  for seed in range(10):
    on = ict.make_ict_example(TITLE, BODY, rng=np.random.default_rng(seed), vocab=vocab,
                              remove_probability=1.0)
    off = ict.make_ict_example(TITLE, BODY, rng=np.random.default_rng(seed), vocab=vocab,
                               remove_probability=0.0)
    index = int(on["query_sentence_index"])
    assert on["sentence_removed"] and not off["sentence_removed"]
    assert on["block_mask"].sum() == 3 + 18 + 2 - len(SENTENCES[index])
    assert off["block_mask"].sum() == 3 + 18 + 2
    assert on["query_ids"].shape == (64,) and on["block_ids"].shape == (288,)


def test_block_and_query_truncation(vocab):
  # block_len 12: [CLS] tessa ##var [SEP] + 7 body wordpieces + [SEP]; the body's end is cut.
  example = ict.make_ict_example(TITLE, BODY, rng=np.random.default_rng(6), vocab=vocab,
                                 query_len=5, block_len=12, remove_probability=0.0)
  assert example["block_ids"].tolist() == ids(
      vocab, ["[CLS]", "tessa", "##var", "[SEP]", *SENTENCES[0], "[SEP]"], 12)
  assert example["block_type_ids"].tolist() == [0] * 4 + [1] * 8
  assert example["block_mask"].tolist() == [1] * 12
  # query_len 5 keeps 3 wordpieces of sentence 1.
  assert example["query_ids"].tolist() == ids(vocab, ["[CLS]", "she", "was", "born", "[SEP]"], 5)


def test_drops_are_counted(vocab):
  skips = SkipCounter()
  one = "Only one sentence here."
  assert ict.make_ict_example(TITLE, one, rng=np.random.default_rng(0), vocab=vocab,
                              remove_probability=1.0, skips=skips) is None
  assert skips == {"empty_block_body": 1}
  kept = ict.make_ict_example(TITLE, one, rng=np.random.default_rng(0), vocab=vocab,
                              remove_probability=0.0, skips=skips)
  assert kept is not None and not kept["sentence_removed"]
  # A title that fills the block leaves no room for the body.
  assert ict.make_ict_example("word " * 20, BODY, rng=np.random.default_rng(0), vocab=vocab,
                              block_len=12, remove_probability=0.0, skips=skips) is None
  # A sentence with no wordpieces (a line of zero-width spaces, which BERT deletes) cannot be
  # a query; seed 1 draws sentence 0 of 2.
  assert ict.make_ict_example(TITLE, "\u200b\u200b\nNext one.", rng=np.random.default_rng(1),
                              vocab=vocab, skips=skips) is None
  assert ict.make_ict_example(TITLE, "  \n ", rng=np.random.default_rng(0), vocab=vocab,
                              skips=skips) is None
  assert skips == {"empty_block_body": 2, "empty_query_sentence": 1, "no_sentences": 1}


def test_removal_rate_and_sentence_choice(vocab):
  rng = np.random.default_rng(2024)
  examples = [ict.make_ict_example(TITLE, BODY, rng=rng, vocab=vocab, query_len=16,
                                   block_len=32) for _ in range(2000)]
  removed = np.mean([e["sentence_removed"] for e in examples])
  assert 0.87 <= removed <= 0.93  # 0.9 +- 3 standard deviations of 2000 draws
  chosen = np.bincount([e["query_sentence_index"] for e in examples], minlength=3) / 2000
  assert (chosen > 0.28).all() and (chosen < 0.39).all()


def test_deterministic_given_the_seed(vocab):
  a = ict.make_ict_example(TITLE, BODY, rng=np.random.default_rng(9), vocab=vocab)
  b = ict.make_ict_example(TITLE, BODY, rng=np.random.default_rng(9), vocab=vocab)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])
