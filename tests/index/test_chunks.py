"""RETRO's chunk database: chunking by hand, keys against BERT's hidden states averaged in NumPy,
search and same-document exclusion against brute force, atomic verified publication, and the
toy world with the shipped toy BERT."""

import json
import os
import shutil

import numpy as np
import pytest

import realm_jax_tasks
from realm_jax import fileio
from realm_jax.convert import hf
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.data import vocab as vocab_lib
from realm_jax.index import chunks
from realm_jax.models.bert import BertModel
from realm_jax.toy_bert import SHIPPED_DIR

# Each sentence is single-wordpiece words and a ".": a document's token stream can be written
# down by hand. Block length 12 leaves 12 - 3 - 1 (title) = 8 body wordpieces, so "Alpha" is
# two blocks (4 + 4, then 4 + 2 wordpieces).
SMALL_DOCS = [("Alpha", "one two three. four five six. seven eight nine. ten."),
              ("Beta", "red green. blue."),
              ("Gamma", "cat.")]


@pytest.fixture(scope="module")
def bert():
  config, params, _ = hf.load_checkpoint(SHIPPED_DIR)
  return config.bert, params["bert"]


def write_store(directory, docs, max_block_len):
  directory.mkdir()
  src = directory / "docs.jsonl"
  with open(src, "w", encoding="utf-8") as f:
    for title, text in docs:
      f.write(json.dumps({"title": title, "text": text}) + "\n")
  corpus_build.build_block_store(sources_lib.JsonlSource(str(src)), str(directory / "blocks"),
                                 max_block_len=max_block_len)
  return block_store_lib.BlockStore.open(str(directory / "blocks"))


@pytest.fixture(scope="module")
def small(tmp_path_factory, bert):
  """(store, published database of chunk_len 4) of SMALL_DOCS."""
  tmp = tmp_path_factory.mktemp("small")
  store = write_store(tmp / "z", SMALL_DOCS, max_block_len=12)
  dest = chunks.build_chunk_database(store, str(tmp / "db"), bert[1], bert[0], chunk_len=4,
                                     model=SHIPPED_DIR)
  return store, chunks.ChunkDatabase.open(dest)


@pytest.fixture(scope="module")
def larger(tmp_path_factory, bert):
  """A database of 9 documents of 2 to 10 chunks (chunk_len 8)."""
  tmp = tmp_path_factory.mktemp("larger")
  topics = ["rivers", "mountains", "composers", "bridges", "planets", "deserts", "painters",
            "glaciers", "harbours"]
  words = ("old new long short red blue green river city king queen war peace music art "
           "north south east west river lake stone iron gold silver early late first last").split()
  rng = np.random.default_rng(0)  # random words: no two chunks alike, so no ties
  docs = [(topic.title(), " ".join(" ".join(rng.choice(words, 9)) + "."
                                   for _ in range(1 + i % 5)))
          for i, topic in enumerate(topics)]
  store = write_store(tmp / "z", docs, max_block_len=40)
  dest = chunks.build_chunk_database(store, str(tmp / "db"), bert[1], bert[0], chunk_len=8)
  db = chunks.ChunkDatabase.open(dest)
  counts = np.bincount(np.asarray(db.doc_ids))
  assert counts.min() >= 2 and len(set(counts.tolist())) >= 4, counts  # varied documents
  return db


def brute_force(queries, keys, k, allowed=None):
  """NumPy reference: (squared L2 distances [q, k], ids [q, k]), nearest first, ties by id;
  only the chunks `allowed[i]` ([q, C] bool) for query i."""
  queries, keys = np.asarray(queries, np.float64), np.asarray(keys, np.float64)
  distances = np.square(queries[:, None, :] - keys[None, :, :]).sum(-1)  # [q, C]
  if allowed is not None:
    distances = np.where(allowed, distances, np.inf)
  ids = np.stack([np.lexsort((np.arange(row.size), row))[:k] for row in distances])
  return np.take_along_axis(distances, ids, axis=1), ids


# ------------------------------------------------------------------------------ chunking


def test_chunking_a_hand_made_store(small):
  store, db = small
  assert list(store.doc_ids) == [0, 0, 1, 2]  # Alpha's text is two blocks
  vocab = vocab_lib.default_vocabulary()

  def ids(*rows):
    return np.array([[vocab.token_to_id(w) for w in row.split()] + [0] * (4 - len(row.split()))
                     for row in rows])

  # Alpha: 14 wordpieces -> 4 + 4 + 4 + 2 (padded); Beta: 5 -> 4 + 1; Gamma: 2 -> 2.
  tokens = ids("one two three .", "four five six .", "seven eight nine .", "ten .",
               "red green . blue", ".", "cat .")
  continuations = ids("four five six .", "seven eight nine .", "ten .", "",
                      ".", "", "")
  lengths = [4, 4, 4, 2, 4, 1, 2]
  doc_ids = [0, 0, 0, 0, 1, 1, 2]
  in_memory = chunks.chunk_block_store(store, 4)
  for got in (in_memory, db):
    np.testing.assert_array_equal(got.chunk_tokens if got is db else got.tokens, tokens)
    np.testing.assert_array_equal(
        got.continuation_tokens if got is db else got.continuations, continuations)
    np.testing.assert_array_equal(got.chunk_lengths if got is db else got.lengths, lengths)
    np.testing.assert_array_equal(got.doc_ids, doc_ids)
  assert db.chunk_tokens.dtype == store.tokens.dtype and db.manifest["num_documents"] == 3

  part = chunks.chunk_block_store(store, 4, doc_range=(1, 3))
  np.testing.assert_array_equal(part.tokens, tokens[4:])
  np.testing.assert_array_equal(part.doc_ids, doc_ids[4:])
  # RETRO's [N, F] values: chunk and continuation, 0 for a slot an approximate search missed.
  values = db.neighbour_tokens(np.array([[0, 5], [3, -1]]))
  assert values.shape == (2, 2, 8)
  np.testing.assert_array_equal(values[0, 0], np.r_[tokens[0], tokens[1]])
  np.testing.assert_array_equal(values[0, 1], np.r_[tokens[5], np.zeros(4)])
  np.testing.assert_array_equal(values[1, 1], np.zeros(8))


def test_keys_are_bert_hidden_states_averaged_over_the_chunk(small, bert):
  config, params = bert
  _, db = small
  for i in (0, 3, 5):  # a full chunk, then 2 and 1 real tokens: padding must not count
    n = int(db.chunk_lengths[i])
    ids = np.r_[vocab_lib.CLS_ID, db.chunk_tokens[i, :n], vocab_lib.SEP_ID][None]  # unpadded
    hidden, _ = BertModel(config).apply({"params": params}, ids.astype(np.int32))
    expected = np.asarray(hidden, np.float64)[0, 1:n + 1].mean(axis=0)  # [hidden]
    np.testing.assert_allclose(db.keys[i], expected, rtol=1e-5, atol=1e-5)
  row = np.asarray(db.index.embeddings[2], np.float64)
  assert row[-1] == pytest.approx(-0.5 * np.square(row[:-1]).sum(), rel=1e-6)


# ------------------------------------------------------------------------------ search


def test_top_k_matches_brute_force(larger):
  db = larger
  rng = np.random.default_rng(0)
  keys = np.asarray(db.keys)
  # The chunks' own keys, and keys moved off them (whose neighbours are not themselves).
  queries = np.concatenate([keys[::3], keys[1::4] + rng.normal(0, 0.3, keys[1::4].shape)])
  distances, ids = db.neighbours(db.searcher(), queries, 5)
  ref_distances, ref_ids = brute_force(queries, keys, 5)
  np.testing.assert_array_equal(ids, ref_ids)
  np.testing.assert_allclose(distances, ref_distances, rtol=1e-4, atol=1e-3)
  # The inner products the searcher ranks by, in NumPy, rank the same.
  scores = chunks.query_vectors(queries) @ np.asarray(db.index.embeddings).T  # [q, C]
  np.testing.assert_array_equal(
      np.stack([np.lexsort((np.arange(r.size), -r))[:5] for r in scores]), ids)


def test_same_document_exclusion_is_exact(larger):
  db = larger
  doc_ids = np.asarray(db.doc_ids)
  starts = chunks.training_sequences(doc_ids, 2)
  firsts = np.flatnonzero(np.r_[True, doc_ids[1:] != doc_ids[:-1]])
  counts = np.diff(np.r_[firsts, doc_ids.size])
  expected_starts = np.concatenate([f + 2 * np.arange(c // 2) for f, c in zip(firsts, counts)])
  np.testing.assert_array_equal(starts, expected_starts)

  searcher = db.searcher()
  distances, ids = db.sequence_neighbours(searcher, starts, 2, k=3)
  assert ids.shape == (starts.size, 2, 3)
  query_ids = (starts[:, None] + np.arange(2)).reshape(-1)  # [s * l]
  sequence_docs = doc_ids[query_ids]
  assert not np.any(doc_ids[ids.reshape(-1, 3)] == sequence_docs[:, None])
  allowed = doc_ids[None, :] != sequence_docs[:, None]  # [s * l, C]
  ref_distances, ref_ids = brute_force(np.asarray(db.keys)[query_ids], np.asarray(db.keys), 3,
                                       allowed)
  np.testing.assert_array_equal(ids.reshape(-1, 3), ref_ids)
  np.testing.assert_allclose(distances.reshape(-1, 3), ref_distances, rtol=1e-4, atol=1e-3)
  # Without the rule, each chunk's first neighbour is itself: the rule removed something.
  _, own = db.sequence_neighbours(searcher, starts, 2, k=3, exclude_same_document=False)
  np.testing.assert_array_equal(own[:, :, 0].reshape(-1), query_ids)

  with pytest.raises(ValueError, match="sequence 0 .* crosses from document"):
    db.sequence_neighbours(searcher, [firsts[1] - 1], 2)


# ------------------------------------------------------------------------------ publication


def test_publication_round_trips_and_is_verified(small, bert, tmp_path):
  store, db = small
  assert isinstance(db.chunk_tokens, np.memmap) and isinstance(db.index.embeddings, np.memmap)
  in_memory = chunks.chunk_block_store(store, 4)
  np.testing.assert_array_equal(db.chunk_tokens, in_memory.tokens)
  keys = chunks.chunk_keys(bert[1], bert[0], in_memory.tokens, in_memory.lengths, batch_size=8)
  np.testing.assert_allclose(db.keys, keys, rtol=1e-5, atol=1e-5)
  assert db.manifest["block_store_id"] == store.store_id and db.chunk_len == 4

  for name in (chunks.CONTINUATION_TOKENS, "index/0/embeddings.npy"):
    copy = tmp_path / name.replace("/", "_")
    shutil.copytree(db.path, copy)
    with open(copy / name, "r+b") as f:  # flip the last byte: same size, other contents
      f.seek(-1, os.SEEK_END)
      last = f.read(1)
      f.seek(-1, os.SEEK_END)
      f.write(bytes([last[0] ^ 1]))
    with pytest.raises(chunks.ChunkDatabaseError,
                       match=f"{copy}: .*{os.path.basename(name)} does not match its sha256"):
      chunks.ChunkDatabase.open(str(copy))
    chunks.ChunkDatabase.open(str(copy), verify="fast")  # only the hashes could tell
  with pytest.raises(chunks.ChunkDatabaseError, match="expected other-store"):
    chunks.ChunkDatabase.open(db.path, block_store_id="other-store")


def test_a_build_in_slabs_of_whole_documents_is_the_same(small, bert, tmp_path, monkeypatch):
  store, db = small
  # Slabs of one block: Alpha (two blocks) must still be one slab, the others one each.
  monkeypatch.setattr(chunks, "_SLAB_BLOCKS", 1)
  slabbed = chunks.ChunkDatabase.open(chunks.build_chunk_database(
      store, str(tmp_path / "db"), bert[1], bert[0], chunk_len=4))
  for name in ("chunk_tokens", "continuation_tokens", "chunk_lengths", "doc_ids"):
    np.testing.assert_array_equal(getattr(slabbed, name), getattr(db, name), err_msg=name)
  np.testing.assert_allclose(slabbed.keys, db.keys, rtol=1e-5, atol=1e-5)


def test_publication_is_atomic(small, bert, tmp_path, monkeypatch):
  store, db = small

  def fail(*args):
    raise OSError("disk full")

  monkeypatch.setattr(fileio, "write_manifest", fail)
  with pytest.raises(OSError, match="disk full"):
    chunks.build_chunk_database(store, str(tmp_path / "db"), bert[1], bert[0], chunk_len=4)
  assert os.listdir(tmp_path) == []  # no database, no staging directory
  monkeypatch.undo()

  dest = chunks.build_chunk_database(store, str(tmp_path / "db"), bert[1], bert[0],
                                     chunk_len=3)
  with pytest.raises(chunks.ChunkDatabaseError, match="already exists"):
    chunks.build_chunk_database(store, dest, bert[1], bert[0], chunk_len=4)
  assert chunks.ChunkDatabase.open(dest).chunk_len == 3
  chunks.build_chunk_database(store, dest, bert[1], bert[0], chunk_len=4, overwrite=True)
  assert chunks.ChunkDatabase.open(dest).chunk_len == 4
  assert os.listdir(tmp_path) == ["db"]
  # A staging directory is never loaded, even a complete one.
  staging = tmp_path / "db.staging-somehost-123-abcd"
  shutil.copytree(dest, staging)
  with pytest.raises(chunks.ChunkDatabaseError, match="staging directory"):
    chunks.ChunkDatabase.open(str(staging))


# ------------------------------------------------------------------------------ toy world


def test_toy_world_with_the_shipped_toy_bert(bert, tmp_path):
  store = block_store_lib.BlockStore.open(realm_jax_tasks.toy_block_store_dir())
  dest = chunks.build_chunk_database(store, str(tmp_path / "db"), bert[1], bert[0],
                                     chunk_len=chunks.TOY_CHUNK_LEN, doc_range=(0, 100))
  db = chunks.ChunkDatabase.open(dest, block_store_id=store.store_id)
  assert 200 <= db.num_chunks <= 500 and db.manifest["num_documents"] == 100
  keys = np.asarray(db.keys)
  assert np.all(np.isfinite(keys)) and np.all(np.abs(keys).sum(axis=1) > 0)

  searcher = db.searcher()
  every = np.arange(db.num_chunks)
  distances, ids = db.neighbours(searcher, keys, 1)
  # Each chunk is its own nearest neighbour; a chunk whose text repeats elsewhere (templated
  # sentences) may get an identical copy first, at distance 0 and with the same tokens.
  texts = [tuple(row) for row in np.asarray(db.chunk_tokens)]
  repeated = np.array([texts.count(t) > 1 for t in texts])
  assert repeated.sum() < db.num_chunks // 4
  np.testing.assert_array_equal(ids[~repeated, 0], every[~repeated])
  assert all(texts[i] == texts[j] for i, j in zip(every, ids[:, 0]))
  np.testing.assert_allclose(distances[:, 0], 0.0, atol=1e-3)

  doc_ids = np.asarray(db.doc_ids)
  _, ids = db.neighbours(searcher, keys, 4, exclude_doc_ids=doc_ids)
  assert np.all(ids >= 0) and not np.any(doc_ids[ids] == doc_ids[:, None])
  starts = chunks.training_sequences(doc_ids, 2)
  _, ids = db.sequence_neighbours(searcher, starts, 2, k=chunks.RETRO_TRAIN_NEIGHBOURS)
  assert not np.any(doc_ids[ids] == doc_ids[starts][:, None, None])
  assert db.neighbour_tokens(ids).shape == (starts.size, 2, 2, 2 * chunks.TOY_CHUNK_LEN)
