"""`retromae`: the RetroMAE warm start of the retriever (Xiao et al. 2022), beside ICT.

The retriever's document tower learns to be the encoder of a masked auto-encoder over the
blocks of the `ict_<corpus>` task (`realm_jax.models.retromae`), its BERT started from
`init_checkpoint`'s encoder as ICT's is. Its checkpoints hold `params["retriever"]` as ICT's
do, so they warm-start REALM pretraining and give the first index exactly as an ICT checkpoint
does. Details: docs/design/models_and_jobs.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import gin

from realm_jax.gin_utils import ConfigError
from realm_jax.jobs.base import Job, RunContext, global_spec
from realm_jax.jobs.ict import towers_from_encoder


@gin.configurable
@dataclasses.dataclass
class RetroMaeJob(Job):
  """RetroMaeModel on the blocks of an `ict_<corpus>` task.

  Attributes:
    encoder_mask_rate: fraction of a block's wordpieces the encoder sees masked (the paper: 0.3).
    decoder_mask_rate: fraction of the other wordpieces each decoder row does not see (0.5).
    decoder_predictions: at most this many decoder rows per block, a uniform sample; None:
      every wordpiece but [CLS] (the paper). A cost knob.
    encoder_loss_weight: weight of the encoder's MLM loss beside the decoder's (the paper: 1).
  """
  encoder_mask_rate: float = 0.3
  decoder_mask_rate: float = 0.5
  decoder_predictions: Optional[int] = None
  encoder_loss_weight: float = 1.0

  name = "retromae"
  warm_start_bert_only = True

  def configure(self, ctx: RunContext) -> None:
    from realm_jax.batches import retromae  # pylint: disable=g-import-not-at-top
    problem = retromae.check_rates(self.encoder_mask_rate, self.decoder_mask_rate,
                                   self.decoder_predictions)
    if problem:
      raise ConfigError(f"RetroMaeJob.{problem}")
    weight = self.encoder_loss_weight
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0:
      raise ConfigError(f"RetroMaeJob.encoder_loss_weight={weight!r}: expected a number >= 0")
    # A corpus this run registers keeps its blocks whole (ICT removes a sentence with p 0.9).
    self.register_corpus(ict_remove_probability=0.0)
    self.check_task_prefix("ict_")

  def describe(self) -> str:
    rows = ("" if self.decoder_predictions is None
            else f", at most {self.decoder_predictions} decoder rows")
    return (f"encoder mask {self.encoder_mask_rate:g}, decoder mask "
            f"{self.decoder_mask_rate:g}{rows}")

  def build_model(self, ctx: RunContext) -> Any:
    from realm_jax.models import retromae  # pylint: disable=g-import-not-at-top
    return retromae.RetroMaeModel(ctx.model_config,
                                  encoder_loss_weight=float(self.encoder_loss_weight))

  def _batches(self, ctx: RunContext) -> Any:
    import realm_jax_tasks  # pylint: disable=g-import-not-at-top,unused-import  (registers tasks)
    from realm_jax.batches import retromae  # pylint: disable=g-import-not-at-top
    from realm_jax.batches import seqio_batches  # pylint: disable=g-import-not-at-top
    blocks = seqio_batches.SeqioBatches(self.task, batch_size=ctx.batch_size, seed=ctx.seed,
                                        feature_keys=retromae.BLOCK_KEYS)
    return retromae.RetroMaeBatches(
        blocks, seed=ctx.seed, vocab_size=ctx.model_config.bert.vocab_size,
        encoder_mask_rate=self.encoder_mask_rate, decoder_mask_rate=self.decoder_mask_rate,
        decoder_predictions=self.decoder_predictions)

  def abstract_batch(self, ctx: RunContext, model: Any) -> dict[str, Any]:
    return global_spec(self._batches(ctx).element_spec(), ctx.global_batch)

  def build_batches(self, ctx: RunContext, model: Any) -> Any:
    return self._batches(ctx)

  def warm_start(self, checkpoint: Mapping[str, Any], params: dict, source: str
                 ) -> tuple[dict, str]:
    """Every retriever tower's BERT from the checkpoint's encoder, as ICT's (untied towers
    stay equal: they start equal, see RetroMaeModel)."""
    return towers_from_encoder(checkpoint, params, source, "RetroMAE")
