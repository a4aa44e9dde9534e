"""Okapi BM25 over short documents: a lexical retrieval baseline (NumPy + SciPy sparse).

Lucene's BM25 with Anserini's defaults k1 = 0.9, b = 0.4 (which the DPR and ORQA comparisons
used), over lower-cased runs of letters and digits, without stemming or stop words; a query is
a bag of distinct terms. The document weights form a sparse [terms, documents] matrix, so a
chunk of queries is one sparse product. A BlockStore's documents are its blocks' title and body
(`block_texts`); `BM25Searcher` gives BM25's ranking to the open-QA reader in place of the dense
index (`candidates='bm25'`). Design notes: docs/design/training_and_commands.md.
"""

from __future__ import annotations

import collections
import re
from typing import Any, Iterable, Sequence

import numpy as np
from scipy import sparse

K1 = 0.9
B = 0.4
_TERM = re.compile(r"[^\W_]+")  # a run of letters and digits (\w without the underscore)
# Queries per sparse product in `top_k`: a common word makes a product of many nearly dense.
QUERY_CHUNK = 16
# Where the open-QA reader's blocks come from: the dense index, `BM25Searcher`, or none (the
# closed book, `batches.qa_batches.ClosedBook`).
READER_CANDIDATES = ("index", "bm25", "none")


def tokenize(text: str) -> list[str]:
  """The terms of `text`: lower-cased runs of letters and digits, in order."""
  return _TERM.findall(text.lower())


def idf(num_documents: int, document_frequency):
  """Lucene's BM25 idf, log(1 + (N - df + 0.5) / (df + 0.5)); positive for every df <= N."""
  df = np.asarray(document_frequency, np.float64)
  return np.log1p((num_documents - df + 0.5) / (df + 0.5))


class BM25Index:
  """BM25 scores of queries against a fixed list of documents (ids 0..num_documents-1)."""

  def __init__(self, documents: Iterable[str], *, k1: float = K1, b: float = B):
    """Indexes the documents (their position in `documents` is their id); k1 (>= 0) is the
    term-frequency saturation, b in [0, 1] the length normalisation; ValueError otherwise or
    without documents."""
    if k1 < 0 or not 0 <= b <= 1:
      raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
    self.k1, self.b = float(k1), float(b)
    self._term_ids: dict[str, int] = {}
    term_ids, counts, row_starts, lengths = [], [], [0], []
    for text in documents:
      term_counts = collections.Counter(tokenize(text))
      term_ids.extend(self._term_ids.setdefault(t, len(self._term_ids)) for t in term_counts)
      counts.extend(term_counts.values())
      row_starts.append(len(term_ids))
      lengths.append(sum(term_counts.values()))
    if not lengths:
      raise ValueError("BM25Index: no documents to index")
    n, v = len(lengths), len(self._term_ids)
    terms = np.asarray(term_ids, np.int64)  # [nnz], a document's distinct terms, row by row
    tf = np.asarray(counts, np.float64)  # [nnz]
    doc_len = np.asarray(lengths, np.float64)  # [n]
    # Only documents without a single term make avgdl 0; their length never enters a score.
    avgdl = doc_len.mean() if doc_len.sum() > 0 else 1.0
    self.document_frequency = np.bincount(terms, minlength=v)  # [v]
    self.idf = idf(n, self.document_frequency)  # [v]
    rows = np.repeat(np.arange(n), np.diff(row_starts))  # [nnz], the document of each entry
    norm = self.k1 * (1.0 - self.b + self.b * doc_len / avgdl)  # [n]
    weight = self.idf[terms] * tf * (self.k1 + 1.0) / (tf + norm[rows])  # [nnz], all > 0
    by_doc = sparse.csr_matrix((weight, terms, np.asarray(row_starts)), shape=(n, v))
    # Term-major (posting lists): a query's row times this touches only its terms' documents.
    self._weights = by_doc.T.tocsr()  # [v, n]
    self.num_documents, self.avgdl = n, float(avgdl)

  @property
  def num_terms(self) -> int:
    return len(self._term_ids)

  def _query_matrix(self, queries: Sequence[str]) -> sparse.csr_matrix:
    """[num_queries, num_terms] 0/1: the distinct known terms of each query."""
    indptr, indices = [0], []
    for query in queries:
      known = {self._term_ids[t] for t in tokenize(query) if t in self._term_ids}
      indices.extend(sorted(known))
      indptr.append(len(indices))
    return sparse.csr_matrix((np.ones(len(indices)), np.asarray(indices, np.int64),
                              np.asarray(indptr, np.int64)),
                             shape=(len(queries), self.num_terms))

  def scores(self, queries: Sequence[str]) -> sparse.csr_matrix:
    """BM25 scores, sparse [num_queries, num_documents]: an absent entry is a score of 0 (the
    document shares no term with the query); every stored entry is positive."""
    return (self._query_matrix(queries) @ self._weights).tocsr()

  def top_k(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best documents of each query, best first: (ids int64 [num_queries, k], scores
    float64 [num_queries, k]).

    Ties go to the lower id; too few matches are padded with score-0 documents, lowest ids
    first. k must be in 1..num_documents (refused, not clipped: clip it first).
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k:
      raise ValueError(f"top_k: k must be a positive integer, got {k!r}")
    if k > self.num_documents:
      raise ValueError(f"top_k: k={k} is more than the {self.num_documents} documents indexed")
    ids = np.empty((len(queries), k), np.int64)  # [num_queries, k]
    values = np.zeros((len(queries), k), np.float64)  # [num_queries, k]
    for first in range(0, len(queries), QUERY_CHUNK):
      scores = self.scores(queries[first:first + QUERY_CHUNK])  # sparse [chunk, num_documents]
      for row in range(scores.shape[0]):
        begin, end = scores.indptr[row], scores.indptr[row + 1]
        ids[first + row], values[first + row] = _row_top_k(scores.indices[begin:end],
                                                           scores.data[begin:end], k)
    return ids, values


def _row_top_k(doc_ids: np.ndarray, doc_scores: np.ndarray,
               k: int) -> tuple[np.ndarray, np.ndarray]:
  """Top k of one query from its positive scores (doc_ids, doc_scores: [m], any order).

  Returns (ids [k], scores [k]) by descending score, then ascending id; score-0 documents (the
  ones not in doc_ids) fill up the tail in id order.
  """
  if len(doc_ids) > k:
    # Keep everything at least as good as the k-th best (ties at the cut included), so the
    # exact sort below sees every document that can make the top k.
    kth_best = np.partition(doc_scores, len(doc_scores) - k)[len(doc_scores) - k]
    keep = doc_scores >= kth_best
    doc_ids, doc_scores = doc_ids[keep], doc_scores[keep]
  order = np.lexsort((doc_ids, -doc_scores))[:k]  # by -score, then by id
  ids, values = doc_ids[order].astype(np.int64), doc_scores[order]
  if len(ids) < k:
    # The zero-score fill: the lowest ids that scored nothing. At most len(ids) of 0..k-1 are
    # taken, so those k ids hold enough.
    candidates = np.arange(k)
    zeros = candidates[~np.isin(candidates, ids)][:k - len(ids)]
    ids = np.concatenate([ids, zeros])
    values = np.concatenate([values, np.zeros(len(zeros))])
  return ids, values


def block_texts(store: Any):
  """Each block's title and body text, as BM25 indexes it (block id order)."""
  for block_id in range(store.num_blocks):
    yield store.title(block_id) + "\n" + store.body(block_id)


class BM25Searcher:
  """BM25 as the open-QA reader's retriever, DrQA's pipeline: the reader reads the top blocks
  BM25 ranks for each question's text (`retrieve_texts`). Its embeddings are zeros, so no
  retrieval score joins the span scores and the question tower neither ranks nor learns. Serves
  the fine-tuning batches and the evaluation's `Predictor`.
  """

  def __init__(self, store: Any, dim: int):
    """Indexes the store's blocks (`block_texts`); `dim` is the model's proj_size."""
    self.index = BM25Index(block_texts(store))
    self.num_docs = int(store.num_blocks)
    self.block_store_id = store.store_id
    self.step = 0  # no index step: named in the batches' messages only
    # [num_blocks, dim] zeros in the memory of one row (stride 0): gathering rows copies them.
    self.embeddings = np.broadcast_to(np.zeros((1, int(dim)), np.float32),
                                      (self.num_docs, int(dim)))

  @property
  def block_emb(self) -> np.ndarray:
    """`embeddings`, under the name the fine-tuning batches read."""
    return self.embeddings

  def retrieve_texts(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best blocks of each question (at most every block), best first.

    Returns:
      (scores float32 [n, k], ids int32 [n, k]), as a dense searcher returns them.
    """
    ids, scores = self.index.top_k(list(questions), min(int(k), self.num_docs))
    return scores.astype(np.float32), ids.astype(np.int32)
