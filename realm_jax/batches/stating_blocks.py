"""Oracle candidates for REALM pretraining: blocks of another document that state the masked span.

A diagnostic, off in REALM (`PretrainJob.oracle_blocks = 0`). With it, each masked query's
retrieved list starts with up to n blocks whose wordpieces hold the masked span as one phrase,
from a document other than the query's source, whatever the retriever ranked. It separates what
retrieval finds from what the encoder can read: with blocks that can help in every candidate
list, does the encoder learn to read them, and does retrieval utility rise?
"""

from __future__ import annotations

import functools
from typing import Mapping, Optional, Sequence

import numpy as np

from realm_jax.data import block_store as block_store_lib
from realm_jax.data.vocab import PAD_ID


class StatingBlocks:
  """Which blocks of a BlockStore hold a phrase of wordpieces (title or body), and which
  document a content uid's block belongs to."""

  def __init__(self, store: block_store_lib.BlockStore):
    tokens = np.asarray(store.tokens)  # [N, L]
    num_blocks = tokens.shape[0]
    # (token, block) pairs, each once, sorted by token then block.
    keys = np.unique(tokens.astype(np.int64) * num_blocks + np.arange(num_blocks)[:, None])
    keys = keys[keys // num_blocks != PAD_ID]
    self._tokens = keys // num_blocks  # [P] sorted
    self._blocks = keys % num_blocks  # [P], within one token's run: ascending
    self._rows = tokens
    self.doc_ids = np.asarray(store.doc_ids)  # [N]
    uids = np.asarray(store.uids, np.uint64)
    self._uid_order = np.argsort(uids, kind="stable")
    self._sorted_uids = uids[self._uid_order]
    self.uids = uids

  def _posting(self, token: int) -> np.ndarray:
    lo, hi = np.searchsorted(self._tokens, [token, token + 1])
    return self._blocks[lo:hi]

  def holding(self, phrase: Sequence[int]) -> np.ndarray:
    """int [M]: the ids of the blocks whose wordpieces hold `phrase` contiguously, ascending."""
    phrase = np.asarray(phrase, np.int64)  # [n]
    if phrase.size == 0:
      return np.zeros([0], np.int64)
    candidates = None
    for token in sorted(set(phrase.tolist()), key=lambda t: len(self._posting(t))):
      posting = self._posting(token)
      candidates = posting if candidates is None else np.intersect1d(candidates, posting)
      if not candidates.size:
        return candidates
    n = phrase.size
    if n > self._rows.shape[1]:
      return np.zeros([0], np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(self._rows[candidates], n, axis=1)
    return candidates[(windows == phrase).all(axis=2).any(axis=1)]  # [M]

  def document_of(self, uid: int) -> Optional[int]:
    """The document id of the block with content uid `uid`; None for 0 or a uid not stored."""
    if not uid:
      return None
    at = int(np.searchsorted(self._sorted_uids, np.uint64(uid)))
    if at == len(self._sorted_uids) or self._sorted_uids[at] != np.uint64(uid):
      return None
    return int(self.doc_ids[self._uid_order[at]])

  def stating(self, phrase: Sequence[int], source_uid: int) -> np.ndarray:
    """int [M]: the blocks holding `phrase` outside the source's document (every block holding
    it when the source is not in the store), in the order of their content uids (a fixed
    order unrelated to the corpus's layout)."""
    found = self.holding(phrase)
    source_doc = self.document_of(source_uid)
    if source_doc is not None:
      found = found[self.doc_ids[found] != source_doc]
    return found[np.argsort(self.uids[found], kind="stable")]


@functools.lru_cache(maxsize=1)
def lookup(store: block_store_lib.BlockStore) -> StatingBlocks:
  """The `StatingBlocks` of `store`, built once: a job makes a new batch iterator for each
  checkpoint's evaluation over the same store."""
  return StatingBlocks(store)


def masked_phrase(positions: np.ndarray, targets: np.ndarray, weights: np.ndarray
                  ) -> Optional[np.ndarray]:
  """The masked wordpieces of one query as a phrase (int [n]), in position order; None when
  nothing is masked or the masks are not one contiguous span (random-token masking)."""
  weighted = weights > 0  # [max_masks]
  if not weighted.any():
    return None
  order = np.argsort(positions[weighted], kind="stable")
  positions, targets = positions[weighted][order], targets[weighted][order]
  if (np.diff(positions) != 1).any():
    return None
  return targets.astype(np.int64)


def put_first(retrieved_ids: np.ndarray, firsts: Sequence[np.ndarray]) -> np.ndarray:
  """int32 [B, k]: row b holds `firsts[b]`, then the retrieved blocks not among them in rank
  order, cut to the k columns of `retrieved_ids` [B, k]."""
  retrieved_ids = np.asarray(retrieved_ids)
  out = np.empty(retrieved_ids.shape, np.int32)
  k = retrieved_ids.shape[1]
  for b, first in enumerate(firsts):  # B rows of at most k ids: cheap
    first = np.asarray(first, np.int64)[:k]
    rest = retrieved_ids[b][~np.isin(retrieved_ids[b], first)]
    out[b] = np.concatenate([first, rest])[:k]
  return out


def with_stating_first(lookup: StatingBlocks, masked: Mapping[str, np.ndarray],
                       retrieved_ids: np.ndarray, count: int) -> tuple[np.ndarray, int]:
  """(retrieved ids [B, k] with up to `count` stating blocks first in each row, how many rows
  got at least one). `masked`: the batch's masked queries (`source_uid` as uint64)."""
  firsts = []
  for b in range(retrieved_ids.shape[0]):
    phrase = masked_phrase(np.asarray(masked["mlm_positions"][b]),
                           np.asarray(masked["mlm_targets"][b]),
                           np.asarray(masked["mlm_weights"][b]))
    firsts.append(np.zeros([0], np.int64) if phrase is None else
                  lookup.stating(phrase, int(masked["source_uid"][b]))[:count])
  return put_first(retrieved_ids, firsts), sum(1 for first in firsts if first.size)
