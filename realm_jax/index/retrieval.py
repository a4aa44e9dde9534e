"""Retrieval from a published index with the query tower of the index's own checkpoint.

REALM_SPEC 21: an index is one snapshot, searched with its own checkpoint's query tower, never
the live trainer's. `IndexRetriever` holds (index step, that tower, a searcher);
`make_index_loader` is `IndexWatcher`'s `load_fn`, which swaps them at step boundaries:

    watcher = IndexWatcher(run_dir, load_fn=make_index_loader(run_dir, config),
                           block_store_id=store.store_id, dim=config.proj_size)
    watcher.start()
    batches = PretrainingBatches(masked, store, retriever=watcher)  # watcher.current per batch
    for step in range(start_step, num_steps):
      watcher.maybe_swap(step)          # the step boundary: maybe a newer snapshot
      batch = next(batches)

Open-QA fine-tuning searches with the live question tower (`IndexRetriever.set_query_params`).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, Mapping, Optional, Protocol

import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from realm_jax.index import search as search_lib
from realm_jax.index import store as store_lib
from realm_jax.models.config import RealmConfig
from realm_jax.models.retriever import RealmRetriever
from realm_jax.models import realm as realm_lib
from realm_jax.models import retriever as retriever_lib
from realm_jax import checkpoints as ckpt_lib

log = logging.getLogger(__name__)

# The default number of blocks a search returns per query: REALM's candidates per masked query.
DEFAULT_K = 8


class Retriever(Protocol):
  """What `PretrainingBatches` retrieves with: one index snapshot and its query tower.

  Attributes:
    step: the checkpoint step of the index (recorded in every batch it chose candidates for).
  """

  step: int

  def retrieve(self, query_ids: np.ndarray, query_mask: np.ndarray, *,
               k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores float32 [B, k], block ids int32 [B, k]), best first, for [B, query_len] queries."""


class FunctionRetriever:
  """A `Retriever` from a plain function (tests, or a custom search)."""

  def __init__(self, step: int, fn: Callable[..., tuple[np.ndarray, np.ndarray]], *,
               block_store_id: Optional[str] = None):
    """Args: step: the index step; fn: `fn(query_ids, query_mask, k) -> (scores, ids)`;
    block_store_id: the BlockStore the ids index (checked by PretrainingBatches if given)."""
    self.step = int(step)
    self.block_store_id = block_store_id
    self._fn = fn

  def retrieve(self, query_ids, query_mask, *, k: int = DEFAULT_K):
    return self._fn(query_ids, query_mask, k)


def query_tower_params(params: Mapping[str, Any], config: RealmConfig) -> dict:
  """The retriever params `embed_queries` needs: {"embedder": ...} (tied) or {"query_embedder":
  ...} (untied), from any layout `builder.document_tower_params` accepts. The untied document
  tower is left out, so an index holds one tower on the devices, not two.
  """
  name, tower = retriever_lib.tower_params(params, config, "query")
  return {name: tower}


def local_query_mesh() -> Mesh:
  """A 1-D mesh named "docs" over this host's devices: where an index lives by default.

  Process-local on purpose: each host holds the whole index (sharded over its own devices) and
  searches its own queries, so the input pipeline never needs another host.
  """
  return Mesh(np.asarray(jax.local_devices()), ("docs",))


@functools.lru_cache(maxsize=8)
def _embed_queries_fn(config: RealmConfig, mesh: Mesh, axis: str) -> Callable:
  """The jitted query tower for one (config, mesh); cached so every new index reuses one
  compilation (the params are arguments, not constants)."""
  module = RealmRetriever(config)
  batch_sharding = NamedSharding(mesh, P(axis, None))

  def embed(tower_params, query_ids, query_mask):
    # [B, query_len] -> [B, proj] float32, eval mode: the index was built without dropout too.
    emb = module.apply({"params": tower_params}, query_ids, jnp.zeros_like(query_ids),
                       query_mask, deterministic=True, method=RealmRetriever.embed_queries)
    return emb.astype(jnp.float32)

  return jax.jit(embed, in_shardings=(NamedSharding(mesh, P()), batch_sharding, batch_sharding),
                 out_shardings=NamedSharding(mesh, P()))


class IndexRetriever:
  """One index snapshot: its step, its checkpoint's query tower and a searcher (REALM_SPEC 21).

  Queries are embedded with the jitted `RealmRetriever.embed_queries` of the params the index's
  documents were embedded with (never the live trainer params), batch-sharded over the mesh,
  then searched for the top k by inner product. Attributes: `step`, `index` (the LoadedIndex),
  `block_store_id`, `searcher` (`ExactSearcher` by default), `mesh`.
  """

  def __init__(self, loaded_index: store_lib.LoadedIndex, query_params: Mapping[str, Any],
               config: RealmConfig, *, mesh: Optional[Mesh] = None, backend: str = "exact",
               searcher: Any = None, **searcher_kwargs):
    """Places the query tower and the index on the devices.

    Args:
      query_params: the retriever params of the checkpoint the index was built from (any
        layout `query_tower_params` accepts).
      mesh: a 1-D mesh for the query tower and the exact searcher; default `local_query_mesh`.
      backend: "exact" or "scann" (`search.make_searcher`; ScaNN loads the index's artifacts).
      searcher: use this searcher instead of building one.
      **searcher_kwargs: passed to the searcher (e.g. query_batch_size, precision).
    """
    if loaded_index.dim != config.proj_size:
      raise ValueError(f"{loaded_index.path}: index embeddings have dim {loaded_index.dim} but "
                       f"the model projects to proj_size={config.proj_size}")
    self.index = loaded_index
    self.step = int(loaded_index.step)
    self.block_store_id = loaded_index.block_store_id
    self.config = config
    self.mesh = mesh if mesh is not None else local_query_mesh()
    if len(self.mesh.axis_names) != 1:
      raise ValueError(f"IndexRetriever needs a 1-D mesh, got axes {self.mesh.axis_names}")
    self._axis = self.mesh.axis_names[0]
    self.set_query_params(query_params)
    if searcher is None:
      if backend == "exact":
        searcher_kwargs = {"mesh": self.mesh, "docs_axis": self._axis, **searcher_kwargs}
      searcher = search_lib.make_searcher(
          backend, loaded_index.embeddings,
          artifacts_dir=loaded_index.scann_dir if backend == "scann" else None,
          **searcher_kwargs)
    self.searcher = searcher
    self._embed = _embed_queries_fn(config, self.mesh, self._axis)

  @property
  def block_emb(self) -> Any:
    """The index embeddings [num_blocks(+padding), proj]: the searcher's device copy when it
    has one (exact search), else the loaded matrix."""
    emb = getattr(self.searcher, "embeddings", None)
    return self.index.embeddings if emb is None else emb

  def set_query_params(self, query_params: Mapping[str, Any],
                       config: Optional[RealmConfig] = None) -> None:
    """Searches with another query tower from now on (open-QA fine-tuning retrieves with the
    live question tower; any layout `query_tower_params` accepts), of `config` when given (a
    PEFT run's tower has adapters the index's own has not)."""
    if config is not None and config != self.config:
      self.config = config
      self._embed = _embed_queries_fn(config, self.mesh, self._axis)
    tower = query_tower_params(query_params, self.config)
    self._params = jax.device_put(tower, NamedSharding(self.mesh, P()))

  def embed_queries(self, query_ids, query_mask) -> np.ndarray:
    """Query embeddings of this snapshot's query tower.

    Args:
      query_ids, query_mask: int [B, query_len] `[CLS] q [SEP]` and its mask.

    Returns:
      float32 [B, proj].
    """
    query_ids = np.asarray(query_ids, np.int32)  # [B, query_len]
    query_mask = np.asarray(query_mask, np.int32)  # [B, query_len]
    batch_size = query_ids.shape[0]
    if batch_size == 0:
      return np.zeros([0, self.config.proj_size], np.float32)
    # Pad to a multiple of the devices so the batch shards evenly; the padding repeats the first
    # query (a well-formed input) and its rows are dropped.
    num_devices = self.mesh.devices.size
    pad = -batch_size % num_devices
    if pad:
      query_ids = np.concatenate([query_ids, np.repeat(query_ids[:1], pad, axis=0)])
      query_mask = np.concatenate([query_mask, np.repeat(query_mask[:1], pad, axis=0)])
    emb = self._embed(self._params, query_ids, query_mask)  # [B + pad, proj]
    return np.asarray(emb)[:batch_size]

  def retrieve(self, query_ids, query_mask, *,
               k: int = DEFAULT_K) -> tuple[np.ndarray, np.ndarray]:
    """Top-k blocks of the index for each query.

    Returns:
      (scores float32 [B, k], ids int32 [B, k]), best first (ties: lower id first with exact
      search).
    """
    return self.searcher.search(self.embed_queries(query_ids, query_mask), k)


def index_checkpoint_dir(run_dir: str, loaded_index: store_lib.LoadedIndex, *,
                         first_checkpoint_dir: Optional[str] = None) -> str:
  """The checkpoint step directory whose parameters built an index: the manifest's "checkpoint"
  when it exists (REALM_SPEC 22: the ICT run's for the first index); else `first_checkpoint_dir`
  for step 0 (moved run directories); else `<run_dir>/checkpoints/<index step>`.
  CheckpointError when none exists.
  """
  recorded = str(loaded_index.manifest.get("checkpoint") or "")
  tried = []
  if recorded:
    if os.path.isdir(recorded):
      return recorded
    tried.append(f"the manifest's checkpoint {recorded}")
  if first_checkpoint_dir is not None and loaded_index.step == store_lib.FIRST_INDEX_STEP:
    if os.path.isdir(first_checkpoint_dir):
      return os.path.abspath(first_checkpoint_dir)
    tried.append(f"first_checkpoint_dir {first_checkpoint_dir}")
  own = ckpt_lib.checkpoint_path(run_dir, loaded_index.step)
  if os.path.isdir(own):
    return own
  tried.append(own)
  raise ckpt_lib.CheckpointError(
      f"{loaded_index.path}: cannot find the checkpoint the index was built from (tried "
      f"{'; '.join(tried)}); its query tower is needed to search it (REALM_SPEC 21)")


def index_query_tower(loaded_index: store_lib.LoadedIndex, config: RealmConfig
                      ) -> Optional[dict]:
  """The query tower the index was published with (`store.QUERY_TOWER`, written by the
  builder), as `query_tower_params` returns it; None for an index without one (published
  before indexes carried it).

  Raises:
    CheckpointError: unreadable, or not of this model's shapes.
  """
  if store_lib.QUERY_TOWER not in (loaded_index.manifest.get("files") or {}):
    return None
  path = os.path.join(loaded_index.path, store_lib.QUERY_TOWER)
  try:
    with open(path, "rb") as f:
      tower = flax.serialization.msgpack_restore(f.read())
  except (OSError, ValueError) as e:
    raise ckpt_lib.CheckpointError(f"{path}: unreadable ({e})") from e
  # The shapes this model's query tower has (traced only, nothing allocated).
  expected = query_tower_params(nn.unbox(jax.eval_shape(
      lambda: realm_lib.init_retriever_params(config, jax.random.PRNGKey(0)))), config)
  want = {jax.tree_util.keystr(p): leaf.shape
          for p, leaf in jax.tree_util.tree_leaves_with_path(expected)}
  have = ({jax.tree_util.keystr(p): np.shape(leaf)
           for p, leaf in jax.tree_util.tree_leaves_with_path(tower)}
          if isinstance(tower, Mapping) else {})
  if have != want:
    differ = sorted(set(want) ^ set(have)) or sorted(k for k in want if want[k] != have[k])
    first = differ[0]
    raise ckpt_lib.CheckpointError(
        f"{path}: a query tower of another model (first difference: {first} is "
        f"{have.get(first, 'missing')}, this model's {want.get(first, 'absent')})")
  return tower


def make_index_loader(run_dir: str, config: RealmConfig, *, mesh: Optional[Mesh] = None,
                      first_checkpoint_dir: Optional[str] = None, backend: str = "exact",
                      **searcher_kwargs) -> Callable[[store_lib.LoadedIndex], IndexRetriever]:
  """The `load_fn` for `IndexWatcher`: `load_fn(loaded_index) -> IndexRetriever`.

  The query tower is the one published with the index (`index_query_tower`); for an index
  without one, that of the checkpoint it was built from (`index_checkpoint_dir`), checked to be
  this run's model size and the step the builder recorded. Runs on the watcher's background
  thread; a failure is logged by the watcher, which keeps the index it has. `config` is this
  run's model config; `first_checkpoint_dir` the ICT warm start's, for index step 0.
  """

  def load(loaded: store_lib.LoadedIndex) -> IndexRetriever:
    tower = index_query_tower(loaded, config)
    if tower is not None:
      log.info("index %d: query tower published with it (%s)", loaded.step,
               loaded.manifest.get("checkpoint") or "checkpoint not recorded")
      return IndexRetriever(loaded, tower, config, mesh=mesh, backend=backend, **searcher_kwargs)
    step_dir = index_checkpoint_dir(run_dir, loaded, first_checkpoint_dir=first_checkpoint_dir)
    params, _, metadata = ckpt_lib.restore_checkpoint_dir(step_dir, expected_config=config)
    recorded_step = (loaded.manifest.get("extra") or {}).get("checkpoint_step")
    if recorded_step is not None and int(metadata["step"]) != int(recorded_step):
      raise ckpt_lib.CheckpointError(
          f"{loaded.path}: built from checkpoint step {recorded_step}, but {step_dir} holds "
          f"step {metadata['step']}; its query tower would not match the index (REALM_SPEC 21)")
    if "retriever" not in params:
      raise ckpt_lib.CheckpointError(f"{step_dir}: no retriever params (has {sorted(params)})")
    log.info("index %d: query tower from %s", loaded.step, step_dir)
    return IndexRetriever(loaded, params["retriever"], config, mesh=mesh, backend=backend,
                          **searcher_kwargs)

  return load

