"""`pretrain`: REALM pretraining (REALM_SPEC 15-17, 21).

Masked queries of a `realm_<corpus>_<strategy>` task, candidates retrieved from the run's
current index (`realm_jax.build_index` publishes it alongside), the per-token marginal MLM loss.
The retriever warm-starts from `init_checkpoint` (an ICT checkpoint) and the knowledge-augmented
encoder from `encoder_checkpoint` (a converted BERT or an mlm checkpoint). At every checkpoint,
retrieval utility on `eval_batches` batches picks the best checkpoint (REALM_SPEC 17).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import gin

from realm_jax.gin_utils import ConfigError
from realm_jax.jobs.base import RunContext, global_spec, require
from realm_jax.jobs.index_job import IndexJob


@gin.configurable
@dataclasses.dataclass
class PretrainJob(IndexJob):
  """RealmPretrainModel on a `realm_<corpus>_<strategy>` task.

  Attributes:
    pretrain_records: the pretraining text X in the REALM release schema (e.g. CC-News with
      precomputed salient spans); None: X is the corpus itself.
    num_candidates: candidates per query including the null document.
    null_document: False for the ablation without the null document (K retrieved blocks).
    eval_batches: batches whose retrieval utility picks the best checkpoint; 0 disables.
    length_bucket: cut training reader rows to a multiple of this many wordpieces (0: off).
    retriever_objective: "marginal" (REALM) or Atlas's "emdr2", "pdist", "loop", "adist" (the
      reader keeps the marginal MLM loss with the scores held fixed).
    oracle_blocks: a diagnostic, 0 in REALM: up to this many blocks of another document that
      state the masked span go first among each query's candidates
      (`realm_jax.batches.stating_blocks`), whatever the retriever ranks.
  """
  pretrain_records: Optional[str] = None
  num_candidates: int = 8
  null_document: bool = True
  eval_batches: int = 4
  length_bucket: int = 0
  oracle_blocks: int = 0

  name = "pretrain"

  def configure(self, ctx: RunContext) -> None:
    from realm_jax.batches import seqio_batches  # pylint: disable=g-import-not-at-top
    self.check_retriever_objective()
    try:
      seqio_batches.check_row_bucket(self.length_bucket)
    except ValueError as e:
      raise ConfigError(f"PretrainJob.length_bucket: {e}") from e
    self.register_corpus(pretrain_records=self.pretrain_records)
    self.check_task_prefix("realm_")
    real_candidates = self.num_candidates - (1 if self.null_document else 0)
    if not 0 <= self.oracle_blocks <= real_candidates:
      raise ConfigError(f"PretrainJob.oracle_blocks={self.oracle_blocks}: expected 0 to the "
                        f"{real_candidates} retrieved candidates of num_candidates="
                        f"{self.num_candidates}")
    self.open_store()

  def build_model(self, ctx: RunContext) -> Any:
    from realm_jax.models import realm  # pylint: disable=g-import-not-at-top
    return realm.RealmPretrainModel(ctx.model_config,
                                    null_index=0 if self.null_document else None,
                                    retriever_objective=self.retriever_objective,
                                    objective_temperature=self.objective_temperature)

  def _batches(self, ctx: RunContext, retriever: Any = None, **masked_options: Any) -> Any:
    import realm_jax_tasks  # pylint: disable=g-import-not-at-top,unused-import  (registers tasks)
    from realm_jax.batches import pretraining_batches  # pylint: disable=g-import-not-at-top
    from realm_jax.batches import seqio_batches  # pylint: disable=g-import-not-at-top
    masked = seqio_batches.SeqioBatches(
        self.task, batch_size=ctx.batch_size, seed=ctx.seed,
        feature_keys=pretraining_batches.MASKED_QUERY_KEYS, **masked_options)
    return pretraining_batches.PretrainingBatches(masked, self.store, retriever=retriever,
                                                  num_candidates=self.num_candidates,
                                                  null_document=self.null_document,
                                                  oracle_blocks=self.oracle_blocks)

  def abstract_batch(self, ctx: RunContext, model: Any) -> dict[str, Any]:
    return global_spec(self._batches(ctx).element_spec(), ctx.global_batch)

  def build_batches(self, ctx: RunContext, model: Any) -> Any:
    batches = self._batches(ctx)  # the retriever is the index watcher, set by `start`
    if not self.length_bucket:
      return batches
    from realm_jax.batches import pretraining_batches  # pylint: disable=g-import-not-at-top
    from realm_jax.batches import seqio_batches  # pylint: disable=g-import-not-at-top
    return seqio_batches.LengthBucketed(batches, keys=pretraining_batches.READER_ROW_KEYS,
                                        mask_key="reader_mask", length_bucket=self.length_bucket,
                                        name="reader")

  def warm_start(self, checkpoint: Mapping[str, Any], params: dict, source: str
                 ) -> tuple[dict, str]:
    """The retriever, and the encoder when the checkpoint has one."""
    params = self.warm_start_retriever(checkpoint, params, source)
    if "encoder" not in checkpoint:
      return params, "retriever"
    return {**params, "encoder": checkpoint["encoder"]}, "retriever, encoder"

  def warm_start_extra(self, knob: str, checkpoint: Mapping[str, Any], params: dict,
                       source: str) -> tuple[dict, str]:
    """`encoder_checkpoint`: the knowledge-augmented encoder (REALM starts it from BERT). A
    BERT without an MLM head (a `BertModel` checkpoint, e.g. a sentence encoder) keeps the
    fresh head, whose decoder is tied to the BERT's word embeddings."""
    encoder = require(checkpoint, "encoder", knob, source)
    taken = ("encoder" if "mlm_head" in encoder
             else "encoder's BERT (the checkpoint has no MLM head: a fresh one)")
    return {**params, "encoder": {**params["encoder"], **encoder}}, taken

  def start(self, ctx: RunContext, model: Any, batches: Any):
    hooks, _, _ = super().start(ctx, model, batches)
    if not self.eval_batches:
      return hooks, None, None
    from realm_jax.training import trainer  # pylint: disable=g-import-not-at-top

    def draw():
      # The first `eval_batches` batches in order, from the index in use (REALM_SPEC 17), at
      # full width even with `length_bucket` so the eval step compiles once.
      batches = self._batches(ctx, retriever=self.watcher, shuffle=False, num_epochs=1)
      return [next(batches) for _ in range(self.eval_batches)]

    eval_fn = trainer.make_eval_fn(model, draw, mesh=ctx.mesh, rules=ctx.rules)
    best = "eval/retrieval/utility" if self.null_document else "eval/mlm/accuracy"
    return hooks, eval_fn, best
