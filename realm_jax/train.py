r"""The trainer entry point: any job (ICT warm start, REALM pretraining, open-QA fine-tuning,
the toy BERT's MLM) that gin builds, run by one generic `train_main`.

  python -m realm_jax.train --gin_file=gin_configs/experiments/toy_ict.gin \
      --gin.RUN_DIR="'/tmp/realm_toy/ict'" [--dry_run]

Gin binds `train_main` (what every run shares), its job (`train_main.job = @PretrainJob()`; a
job's settings on its class, e.g. `--gin.PretrainJob.num_candidates=8`) and %MODEL_CONFIG. Jobs
(`realm_jax.jobs`): @MlmJob() (the toy BERT), @IctJob() (REALM_SPEC 14), @ContrieverJob() and
@RetroMaeJob() (other warm starts), @PretrainJob() (REALM_SPEC 15-21; `realm_jax.build_index`
beside it) and @FinetuneJob() (REALM_SPEC 25-29). `--dry_run` builds the job, lowers its step on
abstract shapes and prints one line; it reads and writes nothing. Exit status: 0 done, 1 a
runtime error, 2 a configuration error or another trainer holding the run directory, 130 or 143
interrupted (a rerun resumes). Design notes: docs/design/training_and_commands.md.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Optional, Sequence

import gin

from realm_jax import fileio
from realm_jax import gin_utils
from realm_jax import jobs as jobs_lib
from realm_jax.gin_utils import ConfigError

PROG = "train"

log = logging.getLogger(PROG)


def _check_init_checkpoint(step_dir: str, config: Any, knob: str, *, bert_only: bool) -> None:
  """One-line ConfigError unless `step_dir` is a finished checkpoint of this model size (of this
  BERT shape with `bert_only`: a BERT warm start, whose heads start fresh)."""
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
  try:
    ckpt_lib.checkpoint_config(step_dir, ckpt_lib.read_metadata(step_dir), config,
                               bert_only=bert_only)
  except ckpt_lib.CheckpointError as e:
    raise ConfigError(f"{knob}: {gin_utils.one_line(e)}") from e


def _warm_init(job: jobs_lib.Job, train_step: Any, ctx: jobs_lib.RunContext) -> Any:
  """`train_step.init_state` with the job's warm starts applied (`init_checkpoint`, then the
  job's extra ones); used only when the run does not resume."""
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.models import peft as peft_lib  # pylint: disable=g-import-not-at-top
  sources = ([("init_checkpoint", ctx.init_checkpoint)] if ctx.init_checkpoint else [])
  sources += job.extra_warm_starts()
  # Sizes were checked (_check_init_checkpoint): a BERT warm start's heads may differ.
  loaded = [(knob, path, ckpt_lib.restore_checkpoint_dir(
      path, expected_config=None if job.warm_start_bert_only or knob != "init_checkpoint"
      else ctx.model_config)[0]) for knob, path in sources]
  fresh_init = train_step.init_state

  def warm_init(rng):
    state = fresh_init(rng)
    params = fresh = jax.device_get(state.params)
    for knob, path, checkpoint in loaded:
      if knob == "init_checkpoint":
        params, taken = job.warm_start(checkpoint, params, path)
      else:
        params, taken = job.warm_start_extra(knob, checkpoint, params, path)
      log.info("warm start from %s (%s): %s", path, knob, taken)
    # What no checkpoint has (a PEFT run's adapters) stays as initialised.
    params = peft_lib.with_missing_leaves(params, fresh)
    return state.replace(params=jax.device_put(params, train_step.state_sharding.params))

  return warm_init


@gin_utils.command(PROG, doc=__doc__, example_gin="gin_configs/experiments/toy_ict.gin",
                   interrupted="resume by running the same command",
                   booleans={"dry_run": "Build the job (model, optimizer, mesh, inputs, lowered "
                                        "step), print one line and exit without training."},
                   configurables=jobs_lib.all_jobs())
def train_main(run_dir: str = gin.REQUIRED, model_config: Any = gin.REQUIRED,
               job: jobs_lib.Job = gin.REQUIRED, batch_size: int = gin.REQUIRED,
               num_steps: int = gin.REQUIRED, learning_rate: float = gin.REQUIRED,
               warmup_steps: Optional[int] = None, checkpoint_every: int = 1000,
               mesh_shape: Sequence[int] = (-1, 1), rules: Optional[Sequence] = None,
               seed: int = 0, init_checkpoint: Optional[str] = None,
               log_every: int = 100, keep: int = 3, dry_run: bool = False,
               checkpoint_timeout: Optional[float] = None,
               metrics_format: str = "tensorboard") -> int:
  """Runs (or, with `dry_run`, only builds) one training job.

  Args:
    run_dir: the run directory (checkpoints/, tensorboard/, best.json, TRAINING_DONE; index/
      for jobs that retrieve).
    model_config: a RealmConfig (%MODEL_CONFIG of gin_configs/models/*.gin).
    job: the job object (`@IctJob()`, `@PretrainJob()`, ...), which owns the task, model,
      batches, warm start and evaluation.
    batch_size: examples per step on this host (global batch = hosts x this; a multiple of the
      mesh's data axis).
    num_steps: total updates of the run (a resumed run continues to it).
    learning_rate: peak learning rate of `optim.bert_optimizer`.
    warmup_steps: linear warmup steps (None: the optimizer's default).
    checkpoint_every: checkpoint (and evaluate) every this many steps, and at the end.
    mesh_shape: (data, model) sizes of the device mesh; -1 takes the rest.
    rules: logical axis rules (None: partitioning.DEFAULT_RULES).
    seed: parameter init, dropout and data seed.
    init_checkpoint: a checkpoint step directory to warm-start from (the job's `warm_start`);
      ignored when resuming.
    log_every: write metrics every this many steps.
    keep: newest checkpoints to keep (the best one is kept too).
    dry_run: build everything and lower the step on abstract shapes, print one line.
    checkpoint_timeout: seconds a checkpoint save may take before the run stops (None:
      `checkpoints.DEFAULT_SAVE_TIMEOUT_SECONDS`, 30 minutes).
    metrics_format: "tensorboard" (`<run_dir>/tensorboard`, imports TensorFlow) or "jsonl"
      (`<run_dir>/metrics.jsonl`).

  Returns:
    The exit status (0).
  """
  # Heavy imports here: `--help` and config errors stay instant.
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.models.config import RealmConfig  # pylint: disable=g-import-not-at-top
  from realm_jax.training import optim  # pylint: disable=g-import-not-at-top
  from realm_jax.training import partitioning  # pylint: disable=g-import-not-at-top
  from realm_jax.training import trainer  # pylint: disable=g-import-not-at-top
  from realm_jax.models import peft as peft_lib  # pylint: disable=g-import-not-at-top

  if not isinstance(job, jobs_lib.Job):
    raise ConfigError(f"train_main.job is a {type(job).__name__}, not a job: bind it to one of "
                      f"{', '.join(f'@{j.__name__}()' for j in jobs_lib.all_jobs())}")
  if not isinstance(model_config, RealmConfig):
    raise ConfigError(f"train_main.model_config is a {type(model_config).__name__}, not a "
                      f"RealmConfig: include a gin_configs/models/*.gin and bind %MODEL_CONFIG")
  if metrics_format not in trainer.METRICS_FORMATS:
    raise ConfigError(f"train_main.metrics_format={metrics_format!r}: one of "
                      f"{', '.join(trainer.METRICS_FORMATS)}")
  rules = partitioning.DEFAULT_RULES if rules is None else tuple(tuple(r) for r in rules)
  try:
    mesh = partitioning.make_mesh(*mesh_shape)
  except (ValueError, TypeError) as e:
    raise ConfigError(f"train_main.mesh_shape={tuple(mesh_shape)!r}: {e}") from e
  global_batch = int(batch_size) * jax.process_count()
  data_size = int(mesh.shape[partitioning.DATA_AXIS])
  if global_batch % data_size:
    raise ConfigError(f"global batch {global_batch} (batch_size {batch_size} x "
                      f"{jax.process_count()} hosts) is not a multiple of the mesh's data axis "
                      f"({data_size})")
  ctx = jobs_lib.RunContext(run_dir=run_dir, model_config=model_config,
                            batch_size=int(batch_size), global_batch=global_batch, seed=seed,
                            mesh=mesh, rules=rules, init_checkpoint=init_checkpoint,
                            checkpoint_every=checkpoint_every)
  job.configure(ctx)
  if init_checkpoint is not None:
    _check_init_checkpoint(init_checkpoint, model_config, "init_checkpoint",
                           bert_only=job.warm_start_bert_only)
  for knob, path in job.extra_warm_starts():
    _check_init_checkpoint(path, model_config, knob, bert_only=True)

  model = job.build_model(ctx)
  schedule = optim.bert_learning_rate_schedule(learning_rate, num_steps, warmup_steps)
  options = job.optimizer_options()
  try:
    optimizer = optim.bert_optimizer(learning_rate, num_steps, warmup_steps=warmup_steps,
                                     **options)
    train_step = trainer.make_train_step(model, optimizer, mesh=mesh, rules=rules,
                                         learning_rate_fn=schedule)
  except ValueError as e:
    raise ConfigError(f"train_main: {e}") from e
  params_shape = train_step.abstract_state.params
  num_params = sum(int(x.size) for x in jax.tree.leaves(params_shape))
  trained = ("" if options.get("trainable") is None else
             f" ({peft_lib.count_trained(params_shape, options['trainable']):,} trained)")
  mesh_text = " x ".join(f"{name} {size}" for name, size in mesh.shape.items())
  description = ", ".join(filter(None, [
      f"job {job.name}, task {job.task}, model ({ckpt_lib.describe_size(model_config)}), "
      f"{num_params:,} params{trained}, mesh {mesh_text}, global batch {global_batch}, {num_steps} "
      f"steps, lr {learning_rate:g}, run_dir {run_dir}",
      init_checkpoint and f"warm start from {init_checkpoint}", job.describe()]))

  if dry_run:
    train_step.lower(train_step.abstract_state, job.abstract_batch(ctx, model))
    print(f"{PROG}: dry run ok ({description}; step lowered on abstract shapes, not "
          f"compiled)", flush=True)
    return 0

  # One trainer per run directory: a second stops here, before touching the run. Hosts other
  # than the first share the first's lock.
  with (fileio.run_dir_lock(run_dir, "trainer") if jax.process_index() == 0
        else contextlib.nullcontext()):
    batches = job.build_batches(ctx, model)
    if init_checkpoint is not None or job.extra_warm_starts():
      train_step.init_state = _warm_init(job, train_step, ctx)
    try:
      hooks, eval_fn, best_metric = job.start(ctx, model, batches)
      log.info("%s: %s", PROG, description)
      # The model's own config: a PEFT run's adapters are part of what its checkpoints hold.
      trainer.train(model, optimizer, batches, run_dir=run_dir, num_steps=num_steps, mesh=mesh,
                    config=getattr(model, "config", model_config), rules=rules,
                    checkpoint_every=checkpoint_every, keep=keep, log_every=log_every,
                    hooks=hooks, seed=seed, learning_rate_fn=schedule, eval_fn=eval_fn,
                    best_metric=best_metric, train_step=train_step,
                    peft=job.peft_checkpoints(ctx, model),
                    checkpoint_timeout=checkpoint_timeout, writer=metrics_format)
    finally:
      job.close()
  print(f"{PROG}: done ({description})", flush=True)
  return 0


main = train_main.main

if __name__ == "__main__":
  gin_utils.exit_process(main(), PROG)
