r"""The evaluation job: open-QA exact match, free-text answers, and retrieval recall of a run, or
of a BM25 baseline.

  python -m realm_jax.evaluate --gin_file=gin_configs/experiments/toy_eval.gin \
      --gin.RUN_DIR="'/tmp/realm_toy/finetune'" [--dry_run] [--question="Who ...?" ...]
  python -m realm_jax.evaluate --released DIR --task nq_open [--split test] [--output PATH]

Modes (`evaluate_main.mode`): "qa" (a fine-tuned checkpoint answers a QA task split: predictions
JSONL, metrics JSON, one summary line), "retrieval" (recall@k of the index's own query tower) and
"bm25" (the same recall of Okapi BM25; no run needed). `--question` answers free-text questions
with their evidence; `--released DIR` evaluates transformers' released REALM open-QA models (its
own flags: `--released DIR --help`). `--dry_run` checks the configuration, reads no data and
prints one line. Exit status: 0 done, 1 a runtime error, 2 a configuration error, 130
interrupted (nothing partial is written). Design notes: docs/design/training_and_commands.md.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import time
from typing import Any, Optional, Sequence

import gin

from realm_jax import gin_utils
from realm_jax import progress as progress_lib
from realm_jax.evaluation import bm25 as bm25_lib
from realm_jax.evaluation import results
from realm_jax.gin_utils import ConfigError
from realm_jax.index import store as index_lib
from realm_jax.models.config import RealmConfig

# Orbax configures the root logger on import and TensorFlow takes seconds to import: both are
# imported inside the functions that use them, once `main` has set up logging.

PROG = results.PROG
MODES = ("qa", "retrieval", "bm25")
BACKENDS = ("exact", "scann")

log = logging.getLogger(PROG)


# ------------------------------------------------------------------------------ settings


def _default(name: str) -> Any:
  """evaluate_main's default of one setting."""
  return inspect.signature(evaluate_main).parameters[name].default


def _check_positive(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ConfigError(f"evaluate_main.{name}={value!r}: expected a positive integer")


def _check_k_values(k_values: Any) -> tuple[int, ...]:
  if isinstance(k_values, int) or not k_values:
    raise ConfigError(f"evaluate_main.k_values={k_values!r}: expected a non-empty sequence of "
                      f"positive integers, e.g. (1, 5, 20, 100)")
  bad = [k for k in k_values if isinstance(k, bool) or not isinstance(k, int) or k < 1]
  if bad:
    raise ConfigError(f"evaluate_main.k_values={tuple(k_values)!r}: {bad[0]!r} is not a positive "
                      f"integer")
  return tuple(int(k) for k in k_values)


def _refuse_unused(settings: dict, what: str) -> None:
  """ConfigError for a setting ({name: value}) that is not at evaluate_main's default, where
  `what` has no use for it."""
  changed = [name for name, value in settings.items() if value != _default(name)]
  if changed:
    name = changed[0]
    raise ConfigError(f"evaluate_main.{name}={settings[name]!r} does not apply to {what}: leave "
                      f"it at its default {_default(name)!r}")


def _check_mode(mode: str, questions: Sequence[str], model_config: Any, run_dir: Any) -> None:
  if mode not in MODES:
    raise ConfigError(f"evaluate_main.mode={mode!r}; expected one of {', '.join(MODES)}")
  if questions and mode != "qa":
    raise ConfigError("--question answers with the reader: it needs mode 'qa'")
  if mode != "bm25" and not isinstance(model_config, RealmConfig):  # BM25 has no model
    raise ConfigError(f"evaluate_main.model_config is a {type(model_config).__name__}, not a "
                      f"RealmConfig: include a gin_configs/models/*.gin and bind %MODEL_CONFIG")
  if not (mode == "bm25" and run_dir is None) and (not isinstance(run_dir, str) or not run_dir):
    raise ConfigError(f"evaluate_main.run_dir={run_dir!r}: expected a directory path "
                      f"(--gin.RUN_DIR=\"'/runs/x'\"; mode 'bm25' also takes --gin.RUN_DIR=None)")


def _check_sizes(backend: str, k_values: Any, batch_size: Any, reader_beam: Any,
                 reader_len: Any, max_examples: Any) -> tuple[int, ...]:
  """The k values, after the backend, the sizes and the example limit are checked."""
  if backend not in BACKENDS:
    raise ConfigError(f"evaluate_main.backend={backend!r}; expected one of {', '.join(BACKENDS)}")
  k_values = _check_k_values(k_values)
  _check_positive("batch_size", batch_size)
  _check_positive("reader_beam", reader_beam)
  _check_positive("reader_len", reader_len)
  if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
    raise ConfigError(f"evaluate_main.max_examples={max_examples!r}: expected None or a "
                      f"positive integer")
  return k_values


def _check_candidates(mode: str, candidates: str, reader_beam: int, index_settings: dict) -> int:
  """The reader beam after `candidates` is checked against the mode and the index settings
  ({name: value}; the closed book reads one row: its beam is 1)."""
  if candidates not in bm25_lib.READER_CANDIDATES:
    raise ConfigError(f"evaluate_main.candidates={candidates!r}; expected one of "
                      f"{', '.join(bm25_lib.READER_CANDIDATES)}")
  if candidates != "index":
    if mode != "qa":
      raise ConfigError(f"evaluate_main.candidates={candidates!r} is what the reader reads "
                        f"(mode 'qa' or --question); mode {mode!r} does not read"
                        + (": BM25's own recall is mode 'bm25'" if candidates == "bm25" else ""))
    _refuse_unused(index_settings, f"candidates={candidates!r}, which reads no index")
  if candidates != "none":
    return reader_beam
  if reader_beam not in (1, _default("reader_beam")):
    raise ConfigError(f"evaluate_main.reader_beam={reader_beam} does not apply to "
                      f"candidates='none' (the closed book reads one row per question, the "
                      f"question alone): leave it unset")
  return 1


def _refuse_unused_for_bm25(settings: dict) -> None:
  """ConfigError for a setting of a checkpoint, an index or the reader ({name: value}) that is
  not at evaluate_main's default: mode "bm25" has none of them."""
  _refuse_unused(settings, "mode 'bm25', which ranks the BlockStore's own text (no checkpoint, "
                           "index or reader)")


# ------------------------------------------------------------------------------ the task


def _resolve_task(task: str, mode: str, split: str) -> str:
  """The task's kind ("qa" or "ict") after checking it is registered, fits the mode and has the
  split."""
  from realm_jax.batches import seqio_batches  # pylint: disable=g-import-not-at-top  (Orbax)
  from realm_jax.evaluation import tasks as tasks_lib  # pylint: disable=g-import-not-at-top  (TF)
  try:
    seqio_task = seqio_batches.get_task(task)
  except seqio_batches.UnknownTaskError as e:
    raise ConfigError(f"evaluate_main.task: unknown task {task!r}; registered QA tasks: "
                      f"{', '.join(tasks_lib.registered_tasks('qa'))} (modes 'retrieval' and "
                      f"'bm25' also take ICT tasks: "
                      f"{', '.join(tasks_lib.registered_tasks('ict'))})") from e
  kind = tasks_lib.task_kind(seqio_task)
  allowed = ("qa",) if mode == "qa" else ("qa", "ict")
  if kind not in allowed:
    raise ConfigError(f"evaluate_main.task={task!r} is not a "
                      f"{'QA' if mode == 'qa' else 'QA or ICT'} task, which mode {mode!r} needs "
                      f"(QA tasks: {', '.join(tasks_lib.registered_tasks('qa'))}"
                      + ("" if mode == "qa" else
                         f"; ICT tasks: {', '.join(tasks_lib.registered_tasks('ict'))}") + ")")
  splits = tuple(seqio_task.splits)
  if split not in splits:
    raise ConfigError(f"evaluate_main.split={split!r}: task {task!r} has splits "
                      f"{', '.join(splits)} (e.g. --gin.evaluate_main.split=\"'{splits[-1]}'\")")
  return kind


def _check_task(task: Any, mode: str, split: str, block_store: Optional[str],
                questions: Sequence[str]) -> tuple[Any, Optional[str], bool]:
  """(task, its kind, whether the toy store is read): your own question files and an ICT task
  over `block_store` registered first (as train does); no task for `questions`."""
  import realm_jax_tasks  # pylint: disable=g-import-not-at-top  (TensorFlow)
  kind = None
  if not questions:
    if not isinstance(task, str) or not task:
      raise ConfigError(f"evaluate_main.task={task!r}: name a seqio task "
                        f"(--gin.TASK=\"'toy_qa'\"), or pass --question")
    if realm_jax_tasks.is_qa_path(task):  # your own question files
      try:
        task = realm_jax_tasks.register_qa_files(task)
      except ValueError as e:
        raise ConfigError(f"evaluate_main.task={task!r}: {e}") from e
    elif block_store is not None and mode in ("retrieval", "bm25"):
      realm_jax_tasks.register_corpus_for_task(task, block_store)  # as train does
    kind = _resolve_task(task, mode, split)
  if block_store is not None:
    return task, kind, False
  if questions or task in realm_jax_tasks.TOY_TASKS:
    return task, kind, True
  raise ConfigError(f"evaluate_main.block_store is required for task {task!r} (the "
                    + ("BlockStore whose blocks BM25 ranks)" if mode == "bm25" else
                       "BlockStore the run's index embeds)"))


# ------------------------------------------------------------------------------ the checkpoint


def _require_reader(metadata: dict, step_dir: str) -> None:
  items = list(metadata.get("param_items", []))
  if "reader" not in items and "fid" not in items:  # a span reader, or FiD's (generative)
    raise ConfigError(f"{step_dir} holds params {items}, no fine-tuned reader (an ICT or "
                      f"pretraining run?): mode 'qa' needs an open-QA checkpoint; measure its "
                      f"retrieval with --gin.evaluate_main.mode=\"'retrieval'\"")


def _check_closed_book(metadata: dict, step_dir: str, candidates: str) -> None:
  """ConfigError unless `candidates='none'` goes with a FiD checkpoint and a closed-book one
  (a FiD reader without a retriever, `FinetuneJob.candidates='none'`) with it."""
  items = list(metadata.get("param_items", []))
  if candidates == "none" and "fid" not in items:
    raise ConfigError(f"evaluate_main.candidates='none' (closed book) reads no block: it needs "
                      f"a generative FiD reader, and {step_dir} holds params {items} (a span "
                      f"reader answers with spans of the blocks it reads)")
  if candidates != "none" and "fid" in items and "retriever" not in items:
    raise ConfigError(f"{step_dir} is a closed-book reader (FinetuneJob.candidates='none': "
                      f"params {items}, no retriever): evaluate it with "
                      f"--gin.evaluate_main.candidates=\"'none'\"")


def _checkpoint(run_dir: str, config: Any, checkpoint_step: Optional[int], mode: str,
                candidates: str, dry_run: bool) -> tuple[Optional[int], str, str, str]:
  """(the checkpoint step mode "qa" reads, why it was chosen, the model's size, "" or what says
  the run has no checkpoints yet). Only what is already on disk is checked, so a dry run works
  before the run exists: the checkpoint's model size, and for mode "qa" its reader."""
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top  (Orbax)
  from realm_jax.evaluation import runs  # pylint: disable=g-import-not-at-top  (Orbax)
  size = ckpt_lib.describe_size(config)
  steps = ckpt_lib.list_checkpoint_steps(run_dir)
  if not steps:
    return None, "none", size, f"; no checkpoints in {ckpt_lib.checkpoints_dir(run_dir)} yet"
  if checkpoint_step is not None and int(checkpoint_step) not in steps:
    raise ConfigError(f"evaluate_main.checkpoint_step={checkpoint_step}: "
                      f"{ckpt_lib.checkpoints_dir(run_dir)} has steps {steps}")
  if mode == "retrieval":
    if dry_run:
      # Retrieval uses the checkpoint its index was built from (checked when it is loaded); the
      # run's newest one tells the model size without reading an index.
      runs.checkpoint_metadata(ckpt_lib.checkpoint_path(run_dir, steps[-1]), config,
                               "checkpoint")
    return None, "none", size, ""
  step, why = runs.choose_checkpoint(run_dir, checkpoint_step)
  step_dir = ckpt_lib.checkpoint_path(run_dir, step)
  metadata = runs.checkpoint_metadata(step_dir, config, "checkpoint")
  _require_reader(metadata, step_dir)
  _check_closed_book(metadata, step_dir, candidates)
  return step, why, size, ""


def _dry_run_line(what: str, candidates: str, index_run: str, toy_store: bool) -> str:
  if candidates == "bm25":
    what += "; candidates: BM25's blocks, no index"
  elif candidates == "none":
    what += "; closed book: nothing retrieved, no index"
  else:
    indexes = index_lib.list_indexes(index_run)
    what += (f"; index steps {indexes}" if indexes
             else f"; no published index in {index_lib.index_root(index_run)} yet")
  if toy_store:
    what += "; block store: the toy store"
  return f"{PROG}: dry run ok ({what}; no data read, nothing written)"


def _check_run_dirs(run_dirs: Sequence[str]) -> None:
  missing = [directory for directory in run_dirs if not os.path.isdir(directory)]
  if missing:
    raise FileNotFoundError(f"{os.path.abspath(missing[0])}: no such run directory")


# ------------------------------------------------------------------------------ the modes


def _bm25(*, run_dir: Optional[str], task: str, kind: str, split: str,
          block_store: Optional[str], batch_size: int, k_values: tuple[int, ...],
          max_examples: Optional[int], output: Optional[str], dry_run: bool) -> int:
  """Mode "bm25" after the common checks; `block_store` None: the toy store."""
  if run_dir is None and not output:
    raise ConfigError("mode 'bm25' without a run directory (RUN_DIR=None) needs "
                      "evaluate_main.output: e.g. --gin.evaluate_main.output=\"'/tmp/bm25.jsonl'\" "
                      "writes /tmp/bm25.metrics.json (or give a RUN_DIR: "
                      "<RUN_DIR>/predictions/<task>_<split>_bm25.metrics.json)")
  if dry_run:
    _, metrics_path = results.output_paths(output, run_dir, results.file_stem("bm25", task, split))
    print(f"{PROG}: dry run ok (bm25, task {task}/{split}, block store "
          f"{block_store or 'the toy store'}, metrics {metrics_path}; no data read, nothing "
          f"written)", flush=True)
    return 0
  if run_dir is not None and not os.path.isdir(run_dir):
    # A typo would otherwise create a run directory holding nothing but this file.
    raise FileNotFoundError(f"{os.path.abspath(run_dir)}: no such run directory (mode 'bm25' "
                            f"needs none: --gin.RUN_DIR=None with evaluate_main.output)")
  from realm_jax.evaluation import modes  # pylint: disable=g-import-not-at-top  (Orbax)
  results.write(modes.run_bm25(run_dir, task=task, kind=kind, split=split,
                               block_store=block_store, batch_size=batch_size,
                               k_values=k_values, max_examples=max_examples), output, run_dir)
  return 0


def _run(mode: str, questions: Sequence[str], *, run_dir: str, config: Any, task: str,
         kind: Optional[str], split: str, step: Optional[int], why: str,
         block_store: Optional[str], candidates: str, index_run: str,
         index_step: Optional[int], backend: str, verify_index: bool, batch_size: int,
         k_values: tuple[int, ...], reader_beam: int, reader_len: int,
         max_examples: Optional[int], output: Optional[str],
         first_index_checkpoint_dir: Optional[str]) -> int:
  """Mode "qa", "retrieval" or the questions, after every check."""
  from realm_jax.evaluation import modes  # pylint: disable=g-import-not-at-top  (Orbax)
  index = modes.Index(index_run, index_step, backend, verify_index)
  if questions:
    modes.run_questions(run_dir, config, step, why, questions, block_store=block_store,
                        candidates=candidates, index=index, reader_beam=reader_beam,
                        reader_len=reader_len)
    return 0
  if mode == "qa":
    result = modes.run_qa(run_dir, config, step, why, task=task, split=split,
                          block_store=block_store, candidates=candidates, index=index,
                          batch_size=batch_size, k_values=k_values, reader_beam=reader_beam,
                          reader_len=reader_len, max_examples=max_examples)
  else:
    result = modes.run_retrieval(run_dir, config, task=task, kind=kind, split=split,
                                 block_store=block_store, index=index, batch_size=batch_size,
                                 k_values=k_values, max_examples=max_examples,
                                 first_index_checkpoint_dir=first_index_checkpoint_dir)
  results.write(result, output, run_dir)
  return 0


def _question_bindings(values: Any) -> list[str]:
  """Free-text questions need no task; gin refuses a config whose TASK macro is left at
  %gin.REQUIRED (at parse time, whether or not the call uses it), so --question sets it."""
  return ["TASK = None"] if values.question else []


# Runtime errors that explain themselves: CheckpointError, IndexLoadError, FileNotFoundError...
@gin_utils.command(
    PROG, doc=__doc__, example_gin="gin_configs/experiments/toy_eval.gin",
    interrupted="nothing partial was written",
    booleans={"dry_run": "Check the configuration (and the run's checkpoint size), print one "
                         "line and exit without reading data."},
    multi_strings={"question": "A free-text question to answer with its evidence "
                               "(repeatable); no task needed."},
    arguments={"question": "questions"}, extra_bindings=_question_bindings)
def evaluate_main(run_dir: str = gin.REQUIRED, model_config: Any = gin.REQUIRED,
                  task: Optional[str] = gin.REQUIRED, split: str = "test", mode: str = "qa",
                  checkpoint_step: Optional[int] = None, index_step: Optional[int] = None,
                  index_run_dir: Optional[str] = None, block_store: Optional[str] = None,
                  first_index_checkpoint_dir: Optional[str] = None, batch_size: int = 16,
                  k_values: Sequence[int] = (1, 5, 20, 100), reader_beam: int = 5,
                  reader_len: int = 320, backend: str = "exact",
                  max_examples: Optional[int] = None, output: Optional[str] = None,
                  questions: Sequence[str] = (), verify_index: bool = True,
                  candidates: str = "index", dry_run: bool = False) -> int:
  """Evaluates a run, or BM25 over a block store (the only gin-configurable function of this job).

  Args:
    run_dir: the run: its checkpoints/, best.json and published index/ ("bm25": None needs
      `output`).
    model_config: a RealmConfig (%MODEL_CONFIG); checkpoints of another size are refused.
    task: a seqio QA task, an ICT task ("retrieval", "bm25"), or your own QA files (a path;
      `regex:<path>` for regex answers). Not needed with `questions`.
    split: the task split ("test"; the ICT tasks have only "train").
    mode: "qa" (reader predictions, EM, recall), "retrieval" (the index's query tower, no
      reader) or "bm25" (Okapi BM25: no checkpoint, index or reader settings).
    checkpoint_step: "qa": the checkpoint to evaluate; None: best.json's, else the newest.
    index_step: the published index to retrieve from; None: the newest.
    index_run_dir: the run whose published index/ is searched; None: `run_dir`.
    block_store: the BlockStore the index embeds (or BM25 ranks); None: the toy store.
    first_index_checkpoint_dir: "retrieval": index 0's checkpoint, if its recorded path is gone.
    batch_size: questions (queries) per step.
    k_values: recall cut-offs (clipped to the number of blocks).
    reader_beam: blocks the reader reads per question.
    reader_len: reader sequence length.
    backend: "exact" or "scann" (the index's ScaNN artifacts).
    max_examples: evaluate only the first this many examples.
    output: predictions JSONL path (metrics beside it, .metrics.json); None: under
      `<run_dir>/predictions/`.
    questions: free-text questions to answer and show evidence for (overrides the task).
    verify_index: re-hash the index's files before searching it (False: sizes only).
    candidates: what the reader reads: "index", "bm25" (BM25's blocks, no retrieval score) or
      "none" (the closed book of a FiD run: no block, reader_beam 1).
    dry_run: check the configuration (and the run's checkpoint size, if any), print one line.

  Returns:
    The exit status (0).
  """
  questions = [str(q) for q in (questions or ())]
  _check_mode(mode, questions, model_config, run_dir)
  k_values = _check_sizes(backend, k_values, batch_size, reader_beam, reader_len, max_examples)
  if checkpoint_step is not None and mode == "retrieval":
    raise ConfigError("evaluate_main.checkpoint_step is for mode 'qa'; mode 'retrieval' uses "
                      "the checkpoint its index was built from: pick the index with "
                      "evaluate_main.index_step")
  reader_beam = _check_candidates(mode, candidates, reader_beam, {
      "index_step": index_step, "index_run_dir": index_run_dir, "backend": backend,
      "verify_index": verify_index})
  if mode == "bm25":
    _refuse_unused_for_bm25({
        "checkpoint_step": checkpoint_step, "index_step": index_step,
        "index_run_dir": index_run_dir, "first_index_checkpoint_dir": first_index_checkpoint_dir,
        "backend": backend, "reader_beam": reader_beam, "reader_len": reader_len,
        "verify_index": verify_index})
  task, kind, toy_store = _check_task(task, mode, split, block_store, questions)
  if mode == "bm25":
    return _bm25(run_dir=run_dir, task=task, kind=kind, split=split, block_store=block_store,
                 batch_size=batch_size, k_values=k_values, max_examples=max_examples,
                 output=output, dry_run=dry_run)

  step, why, size, none_yet = _checkpoint(run_dir, model_config, checkpoint_step, mode,
                                          candidates, dry_run)
  index_run = index_run_dir or run_dir
  what = (("predict" if questions else f"{mode}, task {task}/{split}")
          + f", model ({size}), run_dir {run_dir}"
          + (f"; checkpoint step {step} ({why})" if step is not None else "")
          + (f", index of {index_run_dir}" if index_run_dir else ""))
  if dry_run:
    print(_dry_run_line(what + none_yet, candidates, index_run, toy_store), flush=True)
    return 0
  _check_run_dirs(([run_dir] if mode == "qa" else []) + [index_run])
  log.info("%s", what)
  return _run(mode, questions, run_dir=run_dir, config=model_config, task=task, kind=kind,
              split=split, step=step, why=why, block_store=block_store, candidates=candidates,
              index_run=index_run, index_step=index_step, backend=backend,
              verify_index=verify_index, batch_size=batch_size, k_values=k_values,
              reader_beam=reader_beam, reader_len=reader_len, max_examples=max_examples,
              output=output, first_index_checkpoint_dir=first_index_checkpoint_dir)


# ------------------------------------------------------------------------------ released models


def _asks_released(args: Sequence[str]) -> bool:
  """Whether a command line (without the program name) names `--released DIR`."""
  return any(arg == "--released" or arg.startswith("--released=") for arg in args)


def _check_released(args: Any) -> tuple[dict, Any, str, Any, str]:
  """(config.json, the vocabulary, the task's seqio name, the prediction settings, what is
  evaluated in words) of the released mode's flags, checked before any weight is read."""
  from realm_jax.convert import hf  # pylint: disable=g-import-not-at-top
  from realm_jax.evaluation import released  # pylint: disable=g-import-not-at-top  (TF)
  released.check_directory(args.released)
  hf_config = hf.read_config(args.released)
  released.check_kind(hf.detect_kind(hf_config, args.released), args.released)
  vocab = released.read_vocabulary(args.released, hf_config)
  task = released.check_task(args.task, args.split)
  run = released.settings(hf_config, args.reader_beam)
  what = (f"released model {args.released} ({run.num_blocks:,} blocks), task "
          f"{task}/{args.split}, {args.backend} search, reader top {run.reader_beam} of "
          f"{run.reader_len} wordpieces")
  return hf_config, vocab, task, run, what


def _released(args: Any) -> int:
  """The released mode after its flags are parsed: everything is checked before the weights
  (gigabytes) are read, then the model answers the split and the files are written."""
  from realm_jax.batches import qa_batches  # pylint: disable=g-import-not-at-top  (Orbax)
  from realm_jax.convert import hf  # pylint: disable=g-import-not-at-top
  from realm_jax.evaluation import released  # pylint: disable=g-import-not-at-top  (TF)
  _, vocab, task, run, what = _check_released(args)
  if args.dry_run:
    print(f"{PROG}: dry run ok ({what}; no weights read, nothing written)", flush=True)
    return 0
  log.info("%s", what)
  start = time.monotonic()
  config, params, extras = hf.load_checkpoint(args.released, "open_qa")
  records = released.read_block_records(args.released)  # [num_blocks] bytes
  log.info("weights and %d block texts read in %s", records.shape[0],
           progress_lib.format_duration(time.monotonic() - start))
  store = released.BlockRecords(records, vocab,
                                os.path.join(args.released, released.BLOCK_RECORDS))
  examples = qa_batches.qa_task_examples(task, args.split, max_examples=args.max_examples)
  result = released.evaluate_released(
      args.released, config, params, extras.pop("block_emb"), store, examples, task=task,
      split=args.split, run=run, backend=args.backend, batch_size=args.batch_size,
      k_values=_default("k_values"))
  results.write(result, args.output, args.released)
  return 0


def released_main(argv: Sequence[str]) -> int:
  """`python -m realm_jax.evaluate --released DIR ...` (`realm_jax.evaluation.released`);
  returns the exit status (argparse's 2 for a bad flag, 0 after --help)."""
  from realm_jax.evaluation import released  # pylint: disable=g-import-not-at-top  (TF)
  try:
    args = released.make_parser(f"python -m realm_jax.{PROG}").parse_args(list(argv[1:]))
  except SystemExit as e:  # --help, or a bad flag (argparse printed why)
    return int(e.code or 0)
  gin_utils.setup_logging()
  return gin_utils.run_command(PROG, lambda: _released(args),
                               interrupted="nothing partial was written")


def main(argv: Optional[Sequence[str]] = None) -> int:
  """python -m realm_jax.evaluate; returns the exit status: the released mode for a command line
  naming `--released DIR`, else the gin-configured `evaluate_main`."""
  argv = list(sys.argv if argv is None else argv)
  if _asks_released(argv[1:]):
    return released_main(argv)
  return evaluate_main.main(argv)


if __name__ == "__main__":
  gin_utils.exit_process(main(), PROG)
