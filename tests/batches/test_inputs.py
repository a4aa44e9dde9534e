"""Trainer inputs (issue 5): resumable seqio batches, per-host shards, ICT batches, and REALM
pretraining batches retrieved with the query tower of the index's own checkpoint."""

import dataclasses
import functools
import json
import os

import jax
import numpy as np
import pytest
import seqio
import tensorflow as tf

import realm_jax_tasks  # registers the tasks
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.data import toy_world
from realm_jax.data import vocab as vocab_lib
from realm_jax.index import builder
from realm_jax.batches import pretraining_batches
from realm_jax.index import retrieval
from realm_jax.index import store as store_lib
from realm_jax.index import swap
from realm_jax.models import config as config_lib
from realm_jax.models.realm import IctModel, RealmPretrainModel
from realm_jax.models.reader import RealmKnowledgeAugEncoder
from realm_jax.models.retriever import RealmRetriever
from realm_jax import checkpoints as ckpt
from realm_jax.batches import seqio_batches
from realm_jax.training import trainer as trainer_lib
from realm_jax_tasks import TOY_BLOCK_LEN

TINY = config_lib.RealmConfig(bert=config_lib.tiny_bert(), proj_size=16)
COUNTING_TASK = "test_inputs_counting"
NUM_COUNTING = 37


@pytest.fixture(scope="module", autouse=True)
def cache(private_cache):
  return private_cache


@pytest.fixture(scope="module", autouse=True)
def counting_task():
  """A task of NUM_COUNTING examples {"x": [i, -i]}: fast, and every example is identifiable."""

  def dataset_fn(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    return tf.data.Dataset.range(NUM_COUNTING).map(
        lambda i: {"x": tf.cast(tf.stack([i, -i]), tf.int32)})

  feature = seqio.Feature(seqio.PassThroughVocabulary(size=0), add_eos=False, dtype=tf.int32)
  seqio.TaskRegistry.remove(COUNTING_TASK)
  seqio.TaskRegistry.add(COUNTING_TASK, source=seqio.FunctionDataSource(dataset_fn, ("train",)),
                         output_features={"x": feature})
  yield COUNTING_TASK
  seqio.TaskRegistry.remove(COUNTING_TASK)


def ids_of(batches):
  return [b["x"][:, 0].tolist() for b in batches]


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert sorted(x) == sorted(y)
    for key in x:
      np.testing.assert_array_equal(x[key], y[key], err_msg=key)


# ------------------------------------------------------------------------------ SeqioBatches


def test_same_seed_same_batches_and_each_epoch_is_a_permutation():
  make = lambda seed: seqio_batches.SeqioBatches(COUNTING_TASK, batch_size=4, seed=seed,
                                                 num_shards=1, shard_index=0)
  a, b, c = take(make(1), 20), take(make(1), 20), take(make(2), 20)
  assert ids_of(a) == ids_of(b) and ids_of(a) != ids_of(c)
  # 37 examples, batches of 4: 9 per epoch (one example dropped), each epoch a new order.
  epochs = [sum(ids_of(a[i:i + 9]), []) for i in (0, 9)]
  for epoch in epochs:
    assert len(set(epoch)) == 36 and set(epoch) <= set(range(NUM_COUNTING))
  assert epochs[0] != epochs[1]
  assert a[0]["x"].shape == (4, 2) and a[0]["x"].dtype == np.int32


def test_every_epoch_is_read_without_tf_data_autotuning(monkeypatch):
  # An autotuned iterator left idle (an evaluation stream) took up to a minute to delete.
  from realm_jax.data import tensorflow_setup  # pylint: disable=g-import-not-at-top
  seen = []

  def recording(dataset):
    quiet = real(dataset)
    seen.append(quiet.options().autotune.enabled)
    return quiet

  real = tensorflow_setup.without_autotune
  monkeypatch.setattr(tensorflow_setup, "without_autotune", recording)
  take(seqio_batches.SeqioBatches(COUNTING_TASK, batch_size=4, seed=1, num_shards=1, shard_index=0),
       10)  # two epochs of 9 batches
  assert seen == [False, False]


def test_restore_continues_exactly_where_the_straight_run_was():
  make = lambda: seqio_batches.SeqioBatches(COUNTING_TASK, batch_size=4, seed=5, num_shards=1,
                                            shard_index=0)
  straight = take(make(), 25)  # crosses two epoch boundaries (9 batches each)
  for k in (0, 3, 9, 13):
    first = make()
    take(first, k)
    state = json.loads(json.dumps(first.state()))  # what a checkpoint stores
    assert state["batches_consumed"] == k == 9 * state["epoch"] + state["batches_in_epoch"]
    resumed = make()
    resumed.restore(state)
    assert_batches_equal(take(resumed, 25 - k), straight[k:])
    # The minimal state (position only) walks the epochs instead of jumping to one.
    minimal = make()
    minimal.restore({key: state[key] for key in ("task", "seed", "batches_consumed")})
    assert_batches_equal(take(minimal, 25 - k), straight[k:])


def test_every_host_can_restore_host_0s_state():
  """Hosts step in lockstep, so a trainer may save one host's state and restore it everywhere;
  each host then finds its own position (shards of 19 and 18 examples: 4 batches per epoch)."""
  make = lambda index: seqio_batches.SeqioBatches(COUNTING_TASK, batch_size=4, seed=5, num_shards=2,
                                                  shard_index=index)
  host0 = make(0)
  take(host0, 6)
  straight = take(make(1), 10)
  host1 = make(1)
  host1.restore(json.loads(json.dumps(host0.state())))
  assert (host1.epoch, host1.batches_consumed) == (1, 6)
  assert_batches_equal(take(host1, 4), straight[6:])


def test_restore_refuses_another_stream():
  it = seqio_batches.SeqioBatches(COUNTING_TASK, batch_size=4, seed=5, num_shards=1, shard_index=0)
  state = it.state()
  other = seqio_batches.SeqioBatches(COUNTING_TASK, batch_size=4, seed=6, num_shards=1,
                                     shard_index=0)
  with pytest.raises(ValueError, match=r"another input stream: seed 5 \(this run: 6\)"):
    other.restore(state)


def toy_masked_queries(batch_size, seed):
  """Masked queries of the toy world on one host; a small shuffle buffer, so the first batch
  does not wait for a whole epoch of the Python example generator."""
  return pretraining_batches.masked_query_batches("toy", batch_size=batch_size, seed=seed,
                                                  num_shards=1, shard_index=0,
                                                  shuffle_buffer_size=64)


def test_restore_on_the_toy_pretraining_task():
  make = lambda: toy_masked_queries(batch_size=8, seed=0)
  straight = take(make(), 5)
  first = make()
  take(first, 2)
  resumed = make()
  resumed.restore(first.state())
  assert_batches_equal(take(resumed, 3), straight[2:])
  assert sorted(straight[0]) == sorted(pretraining_batches.MASKED_QUERY_KEYS)
  assert straight[0]["query_ids"].shape == (8, 96)


def test_shards_split_the_data_without_overlap():
  seen = []
  for index in range(3):
    it = seqio_batches.SeqioBatches(COUNTING_TASK, batch_size=2, seed=0, num_epochs=1,
                                    shard_index=index, num_shards=3, drop_remainder=False)
    seen.append(sum(ids_of(list(it)), []))
  assert [len(s) for s in seen] == [13, 12, 12]
  assert sorted(sum(seen, [])) == list(range(NUM_COUNTING))  # a partition: no overlap, no loss


def test_defaults_shard_by_process_and_finite_epochs_end():
  it = seqio_batches.SeqioBatches(COUNTING_TASK, batch_size=10, seed=0, num_epochs=2)
  assert (it.shard_index, it.num_shards) == (jax.process_index(), jax.process_count())
  assert len(list(it)) == 6 and it.epoch == 2  # 3 full batches per epoch


def test_unknown_task_is_a_clear_one_line_error():
  with pytest.raises(seqio_batches.UnknownTaskError) as info:
    seqio_batches.SeqioBatches("realm_toy_salient_spam", batch_size=2)
  message = str(info.value)
  assert "\n" not in message
  assert "unknown seqio task or mixture 'realm_toy_salient_spam'" in message
  assert "realm_toy_salient_span" in message


def test_too_small_shard_is_an_error_not_an_endless_loop():
  it = seqio_batches.SeqioBatches(COUNTING_TASK, batch_size=64, seed=0, num_shards=1, shard_index=0)
  with pytest.raises(ValueError, match="fewer examples than the per-host batch size"):
    next(it)


# ------------------------------------------------------------------------------ ICT


def random_params(init_fn, seed, std=0.05):
  """Parameters of the right shapes without running init (slow on CPU)."""
  shapes = jax.eval_shape(init_fn, jax.random.PRNGKey(0))
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.normal(0, std, s.shape).astype(s.dtype), shapes)


def test_ict_batches_have_exactly_the_ict_model_keys():
  batch = next(seqio_batches.ict_batches("toy", batch_size=4, seed=0, shuffle_buffer_size=64))
  assert sorted(batch) == sorted(seqio_batches.ICT_BATCH_KEYS)
  spec = seqio_batches.ict_batches("toy", batch_size=4).element_spec()  # the task's features
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
      k: ((4,) + v.shape, v.dtype) for k, v in spec.items()}
  assert batch["query_ids"].shape == batch["query_mask"].shape == (4, 64)
  for key in ("block_ids", "block_type_ids", "block_mask"):
    assert batch[key].shape == (4, TOY_BLOCK_LEN) and batch[key].dtype == np.int32
  assert np.all(batch["block_ids"][:, 0] == vocab_lib.CLS_ID)
  model = IctModel(TINY)
  aux = jax.jit(model.eval_fn)(random_params(model.init, 0), batch)
  assert float(aux["weight_sum"]) == 4 and np.isfinite(float(aux["loss_sum"]))


# ------------------------------------------------------------------------------ pretraining


@pytest.fixture(scope="module")
def toy_store(tmp_path_factory):
  """The toy world's first 100 documents as a BlockStore (288-wordpiece rows, like the full
  toy store): embedding all 2,511 toy blocks takes ~20 s per index on this CPU."""
  dest = str(tmp_path_factory.mktemp("z") / "blocks")
  source = sources_lib.JsonlSource(os.path.join(toy_world.toy_world_dir(), toy_world.CORPUS_FILE))
  corpus_build.build_block_store(source, dest, limit=100)
  store = block_store_lib.BlockStore.open(dest)
  assert store.max_block_len == 288 and store.num_blocks >= 50
  return store


@pytest.fixture(scope="module")
def world(tmp_path_factory, toy_store):
  """An ICT checkpoint (-> index 0) and a pretraining run's checkpoint 20 (-> index 20)."""
  root = tmp_path_factory.mktemp("runs")
  ict_dir, run_dir = str(root / "ict"), str(root / "run")
  model = RealmPretrainModel(TINY)
  # Weights of std 0.5 in the retriever make its embeddings depend visibly on the query (with
  # BERT-like 0.02-0.05 a random tower maps every query to nearly the same point).
  ict_params = {"retriever": random_params(IctModel(TINY).init, 1, std=0.5)["retriever"]}
  run_params = {"retriever": random_params(IctModel(TINY).init, 2, std=0.5)["retriever"],
                "encoder": random_params(model.init, 3)["encoder"]}
  ict_step_dir = ckpt.save_checkpoint(ict_dir, 5, ict_params, config=TINY)
  ckpt.save_checkpoint(run_dir, 20, run_params, config=TINY)
  for step, params, checkpoint in ((0, ict_params, ict_step_dir),
                                   (20, run_params, ckpt.checkpoint_path(run_dir, 20))):
    embeddings = builder.embed_blocks(params["retriever"], TINY, toy_store, batch_size=64,
                                      progress=None)  # [num_blocks, proj]
    store_lib.publish_index(run_dir, step, embeddings, block_store_id=toy_store.store_id,
                            checkpoint=checkpoint, keep=None,
                            extra={"checkpoint_step": 5 if step == 0 else 20})
  return {"run_dir": run_dir, "ict_params": ict_params, "run_params": run_params,
          "model": model}


def reference_query_embeddings(retriever_params, batch):
  """The query tower applied directly (no jit, no sharding): [B, proj] float64."""
  emb = RealmRetriever(TINY).apply(
      {"params": retriever_params}, batch["query_ids"], np.zeros_like(batch["query_ids"]),
      batch["query_mask"], deterministic=True, method=RealmRetriever.embed_queries)
  return np.asarray(emb, np.float64)


def check_candidates_are_the_brute_force_top_k(batch, query_emb, index_emb, num_candidates):
  """Slots 1.. of every kept example are the NumPy top-(K-1) of query_emb @ index_emb.T.

  Scores that differ by less than float32 rounding may come in either order, so the check is:
  the retrieved blocks' scores equal the best K-1 scores (to rounding), the blocks are
  distinct, and where no two of the top K scores are that close, the ids are exactly NumPy's.
  """
  scores = query_emb @ np.asarray(index_emb, np.float64).T  # [B, num_blocks]
  tol = 1e-5 * np.abs(scores).max()
  kept = batch["example_mask"] > 0
  assert kept.sum() >= len(kept) // 2  # duplicates are rare: most examples are kept
  # The toy X is not the corpus: no example has a source block to remove, so the candidates
  # are the top K-1 in rank order.
  assert not batch["source_removed"].any()
  got = batch["candidate_block_ids"][:, 1:]  # [B, K-1]
  best = -np.sort(-scores, axis=1)[:, :num_candidates]  # [B, K] descending
  order = np.argsort(-scores, axis=1, kind="stable")[:, :num_candidates - 1]  # [B, K-1]
  for row in np.flatnonzero(kept):
    assert len(set(got[row].tolist())) == num_candidates - 1
    np.testing.assert_allclose(scores[row, got[row]], best[row, :-1], rtol=0, atol=tol)
    if np.all(-np.diff(best[row]) > tol):
      np.testing.assert_array_equal(got[row], order[row])


def test_pretraining_batches_retrieve_with_the_index_snapshot(world, toy_store):
  run_dir, model = world["run_dir"], world["model"]
  loader = retrieval.make_index_loader(run_dir, TINY)
  with swap.IndexWatcher(run_dir, load_fn=loader, check_every_steps=1,
                         block_store_id=toy_store.store_id, dim=TINY.proj_size) as watcher:
    retriever = watcher.start(initial_step=0)
    assert isinstance(retriever, retrieval.IndexRetriever) and retriever.step == 0
    masked = toy_masked_queries(batch_size=4, seed=0)
    batches = pretraining_batches.PretrainingBatches(masked, toy_store, watcher,
                                                     num_candidates=8, retrieval_margin=2)
    batch = next(batches)
    skipped = int((batch["example_mask"] == 0).sum())

    b, k = 4, 8
    expected_shapes = {
        "query_ids": (b, 96), "query_type_ids": (b, 96), "query_mask": (b, 96),
        "candidate_input_ids": (b, k, 288), "candidate_type_ids": (b, k, 288),
        "candidate_mask": (b, k, 288), "reader_ids": (b, k, 384),
        "reader_type_ids": (b, k, 384), "reader_mask": (b, k, 384),
        "mlm_positions": (b, 10), "mlm_targets": (b, 10), "mlm_weights": (b, 10),
        "example_mask": (b,), "candidate_block_ids": (b, k), "source_removed": (b,),
        "example_index_step": (b,), "index_step": ()}
    assert {key: value.shape for key, value in batch.items()} == expected_shapes
    assert int(batch["index_step"]) == 0 and np.all(batch["example_index_step"] == 0)
    # Slot 0 is the null document: [CLS] [SEP] [SEP] for the embedder.
    assert np.all(batch["candidate_block_ids"][:, 0] == pretraining_batches.NULL_BLOCK)
    assert np.all(batch["candidate_input_ids"][:, 0, :3] == [vocab_lib.CLS_ID, vocab_lib.SEP_ID,
                                                             vocab_lib.SEP_ID])
    # Index 0 is searched with the ICT checkpoint's query tower (the index's own snapshot),
    # not with the run's parameters.
    query_emb = reference_query_embeddings(world["ict_params"]["retriever"], batch)
    live_emb = reference_query_embeddings(world["run_params"]["retriever"], batch)
    got_emb = retriever.embed_queries(batch["query_ids"], batch["query_mask"])
    np.testing.assert_allclose(got_emb, query_emb, rtol=1e-4, atol=1e-4)
    assert np.abs(got_emb - live_emb).max() > 0.1
    assert np.abs(query_emb[0] - query_emb[1:]).max() > 0.01  # the rows really are distinct
    check_candidates_are_the_brute_force_top_k(batch, query_emb, retriever.index.embeddings, k)

    # The model's eval step runs on the batch.
    aux = jax.jit(model.eval_fn)(world["run_params"], batch)
    assert all(np.isfinite(float(v)) for v in aux.values()), aux
    assert float(aux["example_sum"]) == batch["example_mask"].sum()

    # A step boundary swaps in index 20; the next batch is retrieved with checkpoint 20's tower.
    watcher.maybe_swap(1)
    watcher.maybe_swap(2)  # starts the background load
    assert watcher.wait(60)
    assert watcher.maybe_swap(3).step == 20
    batch = next(batches)
    skipped += int((batch["example_mask"] == 0).sum())
    assert int(batch["index_step"]) == 20 and np.all(batch["example_index_step"] == 20)
    query_emb = reference_query_embeddings(world["run_params"]["retriever"], batch)
    check_candidates_are_the_brute_force_top_k(batch, query_emb, watcher.current.index.embeddings,
                                               k)

    counts = batches.skip_counts()
    assert set(counts) == set(pretraining_batches.SKIP_REASONS) and sum(counts.values()) == skipped
    assert batches.metrics()["retrieval/skipped_fraction"] == skipped / 8
    assert batches.state()["last_index_step"] == 20


def test_pretraining_rows_get_their_own_retrievals(toy_store):
  """Each example's candidates come from its own row of the search result (k with margin)."""
  calls = []

  def fn(query_ids, query_mask, k):
    calls.append(k)
    rows = np.arange(len(query_ids))[:, None]
    ids = (rows * 11 + np.arange(k)[None, :]) % toy_store.num_blocks  # [B, k], distinct rows
    return np.zeros(ids.shape, np.float32), ids.astype(np.int32)

  masked = toy_masked_queries(batch_size=4, seed=0)
  batches = pretraining_batches.PretrainingBatches(
      masked, toy_store, retrieval.FunctionRetriever(7, fn, block_store_id=toy_store.store_id),
      num_candidates=5, retrieval_margin=3)
  batch = next(batches)
  assert calls == [8] and int(batch["index_step"]) == 7
  # The declared schema is what the iterator yields (all but the 0-d host metadata); hand-
  # stated: query 96, K 5, the store's blocks, reader rows query + block, 10 mask slots.
  spec = batches.element_spec()
  assert {k: (v.shape, np.dtype(v.dtype)) for k, v in batch.items() if k != "index_step"} == {
      k: ((4,) + v.shape, np.dtype(v.dtype)) for k, v in spec.items()}
  block_len = toy_store.max_block_len
  assert spec["reader_ids"].shape == (5, 96 + block_len) and spec["mlm_weights"].shape == (10,)
  assert spec["candidate_mask"].shape == (5, block_len) and spec["mlm_weights"].dtype == np.float32
  expected = (np.arange(4)[:, None] * 11 + np.arange(4)[None, :]) % toy_store.num_blocks
  np.testing.assert_array_equal(batch["candidate_block_ids"][:, 1:], expected)
  wrong_store = retrieval.FunctionRetriever(7, fn, block_store_id="another-store")
  batches.set_retriever(wrong_store)
  with pytest.raises(ValueError, match="embeds BlockStore another-store"):
    next(batches)


def test_pretraining_state_delegates_and_restores(world, toy_store):
  run_dir = world["run_dir"]
  loaded = store_lib.load_index(store_lib.index_dir(run_dir, 20))
  retriever = retrieval.make_index_loader(run_dir, TINY)(loaded)
  make = lambda: pretraining_batches.PretrainingBatches(
      toy_masked_queries(batch_size=4, seed=3),
      toy_store, retriever)
  straight = take(make(), 3)
  first = make()
  take(first, 1)
  state = json.loads(json.dumps(first.state()))
  assert state["batches_consumed"] == 1 and state["task"] == "realm_toy_salient_span"
  resumed = make()
  resumed.restore(state)
  assert resumed.skip_counts() == first.skip_counts()
  assert_batches_equal(take(resumed, 2), straight[1:])


def test_index_loader_finds_the_checkpoint_and_refuses_a_mismatch(world, tmp_path):
  run_dir = world["run_dir"]
  loaded = store_lib.load_index(store_lib.index_dir(run_dir, 0))
  # The manifest names the ICT checkpoint step directory, outside this run.
  assert retrieval.index_checkpoint_dir(run_dir, loaded).endswith(os.path.join("ict", "checkpoints",
                                                                               "5"))
  other = config_lib.RealmConfig(bert=config_lib.tiny_bert(hidden_size=64), proj_size=16)
  with pytest.raises(ckpt.CheckpointError, match="another model size"):
    retrieval.make_index_loader(run_dir, other)(loaded)
  # An index whose checkpoint is gone cannot be searched: its query tower is missing.
  moved = store_lib.LoadedIndex(path=loaded.path, step=7, embeddings=loaded.embeddings,
                                manifest={**loaded.manifest, "checkpoint": str(tmp_path / "x")},
                                published_unix=loaded.published_unix)
  with pytest.raises(ckpt.CheckpointError, match="cannot find the checkpoint"):
    retrieval.index_checkpoint_dir(run_dir, moved)
  # The first index (step 0) can be pointed at the ICT checkpoint when its recorded path moved.
  ict_step_dir = retrieval.index_checkpoint_dir(run_dir, loaded)
  moved_first = dataclasses.replace(moved, step=0)
  assert retrieval.index_checkpoint_dir(run_dir, moved_first,
                                        first_checkpoint_dir=ict_step_dir) == ict_step_dir


def test_an_index_carries_its_query_tower_past_its_checkpoints_pruning(world, toy_store,
                                                                       tmp_path):
  # A builder slower than the trainer's checkpoint cadence: by the time the trainer loads the
  # index of checkpoint 30, the trainer has pruned that checkpoint.
  run_dir = str(tmp_path / "run")
  params = {"retriever": random_params(IctModel(TINY).init, 4, std=0.5)["retriever"]}
  ckpt.save_checkpoint(run_dir, 30, params, config=TINY)
  path = builder.build_index(run_dir, 30, store=toy_store, batch_size=64, progress=None)
  assert store_lib.QUERY_TOWER in store_lib.load_index(path).manifest["files"]
  ckpt.save_checkpoint(run_dir, 40, world["run_params"], config=TINY, keep=1)
  assert ckpt.list_checkpoint_steps(run_dir) == [40]
  loaded = store_lib.load_index(path)  # verifies the tower's sha256 with the rest
  with pytest.raises(ckpt.CheckpointError, match="cannot find the checkpoint"):
    retrieval.index_checkpoint_dir(run_dir, loaded)
  retriever = retrieval.make_index_loader(run_dir, TINY)(loaded)
  batch = next(toy_masked_queries(batch_size=4, seed=0))
  np.testing.assert_allclose(retriever.embed_queries(batch["query_ids"], batch["query_mask"]),
                             reference_query_embeddings(params["retriever"], batch),
                             rtol=1e-4, atol=1e-4)
  # A tower of another model size is refused in one line, naming the file.
  other = config_lib.RealmConfig(bert=config_lib.tiny_bert(hidden_size=64), proj_size=16)
  with pytest.raises(ckpt.CheckpointError,
                     match=r"query_tower\.msgpack: a query tower of another model"):
    retrieval.index_query_tower(loaded, other)
  # A flipped byte in it is refused when the index is loaded.
  tower_path = os.path.join(path, store_lib.QUERY_TOWER)
  data = bytearray(open(tower_path, "rb").read())
  data[len(data) // 2] ^= 0xFF
  with open(tower_path, "wb") as f:
    f.write(bytes(data))
  with pytest.raises(store_lib.IndexLoadError, match="query_tower.msgpack does not match its "
                                                     "sha256"):
    store_lib.load_index(path)


# ------------------------------------------------------------------------------ length buckets


def spread_retriever(store):
  """A retriever of candidates spread over the store by the query's wordpieces (blocks of
  different lengths in every batch), the same for the same query."""

  def fn(query_ids, query_mask, k):
    first = np.asarray(query_ids, np.int64).sum(axis=1)[:, None]  # [B, 1]
    ids = (first + np.arange(k)[None, :] * 13) % store.num_blocks  # [B, k], distinct rows
    return np.zeros(ids.shape, np.float32), ids.astype(np.int32)

  return retrieval.FunctionRetriever(3, fn, block_store_id=store.store_id)


def spread_pretraining_batches(store, batch_size=4, seed=0):
  return pretraining_batches.PretrainingBatches(
      toy_masked_queries(batch_size=batch_size, seed=seed), store, spread_retriever(store),
      num_candidates=5)


def bucketed(batches, length_bucket=32):
  return seqio_batches.LengthBucketed(batches, keys=pretraining_batches.READER_ROW_KEYS,
                                      mask_key="reader_mask", length_bucket=length_bucket,
                                      name="reader")


def test_length_buckets_cut_only_the_reader_rows_padding(toy_store):
  full = take(spread_pretraining_batches(toy_store), 4)
  cut_batches = bucketed(spread_pretraining_batches(toy_store))
  cut = take(cut_batches, 4)
  spec = cut_batches.element_spec()
  assert spec == spread_pretraining_batches(toy_store).element_spec()  # the widest: 96 + 288
  assert spec["reader_ids"].shape == (5, 96 + toy_store.max_block_len)
  widths = []
  for padded, batch in zip(full, cut):
    # [CLS] query [SEP] body [SEP] from position 0: the longest row, by hand.
    longest = int(padded["reader_mask"].sum(axis=-1).max())
    width = -(-longest // 32) * 32
    widths.append(width)
    assert width < 384 and batch["reader_ids"].shape == (4, 5, width)
    assert sorted(batch) == sorted(padded)
    for key, value in padded.items():
      if key in pretraining_batches.READER_ROW_KEYS:
        np.testing.assert_array_equal(batch[key], value[..., :width], err_msg=key)
        assert not value[..., width:].any(), key  # only padding was cut
      else:
        np.testing.assert_array_equal(batch[key], value, err_msg=key)
    # The schema of a cut batch: the declared one with the reader rows at the batch's width.
    assert {k: (v.shape, np.dtype(v.dtype)) for k, v in batch.items() if k != "index_step"} == {
        k: ((4,) + v.shape, np.dtype(v.dtype))
        for k, v in seqio_batches.spec_at_width(spec, pretraining_batches.READER_ROW_KEYS,
                                                width).items()}
  assert cut_batches.widths == set(widths) and len(set(widths)) > 1
  metrics = cut_batches.metrics()
  assert metrics["input/reader_widths"] == len(set(widths))
  assert metrics["input/reader_width"] == np.mean(widths)
  assert "retrieval/skipped_fraction" in metrics  # the wrapped iterator's metrics too
  # length_bucket=0 cuts nothing.
  uncut = next(bucketed(spread_pretraining_batches(toy_store), length_bucket=0))
  assert uncut["reader_ids"].shape == (4, 5, 384)


def test_a_cut_batch_gives_the_padded_batchs_logits_losses_and_gradients(toy_store):
  """The padded computation is the reference: the same logits at every mask position, the same
  loss, metrics and gradients, to float32 rounding; a cut into a real token breaks it."""
  model = RealmPretrainModel(TINY)
  # Weights of std 0.5: a token more or less moves the outputs far beyond the tolerance.
  params = random_params(model.init, 5, std=0.5)
  padded = next(spread_pretraining_batches(toy_store, seed=1))
  longest = int(padded["reader_mask"].sum(axis=-1).max())
  cut = seqio_batches.cut_rows(padded, pretraining_batches.READER_ROW_KEYS,
                               builder.bucket_width(padded["reader_mask"], 32))
  assert cut["reader_ids"].shape[-1] < padded["reader_ids"].shape[-1]

  def logits(batch):  # [B, K, M, V] at the mask positions
    return RealmKnowledgeAugEncoder(TINY).apply(
        {"params": params["encoder"]}, batch["reader_ids"], batch["reader_type_ids"],
        batch["reader_mask"], batch["mlm_positions"])

  eval_and_grad = jax.jit(lambda p, b: (model.eval_fn(p, b),
                                        jax.grad(lambda q: model.eval_fn(q, b)["loss_sum"])(p)))
  reference_logits = np.asarray(logits(padded))
  np.testing.assert_allclose(logits(cut), reference_logits, rtol=1e-5, atol=1e-5)
  reference_aux, reference_grads = eval_and_grad(params, padded)
  aux, grads = eval_and_grad(params, cut)
  assert float(reference_aux["loss_sum"]) > 0 and float(reference_aux["weight_sum"]) > 0
  for key in reference_aux:
    np.testing.assert_allclose(aux[key], reference_aux[key], rtol=1e-5, atol=1e-5, err_msg=key)
  for path, reference in jax.tree_util.tree_leaves_with_path(reference_grads):
    got = np.asarray(functools.reduce(lambda tree, key: tree[key.key], path, grads))
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-6,
                               err_msg=jax.tree_util.keystr(path))
  # The comparison can fail: cut one position into the longest row (its final [SEP]) and
  # that row's logits move by over 100 times the tolerance.
  too_short = seqio_batches.cut_rows(padded, pretraining_batches.READER_ROW_KEYS, longest - 1)
  assert np.abs(np.asarray(logits(too_short)) - reference_logits).max() > 1e-3


def test_each_reader_width_is_one_compilation(toy_store):
  model = RealmPretrainModel(TINY)
  params = random_params(model.init, 6)
  step = jax.jit(model.eval_fn)
  cut_batches = bucketed(spread_pretraining_batches(toy_store, batch_size=2), length_bucket=16)
  for batch in take(cut_batches, 6):
    step(params, trainer_lib.device_batch(batch))
  assert 1 < len(cut_batches.widths) < 6
  assert step._cache_size() == len(cut_batches.widths)  # pylint: disable=protected-access


def test_length_bucketed_batches_resume_and_delegate(toy_store):
  straight = take(bucketed(spread_pretraining_batches(toy_store)), 3)
  first = bucketed(spread_pretraining_batches(toy_store))
  take(first, 1)
  state = json.loads(json.dumps(first.state()))
  assert state == first.batches.state()  # the wrapped iterator's resume protocol
  resumed = bucketed(spread_pretraining_batches(toy_store))
  resumed.restore(state)
  assert_batches_equal(take(resumed, 2), straight[1:])
  # Everything else is the wrapped iterator's: the job hands it the index watcher this way.
  assert resumed.skip_counts() == resumed.batches.skip_counts()
  resumed.set_retriever(retrieval.FunctionRetriever(3, None, block_store_id="another-store"))
  with pytest.raises(ValueError, match="embeds BlockStore another-store"):
    next(resumed)
  with pytest.raises(AttributeError):
    resumed.no_such_attribute  # pylint: disable=pointless-statement


@pytest.mark.parametrize("length_bucket, hosts, expected", [
    (0, 1, 0), (32, 1, 32), (0, 4, 0),
    (32, 4, "the 4 hosts' batches must have one shape"), (-1, 1, "length_bucket must be"),
    (32.0, 1, "length_bucket must be"), (True, 1, "length_bucket must be")])
def test_check_row_bucket(length_bucket, hosts, expected):
  if isinstance(expected, str):
    with pytest.raises(ValueError, match=expected):
      seqio_batches.check_row_bucket(length_bucket, hosts)
  else:
    assert seqio_batches.check_row_bucket(length_bucket, hosts) == expected
