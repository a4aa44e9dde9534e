"""REALM's knowledge retriever: BERT embedder towers and dot-product relevance scores.

embed(x) = LayerNorm(Dense_proj(pooler(BERT(x))))   (REALM_SPEC 1; the pooler reads [CLS], or
                                                     the mean over tokens where
                                                     RealmConfig.retriever_pooling = "mean")
f(x, z)  = <embed(x), embed(z)>                      (REALM_SPEC 2: no temperature, no scaling)

In pretraining the query and document towers are the same parameters (REALM_SPEC 3,
`share_embedders=True` in the release); `RealmConfig.share_embedders=False` unties them.
"""

from __future__ import annotations

from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from realm_jax.models.bert import BertModel, dense, layer_norm
from realm_jax.models.config import RealmConfig

Array = jax.Array


def relevance_scores(query_emb: Array, candidate_emb: Array) -> Array:
  """Scores of each query's own candidates.

  Args:
    query_emb: [batch, proj].
    candidate_emb: [batch, candidates, proj].

  Returns:
    [batch, candidates] float32 dot products.
  """
  return jnp.einsum("bp,bkp->bk", query_emb, candidate_emb,
                    preferred_element_type=jnp.float32)


def all_pairs_scores(query_emb: Array, doc_emb: Array) -> Array:
  """Scores of every query against every document ([queries, proj] x [docs, proj])."""
  # [queries, docs]
  return jnp.einsum("qp,dp->qd", query_emb, doc_emb, preferred_element_type=jnp.float32)


class RealmEmbedder(nn.Module):
  """One tower: token ids -> `proj_size` retrieval embedding."""

  config: RealmConfig

  @nn.compact
  def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
               attention_mask: Array | None = None, *, deterministic: bool = True) -> Array:
    """Embeds sequences.

    Args:
      input_ids: int [..., length], e.g. [batch, length] or [batch, candidates, length].
      token_type_ids: int [..., length] or None (zeros).
      attention_mask: [..., length] or None (all ones).
      deterministic: disables dropout.

    Returns:
      [..., proj] embeddings in the compute dtype.
    """
    cfg = self.config
    _, pooled = BertModel(cfg.bert, use_pooler=True, pooling=cfg.retriever_pooling, name="bert")(
        input_ids, token_type_ids, attention_mask, deterministic=deterministic)
    # [..., proj]
    projected = dense(cfg.proj_size, cfg.bert, ("embed", "proj"), name="projection")(pooled)
    projected = layer_norm(cfg.proj_layer_norm_eps, cfg.bert, name="projection_layer_norm",
                           axis_name="proj")(projected)
    return nn.Dropout(cfg.proj_dropout)(projected, deterministic=deterministic)


class RealmRetriever(nn.Module):
  """Query and document towers (tied by default) and their relevance scores."""

  config: RealmConfig

  def setup(self):
    if self.config.share_embedders:
      self.embedder = RealmEmbedder(self.config)
    else:
      self.query_embedder = RealmEmbedder(self.config)
      self.document_embedder = RealmEmbedder(self.config)

  def _tower(self, side: str) -> RealmEmbedder:
    if self.config.share_embedders:
      return self.embedder
    return self.query_embedder if side == "query" else self.document_embedder

  def embed_queries(self, input_ids: Array, token_type_ids: Array | None = None,
                    attention_mask: Array | None = None, *,
                    deterministic: bool = True) -> Array:
    """[..., length] query ids -> [..., proj]."""
    if self.config.retriever_query_masks == "ignore":
      # [..., length] the query's [MASK]s count as padding (RealmConfig.retriever_query_masks).
      real = input_ids != self.config.mask_token_id
      attention_mask = real if attention_mask is None else (attention_mask != 0) & real
    return self._tower("query")(input_ids, token_type_ids, attention_mask,
                             deterministic=deterministic)

  def embed_documents(self, input_ids: Array, token_type_ids: Array | None = None,
                      attention_mask: Array | None = None, *,
                      deterministic: bool = True) -> Array:
    """[..., length] block ids -> [..., proj]."""
    return self._tower("document")(input_ids, token_type_ids, attention_mask,
                                deterministic=deterministic)

  def __call__(self, query_ids: Array, query_type_ids: Array, query_mask: Array,
               candidate_ids: Array, candidate_type_ids: Array, candidate_mask: Array, *,
               deterministic: bool = True) -> tuple[Array, Array, Array]:
    """Relevance scores of each query's candidates, embedded with the live parameters.

    Args:
      query_ids, query_type_ids, query_mask: [batch, query_len].
      candidate_ids, candidate_type_ids, candidate_mask: [batch, candidates, block_len].
      deterministic: disables dropout.

    Returns:
      (scores [batch, candidates] float32, query_emb [batch, proj],
       candidate_emb [batch, candidates, proj]).
    """
    query_emb = self.embed_queries(query_ids, query_type_ids, query_mask,
                                   deterministic=deterministic)
    candidate_emb = self.embed_documents(candidate_ids, candidate_type_ids, candidate_mask,
                                         deterministic=deterministic)
    candidate_emb = nn.with_logical_constraint(candidate_emb, ("batch", "candidates", "proj"))
    return relevance_scores(query_emb, candidate_emb), query_emb, candidate_emb


def tower_params(params, config: RealmConfig, side: str):
  """One tower's RealmEmbedder params, from retriever params or a checkpoint's dict.

  Args:
    params: RealmRetriever params ({"embedder"} tied, or {"query_embedder",
      "document_embedder"} untied), optionally wrapped as {"params": ...} and/or
      {"retriever": ...} (the checkpoint layout of `training.checkpoints`).
    config: the model config (tied or untied towers).
    side: "query" or "document".

  Returns:
    (name, params): the tower's name in a RealmRetriever tree ("embedder" when tied) and its
    RealmEmbedder params.
  """
  if side not in ("query", "document"):
    raise ValueError(f"side must be 'query' or 'document', got {side!r}")
  tree = params
  if isinstance(tree, Mapping) and set(tree) == {"params"}:
    tree = tree["params"]
  if isinstance(tree, Mapping) and "retriever" in tree:
    tree = tree["retriever"]
  name = "embedder" if config.share_embedders else f"{side}_embedder"
  if not isinstance(tree, Mapping) or name not in tree:
    keys = sorted(tree) if isinstance(tree, Mapping) else type(tree).__name__
    raise ValueError(f"retriever params have no {name!r} tower (got {keys}); "
                     f"share_embedders={config.share_embedders} in the config")
  return name, tree[name]
