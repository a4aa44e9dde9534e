"""Knowledge corpus -> BlockStore (REALM_SPEC 7, 11, 12, 24): packing, sources, bad input,
determinism, atomic builds, open() refusals, embedder inputs, the CLI, and builds with worker
processes (byte for byte those of one process)."""

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sentences as sentences_lib
from realm_jax.data import sources as sources_lib
from realm_jax.data import vocab as vocab_lib

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLS, SEP = vocab_lib.CLS_ID, vocab_lib.SEP_ID


@pytest.fixture(scope="module")
def vocab():
  return vocab_lib.default_vocabulary()


def write_jsonl(path, docs):
  with open(path, "w", encoding="utf-8") as f:
    for doc in docs:
      f.write(json.dumps(doc, ensure_ascii=False) + "\n")
  return str(path)


def build_jsonl(tmp_path, docs, name="store", **kwargs):
  src = write_jsonl(tmp_path / f"{name}.jsonl", docs)
  report = corpus_build.build_block_store(sources_lib.JsonlSource(src), str(tmp_path / name),
                                          **kwargs)
  return report, block_store_lib.BlockStore.open(str(tmp_path / name))


def leftovers(tmp_path):
  return sorted(p for p in os.listdir(tmp_path) if ".staging-" in p or ".old-" in p)


# ------------------------------------------------------------------------------ basics


def test_content_uid_is_big_endian_sha256_prefix():
  digest = hashlib.sha256("Title\x00Body text é".encode("utf-8")).digest()
  assert block_store_lib.content_uid("Title", "Body text é") == int.from_bytes(digest[:8], "big")
  # The separator matters.
  assert block_store_lib.content_uid("a", "bc") != block_store_lib.content_uid("ab", "c")


def test_pack_sentences_by_hand():
  # budget 7: [3 + 4] fits exactly, 2 opens a new block and 5 joins it.
  assert corpus_build.pack_sentences([3, 4, 2, 5], 7) == [(0, 7), (7, 14)]
  # A 10-token sentence with budget 4: the open block closes, the sentence is cut into
  # budget-sized pieces, and the remainder starts a block that the next sentence joins.
  assert corpus_build.pack_sentences([2, 10, 1], 4) == [(0, 2), (2, 6), (6, 10), (10, 13)]
  # With word starts, a cut falls before a whole word when one is inside the budget:
  # tokens 5 and 6 are "##" continuations, so the first cut is before token 4.
  word_starts = [True] * 13
  word_starts[5] = word_starts[6] = False
  assert corpus_build.pack_sentences([2, 10, 1], 4, word_starts) == [(0, 2), (2, 4), (4, 8),
                                                                (8, 12), (12, 13)]
  # No word start inside the window: cut mid-word at the budget.
  assert corpus_build.pack_sentences([6], 4, [True] + [False] * 5) == [(0, 4), (4, 6)]
  assert corpus_build.pack_sentences([0, 3, 0], 4) == [(0, 3)]


def test_greedy_packing_end_to_end_by_hand(tmp_path, vocab):
  # Title "T" is 1 wordpiece, so with max_block_len 16 the body budget is 16 - 3 - 1 = 12.
  # Sentences of 6, 4 and 6 wordpieces: the first two share a block (10), the third does not.
  text = "One two three four five.  Six seven eight.\nNine ten eleven twelve thirteen."
  docs = [{"title": "T", "text": text}, {"title": "Other", "text": "Short one."}]
  report, store = build_jsonl(tmp_path, docs, max_block_len=16)
  assert report.num_blocks == len(store) == 3
  # The body is the original text (case, double space) of its wordpieces.
  assert store.body(0) == "One two three four five.  Six seven eight."
  assert store.body(1) == "Nine ten eleven twelve thirteen."
  assert store.body(2) == "Short one."
  assert [store.title(i) for i in range(3)] == ["T", "T", "Other"]
  # Blocks never cross articles.
  np.testing.assert_array_equal(store.doc_ids, [0, 0, 1])
  np.testing.assert_array_equal(store.title_lengths, [1, 1, 1])
  np.testing.assert_array_equal(store.body_lengths, [10, 6, 3])
  for i in range(3):
    title_ids, body_ids = vocab.encode(store.title(i)), vocab.encode(store.body(i))
    row = [CLS, *title_ids, SEP, *body_ids, SEP]
    assert len(row) <= 16
    np.testing.assert_array_equal(store.tokens[i], row + [0] * (16 - len(row)))
    np.testing.assert_array_equal(store.body_tokens(i), body_ids)
    t, b = int(store.title_lengths[i]), int(store.body_lengths[i])
    np.testing.assert_array_equal(store.tokens[i, t + 2:t + 2 + b], body_ids)
    assert store.uids[i] == block_store_lib.content_uid(store.title(i), store.body(i))
  assert store.tokens.dtype == np.uint16
  block = store.block(1)
  assert (block.block_id, block.doc_id, block.title, block.body) == (
      1, 0, "T", "Nine ten eleven twelve thirteen.")
  assert block.uid == int(store.uids[1])
  np.testing.assert_array_equal(block.title_token_ids, vocab.encode("T"))
  assert report.counts["documents_read"] == report.counts["documents_used"] == 2


def test_overlong_sentence_is_split_at_wordpiece_boundaries(tmp_path, vocab):
  sentence = " ".join(["antidisestablishmentarianism"] + ["word"] * 20) + "."
  text = "Short start. " + sentence + " Tail sentence."
  report, store = build_jsonl(tmp_path, [{"title": "T", "text": text}], max_block_len=12)
  budget = 12 - 3 - 1
  assert report.counts["oversize_sentences"] == 1
  assert len(store) > 3
  rows = store.embedder_inputs(np.arange(len(store)))[2].sum(axis=1)
  assert rows.max() <= 12
  assert all(0 < store.body_lengths[i] <= budget for i in range(len(store)))
  # Every wordpiece is kept, in order, across the blocks.
  all_body = np.concatenate([store.body_tokens(i) for i in range(len(store))])
  np.testing.assert_array_equal(all_body, vocab.encode(text))
  assert store.body(0) == "Short start."
  # The long word (anti ##dis ##est ...) fits in one budget, so the cut keeps it whole.
  assert store.body(1) == "antidisestablishmentarianism"


# ------------------------------------------------------------------------------ bad input

BAD_LINES = [
    (b'{"title": "A", "text": ', "malformed_json", "malformed JSON"),
    (b'{"title": "A"}', "missing_field", "missing field 'text'"),
    (b'{"text": "x"}', "missing_field", "missing field 'title'"),
    (b'{"title": 7, "text": "x"}', "wrong_type", "field 'title' must be a string, got int"),
    (b'["A", "x"]', "malformed_json", "expected a JSON object"),
    (b'{"title": "A", "text": "caf\xe9 au lait"}', "invalid_utf8", "not valid UTF-8"),
    (b'{"title": "A", "text": "lone \\ud800 surrogate"}', "invalid_utf8", "field 'text'"),
]
GOOD = b'{"title": "Good", "text": "A fine document."}\n'


@pytest.mark.parametrize("line,reason,expected", BAD_LINES, ids=[b[1] for b in BAD_LINES])
def test_bad_line_raises_naming_file_line_and_field(tmp_path, line, reason, expected):
  path = tmp_path / "bad.jsonl"
  path.write_bytes(GOOD + line + b"\n" + GOOD)
  with pytest.raises(sources_lib.CorpusInputError) as info:
    corpus_build.build_block_store(sources_lib.JsonlSource(str(path)), str(tmp_path / "out"))
  message = str(info.value)
  assert f"{path}:2:" in message and expected in message, message
  assert info.value.record.reason == reason
  assert not os.path.exists(tmp_path / "out") and not leftovers(tmp_path)


def test_skip_mode_counts_and_reports_every_problem(tmp_path):
  lines = [GOOD]
  lines += [line + b"\n" for line, _, _ in BAD_LINES]
  lines += [b'{"title": "Empty", "text": "  \\n "}\n',                     # empty
            b'{"title": "Zero", "text": "\\u200b\\u200b"}\n',              # no wordpieces
            json.dumps({"title": "long " * 20, "text": "x."}).encode() + b"\n",  # title
            GOOD,                                                           # duplicate
            b"\n",                                                          # blank: ignored
            b'{"title": "Second", "text": "Another document.", "extra": 1}\n']
  path = tmp_path / "mixed.jsonl"
  path.write_bytes(b"".join(lines))
  report = corpus_build.build_block_store(sources_lib.JsonlSource(str(path)), str(tmp_path / "out"),
                                          max_block_len=16, on_error="skip")
  skipped = report.counts["skipped"]
  assert skipped == {"malformed_json": 2, "missing_field": 2, "wrong_type": 1,
                     "invalid_utf8": 2, "malformed_record": 0, "token_mismatch": 0,
                     "empty": 2, "title_too_long": 1, "duplicate": 1}
  assert report.counts["documents_read"] == 13  # the blank line is not a document
  assert report.counts["documents_used"] == 2 and report.num_blocks == 2
  manifest = block_store_lib.BlockStore.open(str(tmp_path / "out")).manifest
  assert manifest["counts"]["skipped"] == skipped
  assert f"{path}:11:" in manifest["skip_examples"]["title_too_long"][0]
  assert f"{path}:12:" in manifest["skip_examples"]["duplicate"][0]
  assert any(f"{path}:7:" in m for m in manifest["skip_examples"]["invalid_utf8"])
  summary = "\n".join(report.summary_lines())
  assert "duplicate 1" in summary and "title_too_long" in summary


def test_data_skips_are_counted_even_in_raise_mode(tmp_path):
  docs = [{"title": "A", "text": "Text one."}, {"title": "B", "text": ""},
          {"title": "A", "text": "Text one."}, {"title": "word " * 70, "text": "Text."}]
  report, store = build_jsonl(tmp_path, docs)  # on_error="raise", default block length
  assert report.counts["skipped"]["empty"] == 1
  assert report.counts["skipped"]["duplicate"] == 1
  assert report.counts["skipped"]["title_too_long"] == 1  # 70 > default max_title_len 64
  assert len(store) == 1


def test_all_documents_skipped_is_an_error(tmp_path):
  with pytest.raises(sources_lib.CorpusInputError, match="no blocks"):
    build_jsonl(tmp_path, [{"title": "A", "text": " "}])
  assert not leftovers(tmp_path)


# ------------------------------------------------------------------------------ sources agree

SAME_DOCS = [
    {"title": "Alan Turing", "text": "Alan Turing was an English mathematician. He was born "
                                     "in Maida Vale, London, in 1912."},
    {"title": "Zürich", "text": "Zürich is the largest city in Switzerland.  Its Café culture "
                                "is naïve-free; Œuvre!"},
    {"title": "東京", "text": "東京 (Tokyo) is the capital of Japan. It has 14 million people."},
    {"title": "", "text": "A document without a title, still one block."},
    {"title": "Ada Lovelace", "text": "  Ada Lovelace wrote the first published algorithm.  "},
]


def store_arrays(path):
  store = block_store_lib.BlockStore.open(path)
  out = {name: np.load(os.path.join(path, name)) for name in block_store_lib.DATA_FILES
         if name.endswith(".npy")}
  with open(os.path.join(path, block_store_lib.TEXT), "rb") as f:
    out["text"] = f.read()
  return store, out


@pytest.fixture(scope="module")
def tf():
  import tensorflow as tf  # noqa: PLC0415
  return tf


def test_jsonl_tfds_realm_and_orqa_sources_build_the_same_store(tmp_path, tf):
  import tensorflow_datasets as tfds  # noqa: PLC0415
  # JSONL.
  jsonl = write_jsonl(tmp_path / "docs.jsonl", SAME_DOCS)
  corpus_build.build_block_store(sources_lib.JsonlSource(jsonl), str(tmp_path / "jsonl"))

  # TFDS wikipedia, mocked with our documents (no network, no prepared data).
  def as_dataset(self, split, **kwargs):
    del self, kwargs
    assert split == "train"
    return tf.data.Dataset.from_tensor_slices(
        {"title": [d["title"].encode("utf-8") for d in SAME_DOCS],
         "text": [d["text"].encode("utf-8") for d in SAME_DOCS]})

  with tfds.testing.mock_data(num_examples=len(SAME_DOCS), as_dataset_fn=as_dataset):
    corpus_build.build_block_store(sources_lib.TfdsSource("wikipedia/20230601.en", split="train"),
                                   str(tmp_path / "tfds"))

  # REALM retrieval-corpus records (each document is short enough to be one block), in two
  # GZIP shards read in sorted order.
  pairs = [(d["title"], d["text"]) for d in SAME_DOCS]
  sources_lib.write_realm_records(str(tmp_path / "docs.tfr.gz-00000-of-00002"), pairs[:2])
  sources_lib.write_realm_records(str(tmp_path / "docs.tfr.gz-00001-of-00002"), pairs[2:])
  corpus_build.build_block_store(sources_lib.RealmSource(str(tmp_path / "docs.tfr.gz-*-of-*")),
                                 str(tmp_path / "realm"))

  # ORQA's released layout (blocks.tfr / titles.tfr / examples.tfr).
  sources_lib.write_orqa_blocks(str(tmp_path / "orqa_in"), pairs)
  corpus_build.build_block_store(sources_lib.RealmSource(str(tmp_path / "orqa_in")),
                                 str(tmp_path / "orqa"))

  reference, ref_arrays = store_arrays(str(tmp_path / "jsonl"))
  assert len(reference) == len(SAME_DOCS)
  assert reference.body(4) == "Ada Lovelace wrote the first published algorithm."
  for name in ("tfds", "realm", "orqa"):
    store, arrays = store_arrays(str(tmp_path / name))
    assert store.store_id == reference.store_id, name
    for key in ref_arrays:
      np.testing.assert_array_equal(arrays[key], ref_arrays[key], err_msg=f"{name}: {key}")
    assert store.manifest["source"]["kind"] == ("tfds" if name == "tfds" else "realm")


def test_realm_records_map_one_to_one_and_check_token_ids(tmp_path, tf, vocab):
  long_body = " ".join(["word"] * 40) + "."
  path = str(tmp_path / "blocks.tfr")
  sources_lib.write_realm_records(path, [("Title", "Body one."), ("Title", long_body)])
  report = corpus_build.build_block_store(sources_lib.RealmSource(path), str(tmp_path / "a"),
                                          max_block_len=16)
  store = block_store_lib.BlockStore.open(str(tmp_path / "a"))
  # One record, one block: the long record is truncated like the authors' featurizer.
  assert len(store) == 2 and report.counts["truncated_records"] == 1
  np.testing.assert_array_equal(store.doc_ids, [0, 1])
  assert store.body_lengths[1] == 16 - 3 - 1 and store.body(1) == " ".join(["word"] * 12)

  # Records whose ids disagree with our tokenisation: an error naming record and field, or
  # (record_token_ids="ours") counted and ours kept.
  example = tf.train.Example(features=tf.train.Features(feature={
      "title": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"T"])),
      "body": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"Hello world."])),
      "body_token_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[1, 2, 3]))}))
  missing = tf.train.Example(features=tf.train.Features(feature={
      "title": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"T"]))}))
  bad_path = str(tmp_path / "bad.tfr")
  with tf.io.TFRecordWriter(bad_path) as writer:
    writer.write(example.SerializeToString())
    writer.write(missing.SerializeToString())
    writer.write(b"not a proto \xff\xff")
  with pytest.raises(sources_lib.CorpusInputError,
                     match=rf"tfrecord:{bad_path}:0: field 'body_token_ids' differs"):
    corpus_build.build_block_store(sources_lib.RealmSource(bad_path), str(tmp_path / "b"))
  report = corpus_build.build_block_store(sources_lib.RealmSource(bad_path), str(tmp_path / "c"),
                                          on_error="skip", record_token_ids="ours")
  assert report.counts["token_mismatches"] == 1 and report.num_blocks == 1
  assert report.counts["skipped"]["missing_field"] == 1
  assert report.counts["skipped"]["malformed_record"] == 1
  assert f"tfrecord:{bad_path}:1: missing feature 'body'" in (
      report.skip_examples["missing_field"][0])
  store = block_store_lib.BlockStore.open(str(tmp_path / "c"))
  np.testing.assert_array_equal(store.body_tokens(0), vocab.encode("Hello world."))


def test_corrupt_tfrecord_stops_the_build_naming_the_record(tmp_path, tf):
  path = str(tmp_path / "cut.tfr")
  sources_lib.write_realm_records(path, [(f"T{i}", f"Body number {i}. " * 20) for i in range(50)])
  data = open(path, "rb").read()
  open(path, "wb").write(data[:len(data) // 2])  # a GZIP stream cut in the middle
  with pytest.raises(sources_lib.CorpusInputError, match=rf"tfrecord:{path}:\d+: corrupt TFRecord"):
    corpus_build.build_block_store(sources_lib.RealmSource(path), str(tmp_path / "out"),
                                   on_error="skip")
  assert not os.path.exists(tmp_path / "out") and not leftovers(tmp_path)


# ------------------------------------------------------------------------------ determinism


def test_two_builds_give_the_same_store_id_and_files(tmp_path):
  docs = SAME_DOCS + [{"title": f"Doc {i}", "text": f"Sentence {i}. Another {i}."}
                      for i in range(30)]
  src = write_jsonl(tmp_path / "d.jsonl", docs)
  a = corpus_build.build_block_store(sources_lib.JsonlSource(src), str(tmp_path / "a"),
                                     max_block_len=24)
  b = corpus_build.build_block_store(sources_lib.JsonlSource(src), str(tmp_path / "b"),
                                     max_block_len=24)
  c = corpus_build.build_block_store(sources_lib.JsonlSource(src), str(tmp_path / "c"),
                                     max_block_len=32)
  assert a.store_id == b.store_id != c.store_id
  manifest_a = block_store_lib.BlockStore.open(a.path).manifest
  manifest_b = block_store_lib.BlockStore.open(b.path).manifest
  assert manifest_a["files"] == manifest_b["files"]  # byte-identical data files
  # store_id is sha256(options JSON + "\n" + uids), as documented.
  uids = np.load(os.path.join(a.path, block_store_lib.UIDS))
  options = json.dumps(manifest_a["store_id_options"], sort_keys=True, separators=(",", ":"))
  expected = hashlib.sha256(options.encode() + b"\n" + uids.astype("<u8").tobytes())
  assert a.store_id == expected.hexdigest()


def test_npy_appender_streams_chunks(tmp_path):
  path = str(tmp_path / "x.npy")
  appender = corpus_build._NpyAppender(path, np.uint16, (4,), chunk_rows=3)
  for i in range(10):
    appender.append_prefix(list(range(1, i % 4 + 1)))
  appender.close()
  loaded = np.load(path, mmap_mode="r")
  assert loaded.shape == (10, 4) and loaded.dtype == np.uint16
  expected = np.zeros((10, 4), np.uint16)
  for i in range(10):
    expected[i, :i % 4] = np.arange(1, i % 4 + 1)
  np.testing.assert_array_equal(loaded, expected)


def test_uint64_set_matches_python_set():
  rng = np.random.default_rng(0)
  keys = rng.integers(0, 2**63, size=3000, dtype=np.uint64).tolist()
  keys += keys[:500]
  table = corpus_build._UInt64Set(capacity=8)
  added = [table.add(k) for k in keys]
  assert added == [True] * 3000 + [False] * 500 and len(table) == 3000


# ------------------------------------------------------------------------------ atomicity


def failing_source(docs, fail_after):
  for i, doc in enumerate(docs):
    if i == fail_after:
      raise RuntimeError("source died")
    yield sources_lib.Document(doc["title"], doc["text"], f"mem:{i}")


MANY = [{"title": f"Doc {i}", "text": f"Text number {i}. More text {i}."} for i in range(20)]


@pytest.mark.parametrize("fault", ["source", "manifest", "verify", "rename"])
def test_a_failed_build_leaves_nothing_at_dest(tmp_path, monkeypatch, fault):
  dest = str(tmp_path / "store")
  source = [sources_lib.Document(d["title"], d["text"], f"mem:{i}") for i, d in enumerate(MANY)]
  if fault == "source":
    source = failing_source(MANY, fail_after=7)
  elif fault == "manifest":
    monkeypatch.setattr(corpus_build, "_write_manifest", _raise)
  elif fault == "verify":
    monkeypatch.setattr(block_store_lib.BlockStore, "open", _raise)
  else:  # everything written and verified, the rename fails
    monkeypatch.setattr(corpus_build, "_publish", _raise)
  with pytest.raises(RuntimeError):
    corpus_build.build_block_store(source, dest, max_block_len=16)
  assert not os.path.exists(dest) and not leftovers(tmp_path)


def _raise(*args, **kwargs):
  raise RuntimeError("injected fault")


def test_killed_build_leaves_no_store_and_next_build_cleans_up(tmp_path):
  dest = str(tmp_path / "store")
  marker = str(tmp_path / "started")
  script = textwrap.dedent(f"""
      import time
      from realm_jax.data import corpus_build
      from realm_jax.data import sources as sources_lib
      def docs():
        for i in range(100000):
          if i == 3000:
            open({marker!r}, "w").close()
            time.sleep(600)
          yield sources_lib.Document("Doc %d" % i, "Some text %d. More." % i, "mem:%d" % i)
      corpus_build.build_block_store(docs(), {dest!r}, max_block_len=16)
  """)
  process = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT)
  try:
    deadline = time.monotonic() + 60
    while not os.path.exists(marker):
      assert process.poll() is None, "builder exited early"
      assert time.monotonic() < deadline
      time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
  finally:
    process.wait()
  staged = leftovers(tmp_path)
  assert len(staged) == 1 and staged[0].startswith("store.staging-")
  assert not os.path.exists(dest)
  with pytest.raises(block_store_lib.BlockStoreError, match="no manifest.json"):
    block_store_lib.BlockStore.open(str(tmp_path / staged[0]))  # partial data, never opens
  report = corpus_build.build_block_store(
      [sources_lib.Document("A", "Text.", "mem:0")], dest, max_block_len=16)
  assert report.counts["removed_leftovers"] == 1 and not leftovers(tmp_path)
  assert len(block_store_lib.BlockStore.open(dest)) == 1


def test_only_dead_local_builds_leftovers_are_removed(tmp_path):
  dead = subprocess.Popen(["true"])
  dead.wait()  # its pid is now free
  host = socket.gethostname()
  stale = tmp_path / f"store.staging-{host}-{dead.pid}-0a1b2c3d"
  other_host = tmp_path / "store.staging-elsewhere-1-0a1b2c3d"
  live = tmp_path / f"store.staging-{host}-{os.getppid()}-0a1b2c3d"
  unrelated = tmp_path / f"other.staging-{host}-{dead.pid}-0a1b2c3d"
  for path in (stale, other_host, live, unrelated):
    path.mkdir()
  report = corpus_build.build_block_store([sources_lib.Document("A", "Text.", "m:0")],
                                          str(tmp_path / "store"))
  assert report.counts["removed_leftovers"] == 1
  assert not stale.exists() and other_host.exists() and live.exists() and unrelated.exists()


def test_limit_and_progress(tmp_path):
  src = write_jsonl(tmp_path / "d.jsonl", MANY)
  seen = []
  report = corpus_build.build_block_store(sources_lib.JsonlSource(src), str(tmp_path / "out"),
                                          limit=5, progress=seen.append, progress_interval_s=0)
  assert report.counts["documents_read"] == 5 and report.num_blocks == 5
  final = seen[-1]
  assert final.documents_read == 5 and final.blocks_written == 5
  assert 0 < final.fraction_done < 1 and final.eta_s is not None  # bytes read / file size
  assert final.line().startswith("documents read 5 (") and "ETA" in final.line()


def test_existing_dest_needs_overwrite(tmp_path):
  dest = str(tmp_path / "store")
  first = corpus_build.build_block_store([sources_lib.Document("A", "One.", "m:0")], dest)
  with pytest.raises(block_store_lib.BlockStoreError, match="already exists"):
    corpus_build.build_block_store([sources_lib.Document("B", "Two.", "m:0")], dest)
  assert block_store_lib.BlockStore.open(dest).store_id == first.store_id
  second = corpus_build.build_block_store([sources_lib.Document("B", "Two.", "m:0")], dest,
                                          overwrite=True)
  assert block_store_lib.BlockStore.open(dest).store_id == second.store_id != first.store_id
  assert not leftovers(tmp_path)


def test_overwrite_replaces_only_a_block_store(tmp_path):
  notes = tmp_path / "notes"
  notes.mkdir()
  (notes / "thesis.tex").write_text("years of work")
  a_file = tmp_path / "a_file"
  a_file.write_text("data")
  for dest, problem in ((notes, "not a BlockStore (no manifest.json)"),
                        (a_file, "exists and is not a directory")):
    with pytest.raises(block_store_lib.BlockStoreError, match=re.escape(f"{dest}: {problem}")):
      corpus_build.build_block_store([sources_lib.Document("A", "One.", "m:0")], str(dest),
                                     overwrite=True)
  assert (notes / "thesis.tex").read_text() == "years of work" and a_file.read_text() == "data"


def test_an_input_without_blocks_is_named(tmp_path):
  empty = tmp_path / "empty.jsonl"
  empty.write_text("")
  with pytest.raises(sources_lib.CorpusInputError,
                     match=re.escape(f"{empty}: no blocks: the input has no records")):
    corpus_build.build_block_store(sources_lib.JsonlSource(str(empty)), str(tmp_path / "out"))
  titles_only = write_jsonl(tmp_path / "t.jsonl", [{"title": "A", "text": ""}])
  with pytest.raises(sources_lib.CorpusInputError,
                     match=re.escape(f"{titles_only}: no blocks: all 1 input records were "
                                     f"skipped")):
    corpus_build.build_block_store(sources_lib.JsonlSource(titles_only), str(tmp_path / "out"))


# ------------------------------------------------------------------------------ open()


@pytest.fixture
def built(tmp_path):
  report, store = build_jsonl(tmp_path, MANY, max_block_len=16)
  return report.path


def test_open_refuses_missing_manifest_and_missing_file(built):
  os.remove(os.path.join(built, block_store_lib.UIDS))
  with pytest.raises(block_store_lib.BlockStoreError, match=rf"{built}: missing file uids.npy"):
    block_store_lib.BlockStore.open(built, verify=False)
  os.remove(os.path.join(built, block_store_lib.MANIFEST))
  with pytest.raises(block_store_lib.BlockStoreError, match=rf"{built}: no manifest.json"):
    block_store_lib.BlockStore.open(built)


def test_open_refuses_checksum_mismatch(built):
  path = os.path.join(built, block_store_lib.TEXT)
  data = bytearray(open(path, "rb").read())
  data[5] ^= 0x01  # same size, different content
  open(path, "wb").write(bytes(data))
  with pytest.raises(block_store_lib.BlockStoreError, match=r"text.bin does not match its sha256"):
    block_store_lib.BlockStore.open(built)
  block_store_lib.BlockStore.open(built, verify="fast")  # sizes only: documented blind spot


@pytest.mark.parametrize("verify", [True, "fast", False])
def test_open_refuses_truncated_tokens(built, verify):
  path = os.path.join(built, block_store_lib.TOKENS)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) - 32)
  with pytest.raises(block_store_lib.BlockStoreError, match=rf"{built}: .*tokens.npy"):
    block_store_lib.BlockStore.open(built, verify=verify)


def test_open_refuses_bad_manifest_and_wrong_vocab(built, vocab):
  block_store_lib.BlockStore.open(built, vocab_fingerprint=vocab.fingerprint)
  with pytest.raises(block_store_lib.BlockStoreError, match="built with vocabulary"):
    block_store_lib.BlockStore.open(built, vocab_fingerprint="0" * 64)
  manifest_path = os.path.join(built, block_store_lib.MANIFEST)
  manifest = json.load(open(manifest_path))
  manifest["format_version"] = 99
  json.dump(manifest, open(manifest_path, "w"))
  with pytest.raises(block_store_lib.BlockStoreError, match="format_version 99 is not supported"):
    block_store_lib.BlockStore.open(built)
  open(manifest_path, "w").write("{not json")
  with pytest.raises(block_store_lib.BlockStoreError, match="unreadable manifest.json"):
    block_store_lib.BlockStore.open(built)


# ------------------------------------------------------------------------------ inputs


def test_embedder_inputs_by_hand(tmp_path, vocab):
  docs = [{"title": "Alan Turing", "text": "He was born in 1912."},
          {"title": "Ada", "text": "Ada wrote code."}]
  _, store = build_jsonl(tmp_path, docs, max_block_len=12)
  ids, type_ids, mask = store.embedder_inputs([1, 0, 1])
  assert ids.shape == type_ids.shape == mask.shape == (3, 12)
  assert ids.dtype == type_ids.dtype == mask.dtype == np.int32
  alan, turing = vocab.encode("Alan Turing")
  he, was, born, in_, year, period = vocab.encode("He was born in 1912.")
  np.testing.assert_array_equal(ids[1], [CLS, alan, turing, SEP, he, was, born, in_, year,
                                         period, SEP, 0])
  np.testing.assert_array_equal(type_ids[1], [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0])
  np.testing.assert_array_equal(mask[1], [1] * 11 + [0])
  ada, wrote, code, period = vocab.encode("Ada wrote code.")
  np.testing.assert_array_equal(ids[0], [CLS, ada, SEP, ada, wrote, code, period, SEP] + [0] * 4)
  np.testing.assert_array_equal(type_ids[0], [0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(mask[0], [1] * 8 + [0] * 4)
  np.testing.assert_array_equal(ids[2], ids[0])
  with pytest.raises(IndexError):
    store.embedder_inputs([2])


# ------------------------------------------------------------------------------ CLI


def test_cli_end_to_end(tmp_path):
  src = tmp_path / "tiny.jsonl"
  src.write_bytes(b'{"title": "Alan Turing", "text": "He was born in 1912. He died in 1954."}\n'
                  b'{"title": "Broken", "text": \n'
                  b'{"title": "Ada", "text": "Ada wrote the first program."}\n')
  out = tmp_path / "blocks"
  command = [sys.executable, "-m", "realm_jax.build_corpus", "--source", "jsonl",
             "--input", str(src), "--out", str(out), "--max_block_len", "32"]
  env = dict(os.environ, PYTHONPATH=REPO_ROOT)
  failed = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, env=env)
  assert failed.returncode == 1
  error_lines = failed.stderr.strip().splitlines()
  assert len(error_lines) == 1 and f"{src}:2: malformed JSON" in error_lines[0], failed.stderr
  assert not out.exists()

  done = subprocess.run(command + ["--on_error", "skip", "--progress_every", "0"],
                        capture_output=True, text=True, cwd=REPO_ROOT, env=env)
  assert done.returncode == 0, done.stderr
  store = block_store_lib.BlockStore.open(str(out))
  assert len(store) == 2
  assert store.store_id in done.stdout and str(out) in done.stdout
  assert "malformed_json 1" in done.stdout and f"{src}:2:" in done.stdout
  assert "documents read" in done.stderr and "blocks written" in done.stderr

  # An output that cannot be written (under a file; in a read-only directory, unless this
  # runs as root, who may write there anyway): one line naming the path, no traceback.
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  read_only = tmp_path / "read_only"
  read_only.mkdir()
  read_only.chmod(0o555)
  unwritable = [a_file] + ([read_only] if not os.access(read_only, os.W_OK) else [])
  try:
    for parent in unwritable:
      denied = subprocess.run(command[:-4] + ["--out", str(parent / "blocks"), "--on_error",
                                              "skip"],
                              capture_output=True, text=True, cwd=REPO_ROOT, env=env)
      lines = denied.stderr.strip().splitlines()
      assert denied.returncode == 1 and len(lines) == 1, denied.stderr
      assert lines[0].startswith(f"build_corpus: error: cannot write --out {parent / 'blocks'}: "
                                 ), lines
  finally:
    read_only.chmod(0o755)


def test_the_inputs_own_document_ids_are_kept(tmp_path):
  _, store = build_jsonl(tmp_path, [
      {"id": "Q42", "title": "Douglas", "text": "He wrote a guide."},
      {"title": "Nobody", "text": "No id here."},
      {"id": 7, "title": "Seven", "text": "An integer id. " * 40},  # several blocks
      {"id": "gone", "title": "Empty", "text": " "}], max_block_len=32)  # skipped: not kept
  keys = {store.block(i).title: store.doc_key(store.block(i).doc_id) for i in range(len(store))}
  assert keys == {"Douglas": "Q42", "Nobody": None, "Seven": "7"}
  assert len({store.block(i).doc_id for i in range(len(store))
              if store.block(i).title == "Seven"}) == 1
  manifest = json.load(open(os.path.join(store.path, block_store_lib.MANIFEST)))
  assert block_store_lib.DOC_KEYS in manifest["files"]
  # Without ids in the input, no file, and no key.
  _, plain = build_jsonl(tmp_path, MANY, name="plain")
  assert plain.doc_key(0) is None and not os.path.exists(os.path.join(plain.path,
                                                                      block_store_lib.DOC_KEYS))
  # An id of another type is a bad record naming the field.
  bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": [1], "title": "A", "text": "B."}])
  with pytest.raises(sources_lib.CorpusInputError, match=r"bad\.jsonl:1: field 'id' must be"):
    corpus_build.build_block_store(sources_lib.JsonlSource(bad), str(tmp_path / "bad_out"))


def test_a_gzip_stream_is_complete_only_with_every_members_end_marker(tmp_path):
  """tf.data ends a cut GZIP TFRecord stream silently; the reader checks the stream itself,
  here against files made by Python's gzip module (two members, and cuts of them)."""
  import gzip  # pylint: disable=import-outside-toplevel
  path = tmp_path / "x.gz"
  data = gzip.compress(bytes(range(256)) * 400) + gzip.compress(b"hello" * 1000)
  path.write_bytes(data)
  assert sources_lib._gzip_complete(str(path), chunk_bytes=4096)  # pylint: disable=protected-access
  for cut in (len(data) - 10, len(data) // 3):
    path.write_bytes(data[:cut])
    # pylint: disable-next=protected-access
    assert not sources_lib._gzip_complete(str(path), chunk_bytes=4096)


# ------------------------------------------------------------------------------ token rows


def _token_rows(rng, num_blocks, block_len, title_len):
  rows = np.zeros((num_blocks, block_len), np.int64)
  body_lens = rng.integers(1, block_len - title_len - 3 + 1, num_blocks)
  for i, body_len in enumerate(body_lens):
    ids = rng.integers(1000, 30000, title_len + body_len)
    rows[i, :title_len + body_len + 3] = [CLS, *ids[:title_len], SEP, *ids[title_len:], SEP]
  return rows, np.full(num_blocks, title_len), body_lens


def test_a_store_of_token_rows_reads_back_with_the_documented_store_id(tmp_path, vocab):
  rng = np.random.default_rng(0)
  rows, titles, bodies = _token_rows(rng, 50, 24, 3)
  store_id = corpus_build.write_tokenized_block_store(str(tmp_path / "s"), rows, titles, bodies,
                                                      vocab=vocab, source={"kind": "test"})
  store = block_store_lib.BlockStore.open(str(tmp_path / "s"), verify=True,
                                          vocab_fingerprint=vocab.fingerprint)
  assert store.num_blocks == 50 and store.max_block_len == 24 and store.store_id == store_id
  np.testing.assert_array_equal(store.tokens, rows)
  assert store.tokens.dtype == np.uint16  # the BERT vocabulary fits
  assert store.title(7) == "" and store.body(7) == ""  # no text is kept
  # Each block its own document; a uid is sha256(token row as stored)[:8], big-endian.
  np.testing.assert_array_equal(store.doc_ids, np.arange(50))
  row = rows[7].astype(np.uint16).tobytes()
  assert int(store.uids[7]) == int.from_bytes(hashlib.sha256(row).digest()[:8], "big")
  # store_id = sha256(options JSON (sorted keys, compact) + "\n" + uids as little-endian u64).
  options = {"format_version": block_store_lib.FORMAT_VERSION, "max_block_len": 24,
             "max_title_len": 3, "vocab_fingerprint": vocab.fingerprint, "text": False}
  expected = hashlib.sha256(json.dumps(options, sort_keys=True, separators=(",", ":")).encode()
                            + b"\n" + store.uids.astype("<u8").tobytes()).hexdigest()
  assert store_id == expected
  # The embedder sees the rows: type 0 through the title's [SEP], then 1.
  ids, types, mask = store.embedder_inputs([3])
  np.testing.assert_array_equal(ids[0], rows[3])
  assert types[0, :5].tolist() == [0, 0, 0, 0, 0] and types[0, 5] == 1
  assert mask[0].sum() == 3 + 3 + bodies[3]


def test_a_store_of_token_rows_refuses_bad_rows_and_an_existing_store(tmp_path, vocab):
  rng = np.random.default_rng(1)
  rows, titles, bodies = _token_rows(rng, 4, 16, 2)
  dest = str(tmp_path / "s")
  with pytest.raises(ValueError, match="fit max_block_len"):
    corpus_build.write_tokenized_block_store(dest, rows, titles, bodies + 20, vocab=vocab)
  with pytest.raises(ValueError, match="token ids"):
    corpus_build.write_tokenized_block_store(dest, rows + vocab.vocab_size, titles, bodies,
                                             vocab=vocab)
  with pytest.raises(ValueError, match="same token row"):
    corpus_build.write_tokenized_block_store(dest, np.repeat(rows[:1], 4, 0), titles,
                                             np.repeat(bodies[:1], 4), vocab=vocab)
  assert not os.path.exists(dest)  # nothing half-written
  corpus_build.write_tokenized_block_store(dest, rows, titles, bodies, vocab=vocab)
  with pytest.raises(block_store_lib.BlockStoreError, match="already exists"):
    corpus_build.write_tokenized_block_store(dest, rows, titles, bodies, vocab=vocab)


# ------------------------------------------------------------------------------ workers
#
# A build with workers > 1 tokenises chunks of documents in other processes; the writer keeps
# the one-process order, so everything it writes and reports must be the same.


def _varied_docs(count, seed=0):
  """Articles of 1-12 sentences: accents, CJK, long sentences, ids on some."""
  rng = np.random.default_rng(seed)
  words = ["alpha", "Beta", "gamma's", "Zürich", "naïve", "東京", "co-op", "U.S.", "Dr.",
           "1999", "(note)", "—", "well-known", "ﬁnance", "e.g.", "unaffable", "ΣΑΣ", "x" * 40]
  docs = []
  for i in range(count):
    sentences = []
    for _ in range(int(rng.integers(1, 13))):
      n = int(rng.integers(2, 40 if rng.random() < 0.9 else 90))
      sentence = " ".join(words[int(j)] for j in rng.integers(0, len(words), n))
      sentences.append(sentence[0].upper() + sentence[1:] + str(rng.choice([".", "!", "?"])))
    doc = {"title": f"Doc {i} {words[i % len(words)]}",
           "text": rng.choice(["  ", "", "\n"]) + " ".join(sentences)}
    if i % 3 == 0:
      doc["id"] = f"Q{i}"
    docs.append(doc)
  return docs


def _mixed_jsonl(path, count=300):
  """Good documents with bad records, blank lines, duplicates and data skips among them."""
  docs = _varied_docs(count)
  lines = []
  for i, doc in enumerate(docs):
    lines.append(json.dumps(doc, ensure_ascii=i % 2 == 0).encode() + b"\n")
    if i % 37 == 5:
      lines.append(json.dumps(docs[i // 2]).encode() + b"\n")  # duplicate
    if i % 41 == 7:
      lines.append(BAD_LINES[(i // 41) % len(BAD_LINES)][0] + b"\n")
    if i % 43 == 9:
      lines.append(b'{"title": "Nothing", "text": "\\u200b \\u200b"}\n')  # no wordpieces
    if i % 47 == 11:
      lines.append(json.dumps({"title": "t " * 70, "text": "Body."}).encode() + b"\n")
    if i % 53 == 13:
      lines.append(b"\n")
  path.write_bytes(b"".join(lines))
  return str(path)


def _everything_written(path):
  """Every file of a store, the manifest without its creation time."""
  files = {}
  for name in sorted(os.listdir(path)):
    with open(os.path.join(path, name), "rb") as f:
      files[name] = f.read()
  manifest = json.loads(files.pop(block_store_lib.MANIFEST))
  del manifest["created"]
  return files, manifest


def _count_pools(monkeypatch):
  """A list that gets one entry per worker pool a build starts."""
  pools = []
  start = corpus_build._analyzed_in_workers  # pylint: disable=protected-access

  def counted(chunks, analyzer, workers):
    pools.append(workers)
    yield from start(chunks, analyzer, workers)

  monkeypatch.setattr(corpus_build, "_analyzed_in_workers", counted)
  return pools


def test_workers_build_the_same_store_byte_for_byte(tmp_path, monkeypatch):
  monkeypatch.setattr(corpus_build, "CHUNK_DOCS", 32)  # many chunks, several in flight
  pools = _count_pools(monkeypatch)
  src = _mixed_jsonl(tmp_path / "mixed.jsonl")
  built = {}
  for workers in (1, 2):
    dest = str(tmp_path / f"store{workers}")
    lines = []
    report = corpus_build.build_block_store(sources_lib.JsonlSource(src), dest, max_block_len=48,
                                            on_error="skip", workers=workers,
                                            progress=lambda p: lines.append(p.line()),
                                            progress_interval_s=0)
    built[workers] = report, _everything_written(dest), lines
  assert pools == [2]
  (one, (files, manifest), lines), (two, (files2, manifest2), lines2) = built[1], built[2]
  assert files.keys() == files2.keys() and block_store_lib.DOC_KEYS in files
  for name in files:
    assert files[name] == files2[name], name
  assert manifest == manifest2
  assert (one.counts, one.skip_examples, one.store_id, one.num_blocks) == (
      two.counts, two.skip_examples, two.store_id, two.num_blocks)
  # The summary but its first line (the path) and the time taken.
  def untimed(report):
    return [line for line in report.summary_lines()[1:] if " in " not in line]
  assert untimed(one) == untimed(two)
  # The input had all of it.
  skipped = one.counts["skipped"]
  assert all(skipped[reason] for reason in ("duplicate", "empty", "title_too_long",
                                            "malformed_json", "missing_field", "wrong_type",
                                            "invalid_utf8"))
  assert one.counts["oversize_sentences"] > 0 and one.num_blocks > 600
  # Progress: the same lines but for rates and ETAs (the fraction done is the source's,
  # interpolated over each chunk read ahead), rising to 100%.
  def untimed_lines(lines):
    return [re.sub(r" \| [\d,.?]+ documents/s| \| elapsed .*", "", line) for line in lines]
  assert untimed_lines(lines) == untimed_lines(lines2)
  assert "(100.0%)" in lines2[-1] and lines2[-1].endswith("| ETA 0.0s") and len(lines) == 331
  fractions = [float(re.search(r"([\d.]+)%", line).group(1)) for line in lines2]
  assert fractions == sorted(fractions) and fractions[0] < 1


def test_workers_stop_at_the_same_bad_record(tmp_path, monkeypatch):
  monkeypatch.setattr(corpus_build, "CHUNK_DOCS", 16)
  docs = _varied_docs(200)
  lines = [json.dumps(d).encode() + b"\n" for d in docs]
  lines.insert(150, b'{"title": "Broken", "text": \n')
  src = tmp_path / "bad.jsonl"
  src.write_bytes(b"".join(lines))
  errors = []
  for workers in (1, 2):
    with pytest.raises(sources_lib.CorpusInputError) as info:
      corpus_build.build_block_store(sources_lib.JsonlSource(str(src)), str(tmp_path / "out"),
                                     workers=workers)
    errors.append((str(info.value), info.value.record))
    assert not os.path.exists(tmp_path / "out") and not leftovers(tmp_path)
  assert errors[0] == errors[1] and f"{src}:151: malformed JSON" in errors[0][0]


def _realm_blocks(vocab, count):
  """Block records carrying token ids, some of which differ from ours."""
  docs = []
  for i, doc in enumerate(_varied_docs(count, seed=1)):
    title, text = doc["title"], doc["text"].strip()[:300]
    title_ids, body_ids = vocab.encode(title), vocab.encode(text)
    if i % 9 == 4:
      body_ids = body_ids[:-1]
    if i % 11 == 6:
      title_ids = title_ids + [vocab_lib.UNK_ID]
    docs.append(sources_lib.Document(title, text, f"rec:{i}", is_block=True,
                                     title_token_ids=title_ids, body_token_ids=body_ids))
  return docs


@pytest.mark.parametrize("record_token_ids,on_error", [("verify", "skip"), ("ours", "raise"),
                                                       ("verify", "raise")])
def test_workers_check_record_token_ids_as_one_process(tmp_path, monkeypatch, vocab,
                                                       record_token_ids, on_error):
  monkeypatch.setattr(corpus_build, "CHUNK_DOCS", 16)
  docs = _realm_blocks(vocab, 120)
  outcomes = []
  for workers in (1, 2):
    dest = str(tmp_path / f"store{workers}")
    try:
      report = corpus_build.build_block_store(docs, dest, max_block_len=64, on_error=on_error,
                                              record_token_ids=record_token_ids, workers=workers)
    except sources_lib.CorpusInputError as e:
      outcomes.append(("error", str(e), e.record))
      continue
    outcomes.append((report.counts, report.skip_examples, _everything_written(dest)))
  assert outcomes[0] == outcomes[1]
  if on_error == "raise" and record_token_ids == "verify":
    assert outcomes[0][0] == "error" and "rec:4: field 'body_token_ids' differs" in outcomes[0][1]
  elif record_token_ids == "ours":
    assert outcomes[0][0]["token_mismatches"] > 20 and outcomes[0][0]["truncated_records"] > 0
  else:
    assert outcomes[0][0]["skipped"]["token_mismatch"] > 20


def exploding_splitter(text):
  """The default splitter, except that it raises on a marked document (picklable: workers)."""
  if "BOOM" in text:
    raise ValueError("the splitter failed on BOOM")
  return sentences_lib.split_sentences(text)


def test_an_error_in_a_worker_is_raised_where_one_process_raises_it(tmp_path, monkeypatch):
  monkeypatch.setattr(corpus_build, "CHUNK_DOCS", 16)
  docs = _varied_docs(200)
  docs[170]["text"] += " BOOM."
  lines = [json.dumps(d).encode() + b"\n" for d in docs]
  src = tmp_path / "boom.jsonl"
  src.write_bytes(b"".join(lines))
  bad = tmp_path / "boom_and_bad.jsonl"
  bad.write_bytes(b"".join(lines[:120] + [b"[1]\n"] + lines[120:]))
  for workers in (1, 2):
    with pytest.raises(ValueError, match="the splitter failed on BOOM"):
      corpus_build.build_block_store(sources_lib.JsonlSource(str(src)), str(tmp_path / "out"),
                                     workers=workers, sentence_splitter=exploding_splitter)
    # A bad record before it is what a build that reads one record at a time meets first.
    with pytest.raises(sources_lib.CorpusInputError, match=r"boom_and_bad\.jsonl:121: expected"):
      corpus_build.build_block_store(sources_lib.JsonlSource(str(bad)), str(tmp_path / "out"),
                                     workers=workers, sentence_splitter=exploding_splitter)
    assert not os.path.exists(tmp_path / "out") and not leftovers(tmp_path)


def test_workers_need_a_picklable_splitter(tmp_path):
  with pytest.raises(ValueError, match="cannot be pickled"):
    corpus_build.build_block_store([sources_lib.Document("A", "Text.", "m:0")],
                                   str(tmp_path / "out"), workers=2,
                                   sentence_splitter=lambda text: [(0, len(text))])
  with pytest.raises(ValueError, match="workers must be >= 1"):
    corpus_build.build_block_store([sources_lib.Document("A", "Text.", "m:0")],
                                   str(tmp_path / "out"), workers=0)
  assert not os.path.exists(tmp_path / "out")


def test_sentences_read_off_the_whole_text_are_tokenised_sentence_by_sentence(vocab):
  """The build takes each sentence's tokens from the whole text's when that is the same as
  tokenising the sentence alone (the definition); otherwise it tokenises sentence by
  sentence."""
  reference = vocab_lib.WordPieceVocabulary(backend="python")

  def expected(text, spans):
    raw = text.encode("utf-8")
    ids, starts, limits, lengths = [], [], [], []
    for start, limit in spans:
      i, s, l = reference.tokenize_with_offsets(raw[start:limit].decode("utf-8"))
      ids += i
      starts += [x + start for x in s]
      limits += [x + start for x in l]
      lengths.append(len(i))
    return ids, starts, limits, lengths

  def cut_words(text):  # every 7 bytes, on character boundaries: cuts inside words
    raw = text.encode("utf-8")
    cuts = [i for i in range(0, len(raw), 7) if i == 0 or (raw[i] & 0xC0) != 0x80]
    return list(zip(cuts, cuts[1:] + [len(raw)]))

  texts = [d["text"].strip() for d in _varied_docs(150, seed=3)] + [
      "A. B. C.", "Zoë's   naïve café.  東京タワー!  Ok.", "ab\u200bcd. ef\u0301gh!"]
  fast = 0
  for splitter in (sentences_lib.split_sentences, cut_words):
    # pylint: disable-next=protected-access
    analyzer = corpus_build._Analyzer(vocab, 288, 64, "verify", splitter)
    for text in texts:
      raw = text.encode("utf-8")
      spans = splitter(text)
      body = vocab.tokenize_batch([text]).item(0)
      got = analyzer._sentences(raw, spans, body)  # pylint: disable=protected-access
      assert tuple(x.tolist() for x in got) == tuple(expected(text, spans)), text
      fast += corpus_build._sentence_lengths(  # pylint: disable=protected-access
          np.asarray(spans, np.int64).reshape(-1, 2), raw, body,
          vocab.word_start_table) is not None
  # The default splitter always cuts between words; cutting every 7 bytes almost never does.
  assert len(texts) <= fast < len(texts) + 10


def test_cli_workers_write_the_same_store(tmp_path):
  src = _mixed_jsonl(tmp_path / "mixed.jsonl", count=400)
  env = dict(os.environ, PYTHONPATH=REPO_ROOT)
  outputs = []
  for workers in ("1", "2"):
    out = tmp_path / f"blocks{workers}"
    done = subprocess.run([sys.executable, "-m", "realm_jax.build_corpus", "--source", "jsonl",
                           "--input", src, "--out", str(out), "--on_error", "skip",
                           "--workers", workers], capture_output=True, text=True, cwd=REPO_ROOT,
                          env=env)
    assert done.returncode == 0, done.stderr
    outputs.append((_everything_written(str(out)),
                    done.stdout.replace(str(out), "OUT").splitlines()[1:]))
  assert outputs[0][0] == outputs[1][0]
  assert [line for line in outputs[0][1] if " in " not in line] == [
      line for line in outputs[1][1] if " in " not in line]  # all but the timing line
