"""The index builder (issue 4 item 1): embedding equals the model's, publishing, the follow loop,
waiting for a first checkpoint, crash safety, and one-line config errors of the entry point."""

import json
import logging
import os
import subprocess
import sys
import threading
import time

import flax.linen as nn
import jax
import numpy as np
import pytest

from realm_jax import build_index as entry
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.index import builder
from realm_jax.index import store as store_lib
from realm_jax.models import config as config_lib
from realm_jax.models.retriever import RealmRetriever
from realm_jax import checkpoints as ckpt

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = config_lib.RealmConfig(bert=config_lib.tiny_bert(vocab_size=30522))
TIMEOUT = 60.0


def random_params(config, seed=0, std=0.05):
  """Unboxed RealmRetriever params of the right shapes, without running init (slow on CPU)."""
  q = np.ones((1, 8), np.int32)
  c = np.ones((1, 2, 8), np.int32)
  shapes = jax.eval_shape(lambda: nn.unbox(
      RealmRetriever(config).init(jax.random.PRNGKey(0), q, q, q, c, c, c)))["params"]
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.normal(0, std, s.shape).astype(s.dtype), shapes)


@pytest.fixture(scope="module")
def block_store(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("z")
  src = tmp / "docs.jsonl"
  topics = ["rivers", "mountains", "composers", "bridges", "planets", "deserts", "painters"]
  with open(src, "w", encoding="utf-8") as f:
    for i, topic in enumerate(topics):
      text = " ".join(f"The {topic} number {j} of this article is long and well known in the "
                      f"region of {topic}." for j in range(3 + i % 3))
      f.write(json.dumps({"title": f"{topic.title()} {i}", "text": text}) + "\n")
  corpus_build.build_block_store(sources_lib.JsonlSource(str(src)), str(tmp / "blocks"),
                                 max_block_len=32)
  store = block_store_lib.BlockStore.open(str(tmp / "blocks"))
  assert store.num_blocks >= 12 and store.num_blocks % 8, store.num_blocks
  return store


@pytest.fixture(scope="module")
def params():
  return random_params(TINY)


def document_embeddings(params, config, ids, types, mask):
  """RealmRetriever.embed_documents of [n, length] inputs, one call, unsharded."""
  # Jitted only because op-by-op dispatch is slow here.
  apply = jax.jit(lambda p, i, t, m: RealmRetriever(config).apply(
      {"params": p}, i, t, m, deterministic=True, method=RealmRetriever.embed_documents))
  return np.asarray(apply(params, ids, types, mask))  # [n, proj]


def direct_embeddings(params, config, store):
  """Reference: RealmRetriever.embed_documents on all blocks at once."""
  return document_embeddings(params, config,
                             *store.embedder_inputs(np.arange(store.num_blocks)))


def one_device_mesh():
  return builder.local_mesh(jax.devices()[:1])


# ------------------------------------------------------------------------------ embedding


def test_embed_blocks_equals_the_document_tower_on_one_device(params, block_store):
  expected = direct_embeddings(params, TINY, block_store)  # [num_blocks, proj]
  got = builder.embed_blocks(params, TINY, block_store, batch_size=5, mesh=one_device_mesh(),
                             progress=None)
  assert got.shape == (block_store.num_blocks, TINY.proj_size) and got.dtype == np.float32
  np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_embed_blocks_sharded_over_8_devices_with_a_ragged_last_batch(params, block_store):
  assert len(jax.devices()) == 8
  expected = direct_embeddings(params, TINY, block_store)
  reports = []
  # 8 does not divide num_blocks: the last batch is padded; batch 5 is rounded up to 8.
  for batch_size in (8, 5):
    got = builder.embed_blocks({"retriever": params}, TINY, block_store, batch_size=batch_size,
                               progress=reports.append)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
  assert reports[-1].blocks_done == reports[-1].blocks_total == block_store.num_blocks
  assert "blocks/s" in reports[-1].line() and "ETA" in reports[-1].line()
  # A sub-range (what one host of several embeds), and bfloat16 rows.
  part = builder.embed_blocks(params, TINY, block_store, batch_size=8, block_range=(3, 11),
                              dtype="bfloat16", progress=None)
  assert part.dtype.name == "bfloat16"
  np.testing.assert_allclose(part.astype(np.float32), expected[3:11], atol=2e-2)


def test_untied_towers_embed_with_the_document_tower(block_store):
  untied = TINY.replace(share_embedders=False)
  params = random_params(untied, seed=1)
  got = builder.embed_blocks(params, untied, block_store, batch_size=8, progress=None)
  np.testing.assert_allclose(got, direct_embeddings(params, untied, block_store), atol=1e-5)
  # The query tower (different parameters) would give other embeddings.
  swapped = dict(params, document_embedder=params["query_embedder"])
  assert not np.allclose(got, direct_embeddings(swapped, untied, block_store), atol=1e-3)


# Blocks of 12 to 96 wordpieces ("[CLS] doc i [SEP]" is 5, each sentence 7). In id order, batches
# of 4 have longest 26, 33, 96 and a last partial batch of 2 with longest 26; shortest first
# (what a length bucket embeds), blocks [0, 3, 6, 9], [1, 4, 11, 13], [2, 7, 12, 5] and [8, 10]
# (padded), longest 12, 19, 33 and 96. 33 is one past a bucket of 32: a width of 32 there would
# drop that block's final [SEP].
MIXED_SENTENCES = [1, 2, 3, 1, 2, 4, 1, 3, 12, 1, 13, 2, 3, 2]
MIXED_LENGTHS = [12, 19, 26, 12, 19, 33, 12, 26, 89, 12, 96, 19, 26, 19]


@pytest.fixture(scope="module")
def mixed_store(tmp_path_factory):
  """A BlockStore of max_block_len 96 whose blocks are short, medium and full, one per document."""
  tmp = tmp_path_factory.mktemp("mixed")
  src = tmp / "docs.jsonl"
  with open(src, "w", encoding="utf-8") as f:
    for i, n in enumerate(MIXED_SENTENCES):
      text = " ".join(f"Item {i} part {j} is known." for j in range(n))
      f.write(json.dumps({"title": f"Doc {i}", "text": text}) + "\n")
  corpus_build.build_block_store(sources_lib.JsonlSource(str(src)), str(tmp / "blocks"),
                                 max_block_len=96)
  store = block_store_lib.BlockStore.open(str(tmp / "blocks"))
  lengths = store.title_lengths[:] + store.body_lengths[:] + 3  # [num_blocks] with the specials
  assert lengths.tolist() == MIXED_LENGTHS
  return store


@pytest.fixture(scope="module")
def sensitive_params():
  """Weights of std 0.5: with std 0.05 (`params`) embeddings hardly depend on the input (one
  token less moves them by ~1e-5, within the tolerance), with 0.5 by ~0.1."""
  return random_params(TINY, std=0.5)


def record_widths(monkeypatch):
  """Wraps the jitted document tower: returns the list of [batch, width] shapes it is fed."""
  shapes = []
  real = builder._embed_fn

  def recording(*args):
    fn = real(*args)

    def call(tower, ids, type_ids, mask):
      assert ids.shape == type_ids.shape == mask.shape
      shapes.append(ids.shape)
      return fn(tower, ids, type_ids, mask)
    return call

  monkeypatch.setattr(builder, "_embed_fn", recording)
  return shapes


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_length_buckets_give_the_full_width_embeddings(sensitive_params, mixed_store, pooling,
                                                       monkeypatch):
  params, config = sensitive_params, TINY.replace(retriever_pooling=pooling)
  shapes = record_widths(monkeypatch)
  full = builder.embed_blocks(params, config, mixed_store, batch_size=4, length_bucket=0,
                              mesh=one_device_mesh(), progress=None)  # [num_blocks, proj]
  assert shapes == [(4, 96)] * 4
  np.testing.assert_allclose(full, direct_embeddings(params, config, mixed_store), atol=1e-5,
                             rtol=0)
  for length_bucket, widths in ((32, [32, 32, 64, 96]), (1, [12, 19, 33, 96]),
                                (1000, [96] * 4)):
    shapes.clear()
    got = builder.embed_blocks(params, config, mixed_store, batch_size=4,
                               length_bucket=length_bucket, mesh=one_device_mesh(),
                               progress=None)
    assert shapes == [(4, w) for w in widths], length_bucket
    np.testing.assert_allclose(got, full, atol=1e-5, rtol=0, err_msg=f"bucket {length_bucket}")
  # The comparison can fail: block 5 (33 wordpieces) cut to 32, without its last [SEP], embeds
  # far (over 100 times the tolerance) from its full-width embedding.
  ids, types, mask = mixed_store.embedder_inputs([5])  # each [1, 96]
  cut = document_embeddings(params, config, ids[:, :32], types[:, :32], mask[:, :32])
  assert np.abs(cut[0] - full[5]).max() > 1e-3


def test_length_buckets_over_8_devices_and_a_sub_range(sensitive_params, mixed_store,
                                                       monkeypatch):
  params = sensitive_params
  shapes = record_widths(monkeypatch)
  full = builder.embed_blocks(params, TINY, mixed_store, batch_size=8, length_bucket=0,
                              progress=None)
  # Shortest first: the 8 blocks of 12 and 19 wordpieces (longest 19), then the other 6 padded
  # to 8 (longest 96); then [11, 14) as 11, 13, 12 padded to 8 (longest 26).
  got = builder.embed_blocks(params, TINY, mixed_store, batch_size=8, progress=None)
  part = builder.embed_blocks(params, TINY, mixed_store, batch_size=8, block_range=(11, 14),
                              progress=None)
  assert shapes == [(8, 96)] * 2 + [(8, 32), (8, 96)] + [(8, 32)]
  np.testing.assert_allclose(got, full, atol=1e-5, rtol=0)
  np.testing.assert_allclose(part, full[11:], atol=1e-5, rtol=0)


def test_bucket_width_holds_the_longest_row():
  mask = (np.arange(96)[None, :] < np.array([[3], [33], [0]])).astype(np.int32)  # [3, 96]
  assert builder.bucket_width(mask, 32) == 64
  assert builder.bucket_width(mask, 1) == 33
  assert builder.bucket_width(mask, 0) == 96
  assert builder.bucket_width(mask, 40) == 40
  assert builder.bucket_width(mask, 64) == 64
  assert builder.bucket_width(mask, 128) == 96  # capped at the full width
  assert builder.bucket_width(mask[:1], 32) == 32
  # Trailing positions are cut only where every row is padding.
  holes = np.zeros((2, 96), np.int32)
  holes[0, [0, 70]] = 1
  assert builder.bucket_width(holes, 32) == 96
  # Rows of any rank: a pretraining batch's reader mask [B, K, length].
  assert builder.bucket_width(mask.reshape(3, 1, 96), 32) == 64
  assert builder.bucket_width(np.stack([mask, holes[:1].repeat(3, 0)]), 32) == 96


def test_length_order_is_shortest_first_and_stable(mixed_store):
  order = builder.length_order(mixed_store, 0, mixed_store.num_blocks)
  assert order.tolist() == [0, 3, 6, 9, 1, 4, 11, 13, 2, 7, 12, 5, 8, 10]
  assert builder.length_order(mixed_store, 11, 14).tolist() == [11, 13, 12]


class _RecordingWriter:
  def __init__(self, num_rows):
    self.rows = np.full((num_rows, 2), np.nan)
    self.calls = []

  def write_rows(self, start, rows):
    self.calls.append((start, rows.shape[0]))
    self.rows[start:start + rows.shape[0]] = rows


def test_write_at_puts_each_row_at_its_block_in_contiguous_runs():
  writer = _RecordingWriter(8)
  block_ids = np.array([5, 6, 7, 0, 3, 4])
  rows = np.arange(12, dtype=np.float64).reshape(6, 2)  # [6, 2]
  builder.write_at(writer, block_ids, rows)
  assert writer.calls == [(5, 3), (0, 1), (3, 2)]
  np.testing.assert_array_equal(writer.rows[block_ids], rows)
  assert np.isnan(writer.rows[[1, 2]]).all()  # rows no block id names are untouched


@pytest.mark.parametrize("bad", [-1, -32, 1.5, 32.0, "32", None, True])
def test_bad_length_bucket_is_a_value_error(params, block_store, tmp_path, bad):
  with pytest.raises(ValueError, match="length_bucket must be"):
    builder.embed_blocks(params, TINY, block_store, length_bucket=bad, progress=None)
  # The job says so at once, not after waiting for (or restoring) a checkpoint.
  with pytest.raises(ValueError, match="length_bucket must be"):
    builder.follow(str(tmp_path), store=block_store, once=True, length_bucket=bad)
  with pytest.raises(ValueError, match="length_bucket must be"):
    builder.build_index(str(tmp_path), 1, store=block_store, length_bucket=bad)


def test_host_block_ranges_tile_the_blocks():
  ranges = [builder.host_block_range(10, i, 3) for i in range(3)]
  assert ranges == [(0, 3), (3, 6), (6, 10)]


# ------------------------------------------------------------------------------ build_index


def test_build_index_publishes_a_loadable_index_with_its_manifest(tmp_path, params,
                                                                  block_store):
  ckpt.save_checkpoint(tmp_path, 40, {"retriever": params}, config=TINY)
  path = builder.build_index(str(tmp_path), 40, store=block_store, dtype="float32",
                             batch_size=8, keep=3, progress=None)
  assert path == store_lib.index_dir(str(tmp_path), 40)
  loaded = store_lib.load_index(path, block_store_id=block_store.store_id,
                                num_blocks=block_store.num_blocks, dim=TINY.proj_size)
  manifest = loaded.manifest
  assert manifest["step"] == 40 and manifest["dtype"] == "float32"
  assert manifest["checkpoint"] == ckpt.checkpoint_path(str(tmp_path), 40)
  assert manifest["block_store_id"] == block_store.store_id
  assert manifest["extra"]["checkpoint_step"] == 40 and manifest["build_seconds"] > 0
  assert manifest["extra"]["length_bucket"] == builder.DEFAULT_LENGTH_BUCKET == 32
  assert len(manifest["sha256"]) == 64
  np.testing.assert_allclose(loaded.embeddings, direct_embeddings(params, TINY, block_store),
                             atol=1e-5)


def test_multi_host_parts_are_combined_by_host_0(tmp_path, params, block_store, monkeypatch):
  """Two "hosts" (threads that see different process indices) embed halves; host 0 publishes."""
  local = threading.local()
  monkeypatch.setattr(builder, "_process_count", lambda: 2)
  monkeypatch.setattr(builder, "_process_index", lambda: local.index)
  monkeypatch.setattr(builder, "_PARTS_POLL_SECONDS", 0.02)
  ckpt.save_checkpoint(tmp_path, 5, {"retriever": params}, config=TINY)
  ranges, paths = {}, {}

  def embed_and_record(*args, block_range, **kwargs):
    ranges[local.index] = block_range
    return builder.embed_blocks(*args, block_range=block_range, **kwargs)

  def host(index):
    local.index = index
    paths[index] = builder.build_index(str(tmp_path), 5, store=block_store, batch_size=8,
                                       progress=None, embed_fn=embed_and_record)

  threads = [threading.Thread(target=host, args=(i,), daemon=True) for i in (1, 0)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(TIMEOUT)
  assert not any(thread.is_alive() for thread in threads)
  n = block_store.num_blocks
  assert ranges == {0: (0, n // 2), 1: (n // 2, n)}
  assert paths == {i: store_lib.index_dir(str(tmp_path), 5) for i in (0, 1)}
  loaded = store_lib.load_index(paths[0], num_blocks=n)
  assert loaded.manifest["extra"]["num_hosts"] == 2
  np.testing.assert_allclose(loaded.embeddings, direct_embeddings(params, TINY, block_store),
                             atol=1e-5)
  assert not [name for name in os.listdir(store_lib.index_root(str(tmp_path)))
              if name.startswith(".")], "parts or staging left behind"


def test_build_index_with_scann_artifacts(tmp_path, params, block_store):
  import scann  # noqa: F401,PLC0415  (a pinned dependency: must import)
  from realm_jax.index import search  # pylint: disable=g-import-not-at-top
  ckpt.save_checkpoint(tmp_path, 6, {"retriever": params}, config=TINY)
  path = builder.build_index(str(tmp_path), 6, store=block_store, batch_size=8, progress=None,
                             scann=True, scann_options={"num_leaves": 2, "reorder": 8})
  loaded = store_lib.load_index(path)  # verify=True re-hashes the ScaNN files too
  assert loaded.manifest["scann"]["num_leaves"] == 2 and loaded.manifest["scann"]["reorder"] == 8
  assert any(name.startswith("scann/") for name in loaded.manifest["files"])
  searcher = search.ScannSearcher.from_artifacts(loaded.scann_dir)
  _, ids = searcher.search(np.asarray(loaded.embeddings[:2], np.float32), 1)
  assert ids.shape == (2, 1)


def test_follow_once_indexes_only_the_newest_checkpoint(tmp_path, params, block_store):
  for step in (3, 7):
    ckpt.save_checkpoint(tmp_path, step, {"retriever": params}, config=TINY)
  published = builder.follow(str(tmp_path), store=block_store, once=True, batch_size=8,
                             poll_seconds=0.01)
  assert published == [store_lib.index_dir(str(tmp_path), 7)]
  assert store_lib.list_indexes(str(tmp_path)) == [7]
  # Already indexed: --once has nothing to do and says so.
  assert builder.follow(str(tmp_path), store=block_store, once=True, batch_size=8) == []


def test_first_index_from_an_ict_checkpoint_dir(tmp_path, params, block_store):
  ict_run, run = tmp_path / "ict", tmp_path / "realm"
  ict_dir = ckpt.save_checkpoint(ict_run, 1000, {"retriever": params}, config=TINY)
  published = builder.follow(str(run), store=block_store, once=True, checkpoint_dir=ict_dir,
                             batch_size=8)
  assert published == [store_lib.index_dir(str(run), 0)]
  manifest = store_lib.load_index(published[0]).manifest
  assert manifest["checkpoint"] == ict_dir and manifest["extra"]["checkpoint_step"] == 1000


def test_follow_waits_for_a_first_checkpoint_then_follows_and_exits_when_done(
    tmp_path, params, block_store, caplog, monkeypatch):
  caplog.set_level(logging.INFO, logger="realm_jax.index.builder")
  # Polls every 0.05 s; says it is waiting at most every 0.3 s (a minute by default).
  monkeypatch.setattr(builder, "WAITING_LOG_SECONDS", 0.3)
  run_dir = str(tmp_path / "run")
  result = {}
  started = time.monotonic()

  def run():
    result["paths"] = builder.follow(run_dir, store=block_store, poll_seconds=0.05,
                                     batch_size=8)

  thread = threading.Thread(target=run, daemon=True)
  thread.start()

  def wait_for(condition, what):
    deadline = time.monotonic() + TIMEOUT
    while not condition():
      assert thread.is_alive() or condition(), f"follow() ended early while waiting for {what}"
      assert time.monotonic() < deadline, f"timed out waiting for {what}"
      time.sleep(0.02)

  waiting = f"waiting for a first checkpoint in {os.path.join(run_dir, 'checkpoints')} (none yet)"
  wait_for(lambda: sum(waiting in r.getMessage() for r in caplog.records) >= 3,
           "three waiting messages")
  # Three messages took at least two intervals, though ~12 polls happened meanwhile.
  assert time.monotonic() - started >= 0.6
  assert store_lib.list_indexes(run_dir) == []
  ckpt.save_checkpoint(run_dir, 2, {"retriever": params}, config=TINY)
  wait_for(lambda: store_lib.list_indexes(run_dir) == [2], "index 2")
  ckpt.save_checkpoint(run_dir, 4, {"retriever": params}, config=TINY)
  ckpt.mark_training_done(run_dir)
  thread.join(TIMEOUT)
  assert not thread.is_alive(), "follow() did not exit after TRAINING_DONE"
  assert result["paths"] == [store_lib.index_dir(run_dir, s) for s in (2, 4)]
  assert any("last checkpoint (step 4) is indexed; exiting" in r.getMessage()
             for r in caplog.records)


def test_follow_exits_at_once_when_done_and_nothing_new(tmp_path, params, block_store):
  ckpt.save_checkpoint(tmp_path, 5, {"retriever": params}, config=TINY)
  builder.build_index(str(tmp_path), 5, store=block_store, batch_size=8, progress=None)
  ckpt.mark_training_done(tmp_path)
  start = time.monotonic()
  assert builder.follow(str(tmp_path), store=block_store, poll_seconds=30) == []
  assert time.monotonic() - start < 10


# ------------------------------------------------------------------------------ crashes


def test_a_builder_dying_midway_leaves_nothing_loadable_and_a_rerun_publishes(
    tmp_path, params, block_store):
  run_dir = str(tmp_path)
  ckpt.save_checkpoint(run_dir, 9, {"retriever": params}, config=TINY)

  def dies_after_one_batch(tower_params, config, store, *, writer, **kwargs):
    rows = np.ones((4, config.proj_size), np.float32)
    writer.write_rows(0, rows)
    raise RuntimeError("killed mid-way")

  with pytest.raises(RuntimeError, match="killed mid-way"):
    builder.follow(run_dir, store=block_store, once=True, embed_fn=dies_after_one_batch)
  assert store_lib.list_indexes(run_dir) == []
  assert not os.path.exists(store_lib.index_dir(run_dir, 9))

  # A real kill (no Python cleanup at all) in the middle of writing rows.
  code = ("import os, numpy as np\nfrom realm_jax.index import store\n"
          f"w = store.IndexWriter({run_dir!r}, 9, {block_store.num_blocks}, 128, 'float32')\n"
          "w.write_rows(0, np.ones((3, 128), np.float32))\nos._exit(9)\n")
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, timeout=TIMEOUT)
  assert proc.returncode == 9
  leftovers = [n for n in os.listdir(store_lib.index_root(run_dir)) if n.startswith(".staging")]
  assert leftovers, "the killed writer should have left its staging directory"
  assert store_lib.list_indexes(run_dir) == []
  for name in leftovers:
    with pytest.raises(store_lib.IndexLoadError):
      store_lib.load_index(os.path.join(store_lib.index_root(run_dir), name))

  published = builder.follow(run_dir, store=block_store, once=True, batch_size=8)
  assert published == [store_lib.index_dir(run_dir, 9)]
  store_lib.load_index(published[0], num_blocks=block_store.num_blocks)
  assert not [n for n in os.listdir(store_lib.index_root(run_dir)) if n.startswith(".staging")]


# ------------------------------------------------------------------------------ entry point


@pytest.fixture(autouse=True)
def _entry_point_gin(clean_gin):
  """The entry point's tests parse gin in this process: cleared (and unlocked) after each."""
  del clean_gin


def run_main(capsys, *args):
  code = entry.main(["build_index", "--gin_file=gin_configs/runs/build_index.gin", *args])
  out, err = capsys.readouterr()
  return code, out, err


@pytest.mark.parametrize("args, expected", [
    ((), "required macro RUN_DIR is not set"),
    (("--gin.RUN_DIR='/tmp/x'",), "required macro BLOCK_STORE is not set"),
    (("--gin.RUN_DIR='/tmp/x'", "--gin.BLOCK_STORE='/tmp/y'", "--gin.build_index_main.bogus=1"),
     "doesn't have a parameter named 'bogus'"),
    (("--gin.RUN_DIR='/tmp/x'", "--gin.BLOCK_STORE='/tmp/y'", "--gin.nothing.here=1"),
     "No configurable matching 'nothing'"),
    (("--gin.RUN_DIR='/tmp/x'", "--gin.BLOCK_STORE='/tmp/y'", "--onse"),
     "Unknown command line flag 'onse'"),
    (("--gin.RUN_DIR",), "expected --gin.KEY=VALUE"),
])
def test_entry_point_config_errors_are_one_line(capsys, args, expected):
  code, out, err = run_main(capsys, *args)
  assert code == 2
  lines = [line for line in err.splitlines() if line.strip()]
  assert len(lines) == 1, err
  assert lines[0].startswith("build_index: config error: ") and expected in lines[0], lines[0]


def test_entry_point_once_publishes_and_prints(tmp_path, capsys, params, block_store):
  run_dir = str(tmp_path / "run")
  ckpt.save_checkpoint(run_dir, 12, {"retriever": params}, config=TINY)
  code, out, err = run_main(capsys, f"--gin.RUN_DIR='{run_dir}'",
                            f"--gin.BLOCK_STORE='{block_store.path}'",
                            "--gin.build_index_main.batch_size=8",
                            "--gin.build_index_main.dtype='bfloat16'",
                            "--gin.build_index_main.length_bucket=16", "--once")
  assert code == 0, err
  assert f"build_index: published index step 12 at {store_lib.index_dir(run_dir, 12)}" in out
  loaded = store_lib.load_index(store_lib.index_dir(run_dir, 12))
  assert loaded.dtype == "bfloat16" and loaded.manifest["extra"]["length_bucket"] == 16
  # A runtime error (no such BlockStore) is one line too, status 1.
  code, out, err = run_main(capsys, f"--gin.RUN_DIR='{run_dir}'",
                            f"--gin.BLOCK_STORE='{tmp_path / 'missing'}'", "--once")
  assert code == 1 and len(err.strip().splitlines()) == 1 and "no BlockStore here" in err
