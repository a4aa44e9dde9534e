"""The job interface: what one kind of training run owns, so that one generic `train` runs any.

A job (t5x style: gin builds it, `train_main.job = @PretrainJob()`) owns its task, its model,
its batch source and that source's schema, its warm start, its hooks and its evaluation; its
settings are its constructor's arguments. `realm_jax.train.train_main` holds what every run
shares in a `RunContext` and calls `configure`, `build_model`, `abstract_batch`,
`build_batches`, `warm_start`, `start`, trains, then `close`. Adding a job and the call order:
docs/design/models_and_jobs.md, docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import gin

from realm_jax import gin_utils
from realm_jax.gin_utils import ConfigError

Hook = Callable[[int, Any], Optional[Mapping[str, float]]]
EvalFn = Callable[[int, Any], Mapping[str, float]]


@dataclasses.dataclass(frozen=True)
class RunContext:
  """What every job is given: the run's shared settings and the objects built from them.

  Attributes:
    run_dir: the run directory.
    model_config: the RealmConfig.
    batch_size: examples per step on this host; `global_batch` across hosts.
    seed: parameter init, dropout and data seed.
    mesh, rules: the device mesh and logical axis rules.
    init_checkpoint: the warm-start checkpoint step directory, or None.
    checkpoint_every: the trainer's checkpoint cadence (None where unknown).
  """
  run_dir: str
  model_config: Any
  batch_size: int
  global_batch: int
  seed: int
  mesh: Any
  rules: Sequence
  init_checkpoint: Optional[str]
  checkpoint_every: Optional[int] = None


def global_spec(spec: Mapping[str, Any], global_batch: int) -> dict[str, Any]:
  """Per-example `{key: ShapeDtypeStruct}` -> the global batch's (leading `global_batch`)."""
  import jax  # pylint: disable=g-import-not-at-top
  return {key: jax.ShapeDtypeStruct((global_batch,) + tuple(s.shape), s.dtype)
          for key, s in spec.items()}


def bert_from_encoder(tower: dict, encoder: dict) -> dict:
  """A retriever tower (RealmEmbedder params) whose BERT is `encoder`'s; the pooler, which the
  MLM encoder has none of, and the projection stay as they are (fresh)."""
  return {**tower, "bert": {**tower["bert"], **encoder["bert"]}}


def require(checkpoint: Mapping[str, Any], key: str, knob: str, source: str,
            hint: str = "") -> Any:
  """`checkpoint[key]`, or a one-line ConfigError naming the checkpoint and what it has."""
  if key not in checkpoint:
    raise ConfigError(f"{knob} {source}: no {key} params (has {sorted(checkpoint)}{hint})")
  return checkpoint[key]


@dataclasses.dataclass
class Job:
  """Base of every job. Subclasses are gin-configurable dataclasses.

  Attributes:
    task: the seqio task (or, for fine-tuning, your own QA files) the job trains on.
    block_store: the BlockStore its corpus lives in (None: the toy store for the toy tasks).
  """
  task: str = gin.REQUIRED
  block_store: Optional[str] = None

  # The job's name in `train_main.job` descriptions and in its task names (`<name>_<corpus>`).
  name = "job"
  # Whether `init_checkpoint` only has to match the model's BERT (its heads start fresh).
  warm_start_bert_only = False

  # -- configuration (nothing read)

  def configure(self, ctx: RunContext) -> None:
    """Checks the settings that need the run's context and registers what the task needs;
    ConfigError (one line) on a mistake. The default checks that the task is registered and
    named `<name>_*` (registering its corpus over `block_store` first)."""
    self.register_corpus()
    self.check_task_prefix(f"{self.name}_")

  def register_corpus(self, **options: Any) -> bool:
    """Registers the corpus the task names over `block_store`, when one is set
    (`realm_jax_tasks.register_corpus_for_task`, with its `options`); whether it did (a known
    task such as the toy world's needs none)."""
    if self.block_store is None:
      return False
    import realm_jax_tasks  # pylint: disable=g-import-not-at-top
    from realm_jax.data import block_store as block_store_lib  # pylint: disable=g-import-not-at-top
    try:
      # Also for a known task.
      block_store_lib.BlockStore.open(self.block_store, verify="fast").close()
      return realm_jax_tasks.register_corpus_for_task(self.task, self.block_store,
                                                      **options) is not None
    except block_store_lib.BlockStoreError as e:
      raise ConfigError(f"{type(self).__name__}.block_store: {e}") from e

  def check_task_prefix(self, prefix: str) -> Any:
    """The registered seqio task, or ConfigError unless it exists and starts with `prefix`."""
    # The jobs name the tasks, so they register them; imported here, not at the top: the
    # tasks import TensorFlow, which `python -m realm_jax.train --help` need not load.
    import realm_jax_tasks  # pylint: disable=g-import-not-at-top,unused-import
    from realm_jax.batches import seqio_batches  # pylint: disable=g-import-not-at-top
    try:
      task = seqio_batches.get_task(self.task)
    except seqio_batches.UnknownTaskError as e:
      raise ConfigError(f"{type(self).__name__}.task: {gin_utils.one_line(e)}") from e
    if not self.task.startswith(prefix):
      raise ConfigError(f"{type(self).__name__}.task={self.task!r} does not fit job "
                        f"{self.name!r} (expected a {prefix}* task)")
    return task

  def optimizer_options(self) -> dict[str, Any]:
    """Extra `optim.bert_optimizer` arguments (none by default)."""
    return {}

  def describe(self) -> str:
    """What the run's one-line description says about this job beyond its name and task."""
    return ""

  # -- model and batches (every job defines the four methods that raise NotImplementedError
  # here: the interface train_main calls, not missing work)

  def build_model(self, ctx: RunContext) -> Any:
    """The model (`realm_jax.models.realm`'s interface) the job trains."""
    raise NotImplementedError

  def abstract_batch(self, ctx: RunContext, model: Any) -> dict[str, Any]:
    """The global batch's `{key: ShapeDtypeStruct}` (from the batch source's schema, nothing
    read): a dry run lowers the train step on it."""
    raise NotImplementedError

  def build_batches(self, ctx: RunContext, model: Any) -> Any:
    """The host batch iterator (the trainer's BatchIterator)."""
    raise NotImplementedError

  # -- warm start

  def warm_start(self, checkpoint: Mapping[str, Any], params: dict, source: str
                 ) -> tuple[dict, str]:
    """The parameters a run starts from: fresh `params` with the subtrees `checkpoint` (the
    `init_checkpoint`'s params) provides; returns (params, what was taken, for the log)."""
    raise NotImplementedError

  def extra_warm_starts(self) -> list[tuple[str, str]]:
    """[(knob, checkpoint step dir)] warm starts beyond `init_checkpoint`, applied after it
    with `warm_start_extra` (e.g. pretraining's `encoder_checkpoint`); BERT-shaped."""
    return []

  def warm_start_extra(self, knob: str, checkpoint: Mapping[str, Any], params: dict,
                       source: str) -> tuple[dict, str]:
    """Applies one of `extra_warm_starts` (only a job that lists some defines it)."""
    raise NotImplementedError

  # -- around training

  def start(self, ctx: RunContext, model: Any, batches: Any
            ) -> tuple[list[Hook], Optional[EvalFn], Optional[str]]:
    """Starts what runs alongside (an index watcher); returns (hooks, eval_fn, best_metric)."""
    del ctx, model, batches
    return [], None, None

  def close(self) -> None:
    """Stops what `start` started."""

  def peft_checkpoints(self, ctx: RunContext, model: Any) -> Any:
    """A parameter-efficient run's `checkpoints.PeftCheckpoints` (its checkpoints hold only the
    trained parameters), or None (the default: every parameter is checkpointed)."""
    del ctx, model
    return None


@dataclasses.dataclass
class SeqioJob(Job):
  """A job whose batches are a seqio task's examples as they are (`SeqioBatches`): the task's
  features named by `feature_keys` (a key tuple of `realm_jax.batches.seqio_batches`) are its
  batch schema.

  Attributes:
    shuffle_buffer: examples in the shuffle buffer (None: `SeqioBatches`' default, 10,000),
      filled before the first batch; a smaller one starts sooner and shuffles less.
  """
  shuffle_buffer: Optional[int] = None

  feature_keys = ""

  def _seqio(self, ctx: RunContext) -> Any:
    import realm_jax_tasks  # pylint: disable=g-import-not-at-top,unused-import  (registers tasks)
    from realm_jax.batches import seqio_batches  # pylint: disable=g-import-not-at-top
    size = self.shuffle_buffer
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
      raise ConfigError(f"{type(self).__name__}.shuffle_buffer={size!r}: expected a whole "
                        "number of examples >= 1 (None: 10,000)")
    buffer = {} if size is None else {"shuffle_buffer_size": size}
    return seqio_batches.SeqioBatches(self.task, batch_size=ctx.batch_size, seed=ctx.seed,
                                      feature_keys=getattr(seqio_batches, self.feature_keys),
                                      **buffer)

  def abstract_batch(self, ctx: RunContext, model: Any) -> dict[str, Any]:
    return global_spec(self._seqio(ctx).element_spec(), ctx.global_batch)

  def build_batches(self, ctx: RunContext, model: Any) -> Any:
    return self._seqio(ctx)
