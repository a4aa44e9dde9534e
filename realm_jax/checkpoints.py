"""Orbax checkpoints of a training run, and the run directory the index builder follows.

`<run_dir>/checkpoints/<step>/` holds one Orbax checkpoint per saved step: `params/`, a JSON
`metadata/` (format, step, model config, items) and the trainer's extra items; beside it
`best.json`, `TRAINING_DONE`, `checksums/<step>.json` (every restore checks them) and, for PEFT,
`peft_base/`. Orbax renames a step into place when it is complete, and only complete steps are
listed, so the index builder (another process, re-listing on every poll) never restores a
half-written one. `save_checkpoint` saves once, synchronously; `CheckpointWriter` is the
trainer's (asynchronous, keeps the newest and the best). A PEFT checkpoint holds only the
trained parameters, restored against its hash-checked base (`PeftCheckpoints`).
Layout and design notes: docs/design/training_and_commands.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
import threading
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util

from realm_jax import fileio
from realm_jax.models import peft as peft_lib
from realm_jax.models.config import RealmConfig, config_to_dict, realm_config_from_dict

log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
TRAINING_DONE = "TRAINING_DONE"
PARAMS_ITEM = "params"
METADATA_ITEM = "metadata"
BEST_FILE = "best.json"
FORMAT_NAME = "realm_jax.checkpoint"
FORMAT_VERSION = 1
# Written by Orbax into a step directory when the step is finalized.
_ORBAX_STEP_METADATA = "_CHECKPOINT_METADATA"
# How long `CheckpointWriter` waits for an asynchronous save to reach the disk before it calls
# the save lost: a paper-scale checkpoint takes a minute or two even on remote storage.
DEFAULT_SAVE_TIMEOUT_SECONDS = 1800.0


class CheckpointError(ValueError):
  """A checkpoint is missing, unfinished, unreadable or belongs to another model size."""


class CheckpointSaveError(CheckpointError):
  """An asynchronous save failed or did not finish in time; the message names its step and the
  last complete checkpoint, which is intact."""


class CorruptCheckpointError(CheckpointError):
  """A checkpoint whose files do not match the checksums recorded when it was saved, or that
  cannot be read at all: the trainer resumes from an older, intact one."""


CHECKSUMS_DIR = "checksums"
CORRUPT_DIR = "corrupt_checkpoints"


def checksums_path(run_dir: str, step: int) -> str:
  return os.path.join(os.path.abspath(os.fspath(run_dir)), CHECKSUMS_DIR, f"{int(step)}.json")


def _step_files(step_dir: str) -> dict[str, str]:
  """{relative path: absolute path} of every file of a checkpoint step directory."""
  files = {}
  for root, _, names in os.walk(step_dir):
    for name in names:
      path = os.path.join(root, name)
      files[os.path.relpath(path, step_dir)] = path
  return files


def record_checksums(run_dir: str, step: int) -> str:
  """Writes `<run_dir>/checksums/<step>.json` for a finished checkpoint (and removes those of
  steps no longer listed); returns its path."""
  step_dir = checkpoint_path(run_dir, step)
  files = {rel: fileio.sha256_file(path) for rel, path in sorted(_step_files(step_dir).items())}
  path = checksums_path(run_dir, step)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fileio.write_json_atomically(path, {"step": int(step), "files": files})
  listed = set(list_checkpoint_steps(run_dir))
  for name in os.listdir(os.path.dirname(path)):
    stem = name[:-len(".json")]
    if name.endswith(".json") and stem.isdigit() and int(stem) not in listed:
      os.remove(os.path.join(os.path.dirname(path), name))
  return path


def verify_checkpoint(step_dir: str) -> bool:
  """Checks a step directory `<run>/checkpoints/<step>` against the checksums recorded when it
  was saved. Returns False when none were recorded (an older run, or a save whose checksums
  were not written yet); True when every file matches.

  Raises:
    CorruptCheckpointError: a file differs, is missing, or was added.
  """
  step_dir = os.path.abspath(os.fspath(step_dir))
  step = os.path.basename(step_dir)
  if not step.isdigit():
    return False
  recorded = _recorded_checksums(step_dir)
  if recorded is None:
    return False
  path = checksums_path(os.path.dirname(os.path.dirname(step_dir)), int(step))
  present = _step_files(step_dir)
  for rel in sorted(set(recorded) | set(present)):
    if rel not in present:
      problem = "is missing"
    elif rel not in recorded:
      problem = "was not there when it was saved"
    elif fileio.sha256_file(present[rel]) != recorded[rel]:
      problem = "does not match its sha256 recorded at save time"
    else:
      continue
    raise CorruptCheckpointError(f"{step_dir}: {rel} {problem} ({path}): a corrupt or "
                                 f"modified checkpoint")
  return True


def _recorded_checksums(step_dir: str) -> Optional[dict[str, str]]:
  """{relative path: sha256} recorded when `step_dir` was saved; None if none were."""
  step = os.path.basename(step_dir)
  if not step.isdigit():
    return None
  path = checksums_path(os.path.dirname(os.path.dirname(step_dir)), int(step))
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      return dict(json.load(f)["files"])
  except (OSError, ValueError, KeyError, TypeError) as e:  # written atomically: not expected
    log.warning("%s: unreadable (%s); %s is restored unverified", path, e, step_dir)
    return None


def params_sha256(step_dir: str) -> str:
  """One sha256 of a checkpoint's parameters: over the sorted "<file> <sha256>" lines of its
  `params/` files, from the checksums recorded when it was saved (computed from the files when
  none were)."""
  step_dir = os.path.abspath(os.fspath(step_dir))
  files = _recorded_checksums(step_dir)
  if files is None:
    files = {rel: fileio.sha256_file(path) for rel, path in _step_files(step_dir).items()}
  prefix = PARAMS_ITEM + os.sep
  lines = [f"{rel} {digest}" for rel, digest in sorted(files.items()) if rel.startswith(prefix)]
  if not lines:
    raise CheckpointError(f"{step_dir}: no {PARAMS_ITEM}/ files")
  return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def params_values_sha256(step_dir: str) -> str:
  """One sha256 of a checkpoint's parameter values (each leaf's path, dtype, shape and bytes),
  not of its files: Orbax names its files at random, so two runs that trained bit-identical
  parameters have different file checksums (`params_sha256`) but this same digest."""
  params, _, _ = restore_checkpoint_dir(step_dir)
  digest = hashlib.sha256()
  leaves, _ = jax.tree_util.tree_flatten_with_path(params)
  for path, leaf in sorted(leaves, key=lambda item: jax.tree_util.keystr(item[0])):
    values = np.ascontiguousarray(np.asarray(leaf))
    digest.update(f"{jax.tree_util.keystr(path)} {values.dtype.str} {values.shape}\n".encode())
    digest.update(values.tobytes())
  return digest.hexdigest()


def checkpoints_dir(run_dir: str) -> str:
  """`<run_dir>/checkpoints`: the CheckpointManager's directory."""
  return os.path.join(os.path.abspath(os.fspath(run_dir)), CHECKPOINTS_DIR)


def checkpoint_path(run_dir: str, step: int) -> str:
  """`<run_dir>/checkpoints/<step>`."""
  return os.path.join(checkpoints_dir(run_dir), str(int(step)))


def _is_finished_step_dir(path: str) -> bool:
  return (os.path.isfile(os.path.join(path, _ORBAX_STEP_METADATA))
          and os.path.isdir(os.path.join(path, METADATA_ITEM)))


def list_checkpoint_steps(run_dir: str) -> list[int]:
  """Steps of the finished checkpoints of a run, ascending (unfinished ones are never listed).

  Args:
    run_dir: the run directory (the one holding `checkpoints/`).

  Returns:
    Sorted step numbers; [] when there is no `checkpoints/` directory yet.
  """
  # Orbax's temporary directories are `<step>.orbax-checkpoint-tmp-<ts>`: not numbers.
  return [step for step, path in fileio.numbered_dirs(checkpoints_dir(run_dir))
          if _is_finished_step_dir(path)]


def latest_checkpoint_step(run_dir: str) -> Optional[int]:
  """The newest finished checkpoint step of a run, or None when there is none yet."""
  steps = list_checkpoint_steps(run_dir)
  return steps[-1] if steps else None


def _model_kind(params: Mapping[str, Any]) -> str:
  return "+".join(sorted(params))


def _checkpoint_args(step: int, params: Mapping[str, Any], *, config: RealmConfig,
                     extra_state: Optional[Mapping[str, Any]],
                     json_state: Optional[Mapping[str, Any]], model_kind: Optional[str],
                     extra_metadata: Optional[Mapping[str, Any]],
                     peft: Optional[tuple["PeftCheckpoints", dict]] = None
                     ) -> ocp.args.Composite:
  """The Orbax items of one checkpoint (shared by save_checkpoint and CheckpointWriter); with
  `peft` ((PeftCheckpoints, its metadata record)) only the trained parameters are saved."""
  if not {"retriever", "encoder", "retro", "fid"} & set(params):
    raise CheckpointError(f"save_checkpoint: params must have a 'retriever' or an 'encoder' "
                          f"entry, a RETRO model's 'retro' or a closed-book FiD reader's 'fid' "
                          f"(got {sorted(params)})")
  extra_state = dict(extra_state or {})
  json_state = dict(json_state or {})
  reserved = {PARAMS_ITEM, METADATA_ITEM}
  clash = (reserved & set(extra_state)) | (reserved & set(json_state))
  clash |= set(extra_state) & set(json_state)
  if clash:
    raise CheckpointError(f"save_checkpoint: item names {sorted(clash)} are reserved or used "
                          f"twice")
  params = nn.unbox(dict(params))
  saved = params
  if peft is not None:
    saved, _ = peft_lib.split_params(params, peft[0].trainable(params))
  metadata = {
      "format": FORMAT_NAME,
      "format_version": FORMAT_VERSION,
      "step": int(step),
      "model_kind": model_kind or _model_kind(params),
      "param_items": sorted(params),
      "extra_items": sorted(extra_state),
      "json_items": sorted(json_state),
      "config": config_to_dict(config),
      "saved_unix": time.time(),
  }
  if peft is not None:
    metadata["peft"] = peft[1]
  if extra_metadata:
    metadata["extra"] = dict(extra_metadata)
  items = {PARAMS_ITEM: ocp.args.StandardSave(saved),
           METADATA_ITEM: ocp.args.JsonSave(metadata)}
  for name, tree in extra_state.items():
    items[name] = ocp.args.StandardSave(nn.unbox(tree))
  for name, value in json_state.items():
    items[name] = ocp.args.JsonSave(value)
  return ocp.args.Composite(**items)


def save_checkpoint(run_dir: str, step: int, params: Mapping[str, Any], *, config: RealmConfig,
                    extra_state: Optional[Mapping[str, Any]] = None, keep: Optional[int] = 3,
                    model_kind: Optional[str] = None,
                    json_state: Optional[Mapping[str, Any]] = None,
                    extra_metadata: Optional[Mapping[str, Any]] = None) -> str:
  """Saves one checkpoint with Orbax and waits until it is finalized on disk.

  Args:
    params: {"retriever", "encoder", ...: parameter tree} (boxed leaves are unboxed first).
    config: the model config, written as JSON (a reader refuses another model size).
    extra_state: {item name: pytree of arrays} saved as further Orbax items (optimizer state).
    keep: keep the newest `keep` checkpoints (None keeps all).
    model_kind: recorded in the metadata; default: the sorted `params` keys joined by "+".
    json_state: {item name: JSON-able value} saved as JSON items (the input position).
    extra_metadata: a JSON-able dict stored as the metadata's "extra" (the trainer's settings).

  Returns the step directory `<run_dir>/checkpoints/<step>`, finished (renamed into place).
  """
  step = int(step)
  args = _checkpoint_args(step, params, config=config, extra_state=extra_state,
                          json_state=json_state, model_kind=model_kind,
                          extra_metadata=extra_metadata)
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
  with ocp.CheckpointManager(checkpoints_dir(run_dir), options=options) as manager:
    manager.save(step, args=args, force=True)
    manager.wait_until_finished()
  if jax.process_index() == 0:
    record_checksums(run_dir, step)
  return checkpoint_path(run_dir, step)


PEFT_BASE_DIR = "peft_base"


@dataclasses.dataclass(frozen=True)
class PeftCheckpoints:
  """How a parameter-efficient run checkpoints (see the module docstring).

  Attributes:
    run_dir: the run directory; its base is `<run_dir>/peft_base/checkpoints/0`.
    trainable: params -> tree of bools, True on the trained leaves (`PeftConfig.trainable_mask`).
    settings: JSON recorded in every checkpoint (`PeftConfig.to_dict()`: the method and, for
      LoRA, what merging needs).
    base_config: the base's model config (no adapters: the base is an ordinary checkpoint of the
      model the run started from).
  """

  run_dir: str
  trainable: Callable[[Any], Any]
  settings: Mapping[str, Any]
  base_config: RealmConfig

  @property
  def base_dir(self) -> str:
    return checkpoint_path(os.path.join(os.path.abspath(self.run_dir), PEFT_BASE_DIR), 0)

  def save_base(self, params: Mapping[str, Any]) -> str:
    """Writes the frozen leaves of `params` (the run's step-0 state) as the base, replacing one
    a run that never checkpointed left behind; returns its step directory."""
    base_run = os.path.dirname(os.path.dirname(self.base_dir))
    if jax.process_index() == 0 and os.path.isdir(base_run):
      shutil.rmtree(base_run)
    if jax.process_count() > 1:  # every host sees it gone before Orbax writes it again
      from jax.experimental import multihost_utils  # noqa: PLC0415
      multihost_utils.sync_global_devices("replace the PEFT base")
    params = nn.unbox(dict(params))
    _, frozen = peft_lib.split_params(params, self.trainable(params))
    return save_checkpoint(base_run, 0, frozen, config=self.base_config, keep=None,
                           extra_metadata={"peft_base_of": os.path.abspath(self.run_dir)})

  def record(self) -> dict:
    """metadata["peft"] of the run's checkpoints: settings, base and the base's params hash."""
    base = self.base_dir
    return {**dict(self.settings), "base_checkpoint": base,
            "base_checkpoint_relative": os.path.join("..", "..", PEFT_BASE_DIR, CHECKPOINTS_DIR,
                                                     "0"),
            "base_params_sha256": params_sha256(base)}


def _peft_base(step_dir: str, record: Mapping[str, Any]) -> str:
  """The base checkpoint of a PEFT checkpoint, checked against the hash it recorded."""
  # The run's own base first (a copied or moved run keeps its own), then the recorded path.
  recorded = record.get("base_checkpoint")
  candidates = [os.path.normpath(os.path.join(
      step_dir, record.get("base_checkpoint_relative") or os.curdir)), recorded]
  base = next((c for c in candidates if c and _is_finished_step_dir(c)), None)
  if base is None:
    raise CheckpointError(f"{step_dir}: its base checkpoint {recorded} is gone (a PEFT "
                          f"checkpoint holds only the trained parameters)")
  try:
    verify_checkpoint(base)
    digest = params_sha256(base)
  except CheckpointError as e:  # the base's trouble, not this checkpoint's: never set aside
    raise CheckpointError(f"{step_dir}: its base checkpoint {base} is unusable "
                          f"({e})") from e
  if digest != record.get("base_params_sha256"):
    raise CheckpointError(f"{step_dir}: its base checkpoint {base} has changed (params sha256 "
                          f"{digest} now, {record.get('base_params_sha256')} when this "
                          f"checkpoint was saved)")
  return base


class _PreserveSteps:
  """An Orbax preservation policy keeping the steps in a set the writer updates (the best)."""

  def __init__(self, steps: set[int]):
    self.steps = steps

  def should_preserve(self, checkpoints, *, context) -> Sequence[bool]:
    del context
    return [info.step in self.steps for info in checkpoints]


def read_best(run_dir: str) -> Optional[dict]:
  """`<run_dir>/best.json` ({"metric", "mode", "step", "value"}), or None if there is none."""
  path = os.path.join(os.path.abspath(os.fspath(run_dir)), BEST_FILE)
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except FileNotFoundError:
    return None




def _is_better(value: float, best: float, mode: str) -> bool:
  return value > best if mode == "max" else value < best


class CheckpointWriter:
  """The trainer's checkpoint writer: one CheckpointManager for the whole run.

  Saves asynchronously (at most one in flight), keeps the newest `keep` checkpoints and the
  best one by `best_metric` (`best.json`, naming only finished checkpoints), and bounds each
  wait by `save_timeout` (CheckpointSaveError) so a run ends instead of hanging. Multi-host:
  every process calls `save` with the same step; process 0 writes the JSON.
  """

  def __init__(self, run_dir: str, *, keep: Optional[int] = 3, async_save: bool = True,
               best_metric: Optional[str] = None, best_mode: str = "max",
               peft: Optional[PeftCheckpoints] = None,
               save_timeout: float = DEFAULT_SAVE_TIMEOUT_SECONDS):
    """Opens (creates) `<run_dir>/checkpoints`.

    Args:
      keep: newest checkpoints to keep (None keeps all); the best one is kept in addition.
      best_metric: the metric (passed to `save`) that ranks checkpoints; None: no best.
      best_mode: "max" (higher is better) or "min".
      peft: save only a PEFT run's trained parameters, against its base.
      save_timeout: seconds to wait for a save to reach the disk.
    """
    if not save_timeout > 0:
      raise ValueError(f"CheckpointWriter: save_timeout={save_timeout}; expected > 0 seconds")
    self.save_timeout = float(save_timeout)
    self._failed: Optional[str] = None  # why a save was lost; Orbax is not waited on again
    self._peft = peft
    self._peft_record: Optional[dict] = None
    if best_mode not in ("max", "min"):
      raise ValueError(f"CheckpointWriter: best_mode={best_mode!r}; expected 'max' or 'min'")
    if keep is not None and keep < 1:
      raise ValueError(f"CheckpointWriter: keep={keep}; expected >= 1 or None")
    self.run_dir = os.path.abspath(os.fspath(run_dir))
    self.best_metric = best_metric
    self.best_mode = best_mode
    self._lock = threading.Lock()
    # The recorded best stays preserved even when this invocation does not evaluate (a resumed
    # run without eval_fn must not prune the checkpoint the run is selected by).
    self._best = read_best(self.run_dir)
    if (best_metric and self._best is not None
        and (self._best.get("metric") != best_metric or self._best.get("mode") != best_mode)):
      log.warning("%s: records %s (%s); this run ranks by %s (%s): starting afresh",
                  os.path.join(self.run_dir, BEST_FILE), self._best.get("metric"),
                  self._best.get("mode"), best_metric, best_mode)
      self._best = None
    self._pending_best: Optional[dict] = None
    self._in_flight: Optional[int] = None  # the step being saved, until `wait` records it
    self._warned_missing = False
    self._preserved: set[int] = {int(self._best["step"])} if self._best else set()
    policy = None
    if keep is not None:
      from orbax.checkpoint import checkpoint_managers as managers  # noqa: PLC0415
      policy = managers.AnyPreservationPolicy(
          [managers.LatestN(n=keep), _PreserveSteps(self._preserved)])
    options = ocp.CheckpointManagerOptions(
        create=True, enable_async_checkpointing=async_save, preservation_policy=policy)
    self._manager = ocp.CheckpointManager(checkpoints_dir(self.run_dir), options=options)

  @property
  def best(self) -> Optional[dict]:
    """The recorded best ({"metric", "mode", "step", "value"}) or None."""
    return self._best

  def save(self, step: int, params: Mapping[str, Any], *, config: RealmConfig,
           extra_state: Optional[Mapping[str, Any]] = None,
           json_state: Optional[Mapping[str, Any]] = None,
           metrics: Optional[Mapping[str, float]] = None,
           extra_metadata: Optional[Mapping[str, Any]] = None) -> None:
    """Starts saving step `step` (same items as `save_checkpoint`).

    Args:
      step: the step (number of updates applied).
      params, config, extra_state, json_state, extra_metadata: as `save_checkpoint`.
      metrics: eval metrics of this step; if they contain `best_metric` and it beats the
        recorded best, this step becomes the best once its save has finished.
    """
    step = int(step)
    if self._peft is not None and self._peft_record is None:
      self._peft_record = self._peft.record()
    args = _checkpoint_args(step, params, config=config, extra_state=extra_state,
                            json_state=json_state, model_kind=None,
                            extra_metadata=extra_metadata,
                            peft=None if self._peft is None else (self._peft,
                                                                  self._peft_record))
    # Finish (and record) the previous save first; Orbax would wait for it anyway.
    self.wait()
    candidate = None
    if (self.best_metric and metrics is not None and self.best_metric not in metrics
        and not self._warned_missing):
      self._warned_missing = True
      log.warning("eval metrics %s have no %r: no best checkpoint is recorded",
                  sorted(metrics), self.best_metric)
    if self.best_metric and metrics is not None and self.best_metric in metrics:
      value = float(metrics[self.best_metric])
      if value == value and (self._best is None
                             or _is_better(value, float(self._best["value"]), self.best_mode)):
        candidate = {"metric": self.best_metric, "mode": self.best_mode, "step": step,
                     "value": value}
        # Preserved from now on, so the pruning that follows this very save cannot take it.
        self._preserved.add(step)
    self._manager.save(step, args=args, force=True)
    self._pending_best = candidate
    self._in_flight = step

  def _wait_for_orbax(self) -> None:
    """Orbax's wait for the in-flight save, bounded by `save_timeout`; raises
    CheckpointSaveError when the save failed or did not finish."""
    if self._failed is not None:
      raise CheckpointSaveError(self._failed)
    step = self._in_flight
    done = threading.Event()
    errors: list[BaseException] = []

    def wait() -> None:
      try:
        self._manager.wait_until_finished()
      except BaseException as e:  # noqa: BLE001  (re-raised in the caller's thread)
        errors.append(e)
      finally:
        done.set()

    # A daemon thread: one blocked for ever must not keep the process alive.
    threading.Thread(target=wait, name="checkpoint-wait", daemon=True).start()
    finished = done.wait(self.save_timeout)
    if finished and not errors:
      return
    last = latest_checkpoint_step(self.run_dir)
    intact = ("no complete checkpoint" if last is None
              else f"the last complete checkpoint is step {last} "
                   f"({checkpoint_path(self.run_dir, last)})")
    reason = " ".join(str(errors[0]).split()) if errors else ""
    what = (f"did not finish within {self.save_timeout:g}s" if not finished
            else f"failed ({type(errors[0]).__name__}: {reason})")
    self._failed = f"saving checkpoint step {step} in {self.run_dir} {what}; {intact}"
    self._in_flight = None
    self._pending_best = None
    raise CheckpointSaveError(self._failed) from (errors[0] if errors else None)

  def wait(self) -> None:
    """Blocks until the in-flight save (if any) is on disk, then records its checksums and a
    pending best. Raises CheckpointSaveError when it failed or took over `save_timeout`."""
    if self._in_flight is None and self._failed is None:
      return
    self._wait_for_orbax()
    with self._lock:
      step, self._in_flight = self._in_flight, None
      if (step is not None and jax.process_index() == 0
          and step in list_checkpoint_steps(self.run_dir)):
        record_checksums(self.run_dir, step)
      pending, self._pending_best = self._pending_best, None
      if pending is None:
        return
      if pending["step"] not in list_checkpoint_steps(self.run_dir):
        log.warning("checkpoint %d did not finish; not recording it as the best", pending["step"])
        self._preserved.discard(pending["step"])
        return
      previous = self._best
      self._best = pending
      self._preserved.clear()
      self._preserved.add(pending["step"])
      if jax.process_index() == 0:
        fileio.write_json_atomically(os.path.join(self.run_dir, BEST_FILE), pending)
      log.info("new best checkpoint: step %d with %s=%.6g (was %s)", pending["step"],
               pending["metric"], pending["value"],
               "none" if previous is None else f"step {previous['step']}")

  def close(self) -> None:
    """Waits for the last save and closes the manager; after a lost save (CheckpointSaveError,
    raised here or earlier) the manager is left as it is, since closing it waits on the same
    save."""
    try:
      self.wait()
    finally:
      if self._failed is None:
        self._manager.close()

  def __enter__(self) -> "CheckpointWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def read_metadata(step_dir: str) -> dict:
  """The JSON metadata of one finished checkpoint step directory.

  Raises:
    CheckpointError: the directory is not a finished realm_jax checkpoint.
  """
  step_dir = os.path.abspath(os.fspath(step_dir))
  if not os.path.isdir(step_dir):
    raise CheckpointError(f"{step_dir}: no such checkpoint directory")
  if not _is_finished_step_dir(step_dir):
    raise CheckpointError(f"{step_dir}: not a finished Orbax checkpoint (no "
                          f"{_ORBAX_STEP_METADATA} or {METADATA_ITEM}/; still being written?)")
  # The item's own directory, read by its own handler: a Composite restore of one item would
  # warn about every other item of the step.
  checkpointer = ocp.Checkpointer(ocp.JsonCheckpointHandler())
  try:
    metadata = checkpointer.restore(os.path.join(step_dir, METADATA_ITEM))
  except Exception as e:  # noqa: BLE001 - report any Orbax failure as one line
    raise CheckpointError(f"{step_dir}: unreadable checkpoint metadata "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                          ) from e
  if not isinstance(metadata, dict) or metadata.get("format") != FORMAT_NAME:
    raise CheckpointError(f"{step_dir}: not a {FORMAT_NAME} checkpoint (metadata "
                          f"{json.dumps(metadata)[:120]})")
  return metadata


def model_size(config: RealmConfig) -> dict:
  """The fields of a config that must match to load a checkpoint: those that fix parameter
  shapes, and the retriever's pooling (same shapes, but another embedding of the same text: an
  index built with one would not answer queries embedded with the other)."""
  bert = config.bert
  return {"num_layers": bert.num_layers, "hidden_size": bert.hidden_size,
          "num_heads": bert.num_heads, "intermediate_size": bert.intermediate_size,
          "vocab_size": bert.vocab_size, "max_position_embeddings": bert.max_position_embeddings,
          "type_vocab_size": bert.type_vocab_size, "proj_size": config.proj_size,
          "share_embedders": config.share_embedders,
          "span_hidden_size": config.span_hidden_size,
          "retriever_pooling": config.retriever_pooling}


def describe_size(config: RealmConfig) -> str:
  """'hidden 32, 2 layers, 4 heads, mlp 64, proj 128, vocab 30522' (and 'untied' if so)."""
  b = config.bert
  text = (f"hidden {b.hidden_size}, {b.num_layers} layers, {b.num_heads} heads, mlp "
          f"{b.intermediate_size}, proj {config.proj_size}, vocab {b.vocab_size}")
  text += f", adapters {b.adapter_size}" if b.adapter_size else ""
  text += "" if config.share_embedders else ", untied towers"
  return text + ("" if config.retriever_pooling == "cls" else
                 f", {config.retriever_pooling}-pooled retriever")


# The `model_size` fields of BERT itself: all a BERT warm start (a converted BERT, or an mlm run's
# encoder) must share with the run it starts; the retriever's and reader's heads start fresh.
BERT_SIZE_FIELDS = ("num_layers", "hidden_size", "num_heads", "intermediate_size", "vocab_size",
                    "max_position_embeddings", "type_vocab_size")


def check_model_size(config: RealmConfig, expected: RealmConfig, where: str, *,
                     bert_only: bool = False) -> None:
  """Raises a one-line CheckpointError when `config` and `expected` differ in shape (in BERT's
  shape only with `bert_only`)."""
  got, want = model_size(config), model_size(expected)
  if bert_only:
    got, want = ({k: d[k] for k in BERT_SIZE_FIELDS} for d in (got, want))
  if got != want:
    diff = ", ".join(f"{k} {got[k]} vs {want[k]}" for k in got if got[k] != want[k])
    raise CheckpointError(
        f"{where}: checkpoint of another model size ({describe_size(config)}) but this run's "
        f"model is ({describe_size(expected)}); differs in {diff}. Use a checkpoint of the "
        f"same model size or change the model gin.")


def checkpoint_config(step_dir: str, metadata: dict,
                      expected_config: Optional[RealmConfig] = None, *,
                      bert_only: bool = False) -> RealmConfig:
  """The model config a checkpoint's metadata (`read_metadata(step_dir)`) records; a one-line
  CheckpointError when it is unreadable or, given `expected_config`, of another model size
  (`check_model_size`; BERT's shape only with `bert_only`)."""
  try:
    config = realm_config_from_dict(metadata["config"])
  except (KeyError, TypeError, ValueError) as e:
    raise CheckpointError(f"{step_dir}: the metadata's model config is unreadable ({e})") from e
  if expected_config is not None:
    check_model_size(config, expected_config, step_dir, bert_only=bert_only)
  return config


def restore_items(step_dir: str, targets: Mapping[str, Any], *,
                  expected_config: Optional[RealmConfig] = None
                  ) -> tuple[dict[str, Any], RealmConfig, dict]:
  """Restores several items of one checkpoint step directory in one read.

  Args:
    targets: {item name: target}: an abstract tree (`jax.ShapeDtypeStruct` leaves with
      shardings), or None for host NumPy arrays (always None for JSON items).
    expected_config: if given, another model size is a one-line CheckpointError.

  A PEFT checkpoint's "params" come back whole: as trained into an abstract target, LoRA merged
  into host arrays. Returns ({item name: value}, config, metadata). Raises CheckpointError
  (unfinished, another size, no such item) or CorruptCheckpointError (checksums, unreadable).
  """
  step_dir = os.path.abspath(os.fspath(step_dir))
  verify_checkpoint(step_dir)
  metadata = read_metadata(step_dir)
  config = checkpoint_config(step_dir, metadata, expected_config)
  record = metadata.get("peft")
  if not record or PARAMS_ITEM not in targets:
    return _restore(step_dir, targets, metadata), config, metadata
  return _restore_peft(step_dir, targets, metadata, record), config, metadata


def _restore_peft(step_dir: str, targets: Mapping[str, Any], metadata: dict,
                  record: Mapping[str, Any]) -> dict[str, Any]:
  """`_restore` of a PEFT checkpoint: its trained parameters joined to its base's (checked
  against the recorded hash); into host arrays, LoRA merged (the module docstring)."""
  base_dir = _peft_base(step_dir, record)
  saved = traverse_util.flatten_dict(_saved_tree(step_dir, PARAMS_ITEM))
  target = targets[PARAMS_ITEM]
  own_target = base_target = None
  if target is not None:
    flat = traverse_util.flatten_dict(dict(target))
    misfit = [path for path, leaf in saved.items()
              if path not in flat or tuple(flat[path].shape) != tuple(leaf.shape)]
    if misfit:
      path = misfit[0]
      raise CheckpointError(
          f"{step_dir}: its trained parameter {'/'.join(path)} {tuple(saved[path].shape)} is "
          f"not one of this run's ({tuple(flat[path].shape) if path in flat else 'absent'}): "
          f"resume a PEFT run with the settings it was started with ({record.get('method')})")
    own_target = traverse_util.unflatten_dict({p: flat[p] for p in saved})
    base_target = traverse_util.unflatten_dict({p: v for p, v in flat.items() if p not in saved})
  restored = _restore(step_dir, {**targets, PARAMS_ITEM: own_target}, metadata)
  base = _restore(base_dir, {PARAMS_ITEM: base_target}, read_metadata(base_dir))[PARAMS_ITEM]
  params = traverse_util.flatten_dict(dict(base))
  params.update(traverse_util.flatten_dict(dict(restored[PARAMS_ITEM])))
  params = traverse_util.unflatten_dict(params)
  if target is None:
    params = jax.device_get(peft_lib.merged_params(params, peft_lib.PeftConfig.from_dict(record)))
  return {**restored, PARAMS_ITEM: params}


def _saved_tree(step_dir: str, item: str) -> dict:
  """An array item's tree as Orbax recorded it, with empty NumPy leaves of its shapes."""
  checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler())
  try:
    tree_metadata = checkpointer.metadata(os.path.join(step_dir, item))
  except Exception as e:  # noqa: BLE001 - report any Orbax failure as one line
    raise CorruptCheckpointError(f"{step_dir}: unreadable {item} metadata ({type(e).__name__})"
                                 ) from e
  tree_metadata = getattr(tree_metadata, "item_metadata", tree_metadata)
  tree_metadata = getattr(tree_metadata, "tree", tree_metadata)
  return jax.tree.map(lambda m: np.empty(m.shape, m.dtype), dict(tree_metadata))


def _restore(step_dir: str, targets: Mapping[str, Any], metadata: dict) -> dict[str, Any]:
  """Restores items of a verified checkpoint step directory as `restore_items` says."""
  array_items = [PARAMS_ITEM] + list(metadata.get("extra_items", []))
  json_items = list(metadata.get("json_items", []))
  missing = [name for name in targets if name not in array_items + json_items]
  if missing:
    raise CheckpointError(f"{step_dir}: no item {missing[0]!r} (has {array_items + json_items})")
  # A handler for every item of the step (Orbax warns about items it has no handler for).
  handlers = {name: ocp.StandardCheckpointHandler() for name in array_items}
  handlers.update({name: ocp.JsonCheckpointHandler() for name in json_items})
  handlers[METADATA_ITEM] = ocp.JsonCheckpointHandler()
  checkpointer = ocp.Checkpointer(ocp.CompositeCheckpointHandler(**handlers))
  try:
    restore_args = {}
    for name, target in targets.items():
      if name in json_items:
        restore_args[name] = ocp.args.JsonRestore()
        continue
      if target is None:
        tree_metadata = checkpointer.metadata(step_dir).item_metadata[name]
        tree_metadata = getattr(tree_metadata, "tree", tree_metadata)
        # NumPy targets make Orbax restore host arrays, whatever devices wrote them.
        target = jax.tree.map(lambda m: np.empty(m.shape, m.dtype), dict(tree_metadata))
      restore_args[name] = ocp.args.StandardRestore(target)
    restored = checkpointer.restore(step_dir, args=ocp.args.Composite(**restore_args))
  except Exception as e:  # noqa: BLE001 - vanished (pruned) or corrupt: one line
    first = str(e).splitlines()[0] if str(e) else ""
    what = (f"item {next(iter(targets))!r}" if len(targets) == 1
            else f"items {sorted(targets)}")
    if not os.path.isdir(step_dir):  # pruned meanwhile (the index builder's race)
      raise CheckpointError(f"{step_dir}: cannot restore {what}: the checkpoint is gone "
                            f"({type(e).__name__}: {first})") from e
    raise CorruptCheckpointError(f"{step_dir}: cannot restore {what}, a truncated or corrupt "
                                 f"checkpoint ({type(e).__name__}: {first})") from e
  return {name: restored[name] for name in targets}


def restore_checkpoint_dir(step_dir: str, *, item: str = PARAMS_ITEM,
                           expected_config: Optional[RealmConfig] = None,
                           target: Any = None) -> tuple[Any, RealmConfig, dict]:
  """Restores one item of a checkpoint step directory (e.g. an ICT run's `checkpoints/1000`).

  `item`: "params" or an `extra_state` / `json_state` name; `target`: an abstract tree to
  restore into, default host NumPy arrays (any process can read them); `expected_config` as
  `restore_items`. Returns (tree, config, metadata).
  """
  restored, config, metadata = restore_items(step_dir, {item: target},
                                             expected_config=expected_config)
  return restored[item], config, metadata


def restore_params(run_dir: str, step: Optional[int] = None, *, item: str = PARAMS_ITEM,
                   expected_config: Optional[RealmConfig] = None,
                   target: Any = None) -> tuple[Any, RealmConfig, dict]:
  """Restores one item of a run's checkpoint.

  `step` None: the newest; the rest as `restore_checkpoint_dir`. Returns (tree, config,
  metadata); CheckpointError for no such step, unfinished, unreadable or another model size.
  """
  if step is None:
    step = latest_checkpoint_step(run_dir)
    if step is None:
      raise CheckpointError(f"{checkpoints_dir(run_dir)}: no finished checkpoint")
  step_dir = checkpoint_path(run_dir, step)
  if not os.path.isdir(step_dir):
    raise CheckpointError(f"{step_dir}: no checkpoint for step {step} (have "
                          f"{list_checkpoint_steps(run_dir)})")
  return restore_checkpoint_dir(step_dir, item=item, expected_config=expected_config,
                                target=target)


def export_merged(step_dir: str, out_run_dir: str) -> str:
  """Writes a checkpoint's effective parameters as an ordinary checkpoint of `out_run_dir`
  (same step; a PEFT checkpoint's LoRA merged into the kernels, its adapters kept as modules
  with the config that has them), which evaluation and serving read like any fine-tuning run's.
  Returns the new step directory.

  Raises:
    CheckpointError: unreadable, or a PEFT checkpoint whose base is gone or has changed.
  """
  params, config, metadata = restore_checkpoint_dir(step_dir)
  source = os.path.abspath(os.fspath(step_dir))
  exported = {"from": source, "peft": metadata.get("peft")}
  if os.path.abspath(checkpoints_dir(out_run_dir)) == os.path.dirname(source):
    raise CheckpointError(f"{out_run_dir}: the run {step_dir} belongs to; export to another "
                          f"run directory")
  return save_checkpoint(out_run_dir, int(metadata["step"]), params, config=config, keep=None,
                         extra_metadata={"exported": exported})


def mark_training_done(run_dir: str) -> str:
  """Writes `<run_dir>/TRAINING_DONE` (atomically) after the last checkpoint; returns its path."""
  run_dir = os.path.abspath(os.fspath(run_dir))
  os.makedirs(run_dir, exist_ok=True)
  path = os.path.join(run_dir, TRAINING_DONE)
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump({"done_unix": time.time(), "last_checkpoint": latest_checkpoint_step(run_dir)}, f)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  return path


def clear_training_done(run_dir: str) -> bool:
  """Removes `<run_dir>/TRAINING_DONE` (a finished run asked to train further); True if it was
  there. Followers such as the index builder would otherwise exit while training goes on."""
  path = os.path.join(os.path.abspath(os.fspath(run_dir)), TRAINING_DONE)
  try:
    os.remove(path)
  except FileNotFoundError:
    return False
  return True


def training_done(run_dir: str) -> bool:
  """True once the trainer has written `<run_dir>/TRAINING_DONE`."""
  return os.path.isfile(os.path.join(os.path.abspath(os.fspath(run_dir)), TRAINING_DONE))
