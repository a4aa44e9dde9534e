r"""The trainer job: ICT warm start and REALM pretraining as gin configurations of one trainer.

  python -m realm_jax.train --gin_file=gin_configs/experiments/toy_ict.gin \
      --gin.RUN_DIR="'/tmp/realm_toy/ict'" [--dry_run]

t5x style (shared with `realm_jax.build_index`, see `realm_jax.gin_utils`): `--gin_file`
(repeatable; relative paths are also looked up from the repository root), `--gin_bindings`
(repeatable) and `--gin.KEY=VALUE`. Gin binds only `train_main` below (plus the model gins'
%MODEL_CONFIG); `--dry_run` overrides its `dry_run`.

`--dry_run` builds everything the job needs (model config, model, optimizer, mesh, the input
iterator object, the train step jitted with its shardings and *lowered* on abstract shapes:
traced, not compiled, no parameters allocated) and checks `init_checkpoint`'s model size from
its metadata, then prints one line describing the job and exits 0. It reads no data, starts no
index watcher (pretraining dry runs need no index) and writes nothing.

Exit status: 0 done (or dry run), 1 a runtime error (one line), 2 a configuration error (one
line: unknown flag or gin binding, missing required macro, unregistered task, an
`init_checkpoint` of another model size), 130 interrupted.

Open-QA fine-tuning and evaluation are not jobs of this entry point yet.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Optional, Sequence

import gin

from realm_jax import gin_utils
from realm_jax.gin_utils import ConfigError, split_gin_args

PROG = "train"
JOBS = ("ict", "pretrain")
# Feature lengths of the pretraining tasks (realm_jax_tasks.pretraining) for the abstract
# batch of a dry run: ICT queries 64, masked queries 96, blocks 288, 10 mask slots.
ICT_QUERY_LEN = 64
QUERY_LEN = 96
BLOCK_LEN = 288
MAX_MASKS = 10

log = logging.getLogger(PROG)

_CALL_STARTED = [False]  # set by train_main: errors before it are gin's (config errors)


def _abstract_batch(job: str, global_batch: int, num_candidates: int, block_len: int) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  def spec(*shape, dtype=np.int32):
    return jax.ShapeDtypeStruct((global_batch,) + shape, dtype)

  if job == "ict":
    return {"query_ids": spec(ICT_QUERY_LEN), "query_mask": spec(ICT_QUERY_LEN),
            "block_ids": spec(BLOCK_LEN), "block_type_ids": spec(BLOCK_LEN),
            "block_mask": spec(BLOCK_LEN)}
  k, reader_len = num_candidates, QUERY_LEN + block_len
  return {"query_ids": spec(QUERY_LEN), "query_type_ids": spec(QUERY_LEN),
          "query_mask": spec(QUERY_LEN), "candidate_input_ids": spec(k, block_len),
          "candidate_type_ids": spec(k, block_len), "candidate_mask": spec(k, block_len),
          "reader_ids": spec(k, reader_len), "reader_type_ids": spec(k, reader_len),
          "reader_mask": spec(k, reader_len), "mlm_positions": spec(MAX_MASKS),
          "mlm_targets": spec(MAX_MASKS), "mlm_weights": spec(MAX_MASKS, dtype=np.float32),
          "example_mask": spec(dtype=np.float32)}


def _check_init_checkpoint(step_dir: str, config: Any) -> None:
  """One-line ConfigError unless `step_dir` is a finished checkpoint of this model size."""
  from realm_jax.models.config import realm_config_from_dict  # pylint: disable=g-import-not-at-top
  from realm_jax.training import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
  try:
    metadata = ckpt_lib.read_metadata(step_dir)
    try:
      their_config = realm_config_from_dict(metadata["config"])
    except (KeyError, TypeError, ValueError) as e:
      raise ckpt_lib.CheckpointError(f"{step_dir}: the metadata's model config is unreadable "
                                     f"({e})") from e
    ckpt_lib.check_model_size(their_config, config, step_dir)
  except ckpt_lib.CheckpointError as e:
    raise ConfigError(f"init_checkpoint: {gin_utils.one_line(e)}") from e


@gin.configurable
def train_main(run_dir: str = gin.REQUIRED, model_config: Any = gin.REQUIRED,
               job: str = gin.REQUIRED, task: str = gin.REQUIRED, batch_size: int = gin.REQUIRED,
               num_steps: int = gin.REQUIRED, learning_rate: float = gin.REQUIRED,
               warmup_steps: Optional[int] = None, checkpoint_every: int = 1000,
               mesh_shape: Sequence[int] = (-1, 1), rules: Optional[Sequence] = None,
               seed: int = 0, init_checkpoint: Optional[str] = None,
               index_check_every: int = 100, first_index_checkpoint_dir: Optional[str] = None,
               block_store: Optional[str] = None, num_candidates: int = 8,
               log_every: int = 100, keep: int = 3, dry_run: bool = False) -> int:
  """Runs (or, with `dry_run`, only builds) an ICT or REALM pretraining job.

  Args:
    run_dir: the run directory (checkpoints/, tensorboard/, TRAINING_DONE; for pretraining
      also index/, written by `realm_jax.build_index` running alongside).
    model_config: a RealmConfig (%MODEL_CONFIG of gin_configs/models/*.gin).
    job: "ict" (IctModel on an `ict_<corpus>` task) or "pretrain" (RealmPretrainModel on a
      `realm_<corpus>_<strategy>` task, candidates from the run's current index).
    task: the seqio task name.
    batch_size: examples per step on this host (global batch = hosts x this; it must be a
      multiple of the mesh's data axis).
    num_steps: total updates of the run (a resumed run continues to it).
    learning_rate: peak learning rate of `optim.bert_optimizer`.
    warmup_steps: linear warmup steps (None: the optimizer's default).
    checkpoint_every: checkpoint every this many steps (and at the end).
    mesh_shape: (data, model) sizes of the device mesh; -1 takes the rest.
    rules: logical axis rules (None: partitioning.DEFAULT_RULES).
    seed: parameter init, dropout and data seed.
    init_checkpoint: pretraining only: an ICT checkpoint step directory whose retriever
      subtree warm-starts the retriever (model size checked; ignored when resuming).
    index_check_every: pretraining: look for a newer published index every this many steps.
    first_index_checkpoint_dir: pretraining: the checkpoint the step-0 index was built from
      (default: `init_checkpoint`), for its query tower.
    block_store: pretraining: the BlockStore the index embeds (None: the toy store for
      `realm_toy_*` tasks).
    num_candidates: pretraining: candidates per query including the null document.
    log_every: write metrics every this many steps.
    keep: newest checkpoints to keep.
    dry_run: build everything and lower the step on abstract shapes, print one line, no
      training.

  Returns:
    The exit status (0).
  """
  _CALL_STARTED[0] = True
  # Heavy imports here: `--help` and config errors stay instant.
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax.models import realm  # pylint: disable=g-import-not-at-top
  from realm_jax.models.config import RealmConfig  # pylint: disable=g-import-not-at-top
  from realm_jax.training import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.training import inputs  # pylint: disable=g-import-not-at-top
  from realm_jax.training import optim  # pylint: disable=g-import-not-at-top
  from realm_jax.training import partitioning  # pylint: disable=g-import-not-at-top
  from realm_jax.training import trainer  # pylint: disable=g-import-not-at-top

  if job not in JOBS:
    raise ConfigError(f"train_main.job={job!r}; expected one of {', '.join(JOBS)} (open-QA "
                      f"fine-tuning is not a job of this entry point yet)")
  if not isinstance(model_config, RealmConfig):
    raise ConfigError(f"train_main.model_config is a {type(model_config).__name__}, not a "
                      f"RealmConfig: include a gin_configs/models/*.gin and bind %MODEL_CONFIG")
  prefix = "ict_" if job == "ict" else "realm_"
  if not str(task).startswith(prefix):
    raise ConfigError(f"train_main.task={task!r} does not fit job {job!r} (expected a "
                      f"{prefix}* task)")
  if init_checkpoint is not None and job != "pretrain":
    raise ConfigError("train_main.init_checkpoint is only for job 'pretrain' (ICT warm start)")
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
  if init_checkpoint is not None:
    _check_init_checkpoint(init_checkpoint, model_config)

  # Inputs (nothing is read until the first batch).
  try:
    if job == "ict":
      model = realm.IctModel(model_config)
      batches = inputs.SeqioBatches(task, batch_size=batch_size, seed=seed,
                                    feature_keys=inputs.ICT_BATCH_KEYS)
    else:
      model = realm.RealmPretrainModel(model_config)
      masked = inputs.SeqioBatches(task, batch_size=batch_size, seed=seed,
                                   feature_keys=inputs.MASKED_QUERY_KEYS)
  except inputs.UnknownTaskError as e:
    raise ConfigError(f"train_main.task: {gin_utils.one_line(e)}") from e
  store = None
  if job == "pretrain":
    from realm_jax.data import corpus as corpus_lib  # pylint: disable=g-import-not-at-top
    if block_store is None:
      if not task.startswith("realm_toy_"):
        raise ConfigError(f"train_main.block_store is required for task {task!r} (the "
                          f"BlockStore its index embeds)")
      import realm_jax_tasks  # pylint: disable=g-import-not-at-top
      block_store = realm_jax_tasks.toy_block_store_dir()
    store = corpus_lib.BlockStore.open(block_store, verify="fast")
    # The retriever is set below (the IndexWatcher) in a real run; none in a dry run.
    batches = inputs.PretrainingBatches(masked, store, retriever=None,
                                        num_candidates=num_candidates)

  schedule = optim.bert_learning_rate_schedule(learning_rate, num_steps, warmup_steps)
  optimizer = optim.bert_optimizer(learning_rate, num_steps, warmup_steps=warmup_steps)
  train_step = trainer.make_train_step(model, optimizer, mesh=mesh, rules=rules,
                                       learning_rate_fn=schedule)
  num_params = sum(int(x.size) for x in jax.tree.leaves(train_step.abstract_state.params))
  mesh_text = " x ".join(f"{name} {size}" for name, size in mesh.shape.items())
  description = (f"job {job}, task {task}, model ({ckpt_lib.describe_size(model_config)}), "
                 f"{num_params:,} params, mesh {mesh_text}, global batch {global_batch}, "
                 f"{num_steps} steps, lr {learning_rate:g}, run_dir {run_dir}")
  if init_checkpoint is not None:
    description += f", retriever from {init_checkpoint}"

  if dry_run:
    block_len = store.max_block_len if store is not None else BLOCK_LEN
    abstract = _abstract_batch(job, global_batch, num_candidates, block_len)
    train_step.lower(train_step.abstract_state, abstract)
    print(f"{PROG}: dry run ok ({description}; step lowered on abstract shapes, not "
          f"compiled)", flush=True)
    return 0

  if init_checkpoint is not None:
    params, _, _ = ckpt_lib.restore_checkpoint_dir(init_checkpoint, expected_config=model_config)
    if "retriever" not in params:
      raise ConfigError(f"init_checkpoint {init_checkpoint}: no retriever params (has "
                        f"{sorted(params)})")
    retriever_sharding = train_step.state_sharding.params["retriever"]
    warm = jax.device_put(params["retriever"], retriever_sharding)
    fresh_init = train_step.init_state

    def warm_init(rng):
      state = fresh_init(rng)
      new_params = dict(state.params)
      new_params["retriever"] = warm
      log.info("retriever warm-started from %s", init_checkpoint)
      return state.replace(params=new_params)

    train_step.init_state = warm_init

  hooks = []
  watcher = None
  if job == "pretrain":
    from realm_jax.index.swap import IndexWatcher  # pylint: disable=g-import-not-at-top
    loader = inputs.make_index_loader(
        run_dir, model_config,
        first_checkpoint_dir=first_index_checkpoint_dir or init_checkpoint)
    watcher = IndexWatcher(run_dir, load_fn=loader, check_every_steps=index_check_every,
                           block_store_id=store.store_id, dim=model_config.proj_size)
    watcher.start()
    batches.set_retriever(watcher)

    def index_hook(step, state):
      del state
      watcher.maybe_swap(step)
      return watcher.metrics(step)

    hooks.append(index_hook)
  log.info("%s: %s", PROG, description)
  try:
    trainer.train(model, optimizer, batches, run_dir=run_dir, num_steps=num_steps, mesh=mesh,
                  config=model_config, rules=rules, checkpoint_every=checkpoint_every,
                  keep=keep, log_every=log_every, hooks=hooks, seed=seed,
                  learning_rate_fn=schedule, best_metric=None, train_step=train_step)
  finally:
    if watcher is not None:
      watcher.close()
  print(f"{PROG}: done ({description})", flush=True)
  return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Entry point; returns the exit status."""
  argv = list(sys.argv if argv is None else argv)
  logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                      format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  logging.getLogger("absl").setLevel(logging.WARNING)
  _CALL_STARTED[0] = False
  try:
    gin_bindings, rest = split_gin_args(argv[1:])
    values = gin_utils.parse_flags(
        [argv[0] if argv else PROG] + rest,
        {"dry_run": "Build the job (model, optimizer, mesh, inputs, lowered step), print one "
                    "line and exit without training."})
    if not values.gin_file:
      raise ConfigError("no --gin_file given (e.g. --gin_file=gin_configs/experiments/"
                        "toy_ict.gin)")
    gin_utils.parse_gin(values.gin_file, list(values.gin_bindings) + gin_bindings)
    overrides = {"dry_run": True} if values.dry_run else {}
    try:
      return train_main(**overrides)
    except ConfigError:
      raise
    except Exception as e:  # noqa: BLE001
      if not _CALL_STARTED[0]:  # gin refused the call, or a bad macro value: a config error
        raise ConfigError(gin_utils.one_line(e)) from e
      raise
  except ConfigError as e:
    # gin appends "In call to configurable ..." to errors raised inside train_main.
    print(f"{PROG}: config error: {gin_utils.one_line(e)}", file=sys.stderr, flush=True)
    return 2
  except KeyboardInterrupt:
    print(f"{PROG}: interrupted; resume by running the same command", file=sys.stderr,
          flush=True)
    return 130
  except Exception as e:  # noqa: BLE001 - NonFiniteLossError, CheckpointError, NoIndexError...
    return gin_utils.report_error(PROG, e, (ValueError, OSError, RuntimeError))


if __name__ == "__main__":
  sys.exit(main())
