"""Over-retrieval with re-ranking (`index.rerank`, Atlas sec. 2.4): the re-ordering on a
hand-worked beam, and the live document tower's re-ranking against the tower applied by hand
(flax `RealmRetriever.embed_documents` on the store's rows, scores in NumPy)."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.index import builder
from realm_jax.index import rerank
from realm_jax.models import config as config_lib
from realm_jax.models.retriever import RealmRetriever

UNTIED = config_lib.RealmConfig(bert=config_lib.tiny_bert(), proj_size=8, share_embedders=False)


def test_rerank_beam_reorders_the_first_l_blocks_by_their_live_scores():
  # One question, q = (1, 0): a block's live score is its embedding's first coordinate.
  question_emb = np.array([[1.0, 0.0]])
  ids = np.array([[40, 41, 42, 43, 44]])
  stale = np.array([[9.0, 8.0, 7.0, 6.0, 5.0]])
  # The first L = 4 blocks re-embedded: 41 now scores 3, 43 scores 2, 40 and 42 tie at 1.
  live_emb = np.array([[[1.0, 5.0], [3.0, 0.0], [1.0, -5.0], [2.0, 0.0]]])
  scores, reranked = rerank.rerank_beam(question_emb, stale, ids, live_emb)
  # Best first; the tie keeps the stale order (40 before 42); block 44 (not re-embedded) stays
  # last with its stale score.
  np.testing.assert_array_equal(reranked, [[41, 43, 40, 42, 44]])
  np.testing.assert_array_equal(scores, [[3.0, 2.0, 1.0, 1.0, 5.0]])
  assert reranked.dtype == np.int32 and scores.dtype == np.float32
  np.testing.assert_array_equal(ids, [[40, 41, 42, 43, 44]])  # the caller's beam untouched
  with pytest.raises(ValueError, match="do not fit a beam"):
    rerank.rerank_beam(question_emb, stale, ids, np.zeros((1, 6, 2)))


@pytest.mark.parametrize("depth, beam, reader_beam, match", [
    (3, 10, 5, r"reader_beam \(5\) <= depth <= the retrieved beam \(10\)"),
    (11, 10, 5, r"<= the retrieved beam \(10\)"),
    (5.0, 10, 5, "must be an int"),
])
def test_check_depth_refuses_a_depth_outside_the_reader_and_retrieved_beams(depth, beam,
                                                                          reader_beam, match):
  with pytest.raises(ValueError, match=match):
    rerank.check_depth(depth, beam, reader_beam)
  assert rerank.check_depth(7, 10, 5) == 7


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  root = tmp_path_factory.mktemp("rerank")
  path = root / "docs.jsonl"
  topics = ["rivers", "mountains", "composers", "bridges", "planets", "deserts", "painters",
            "harbours", "glaciers"]
  path.write_text("".join(
      json.dumps({"title": topic.title(), "text": f"The {topic} of region {i} are known for "
                  f"{' and '.join(topics[:i + 1])}."}) + "\n" for i, topic in enumerate(topics)))
  corpus_build.build_block_store(sources_lib.JsonlSource(str(path)), str(root / "blocks"),
                                 max_block_len=32)
  return block_store_lib.BlockStore.open(str(root / "blocks"))


@pytest.fixture(scope="module")
def params():
  """Untied retriever params, random: the document tower differs from the question tower."""
  q = np.ones((1, 8), np.int32)
  c = np.ones((1, 2, 8), np.int32)
  shapes = jax.eval_shape(lambda: nn.unbox(
      RealmRetriever(UNTIED).init(jax.random.PRNGKey(0), q, q, q, c, c, c)))["params"]
  rng = np.random.default_rng(3)
  return jax.tree.map(lambda s: rng.normal(0, 0.2, s.shape).astype(s.dtype), shapes)


def by_hand(params, store, ids):
  """[n, proj] the document tower applied by flax to the store's rows of `ids` [n]."""
  return np.asarray(RealmRetriever(UNTIED).apply(
      {"params": params}, *store.embedder_inputs(np.asarray(ids)), deterministic=True,
      method=RealmRetriever.embed_documents))


def test_embed_block_ids_is_the_document_tower_on_any_ids(params, store):
  ids = np.array([4, 0, 4, 7, 2])  # any order, a repeat; 5 rows over the 8 test devices
  got = builder.embed_block_ids({"retriever": params}, UNTIED, store, ids)
  assert got.shape == (5, 8) and got.dtype == np.float32
  np.testing.assert_allclose(got, by_hand(params, store, ids), atol=1e-5)
  assert builder.embed_block_ids(params, UNTIED, store, []).shape == (0, 8)


def test_rerank_with_the_document_tower_equals_scores_by_hand(params, store):
  num_blocks = store.num_blocks
  assert num_blocks >= 9
  rng = np.random.default_rng(0)
  question_emb = rng.normal(size=(2, 8)).astype(np.float32)
  ids = np.stack([rng.permutation(num_blocks)[:7] for _ in range(2)])  # [2, 7] a stale beam
  stale = -np.arange(7, dtype=np.float32)[None].repeat(2, 0)
  scores, reranked = rerank.rerank_with_document_tower(
      question_emb, stale, ids, depth=5, params=params, config=UNTIED, store=store)
  for row in range(2):
    live = by_hand(params, store, ids[row, :5]) @ question_emb[row]  # [5] in NumPy
    order = np.argsort(-live, kind="stable")
    np.testing.assert_array_equal(reranked[row, :5], ids[row, :5][order])
    np.testing.assert_allclose(scores[row, :5], live[order], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(reranked[row, 5:], ids[row, 5:])  # beyond L: as retrieved
    np.testing.assert_array_equal(scores[row, 5:], stale[row, 5:])
  # The random towers reorder something (else the test could not fail on a no-op).
  assert not np.array_equal(reranked[:, :5], ids[:, :5])
  with pytest.raises(ValueError, match="exceeds the beam of 7"):
    rerank.rerank_with_document_tower(question_emb, stale, ids, depth=8, params=params,
                                      config=UNTIED, store=store)
