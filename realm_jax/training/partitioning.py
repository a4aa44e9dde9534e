"""Device mesh, logical-axis rules and the shardings of parameters, train state and batches.

Parameters and activations carry *logical* axis names (`batch`, `embed`, `heads`, `docs`, ...);
a table of rules (plain config, bound by gin) maps them onto a `("data", "model")` mesh:

    mesh = make_mesh(data=-1, model=1)                       # pure data parallelism
    shardings = param_shardings(model.logical_axes(), mesh, DEFAULT_RULES)

One CPU device is a 1x1 mesh, so tests run the production path. In a multi-host run each
process feeds its own slice of the global batch (`shard_batch`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = [
    "DATA_AXIS",
    "DEFAULT_RULES",
    "MESH_AXES",
    "MODEL_AXIS",
    "Rules",
    "batch_sharding",
    "make_mesh",
    "mesh_context",
    "param_shardings",
    "replicated",
    "shard_batch",
    "state_shardings",
]

DATA_AXIS = "data"
MODEL_AXIS = "model"
MESH_AXES = (DATA_AXIS, MODEL_AXIS)

# (logical axis, mesh axis or None) pairs; the first rule naming a logical axis wins (flax).
Rules = Sequence[tuple[str, Optional[str | tuple[str, ...]]]]

# Megatron-style: heads, feed-forward width and vocabulary split over "model", `embed` replicated
# (LayerNorm needs no communication); batch and index rows (`docs`) over "data".
DEFAULT_RULES: tuple[tuple[str, Optional[str]], ...] = (
    ("batch", DATA_AXIS),
    ("candidates", None),
    ("length", None),
    ("embed", None),
    ("mlp", MODEL_AXIS),
    ("heads", MODEL_AXIS),
    ("kv", None),
    ("vocab", MODEL_AXIS),
    ("proj", None),
    ("docs", DATA_AXIS),
)


def make_mesh(data: int = -1, model: int = 1,
              devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """Returns a `("data", "model")` mesh over `devices` (default: every device of every process).

  Args:
    data: size of the data-parallel axis; -1 takes all devices `model` leaves.
    model: size of the model-parallel axis; -1 takes all devices `data` leaves.
    devices: the devices, in order (default `jax.devices()`, process 0's first).

  Returns:
    A Mesh of shape `(data, model)` with automatic (GSPMD) axis types.

  Raises:
    ValueError: when the sizes do not multiply to the number of devices, or both are -1.
  """
  devices = list(jax.devices() if devices is None else devices)
  count = len(devices)
  if data == -1 and model == -1:
    raise ValueError("make_mesh: at most one of data and model may be -1")
  for name, size in (("data", data), ("model", model)):
    if size != -1 and (not isinstance(size, (int, np.integer)) or size < 1):
      raise ValueError(f"make_mesh: {name}={size!r}; expected a positive int or -1")
  if data == -1:
    if count % model:
      raise ValueError(f"make_mesh: model={model} does not divide the {count} devices")
    data = count // model
  elif model == -1:
    if count % data:
      raise ValueError(f"make_mesh: data={data} does not divide the {count} devices")
    model = count // data
  if data * model != count:
    raise ValueError(f"make_mesh: data x model = {data} x {model} = {data * model} but there "
                     f"are {count} devices; use data=-1 to take the rest")
  grid = np.asarray(devices, dtype=object).reshape(data, model)
  auto = jax.sharding.AxisType.Auto
  return Mesh(grid, MESH_AXES, axis_types=(auto, auto))


@contextlib.contextmanager
def mesh_context(mesh: Mesh, rules: Rules, *,
                 constrain_activations: bool = False) -> Iterator[None]:
  """Makes `rules` (and optionally `mesh`) current while a step is traced.

  `constrain_activations` also sets `mesh` as the global mesh, which turns the model's activation
  constraints on; off by default, since flax's `DenseGeneral` then fails to trace BERT's
  attention (google/flax#3676). The jitted step's explicit shardings apply either way.
  """
  with contextlib.ExitStack() as stack:
    if constrain_activations:
      stack.enter_context(jax.set_mesh(mesh))
    stack.enter_context(nn.logical_axis_rules(tuple(rules)))
    yield


def replicated(mesh: Mesh) -> NamedSharding:
  """A sharding that keeps a full copy on every device (scalars, RNG keys, the step)."""
  return NamedSharding(mesh, PartitionSpec())


def param_shardings(logical_axes: Any, mesh: Mesh, rules: Rules) -> Any:
  """NamedShardings for a parameter tree from its logical axis names.

  Args:
    logical_axes: tree of `PartitionSpec`s of logical names (a model's `logical_axes()`).
    mesh: the device mesh.
    rules: logical -> mesh axis rules (e.g. DEFAULT_RULES).

  Returns:
    The same tree with `NamedSharding` leaves. Logical names without a rule are replicated.
  """
  return nn.logical_to_mesh_sharding(logical_axes, mesh, tuple(rules))


def _matches_params(node: Any, params_treedef: Any) -> bool:
  try:
    return jax.tree.structure(node) == params_treedef
  except Exception:  # noqa: BLE001 - odd leaves just do not match
    return False


def state_shardings(abstract_tree: Any, abstract_params: Any, params_sharding: Any,
                    mesh: Mesh) -> Any:
  """Shardings for a tree that contains copies of the parameter tree (e.g. an optimizer state):
  every subtree shaped like the parameters (Adam's `mu`, `nu`) is sharded like them, every other
  leaf replicated, however an optax chain nests its states.

  Args:
    abstract_tree: the tree to shard (arrays or `jax.ShapeDtypeStruct`s).
    abstract_params: the parameter tree (same structure as `params_sharding`).
    params_sharding: NamedShardings for the parameters.
    mesh: the mesh (for the replicated leaves).

  Returns:
    A tree of NamedShardings with the structure of `abstract_tree`.
  """
  params_treedef = jax.tree.structure(abstract_params)
  whole = replicated(mesh)

  def assign(node):
    if _matches_params(node, params_treedef):
      return params_sharding
    return jax.tree.map(lambda _: whole, node)

  return jax.tree.map(assign, abstract_tree,
                      is_leaf=lambda node: _matches_params(node, params_treedef))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (example) dimension over "data", everything else replicated across "model"."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def _data_shards_per_process(mesh: Mesh) -> int:
  """How many distinct slices of the data axis one process's devices hold."""
  index = jax.process_index()
  rows = {r for r in range(mesh.devices.shape[0])
          if any(d.process_index == index for d in mesh.devices[r])}
  return len(rows)


def shard_batch(batch: Mapping[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
  """Builds the global, data-sharded batch from this process's part of it (the whole batch in
  a single process; its own contiguous slice in a multi-host run).

  Args:
    batch: {name: array [local_batch, ...]} host arrays (NumPy); every leading dimension equal.
    mesh: the mesh; the leading dimension is split over its "data" axis.

  Returns:
    {name: jax.Array [global_batch, ...]} sharded with `batch_sharding(mesh)`.

  Raises:
    ValueError: when the leading dimensions differ or do not split evenly over the devices.
  """
  sizes = {name: np.shape(value)[0] if np.ndim(value) else None for name, value in batch.items()}
  if None in sizes.values() or len(set(sizes.values())) != 1:
    raise ValueError(f"shard_batch: every feature needs the same leading (batch) dimension; "
                     f"got {sizes}")
  local = next(iter(sizes.values()))
  shards = _data_shards_per_process(mesh)
  if local % shards:
    raise ValueError(f"shard_batch: this process's batch of {local} examples does not split "
                     f"over its {shards} slices of the data axis")
  data_size = mesh.shape[DATA_AXIS]
  global_size = local * data_size // shards
  sharding = batch_sharding(mesh)
  out = {}
  for name, value in batch.items():
    value = np.asarray(value)
    out[name] = jax.make_array_from_process_local_data(
        sharding, value, (global_size,) + value.shape[1:])
  return out


