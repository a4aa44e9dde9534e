"""realm_jax.evaluation.bm25 against BM25 scores worked out by hand.

The expected scores are computed here with plain `math` from the formula (Lucene's idf, k1 0.9,
b 0.4), over a corpus small enough to count every term frequency by eye; nothing is taken from
the module under test.
"""

import math

import numpy as np
import pytest

from realm_jax.evaluation import bm25

DOCS = [
    "the cat sat",  # the 1, cat 1, sat 1: |d| = 3
    "The dog sat on the cat.",  # the 2, dog 1, sat 1, on 1, cat 1: |d| = 6
    "Dogs bark!",  # dogs 1, bark 1: |d| = 2 ("dogs" is not "dog": no stemming)
    "cat, cat; CAT",  # cat 3: |d| = 3
]
N = 4
AVGDL = (3 + 6 + 2 + 3) / 4  # 3.5


def term_score(tf, df, doc_len, k1=0.9, b=0.4, n=N, avgdl=AVGDL):
  """The textbook formula, one term: idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b |d| / avgdl))."""
  idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
  return idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * doc_len / avgdl))


@pytest.fixture(scope="module")
def index():
  return bm25.BM25Index(DOCS)


def test_tokenize_lowercases_and_splits_on_non_alphanumerics():
  assert bm25.tokenize("Hello, World! x_y 3.14 Café--NOW") == [
      "hello", "world", "x", "y", "3", "14", "café", "now"]
  assert bm25.tokenize(" ?! ") == []


def test_scores_equal_the_hand_worked_formula(index):
  # "cat": df 3 (docs 0, 1, 3), idf = ln(1 + 1.5 / 3.5) = ln(10 / 7) = 0.35667.
  # doc 0: tf 1, |d| 3 -> 0.35667 * 1.9 / (1 + 0.9 * (0.6 + 0.4 * 3 / 3.5)) = 0.36660
  # doc 1: tf 1, |d| 6 -> 0.35667 * 1.9 / (1 + 0.9 * (0.6 + 0.4 * 6 / 3.5)) = 0.31416
  # doc 3: tf 3, |d| 3 -> 0.35667 * 5.7 / (3 + 0.9 * (0.6 + 0.4 * 3 / 3.5)) = 0.52826
  cat = [term_score(1, 3, 3), term_score(1, 3, 6), 0.0, term_score(3, 3, 3)]
  assert cat == pytest.approx([0.36660, 0.31416, 0.0, 0.52826], abs=5e-5)
  # "the dog": the (df 2: docs 0, 1), dog (df 1: doc 1); doc 2 has "dogs", another term.
  the_dog = [term_score(1, 2, 3), term_score(2, 2, 6) + term_score(1, 1, 6), 0.0, 0.0]
  # A repeated query term counts once; case and punctuation do not matter.
  scores = index.scores(["cat", "the dog", "Cat? CAT cat!"]).toarray()  # [3, 4]
  np.testing.assert_allclose(scores, [cat, the_dog, cat], rtol=1e-12)
  assert index.num_documents == N and index.avgdl == AVGDL


def test_k1_and_b_are_parameters():
  index = bm25.BM25Index(DOCS, k1=1.2, b=0.75)
  expected = [term_score(1, 3, 3, k1=1.2, b=0.75), term_score(1, 3, 6, k1=1.2, b=0.75), 0.0,
              term_score(3, 3, 3, k1=1.2, b=0.75)]
  np.testing.assert_allclose(index.scores(["cat"]).toarray()[0], expected, rtol=1e-12)
  # b = 0: no length normalisation, docs 0 and 1 (tf 1 each) score the same.
  flat = bm25.BM25Index(DOCS, b=0.0).scores(["cat"]).toarray()[0]
  assert flat[0] == flat[1] == pytest.approx(math.log(10 / 7) * 1.9 / 1.9)


def test_top_k_ranks_by_score_then_fills_with_the_lowest_unscored_ids(index):
  ids, scores = index.top_k(["cat", "the dog", "dogs"], k=4)
  # cat: 3 (0.528) > 0 (0.367) > 1 (0.314), then doc 2 (no cat) with 0.
  assert ids.tolist() == [[3, 0, 1, 2], [1, 0, 2, 3], [2, 0, 1, 3]]
  assert ids.dtype == np.int64 and scores.shape == (3, 4)
  np.testing.assert_allclose(scores[0], [term_score(3, 3, 3), term_score(1, 3, 3),
                                         term_score(1, 3, 6), 0.0], rtol=1e-12)
  assert scores[1, 0] > scores[1, 1] > 0 == scores[1, 2] == scores[1, 3]
  assert scores[2, 1:].tolist() == [0.0, 0.0, 0.0]
  ids, _ = index.top_k(["cat"], k=2)
  assert ids.tolist() == [[3, 0]]


def test_ties_go_to_the_lower_document_id():
  # Docs 1, 3, 4 are the same text: equal scores, listed in id order, at the cut too.
  index = bm25.BM25Index(["a b", "x y", "a c", "x y", "x y", "x"])
  ids, scores = index.top_k(["y"], k=3)
  assert ids.tolist() == [[1, 3, 4]] and scores[0, 0] == scores[0, 1] == scores[0, 2] > 0
  ids, _ = index.top_k(["y"], k=2)
  assert ids.tolist() == [[1, 3]]
  # Many more ties than k (the partition before the sort must keep all of them).
  many = bm25.BM25Index(["other words"] * 7 + ["same text"] * 50)
  ids, _ = many.top_k(["text", "same"], k=5)
  assert ids.tolist() == [[7, 8, 9, 10, 11]] * 2


def test_empty_and_unknown_queries_score_zero_and_still_get_k_results(index):
  ids, scores = index.top_k(["", "zebra ???", "!!"], k=3)
  assert ids.tolist() == [[0, 1, 2]] * 3
  assert not scores.any()
  ids, scores = index.top_k([], k=2)
  assert ids.shape == (0, 2) and scores.shape == (0, 2)


def test_top_k_agrees_with_a_full_sort_on_a_bigger_corpus():
  rng = np.random.default_rng(0)
  words = [f"w{i}" for i in range(30)]
  docs = [" ".join(rng.choice(words, size=rng.integers(0, 12))) for _ in range(300)]
  docs += docs[:40]  # duplicates: exact ties
  queries = [" ".join(rng.choice(words, size=rng.integers(0, 4))) for _ in range(40)]
  index = bm25.BM25Index(docs)
  ids, scores = index.top_k(queries, k=25)
  dense = index.scores(queries).toarray()  # [40, 340]
  for row in range(len(queries)):
    order = np.lexsort((np.arange(len(docs)), -dense[row]))[:25]  # by -score, then id
    assert ids[row].tolist() == order.tolist()
    np.testing.assert_array_equal(scores[row], dense[row, order])


def test_k_beyond_the_corpus_or_below_one_is_refused(index):
  with pytest.raises(ValueError, match="k=5 is more than the 4 documents"):
    index.top_k(["cat"], k=5)
  for k in (0, -1, 2.0, True):
    with pytest.raises(ValueError, match="positive integer"):
      index.top_k(["cat"], k=k)


def test_no_documents_and_bad_parameters_are_refused():
  with pytest.raises(ValueError, match="no documents"):
    bm25.BM25Index([])
  with pytest.raises(ValueError, match="k1 >= 0 and 0 <= b <= 1"):
    bm25.BM25Index(DOCS, b=1.5)
  # Documents without a single term are fine: they only ever score 0.
  ids, scores = bm25.BM25Index(["", "...", "cat"]).top_k(["cat", "dog"], k=3)
  assert ids.tolist() == [[2, 0, 1], [0, 1, 2]] and scores[0, 0] > 0 == scores[1].max()


def test_the_bm25_searcher_hands_the_reader_bm25s_ranking_and_zero_retrieval_scores():
  """BM25 as the open-QA reader's retriever (DrQA's pipeline): its ranking is the index's, and
  its block embeddings are zeros, so the reader adds no retrieval score."""
  import types  # pylint: disable=import-outside-toplevel
  titles = ["Cats", "Dogs", "Birds", "Fish"]
  store = types.SimpleNamespace(num_blocks=4, store_id="s", title=titles.__getitem__,
                                body=DOCS.__getitem__)
  searcher = bm25.BM25Searcher(store, dim=8)
  questions = ["which dog sat?", "cat", "nothing known"]
  scores, ids = searcher.retrieve_texts(questions, k=10)  # more than the blocks: all of them
  expected_ids, expected_scores = bm25.BM25Index(bm25.block_texts(store)).top_k(questions, 4)
  np.testing.assert_array_equal(ids, expected_ids)
  np.testing.assert_allclose(scores, expected_scores, rtol=1e-6)
  assert ids.dtype == np.int32 and scores.dtype == np.float32
  assert searcher.num_docs == 4 and searcher.block_store_id == "s"
  assert searcher.embeddings.shape == (4, 8) and not searcher.embeddings.any()
  assert searcher.embeddings.strides == (0, 4)  # one row's memory, whatever the corpus
  assert searcher.block_emb is searcher.embeddings
