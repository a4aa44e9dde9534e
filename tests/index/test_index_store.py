"""The published-index format (REALM_SPEC 20-21): round trips, manifest, listing, pruning,
atomic publishing under faults, and load refusals with clear messages."""

import datetime
import hashlib
import json
import os
import socket
import subprocess
import sys
import time

import ml_dtypes
import numpy as np
import pytest

from realm_jax.index import store

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STORE_ID = "store-abc"


def embeddings(seed=0, n=50, d=8, dtype=np.float32):
  return np.random.default_rng(seed).standard_normal((n, d)).astype(dtype)


def publish(run_dir, step, emb=None, **kwargs):
  kwargs.setdefault("block_store_id", STORE_ID)
  return store.publish_index(str(run_dir), step, embeddings(step) if emb is None else emb,
                             **kwargs)


def private_dirs(run_dir):
  root = store.index_root(str(run_dir))
  return sorted(n for n in os.listdir(root) if n.startswith((".staging-", ".trash-")))


def write_scann(directory, emb):
  """A stand-in ScaNN builder: two files, one in a subdirectory."""
  os.makedirs(os.path.join(directory, "assets"))
  np.save(os.path.join(directory, "centers.npy"), np.asarray(emb[:4], np.float32))
  with open(os.path.join(directory, "assets", "config.pb"), "w") as f:
    f.write("num_leaves: 4\n")
  return {"backend": "scann", "num_leaves": 4}


# ------------------------------------------------------------------------------ round trip


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["float32", "bfloat16"])
def test_publish_load_round_trip(tmp_path, dtype):
  emb = embeddings(dtype=dtype)
  path = publish(tmp_path, 7, emb)
  assert path == store.index_dir(str(tmp_path), 7) == os.path.join(str(tmp_path), "index", "7")

  loaded = store.load_index(path, block_store_id=STORE_ID, num_blocks=50, dim=8)
  assert loaded.step == 7 and loaded.path == path
  assert loaded.embeddings.dtype == np.dtype(dtype)
  assert loaded.embeddings.shape == (50, 8)
  assert isinstance(loaded.embeddings, np.memmap)
  np.testing.assert_array_equal(loaded.embeddings.view(np.uint8), emb.view(np.uint8))

  in_memory = store.load_index(path, mmap=False)
  assert not isinstance(in_memory.embeddings, np.memmap)
  np.testing.assert_array_equal(in_memory.embeddings.view(np.uint8), emb.view(np.uint8))

  # bfloat16 sits in the .npy as its uint16 bit pattern, so any .npy reader can open it.
  raw = np.load(os.path.join(path, store.EMBEDDINGS))
  expected_raw = np.float32 if dtype == np.float32 else np.uint16
  assert raw.dtype == expected_raw
  np.testing.assert_array_equal(raw, emb.view(expected_raw))


def test_manifest_fields(tmp_path):
  before = time.time()
  path = publish(tmp_path, 12, checkpoint="/ckpt/12", build_seconds=3.5, extra={"note": "x"})
  after = time.time()
  with open(os.path.join(path, store.MANIFEST)) as f:
    manifest = json.load(f)
  sha = hashlib.sha256(open(os.path.join(path, store.EMBEDDINGS), "rb").read()).hexdigest()
  assert manifest["format"] == "realm_jax.Index" and manifest["format_version"] == 1
  assert manifest["step"] == 12 and manifest["checkpoint"] == "/ckpt/12"
  assert manifest["block_store_id"] == STORE_ID
  assert (manifest["num_blocks"], manifest["dim"], manifest["dtype"]) == (50, 8, "float32")
  assert manifest["sha256"] == sha
  assert manifest["files"] == {store.EMBEDDINGS: {"sha256": sha, "bytes": os.path.getsize(
      os.path.join(path, store.EMBEDDINGS))}}
  assert manifest["build_seconds"] == 3.5
  assert before <= manifest["published_unix"] <= after
  created = datetime.datetime.fromisoformat(manifest["created"])
  assert created.utcoffset() == datetime.timedelta(0)
  assert abs(created.timestamp() - manifest["published_unix"]) < 2
  assert manifest["extra"] == {"note": "x"}
  assert "scann" not in manifest
  loaded = store.load_index(path)
  assert loaded.published_unix == manifest["published_unix"] and loaded.manifest == manifest
  assert loaded.scann_dir is None


def test_scann_builder_artifacts_are_hashed_and_verified(tmp_path):
  calls = []

  def builder(directory, emb):
    calls.append(directory)
    assert os.path.isdir(directory) and ".staging-" in directory  # writes into staging only
    assert emb.dtype == ml_dtypes.bfloat16 and emb.shape == (50, 8)
    return write_scann(directory, emb)

  path = publish(tmp_path, 3, embeddings(dtype=ml_dtypes.bfloat16), scann_builder=builder)
  assert len(calls) == 1
  loaded = store.load_index(path)
  assert loaded.manifest["scann"] == {"backend": "scann", "num_leaves": 4}
  assert set(loaded.manifest["files"]) == {
      store.EMBEDDINGS, "scann/centers.npy", "scann/assets/config.pb"}
  assert loaded.scann_dir == os.path.join(path, "scann")

  with open(os.path.join(path, "scann", "assets", "config.pb"), "w") as f:
    f.write("num_leaves: 5\n")  # same size, different bytes
  with pytest.raises(store.IndexLoadError, match="scann/assets/config.pb does not match its "
                     "sha256"):
    store.load_index(path)


def test_index_writer_streams_rows_in_any_order_and_casts(tmp_path):
  emb = embeddings()
  with store.IndexWriter(str(tmp_path), 4, 50, 8, "bfloat16") as writer:
    for start in (40, 0, 20, 30, 10):  # out of order, as sharded builders may finish
      writer.write_rows(start, emb[start:start + 10])  # float32 rows into a bfloat16 index
    path = writer.commit(block_store_id=STORE_ID, checkpoint="ckpt")
  loaded = store.load_index(path, dtype="bfloat16")
  np.testing.assert_array_equal(loaded.embeddings, emb.astype(ml_dtypes.bfloat16))
  assert loaded.manifest["build_seconds"] >= 0
  assert private_dirs(tmp_path) == []


def test_index_writer_refuses_missing_and_non_finite_rows(tmp_path):
  emb = embeddings()
  writer = store.IndexWriter(str(tmp_path), 4, 50, 8, "float32")
  writer.write_rows(0, emb[:30])
  with pytest.raises(ValueError, match=r"20 of 50 rows were never written \(first: row 30\)"):
    writer.commit(block_store_id=STORE_ID)
  assert store.list_indexes(str(tmp_path)) == [] and private_dirs(tmp_path) == []

  bad = emb.copy()
  bad[13, 2] = np.nan
  with pytest.raises(ValueError, match="non-finite embedding in row 13"):
    publish(tmp_path, 5, bad)
  assert store.list_indexes(str(tmp_path)) == [] and private_dirs(tmp_path) == []


def test_bad_arguments(tmp_path):
  with pytest.raises(ValueError, match="float32 or bfloat16"):
    publish(tmp_path, 1, embeddings(dtype=np.float64))
  with pytest.raises(ValueError, match=r"\[num_blocks, dim\]"):
    publish(tmp_path, 1, np.zeros(8, np.float32))
  with pytest.raises(ValueError, match="non-negative integer"):
    publish(tmp_path, -1)
  with pytest.raises(TypeError, match="extra must be JSON-serializable"):
    publish(tmp_path, 1, extra={"x": object()})
  with pytest.raises(ValueError, match=r"rows \[45, 55\) outside \[0, 50\)"):
    with store.IndexWriter(str(tmp_path), 1, 50, 8) as writer:
      writer.write_rows(45, embeddings()[:10])
  assert store.list_indexes(str(tmp_path)) == [] and private_dirs(tmp_path) == []


# ------------------------------------------------------------------------------ listing


def test_list_and_latest(tmp_path):
  run = str(tmp_path)
  assert store.list_indexes(run) == [] and store.latest_index_step(run) is None
  for step in (200, 5, 40):
    publish(tmp_path, step, keep=None)
  os.makedirs(os.path.join(run, "index", "999"))  # no manifest: never listed
  os.makedirs(os.path.join(run, "index", ".staging-1000-host-1-abcd"))
  os.makedirs(os.path.join(run, "index", "notes"))
  assert store.list_indexes(run) == [5, 40, 200]  # numeric order, not string order
  assert store.latest_index_step(run) == 200


def test_keep_prunes_to_newest(tmp_path):
  run = str(tmp_path)
  for step in (1, 2, 3, 4, 5):
    publish(tmp_path, step, keep=3)
  assert store.list_indexes(run) == [3, 4, 5]
  # An older step published late is kept even though it is not among the newest two.
  publish(tmp_path, 0, keep=2)
  assert store.list_indexes(run) == [0, 4, 5]
  publish(tmp_path, 6, keep=None)
  assert store.list_indexes(run) == [0, 4, 5, 6]
  # The first index (the warm start's) is the run's record: never pruned.
  publish(tmp_path, 7, keep=1)
  assert store.list_indexes(run) == [0, 7]
  assert private_dirs(tmp_path) == []  # trash dirs are deleted after the rename


def test_republishing_a_step(tmp_path):
  path = publish(tmp_path, 8)
  manifest = store.load_index(path).manifest
  # Same snapshot (a restarted builder): no-op, the published index is untouched.
  assert publish(tmp_path, 8) == path
  assert store.load_index(path).manifest == manifest
  # Different embeddings, or another BlockStore: refused; published indexes are immutable.
  with pytest.raises(store.IndexExistsError, match=f"{path}: step 8 is already published with "
                     "different contents"):
    publish(tmp_path, 8, embeddings(seed=99))
  with pytest.raises(store.IndexExistsError, match="block store"):
    publish(tmp_path, 8, block_store_id="other")
  assert store.load_index(path).manifest == manifest
  assert private_dirs(tmp_path) == []


# ------------------------------------------------------------------------------ faults


FAULT_POINTS = ("after_embeddings", "in_scann_builder", "before_manifest", "before_rename")


def _install_fault(monkeypatch, point, fault):
  """Makes the publish call `fault()` at `point`; returns the scann_builder to pass."""
  if point == "after_embeddings":
    # The first hash is of embeddings.npy, just after it was flushed and fsynced.
    monkeypatch.setattr(store, "_sha256_file", lambda path: fault())
  elif point == "before_manifest":
    monkeypatch.setattr(store, "_write_manifest", lambda directory, manifest: fault())
  elif point == "before_rename":
    monkeypatch.setattr(store, "_rename_into_place", lambda staging, dest: fault())

  def builder(directory, emb):
    info = write_scann(directory, emb)
    if point == "in_scann_builder":
      fault()
    return info
  return builder


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_a_failed_publish_leaves_nothing_and_a_retry_succeeds(tmp_path, monkeypatch, point):
  def fault():
    raise RuntimeError("injected")

  with monkeypatch.context() as patch:
    builder = _install_fault(patch, point, fault)
    with pytest.raises(RuntimeError, match="injected"):
      publish(tmp_path, 10, scann_builder=builder)
  assert store.list_indexes(str(tmp_path)) == [] and private_dirs(tmp_path) == []
  assert not os.path.exists(store.index_dir(str(tmp_path), 10))

  path = publish(tmp_path, 10, scann_builder=write_scann)
  np.testing.assert_array_equal(store.load_index(path).embeddings, embeddings(10))


_KILL_SCRIPT = """
import os, sys
sys.path.insert(0, {repo!r})
import pytest
from realm_jax.index import store
sys.path.insert(0, {tests!r})
import test_index_store as t

def fault():
  os._exit(9)  # SIGKILL-like: no cleanup, no finally blocks

with pytest.MonkeyPatch.context() as patch:
  builder = t._install_fault(patch, {point!r}, fault)
  if {point!r} == "after_prune":
    patch.setattr(store, "prune_indexes", lambda *a, **k: fault())
  t.publish({run!r}, 10, scann_builder=builder)
"""


def _publish_and_die(run_dir, point):
  script = _KILL_SCRIPT.format(repo=REPO_ROOT, tests=os.path.dirname(os.path.abspath(__file__)),
                               point=point, run=str(run_dir))
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 9, result.stderr


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_a_killed_publish_never_loads_and_a_restart_cleans_up(tmp_path, point):
  run = str(tmp_path)
  publish(tmp_path, 5)  # an earlier good index stays the latest
  _publish_and_die(tmp_path, point)

  leftovers = private_dirs(tmp_path)
  assert len(leftovers) == 1 and leftovers[0].startswith(".staging-10-")
  staging = os.path.join(store.index_root(run), leftovers[0])
  assert store.list_indexes(run) == [5] and store.latest_index_step(run) == 5
  assert not os.path.exists(store.index_dir(run, 10))
  # Not loadable, not even when killed just before the rename (its manifest is complete).
  with pytest.raises(store.IndexLoadError, match=f"^{staging}: a staging/trash directory"):
    store.load_index(staging)

  path = publish(tmp_path, 10, scann_builder=write_scann)  # the restarted builder
  assert private_dirs(tmp_path) == []  # the dead process's staging dir was removed
  assert store.list_indexes(run) == [5, 10]
  np.testing.assert_array_equal(store.load_index(path).embeddings, embeddings(10))


def test_killed_after_rename_is_published_and_a_restart_is_a_noop(tmp_path):
  _publish_and_die(tmp_path, "after_prune")
  path = store.index_dir(str(tmp_path), 10)
  manifest = store.load_index(path).manifest
  assert publish(tmp_path, 10, scann_builder=write_scann) == path
  assert store.load_index(path).manifest == manifest


def test_clean_stale_staging_spares_live_and_foreign_dirs(tmp_path):
  root = store.index_root(str(tmp_path))
  os.makedirs(root)
  dead = subprocess.Popen(["true"])
  dead.wait()
  host = socket.gethostname()
  names = {"dead": f".staging-3-{host}-{dead.pid}-aaaa",
           "dead_trash": f".trash-2-{host}-{dead.pid}-bbbb",
           "live": f".staging-3-{host}-{os.getppid()}-cccc",
           "foreign": f".staging-3-some-other-host-{dead.pid}-dddd"}
  for name in names.values():
    os.makedirs(os.path.join(root, name))
  removed = store.clean_stale_staging(str(tmp_path))
  assert sorted(removed) == sorted(os.path.join(root, names[k]) for k in ("dead", "dead_trash"))
  assert sorted(private_dirs(tmp_path)) == sorted([names["live"], names["foreign"]])


# ------------------------------------------------------------------------------ refusals


@pytest.fixture
def published(tmp_path):
  return publish(tmp_path, 30, scann_builder=write_scann)


@pytest.mark.parametrize("expect, problem", [
    ({"num_blocks": 49}, "has 50 blocks, expected 49"),
    ({"dim": 16}, "has embedding dim 8, expected 16"),
    ({"dtype": "bfloat16"}, "has dtype float32, expected bfloat16"),
    ({"block_store_id": "other-store"}, f"embeds BlockStore {STORE_ID}, expected other-store"),
])
def test_refuses_an_index_that_does_not_match_expectations(published, expect, problem):
  with pytest.raises(store.IndexLoadError, match=f"^{published}: {problem}"):
    store.load_index(published, **expect)


def test_refuses_a_checksum_mismatch(published):
  emb_path = os.path.join(published, store.EMBEDDINGS)
  with open(emb_path, "r+b") as f:
    f.seek(-5, os.SEEK_END)  # a byte of row 49, not the header
    byte = f.read(1)
    f.seek(-5, os.SEEK_END)
    f.write(bytes([byte[0] ^ 0x01]))
  with pytest.raises(store.IndexLoadError, match=f"^{published}: embeddings.npy does not match "
                     "its sha256 in the manifest"):
    store.load_index(published)
  store.load_index(published, verify="fast")  # sizes agree: only the hash sees a flipped bit


def test_refuses_a_truncated_file(published):
  emb_path = os.path.join(published, store.EMBEDDINGS)
  size = os.path.getsize(emb_path)
  with open(emb_path, "r+b") as f:
    f.truncate(size - 32)
  with pytest.raises(store.IndexLoadError, match=f"^{published}: embeddings.npy has {size - 32} "
                     f"bytes, the manifest says {size}"):
    store.load_index(published, verify="fast")


@pytest.mark.parametrize("name", [store.EMBEDDINGS, "scann/assets/config.pb"])
def test_refuses_a_missing_file(published, name):
  os.remove(os.path.join(published, *name.split("/")))
  with pytest.raises(store.IndexLoadError, match=f"^{published}: missing file {name}"):
    store.load_index(published, verify=False)


def test_refuses_a_missing_manifest(published, tmp_path):
  os.remove(os.path.join(published, store.MANIFEST))
  with pytest.raises(store.IndexLoadError, match=f"^{published}: no manifest.json"):
    store.load_index(published)
  assert store.list_indexes(str(tmp_path)) == []
  missing = os.path.join(str(tmp_path), "index", "77")
  with pytest.raises(store.IndexLoadError, match=f"^{missing}: no such index directory"):
    store.load_index(missing)


def test_refuses_a_manifest_of_another_step(published, tmp_path):
  moved = os.path.join(str(tmp_path), "index", "31")
  os.rename(published, moved)
  with pytest.raises(store.IndexLoadError, match=f"^{moved}: directory name says step 31 but "
                     "manifest.json says step 30"):
    store.load_index(moved)
  assert store.list_indexes(str(tmp_path)) == []
