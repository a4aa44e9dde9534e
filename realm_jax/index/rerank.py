"""Over-retrieval with re-ranking (Atlas, Izacard et al. 2022, sec. 2.4): a stale index's beam
re-scored and re-ordered with the live document tower.

When fine-tuning trains the document tower without refreshing the index, the index ranks blocks
by embeddings the tower no longer computes. Atlas's cheaper option: retrieve L > K blocks,
re-embed those L with the current tower, re-score them and give the reader the best K.
`rerank_beam` is the pure NumPy step; `rerank_with_document_tower` embeds the beam's first L
blocks (`builder.embed_block_ids`) and calls it, for `batches.fid.FidBatches` and
`evaluation.qa.Predictor`.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from realm_jax.data.block_store import BlockStore
from realm_jax.index import builder
from realm_jax.models.config import RealmConfig

__all__ = ["check_depth", "rerank_beam", "rerank_with_document_tower"]


def check_depth(depth: int, beam: int, reader_beam: int) -> int:
  """`depth` (the L of a re-ranking: blocks of the beam re-scored) if reader_beam <= depth <=
  beam, else a one-line ValueError."""
  if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)):
    raise ValueError(f"re-ranking depth must be an int, got {depth!r}")
  if not reader_beam <= depth <= beam:
    raise ValueError(f"re-ranking {depth} blocks needs reader_beam ({reader_beam}) <= depth <= "
                     f"the retrieved beam ({beam})")
  return int(depth)


def rerank_beam(question_emb: np.ndarray, scores: np.ndarray, ids: np.ndarray,
                live_emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The beam with its first L blocks re-scored by `live_emb` and re-ordered, best first.

  Args:
    question_emb: float [B, proj] the questions' embeddings (the tower that searched).
    scores: float [B, D] the stale index's scores of the beam, best first.
    ids: int [B, D] the beam's block ids.
    live_emb: float [B, L, proj] (L <= D) the live document tower's embeddings of the first L
      blocks of each row.

  Returns:
    (scores float32 [B, D], ids int32 [B, D]): the first L of each row ordered by
    `question_emb . live_emb` (descending; equal scores keep the stale order), with those
    scores; positions L.. as they were (their stale scores: they were not re-embedded).
  """
  question_emb = np.asarray(question_emb, np.float32)
  live_emb = np.asarray(live_emb, np.float32)
  scores = np.array(scores, np.float32)  # copies: the caller's arrays are left alone
  ids = np.array(ids, np.int32)
  depth = live_emb.shape[1]
  if live_emb.shape[0] != ids.shape[0] or depth > ids.shape[1]:
    raise ValueError(f"live embeddings {live_emb.shape} do not fit a beam of {ids.shape}")
  live = np.einsum("bp,blp->bl", question_emb, live_emb)  # [B, L]
  order = np.argsort(-live, axis=1, kind="stable")  # [B, L] best first, ties in stale order
  scores[:, :depth] = np.take_along_axis(live, order, axis=1)
  ids[:, :depth] = np.take_along_axis(ids[:, :depth], order, axis=1)
  return scores, ids


def rerank_with_document_tower(question_emb: np.ndarray, scores: np.ndarray, ids: np.ndarray,
                               *, depth: int, params: Mapping[str, Any], config: RealmConfig,
                               store: BlockStore, mesh: Any = None
                               ) -> tuple[np.ndarray, np.ndarray]:
  """`rerank_beam` of the beam's first `depth` blocks, re-embedded with the document tower of
  `params` (retriever params in any layout `builder.document_tower_params` accepts).

  Args:
    question_emb: [B, proj]; scores, ids: [B, D] the stale index's beam, best first.
    depth: L, the blocks of each row re-embedded and re-ranked (<= D).
    params, config: the live retriever and its config.
    store: the BlockStore the ids index.
    mesh: passed to `builder.embed_block_ids`.
  """
  ids = np.asarray(ids)
  if depth > ids.shape[1]:
    raise ValueError(f"re-ranking depth {depth} exceeds the beam of {ids.shape[1]} blocks")
  first = ids[:, :depth]  # [B, L]
  live_emb = builder.embed_block_ids(params, config, store, first.reshape(-1), mesh=mesh)
  return rerank_beam(question_emb, scores, ids, live_emb.reshape(*first.shape, -1))
