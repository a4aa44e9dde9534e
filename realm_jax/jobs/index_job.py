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
    encoder_checkpoint: a converted BERT's or an mlm run's checkpoint: the encoder's (or
      fine-tuning reader's) BERT starts from its encoder; None: `init_checkpoint`'s or random.
    retriever_lr_scale: the retriever's lr relative to the encoder's or reader's, as Atlas's
      `--lr_retriever`; 1.0: off (REALM_SPEC 18: one optimizer for both towers).
    freeze_retriever_steps: the retriever stays fixed for this many first updates; 0: off.
    index_check_every: look for a newer published index every this many steps.
    refresh_in_lockstep: True: step s waits for the index of the newest checkpoint before it
      (reproducible); False (the paper's way): whatever newer index the builder published.
    first_index_checkpoint_dir: the checkpoint the step-0 index was built from (default:
      `init_checkpoint`), for its query tower.
    retriever_objective: "marginal" (REALM's and ORQA's own loss) or one of Atlas's "emdr2",
      "pdist", "loop", "adist" (realm_jax.models.retriever_objectives).
    objective_temperature: T of the retriever's softmax in Atlas's objectives (1.0 with
      "marginal").
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
