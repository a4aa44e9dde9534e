r"""The trainer job: ICT warm start, REALM pretraining and open-QA fine-tuning as gin
configurations of one trainer.

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

Jobs (`train_main.job`):
  mlm       BertMlmModel on an `mlm_<corpus>` task: masked language modelling of the encoder, a
            stand-in for BERT where there is none (the toy world; REALM starts both its encoder
            and its retriever from BERT: at paper scale, convert BERT with
            `python -m realm_jax.convert.hf`); continues from `init_checkpoint`'s encoder (a
            converted BERT or an mlm checkpoint) when one is given (the toy BERT's second
            phase).
  ict       IctModel on an `ict_<corpus>` task (REALM_SPEC 14); the towers' BERT warm-starts from
            `init_checkpoint` (a converted BERT or an mlm checkpoint) when one is given.
  pretrain  RealmPretrainModel on a `realm_<corpus>_<strategy>` task; candidates from the run's
            current index (built by `realm_jax.build_index` alongside); the retriever warm-starts
            from `init_checkpoint` (an ICT checkpoint) and the encoder from
            `encoder_checkpoint` (a converted BERT or an mlm checkpoint); at every checkpoint,
            retrieval utility on
            `eval_batches` batches picks the best checkpoint (REALM_SPEC 15-17, 21).
  finetune  OpenQAModel on a QA task (toy_qa, nq_open, web_questions, curated_trec): batches of
            questions retrieved with the live question tower from the run's index (frozen: built
            once with `build_index --once` from `init_checkpoint`; refreshed by a builder running
            alongside when `train_document_tower=True`); retriever and reader warm-start from
            `init_checkpoint` (a pretraining checkpoint: the reader's BERT is its encoder's); at
            every checkpoint, EM (or CuratedTrec's regex match) on `eval_split` picks the best
            checkpoint (REALM_SPEC 25-29).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Optional, Sequence

import gin

from realm_jax import gin_utils
from realm_jax.gin_utils import ConfigError, split_gin_args

PROG = "train"
JOBS = ("mlm", "ict", "pretrain", "finetune")
# Jobs without an index (no BlockStore, no index watcher).
_INDEX_FREE_JOBS = ("mlm", "ict")
# Feature lengths of the pretraining tasks (realm_jax_tasks.pretraining) for the abstract
# batch of a dry run: ICT queries 64, masked queries 96, 10 mask slots (block lengths come from
# the task or the BlockStore).
ICT_QUERY_LEN = 64
QUERY_LEN = 96
MAX_MASKS = 10

log = logging.getLogger(PROG)

_CALL_STARTED = [False]  # set by train_main: errors before it are gin's (config errors)


def _abstract_batch(job: str, global_batch: int, num_candidates: int, block_len: int,
                    qa: Optional[dict] = None, mlm_masks: int = 0) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  def spec(*shape, dtype=np.int32):
    return jax.ShapeDtypeStruct((global_batch,) + shape, dtype)

  if job == "mlm":
    return {"input_ids": spec(block_len), "type_ids": spec(block_len),
            "input_mask": spec(block_len), "mlm_positions": spec(mlm_masks),
            "mlm_targets": spec(mlm_masks), "mlm_weights": spec(mlm_masks, dtype=np.float32)}
  if job == "ict":
    return {"query_ids": spec(ICT_QUERY_LEN), "query_mask": spec(ICT_QUERY_LEN),
            "block_ids": spec(block_len), "block_type_ids": spec(block_len),
            "block_mask": spec(block_len)}
  if job == "finetune":
    q_len, beam, reader_beam, reader_len = (qa["question_len"], qa["beam"], qa["reader_beam"],
                                            qa["reader_len"])
    batch = {"question_ids": spec(q_len), "question_type_ids": spec(q_len),
             "question_mask": spec(q_len), "retrieved_block_ids": spec(beam),
             "retrieved_block_emb": spec(beam, qa["proj_size"], dtype=np.float32),
             "retriever_correct": spec(beam, dtype=bool),
             "reader_ids": spec(reader_beam, reader_len),
             "reader_type_ids": spec(reader_beam, reader_len),
             "reader_mask": spec(reader_beam, reader_len),
             "reader_block_mask": spec(reader_beam, reader_len, dtype=bool),
             "reader_gold_starts": spec(reader_beam, qa["max_occurrences"]),
             "reader_gold_ends": spec(reader_beam, qa["max_occurrences"]),
             "example_mask": spec(dtype=bool)}
    if qa["document_beam"]:
      for key in ("document_ids", "document_type_ids", "document_mask"):
        batch[key] = spec(qa["document_beam"], block_len)
    return batch
  k, reader_len = num_candidates, QUERY_LEN + block_len
  return {"query_ids": spec(QUERY_LEN), "query_type_ids": spec(QUERY_LEN),
          "query_mask": spec(QUERY_LEN), "candidate_input_ids": spec(k, block_len),
          "candidate_type_ids": spec(k, block_len), "candidate_mask": spec(k, block_len),
          "reader_ids": spec(k, reader_len), "reader_type_ids": spec(k, reader_len),
          "reader_mask": spec(k, reader_len), "mlm_positions": spec(MAX_MASKS),
          "mlm_targets": spec(MAX_MASKS), "mlm_weights": spec(MAX_MASKS, dtype=np.float32),
          "example_mask": spec(dtype=np.float32)}


def _feature_len(task_name: str, feature: str) -> int:
  """The length of a task's feature, from its (lazily built, unread) dataset's spec."""
  from realm_jax.batches import inputs  # pylint: disable=g-import-not-at-top
  dataset = inputs.get_task(task_name).get_dataset(split="train", shuffle=False,
                                                    sequence_length=None)
  return int(dataset.element_spec[feature].shape[0])


def _check_init_checkpoint(step_dir: str, config: Any, knob: str = "init_checkpoint", *,
                           bert_only: bool = False) -> None:
  """One-line ConfigError unless `step_dir` is a finished checkpoint of this model size (of this
  BERT shape with `bert_only`: a BERT warm start, whose heads start fresh)."""
  from realm_jax.models.config import realm_config_from_dict  # pylint: disable=g-import-not-at-top
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
  try:
    metadata = ckpt_lib.read_metadata(step_dir)
    try:
      their_config = realm_config_from_dict(metadata["config"])
    except (KeyError, TypeError, ValueError) as e:
      raise ckpt_lib.CheckpointError(f"{step_dir}: the metadata's model config is unreadable "
                                     f"({e})") from e
    ckpt_lib.check_model_size(their_config, config, step_dir, bert_only=bert_only)
  except ckpt_lib.CheckpointError as e:
    raise ConfigError(f"{knob}: {gin_utils.one_line(e)}") from e


def _bert_from_encoder(tower: dict, encoder: dict) -> dict:
  """A retriever tower (RealmEmbedder params) whose BERT is `encoder`'s; the pooler, which the
  MLM encoder has none of, and the projection stay as they are (fresh)."""
  return {**tower, "bert": {**tower["bert"], **encoder["bert"]}}


def _warm_start(job: str, checkpoint: dict, fresh: dict, source: str) -> tuple[dict, str]:
  """The parameters a run starts from: `fresh` with the subtrees `checkpoint` provides.

  mlm: the encoder (continued masked language modelling). ict: every retriever tower's BERT
  from the checkpoint's encoder (a converted BERT or an `mlm`
  checkpoint: REALM warm-starts ICT from BERT). pretrain: the retriever (an ICT checkpoint, or any
  checkpoint with one), and the encoder when the checkpoint has one. finetune: the retriever, and
  the reader (a fine-tuning checkpoint's reader, or a pretraining checkpoint's encoder BERT under a
  fresh span head: REALM initialises the reader from the knowledge-augmented encoder). Returns
  (params, what was warm-started, for the log).
  """
  params = dict(fresh)
  if job == "mlm":
    if "encoder" not in checkpoint:
      raise ConfigError(f"init_checkpoint {source}: no encoder params to continue from (has "
                        f"{sorted(checkpoint)})")
    params["encoder"] = checkpoint["encoder"]
    return params, "encoder (BERT and MLM head)"
  if job == "ict":
    if "encoder" not in checkpoint:
      raise ConfigError(f"init_checkpoint {source}: no encoder params to start the towers' BERT "
                        f"from (has {sorted(checkpoint)}; ICT starts from a BERT: python -m "
                        f"realm_jax.convert.hf, or an 'mlm' run)")
    params["retriever"] = {name: _bert_from_encoder(tower, checkpoint["encoder"])
                           for name, tower in fresh["retriever"].items()}
    return params, "retriever towers' BERT (from the encoder)"
  if "retriever" not in checkpoint:
    raise ConfigError(f"init_checkpoint {source}: no retriever params (has {sorted(checkpoint)})")
  params["retriever"] = checkpoint["retriever"]
  taken = ["retriever"]
  if job == "pretrain" and "encoder" in checkpoint:
    params["encoder"] = checkpoint["encoder"]
    taken.append("encoder")
  if job == "finetune":
    if "reader" in checkpoint:
      params["reader"] = checkpoint["reader"]
      taken.append("reader")
    elif "encoder" in checkpoint:
      params["reader"] = {**fresh["reader"], "bert": checkpoint["encoder"]["bert"]}
      taken.append("reader BERT (from the encoder)")
  return params, ", ".join(taken)


def _warm_start_encoder(job: str, checkpoint: dict, params: dict, source: str) -> dict:
  """`encoder_checkpoint` (a converted BERT or an `mlm` checkpoint): pretrain's
  knowledge-augmented encoder (REALM starts it from BERT), or finetune's reader BERT under a
  fresh span head (ORQA's reader starts from BERT: fine-tuning without REALM pretraining)."""
  if "encoder" not in checkpoint:
    raise ConfigError(f"encoder_checkpoint {source}: no encoder params (has {sorted(checkpoint)})")
  if job == "finetune":
    return {**params, "reader": {**params["reader"], "bert": checkpoint["encoder"]["bert"]}}
  return {**params, "encoder": checkpoint["encoder"]}


def _register_corpus_tasks(job: str, task_name: str, block_store: Optional[str],
                           pretrain_records: Optional[str],
                           ict_remove_probability: Optional[float]) -> None:
  """For a job that reads a corpus, registers the corpus its task names over `block_store`
  (`realm_jax_tasks.register_corpus_for_task`), ICT's removal probability as asked."""
  if ict_remove_probability is not None:
    if job != "ict":
      raise ConfigError("train_main.ict_remove_probability is an 'ict' option")
    if isinstance(ict_remove_probability, bool) or not isinstance(
        ict_remove_probability, (int, float)) or not 0 <= ict_remove_probability <= 1:
      raise ConfigError(f"train_main.ict_remove_probability={ict_remove_probability!r}: "
                        f"expected a probability in [0, 1]")
  if job == "finetune" or block_store is None:
    corpus = None
  else:
    import realm_jax_tasks  # pylint: disable=g-import-not-at-top
    from realm_jax.data import corpus as corpus_lib  # pylint: disable=g-import-not-at-top
    removal = {} if ict_remove_probability is None else {
        "ict_remove_probability": float(ict_remove_probability)}
    try:
      corpus_lib.BlockStore.open(block_store, verify="fast").close()  # also for a known task
      corpus = realm_jax_tasks.register_corpus_for_task(task_name, block_store, pretrain_records,
                                                        **removal)
    except corpus_lib.BlockStoreError as e:
      raise ConfigError(f"train_main.block_store: {e}") from e
  if ict_remove_probability is not None and corpus is None:
    # The probability is fixed when a task is registered; this one was registered before.
    raise ConfigError(f"train_main.ict_remove_probability applies to a corpus that train "
                      f"registers over train_main.block_store; task {task_name!r} is "
                      f"registered already with its own (set it where that task is registered: "
                      f"realm_jax_tasks.register_pretraining_tasks)")


def _qa_files_task(task: str) -> str:
  """A QA task that is your own files (a path, or `regex:<path>`): registered, and its seqio
  name returned (`realm_jax_tasks.register_qa_files`); any other name as it is."""
  import realm_jax_tasks  # pylint: disable=g-import-not-at-top
  if not realm_jax_tasks.is_qa_path(task):
    return task
  try:
    return realm_jax_tasks.register_qa_files(task)
  except ValueError as e:
    raise ConfigError(f"TASK={task!r}: {e}") from e


def _check_task(job: str, task_name: str) -> None:
  """ConfigError unless `task_name` is registered and fits `job` (read nothing)."""
  from realm_jax.batches import inputs  # pylint: disable=g-import-not-at-top
  try:
    task = inputs.get_task(task_name)
  except inputs.UnknownTaskError as e:
    raise ConfigError(f"train_main.task: {gin_utils.one_line(e)}") from e
  if job == "finetune":
    if "question_ids" not in task.output_features:
      raise ConfigError(f"train_main.task={task_name!r} is not a QA task (job 'finetune' needs "
                        f"one of toy_qa, nq_open, web_questions, curated_trec)")
    return
  prefix = f"{job}_" if job in _INDEX_FREE_JOBS else "realm_"
  if not task_name.startswith(prefix):
    raise ConfigError(f"train_main.task={task_name!r} does not fit job {job!r} (expected a "
                      f"{prefix}* task)")


@gin.configurable
def train_main(run_dir: str = gin.REQUIRED, model_config: Any = gin.REQUIRED,
               job: str = gin.REQUIRED, task: str = gin.REQUIRED, batch_size: int = gin.REQUIRED,
               num_steps: int = gin.REQUIRED, learning_rate: float = gin.REQUIRED,
               warmup_steps: Optional[int] = None, checkpoint_every: int = 1000,
               mesh_shape: Sequence[int] = (-1, 1), rules: Optional[Sequence] = None,
               seed: int = 0, init_checkpoint: Optional[str] = None,
               encoder_checkpoint: Optional[str] = None,
               retriever_lr_scale: float = 1.0, freeze_retriever_steps: int = 0,
               index_check_every: int = 100, first_index_checkpoint_dir: Optional[str] = None,
               block_store: Optional[str] = None, pretrain_records: Optional[str] = None,
               ict_remove_probability: Optional[float] = None,
               num_candidates: int = 8, null_document: bool = True,
               eval_batches: int = 4, retriever_beam: int = 5000, reader_beam: int = 5,
               reader_len: int = 320, question_len: int = 64, max_occurrences: int = 32,
               train_document_tower: bool = False, document_beam: Optional[int] = None,
               eval_split: str = "dev", eval_examples: Optional[int] = None,
               log_every: int = 100, keep: int = 3, dry_run: bool = False) -> int:
  """Runs (or, with `dry_run`, only builds) an ICT, REALM pretraining or fine-tuning job.

  Args:
    run_dir: the run directory (checkpoints/, tensorboard/, best.json, TRAINING_DONE; for
      pretraining and fine-tuning also index/, written by `realm_jax.build_index`).
    model_config: a RealmConfig (%MODEL_CONFIG of gin_configs/models/*.gin).
    job: "mlm", "ict", "pretrain" or "finetune" (see the module docstring).
    task: the seqio task name; finetune: or your own QA files, a path (`regex:<path>` for
      regex answers; `realm_jax_tasks.register_qa_files`).
    batch_size: examples (questions) per step on this host (global batch = hosts x this; a
      multiple of the mesh's data axis).
    num_steps: total updates of the run (a resumed run continues to it).
    learning_rate: peak learning rate of `optim.bert_optimizer`.
    warmup_steps: linear warmup steps (None: the optimizer's default).
    checkpoint_every: checkpoint (and evaluate) every this many steps, and at the end.
    mesh_shape: (data, model) sizes of the device mesh; -1 takes the rest.
    rules: logical axis rules (None: partitioning.DEFAULT_RULES).
    seed: parameter init, dropout and data seed.
    init_checkpoint: a checkpoint step directory to warm-start from (mlm: its encoder)
      (model size checked; ignored when resuming); see `_warm_start`.
    encoder_checkpoint: pretrain: a checkpoint step directory (a converted BERT's or an mlm run's)
      whose encoder the knowledge-augmented encoder starts from (None: random, or
      `init_checkpoint`'s encoder when it has one). finetune: the reader's BERT starts from its
      encoder's BERT (ORQA: an ICT `init_checkpoint` and a BERT reader), overriding
      `init_checkpoint`'s reader.
    retriever_lr_scale: pretrain/finetune: the retriever's (question tower's) updates are
      multiplied by this (its lr relative to the encoder's or reader's; same schedule), as
      Atlas's `--lr_retriever`. 1.0 (off): REALM uses one optimizer for both towers
      (REALM_SPEC 18); a toy-world deviation where set. See `optim.bert_optimizer`.
    freeze_retriever_steps: pretrain/finetune: the retriever's parameters stay exactly as they
      are for this many first updates (Atlas's `--freeze_retriever_steps`: its gradient is noise
      while the encoder cannot read yet); its Adam moments still accumulate. 0: off (REALM_SPEC
      18). Either option on changes the optimizer state's structure: a run resumes only with
      the options on or off as they were.
    index_check_every: pretrain/finetune: look for a newer published index every this many
      steps.
    first_index_checkpoint_dir: the checkpoint the step-0 index was built from (default:
      `init_checkpoint`), for its query tower.
    block_store: the BlockStore the index embeds (None: the toy store for the toy tasks). For
      ict/pretrain, `ict_<corpus>` / `realm_<corpus>_<strategy>` tasks that are not registered
      yet are registered over it.
    pretrain_records: pretrain: the pretraining text X in the REALM release schema (e.g.
      CC-News with precomputed salient spans); None: X is the corpus itself.
    ict_remove_probability: ict on a corpus registered over `block_store`: the probability
      that ICT removes the query sentence from its block (None: ORQA's 0.9). Short documents
      (one-sentence blocks are skipped when their sentence is removed) want it lower.
    num_candidates: pretrain: candidates per query including the null document.
    null_document: pretrain: False for the ablation without the null document (K retrieved
      blocks; retrieval utility is then undefined and the best checkpoint is picked by
      eval/mlm/accuracy).
    eval_batches: pretrain: batches (drawn with the current index) whose retrieval utility is
      computed at every checkpoint to pick the best one; 0 disables.
    retriever_beam: finetune: blocks per question for the retriever loss (5000).
    reader_beam: finetune: blocks the reader reads (5).
    reader_len: finetune: reader row length (320).
    question_len: finetune: fixed question length (longer questions are left out, counted).
    max_occurrences: finetune: gold-span slots per (question, block).
    train_document_tower: finetune: also train the document tower (run the index builder
      alongside so the index follows it).
    document_beam: finetune with the document tower: blocks re-embedded per question (None:
      the reader beam).
    eval_split: finetune: the split evaluated at every checkpoint ("" disables).
    eval_examples: finetune: evaluate only the first this many questions of it (None: all).
    log_every: write metrics every this many steps.
    keep: newest checkpoints to keep (the best one is kept too).
    dry_run: build everything and lower the step on abstract shapes, print one line, no
      training.

  Returns:
    The exit status (0).
  """
  _CALL_STARTED[0] = True
  # Heavy imports here: `--help` and config errors stay instant.
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax.models import open_qa  # pylint: disable=g-import-not-at-top
  from realm_jax.models import realm  # pylint: disable=g-import-not-at-top
  from realm_jax.models.config import RealmConfig  # pylint: disable=g-import-not-at-top
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.batches import inputs  # pylint: disable=g-import-not-at-top
  from realm_jax.training import optim  # pylint: disable=g-import-not-at-top
  from realm_jax.training import partitioning  # pylint: disable=g-import-not-at-top
  from realm_jax.batches import qa_inputs  # pylint: disable=g-import-not-at-top
  from realm_jax.training import trainer  # pylint: disable=g-import-not-at-top

  if job not in JOBS:
    raise ConfigError(f"train_main.job={job!r}; expected one of {', '.join(JOBS)}")
  if not isinstance(model_config, RealmConfig):
    raise ConfigError(f"train_main.model_config is a {type(model_config).__name__}, not a "
                      f"RealmConfig: include a gin_configs/models/*.gin and bind %MODEL_CONFIG")
  if job == "finetune":
    task = _qa_files_task(str(task))
  _register_corpus_tasks(job, str(task), block_store, pretrain_records, ict_remove_probability)
  _check_task(job, str(task))
  if job == "finetune":
    splits = tuple(inputs.get_task(str(task)).splits)
    for what, split in (("the training split", "train"), ("train_main.eval_split", eval_split)):
      if split and split not in splits:
        raise ConfigError(f"{what} {split!r}: task {task!r} has splits {', '.join(splits)}"
                          + (" (eval_split='' evaluates nothing)" if split == eval_split
                             else ""))
  if encoder_checkpoint is not None and job not in ("pretrain", "finetune"):
    raise ConfigError("train_main.encoder_checkpoint is a 'pretrain' and 'finetune' option")
  if train_document_tower and job != "finetune":
    raise ConfigError("train_main.train_document_tower is a 'finetune' option")
  if retriever_lr_scale != 1.0 and job not in ("pretrain", "finetune"):
    raise ConfigError("train_main.retriever_lr_scale is a 'pretrain' and 'finetune' option")
  if freeze_retriever_steps != 0 and job not in ("pretrain", "finetune"):
    raise ConfigError("train_main.freeze_retriever_steps is a 'pretrain' and 'finetune' option")
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
    # ICT starts its towers from a BERT: only BERT's shape must match.
    _check_init_checkpoint(init_checkpoint, model_config, bert_only=job in ("mlm", "ict"))
  if encoder_checkpoint is not None:
    _check_init_checkpoint(encoder_checkpoint, model_config, "encoder_checkpoint",
                           bert_only=True)

  store = None
  if job not in _INDEX_FREE_JOBS:
    from realm_jax.data import corpus as corpus_lib  # pylint: disable=g-import-not-at-top
    if block_store is None:
      if not (task.startswith("realm_toy_") or task == "toy_qa"):
        raise ConfigError(f"train_main.block_store is required for task {task!r} (the "
                          f"BlockStore its index embeds)")
      import realm_jax_tasks  # pylint: disable=g-import-not-at-top
      block_store = realm_jax_tasks.toy_block_store_dir()
    store = corpus_lib.BlockStore.open(block_store, verify="fast")

  # Model and inputs (nothing is read until the first batch; fine-tuning reads the questions).
  qa_shapes = None
  if job == "mlm":
    model = realm.BertMlmModel(model_config)
    batches = inputs.SeqioBatches(task, batch_size=batch_size, seed=seed,
                                  feature_keys=inputs.BLOCK_MLM_KEYS)
  elif job == "ict":
    model = realm.IctModel(model_config)
    batches = inputs.SeqioBatches(task, batch_size=batch_size, seed=seed,
                                  feature_keys=inputs.ICT_BATCH_KEYS)
  elif job == "pretrain":
    model = realm.RealmPretrainModel(model_config, null_index=0 if null_document else None)
    masked = inputs.SeqioBatches(task, batch_size=batch_size, seed=seed,
                                 feature_keys=inputs.MASKED_QUERY_KEYS)
    # The retriever is set below (the IndexWatcher) in a real run; none in a dry run.
    batches = inputs.PretrainingBatches(masked, store, retriever=None,
                                        num_candidates=num_candidates,
                                        null_document=null_document)
  else:
    try:
      model = open_qa.OpenQAModel(model_config, reader_beam=reader_beam,
                                  train_document_tower=train_document_tower,
                                  document_beam=document_beam)
    except ValueError as e:
      raise ConfigError(f"train_main: {e}") from e
    qa_shapes = {"question_len": question_len, "beam": min(retriever_beam, store.num_blocks),
                 "reader_beam": reader_beam, "reader_len": reader_len,
                 "proj_size": model_config.proj_size, "max_occurrences": max_occurrences,
                 "document_beam": model.num_reembedded}
    batches = None  # reads the split: built after the dry-run exit

  schedule = optim.bert_learning_rate_schedule(learning_rate, num_steps, warmup_steps)
  try:
    # Both jobs' parameter trees keep the retriever (finetune: the question tower) under
    # "retriever"; with the options off this is the plain optimizer.
    optimizer = optim.bert_optimizer(learning_rate, num_steps, warmup_steps=warmup_steps,
                                     retriever_lr_scale=retriever_lr_scale,
                                     freeze_retriever_steps=freeze_retriever_steps,
                                     retriever_keys=("retriever",))
  except ValueError as e:
    raise ConfigError(f"train_main: {e}") from e
  train_step = trainer.make_train_step(model, optimizer, mesh=mesh, rules=rules,
                                       learning_rate_fn=schedule)
  num_params = sum(int(x.size) for x in jax.tree.leaves(train_step.abstract_state.params))
  mesh_text = " x ".join(f"{name} {size}" for name, size in mesh.shape.items())
  description = (f"job {job}, task {task}, model ({ckpt_lib.describe_size(model_config)}), "
                 f"{num_params:,} params, mesh {mesh_text}, global batch {global_batch}, "
                 f"{num_steps} steps, lr {learning_rate:g}, run_dir {run_dir}")
  if init_checkpoint is not None:
    description += f", warm start from {init_checkpoint}"
  if encoder_checkpoint is not None:
    description += f", encoder from {encoder_checkpoint}"
  if retriever_lr_scale != 1.0:
    description += f", retriever lr x{retriever_lr_scale:g}"
  if freeze_retriever_steps:
    description += f", retriever frozen for {freeze_retriever_steps} steps"

  if dry_run:
    if store is not None:
      block_len = store.max_block_len
    else:
      block_len = _feature_len(task, "input_ids" if job == "mlm" else "block_ids")
    mlm_masks = _feature_len(task, "mlm_positions") if job == "mlm" else 0
    abstract = _abstract_batch(job, global_batch, num_candidates, block_len, qa_shapes,
                               mlm_masks)
    train_step.lower(train_step.abstract_state, abstract)
    print(f"{PROG}: dry run ok ({description}; step lowered on abstract shapes, not "
          f"compiled)", flush=True)
    return 0

  if job == "finetune":
    try:
      batches = qa_inputs.OpenQABatches(
          task, batch_size=batch_size, store=store, model=model, seed=seed,
          retriever_beam=retriever_beam, reader_len=reader_len, question_len=question_len,
          max_occurrences=max_occurrences)
    except inputs.UnknownTaskError as e:
      raise ConfigError(f"train_main.task: {gin_utils.one_line(e)}") from e

  if init_checkpoint is not None or encoder_checkpoint is not None:
    checkpoint = encoder = None
    # Sizes were checked above (_check_init_checkpoint): a BERT warm start's heads may differ.
    if init_checkpoint is not None:
      checkpoint, _, _ = ckpt_lib.restore_checkpoint_dir(
          init_checkpoint, expected_config=None if job in ("mlm", "ict") else model_config)
    if encoder_checkpoint is not None:
      encoder, _, _ = ckpt_lib.restore_checkpoint_dir(encoder_checkpoint)
    fresh_init = train_step.init_state

    def warm_init(rng):
      state = fresh_init(rng)
      params = jax.device_get(state.params)
      if checkpoint is not None:
        params, taken = _warm_start(job, checkpoint, params, init_checkpoint)
        log.info("warm start from %s: %s", init_checkpoint, taken)
      if encoder is not None:
        params = _warm_start_encoder(job, encoder, params, encoder_checkpoint)
        log.info("encoder from %s", encoder_checkpoint)
      return state.replace(params=jax.device_put(params, train_step.state_sharding.params))

    train_step.init_state = warm_init

  hooks = []
  watcher = None
  eval_fn = None
  best_metric = None
  if job not in _INDEX_FREE_JOBS:
    from realm_jax.index.swap import IndexWatcher  # pylint: disable=g-import-not-at-top
    loader = inputs.make_index_loader(
        run_dir, model_config,
        first_checkpoint_dir=first_index_checkpoint_dir or init_checkpoint)
    watcher = IndexWatcher(run_dir, load_fn=loader, check_every_steps=index_check_every,
                           block_store_id=store.store_id, dim=model_config.proj_size)
    watcher.start()
    batches.set_retriever(watcher)

    def index_hook(step, state):
      watcher.maybe_swap(step)
      if job == "finetune":  # retrieve the next questions with the live question tower
        batches.set_query_params(state.params["retriever"])
      return watcher.metrics(step)

    hooks.append(index_hook)
  if job == "pretrain" and eval_batches:
    eval_fn = _pretrain_eval_fn(model, task, store, watcher, mesh, rules, seed=seed,
                                batch_size=batch_size, num_batches=eval_batches,
                                num_candidates=num_candidates, null_document=null_document)
    best_metric = "eval/retrieval/utility" if null_document else "eval/mlm/accuracy"
  elif job == "finetune" and eval_split:
    eval_fn, best_metric = _finetune_eval_fn(model, task, eval_split, eval_examples, store,
                                             watcher, batch_size=batch_size,
                                             reader_len=reader_len)
  log.info("%s: %s", PROG, description)
  try:
    trainer.train(model, optimizer, batches, run_dir=run_dir, num_steps=num_steps, mesh=mesh,
                  config=model_config, rules=rules, checkpoint_every=checkpoint_every,
                  keep=keep, log_every=log_every, hooks=hooks, seed=seed,
                  learning_rate_fn=schedule, eval_fn=eval_fn, best_metric=best_metric,
                  train_step=train_step)
  finally:
    if watcher is not None:
      watcher.close()
  print(f"{PROG}: done ({description})", flush=True)
  return 0


def _pretrain_eval_fn(model, task, store, watcher, mesh, rules, *, seed, batch_size,
                      num_batches, num_candidates, null_document):
  """Retrieval utility (and the loss) on the task's first `num_batches` batches in order,
  candidates retrieved from the index in use at each evaluation (REALM_SPEC 17: the authors
  pick their best checkpoint on it). The queries are training queries: the pretraining tasks
  have one split."""
  from realm_jax.batches import inputs  # pylint: disable=g-import-not-at-top
  from realm_jax.training import trainer  # pylint: disable=g-import-not-at-top

  def draw():
    masked = inputs.SeqioBatches(task, batch_size=batch_size, seed=seed, shuffle=False,
                                 num_epochs=1, feature_keys=inputs.MASKED_QUERY_KEYS)
    batches = inputs.PretrainingBatches(masked, store, retriever=watcher,
                                        num_candidates=num_candidates,
                                        null_document=null_document)
    return [next(batches) for _ in range(num_batches)]

  return trainer.make_eval_fn(model, draw, mesh=mesh, rules=rules)


def _finetune_eval_fn(model, task, split, max_examples, store, watcher, *, batch_size,
                      reader_len):
  """EM (regex match for CuratedTrec) and recall@k on `split` with the live parameters and the
  index in use, through `evaluation.evaluate` (what `python -m realm_jax.evaluate` reports)."""
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax.evaluation import evaluate as evaluate_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.batches import qa_inputs  # pylint: disable=g-import-not-at-top
  examples = qa_inputs.qa_task_examples(task, split, max_examples=max_examples)
  answer_metric = "regex_match" if examples and examples[0].answers_are_regex else "exact_match"

  def eval_fn(step, state):
    del step
    params = jax.device_get(qa_inputs.host_local_params(state.params))
    retriever = watcher.current
    results, _ = evaluate_lib.evaluate(
        model, params, examples, searcher=retriever.searcher, store=store,
        block_emb=retriever.block_emb, batch_size=batch_size, reader_len=reader_len)
    return {f"eval/{name}": float(value) for name, value in results.items()}

  return eval_fn, f"eval/{answer_metric}"


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Entry point; returns the exit status."""
  argv = list(sys.argv if argv is None else argv)
  gin_utils.setup_logging()
  _CALL_STARTED[0] = False

  def job() -> int:
    gin_bindings, rest = split_gin_args(argv[1:])
    values = gin_utils.parse_flags(
        [argv[0] if argv else PROG] + rest,
        {"dry_run": "Build the job (model, optimizer, mesh, inputs, lowered step), print one "
                    "line and exit without training."})
    if not values.gin_file:
      raise ConfigError("no --gin_file given (e.g. --gin_file=gin_configs/experiments/"
                        "toy_ict.gin)")
    gin_utils.parse_gin(values.gin_file, list(values.gin_bindings) + gin_bindings)
    return train_main(**({"dry_run": True} if values.dry_run else {}))

  # Runtime errors that explain themselves: NonFiniteLossError, CheckpointError, NoIndexError...
  return gin_utils.run_job(PROG, job, started=lambda: _CALL_STARTED[0],
                           interrupted="resume by running the same command",
                           doc=__doc__, configurables=(train_main,))


if __name__ == "__main__":
  sys.exit(main())
