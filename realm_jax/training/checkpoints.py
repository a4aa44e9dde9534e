"""Orbax checkpoints of a training run, and the run directory the index builder follows.

Run directory layout (shared by the trainer, the index builder and evaluation):

  <run_dir>/checkpoints/<step>/   one Orbax checkpoint per saved step (CheckpointManager)
      params/                     StandardSave of the parameter dict ({"retriever": ..., ...})
      metadata/                   JsonSave: {"format", "format_version", "step", "model_kind",
                                  "param_items", "config": config_to_dict(config), "extra_items"}
      <name>/                     one StandardSave item per entry of `extra_state`
  <run_dir>/index/<step>/         published indexes (realm_jax.index.store)
  <run_dir>/TRAINING_DONE         written by the trainer after its last checkpoint

Atomicity: Orbax writes a step into `<step>.orbax-checkpoint-tmp-<ts>` and renames it to `<step>`
when every item is written (then `_CHECKPOINT_METADATA` exists inside). `list_checkpoint_steps`
lists only directories whose whole name is a step number *and* that hold `_CHECKPOINT_METADATA`
and the metadata item, so a half-written checkpoint (a temporary directory, or a bare `<step>`
left by something else) is never listed and so never restored by the index builder.

The index builder is another process: it never holds a CheckpointManager (whose step list is a
snapshot taken at construction); it re-lists the directory on every poll and restores one step
directory with a plain Orbax Checkpointer.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp

from realm_jax.models.config import RealmConfig, config_to_dict, realm_config_from_dict

log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
TRAINING_DONE = "TRAINING_DONE"
PARAMS_ITEM = "params"
METADATA_ITEM = "metadata"
FORMAT_NAME = "realm_jax.checkpoint"
FORMAT_VERSION = 1
# Written by Orbax into a step directory when the step is finalized.
_ORBAX_STEP_METADATA = "_CHECKPOINT_METADATA"


class CheckpointError(ValueError):
  """A checkpoint is missing, unfinished, unreadable or belongs to another model size."""


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
  root = checkpoints_dir(run_dir)
  try:
    names = os.listdir(root)
  except FileNotFoundError:
    return []
  steps = []
  for name in names:
    # Orbax's temporary directories are `<step>.orbax-checkpoint-tmp-<ts>`: not all digits.
    if name.isdigit() and _is_finished_step_dir(os.path.join(root, name)):
      steps.append(int(name))
  return sorted(steps)


def latest_checkpoint_step(run_dir: str) -> Optional[int]:
  """The newest finished checkpoint step of a run, or None when there is none yet."""
  steps = list_checkpoint_steps(run_dir)
  return steps[-1] if steps else None


def _model_kind(params: Mapping[str, Any]) -> str:
  return "+".join(sorted(params))


def save_checkpoint(run_dir: str, step: int, params: Mapping[str, Any], *, config: RealmConfig,
                    extra_state: Optional[Mapping[str, Any]] = None, keep: Optional[int] = 3,
                    model_kind: Optional[str] = None) -> str:
  """Saves one checkpoint with Orbax and waits until it is finalized on disk.

  Args:
    params: dict of parameter trees, at least {"retriever": RealmRetriever params} (pretraining
      adds "encoder"). Flax boxed (`nn.Partitioned`) leaves are unboxed first.
    config: the model config; written as JSON so a reader rebuilds the same model and can
      refuse a checkpoint of another model size.
    extra_state: optional {item name: pytree of arrays} saved as further Orbax items
      (optimizer state, RNG, data position); restore one with `restore_params(..., item=name)`.
    keep: keep the newest `keep` checkpoints (None keeps all).
    model_kind: recorded in the metadata; default: the sorted `params` keys joined by "+"
      (e.g. "encoder+retriever").

  Returns:
    The step directory `<run_dir>/checkpoints/<step>`.

  The save is finished (renamed into place) when this returns: the index builder in another
  process may pick the step up at once, and a test's stand-in trainer is deterministic. (The
  trainer may later want Orbax's asynchronous save; it would keep its own manager open.)
  """
  if "retriever" not in params:
    raise CheckpointError(f"save_checkpoint: params must have a 'retriever' entry (got "
                          f"{sorted(params)})")
  extra_state = dict(extra_state or {})
  clash = {PARAMS_ITEM, METADATA_ITEM} & set(extra_state)
  if clash:
    raise CheckpointError(f"save_checkpoint: extra_state names {sorted(clash)} are reserved")
  step = int(step)
  params = nn.unbox(dict(params))
  metadata = {
      "format": FORMAT_NAME,
      "format_version": FORMAT_VERSION,
      "step": step,
      "model_kind": model_kind or _model_kind(params),
      "param_items": sorted(params),
      "extra_items": sorted(extra_state),
      "config": config_to_dict(config),
      "saved_unix": time.time(),
  }
  items = {PARAMS_ITEM: ocp.args.StandardSave(params),
           METADATA_ITEM: ocp.args.JsonSave(metadata)}
  for name, tree in extra_state.items():
    items[name] = ocp.args.StandardSave(nn.unbox(tree))
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
  with ocp.CheckpointManager(checkpoints_dir(run_dir), options=options) as manager:
    manager.save(step, args=ocp.args.Composite(**items), force=True)
    manager.wait_until_finished()
  return checkpoint_path(run_dir, step)


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
  """The fields of a config that fix parameter shapes (what must match to load a checkpoint)."""
  bert = config.bert
  return {"num_layers": bert.num_layers, "hidden_size": bert.hidden_size,
          "num_heads": bert.num_heads, "intermediate_size": bert.intermediate_size,
          "vocab_size": bert.vocab_size, "max_position_embeddings": bert.max_position_embeddings,
          "type_vocab_size": bert.type_vocab_size, "proj_size": config.proj_size,
          "share_embedders": config.share_embedders}


def describe_size(config: RealmConfig) -> str:
  """'hidden 32, 2 layers, 4 heads, mlp 64, proj 128, vocab 30522' (and 'untied' if so)."""
  b = config.bert
  text = (f"hidden {b.hidden_size}, {b.num_layers} layers, {b.num_heads} heads, mlp "
          f"{b.intermediate_size}, proj {config.proj_size}, vocab {b.vocab_size}")
  return text + ("" if config.share_embedders else ", untied towers")


def check_model_size(config: RealmConfig, expected: RealmConfig, where: str) -> None:
  """Raises a one-line CheckpointError when `config` and `expected` differ in shape."""
  got, want = model_size(config), model_size(expected)
  if got != want:
    diff = ", ".join(f"{k} {got[k]} vs {want[k]}" for k in got if got[k] != want[k])
    raise CheckpointError(
        f"{where}: checkpoint of another model size ({describe_size(config)}) but this run's "
        f"model is ({describe_size(expected)}); differs in {diff}. Use a checkpoint of the "
        f"same model size or change the model gin.")


def restore_checkpoint_dir(step_dir: str, *, item: str = PARAMS_ITEM,
                           expected_config: Optional[RealmConfig] = None,
                           target: Any = None) -> tuple[Any, RealmConfig, dict]:
  """Restores one item of a checkpoint step directory (e.g. an ICT run's `checkpoints/1000`).

  Args:
    step_dir: `<some run>/checkpoints/<step>`.
    item: "params" or a name from the checkpoint's `extra_state`.
    expected_config: if given, a checkpoint of another model size is a one-line
      CheckpointError (checked from the JSON metadata before any array is read).
    target: optional abstract tree (jax.ShapeDtypeStruct leaves with shardings) to restore
      into; default: host NumPy arrays, so any process (any device count) can read it and
      place the arrays itself.

  Returns:
    (tree, config, metadata).
  """
  step_dir = os.path.abspath(os.fspath(step_dir))
  metadata = read_metadata(step_dir)
  try:
    config = realm_config_from_dict(metadata["config"])
  except (KeyError, TypeError, ValueError) as e:
    raise CheckpointError(f"{step_dir}: the metadata's model config is unreadable ({e})") from e
  if expected_config is not None:
    check_model_size(config, expected_config, step_dir)
  available = [PARAMS_ITEM] + list(metadata.get("extra_items", []))
  if item not in available:
    raise CheckpointError(f"{step_dir}: no item {item!r} (has {available})")
  # A handler for every item of the step (Orbax warns about items it has no handler for).
  handlers = {name: ocp.StandardCheckpointHandler() for name in available}
  checkpointer = ocp.Checkpointer(ocp.CompositeCheckpointHandler(
      **handlers, **{METADATA_ITEM: ocp.JsonCheckpointHandler()}))
  try:
    if target is None:
      tree_metadata = checkpointer.metadata(step_dir).item_metadata[item]
      tree_metadata = getattr(tree_metadata, "tree", tree_metadata)
      # NumPy targets make Orbax restore host arrays, whatever devices wrote them.
      target = jax.tree.map(lambda m: np.empty(m.shape, m.dtype), dict(tree_metadata))
    restored = checkpointer.restore(
        step_dir, args=ocp.args.Composite(**{item: ocp.args.StandardRestore(target)}))
  except Exception as e:  # noqa: BLE001 - vanished (pruned) or corrupt: one line
    first = str(e).splitlines()[0] if str(e) else ""
    raise CheckpointError(f"{step_dir}: cannot restore item {item!r} "
                          f"({type(e).__name__}: {first})") from e
  return restored[item], config, metadata


def restore_params(run_dir: str, step: Optional[int] = None, *, item: str = PARAMS_ITEM,
                   expected_config: Optional[RealmConfig] = None,
                   target: Any = None) -> tuple[Any, RealmConfig, dict]:
  """Restores one item of a run's checkpoint.

  Args:
    run_dir: the run directory.
    step: the step; None for the newest.
    item: "params" (the parameter dict) or an `extra_state` item name.
    expected_config: the caller's model config; a checkpoint of another model size is a
      one-line CheckpointError.
    target: see `restore_checkpoint_dir`.

  Returns:
    (tree, config, metadata): for "params" the dict saved by `save_checkpoint` with NumPy
    leaves (unless `target` says otherwise), the checkpoint's RealmConfig and its metadata.

  Raises:
    CheckpointError: no such step, unfinished, unreadable, or another model size.
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


def training_done(run_dir: str) -> bool:
  """True once the trainer has written `<run_dir>/TRAINING_DONE`."""
  return os.path.isfile(os.path.join(os.path.abspath(os.fspath(run_dir)), TRAINING_DONE))
