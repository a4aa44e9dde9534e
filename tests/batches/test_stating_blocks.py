"""realm_jax/batches/stating_blocks.py: the oracle candidates of REALM pretraining, by hand."""

import json

import numpy as np
import pytest

from realm_jax.batches import pretraining_batches
from realm_jax.batches import stating_blocks
from realm_jax.batches.pretraining_batches import NULL_BLOCK as NULL
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.data import vocab as vocab_lib
from realm_jax.index import retrieval

DOCS = [{"title": "Eiffel Tower", "text": "It stands in Paris."},
        {"title": "Paris", "text": "Paris holds the Eiffel Tower."},
        {"title": "Rome", "text": "Rome is old."},
        {"title": "Gustave Eiffel", "text": "He built the Eiffel Tower in Paris."}]
# "eiffel tower" = e ##iff ##el tower; "tower eiffel" never stands in a block.
EIFFEL_TOWER = [1041, 13355, 2884, 3578]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("stating")
  path = tmp / "docs.jsonl"
  path.write_text("".join(json.dumps(d) + "\n" for d in DOCS), encoding="utf-8")
  corpus_build.build_block_store(sources_lib.JsonlSource(str(path)), str(tmp / "store"),
                                 max_block_len=32)
  with block_store_lib.BlockStore.open(str(tmp / "store")) as opened:
    yield opened


def by_uid(store, ids):
  return sorted(ids, key=lambda i: int(store.uids[i]))


def test_the_store_is_one_block_per_document(store):
  assert vocab_lib.default_vocabulary().encode("Eiffel Tower") == EIFFEL_TOWER
  assert store.num_blocks == 4 and [int(d) for d in store.doc_ids] == [0, 1, 2, 3]


def test_holding_finds_whole_phrases_in_title_or_body(store):
  lookup = stating_blocks.StatingBlocks(store)
  assert lookup.holding(EIFFEL_TOWER).tolist() == [0, 1, 3]  # title of 0, bodies of 1 and 3
  assert lookup.holding(EIFFEL_TOWER[:3]).tolist() == [0, 1, 3]  # "eiffel": also 3's title
  assert lookup.holding([3578, 1041]).tolist() == []  # "tower eiffel": both words, never so
  rome = vocab_lib.default_vocabulary().encode("rome is old")
  assert lookup.holding(rome).tolist() == [2]
  assert lookup.holding([]).tolist() == [] and lookup.holding([29999]).tolist() == []


def test_stating_leaves_out_the_source_document_and_orders_by_uid(store):
  lookup = stating_blocks.StatingBlocks(store)
  assert lookup.stating(EIFFEL_TOWER, int(store.uids[0])).tolist() == by_uid(store, [1, 3])
  assert lookup.stating(EIFFEL_TOWER, int(store.uids[3])).tolist() == by_uid(store, [0, 1])
  assert lookup.stating(EIFFEL_TOWER, 0).tolist() == by_uid(store, [0, 1, 3])  # no source
  assert lookup.document_of(int(store.uids[2])) == 2 and lookup.document_of(12345) is None


def test_masked_phrase_is_one_contiguous_span_in_position_order():
  positions = np.array([5, 3, 4, 0, 0])
  targets = np.array([30, 10, 20, 0, 0])
  weights = np.array([1.0, 1.0, 1.0, 0.0, 0.0])
  assert stating_blocks.masked_phrase(positions, targets, weights).tolist() == [10, 20, 30]
  gap = np.array([5, 2, 4, 0, 0])  # random-token masks: no phrase
  assert stating_blocks.masked_phrase(gap, targets, weights) is None
  assert stating_blocks.masked_phrase(positions, targets, np.zeros(5)) is None


def test_put_first_moves_and_cuts():
  retrieved = np.array([[2, 1, 0, 3], [5, 6, 7, 8]])
  out = stating_blocks.put_first(retrieved, [np.array([3, 1]), np.array([], np.int64)])
  assert out.tolist() == [[3, 1, 2, 0], [5, 6, 7, 8]] and out.dtype == np.int32
  assert stating_blocks.put_first(retrieved[:1], [np.array([9, 8, 7, 6, 5])]).tolist() == [
      [9, 8, 7, 6]]


def masked_query(store, source_block, positions):
  """One masked query whose masks at `positions` hold "eiffel tower" (batch of one)."""
  cls, sep, mask = 101, 102, 103
  query = [cls, 1996, mask, mask, mask, mask, 2003, 4206, sep] + [0] * 3
  pad = lambda values: list(values) + [0] * (10 - len(values))
  return {
      "query_ids": np.array([query], np.int32),
      "query_mask": np.array([[1] * 9 + [0] * 3], np.int32),
      "mlm_positions": np.array([pad(positions)], np.int32),
      "mlm_targets": np.array([pad(EIFFEL_TOWER)], np.int32),
      "mlm_weights": np.array([pad([1.0] * 4)], np.float32),
      # The tasks carry the uid's bits as int64.
      "source_uid": np.array([store.uids[source_block]], np.uint64).view(np.int64),
  }


class Repeat:
  """The same masked batch again and again, with the state interface of `SeqioBatches`."""

  def __init__(self, batch):
    self.batch, self.consumed = batch, 0

  def __next__(self):
    self.consumed += 1
    return dict(self.batch)

  def state(self):
    return {"batches_consumed": self.consumed}

  def restore(self, state):
    self.consumed = state["batches_consumed"]


def test_pretraining_batches_put_a_stating_block_first(store):
  def fn(query_ids, query_mask, k):
    ids = np.array([[0, 2, 1, 3][:k]] * len(query_ids), np.int32)  # the source ranked first
    return np.zeros(ids.shape, np.float32), ids

  retriever = retrieval.FunctionRetriever(4, fn, block_store_id=store.store_id)
  make = lambda oracle, positions: pretraining_batches.PretrainingBatches(
      Repeat(masked_query(store, 0, positions)), store, retriever, num_candidates=3,
      oracle_blocks=oracle)
  # Without the oracle: [null] + the top 3 less the source = [null, 2, 1].
  plain = make(0, [2, 3, 4, 5])
  assert next(plain)["candidate_block_ids"].tolist() == [[NULL, 2, 1]]
  assert "retrieval/oracle_fraction" not in plain.metrics()
  # With one oracle block: the first stating block by uid of documents 1 and 3, then the
  # retrieved order (the source 0 removed), cut to the 3 columns.
  first = by_uid(store, [1, 3])[0]
  oracle = make(1, [2, 3, 4, 5])
  # Retrieved [0, 2, 1] becomes [first, 0, 2] (1 moved ahead) or [3, 0, 2] (3 put in, 1 cut).
  expected = [NULL, 1, 2] if first == 1 else [NULL, 3, 2]
  assert next(oracle)["candidate_block_ids"].tolist() == [expected]
  assert oracle.metrics()["retrieval/oracle_fraction"] == 1.0
  state = json.loads(json.dumps(oracle.state()))
  assert state["oracle_rows"] == 1
  resumed = make(1, [2, 3, 4, 5])
  resumed.restore(state)
  next(resumed)
  assert resumed.state()["oracle_rows"] == 2 and resumed.metrics()[
      "retrieval/oracle_fraction"] == 1.0
  # Masks that are not one span get no oracle block.
  scattered = make(1, [2, 3, 5, 6])
  assert next(scattered)["candidate_block_ids"].tolist() == [[NULL, 2, 1]]
  assert scattered.metrics()["retrieval/oracle_fraction"] == 0.0
  with pytest.raises(ValueError, match="oracle_blocks >= 0"):
    make(-1, [2, 3, 4, 5])
