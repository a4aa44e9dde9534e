"""`ict`: the Inverse Cloze Task warm start of the retriever (REALM_SPEC 14, ORQA).

The towers' BERT starts from `init_checkpoint`'s encoder (a converted BERT or an `mlm`
checkpoint) when one is given: REALM warm-starts ICT from BERT.
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


@gin.configurable
@dataclasses.dataclass
class IctJob(SeqioJob):
  """IctModel on an `ict_<corpus>` task.

  Attributes:
    ict_remove_probability: on a corpus registered over `block_store`, the probability that
      ICT removes the query sentence from its block (None: ORQA's 0.9). Short documents
      (one-sentence blocks are skipped when their sentence is removed) want it lower.
  """
  ict_remove_probability: Optional[float] = None

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
    `mlm` checkpoint)."""
    return towers_from_encoder(checkpoint, params, source)
