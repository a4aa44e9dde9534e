"""The training loop: a pure, sharded, jitted train step and a resumable loop around it.

One trainer runs every stage (ICT, REALM pretraining, open-QA fine-tuning); each job of
`realm_jax.jobs` gives it a model with `init(rng)`, `logical_axes()` and
`loss_fn(params, batch, rng) -> (loss, aux)`, aux holding sums and weights (never means) so that
they add across devices and microbatches. `make_train_step` jits the sharded step; `train` runs
it, resuming bit for bit from the newest checkpoint. Batches come from a `BatchIterator`:
host-local batches plus `state()` / `restore(state)`, the position after the batches returned.
Design notes: docs/design/training_and_commands.md.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Protocol, Sequence, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from realm_jax.models import realm
from realm_jax.models.config import RealmConfig
from realm_jax import checkpoints
from realm_jax import progress
from realm_jax.training import partitioning

log = logging.getLogger(__name__)

__all__ = [
    "BatchIterator",
    "ListBatches",
    "NonFiniteLossError",
    "PEAK_FLOPS_PER_DEVICE",
    "ShardedFn",
    "TrainState",
    "TrainStep",
    "compute_gradients",
    "init_state",
    "make_eval_fn",
    "make_grad_fn",
    "make_train_step",
    "restore_train_state",
    "train",
]

Array = jax.Array
Batch = Mapping[str, Any]
Hook = Callable[[int, "TrainState"], Optional[Mapping[str, Any]]]

OPT_STATE_ITEM = "opt_state"
TRAIN_STATE_ITEM = "train_state"
DATA_STATE_ITEM = "data_state"
TENSORBOARD_DIR = "tensorboard"
METRICS_JSONL = "metrics.jsonl"
METRICS_FORMATS = ("tensorboard", "jsonl")

# Dense bf16 peak FLOP/s per chip, for perf/mfu when `peak_flops_per_device` is not given;
# matched as a case-insensitive prefix of `jax.Device.device_kind`, longest first. Vendor
# figures; pass the number of your hardware explicitly where it differs (e.g. fp32 training).
PEAK_FLOPS_PER_DEVICE: dict[str, float] = {
    "tpu v4": 275e12,
    "tpu v5 lite": 197e12,
    "tpu v5e": 197e12,
    "tpu v5p": 459e12,
    "tpu v5": 459e12,
    "tpu v6 lite": 918e12,
    "tpu v6e": 918e12,
    "nvidia h100": 989e12,
    "nvidia h200": 989e12,
    "nvidia a100": 312e12,
}


class NonFiniteLossError(RuntimeError):
  """The loss or the gradient norm became NaN/inf; training stopped without saving that state.

  Attributes:
    step: the step (1-based update number) whose loss/gradients were not finite.
    last_checkpoint: the newest finished checkpoint step (all < `step`), or None.
  """

  def __init__(self, message: str, *, step: int, last_checkpoint: Optional[int]):
    super().__init__(message)
    self.step = step
    self.last_checkpoint = last_checkpoint


@flax.struct.dataclass
class TrainState:
  """Everything on the devices that a resumed run needs.

  Attributes:
    step: int32 [] number of updates applied so far.
    params: the model's parameter tree.
    opt_state: the optimizer's state (optax).
    rng: uint32 [2] raw key data of the base dropout key; step `s` (0-based) uses
      `fold_in(rng, s)`, so restarts do not change the dropout.
  """

  step: Array
  params: Any
  opt_state: Any
  rng: Array


# ------------------------------------------------------------------------------------------
# Input protocol.


class BatchIterator(Protocol):
  """What `train` reads batches from (see the module docstring)."""

  def __iter__(self) -> Iterator[Batch]:
    ...

  def __next__(self) -> Batch:
    ...

  def state(self) -> dict:
    ...

  def restore(self, state: Mapping[str, Any]) -> None:
    ...

  # Optional: `metrics() -> {name: float}`, the input's own counts (skipped examples, epoch),
  # written with every log line.


class ListBatches:
  """A `BatchIterator` over a list of host batches; its position is the index of the next one.

  Args:
    batches: the batches, in order.
    repeat: start again from the first batch after the last (default: StopIteration).
  """

  def __init__(self, batches: Sequence[Batch], *, repeat: bool = False):
    if not batches:
      raise ValueError("ListBatches: no batches")
    self._batches = list(batches)
    self._repeat = repeat
    self._position = 0

  def __iter__(self) -> "ListBatches":
    return self

  def __next__(self) -> Batch:
    if self._position >= len(self._batches) and not self._repeat:
      raise StopIteration
    batch = self._batches[self._position % len(self._batches)]
    self._position += 1
    return batch

  def state(self) -> dict:
    return {"position": self._position}

  def restore(self, state: Mapping[str, Any]) -> None:
    position = int(state["position"])
    if position < 0 or (position > len(self._batches) and not self._repeat):
      raise ValueError(f"ListBatches.restore: position {position} outside the "
                       f"{len(self._batches)} batches")
    self._position = position


# ------------------------------------------------------------------------------------------
# The step.


def _key(rng: Any) -> Array:
  """A typed PRNG key from an int seed, a typed key, or raw uint32 key data."""
  if isinstance(rng, (int, np.integer)):
    return jax.random.key(int(rng))
  rng = jnp.asarray(rng)
  if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
    return rng
  return jax.random.wrap_key_data(rng)


def compute_gradients(model: Any, params: Any, batch: Batch, rng: Array, *,
                      microbatches: int = 1) -> tuple[dict, Any]:
  """Summed aux values and gradients of the mean loss over the (global) batch.

  With `microbatches > 1`, `lax.scan` runs microbatches (example `b` in microbatch
  `b % microbatches`) and weights each gradient by its `aux["weight_sum"]`: exact for
  `loss_sum / weight_sum` losses. ICT's in-batch negatives shrink to the microbatch's.

  Args:
    model: has `loss_fn(params, batch, rng) -> (loss, aux)`.
    params: parameter tree.
    batch: {name: array [batch, ...]}.
    rng: dropout key (typed or raw).
    microbatches: number of microbatches; must divide the batch size.

  Returns:
    (aux, grads): aux summed over microbatches; grads shaped like params.
  """
  rng = _key(rng)
  grad_fn = jax.value_and_grad(model.loss_fn, has_aux=True)
  if microbatches == 1:
    (_, aux), grads = grad_fn(params, batch, rng)
    return aux, grads
  sizes = {jnp.shape(x)[0] for x in jax.tree.leaves(batch)}
  if len(sizes) != 1:
    raise ValueError(f"every batch feature needs the same leading dimension; got {sizes}")
  (size,) = sizes
  if size % microbatches:
    raise ValueError(f"microbatches={microbatches} does not divide the batch of {size}")

  def split(x):
    # [batch, ...] -> [microbatches, batch / microbatches, ...], example b in microbatch
    # b % microbatches: the reshape keeps dimension 0 (rows per device) sharded over "data".
    x = x.reshape((size // microbatches, microbatches) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)

  micro = jax.tree.map(split, batch)
  first = jax.tree.map(lambda x: x[0], micro)
  (_, aux_shape), grad_shape = jax.eval_shape(grad_fn, params, first, rng)
  if "weight_sum" not in aux_shape:
    raise ValueError("gradient accumulation needs aux['weight_sum'] (the loss's denominator)")
  zeros = lambda tree: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)

  def body(carry, inputs):
    grads_acc, aux_acc = carry
    index, microbatch = inputs
    (_, aux), grads = grad_fn(params, microbatch, jax.random.fold_in(rng, index))
    weight = aux["weight_sum"]
    grads_acc = jax.tree.map(lambda acc, g: acc + weight * g, grads_acc, grads)
    aux_acc = jax.tree.map(jnp.add, aux_acc, aux)
    return (grads_acc, aux_acc), None

  (grads, aux), _ = jax.lax.scan(body, (zeros(grad_shape), zeros(aux_shape)),
                                 (jnp.arange(microbatches), micro))
  total = aux["weight_sum"]
  # No weight at all (no masked token anywhere): the loss is 0, and so is its gradient.
  grads = jax.tree.map(lambda g: jnp.where(total > 0, g / jnp.maximum(total, 1e-12), 0.0),
                       grads)
  return aux, grads


def device_batch(host_batch: Mapping[str, Any]) -> dict[str, Any]:
  """The per-example arrays of a host batch: 0-d entries are host metadata (e.g. a pretraining
  batch's `index_step`), read on the host and never sent to the devices."""
  return {name: value for name, value in host_batch.items() if np.ndim(value)}


def _namespaced(means: Mapping[str, Any]) -> dict[str, Any]:
  """"loss" -> "train/loss"; names that already have a namespace ("retrieval/...") stay."""
  return {(name if "/" in name else f"train/{name}"): value for name, value in means.items()}


def _grad_norms(grads: Any) -> dict[str, Array]:
  """`train/grad_norm` (global L2 norm of the raw gradients) and `train/grad_norm/<key>` per
  top-level key: which tower drives the clipping. The global norm is computed on its own (not
  from the towers') so it stays bit for bit what earlier runs logged."""
  metrics = {"train/grad_norm": optax.tree.norm(grads)}
  if isinstance(grads, Mapping):
    metrics.update({f"train/grad_norm/{key}": optax.tree.norm(subtree)
                    for key, subtree in grads.items()})
  return metrics


def _init_fn(model: Any, optimizer: optax.GradientTransformation) -> Callable[[Array], TrainState]:
  def init(rng_data: Array) -> TrainState:
    params_rng, dropout_rng = jax.random.split(jax.random.wrap_key_data(rng_data))
    params = model.init(params_rng)
    return TrainState(step=jnp.zeros([], jnp.int32), params=params,
                      opt_state=optimizer.init(params),
                      rng=jax.random.key_data(dropout_rng))
  return init


def _seed_data(rng: Any) -> Array:
  return jax.random.key_data(_key(rng))


class ShardedFn:
  """A jitted function that is traced inside `partitioning.mesh_context`."""

  def __init__(self, jitted, mesh: Mesh, rules: partitioning.Rules,
               constrain_activations: bool):
    self._jitted = jitted
    self.mesh = mesh
    self.rules = tuple(rules)
    self._constrain = constrain_activations

  def _context(self):
    return partitioning.mesh_context(self.mesh, self.rules,
                                     constrain_activations=self._constrain)

  def __call__(self, *args):
    with self._context():
      return self._jitted(*args)

  def lower(self, *args) -> jax.stages.Lowered:
    """Lowers for these arguments (AOT); `.compile()` shares the jit cache with calls."""
    with self._context():
      return self._jitted.lower(*args)


class TrainStep(ShardedFn):
  """`state, metrics = train_step(state, batch)`; build it with `make_train_step`.

  Attributes:
    abstract_state: TrainState of `jax.ShapeDtypeStruct`s (no memory allocated).
    state_sharding: TrainState of NamedShardings (parameters and Adam moments by their logical
      axes, scalars and the key replicated).
    batch_sharding: the batch's sharding (leading dimension over "data").
  """

  def __init__(self, jitted, init_jitted, *, abstract_state: TrainState,
               state_sharding: TrainState, mesh: Mesh, rules: partitioning.Rules,
               constrain_activations: bool, microbatches: int):
    super().__init__(jitted, mesh, rules, constrain_activations)
    self._init = ShardedFn(init_jitted, mesh, rules, constrain_activations)
    self.abstract_state = abstract_state
    self.state_sharding = state_sharding
    self.batch_sharding = partitioning.batch_sharding(mesh)
    self.microbatches = microbatches

  def init_state(self, rng: Any) -> TrainState:
    """A fresh TrainState, created on the devices with its shardings (int seed or key)."""
    return self._init(_seed_data(rng))

  def flops(self, state: TrainState, batch: Batch) -> Optional[float]:
    """FLOPs of one step on the global batch: XLA's cost analysis of the lowered step, before
    partitioning, so independent of the mesh. Re-traces (no compile); None if XLA gives none."""
    try:
      analysis = self.lower(state, batch).cost_analysis()
    except Exception as e:  # noqa: BLE001 - an estimate only; never stop training for it
      log.warning("no FLOP estimate from XLA (%s: %s)", type(e).__name__, e)
      return None
    if isinstance(analysis, (list, tuple)):
      analysis = analysis[0] if analysis else None
    if not analysis or "flops" not in analysis:
      return None
    return float(analysis["flops"])


def train_state_shardings(model: Any, abstract_state: TrainState, mesh: Mesh,
                          rules: partitioning.Rules) -> TrainState:
  """NamedShardings of a TrainState: params by logical axes, Adam moments like their params."""
  params_sharding = partitioning.param_shardings(model.logical_axes(), mesh, rules)
  whole = partitioning.replicated(mesh)
  return TrainState(
      step=whole, params=params_sharding,
      opt_state=partitioning.state_shardings(abstract_state.opt_state, abstract_state.params,
                                             params_sharding, mesh),
      rng=whole)


def _summarize_fn(model: Any, summarize_fn: Optional[Callable]) -> Callable:
  if summarize_fn is not None:
    return summarize_fn
  return getattr(model, "summarize", realm.summarize)


def make_train_step(model: Any, optimizer: optax.GradientTransformation, *, mesh: Mesh,
                    rules: partitioning.Rules = partitioning.DEFAULT_RULES,
                    microbatches: int = 1,
                    learning_rate_fn: Optional[optax.Schedule] = None,
                    summarize_fn: Optional[Callable[[dict], dict]] = None,
                    compiler_options: Optional[dict[str, Any]] = None,
                    constrain_activations: bool = False) -> TrainStep:
  """Builds the jitted, sharded train step.

  One step: dropout key `fold_in(state.rng, state.step)`, `compute_gradients`,
  `optimizer.update`; metrics `summarize_fn(aux)` (namespaced "train/..."), `train/grad_norm`
  (before clipping) and `train/grad_norm/<key>`, and `train/learning_rate` if a schedule is given.

  Args:
    optimizer: an optax transformation (e.g. `optim.bert_optimizer`); `update` gets params.
    mesh, rules: the device mesh (`partitioning.make_mesh`) and logical -> mesh axis rules.
    microbatches: gradient accumulation steps per update (see `compute_gradients`).
    learning_rate_fn: the optimizer's schedule, for `train/learning_rate`.
    summarize_fn: aux sums -> means; default `model.summarize`, else `realm.summarize`.
    compiler_options: XLA options for this step's compile (tests use a cheaper CPU build).
    constrain_activations: see `partitioning.mesh_context`.

  Returns a TrainStep: `state, metrics = step(state, batch)`, the state donated, the metrics
  replicated scalars.
  """
  if microbatches < 1:
    raise ValueError(f"microbatches={microbatches}; expected >= 1")
  summarize = _summarize_fn(model, summarize_fn)
  init = _init_fn(model, optimizer)
  abstract_state = jax.eval_shape(init, jax.ShapeDtypeStruct((2,), jnp.uint32))
  state_sharding = train_state_shardings(model, abstract_state, mesh, rules)
  whole = partitioning.replicated(mesh)

  def step_fn(state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    aux, grads = compute_gradients(model, state.params, batch, rng, microbatches=microbatches)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = _namespaced(summarize(aux))
    metrics.update(_grad_norms(grads))
    if learning_rate_fn is not None:
      metrics["train/learning_rate"] = jnp.asarray(learning_rate_fn(state.step), jnp.float32)
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                           rng=state.rng)
    return new_state, metrics

  jitted = jax.jit(step_fn, in_shardings=(state_sharding, partitioning.batch_sharding(mesh)),
                   out_shardings=(state_sharding, whole), donate_argnums=(0,),
                   compiler_options=compiler_options)
  init_jitted = jax.jit(init, in_shardings=whole, out_shardings=state_sharding,
                        compiler_options=compiler_options)
  return TrainStep(jitted, init_jitted, abstract_state=abstract_state,
                   state_sharding=state_sharding, mesh=mesh, rules=rules,
                   constrain_activations=constrain_activations, microbatches=microbatches)


def init_state(model: Any, optimizer: optax.GradientTransformation, rng: Any, mesh: Mesh,
               rules: partitioning.Rules = partitioning.DEFAULT_RULES) -> TrainState:
  """A fresh TrainState created directly with its shardings (`jax.eval_shape` first).

  Args:
    model, optimizer, mesh, rules: as `make_train_step`.
    rng: an int seed or a PRNG key; split into the parameter init key and the base dropout key.

  Returns:
    The TrainState at step 0.
  """
  return make_train_step(model, optimizer, mesh=mesh, rules=rules).init_state(rng)


def make_grad_fn(model: Any, *, mesh: Mesh,
                 rules: partitioning.Rules = partitioning.DEFAULT_RULES, microbatches: int = 1,
                 summarize_fn: Optional[Callable[[dict], dict]] = None,
                 compiler_options: Optional[dict[str, Any]] = None,
                 constrain_activations: bool = False) -> ShardedFn:
  """`metrics, aux, grads = fn(params, batch, rng)`: the step's gradients without the update.

  Same shardings and code as the train step (`compute_gradients`): for checking that meshes
  agree, and for diagnostics. `params` must be placed with the parameter shardings (or be
  host arrays); `batch` is the global batch; `grads` come back sharded like the parameters.
  """
  summarize = _summarize_fn(model, summarize_fn)
  params_sharding = partitioning.param_shardings(model.logical_axes(), mesh, rules)
  whole = partitioning.replicated(mesh)

  def grad_fn(params, batch, rng):
    aux, grads = compute_gradients(model, params, batch, rng, microbatches=microbatches)
    return _namespaced(summarize(aux)), aux, grads

  jitted = jax.jit(grad_fn,
                   in_shardings=(params_sharding, partitioning.batch_sharding(mesh), whole),
                   out_shardings=(whole, whole, params_sharding),
                   compiler_options=compiler_options)
  return ShardedFn(jitted, mesh, rules, constrain_activations)


def make_eval_fn(model: Any, batches: Union[Sequence[Batch], Callable[[], Iterable[Batch]]], *,
                 mesh: Mesh,
                 rules: partitioning.Rules = partitioning.DEFAULT_RULES,
                 summarize_fn: Optional[Callable[[dict], dict]] = None, prefix: str = "eval/",
                 compiler_options: Optional[dict[str, Any]] = None
                 ) -> Callable[[int, TrainState], dict[str, float]]:
  """An `eval_fn` for `train`: `model.eval_fn` over fixed batches, sums added, means once.

  Args:
    model: has `eval_fn(params, batch) -> aux` (sums).
    batches: host-local batches (the same on every call; all of one shape, so one compile),
      or a function giving them anew at every call (e.g. drawn with the current index).
    mesh, rules: as the train step.
    summarize_fn: aux sums -> means (default as `make_train_step`).
    prefix: prepended to every metric name ("eval/loss", "eval/retrieval/utility").

  Returns:
    `fn(step, state) -> {name: float}`.
  """
  summarize = _summarize_fn(model, summarize_fn)
  params_sharding = partitioning.param_shardings(model.logical_axes(), mesh, rules)
  jitted = ShardedFn(
      jax.jit(model.eval_fn, in_shardings=(params_sharding, partitioning.batch_sharding(mesh)),
              out_shardings=partitioning.replicated(mesh), compiler_options=compiler_options),
      mesh, rules, False)
  fixed = None if callable(batches) else list(batches)

  def eval_fn(step: int, state: TrainState) -> dict[str, float]:
    del step
    total = None
    for batch in (fixed if fixed is not None else batches()):
      aux = jitted(state.params, partitioning.shard_batch(device_batch(batch), mesh))
      total = aux if total is None else jax.tree.map(jnp.add, total, aux)
    means = jax.device_get(summarize(total))
    return {f"{prefix}{name}": float(value) for name, value in means.items()}

  return eval_fn


# ------------------------------------------------------------------------------------------
# Checkpoints of the train state.


def _gather_host_json(value: Any) -> list:
  """Every process's JSON-able `value`, in process order (a collective in multi-host runs)."""
  if jax.process_count() == 1:
    return [value]
  from jax.experimental import multihost_utils  # noqa: PLC0415

  encoded = np.frombuffer(json.dumps(value, sort_keys=True).encode(), np.uint8)
  lengths = multihost_utils.process_allgather(np.array([encoded.size], np.int32))
  longest = int(np.max(lengths))
  padded = np.zeros((longest,), np.uint8)
  padded[:encoded.size] = encoded
  gathered = np.asarray(multihost_utils.process_allgather(padded))
  return [json.loads(bytes(row[:int(n)]).decode())
          for row, n in zip(gathered, np.asarray(lengths).reshape(-1))]


def restore_train_state(run_dir: str, step: int, train_step: TrainStep, *,
                        config: Optional[RealmConfig] = None,
                        peft: Optional[checkpoints.PeftCheckpoints] = None
                        ) -> tuple[TrainState, Optional[dict], dict]:
  """Restores a TrainState (sharded like `train_step.state_sharding`) and the input position.

  Args:
    train_step: the step the state is for (gives the abstract state and shardings).
    config, peft: the run's model config and PEFT checkpointing (None: an ordinary run).

  Returns:
    (state, data_state, metadata): data_state is this process's input position (or None).

  Raises:
    checkpoints.CheckpointError: unreadable, another model size or PEFT method, or saved by a
      run with a different number of processes.
  """
  abstract = jax.tree.map(
      lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
      train_step.abstract_state, train_step.state_sharding)
  step_dir = checkpoints.checkpoint_path(run_dir, step)
  metadata = checkpoints.read_metadata(step_dir)
  for needed in (OPT_STATE_ITEM, TRAIN_STATE_ITEM):
    if needed not in metadata.get("extra_items", []):
      raise checkpoints.CheckpointError(
          f"{step_dir}: not a training checkpoint (no {needed!r} item; has "
          f"{metadata.get('extra_items', [])}); to start from its parameters, warm-start "
          f"instead of resuming")
  theirs = (metadata.get("peft") or {}).get("method", "none")
  ours = "none" if peft is None else peft.settings.get("method")
  if theirs != ours:
    raise checkpoints.CheckpointError(
        f"{step_dir}: saved by a run with peft={theirs!r}, this run has peft={ours!r}; resume "
        f"with the setting it was started with")
  targets = {checkpoints.PARAMS_ITEM: abstract.params, OPT_STATE_ITEM: abstract.opt_state,
             TRAIN_STATE_ITEM: {"step": abstract.step, "rng": abstract.rng}}
  has_data = DATA_STATE_ITEM in metadata.get("json_items", [])
  if has_data:
    targets[DATA_STATE_ITEM] = None
  items, _, metadata = checkpoints.restore_items(step_dir, targets, expected_config=config)
  state = TrainState(step=items[TRAIN_STATE_ITEM]["step"],
                     params=items[checkpoints.PARAMS_ITEM], opt_state=items[OPT_STATE_ITEM],
                     rng=items[TRAIN_STATE_ITEM]["rng"])
  data_state = None
  if has_data:
    saved = items[DATA_STATE_ITEM]
    hosts = saved.get("per_process", [])
    if len(hosts) != jax.process_count():
      raise checkpoints.CheckpointError(
          f"{step_dir}: the input position was saved by {len(hosts)} process(es) but this run "
          f"has {jax.process_count()}; resume with the same number of hosts")
    data_state = hosts[jax.process_index()]
  return state, data_state, metadata


def _set_aside_corrupt(run_dir: str, step: int, error: Exception) -> Optional[int]:
  """Moves a corrupt checkpoint to `<run_dir>/corrupt_checkpoints/<step>` (kept for a look,
  out of the way of the step's next save) and says which checkpoint the run resumes from
  instead; returns that step (None: none left, the run starts afresh)."""
  older = [s for s in checkpoints.list_checkpoint_steps(run_dir) if s < step]
  fallback = older[-1] if older else None
  if jax.process_index() == 0:
    aside = os.path.join(run_dir, checkpoints.CORRUPT_DIR, str(step))
    os.makedirs(os.path.dirname(aside), exist_ok=True)
    if os.path.exists(aside):
      aside += f".{int(time.time())}"
    os.rename(checkpoints.checkpoint_path(run_dir, step), aside)
    log.error("%s; moved it to %s; resuming from %s", error, aside,
              f"the newest intact checkpoint, step {fallback}" if fallback is not None
              else "nothing: no older checkpoint, starting from step 0")
  if jax.process_count() > 1:  # every host sees the same listing before going on
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(f"set aside corrupt checkpoint {step}")
  return fallback


def _save_train_state(writer: checkpoints.CheckpointWriter, state: TrainState, *,
                      data_state: dict, config: RealmConfig, metrics: Optional[dict],
                      extra_metadata: dict) -> None:
  hosts = _gather_host_json(data_state)
  writer.save(int(jax.device_get(state.step)), state.params, config=config,
              extra_state={OPT_STATE_ITEM: state.opt_state,
                           TRAIN_STATE_ITEM: {"step": state.step, "rng": state.rng}},
              json_state={DATA_STATE_ITEM: {"num_processes": len(hosts), "per_process": hosts}},
              metrics=metrics, extra_metadata=extra_metadata)


# ------------------------------------------------------------------------------------------
# The loop.


def _peak_flops(peak_flops_per_device: Optional[float]) -> Optional[float]:
  if peak_flops_per_device is not None:
    return float(peak_flops_per_device)
  kind = jax.devices()[0].device_kind.lower()
  for prefix in sorted(PEAK_FLOPS_PER_DEVICE, key=len, reverse=True):
    if kind.startswith(prefix):
      return PEAK_FLOPS_PER_DEVICE[prefix]
  return None


class _Interval:
  """Metrics of the steps since the last log line: means of the step metrics, last hook values,
  and the wall time of the steps that were not compiling."""

  def __init__(self):
    self.sums: dict[str, float] = {}
    self.count = 0
    self.latest: dict[str, float] = {}
    self.timed_steps = 0
    self.timed_seconds = 0.0

  def add(self, metrics: Mapping[str, float], hook_metrics: Mapping[str, Any],
          seconds: Optional[float]) -> None:
    for name, value in metrics.items():
      self.sums[name] = self.sums.get(name, 0.0) + float(value)
    self.count += 1
    self.latest.update({name: float(value) for name, value in hook_metrics.items()})
    if seconds is not None:
      self.timed_steps += 1
      self.timed_seconds += seconds

  def scalars(self) -> dict[str, float]:
    out = {name: total / self.count for name, total in self.sums.items()}
    out.update(self.latest)
    return out


class JsonlMetricWriter:
  """Metrics as JSON lines appended to a file, one `{"step", "time", name: value, ...}` object
  per write (`time`: seconds since the epoch): for machines without TensorFlow, which clu's
  TensorBoard writer imports, and for scripts that read a run's metrics back. `path` None
  writes nothing (the processes other than the first)."""

  def __init__(self, path: Optional[str]):
    self.path = path
    self._file = None
    if path is not None:
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
      # Line-buffered: a reader following the run sees each record as it is written; a
      # resumed run appends.
      self._file = open(path, "a", encoding="utf-8", buffering=1)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    if self._file is not None:
      record = {"step": int(step), "time": time.time(),
                **{name: float(value) for name, value in scalars.items()}}
      self._file.write(json.dumps(record) + "\n")

  def flush(self) -> None:
    if self._file is not None:
      self._file.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None


def make_metric_writer(run_dir: str, metrics_format: str = "tensorboard") -> Any:
  """The run's metric writer: "tensorboard" (clu: TensorBoard files in `<run_dir>/tensorboard`
  and the log on process 0, the log only elsewhere) or "jsonl" (`<run_dir>/metrics.jsonl`,
  written by process 0)."""
  if metrics_format == "jsonl":
    return JsonlMetricWriter(os.path.join(run_dir, METRICS_JSONL)
                             if jax.process_index() == 0 else None)
  if metrics_format != "tensorboard":
    raise ValueError(f"metrics_format must be one of {METRICS_FORMATS}, got {metrics_format!r}")
  # clu imports TensorFlow for its summary writer (seconds): only when it is used.
  from clu import metric_writers  # noqa: PLC0415
  return metric_writers.create_default_writer(
      os.path.join(run_dir, TENSORBOARD_DIR), just_logging=jax.process_index() > 0)


def train(model: Any, optimizer: optax.GradientTransformation, batches: BatchIterator, *,
          run_dir: str, num_steps: int, mesh: Mesh, config: RealmConfig,
          rules: partitioning.Rules = partitioning.DEFAULT_RULES,
          checkpoint_every: int = 1000, keep: Optional[int] = 3, writer: Any = None,
          log_every: int = 100, hooks: Sequence[Hook] = (),
          eval_fn: Optional[Callable[[int, TrainState], Mapping[str, float]]] = None,
          best_metric: Optional[str] = "eval/retrieval/utility", best_mode: str = "max",
          seed: int = 0, microbatches: int = 1,
          learning_rate_fn: Optional[optax.Schedule] = None,
          summarize_fn: Optional[Callable[[dict], dict]] = None,
          flops_per_example: Optional[float] = None,
          peak_flops_per_device: Optional[float] = None, async_checkpoints: bool = True,
          compiler_options: Optional[dict[str, Any]] = None,
          train_step: Optional[TrainStep] = None,
          peft: Optional[checkpoints.PeftCheckpoints] = None,
          checkpoint_timeout: Optional[float] = None) -> TrainState:
  """Trains to `num_steps` updates, resuming from the newest checkpoint in `run_dir`.

  Each step: the hooks, one sharded batch, the update; a NaN/inf loss or gradient norm raises
  NonFiniteLossError without saving that state. Metrics every `log_every` steps; `eval_fn` and
  an async checkpoint (with `batches.state()`) every `checkpoint_every` steps and at the end;
  then `TRAINING_DONE`. A resumed run computes exactly what an uninterrupted one would.

  Args (the others as `make_train_step`):
    batches: a BatchIterator of host-local batches.
    num_steps: total updates of the run, not of this invocation.
    config: saved with every checkpoint; one of another model size is a CheckpointError.
    keep: newest checkpoints kept (None: all), the best one besides.
    writer: a clu MetricWriter, or "tensorboard" / "jsonl" (`make_metric_writer`).
    hooks: `hook(step, state) -> dict | None` before each step (e.g. index swaps).
    eval_fn, best_metric, best_mode: eval at checkpoint steps; the best step in best.json.
    seed: init and dropout seed (a resumed run uses the checkpoint's key).
    flops_per_example, peak_flops_per_device: for perf/mfu (None: XLA's estimate, and
      PEAK_FLOPS_PER_DEVICE by device kind; no peak, no perf/mfu).
    train_step: a `make_train_step` result to reuse its compiled program.
    peft: checkpoints hold only the trained parameters (`checkpoints.PeftCheckpoints`).
    checkpoint_timeout: seconds a save may take before CheckpointSaveError (None: the default).

  Raises NonFiniteLossError, checkpoints.CheckpointError (cannot resume) or ValueError (the
  input ran out, bad arguments). Returns the final TrainState.
  """
  if num_steps < 1 or checkpoint_every < 1 or log_every < 1:
    raise ValueError(f"train: num_steps ({num_steps}), checkpoint_every ({checkpoint_every}) "
                     f"and log_every ({log_every}) must be >= 1")
  for method in ("state", "restore"):
    if not callable(getattr(batches, method, None)):
      raise TypeError(f"train: batches ({type(batches).__name__}) must have state() and "
                      f"restore(state) so a resumed run continues at the same input position")
  run_dir = os.path.abspath(os.fspath(run_dir))
  os.makedirs(run_dir, exist_ok=True)
  if train_step is None:
    train_step = make_train_step(model, optimizer, mesh=mesh, rules=rules,
                                 microbatches=microbatches, learning_rate_fn=learning_rate_fn,
                                 summarize_fn=summarize_fn, compiler_options=compiler_options)
  is_chief = jax.process_index() == 0
  extra_metadata = {"trainer": {
      "num_steps": int(num_steps), "seed": int(seed), "microbatches": train_step.microbatches,
      "mesh": {name: int(size) for name, size in mesh.shape.items()},
      "rules": [list(rule) for rule in train_step.rules], "num_processes": jax.process_count()}}

  latest, restored = checkpoints.latest_checkpoint_step(run_dir), None
  while latest is not None and restored is None:
    try:
      restored = restore_train_state(run_dir, latest, train_step, config=config, peft=peft)
    except checkpoints.CorruptCheckpointError as e:
      latest = _set_aside_corrupt(run_dir, latest, e)
  if latest is None:
    state = train_step.init_state(seed)
    start = 0
    log.info("%s: no checkpoint, starting from step 0 (seed %d)", run_dir, seed)
    if peft is not None:
      log.info("%s: the frozen parameters written as the base of its checkpoints: %s", run_dir,
               peft.save_base(state.params))
  else:
    state, data_state, _ = restored
    start = int(jax.device_get(state.step))
    if start != latest:
      raise checkpoints.CheckpointError(
          f"{checkpoints.checkpoint_path(run_dir, latest)}: holds step {start}, not {latest}")
    if data_state is None:
      log.warning("checkpoint %d has no input position; the input starts from its beginning",
                  latest)
    else:
      batches.restore(data_state)
    log.info("%s: resumed from checkpoint %d (input position %s)", run_dir, latest, data_state)
  if start >= num_steps:
    log.info("%s: already at step %d of %d; nothing to train", run_dir, start, num_steps)
    if is_chief:
      checkpoints.mark_training_done(run_dir)
    return state
  if is_chief and checkpoints.clear_training_done(run_dir):
    log.info("%s: removed %s: training continues to step %d", run_dir,
             checkpoints.TRAINING_DONE, num_steps)

  own_writer = writer is None or isinstance(writer, str)
  if own_writer:
    writer = make_metric_writer(run_dir, writer or "tensorboard")
  peak = _peak_flops(peak_flops_per_device)
  if peak is None:
    log.info("perf/mfu is not logged: no peak FLOP/s for device kind %r (pass "
             "peak_flops_per_device)", jax.devices()[0].device_kind)
  num_devices = mesh.devices.size
  saver = checkpoints.CheckpointWriter(
      run_dir, keep=keep, async_save=async_checkpoints,
      best_metric=best_metric if eval_fn else None, best_mode=best_mode, peft=peft,
      save_timeout=(checkpoints.DEFAULT_SAVE_TIMEOUT_SECONDS if checkpoint_timeout is None
                    else checkpoint_timeout))
  interval = _Interval()
  run_start = time.perf_counter()
  steps_timed, seconds_timed = 0, 0.0
  global_batch = None
  try:
    for step in range(start + 1, num_steps + 1):
      hook_metrics: dict[str, Any] = {}
      for hook in hooks:
        hook_metrics.update(hook(step, state) or {})
      try:
        host_batch = next(batches)
      except StopIteration:
        raise ValueError(f"train: the input ran out before step {step} of {num_steps} "
                         f"(input position {batches.state()})") from None
      batch = partitioning.shard_batch(device_batch(host_batch), mesh)
      if global_batch is None:
        global_batch = int(next(iter(batch.values())).shape[0])
        if peak is not None and flops_per_example is None:
          step_flops = train_step.flops(state, batch)
          if step_flops is not None:
            flops_per_example = step_flops / global_batch
            log.info("XLA estimates %.4g FLOPs per example for the train step",
                     flops_per_example)
      started = time.perf_counter()
      state, metrics = train_step(state, batch)
      metrics = {name: float(value) for name, value in jax.device_get(metrics).items()}
      seconds = time.perf_counter() - started
      # The first step of an invocation includes the compile: not a throughput sample.
      timed = seconds if step > start + 1 else None

      loss, grad_norm = metrics["train/loss"], metrics["train/grad_norm"]
      if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        saver.wait()
        last = checkpoints.latest_checkpoint_step(run_dir)
        where = ("no checkpoint was saved yet" if last is None else
                 f"the last good checkpoint is step {last} "
                 f"({checkpoints.checkpoint_path(run_dir, last)})")
        raise NonFiniteLossError(
            f"train: non-finite loss at step {step} (train/loss={loss}, "
            f"train/grad_norm={grad_norm}); stopped without saving this state; {where}; "
            f"restarting resumes from it and will meet the same batch again",
            step=step, last_checkpoint=last)

      interval.add(metrics, hook_metrics, timed)
      if timed is not None:
        steps_timed += 1
        seconds_timed += timed
      if step % log_every == 0 or step == num_steps:
        scalars = interval.scalars()
        if interval.timed_steps:
          examples_per_s = global_batch * interval.timed_steps / interval.timed_seconds
          scalars["perf/examples_per_s"] = examples_per_s
          scalars["perf/steps_per_s"] = interval.timed_steps / interval.timed_seconds
          if peak is not None and flops_per_example:
            scalars["perf/mfu"] = examples_per_s * flops_per_example / (peak * num_devices)
        if hasattr(batches, "metrics"):  # this host's input counts
          scalars.update({name: float(v) for name, v in batches.metrics().items()})
        writer.write_scalars(step, scalars)
        # The rate leaves out the steps that compiled, so the ETA is not thrown by them.
        rate = steps_timed / seconds_timed if seconds_timed > 0 else float("nan")
        log.info("%s", progress.line("step", step, num_steps, time.perf_counter() - run_start,
                                     unit="steps", rate=rate,
                                     extras=[f"train/loss {scalars['train/loss']:.5g}"]))
        interval = _Interval()

      if step % checkpoint_every == 0 or step == num_steps:
        eval_metrics = None
        if eval_fn is not None:
          eval_metrics = {name: float(value) for name, value in eval_fn(step, state).items()}
          writer.write_scalars(step, eval_metrics)
        _save_train_state(saver, state, data_state=batches.state(), config=config,
                          metrics=eval_metrics, extra_metadata=extra_metadata)
  finally:
    saver.close()
    writer.flush()
    if own_writer:
      writer.close()
  if is_chief:
    checkpoints.mark_training_done(run_dir)
  log.info("%s: trained to step %d in %s", run_dir, num_steps,
           progress.format_duration(time.perf_counter() - run_start))
  return state
