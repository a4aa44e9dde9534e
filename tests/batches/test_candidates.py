"""Candidates for REALM pretraining (REALM_SPEC 11-13, 21): the authors' selection rule, the null
document, embedder and reader inputs checked token by token, and the assembled batch."""

import json

import numpy as np
import pytest

from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.data import vocab as vocab_lib
from realm_jax.batches import pretraining_batches
from realm_jax.batches.pretraining_batches import NULL_BLOCK as NULL

CLS, SEP, MASK = vocab_lib.CLS_ID, vocab_lib.SEP_ID, vocab_lib.MASK_ID

# ------------------------------------------------------------------------------ selection
# Synthetic search results: the block ranked i (1-based) is r_i = 10 + i with uid 1000 + i.


def ranked(num=8):
  ids = np.arange(11, 11 + num, dtype=np.int32)  # r1..r_num
  uids = np.arange(1001, 1001 + num, dtype=np.uint64)
  return ids, uids


def r(*ranks):
  return [10 + i for i in ranks]


def select_one(ids, uids, source_uid, **kwargs):
  sel = pretraining_batches.select_candidates(np.asarray(ids)[None],
                                              np.asarray(uids, np.uint64)[None],
                                              np.asarray([source_uid], np.uint64), **kwargs)
  return sel


def test_source_ranked_third_is_removed():
  ids, uids = ranked()
  sel = select_one(ids, uids, source_uid=1003)
  assert sel.candidate_ids.tolist() == [[NULL] + r(1, 2, 4, 5, 6, 7, 8)]
  assert sel.candidate_ids.dtype == np.int32
  assert sel.keep.tolist() == [True] and sel.source_removed.tolist() == [True]
  assert dict(sel.skip_counts) == {"duplicate_candidates": 0, "too_few_candidates": 0}


@pytest.mark.parametrize("source_uid", [4242, 0])  # not retrieved / no source block at all
def test_source_absent_keeps_top_seven(source_uid):
  ids, uids = ranked()
  sel = select_one(ids, uids, source_uid=source_uid)
  assert sel.candidate_ids.tolist() == [[NULL] + r(1, 2, 3, 4, 5, 6, 7)]
  assert sel.keep.tolist() == [True] and sel.source_removed.tolist() == [False]


@pytest.mark.parametrize("duplicates", ["skip", "dedupe"])
def test_without_the_null_document_eight_real_blocks(duplicates):
  # The ablation: no null slot; 9 retrieved so that 8 remain when the source is among them.
  ids, uids = ranked(9)
  third = select_one(ids, uids, source_uid=1003, null_document=False, duplicates=duplicates)
  assert third.candidate_ids.tolist() == [r(1, 2, 4, 5, 6, 7, 8, 9)]
  assert third.source_removed.tolist() == [True] and third.keep.tolist() == [True]
  absent = select_one(ids, uids, source_uid=4242, null_document=False, duplicates=duplicates)
  assert absent.candidate_ids.tolist() == [r(1, 2, 3, 4, 5, 6, 7, 8)]
  with pytest.raises(ValueError, match="need at least 9 retrieved blocks"):
    select_one(*ranked(8), source_uid=0, null_document=False)


def test_source_ranked_first_and_last():
  ids, uids = ranked()
  first = select_one(ids, uids, source_uid=1001)
  assert first.candidate_ids.tolist() == [[NULL] + r(2, 3, 4, 5, 6, 7, 8)]
  last = select_one(ids, uids, source_uid=1008)
  # r8 was going to be truncated anyway; it is still "removed" (it was among the top 8).
  assert last.candidate_ids.tolist() == [[NULL] + r(1, 2, 3, 4, 5, 6, 7)]
  assert first.source_removed.tolist() == last.source_removed.tolist() == [True]


def test_zero_source_uid_never_removes_a_block():
  ids, uids = ranked()
  uids[2] = 0  # a block whose uid happens to be 0 must not count as "the source"
  sel = select_one(ids, uids, source_uid=0)
  assert sel.candidate_ids.tolist() == [[NULL] + r(1, 2, 3, 4, 5, 6, 7)]
  assert sel.source_removed.tolist() == [False]


def test_duplicate_documents_in_top_eight_skip_the_example():
  ids, uids = ranked()
  uids[5] = uids[1]  # r6 is the same document (title and body) as r2
  sel = select_one(ids, uids, source_uid=4242)
  assert sel.keep.tolist() == [False] and sel.source_removed.tolist() == [False]
  assert sel.candidate_ids.tolist() == [[NULL] * 8]  # well-formed filler, no information
  assert sel.skip_counts["duplicate_candidates"] == 1


def test_same_block_retrieved_twice_is_a_duplicate():
  ids, uids = ranked()
  ids[7], uids[7] = ids[0], uids[0]
  assert select_one(ids, uids, source_uid=0).keep.tolist() == [False]


def test_duplicate_check_comes_before_source_removal():
  # The source appears twice: the release skips (duplicates first), it does not remove both.
  ids, uids = ranked()
  uids[1] = uids[4] = 1002
  sel = select_one(ids, uids, source_uid=1002)
  assert sel.keep.tolist() == [False]
  assert sel.skip_counts["duplicate_candidates"] == 1


def test_margin_is_ignored_by_the_authors_rule():
  ids, uids = ranked(12)
  uids[8] = uids[0]  # a duplicate of r1 at rank 9: outside the top 8, not a skip
  for source_uid in (1003, 1009, 4242):  # source in the top 8, in the margin, absent
    with_margin = select_one(ids, uids, source_uid)
    without = select_one(ids[:8], uids[:8], source_uid)
    assert with_margin.candidate_ids.tolist() == without.candidate_ids.tolist()
    assert with_margin.keep.tolist() == [True]
  assert select_one(ids, uids, 1009).candidate_ids.tolist() == [[NULL] + r(1, 2, 3, 4, 5, 6, 7)]


def test_dedupe_refills_from_the_margin():
  ids, uids = ranked(12)
  uids[5] = uids[1]  # r6 duplicates r2
  sel = select_one(ids, uids, source_uid=1003, duplicates="dedupe")
  # Distinct in rank order: r1 r2 r3 r4 r5 r7 r8 r9 ...; r3 is the source.
  assert sel.candidate_ids.tolist() == [[NULL] + r(1, 2, 4, 5, 7, 8, 9)]
  assert sel.keep.tolist() == [True] and sel.source_removed.tolist() == [True]
  # Without a duplicate in the top 8, "dedupe" is exactly the authors' rule.
  ids, uids = ranked(12)
  for source_uid in (1001, 1003, 1008, 1010, 0):
    assert (select_one(ids, uids, source_uid, duplicates="dedupe").candidate_ids.tolist()
            == select_one(ids, uids, source_uid).candidate_ids.tolist())


def test_dedupe_skips_when_the_margin_is_too_small():
  ids, uids = ranked(9)
  uids[5] = uids[1]
  uids[6] = uids[2]  # 7 distinct blocks, one of them the source: 6 < 7
  sel = select_one(ids, uids, source_uid=1001, duplicates="dedupe")
  assert sel.keep.tolist() == [False]
  assert dict(sel.skip_counts) == {"duplicate_candidates": 0, "too_few_candidates": 1}


def test_mixed_batch_and_skip_counts():
  ids, uids = ranked()
  dup_uids = uids.copy()
  dup_uids[3] = dup_uids[6]
  batch_ids = np.stack([ids] * 5)  # [5, 8]
  batch_uids = np.stack([uids, uids, dup_uids, uids, dup_uids])  # [5, 8]
  sources = np.array([1003, 4242, 1001, 1001, 0], np.uint64)
  sel = pretraining_batches.select_candidates(batch_ids, batch_uids, sources)
  assert sel.candidate_ids.tolist() == [
      [NULL] + r(1, 2, 4, 5, 6, 7, 8),
      [NULL] + r(1, 2, 3, 4, 5, 6, 7),
      [NULL] * 8,
      [NULL] + r(2, 3, 4, 5, 6, 7, 8),
      [NULL] * 8,
  ]
  assert sel.keep.tolist() == [True, True, False, True, False]
  assert sel.source_removed.tolist() == [True, False, False, True, False]
  assert sel.skip_counts["duplicate_candidates"] == 2
  assert sel.num_candidates == 8
  # Counts of several batches add up (a SkipCounter).
  assert (sel.skip_counts + sel.skip_counts)["duplicate_candidates"] == 4


def test_other_num_candidates():
  ids, uids = ranked(5)
  sel = select_one(ids, uids, source_uid=1002, num_candidates=4)
  assert sel.candidate_ids.tolist() == [[NULL] + r(1, 3, 4)]
  assert select_one(ids, uids, 0, num_candidates=1).candidate_ids.tolist() == [[NULL]]


def test_selection_refuses_bad_input():
  ids, uids = ranked(7)
  with pytest.raises(ValueError, match="need at least 8 retrieved blocks"):
    select_one(ids, uids, 0)
  ids, uids = ranked()
  ids[7] = -1
  with pytest.raises(ValueError, match="negative"):
    select_one(ids, uids, 0)
  with pytest.raises(ValueError, match="duplicates must be"):
    select_one(*ranked(), 0, duplicates="drop")
  with pytest.raises(ValueError, match="source_uids"):
    pretraining_batches.select_candidates(ranked()[0][None], ranked()[1][None],
                                          np.zeros([2], np.uint64))


# ------------------------------------------------------------------------------ model inputs

# Three one-block documents (max_block_len 32). By hand, with BERT's uncased vocabulary:
#   "eiffel tower" = 1041 13355 2884 3578      "it stands in paris ." = 2009 4832 1999 3000 1012
#   "oslo" = 9977, "oslo is cold ." = 9977 2003 3147 1012
#   "rome" = 4199, "rome is old ." = 4199 2003 2214 1012
DOCS = [{"title": "Eiffel Tower", "text": "It stands in Paris."},
        {"title": "Oslo", "text": "Oslo is cold."},
        {"title": "Rome", "text": "Rome is old."}]
TITLE0 = [1041, 13355, 2884, 3578]
BODY0 = [2009, 4832, 1999, 3000, 1012]
BLOCK_LEN = 32
QUERY_LEN = 12
# "the eiffel tower is tall" with "eiffel tower" masked: [CLS] the M M M M is tall [SEP] 0 0 0
QUERY = [CLS, 1996, MASK, MASK, MASK, MASK, 2003, 4206, SEP, 0, 0, 0]
QUERY_MASK = [1] * 9 + [0] * 3


def pad(values, length):
  return list(values) + [0] * (length - len(values))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("candidates")
  path = tmp / "docs.jsonl"
  path.write_text("".join(json.dumps(d) + "\n" for d in DOCS), encoding="utf-8")
  corpus_build.build_block_store(sources_lib.JsonlSource(str(path)), str(tmp / "store"),
                                 max_block_len=BLOCK_LEN)
  with block_store_lib.BlockStore.open(str(tmp / "store")) as opened:
    yield opened


def test_hand_worked_tokens_match_the_vocabulary(store):
  vocab = vocab_lib.default_vocabulary()
  assert vocab.encode("Eiffel Tower") == TITLE0
  assert vocab.encode("It stands in Paris.") == BODY0
  assert vocab.encode("the eiffel tower is tall") == [1996, 1041, 13355, 2884, 3578, 2003, 4206]
  assert store.num_blocks == 3 and store.title(0) == "Eiffel Tower"


def test_null_embedder_input():
  ids, type_ids, mask = pretraining_batches.null_embedder_input(8)
  assert ids.tolist() == [CLS, SEP, SEP, 0, 0, 0, 0, 0]
  assert type_ids.tolist() == [0, 0, 1, 0, 0, 0, 0, 0]  # empty title: segment 0; body [SEP]: 1
  assert mask.tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
  assert pretraining_batches.null_embedder_input()[0].shape == (288,)
  assert {a.dtype for a in pretraining_batches.null_embedder_input(3)} == {np.dtype(np.int32)}


def test_embedder_inputs_by_hand(store):
  ids, type_ids, mask = pretraining_batches.embedder_inputs(store, [[NULL, 0], [2, NULL]])
  assert ids.shape == type_ids.shape == mask.shape == (2, 2, BLOCK_LEN)
  assert ids.dtype == type_ids.dtype == mask.dtype == np.int32
  # Block 0: [CLS] eiffel tower [SEP] it stands in paris . [SEP]
  assert ids[0, 1].tolist() == pad([CLS] + TITLE0 + [SEP] + BODY0 + [SEP], BLOCK_LEN)
  assert type_ids[0, 1].tolist() == pad([0] * 6 + [1] * 6, BLOCK_LEN)
  assert mask[0, 1].tolist() == pad([1] * 12, BLOCK_LEN)
  # Block 2: [CLS] rome [SEP] rome is old . [SEP]
  assert ids[1, 0].tolist() == pad([CLS, 4199, SEP, 4199, 2003, 2214, 1012, SEP], BLOCK_LEN)
  # The null document, wherever it sits.
  for b, k in ((0, 0), (1, 1)):
    assert ids[b, k].tolist() == pad([CLS, SEP, SEP], BLOCK_LEN)
    assert type_ids[b, k].tolist() == pad([0, 0, 1], BLOCK_LEN)
    assert mask[b, k].tolist() == pad([1, 1, 1], BLOCK_LEN)
  # Longer rows are padded; shorter ones are refused; unknown ids are refused.
  long_ids, _, long_mask = pretraining_batches.embedder_inputs(store, [[0, NULL]], block_len=40)
  assert long_ids[0, 0].tolist() == pad(ids[0, 1].tolist(), 40)
  assert long_mask[0, 1].tolist() == pad([1, 1, 1], 40)
  with pytest.raises(ValueError, match="shorter"):
    pretraining_batches.embedder_inputs(store, [[0]], block_len=16)
  with pytest.raises(ValueError, match="neither"):
    pretraining_batches.embedder_inputs(store, [[3]])
  with pytest.raises(ValueError, match="neither"):
    pretraining_batches.embedder_inputs(store, [[-2]])


def test_reader_inputs_by_hand(store):
  query_ids = np.array([QUERY], np.int32)  # [1, 12]
  query_mask = np.array([QUERY_MASK], np.int32)
  ids, type_ids, mask = pretraining_batches.reader_inputs(store, query_ids, query_mask,
                                                          [[NULL, 0, 1]])
  reader_len = QUERY_LEN + BLOCK_LEN  # the default: 12 + 32
  assert ids.shape == type_ids.shape == mask.shape == (1, 3, reader_len)
  assert ids.dtype == type_ids.dtype == mask.dtype == np.int32
  q = QUERY[:9]  # [CLS] q [SEP]
  # Null: [CLS] q [SEP] [SEP].
  assert ids[0, 0].tolist() == pad(q + [SEP], reader_len)
  assert type_ids[0, 0].tolist() == pad([0] * 9 + [1], reader_len)
  assert mask[0, 0].tolist() == pad([1] * 10, reader_len)
  # Block 0: [CLS] q [SEP] it stands in paris . [SEP], no title.
  assert ids[0, 1].tolist() == pad(q + BODY0 + [SEP], reader_len)
  assert type_ids[0, 1].tolist() == pad([0] * 9 + [1] * 6, reader_len)
  assert mask[0, 1].tolist() == pad([1] * 15, reader_len)
  assert not set(TITLE0[:3]) & set(ids[0, 1].tolist())  # "eiffel" "##..." never appear
  # Block 1: [CLS] q [SEP] oslo is cold . [SEP]
  assert ids[0, 2].tolist() == pad(q + [9977, 2003, 3147, 1012, SEP], reader_len)
  # The query part is shared, so the mask positions index every row like the query.
  positions = np.array([2, 3, 4, 5])
  for k in range(3):
    assert ids[0, k, positions].tolist() == query_ids[0, positions].tolist() == [MASK] * 4


def test_reader_body_is_truncated_to_the_room_left(store):
  query_ids = np.array([QUERY], np.int32)
  query_mask = np.array([QUERY_MASK], np.int32)
  # reader_len 13: [CLS] q [SEP] (9) + 3 body wordpieces + [SEP].
  ids, type_ids, mask = pretraining_batches.reader_inputs(store, query_ids, query_mask, [[0]],
                                                          reader_len=13)
  assert ids[0, 0].tolist() == QUERY[:9] + BODY0[:3] + [SEP]
  assert type_ids[0, 0].tolist() == [0] * 9 + [1] * 4
  assert mask[0, 0].tolist() == [1] * 13
  with pytest.raises(ValueError, match="must exceed"):
    pretraining_batches.reader_inputs(store, query_ids, query_mask, [[0]], reader_len=QUERY_LEN)


def test_reader_refuses_malformed_queries(store):
  good = np.array([QUERY], np.int32)
  good_mask = np.array([QUERY_MASK], np.int32)
  no_sep = good.copy()
  no_sep[0, 8] = 0
  holes = good_mask.copy()
  holes[0, 3] = 0
  for query_ids, query_mask in ((no_sep, good_mask), (good, holes),
                                (np.zeros_like(good), np.zeros_like(good_mask))):
    with pytest.raises(ValueError, match=r"\[CLS\] q \[SEP\]"):
      pretraining_batches.reader_inputs(store, query_ids, query_mask, [[NULL]])


# ------------------------------------------------------------------------------ the batch


def masked_batch(store, source_blocks):
  """A batch of the same masked query, with `source_blocks[b]` as its source (-1: none)."""
  batch_size = len(source_blocks)
  positions = pad([2, 3, 4, 5], 10)
  return {
      "query_ids": np.tile(np.array(QUERY, np.int32), (batch_size, 1)),
      "query_mask": np.tile(np.array(QUERY_MASK, np.int32), (batch_size, 1)),
      "mlm_positions": np.tile(np.array(positions, np.int32), (batch_size, 1)),
      "mlm_targets": np.tile(np.array(pad([1041, 13355, 2884, 3578], 10), np.int32),
                             (batch_size, 1)),
      "mlm_weights": np.tile(np.array(pad([1.0] * 4, 10), np.float32), (batch_size, 1)),
      "source_uid": np.array([store.uids[i] if i >= 0 else 0 for i in source_blocks], np.uint64),
      "span_byte_start": np.zeros([batch_size], np.int64),  # extra keys are ignored
  }


def test_build_pretraining_batch(store):
  # Example 0: its source (block 0) is retrieved first and removed.
  # Example 1: no source; candidates [null, 1, 2].
  # Example 2: block 2 retrieved twice -> duplicate documents -> skipped, zero weights.
  retrieved = np.array([[0, 1, 2], [1, 2, 0], [2, 2, 1]], np.int32)
  masked = masked_batch(store, [0, -1, 1])
  batch, skips = pretraining_batches.build_pretraining_batch(store, masked, retrieved,
                                                             index_step=1500, num_candidates=3)
  assert dict(skips) == {"duplicate_candidates": 1, "too_few_candidates": 0}
  expected = {
      "query_ids": ((3, 12), np.int32), "query_type_ids": ((3, 12), np.int32),
      "query_mask": ((3, 12), np.int32),
      "candidate_input_ids": ((3, 3, 32), np.int32), "candidate_type_ids": ((3, 3, 32), np.int32),
      "candidate_mask": ((3, 3, 32), np.int32),
      "reader_ids": ((3, 3, 44), np.int32), "reader_type_ids": ((3, 3, 44), np.int32),
      "reader_mask": ((3, 3, 44), np.int32),
      "mlm_positions": ((3, 10), np.int32), "mlm_targets": ((3, 10), np.int32),
      "mlm_weights": ((3, 10), np.float32), "candidate_block_ids": ((3, 3), np.int32),
      "example_mask": ((3,), np.float32), "source_removed": ((3,), np.bool_),
      "index_step": ((), np.int32), "example_index_step": ((3,), np.int32),
  }
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
      k: (shape, np.dtype(dtype)) for k, (shape, dtype) in expected.items()}
  assert batch["candidate_block_ids"].tolist() == [[NULL, 1, 2], [NULL, 1, 2], [NULL] * 3]
  assert batch["example_mask"].tolist() == [1.0, 1.0, 0.0]
  assert batch["source_removed"].tolist() == [True, False, False]
  assert batch["mlm_weights"][:2].tolist() == [pad([1.0] * 4, 10)] * 2
  assert not batch["mlm_weights"][2].any()
  assert int(batch["index_step"]) == 1500
  assert batch["example_index_step"].tolist() == [1500] * 3
  assert not batch["query_type_ids"].any()
  # Embedder and reader rows agree with the standalone functions.
  emb = pretraining_batches.embedder_inputs(store, batch["candidate_block_ids"])
  rdr = pretraining_batches.reader_inputs(store, masked["query_ids"], masked["query_mask"],
                                          batch["candidate_block_ids"])
  for got, want in zip(("candidate_input_ids", "candidate_type_ids", "candidate_mask",
                        "reader_ids", "reader_type_ids", "reader_mask"), emb + rdr):
    np.testing.assert_array_equal(batch[got], want)
  # The shared-positions invariant, for every example and candidate.
  ids, pos = batch["reader_ids"], batch["mlm_positions"]
  for b in range(3):
    for k in range(3):
      np.testing.assert_array_equal(ids[b, k, pos[b]], batch["query_ids"][b, pos[b]])


def test_build_pretraining_batch_refuses_bad_input(store):
  masked = masked_batch(store, [-1])
  retrieved = np.array([[0, 1, 2]], np.int32)
  with pytest.raises(KeyError, match="source_uid"):
    pretraining_batches.build_pretraining_batch(
        store, {k: v for k, v in masked.items() if k != "source_uid"}, retrieved,
        index_step=0, num_candidates=3)
  on_sep = dict(masked, mlm_positions=masked["mlm_positions"].copy())
  on_sep["mlm_positions"][0, 0] = 8  # the query's [SEP]
  with pytest.raises(ValueError, match="outside"):
    pretraining_batches.build_pretraining_batch(store, on_sep, retrieved, index_step=0,
                                                num_candidates=3)
  with pytest.raises(ValueError, match="out of range"):
    pretraining_batches.build_pretraining_batch(store, masked, np.array([[0, 1, 3]]), index_step=0,
                                                num_candidates=3)


def test_paper_sized_batch(tmp_path):
  # 512 queries x 8 candidates x 384 reader tokens over 288-wordpiece blocks (the paper's
  # shapes; the speed of this step belongs in a benchmark, not a test).
  words = " ".join(f"word{i % 50}" for i in range(120))
  docs = [{"title": f"Title {i}", "text": f"{words} number {i}."} for i in range(40)]
  path = tmp_path / "docs.jsonl"
  path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
  corpus_build.build_block_store(sources_lib.JsonlSource(str(path)), str(tmp_path / "store"))
  with block_store_lib.BlockStore.open(str(tmp_path / "store")) as big:
    assert big.max_block_len == 288 and int(big.body_lengths.max()) > 200
    rng = np.random.default_rng(0)
    batch_size = 512
    retrieved = np.stack([rng.permutation(big.num_blocks)[:8] for _ in range(batch_size)])
    query = np.zeros([batch_size, 96], np.int32)
    query[:, :20] = 2000
    query[:, 0], query[:, 19], query[:, 5] = CLS, SEP, MASK
    masked = {"query_ids": query, "query_mask": (query != 0).astype(np.int32),
              "mlm_positions": np.tile(pad([5], 10), (batch_size, 1)),
              "mlm_targets": np.tile(pad([2000], 10), (batch_size, 1)),
              "mlm_weights": np.tile(pad([1.0], 10), (batch_size, 1)).astype(np.float32),
              "source_uid": big.uids[retrieved[:, 2]]}
    batch, skips = pretraining_batches.build_pretraining_batch(big, masked, retrieved, index_step=7)
  assert batch["reader_ids"].shape == (512, 8, 384)
  assert batch["candidate_input_ids"].shape == (512, 8, 288)
  assert batch["source_removed"].all() and skips["duplicate_candidates"] == 0
  assert np.all(batch["example_index_step"] == 7)
