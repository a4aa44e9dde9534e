"""Exact search against a NumPy reference on 1 and 8 devices; ScaNN round trip and recall."""

import json
import os

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh

from realm_jax.index import search


def reference_top_k(queries, embeddings, k):
  """NumPy top-k with the documented tie rule: score descending, then id ascending."""
  scores = queries.astype(np.float32) @ embeddings.astype(np.float32).T  # [num_queries, num_docs]
  ids = np.empty((scores.shape[0], k), np.int32)
  for q, row in enumerate(scores):
    # np.lexsort sorts by the last key first: -score, then id breaks ties.
    ids[q] = np.lexsort((np.arange(row.shape[0]), -row))[:k]
  return np.take_along_axis(scores, ids, axis=1), ids


def one_device_mesh():
  return Mesh(np.asarray(jax.devices()[:1]), ("docs",))


def eight_device_mesh():
  assert len(jax.devices()) == 8, "tests/conftest.py should give 8 fake CPU devices"
  return Mesh(np.asarray(jax.devices()), ("docs",))


MESHES = {"1dev": one_device_mesh, "8dev": eight_device_mesh}


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
@pytest.mark.parametrize("num_docs", [1003, 16])
@pytest.mark.parametrize("k", [1, 8])
def test_exact_matches_numpy_float32(mesh_name, num_docs, k):
  rng = np.random.default_rng(num_docs + k)
  embeddings = rng.normal(size=(num_docs, 24)).astype(np.float32)
  queries = rng.normal(size=(37, 24)).astype(np.float32)  # 37: not a multiple of the batch
  searcher = search.ExactSearcher(embeddings, mesh=MESHES[mesh_name](), query_batch_size=16)
  assert searcher.padded_docs % searcher.num_shards == 0
  scores, ids = searcher.search(queries, k)
  ref_scores, ref_ids = reference_top_k(queries, embeddings, k)
  assert scores.dtype == np.float32 and ids.dtype == np.int32
  assert scores.shape == ids.shape == (37, k)
  np.testing.assert_array_equal(ids, ref_ids)
  np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
def test_exact_bfloat16_matches_numpy_on_rounded_values(mesh_name):
  rng = np.random.default_rng(1)
  embeddings = rng.normal(size=(517, 32)).astype(ml_dtypes.bfloat16)
  # Queries are cast to the embedding dtype on device, so the reference rounds them too.
  queries = rng.normal(size=(9, 32)).astype(np.float32)
  rounded_queries = queries.astype(ml_dtypes.bfloat16).astype(np.float32)
  searcher = search.ExactSearcher(embeddings, mesh=MESHES[mesh_name](), query_batch_size=4)
  assert searcher.dtype == np.dtype(ml_dtypes.bfloat16)
  scores, ids = searcher.search(queries, 8)
  ref_scores, ref_ids = reference_top_k(rounded_queries, embeddings.astype(np.float32), 8)
  np.testing.assert_array_equal(ids, ref_ids)
  np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
def test_exact_ties_resolve_to_lower_id(mesh_name):
  rng = np.random.default_rng(2)
  # Small-integer vectors: every score is exact in float32, and many are equal.
  embeddings = rng.integers(-2, 3, size=(203, 8)).astype(np.float32)
  # Duplicate rows placed in different shards (203 docs / 8 shards = 26 per shard), outside the
  # [-2, 2] range so that only they reach the top score for queries[0].
  embeddings[[5, 60, 100, 150, 202]] = 3.0
  queries = rng.integers(-2, 3, size=(11, 8)).astype(np.float32)
  queries[0] = 3.0  # the 5 copies tie for first place
  searcher = search.ExactSearcher(embeddings, mesh=MESHES[mesh_name](), query_batch_size=8)
  scores, ids = searcher.search(queries, 8)
  ref_scores, ref_ids = reference_top_k(queries, embeddings, 8)
  np.testing.assert_array_equal(ids, ref_ids)
  np.testing.assert_array_equal(scores, ref_scores)
  np.testing.assert_array_equal(ids[0, :5], [5, 60, 100, 150, 202])
  # The reference really has ties beyond the duplicates (else the test proves little).
  assert sum(len(np.unique(r)) < len(r) for r in ref_scores) >= 5


def test_exact_all_equal_scores_across_shards():
  embeddings = np.ones((30, 4), np.float32)  # every document scores the same
  searcher = search.ExactSearcher(embeddings, mesh=eight_device_mesh())
  _, ids = searcher.search(np.ones((3, 4), np.float32), 8)
  np.testing.assert_array_equal(ids, np.tile(np.arange(8), (3, 1)))


def test_exact_fewer_docs_than_shards_and_k_equals_num_docs():
  rng = np.random.default_rng(3)
  embeddings = rng.normal(size=(5, 6)).astype(np.float32)  # 3 of 8 shards are all padding
  queries = rng.normal(size=(4, 6)).astype(np.float32)
  searcher = search.ExactSearcher(embeddings, mesh=eight_device_mesh())
  scores, ids = searcher.search(queries, 5)
  ref_scores, ref_ids = reference_top_k(queries, embeddings, 5)
  np.testing.assert_array_equal(ids, ref_ids)
  assert np.isfinite(scores).all()  # padding rows never come back
  np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)


def test_exact_default_mesh_and_jax_inputs():
  rng = np.random.default_rng(4)
  embeddings = rng.normal(size=(100, 8)).astype(np.float32)
  queries = rng.normal(size=(3, 8)).astype(np.float32)
  searcher = search.make_searcher("exact", jax.numpy.asarray(embeddings))
  assert searcher.num_shards == len(jax.local_devices())
  scores, ids = searcher.search(jax.numpy.asarray(queries), 4)
  ref_scores, ref_ids = reference_top_k(queries, embeddings, 4)
  np.testing.assert_array_equal(ids, ref_ids)
  np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)
  assert searcher.batch_size_for(3) == 4  # small calls are not padded to 512


def test_exact_errors():
  searcher = search.ExactSearcher(np.zeros((10, 4), np.float32), mesh=one_device_mesh())
  with pytest.raises(ValueError, match=r"k=11 is larger than the number of documents .*\(10\)"):
    searcher.search(np.zeros((2, 4), np.float32), 11)
  with pytest.raises(ValueError, match="queries have dim 5 but the index embeddings have dim 4"):
    searcher.search(np.zeros((2, 5), np.float32), 3)
  with pytest.raises(ValueError, match="positive integer"):
    searcher.search(np.zeros((2, 4), np.float32), 0)
  with pytest.raises(ValueError, match="float32 or bfloat16"):
    search.ExactSearcher(np.zeros((10, 4), np.int32))
  with pytest.raises(ValueError, match="no axis named 'docs'"):
    search.ExactSearcher(np.zeros((10, 4), np.float32), mesh=Mesh(np.asarray(jax.devices()), ("x",)))


def test_registry_unknown_backend():
  with pytest.raises(ValueError, match=r"Unknown search backend 'faiss'.*\['exact', 'scann'\]"):
    search.make_searcher("faiss", np.zeros((4, 2), np.float32))
  assert set(search.SEARCHERS) == {"exact", "scann"}


def test_recall_at_k():
  exact = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
  approx = np.array([[4, 3, 9, 1], [-1, -1, -1, -1]])
  assert search.recall_at_k(approx, exact, 4) == pytest.approx(3 / 8)
  assert search.recall_at_k(exact, exact, 2) == 1.0
  assert search.recall_at_k(approx, exact, 1) == 0.0


def clustered(num_docs, dim, num_clusters, seed):
  """Points around random centres, like embeddings of topical text."""
  rng = np.random.default_rng(seed)
  centres = rng.normal(size=(num_clusters, dim)).astype(np.float32)
  assign = rng.integers(0, num_clusters, size=num_docs)
  points = centres[assign] + 0.35 * rng.normal(size=(num_docs, dim)).astype(np.float32)
  return points.astype(np.float32)


@pytest.fixture(scope="module")
def clustered_set():
  embeddings = clustered(5000, 32, 50, seed=0)
  rng = np.random.default_rng(1)
  # Queries near the data (a question embedding is close to its answer's block).
  queries = embeddings[rng.integers(0, 5000, size=200)] + 0.3 * rng.normal(size=(200, 32))
  queries = queries.astype(np.float32)
  exact = search.ExactSearcher(embeddings, mesh=one_device_mesh())
  _, exact_ids = exact.search(queries, 8)
  return embeddings, queries, exact_ids


def test_scann_artifacts_round_trip_and_recall(clustered_set, tmp_path):
  embeddings, queries, exact_ids = clustered_set
  staging = tmp_path / "staging"
  built = search.ScannSearcher.build(embeddings, reorder=100)
  params = built.save(str(staging))
  assert params == {**params, "backend": "scann", "distance_measure": "dot_product",
                    "num_docs": 5000, "dim": 32, "num_leaves": 70, "num_leaves_to_search": 7,
                    "training_sample_size": 100000, "dims_per_block": 2,
                    "anisotropic_quantization_threshold": 0.2, "reorder": 100}
  assert params["build_seconds"] >= 0
  with open(staging / search.SCANN_PARAMS_FILE) as f:
    assert json.load(f) == params
  # Published by rename: the artifacts must not hold the staging path.
  published = tmp_path / "index" / "7"
  os.makedirs(published.parent)
  os.rename(staging, published)
  loaded = search.ScannSearcher.from_artifacts(str(published))
  via_registry = search.make_searcher("scann", embeddings, artifacts_dir=str(published))
  scores, ids = loaded.search(queries, 8)
  assert scores.dtype == np.float32 and ids.dtype == np.int32 and ids.shape == (200, 8)
  for other in (built, via_registry):
    other_scores, other_ids = other.search(queries, 8)
    np.testing.assert_array_equal(other_ids, ids)
    np.testing.assert_array_equal(other_scores, scores)
  # Scores are real inner products once reordered.
  true_scores = np.einsum("qd,qkd->qk", queries, embeddings[ids])
  np.testing.assert_allclose(scores, true_scores, rtol=1e-4, atol=1e-4)
  # Measured 0.985-0.999 over builds (reorder 100, 7 of 70 leaves searched) on this set; builds
  # differ because ScaNN's k-means initialisation is random.
  assert search.recall_at_k(ids, exact_ids, 8) >= 0.9
  # All leaves searched + reordering: exact up to ties.
  _, all_leaves_ids = loaded.search(queries, 8, leaves_to_search=70)
  assert search.recall_at_k(all_leaves_ids, exact_ids, 8) >= 0.99


def test_scann_without_reorder_orqa_setting(clustered_set):
  embeddings, queries, exact_ids = clustered_set
  searcher = search.make_searcher("scann", embeddings, anisotropic_quantization_threshold=None)
  assert searcher.params["anisotropic_quantization_threshold"] is None
  assert searcher.params["reorder"] == 0
  _, ids = searcher.search(queries, 8)
  # AH scores alone rank less well: measured 0.72-0.74 over builds. Chance is 8/5000.
  assert search.recall_at_k(ids, exact_ids, 8) >= 0.6


def test_scann_errors(tmp_path, clustered_set):
  embeddings, _, _ = clustered_set
  with pytest.raises(FileNotFoundError, match="realm_scann_params.json is missing"):
    search.ScannSearcher.from_artifacts(str(tmp_path))
  params = search.build_scann_artifacts(str(tmp_path / "a"), embeddings[:1000], num_leaves=10,
                                       anisotropic_quantization_threshold=None)
  assert {k: params[k] for k in ("num_docs", "num_leaves", "num_leaves_to_search", "reorder",
                                 "anisotropic_quantization_threshold")} == {
      "num_docs": 1000, "num_leaves": 10, "num_leaves_to_search": 1, "reorder": 0,
      "anisotropic_quantization_threshold": None}
  assert search.default_scann_params(13_353_718) == (1000, 100)  # ORQA's tree at paper scale
  assert search.default_scann_params(1000) == (31, 3)
  with pytest.raises(ValueError, match=r"index 1000 x 32 embeddings"):
    search.make_searcher("scann", embeddings, artifacts_dir=str(tmp_path / "a"))
  searcher = search.ScannSearcher.from_artifacts(str(tmp_path / "a"))
  with pytest.raises(ValueError, match="k=1001 is larger"):
    searcher.search(embeddings[:2], 1001)
  with pytest.raises(ValueError, match="queries have dim 31"):
    searcher.search(embeddings[:2, :31], 3)
