"""RETRO's evaluation analyses (realm_jax.evaluation.retro): the longest-common-substring
overlap on hand-worked token lists (and against brute force), per-token target bytes against
the detokenized text, salient-wordpiece marks on a hand-made BlockStore, and on a tiny trained
RETRO run: the totals equal the job's own evaluation, and the per-kind and per-threshold counts
partition and nest as they must."""

import dataclasses
import json
import os
import shutil

import gin
import jax
import numpy as np
import pytest

from realm_jax import checkpoints
from realm_jax import gin_utils
from realm_jax import train
from realm_jax.batches import retro as retro_batches
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import salient_spans
from realm_jax.data import sources as sources_lib
from realm_jax.data import vocab as vocab_lib
from realm_jax.evaluation import retro as retro_eval
from realm_jax.index import chunks
from realm_jax.jobs import retro as retro_job

VOCAB = vocab_lib.default_vocabulary()


# ------------------------------------------------------------------------------ overlap


def _lcs(chunk, neighbours, chunk_mask=None, neighbour_mask=None):
  chunk = np.asarray([chunk])
  neighbours = np.asarray([neighbours])
  chunk_mask = np.ones_like(chunk) if chunk_mask is None else np.asarray([chunk_mask])
  neighbour_mask = (neighbours != 0) if neighbour_mask is None else np.asarray([neighbour_mask])
  return int(retro_eval.longest_common_substrings(chunk, chunk_mask, neighbours,
                                                  neighbour_mask)[0])


def test_longest_common_substring_hand_worked():
  chunk = [5, 6, 7, 8]
  # "5 6" and "7 8" both occur, never "6 7": 2 (ratio 0.5).
  assert _lcs(chunk, [[1, 5, 6, 9, 7, 8, 0, 0]]) == 2
  # No token in common: 0.
  assert _lcs(chunk, [[1, 2, 3, 4, 9, 9, 0, 0], [0] * 8]) == 0
  # The whole chunk inside the second neighbour (the best of the k): 4, ratio 1.0.
  assert _lcs(chunk, [[5, 6, 1, 1, 1, 1, 1, 1], [9, 5, 6, 7, 8, 3, 0, 0]]) == 4
  # Repeats: "7 7 7" in the chunk, "7 7" in the neighbour.
  assert _lcs([7, 7, 7, 1], [[2, 7, 7, 2, 0, 0, 0, 0]]) == 2
  # The chunk's padding (id 0 and a masked real-looking id) never matches the neighbour's:
  # a partial chunk [5, 6] against a neighbour [5, 6] + padding is 2, not 4.
  assert _lcs([5, 6, 0, 0], [[5, 6, 0, 0, 0, 0, 0, 0]], chunk_mask=[1, 1, 0, 0]) == 2
  assert _lcs([5, 6, 7, 9], [[5, 6, 7, 9, 0, 0, 0, 0]], chunk_mask=[1, 1, 0, 0]) == 2
  # A masked neighbour token splits a run: "5 6" not found across it.
  assert _lcs([5, 6, 7, 8], [[5, 3, 6, 7, 1, 1, 1, 1]],
              neighbour_mask=[[1, 0, 1, 1, 1, 1, 1, 1]]) == 2
  assert _lcs([5, 6, 7, 8], [[5, 6, 7, 8, 0, 0, 0, 0]],
              neighbour_mask=[[1, 1, 0, 1, 1, 1, 1, 1]]) == 2


def _brute_force(chunk, chunk_mask, neighbours, neighbour_mask):
  """The longest run of real chunk tokens found as a run of real tokens of one neighbour."""
  real = [t for t, on in zip(chunk, chunk_mask) if on]  # chunks: real tokens, then padding
  segments = []  # the neighbours' runs of real tokens
  for tokens, mask in zip(neighbours, neighbour_mask):
    current = []
    for token, on in zip(tokens, mask):
      if on:
        current.append(token)
      else:
        segments.append(current)
        current = []
    segments.append(current)
  best = 0
  for start in range(len(real)):
    for end in range(start + 1, len(real) + 1):
      piece = real[start:end]
      if any(piece == seg[i:i + len(piece)] for seg in segments
             for i in range(len(seg) - len(piece) + 1)):
        best = max(best, len(piece))
  return best


def test_longest_common_substring_matches_brute_force():
  rng = np.random.default_rng(0)
  num, m, k, r = 200, 6, 3, 12
  ids = rng.integers(1, 4, (num, m))  # a small alphabet: many matches
  lengths = rng.integers(1, m + 1, num)
  mask = (np.arange(m)[None] < lengths[:, None]).astype(np.int32)
  neighbours = rng.integers(0, 4, (num, k, r))  # 0 is padding
  got = retro_eval.longest_common_substrings(ids, mask, neighbours, neighbours != 0)
  want = [_brute_force(ids[i], mask[i], neighbours[i], neighbours[i] != 0) for i in range(num)]
  assert got.tolist() == want


# ------------------------------------------------------------------------------ target bytes


def test_target_token_bytes_sum_to_the_decoded_text():
  the, cat, plural, hash_ = (VOCAB.token_to_id(t) for t in ("the", "cat", "##s", "#"))
  # Token 0 is never a target; then "the cat ##s # ##s" -> "the cats #s".
  row = np.array([[cat, the, cat, plural, hash_, plural]])
  per_token = retro_batches.target_token_bytes(row, np.ones_like(row), VOCAB)
  assert per_token.tolist() == [[3, 4, 1, 2, 1]]
  assert len("the cats #s") == 11 == retro_batches.target_bytes(row, np.ones_like(row), VOCAB)[0]
  # A first target that is a continuation keeps its "##" (nothing to glue to); masked targets
  # and [PAD] count nothing, and the next real one is the first.
  row = np.array([[the, plural, cat, 0, the]])
  assert retro_batches.target_token_bytes(row, np.array([[1, 1, 1, 1, 1]]), VOCAB).tolist() == [
      [3, 4, 0, 4]]
  assert retro_batches.target_token_bytes(row, np.array([[1, 0, 1, 1, 1]]), VOCAB).tolist() == [
      [0, 3, 0, 4]]
  # Random rows: the sums are the bytes of `decode`'s text, as target_bytes was defined.
  rng = np.random.default_rng(1)
  ids = rng.integers(0, VOCAB.vocab_size, (64, 24))
  ids[rng.random(ids.shape) < 0.3] = plural
  ids[rng.random(ids.shape) < 0.1] = 0
  mask = (rng.random(ids.shape) < 0.8).astype(np.int32)
  want = [len(VOCAB.decode([int(t) for t in i[1:][m[1:] > 0]]).encode("utf-8"))
          for i, m in zip(ids, mask)]
  assert retro_batches.target_token_bytes(ids, mask, VOCAB).sum(axis=1).tolist() == want
  assert retro_batches.target_bytes(ids, mask, VOCAB).tolist() == want


# ------------------------------------------------------------------------------ token kinds

DOCS = [
    {"title": "Curie", "text": "The chemist Marie Curie moved to Paris in 1891. She won a prize."},
    {"title": "Babbage", "text": "In March 1843 the engineer Charles Babbage met Ada Lovelace. "
                                 "Babbage wrote to her on 5 June 1843."},
]
# The wordpieces of each document's body, in brackets those the "union" annotator marks: dates
# and runs of capitalised words (a sentence's first word excepted, so the second "Babbage" is
# not a name to it).
EXPECTED = [
    "the chemist [marie] [cu] [##rie] moved to [paris] in [1891] . she won a prize .",
    "in [march] [1843] the engineer [charles] [ba] [##bba] [##ge] met [ada] [love] [##lace] . "
    "ba ##bba ##ge wrote to her on [5] [june] [1843] .",
]


def _expected_marks(text):
  pieces = text.split()
  return [p.strip("[]") for p in pieces], [p.startswith("[") for p in pieces]


@pytest.fixture(scope="module")
def hand_store(tmp_path_factory):
  """Two documents, blocks of at most 20 wordpieces: each document's two sentences are two
  blocks, so a document's stream crosses blocks."""
  root = tmp_path_factory.mktemp("hand_store")
  source = root / "docs.jsonl"
  source.write_text("".join(json.dumps(d) + "\n" for d in DOCS), encoding="utf-8")
  corpus_build.build_block_store(sources_lib.JsonlSource(str(source)), str(root / "store"),
                                 max_block_len=20)
  store = block_store_lib.BlockStore.open(str(root / "store"))
  assert store.num_blocks == 4 and store.doc_ids.tolist() == [0, 0, 1, 1]
  yield store
  store.close()


def test_block_marks_are_the_annotated_wordpieces(hand_store):
  union = salient_spans.get_annotator("union")
  for doc, text in enumerate(EXPECTED):
    tokens, marks = _expected_marks(text)
    blocks = [b for b in range(hand_store.num_blocks) if hand_store.doc_ids[b] == doc]
    got_tokens = [VOCAB.id_to_token(int(t)) for b in blocks for t in hand_store.body_tokens(b)]
    assert got_tokens == tokens
    got = np.concatenate([retro_eval.block_salient_marks(hand_store, b, union, VOCAB)
                          for b in blocks])
    assert got.tolist() == marks, [t for t, on in zip(tokens, got) if on]


class _Spans(salient_spans.Annotator):
  """Marks the given substrings (their first occurrence) of any text."""

  def __init__(self, *pieces):
    self.pieces = pieces

  def annotate(self, text):
    data = text.encode("utf-8")
    found = [(data.find(p.encode()), data.find(p.encode()) + len(p.encode()))
             for p in self.pieces if p.encode() in data]
    return sorted(found)


def test_block_marks_take_any_byte_overlap(hand_store):
  block = 2  # "In March 1843 the engineer Charles Babbage met Ada Lovelace."
  tokens = [VOCAB.id_to_token(int(t)) for t in hand_store.body_tokens(block)]
  marked = lambda *pieces: [t for t, on in zip(tokens, retro_eval.block_salient_marks(
      hand_store, block, _Spans(*pieces), VOCAB)) if on]
  assert marked("Lov") == ["love"]  # part of a wordpiece marks it
  assert marked("ace") == ["##lace"]
  assert marked("Ada ") == ["ada"]  # the space after "Ada" belongs to no wordpiece
  assert marked("r Ch") == ["engineer", "charles"]
  assert marked() == []


@dataclasses.dataclass
class _Database:
  """What chunk_salient_marks reads of a ChunkDatabase, from chunk_block_store's chunks."""
  path: str
  chunk_len: int
  chunk_tokens: np.ndarray
  chunk_lengths: np.ndarray
  doc_ids: np.ndarray

  def document_chunks(self, doc):
    return (int(np.searchsorted(self.doc_ids, doc, "left")),
            int(np.searchsorted(self.doc_ids, doc, "right")))


def test_chunk_marks_follow_the_document_stream(hand_store):
  m = 4
  cut = chunks.chunk_block_store(hand_store, m)
  database = _Database("<hand-made>", m, cut.tokens, cut.lengths, cut.doc_ids)
  union = salient_spans.get_annotator("union")
  got = retro_eval.chunk_salient_marks(database, hand_store, np.arange(cut.num_chunks)[None],
                                       union, VOCAB)  # [1, C, m]
  for doc, text in enumerate(EXPECTED):
    _, marks = _expected_marks(text)
    rows = np.flatnonzero(cut.doc_ids == doc)
    padded = np.zeros(rows.size * m, bool)
    padded[:len(marks)] = marks
    assert got[0, rows].reshape(-1).tolist() == padded.tolist()


def test_a_store_whose_text_does_not_give_its_tokens_is_refused(hand_store, monkeypatch):
  monkeypatch.setattr(hand_store, "body", lambda block_id: "Something else entirely.")
  with pytest.raises(retro_eval.RetroEvalError, match=r"block 1: .*tokenizes"):
    retro_eval.block_salient_marks(hand_store, 1, salient_spans.get_annotator("dates"), VOCAB)


# ------------------------------------------------------------------------------ a trained run

TOY = ["--gin_file=gin_configs/experiments/toy_retro.gin"]
# As tests/test_retro_job.py's tiny RETRO: 8 sequences of 2 chunks of 16 per step, a
# checkpoint and an evaluation of the first 8 held-out sequences at step 2.
SMALL = ["--gin.BATCH_SIZE=8", "--gin.EVAL_SEQUENCES=8", "--gin.RetroConfig.hidden_size=32",
         "--gin.RetroConfig.num_layers=2", "--gin.RetroConfig.intermediate_size=64",
         "--gin.RetroConfig.encoder_layers=1", "--gin.RetroConfig.cca_every=1",
         "--gin.train_main.checkpoint_every=2", "--gin.train_main.log_every=1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(run_dir, the job's eval metrics at step 2) of a 2-step tiny RETRO run."""
  run_dir = tmp_path_factory.mktemp("retro_eval") / "run"
  seen = []
  start = retro_job.RetroJob.start

  def patched(self, ctx, model, batches):
    hooks, eval_fn, best = start(self, ctx, model, batches)

    def recorded(step, state):
      seen.append(dict(eval_fn(step, state)))
      return seen[-1]
    return hooks, recorded, best

  old_dir = os.getcwd()
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(retro_job.RetroJob, "start", patched)
    os.chdir(gin_utils.REPO_ROOT)
    gin.clear_config()
    try:
      assert train.main(["train", *TOY, *SMALL, "--gin.NUM_STEPS=2",
                         f"--gin.RUN_DIR='{run_dir}'"]) == 0
    finally:
      gin.clear_config()
      os.chdir(old_dir)
  assert len(seen) == 1
  return run_dir, seen[0]


def _close(a, b):
  return a == pytest.approx(b, rel=1e-5)


def test_totals_equal_the_jobs_evaluation(trained):
  run_dir, metrics = trained
  with open(run_dir / retro_eval.RETRO_CONFIG_FILE, encoding="utf-8") as f:
    recorded = json.load(f)
  assert retro_eval.RETRO_CONFIG_FILE == retro_job.RETRO_CONFIG_FILE
  assert os.path.isdir(recorded["chunk_database"]) and os.path.isdir(recorded["block_store"])
  out = retro_eval.evaluate_retro(str(run_dir), max_sequences=8)
  json.dumps(out)  # JSON-ready
  assert out["step"] == 2 and out["sequences"] == 8 and out["num_neighbours"] == 2
  assert _close(out["retrieval"]["loss"], metrics["eval/loss"])
  assert _close(out["retrieval"]["bits_per_byte"], metrics["eval/bits_per_byte"])
  assert _close(out["no_retrieval"]["loss"], metrics["eval/no_retrieval/loss"])
  assert _close(out["no_retrieval"]["bits_per_byte"], metrics["eval/no_retrieval/bits_per_byte"])

  # More sequences than a batch (the last one padded): RetroLanguageModel.eval_fn + summarize
  # over the job's own held-out batches of another size.
  config, _ = retro_eval.read_run_config(str(run_dir))
  model = retro_job.RetroLanguageModel(config)
  database = chunks.ChunkDatabase.open(recorded["chunk_database"], verify="fast")
  heldout = retro_batches.RetroBatches(
      database, batch_size=8, chunks_per_sequence=2, split="heldout", shuffle=False,
      max_sequences=20, vocab=VOCAB, process_index=0, process_count=1)
  params, _, _ = checkpoints.restore_params(str(run_dir), 2)
  eval_fn = jax.jit(model.eval_fn)
  sums = [eval_fn(params, batch) for batch in heldout.fixed_batches()]
  total = jax.tree.map(lambda *x: sum(np.asarray(v, np.float64) for v in x), *sums)
  want = {key: float(value) for key, value in model.summarize(total).items()}
  out = retro_eval.evaluate_retro(str(run_dir), max_sequences=20, batch_size=16)
  assert out["sequences"] == 20
  assert out["target_tokens"] == int(total["weight_sum"])
  assert out["target_bytes"] == float(total["byte_sum"])
  assert _close(out["retrieval"]["loss"], want["loss"])
  assert _close(out["retrieval"]["bits_per_byte"], want["bits_per_byte"])
  assert _close(out["no_retrieval"]["loss"], want["no_retrieval/loss"])
  assert _close(out["no_retrieval"]["bits_per_byte"], want["no_retrieval/bits_per_byte"])
  _check_counts(out)

  # More neighbours at evaluation: retrieval changes, the plain decoder does not.
  wider = retro_eval.evaluate_retro(str(run_dir), max_sequences=20, num_neighbours=4)
  assert wider["num_neighbours"] == 4
  assert wider["retrieval"]["loss"] != out["retrieval"]["loss"]
  assert _close(wider["no_retrieval"]["loss"], out["no_retrieval"]["loss"])
  _check_counts(wider)


def _check_counts(out):
  tokens, chunks_total = out["target_tokens"], out["chunks"]
  kinds = out["by_kind"]
  # The kinds partition the target tokens, bytes and nats.
  assert kinds["salient"]["tokens"] + kinds["other"]["tokens"] == tokens
  assert kinds["salient"]["bytes"] + kinds["other"]["bytes"] == out["target_bytes"]
  assert 0 < kinds["salient"]["tokens"] < tokens
  assert kinds["salient"]["share"] + kinds["other"]["share"] == pytest.approx(1.0)
  for mode in ("retrieval", "no_retrieval"):
    nats = sum(kinds[k]["tokens"] * kinds[k][mode]["loss"] for k in kinds)
    assert nats == pytest.approx(tokens * out[mode]["loss"], rel=1e-9)
  # The thresholds nest; alpha = 1 keeps every chunk and token, so it is the totals.
  levels = sorted(out["by_overlap"], key=lambda x: x["max_overlap"])
  for low, high in zip(levels, levels[1:]):
    assert low["chunks"] <= high["chunks"] and low["tokens"] <= high["tokens"]
  whole = levels[-1]
  assert whole["max_overlap"] == 1.0 and whole["chunks"] == chunks_total
  assert whole["tokens"] == tokens and whole["bytes"] == out["target_bytes"]
  assert whole["retrieval"] == out["retrieval"] and whole["no_retrieval"] == out["no_retrieval"]
  # Chunks: l = 2 per sequence; the histogram's bins hold every chunk, and its cumulative
  # counts are the chunks kept at each multiple of 1/8.
  assert chunks_total == 2 * out["sequences"]
  counts = out["overlap_histogram"]["counts"]
  assert sum(counts) == chunks_total
  for level in levels:
    bins = round(level["max_overlap"] * 8)
    assert level["chunks"] == sum(counts[:bins]), (level, counts)
  # A sequence's first chunk has m - 1 targets, the others m: per kept chunk, at most m.
  for level in levels:
    assert level["tokens"] <= 16 * level["chunks"]


def test_baseline_run_reports_no_retrieval_only(trained, tmp_path):
  run_dir, metrics = trained
  baseline = tmp_path / "baseline"
  shutil.copytree(run_dir, baseline)
  path = baseline / retro_eval.RETRO_CONFIG_FILE
  values = json.loads(path.read_text(encoding="utf-8"))
  path.write_text(json.dumps({**values, "retrieval": False}), encoding="utf-8")
  out = retro_eval.evaluate_retro(str(baseline), max_sequences=8)
  assert out["retrieval"] is None
  assert _close(out["no_retrieval"]["loss"], metrics["eval/no_retrieval/loss"])
  assert all(level["retrieval"] is None and level["no_retrieval"] for level in
             out["by_overlap"])
  assert out["by_kind"]["salient"]["retrieval"] is None


def test_command_line_and_errors(trained, tmp_path, capsys):
  run_dir, _ = trained
  with pytest.raises(SystemExit):
    retro_eval.main(["--help"])
  assert "--num_neighbours" in capsys.readouterr().out
  out_file = tmp_path / "eval.json"
  assert retro_eval.main([str(run_dir), "--step", "2", "--max_sequences", "2",
                          "--thresholds", "0.5", "1.0", "--out", str(out_file)]) == 0
  printed = json.loads(capsys.readouterr().out)
  assert printed == json.loads(out_file.read_text(encoding="utf-8"))
  assert [level["max_overlap"] for level in printed["by_overlap"]] == [0.5, 1.0]
  assert retro_eval.main([str(tmp_path)]) == 2
  assert retro_eval.RETRO_CONFIG_FILE in capsys.readouterr().err
  with pytest.raises(retro_eval.RetroEvalError, match="overlap_thresholds"):
    retro_eval.evaluate_retro(str(run_dir), overlap_thresholds=(0.5, 1.5))
  with pytest.raises(checkpoints.CheckpointError, match="step 7"):
    retro_eval.evaluate_retro(str(run_dir), step=7)
