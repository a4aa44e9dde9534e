"""`ict`: the Inverse Cloze Task warm start of the retriever (REALM_SPEC 14, ORQA), and
`contriever`, Contriever's (Izacard et al. 2021) beside it.

The towers' BERT starts from `init_checkpoint`'s encoder (a converted BERT or an `mlm`
checkpoint) when one is given, or with `continue_retriever` from its whole retriever.
`ContrieverJob` trains the same model (`IctModel`, in-batch negatives) on two independent random
crops of one block (realm_jax.data.contriever); its checkpoints are ICT checkpoints to
everything downstream. Details: docs/design/models_and_jobs.md.
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
    ict_remove_probability: on a corpus over `block_store`, the probability that ICT removes
      the query sentence from its block (None: ORQA's 0.9; lower for short documents).
    continue_retriever: continue `init_checkpoint`'s whole retriever rather than start from
      its encoder's BERT (ICT after RetroMAE).
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


@gin.configurable
@dataclasses.dataclass
class ContrieverJob(SeqioJob):
  """IctModel on a `contriever_<corpus>` task: Contriever's independent random crops. A job
  beside `IctJob`, not a subclass, so gin refuses ICT's settings on it; its warm start is
  IctJob's.

  Attributes:
    min_crop_ratio: the shortest crop, as a fraction of its block's body (Contriever: 0.1).
    max_crop_ratio: the longest crop, as a fraction of its block's body (Contriever: 0.5).
    similarity: "dot" (the retriever's relevance score, ICT's) or "cosine" (Contriever's).
    temperature: the in-batch scores are divided by it (1.0: ICT; Contriever: 0.05).
  """
  # realm_jax.data.contriever's MIN_CROP_RATIO and MAX_CROP_RATIO (not imported: --help stays
  # instant).
  min_crop_ratio: float = 0.1
  max_crop_ratio: float = 0.5
  similarity: str = "dot"
  temperature: float = 1.0

  name = "contriever"
  feature_keys = "ICT_BATCH_KEYS"
  warm_start_bert_only = True

  def configure(self, ctx: RunContext) -> None:
    import realm_jax_tasks  # pylint: disable=g-import-not-at-top
    from realm_jax.data import contriever as contriever_data  # pylint: disable=g-import-not-at-top
    from realm_jax.models import realm  # pylint: disable=g-import-not-at-top
    try:
      contriever_data.check_crop_ratios(self.min_crop_ratio, self.max_crop_ratio)
    except ValueError as e:
      raise ConfigError(f"ContrieverJob.min_crop_ratio={self.min_crop_ratio!r}, "
                        f"max_crop_ratio={self.max_crop_ratio!r}: expected 0 < min_crop_ratio "
                        f"<= max_crop_ratio <= 1") from e
    try:
      realm.IctModel(ctx.model_config, similarity=self.similarity,
                     temperature=self.temperature)
    except ValueError as e:
      raise ConfigError(str(e).replace("IctModel: ", "ContrieverJob.")) from e
    if not self.task.startswith("contriever_"):
      hint = (f" (Contriever's crop pairs of that corpus are the task "
              f"'contriever_{self.task[len('ict_'):]}')" if self.task.startswith("ict_") else "")
      raise ConfigError(f"ContrieverJob.task={self.task!r} does not fit job 'contriever' "
                        f"(expected a contriever_* task{hint})")
    ratios = {"min_crop_ratio": float(self.min_crop_ratio),
              "max_crop_ratio": float(self.max_crop_ratio)}
    if self.block_store is not None:
      registered = self.register_corpus(**ratios)
    elif self.task == "contriever_toy":
      # The toy world's task is this job's own (the toy store, its block length): registered,
      # or registered again with this run's ratios.
      realm_jax_tasks.pretraining.register_contriever_task(
          "toy", block_store=realm_jax_tasks.toy_block_store_dir,
          block_len=realm_jax_tasks.TOY_BLOCK_LEN, **ratios)
      registered = True
    else:
      registered = False
    default_ratios = (self.min_crop_ratio, self.max_crop_ratio) == (
        contriever_data.MIN_CROP_RATIO, contriever_data.MAX_CROP_RATIO)
    if not registered and not default_ratios and _registered(self.task):
      # The ratios are fixed when a task is registered; this one was registered before.
      raise ConfigError(f"ContrieverJob.min_crop_ratio/max_crop_ratio apply to a task that "
                        f"train registers; task {self.task!r} is registered already with its "
                        f"own (set them where it is registered: "
                        f"realm_jax_tasks.pretraining.register_contriever_task)")
    self.check_task_prefix("contriever_")

  def build_model(self, ctx: RunContext) -> Any:
    from realm_jax.models import realm  # pylint: disable=g-import-not-at-top
    return realm.IctModel(ctx.model_config, similarity=self.similarity,
                          temperature=self.temperature)

  def describe(self) -> str:
    return (f"crops {self.min_crop_ratio:g}-{self.max_crop_ratio:g} of a block, "
            f"{self.similarity} scores / {self.temperature:g}")

  def warm_start(self, checkpoint: Mapping[str, Any], params: dict, source: str
                 ) -> tuple[dict, str]:
    """Every retriever tower's BERT from the checkpoint's encoder, as IctJob's."""
    return towers_from_encoder(checkpoint, params, source, what="Contriever")


def _registered(task: str) -> bool:
  import seqio  # pylint: disable=g-import-not-at-top
  return task in seqio.TaskRegistry.names()
