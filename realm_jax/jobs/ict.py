"""`ict`: the Inverse Cloze Task warm start of the retriever (REALM_SPEC 14, ORQA).

The towers' BERT starts from `init_checkpoint`'s encoder (a converted BERT or an `mlm`
checkpoint) when one is given: REALM warm-starts ICT from BERT. With `continue_retriever`, the
checkpoint's whole retriever is continued instead (a RetroMAE run's: ICT as the contrastive
stage after RetroMAE, as RetroMAE's paper fine-tunes its pre-trained encoder contrastively).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import gin

from realm_jax.gin_utils import ConfigError
from realm_jax.jobs.base import RunContext, SeqioJob, bert_from_encoder, require


def towers_from_encoder(checkpoint: Mapping[str, Any], params: dict, source: str,
                        what: str = "ICT") -> tuple[dict, str]:
  """A job's `warm_start` of every retriever tower's BERT from the checkpoint's encoder (a
  converted BERT or an `mlm` checkpoint): ICT's, and RetroMAE's (`what` names the job)."""
  encoder = require(checkpoint, "encoder", "init_checkpoint", source,
                    f"; {what} starts from a BERT: python -m realm_jax.convert.hf, or an 'mlm' "
                    f"run")
  towers = {name: bert_from_encoder(tower, encoder)
            for name, tower in params["retriever"].items()}
  return {**params, "retriever": towers}, "retriever towers' BERT (from the encoder)"


def continue_retriever(checkpoint: Mapping[str, Any], params: dict, source: str
                       ) -> tuple[dict, str]:
  """A job's `warm_start` from a checkpoint's whole retriever (every tower's BERT, pooler,
  projection and LayerNorm), e.g. ICT after RetroMAE. The size check of a BERT warm start
  (`warm_start_bert_only`) does not cover the projection or the towers' tying, so the trees
  are compared here: a one-line ConfigError rather than a shape error inside the first step."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  shapes = lambda tree: jax.tree_util.tree_map(lambda leaf: tuple(np.shape(leaf)), tree)
  retriever = require(checkpoint, "retriever", "init_checkpoint", source,
                      "; continue_retriever takes a run's whole retriever (e.g. RetroMAE's)")
  if shapes(retriever) != shapes(params["retriever"]):
    raise ConfigError(f"init_checkpoint {source}: its retriever is not of this run's shape "
                      f"(towers {sorted(retriever)} vs {sorted(params['retriever'])}, or "
                      f"another projection size)")
  return {**params, "retriever": retriever}, "retriever (continued)"


@gin.configurable
@dataclasses.dataclass
class IctJob(SeqioJob):
  """IctModel on an `ict_<corpus>` task.

  Attributes:
    ict_remove_probability: on a corpus registered over `block_store`, the probability that
      ICT removes the query sentence from its block (None: ORQA's 0.9). Short documents
      (one-sentence blocks are skipped when their sentence is removed) want it lower.
    continue_retriever: take `init_checkpoint`'s whole retriever (every tower's BERT, pooler,
      projection and LayerNorm) rather than its encoder's BERT: ICT after RetroMAE, whose
      checkpoint holds the retriever it pre-trained and no encoder.
  """
  ict_remove_probability: Optional[float] = None
  continue_retriever: bool = False

  name = "ict"
  feature_keys = "ICT_BATCH_KEYS"
  warm_start_bert_only = True

  def configure(self, ctx: RunContext) -> None:
    p = self.ict_remove_probability
    if p is None:
      super().configure(ctx)
      return
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
      raise ConfigError(f"IctJob.ict_remove_probability={p!r}: expected a probability in "
                        f"[0, 1]")
    if not self.register_corpus(ict_remove_probability=float(p)):
      # The probability is fixed when a task is registered; this one was registered before.
      raise ConfigError(f"IctJob.ict_remove_probability applies to a corpus that train "
                        f"registers over IctJob.block_store; task {self.task!r} is registered "
                        f"already with its own (set it where that task is registered: "
                        f"realm_jax_tasks.register_pretraining_tasks)")
    self.check_task_prefix("ict_")

  def build_model(self, ctx: RunContext) -> Any:
    from realm_jax.models import realm  # pylint: disable=g-import-not-at-top
    return realm.IctModel(ctx.model_config)

  def warm_start(self, checkpoint: Mapping[str, Any], params: dict, source: str
                 ) -> tuple[dict, str]:
    """Every retriever tower's BERT from the checkpoint's encoder (a converted BERT or an
    `mlm` checkpoint); with `continue_retriever`, the checkpoint's retriever whole (RetroMAE's:
    its projection is part of the embedding RetroMAE trained)."""
    if self.continue_retriever:
      return continue_retriever(checkpoint, params, source)
    return towers_from_encoder(checkpoint, params, source)
