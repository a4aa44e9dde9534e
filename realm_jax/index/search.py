"""Maximum inner product search over the block embeddings: one interface, two backends.

REALM retrieves the top-k blocks by the inner product of a query embedding with every block
embedding (REALM_SPEC 23). Both backends answer
`searcher.search(queries, k) -> (scores [num_queries, k] float32, ids [num_queries, k] int32)`:
"exact" (`ExactSearcher`: a sharded matmul + top-k on the accelerator, as the authors' release)
and "scann" (`ScannSearcher`: ORQA's ScaNN tree + asymmetric hashing on the host, serialized
next to the index). Ties resolve to the lower document id in the exact backend; ScaNN makes no
such promise. `make_searcher` picks a backend by name; ScaNN (and TensorFlow) is imported only
when used. More: docs/design/data_index_batches.md.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

# Written by `build_scann_artifacts` next to ScaNN's own files: the parameters used and the
# matrix shape, so a loader can check them against the index it belongs to.
SCANN_PARAMS_FILE = "realm_scann_params.json"

_ORQA_NUM_LEAVES = 1000  # language/orqa: tree(num_leaves=1000, num_leaves_to_search=100)
_ORQA_LEAVES_SEARCHED_FRACTION = 10  # 1000 / 100


def _check_queries(queries: Any, dim: int) -> np.ndarray | jax.Array:
  """Validates a [num_queries, dim] query matrix; returns it as an array (JAX arrays kept)."""
  if not isinstance(queries, (np.ndarray, jax.Array)):
    queries = np.asarray(queries, dtype=np.float32)
  if queries.ndim != 2:
    raise ValueError(f"queries must be a [num_queries, dim] matrix; got shape {queries.shape}.")
  if queries.shape[1] != dim:
    raise ValueError(f"queries have dim {queries.shape[1]} but the index embeddings have dim "
                     f"{dim}; the question and block encoders must project to the same size.")
  return queries


def _check_k(k: int, num_docs: int) -> int:
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f"k must be a positive integer; got {k!r}.")
  if k > num_docs:
    raise ValueError(f"k={k} is larger than the number of documents in the index ({num_docs}).")
  return int(k)


def _to_float_matrix(embeddings: Any) -> np.ndarray | jax.Array:
  """Checks a [num_docs, dim] embedding matrix; float32 and bfloat16 are kept, other floats
  become float32."""
  if not hasattr(embeddings, "dtype"):
    embeddings = np.asarray(embeddings)
  if embeddings.ndim != 2:
    raise ValueError(f"embeddings must be a [num_docs, dim] matrix; got shape {embeddings.shape}.")
  if embeddings.shape[0] < 1 or embeddings.shape[1] < 1:
    raise ValueError(f"embeddings must be non-empty; got shape {embeddings.shape}.")
  dtype = jnp.dtype(embeddings.dtype)
  if dtype in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
    return embeddings
  if jnp.issubdtype(dtype, jnp.floating):
    return embeddings.astype(jnp.float32)
  raise ValueError(f"embeddings must be float32 or bfloat16; got {dtype}.")


def _next_power_of_two(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


class ExactSearcher:
  """Exact top-k inner-product search, the embedding matrix sharded over a mesh axis.

  The [num_docs, dim] matrix is padded and split along the documents over `mesh.shape[docs_axis]`
  shards; each shard scores a replicated query batch in float32, keeps its local top-k, and a
  top-k over the all-gathered candidates gives the answer (on every process, SPMD). Equal scores
  resolve to the lower document id, on 1 device or N shards. Device memory: the shard plus
  `query_batch_size * shard_docs * 4` bytes of scores. Queries are cast to the embedding dtype.
  """

  def __init__(self, embeddings: Any, *, mesh: Mesh | None = None, docs_axis: str = "docs",
               query_batch_size: int = 512, precision: str | None = "highest"):
    """Places the embedding matrix on the mesh.

    Args:
      embeddings: [num_docs, dim] NumPy or JAX array, float32 or bfloat16 (other floats: float32).
      mesh: the devices to shard over; default all local devices in one axis named `docs_axis`.
      query_batch_size: queries scored per step; fewer queries use the next power of two, so
        small calls stay cheap and compile a bounded number of times.
      precision: the einsum's; "highest" keeps float32 scores exact on TPU and GPU (TF32),
        "default" is faster there. No effect for bfloat16 embeddings or on CPU.
    """
    embeddings = _to_float_matrix(embeddings)
    if mesh is None:
      mesh = Mesh(np.asarray(jax.local_devices()), (docs_axis,))
    if docs_axis not in mesh.axis_names:
      raise ValueError(f"mesh has axes {mesh.axis_names}; no axis named {docs_axis!r}.")
    if query_batch_size < 1:
      raise ValueError(f"query_batch_size must be positive; got {query_batch_size}.")
    self.mesh = mesh
    self.docs_axis = docs_axis
    self.query_batch_size = int(query_batch_size)
    self.precision = precision
    self.num_docs, self.dim = (int(s) for s in embeddings.shape)
    self.dtype = jnp.dtype(embeddings.dtype)
    self.num_shards = int(mesh.shape[docs_axis])
    self.shard_docs = -(-self.num_docs // self.num_shards)  # ceil
    self.padded_docs = self.shard_docs * self.num_shards
    self._doc_sharding = NamedSharding(mesh, P(docs_axis, None))
    self.query_sharding = NamedSharding(mesh, P())  # query batches: on every device
    self.embeddings = self._place(embeddings)  # [padded_docs, dim], sharded along docs
    self._search_fns: dict[int, Callable] = {}

  @classmethod
  def create(cls, embeddings: Any, *, artifacts_dir: str | None = None, **kwargs) -> ExactSearcher:
    """Registry constructor; exact search has no artifacts, so `artifacts_dir` is ignored."""
    del artifacts_dir
    return cls(embeddings, **kwargs)

  def _place(self, embeddings: Any) -> jax.Array:
    """Pads to `padded_docs` rows and shards along the documents without a full host copy."""
    pad = self.padded_docs - self.num_docs
    if isinstance(embeddings, jax.Array):
      # Already on devices: pad and reshard there instead of round-tripping through the host.
      return jax.jit(lambda x: jnp.pad(x, ((0, pad), (0, 0))),
                     out_shardings=self._doc_sharding)(embeddings)
    embeddings = np.asarray(embeddings)

    def shard(index: tuple[slice, ...]) -> np.ndarray:
      rows = index[0]
      start, stop = rows.start or 0, self.padded_docs if rows.stop is None else rows.stop
      block = embeddings[min(start, self.num_docs):min(stop, self.num_docs)]  # [<=rows, dim]
      if block.shape[0] < stop - start:
        # Padding rows: zeros here, masked to -inf scores in the search (0 * -inf would be NaN).
        block = np.concatenate(
            [block, np.zeros((stop - start - block.shape[0], self.dim), embeddings.dtype)])
      return np.ascontiguousarray(block)

    return jax.make_array_from_callback((self.padded_docs, self.dim), self._doc_sharding, shard)

  def _search_fn(self, k: int) -> Callable:
    """The jitted sharded search for one k (jit caches one executable per batch shape)."""
    if k in self._search_fns:
      return self._search_fns[k]
    num_docs, shard_docs, docs_axis = self.num_docs, self.shard_docs, self.docs_axis
    # A shard may hold fewer than k documents (tiny corpora over many devices); the merge still
    # sees num_shards * local_k >= num_docs >= k candidates.
    local_k = min(k, shard_docs)
    precision = self.precision

    def per_shard(queries, shard):
      # queries: [batch, dim] (replicated); shard: [shard_docs, dim] (this device's documents).
      first_id = jax.lax.axis_index(docs_axis) * shard_docs
      scores = jnp.einsum("qd,nd->qn", queries.astype(shard.dtype), shard,
                          preferred_element_type=jnp.float32,
                          precision=precision)  # [batch, shard_docs]
      doc_ids = first_id + jnp.arange(shard_docs, dtype=jnp.int32)  # [shard_docs]
      scores = jnp.where(doc_ids[None, :] < num_docs, scores, -jnp.inf)  # padding never wins
      local_scores, local_idx = jax.lax.top_k(scores, local_k)  # [batch, local_k]
      local_ids = local_idx.astype(jnp.int32) + first_id  # [batch, local_k] global ids
      # Shards are concatenated in shard order = id order, which keeps the tie rule (the lower
      # id among equal scores: top_k keeps the lower index first).
      # to="invarying": every device holds the same candidates, so the result is replicated.
      cand_scores = jax.lax.all_gather(local_scores, docs_axis, axis=1, tiled=True, to="invarying")
      cand_ids = jax.lax.all_gather(local_ids, docs_axis, axis=1, tiled=True, to="invarying")
      # cand_*: [batch, num_shards * local_k]
      top_scores, pos = jax.lax.top_k(cand_scores, k)  # [batch, k]
      top_ids = jnp.take_along_axis(cand_ids, pos, axis=1)  # [batch, k]
      return top_scores, top_ids

    sharded = jax.shard_map(per_shard, mesh=self.mesh,
                            in_specs=(P(), P(docs_axis, None)), out_specs=(P(), P()))
    fn = jax.jit(sharded, in_shardings=(self.query_sharding, self._doc_sharding),
                 out_shardings=(self.query_sharding, self.query_sharding))
    self._search_fns[k] = fn
    return fn

  def batch_size_for(self, num_queries: int) -> int:
    """The padded batch size used for a call with `num_queries` queries."""
    return min(self.query_batch_size, _next_power_of_two(num_queries))

  def search(self, queries: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k documents by inner product for each query ([num_queries, dim], 1 <= k <= num_docs).

    Returns:
      (scores [num_queries, k] float32, ids [num_queries, k] int32) as NumPy, best first; equal
      scores are ordered by ascending id.
    """
    queries = _check_queries(queries, self.dim)
    k = _check_k(k, self.num_docs)
    num_queries = int(queries.shape[0])
    if num_queries == 0:
      return np.zeros((0, k), np.float32), np.zeros((0, k), np.int32)
    fn = self._search_fn(k)
    batch = self.batch_size_for(num_queries)
    outputs = []
    # Dispatch every batch before reading any back: JAX runs them asynchronously, so host-side
    # slicing/padding of the next batch overlaps the device work of the previous one.
    for start in range(0, num_queries, batch):
      chunk = queries[start:start + batch]  # [<=batch, dim]
      if chunk.shape[0] < batch:
        pad = ((0, batch - chunk.shape[0]), (0, 0))
        chunk = jnp.pad(chunk, pad) if isinstance(chunk, jax.Array) else np.pad(chunk, pad)
      outputs.append(fn(chunk, self.embeddings))
    scores = np.concatenate([np.asarray(s) for s, _ in outputs])[:num_queries]  # [num_queries, k]
    ids = np.concatenate([np.asarray(i) for _, i in outputs])[:num_queries]  # [num_queries, k]
    return scores.astype(np.float32, copy=False), ids.astype(np.int32, copy=False)


def _import_scann():
  """ScaNN pulls in TensorFlow (seconds, GBs of address space): import it only when needed."""
  try:
    from scann.scann_ops.py import scann_ops_pybind  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("The 'scann' search backend needs the scann package (scann 1.4.2 is built "
                      "against tensorflow 2.20.x): pip install scann==1.4.2 "
                      "tensorflow==2.20.*") from e
  return scann_ops_pybind


def default_scann_params(num_docs: int, *, num_leaves: int | None = None,
                         num_leaves_to_search: int | None = None) -> tuple[int, int]:
  """ORQA's tree sizes (1000 leaves, 100 searched), capped for small corpora: a leaf needs enough
  points for k-means (ScaNN's min partition size is 50), so min(1000, sqrt(num_docs)) leaves, a
  tenth of them searched. Returns (num_leaves, num_leaves_to_search).
  """
  if num_leaves is None:
    num_leaves = min(_ORQA_NUM_LEAVES, max(1, int(math.sqrt(num_docs))))
  if num_leaves_to_search is None:
    num_leaves_to_search = max(1, num_leaves // _ORQA_LEAVES_SEARCHED_FRACTION)
  if not 1 <= num_leaves_to_search <= num_leaves:
    raise ValueError(f"num_leaves_to_search={num_leaves_to_search} must be in [1, num_leaves="
                     f"{num_leaves}].")
  return int(num_leaves), int(num_leaves_to_search)


def _build_scann(embeddings: np.ndarray, *, num_leaves: int | None,
                 num_leaves_to_search: int | None, training_sample_size: int,
                 dims_per_block: int, anisotropic_quantization_threshold: float | None,
                 reorder: int) -> tuple[Any, dict]:
  """Builds a ScaNN searcher; returns it and the parameters used."""
  embeddings = _to_float_matrix(embeddings)
  # ScaNN takes a float32, C-contiguous host matrix (bfloat16 indexes are upcast exactly).
  embeddings = np.ascontiguousarray(np.asarray(embeddings, dtype=np.float32))
  num_docs, dim = embeddings.shape
  num_leaves, num_leaves_to_search = default_scann_params(
      num_docs, num_leaves=num_leaves, num_leaves_to_search=num_leaves_to_search)
  if reorder < 0:
    raise ValueError(f"reorder must be >= 0 (0 = no reordering); got {reorder}.")
  scann_ops_pybind = _import_scann()
  # num_neighbors is only the default k; every search passes its own.
  builder = scann_ops_pybind.builder(embeddings, 10, "dot_product")
  builder = builder.tree(num_leaves=num_leaves, num_leaves_to_search=num_leaves_to_search,
                         training_sample_size=int(training_sample_size))
  aq = float("nan") if anisotropic_quantization_threshold is None else float(
      anisotropic_quantization_threshold)
  builder = builder.score_ah(int(dims_per_block), anisotropic_quantization_threshold=aq)
  if reorder > 0:
    builder = builder.reorder(int(reorder))
  start = time.perf_counter()
  searcher = builder.build()
  params = {
      "backend": "scann",
      "distance_measure": "dot_product",
      "num_docs": int(num_docs),
      "dim": int(dim),
      "num_leaves": num_leaves,
      "num_leaves_to_search": num_leaves_to_search,
      "training_sample_size": int(training_sample_size),
      "dims_per_block": int(dims_per_block),
      "anisotropic_quantization_threshold": anisotropic_quantization_threshold,
      "reorder": int(reorder),
      "build_seconds": round(time.perf_counter() - start, 3),
  }
  return searcher, params


def build_scann_artifacts(directory: str, embeddings: Any, *, num_leaves: int | None = None,
                          num_leaves_to_search: int | None = None,
                          training_sample_size: int = 100000, dims_per_block: int = 2,
                          anisotropic_quantization_threshold: float | None = 0.2,
                          reorder: int = 0) -> dict:
  """Builds a ScaNN dot-product searcher over `embeddings` and serializes it into `directory`.

  ORQA's configuration, `tree(num_leaves, num_leaves_to_search, training_sample_size)` +
  `score_ah(dims_per_block)`, with `reorder(n)` when `reorder > 0` (ORQA: 0) and ScaNN's
  recommended anisotropic threshold 0.2 by default (None: ORQA's plain AH). Relative paths, so
  the directory can be staged and renamed; `realm_scann_params.json` records the parameters.

  Returns:
    The parameters used (for the index manifest), with build_seconds.
  """
  searcher = ScannSearcher.build(
      embeddings, num_leaves=num_leaves, num_leaves_to_search=num_leaves_to_search,
      training_sample_size=training_sample_size, dims_per_block=dims_per_block,
      anisotropic_quantization_threshold=anisotropic_quantization_threshold, reorder=reorder)
  return searcher.save(directory)


class ScannSearcher:
  """Approximate top-k inner-product search with a ScaNN tree + AH searcher on the host.

  Same contract as `ExactSearcher.search`. Queries run through ScaNN's `search_batched`
  (one thread; `parallel=True` uses `search_batched_parallel` over ScaNN's thread pool). Results
  ScaNN cannot fill (fewer than k points in the searched leaves) come back as id -1, score -inf.
  """

  def __init__(self, searcher: Any, params: dict, *, parallel: bool = False):
    """Wraps a built or loaded `scann_ops_pybind.ScannSearcher`; use `build`/`from_artifacts`."""
    self._searcher = searcher
    self.params = dict(params)
    self.num_docs = int(searcher.size())
    self.dim = int(params["dim"])
    self.parallel = parallel

  @classmethod
  def build(cls, embeddings: Any, *, parallel: bool = False, **knobs) -> ScannSearcher:
    """Builds in memory; `knobs` are those of `build_scann_artifacts`."""
    searcher, params = _build_scann(embeddings, **{**_SCANN_DEFAULTS, **knobs})
    return cls(searcher, params, parallel=parallel)

  def save(self, directory: str) -> dict:
    """Serializes into `directory` (relative paths, so it can be renamed); returns the params.

    ScaNN's k-means and codebook training are randomized, so two builds of the same matrix can
    differ slightly; a saved and reloaded searcher answers exactly as the one saved.
    """
    os.makedirs(directory, exist_ok=True)
    self._searcher.serialize(directory, relative_path=True)
    with open(os.path.join(directory, SCANN_PARAMS_FILE), "w", encoding="utf-8") as f:
      json.dump(self.params, f, indent=2, sort_keys=True)
    return dict(self.params)

  @classmethod
  def from_artifacts(cls, directory: str, *, parallel: bool = False) -> ScannSearcher:
    """Loads a searcher written by `build_scann_artifacts`.

    Raises:
      FileNotFoundError: the directory or one of its files is missing.
      ValueError: the loaded searcher does not hold the number of points recorded at build time.
    """
    params_path = os.path.join(directory, SCANN_PARAMS_FILE)
    if not os.path.isfile(params_path):
      raise FileNotFoundError(f"{params_path} is missing: {directory} does not hold ScaNN "
                              "artifacts written by build_scann_artifacts.")
    with open(params_path, encoding="utf-8") as f:
      params = json.load(f)
    searcher = _import_scann().load_searcher(directory, assets_backcompat_shim=False)
    result = cls(searcher, params, parallel=parallel)
    if result.num_docs != params["num_docs"]:
      raise ValueError(f"ScaNN artifacts in {directory} hold {result.num_docs} points but "
                       f"{SCANN_PARAMS_FILE} records {params['num_docs']}.")
    return result

  @classmethod
  def create(cls, embeddings: Any = None, *, artifacts_dir: str | None = None,
             **kwargs) -> ScannSearcher:
    """Registry constructor: loads `artifacts_dir` if given, else builds from `embeddings`."""
    if artifacts_dir is None:
      if embeddings is None:
        raise ValueError("The scann backend needs embeddings or an artifacts_dir.")
      return cls.build(embeddings, **kwargs)
    searcher = cls.from_artifacts(artifacts_dir, **kwargs)
    if embeddings is not None and tuple(embeddings.shape) != (searcher.num_docs, searcher.dim):
      raise ValueError(f"ScaNN artifacts in {artifacts_dir} index {searcher.num_docs} x "
                       f"{searcher.dim} embeddings, but the index matrix is "
                       f"{tuple(embeddings.shape)}.")
    return searcher

  def search(self, queries: Any, k: int, *,
             leaves_to_search: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Approximate top-k documents by inner product for each query.

    Args:
      queries: [num_queries, dim].
      k: number of results per query, 1 <= k <= num_docs.
      leaves_to_search: override the build's num_leaves_to_search for this call.

    Returns:
      (scores [num_queries, k] float32, ids [num_queries, k] int32), best first.
    """
    queries = _check_queries(queries, self.dim)
    k = _check_k(k, self.num_docs)
    queries = np.ascontiguousarray(np.asarray(queries, dtype=np.float32))  # [num_queries, dim]
    if queries.shape[0] == 0:
      return np.zeros((0, k), np.float32), np.zeros((0, k), np.int32)
    # With reordering, re-score at least k AH candidates, else the reorder would truncate k.
    pre_reorder = max(k, self.params["reorder"]) if self.params.get("reorder") else None
    search = (self._searcher.search_batched_parallel if self.parallel
              else self._searcher.search_batched)
    ids, scores = search(queries, final_num_neighbors=k, pre_reorder_num_neighbors=pre_reorder,
                         leaves_to_search=leaves_to_search)
    ids = np.asarray(ids).astype(np.int64)  # [num_queries, <=k], uint32 from ScaNN
    scores = np.asarray(scores, dtype=np.float32)  # [num_queries, <=k]
    if scores.shape[1] < k:
      pad = ((0, 0), (0, k - scores.shape[1]))
      ids = np.pad(ids, pad, constant_values=-1)
      scores = np.pad(scores, pad, constant_values=np.nan)
    # ScaNN marks slots it could not fill with NaN scores (and id 0).
    missing = np.isnan(scores)
    ids = np.where(missing, -1, ids).astype(np.int32)
    scores = np.where(missing, -np.inf, scores).astype(np.float32)
    return scores, ids


_SCANN_DEFAULTS = dict(num_leaves=None, num_leaves_to_search=None, training_sample_size=100000,
                       dims_per_block=2, anisotropic_quantization_threshold=0.2, reorder=0)

SEARCHERS: dict[str, type] = {"exact": ExactSearcher, "scann": ScannSearcher}


def make_searcher(backend: str, embeddings: Any, *, artifacts_dir: str | None = None,
                  **kwargs) -> ExactSearcher | ScannSearcher:
  """Builds the searcher named `backend` from `SEARCHERS`.

  Args:
    backend: "exact" or "scann".
    embeddings: [num_docs, dim] index matrix (for "scann" with `artifacts_dir` it may be None;
      when given, its shape is checked against the artifacts).
    artifacts_dir: ScaNN artifacts to load instead of building; ignored by "exact".
    **kwargs: the backend's constructor options (ExactSearcher: mesh, docs_axis,
      query_batch_size, precision; ScaNN: the `build_scann_artifacts` knobs, or parallel).

  Raises:
    ValueError: unknown backend.
  """
  if backend not in SEARCHERS:
    raise ValueError(f"Unknown search backend {backend!r}; choose one of {sorted(SEARCHERS)}.")
  return SEARCHERS[backend].create(embeddings, artifacts_dir=artifacts_dir, **kwargs)


def recall_at_k(approx_ids: Any, exact_ids: Any, k: int) -> float:
  """Fraction of the exact top-k found in the approximate top-k, averaged over queries.

  Args:
    approx_ids: [num_queries, >=k] ids from the approximate searcher (-1 = no result).
    exact_ids: [num_queries, >=k] ids from exact search.
    k: cut-off.

  Returns:
    Mean over queries of |approx[:k] ∩ exact[:k]| / k.
  """
  approx_ids = np.asarray(approx_ids)[:, :k]  # [num_queries, k]
  exact_ids = np.asarray(exact_ids)[:, :k]  # [num_queries, k]
  if approx_ids.shape[0] != exact_ids.shape[0]:
    raise ValueError(f"approx_ids has {approx_ids.shape[0]} queries, exact_ids "
                     f"{exact_ids.shape[0]}.")
  if exact_ids.shape[1] < k:
    raise ValueError(f"exact_ids has only {exact_ids.shape[1]} columns, fewer than k={k}.")
  if exact_ids.shape[0] == 0:
    return float("nan")
  found = (exact_ids[:, :, None] == approx_ids[:, None, :]).any(axis=-1)  # [num_queries, k]
  return float(found.mean())
