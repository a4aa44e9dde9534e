"""What the jobs that retrieve from the run's index share: the BlockStore, the index watcher
that swaps a newer published index in at step boundaries (REALM_SPEC 21), the encoder warm
start, and the protection of the retriever's updates."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from realm_jax.gin_utils import ConfigError
from realm_jax.jobs.base import Job, RunContext, require


@dataclasses.dataclass
class IndexJob(Job):
  """A job whose batches are retrieved from `<run_dir>/index/` (`realm_jax.build_index`).

  Attributes:
    encoder_checkpoint: a checkpoint step directory (a converted BERT's or an mlm run's).
      Pretraining: the knowledge-augmented encoder starts from its encoder (None: random, or
      `init_checkpoint`'s encoder when it has one). Fine-tuning: the reader's BERT starts from
      its encoder's BERT under a fresh span head, overriding `init_checkpoint`'s reader (with
      an ICT `init_checkpoint`: ORQA, the paper's baseline).
    retriever_lr_scale: the retriever's (question tower's) updates are multiplied by this (its
      lr relative to the encoder's or reader's; same schedule), as Atlas's `--lr_retriever`.
      1.0 (off): REALM uses one optimizer for both towers (REALM_SPEC 18); a toy-world
      deviation where set. See `optim.bert_optimizer`.
    freeze_retriever_steps: the retriever's parameters stay exactly as they are for this many
      first updates (Atlas's `--freeze_retriever_steps`); its Adam moments still accumulate.
      0: off. Either option on changes the optimizer state's structure: a run resumes only
      with the options on or off as they were.
    index_check_every: look for a newer published index every this many steps.
    refresh_in_lockstep: False (the paper's way): swap in whatever newer index the builder has
      published, checked every `index_check_every` steps. True: step s searches the index of
      the newest checkpoint before it (R * floor((s - 1) / R), R = `train_main.
      checkpoint_every`), the trainer waiting for the builder to publish it (`index.swap`'s
      lockstep), so that the run does not depend on the builder's speed next to the trainer
      and resumes to the same result. Needs the builder running alongside once training passes
      its first checkpoint.
    first_index_checkpoint_dir: the checkpoint the step-0 index was built from (default:
      `init_checkpoint`), for its query tower.
    retriever_objective: how the retriever learns: "marginal" (REALM's and ORQA's own loss)
      or one of Atlas's "emdr2", "pdist", "loop", "adist" (realm_jax.models.
      retriever_objectives; what each job does with it: its own description).
    objective_temperature: T of the retriever's softmax(scores / T) in Atlas's objectives
      (must stay 1.0 with "marginal").
  """
  encoder_checkpoint: Optional[str] = None
  retriever_lr_scale: float = 1.0
  freeze_retriever_steps: int = 0
  index_check_every: int = 100
  refresh_in_lockstep: bool = False
  first_index_checkpoint_dir: Optional[str] = None
  retriever_objective: str = "marginal"
  objective_temperature: float = 1.0

  def __post_init__(self):
    self.store = None  # the BlockStore, opened by `open_store`
    self.watcher = None  # the IndexWatcher, started by `start`

  def open_store(self) -> Any:
    """Opens `block_store` (the toy store for the toy tasks when None)."""
    from realm_jax.data import block_store as block_store_lib  # pylint: disable=g-import-not-at-top
    path = self.block_store
    if path is None:
      toy_task = self.task.startswith("realm_toy_") or self.task in ("toy_qa",
                                                                       "atlas_pretext_toy")
      if not toy_task:
        raise ConfigError(f"{type(self).__name__}.block_store is required for task "
                          f"{self.task!r} (the BlockStore its index embeds)")
      import realm_jax_tasks  # pylint: disable=g-import-not-at-top
      path = realm_jax_tasks.toy_block_store_dir()
    self.store = block_store_lib.BlockStore.open(path, verify="fast")
    return self.store

  def lockstep_every(self, ctx: RunContext) -> Optional[int]:
    """The lockstep refresh cadence (`refresh_in_lockstep`): the run's checkpoint cadence, or
    None when off; a one-line ConfigError when the cadence is unknown."""
    if not self.refresh_in_lockstep:
      return None
    if ctx.checkpoint_every is None:
      raise ConfigError(f"{type(self).__name__}.refresh_in_lockstep needs the run's "
                        f"train_main.checkpoint_every")
    return int(ctx.checkpoint_every)

  def check_retriever_objective(self) -> None:
    """A one-line ConfigError unless the job's `retriever_objective` and
    `objective_temperature` settings are valid (retriever_objectives.check_objective)."""
    from realm_jax.models import retriever_objectives  # pylint: disable=g-import-not-at-top
    try:
      retriever_objectives.check_objective(self.retriever_objective, self.objective_temperature)
    except ValueError as e:
      raise ConfigError(f"{type(self).__name__}.{e}") from e

  def optimizer_options(self) -> dict[str, Any]:
    # Both jobs' parameter trees keep the retriever (fine-tuning: the question tower) under
    # "retriever"; with the options off this is the plain optimizer.
    return {"retriever_lr_scale": self.retriever_lr_scale,
            "freeze_retriever_steps": self.freeze_retriever_steps,
            "retriever_keys": ("retriever",)}

  def describe(self) -> str:
    parts = []
    if self.encoder_checkpoint is not None:
      parts.append(f"encoder from {self.encoder_checkpoint}")
    if self.retriever_lr_scale != 1.0:
      parts.append(f"retriever lr x{self.retriever_lr_scale:g}")
    if self.freeze_retriever_steps:
      parts.append(f"retriever frozen for {self.freeze_retriever_steps} steps")
    if self.refresh_in_lockstep:
      parts.append("index refreshed in lockstep with the checkpoints")
    from realm_jax.models import retriever_objectives  # pylint: disable=g-import-not-at-top
    # An objective of its own that trains the retriever (not REALM's marginal, not FiD's none).
    objective = retriever_objectives.get(self.retriever_objective)
    if objective is not None and objective.trains_retriever and not objective.joint:
      parts.append(f"retriever objective {self.retriever_objective} "
                   f"(T {self.objective_temperature:g})")
    return ", ".join(parts)

  def extra_warm_starts(self) -> list[tuple[str, str]]:
    return ([] if self.encoder_checkpoint is None
            else [("encoder_checkpoint", self.encoder_checkpoint)])

  def warm_start_retriever(self, checkpoint: Mapping[str, Any], params: dict, source: str
                           ) -> dict:
    """`params` with the checkpoint's retriever (an ICT checkpoint, or any with one)."""
    return {**params, "retriever": require(checkpoint, "retriever", "init_checkpoint", source)}

  def start(self, ctx: RunContext, model: Any, batches: Any):
    from realm_jax.index import retrieval  # pylint: disable=g-import-not-at-top
    from realm_jax.index.swap import IndexWatcher  # pylint: disable=g-import-not-at-top
    loader = retrieval.make_index_loader(
        ctx.run_dir, ctx.model_config,
        first_checkpoint_dir=self.first_index_checkpoint_dir or ctx.init_checkpoint)
    self.watcher = IndexWatcher(ctx.run_dir, load_fn=loader,
                                check_every_steps=self.index_check_every,
                                block_store_id=self.store.store_id,
                                dim=ctx.model_config.proj_size,
                                lockstep_every=self.lockstep_every(ctx))
    self.watcher.start()
    batches.set_retriever(self.watcher)
    return [self.index_hook(batches)], None, None

  def index_hook(self, batches: Any):
    """At each step boundary: maybe swap in a newer index; its retrieval/index_step,
    staleness and refresh metrics."""
    watcher = self.watcher

    def hook(step: int, state: Any):
      del state
      watcher.maybe_swap(step)
      return watcher.metrics(step)

    return hook

  def close(self) -> None:
    if self.watcher is not None:
      self.watcher.close()
      self.watcher = None
