"""`python -m realm_jax.evaluate`, in-process: qa mode against the evaluation library, retrieval
recall against a NumPy brute force, the BM25 baseline's recall on questions whose ranks are
known by construction, free-text answers, dry runs, and one-line errors.

The run directory is built like a fine-tuning run's: an OpenQAModel checkpoint and an index of
its document tower published beside it. The corpus is the first NUM_DOCS documents of the toy
world (its blocks are the toy store's first blocks, with the same uids), because embedding all
2,511 toy blocks takes ~20 s on this suite's 8 simulated devices.
"""

import csv
import json
import os
import re
import shutil
import types

import jax
import numpy as np
import pytest

from realm_jax import evaluate as entry
from realm_jax import gin_utils
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import qa_datasets
from realm_jax.data import sources as sources_lib
from realm_jax.data import toy_world
from realm_jax.evaluation import metrics as metrics_lib
from realm_jax.evaluation import qa as qa_lib
from realm_jax.evaluation import recall
from realm_jax.evaluation import results
from realm_jax.evaluation import runs
from realm_jax.index import builder
from realm_jax.index import store as store_lib
from realm_jax.index.search import ExactSearcher
from realm_jax.models import config as config_lib
from realm_jax.models.open_qa_model import OpenQAModel
from realm_jax.models.retriever import RealmRetriever
from realm_jax import checkpoints

REPO = gin_utils.REPO_ROOT
# = gin_configs/models/toy.gin (its dropout does not change parameter shapes).
TINY = config_lib.RealmConfig(
    bert=config_lib.tiny_bert(hidden_size=128, num_heads=2, intermediate_size=512),
    span_hidden_size=64, retriever_pooling="mean")
STEP = 40
NUM_DOCS = 400
KS = (1, 5, 20, 100)
QUESTION = "Where was Traebousk Asle born?"


def rigged_params(seed=0):
  """OpenQAModel params whose retriever tells texts apart.

  At its initial scale a tiny BERT embeds every text almost identically (scores agree to
  ~1e-5), so rankings would be decided by rounding. Zero query kernels (uniform attention),
  large value kernels and no position embeddings make the [CLS] state a bag of the input's
  words: embeddings differ and rankings are stable. Built from shapes (no init: seconds).
  """
  shapes = jax.eval_shape(OpenQAModel(TINY).init, jax.random.PRNGKey(0))
  rng = np.random.default_rng(seed)

  def leaf(path, shape):
    name = jax.tree_util.keystr(path)
    if name.endswith("['scale']"):
      return np.ones(shape.shape, shape.dtype)
    if name.endswith("['bias']"):
      return np.zeros(shape.shape, shape.dtype)
    return rng.normal(0.0, 0.02, shape.shape).astype(shape.dtype)

  params = jax.tree_util.tree_map_with_path(leaf, shapes)
  bert = params["retriever"]["embedder"]["bert"]
  bert["embeddings"]["position_embeddings"]["embedding"][:] = 0.0
  for i in range(TINY.bert.num_layers):
    attention = bert[f"layer_{i}"]["attention"]
    attention["query"]["kernel"][:] = 0.0
    attention["value"]["kernel"] *= 300.0
  return params


@pytest.fixture(scope="module")
def world(private_cache, tmp_path_factory):
  """A fine-tuning-like run: checkpoint STEP and the index built from it, over a toy prefix."""
  del private_cache  # the toy world is generated into it
  root = tmp_path_factory.mktemp("evaluate_main")
  store_dir = str(root / "blocks")
  source = sources_lib.JsonlSource(os.path.join(toy_world.toy_world_dir(), toy_world.CORPUS_FILE))
  corpus_build.build_block_store(source, store_dir, limit=NUM_DOCS, max_block_len=128)
  store = block_store_lib.BlockStore.open(store_dir)
  params = rigged_params()
  run_dir = str(root / "finetune")
  step_dir = checkpoints.save_checkpoint(run_dir, STEP, params, config=TINY)
  embeddings = builder.embed_blocks(params["retriever"], TINY, store, batch_size=128,
                                    progress=None)  # [num_blocks, proj]
  store_lib.publish_index(run_dir, STEP, embeddings, block_store_id=store.store_id,
                          checkpoint=step_dir, extra={"checkpoint_step": STEP})
  return types.SimpleNamespace(root=root, store=store, store_dir=store_dir, params=params,
                               run_dir=run_dir, step_dir=step_dir, embeddings=embeddings)


pytestmark = pytest.mark.usefixtures("clean_gin")


def _main(*args):
  return entry.main(["evaluate", "--gin_file=gin_configs/experiments/toy_eval.gin", *args])


def _world_args(world, *args):
  return (f"--gin.RUN_DIR='{world.run_dir}'",
          f"--gin.evaluate_main.block_store='{world.store_dir}'", *args)


def _output(capsys):
  captured = capsys.readouterr()
  return ([line for line in captured.out.splitlines() if line.strip()],
          [line for line in captured.err.splitlines() if line.strip()])


def _toy_questions(count):
  path = os.path.join(toy_world.toy_world_dir(), toy_world.qa_file("test"))
  return list(qa_datasets.read_orqa_jsonl(path))[:count]


# ------------------------------------------------------------------------------ qa mode


@pytest.fixture(scope="module")
def library_qa(world):
  """Independently of the entry point: the first 8 test questions read from the toy world's
  file, answered by the evaluation library with the run's params and index."""
  examples = _toy_questions(8)
  loaded = store_lib.load_index(store_lib.index_dir(world.run_dir, STEP))
  metrics, predictions = qa_lib.evaluate(
      OpenQAModel(TINY, reader_beam=5), world.params, examples,
      searcher=ExactSearcher(loaded.embeddings), store=world.store, k_values=KS)
  return types.SimpleNamespace(examples=examples, metrics=metrics, predictions=predictions)


def test_qa_mode_equals_the_evaluation_library_and_writes_both_files(world, library_qa,
                                                                      capsys):
  code = _main(*_world_args(world, "--gin.evaluate_main.max_examples=8"))
  out, err = _output(capsys)
  assert code == 0, err
  assert len(out) == 1, out
  predictions_path = os.path.join(world.run_dir, "predictions", f"toy_qa_test_step{STEP}.jsonl")
  metrics_path = predictions_path[:-len(".jsonl")] + ".metrics.json"
  assert f"checkpoint step {STEP} (latest), index step {STEP}" in out[0]
  assert predictions_path in out[0] and metrics_path in out[0]
  assert any("questions 8/8 (100.0%)" in line and "ETA" in line for line in err), err

  examples, expected = library_qa.examples, library_qa.metrics
  expected_predictions = library_qa.predictions
  saved = json.load(open(metrics_path, encoding="utf-8"))
  assert saved["metrics"] == pytest.approx(expected)
  assert saved["checkpoint_step"] == STEP and saved["index_step"] == STEP
  assert set(expected) == {"exact_match", "recall@1", "recall@5", "recall@20", "recall@100",
                           "num_questions", "skipped_questions"}
  assert 0 < expected["recall@100"]  # the rigged retriever finds some answers
  for name in ("exact_match", "recall@5", "recall@100"):
    assert f"{name} {expected[name]:.4f}" in out[0]
  assert "num_questions 8, skipped 0" in out[0]

  with open(predictions_path, encoding="utf-8") as f:
    lines = [json.loads(line) for line in f]
  assert [list(line)[:2] for line in lines] == [["question", "prediction"]] * 8
  assert [line["question"] for line in lines] == [e.question for e in examples]
  assert [line["prediction"] for line in lines] == [p["prediction"] for p in expected_predictions]
  assert [line["block_ids"] for line in lines] == [p["block_ids"] for p in expected_predictions]


def test_qa_mode_on_bm25s_blocks_equals_the_library_with_the_bm25_searcher(world, capsys):
  """A reader fine-tuned on BM25's blocks (FinetuneJob.candidates='bm25') is evaluated on them:
  no index is read (the run's is moved away), and the reader adds no retrieval score."""
  from realm_jax.evaluation import bm25  # pylint: disable=import-outside-toplevel
  examples = _toy_questions(8)
  searcher = bm25.BM25Searcher(world.store, TINY.proj_size)
  expected, expected_predictions = qa_lib.evaluate(
      OpenQAModel(TINY, reader_beam=5), world.params, examples, searcher=searcher,
      store=world.store, k_values=KS)
  output = str(world.root / "bm25_reader" / "test.jsonl")
  index_root = store_lib.index_root(world.run_dir)
  os.rename(index_root, index_root + ".away")
  try:
    code = _main(*_world_args(world, "--gin.evaluate_main.max_examples=8",
                              "--gin.evaluate_main.candidates='bm25'",
                              f"--gin.evaluate_main.output='{output}'"))
  finally:
    os.rename(index_root + ".away", index_root)
  out, err = _output(capsys)
  assert code == 0, err
  assert f"checkpoint step {STEP} (latest), BM25's blocks: exact_match" in out[0]
  saved = json.load(open(output.replace(".jsonl", ".metrics.json"), encoding="utf-8"))
  assert saved["metrics"] == pytest.approx(expected)
  assert saved["candidates"] == "bm25" and saved["index_step"] is None
  with open(output, encoding="utf-8") as f:
    lines = [json.loads(line) for line in f]
  ranked, _ = bm25.BM25Index(bm25.block_texts(world.store)).top_k(
      [e.question for e in examples], 5)
  assert [line["block_ids"] for line in lines] == ranked.tolist()
  assert [line["prediction"] for line in lines] == [p["prediction"]
                                                    for p in expected_predictions]


def test_question_prints_the_answer_and_its_evidence(world, capsys):
  code = entry.main(["evaluate", "--gin_file=gin_configs/models/toy.gin",
                     "--gin_file=gin_configs/runs/eval.gin",  # TASK left unset: not needed
                     *_world_args(world, f"--question={QUESTION}")])
  out, err = _output(capsys)
  assert code == 0, err
  model = OpenQAModel(TINY, reader_beam=5)
  expected = qa_lib.answer_question(model, world.params, QUESTION,
                                    searcher=ExactSearcher(world.embeddings),
                                    store=world.store)
  assert out[0] == f"evaluate: checkpoint step {STEP} (latest), index step {STEP}"
  assert out[1] == f"question: {QUESTION}"
  assert out[2].startswith(f"answer: {expected['answer']!r} (block {expected['block_id']},")
  evidence = out[3:]
  assert len(evidence) == 5, out
  for rank, (line, item) in enumerate(zip(evidence, expected["evidence"])):
    assert line.startswith(f" {'*' if item['has_prediction'] else ' '}{rank + 1}. block "
                           f"{item['block_id']} [{item['title']}] score {item['score']:.3f}: ")
  assert sum(line.startswith(" *") for line in evidence) == 1


# ------------------------------------------------------------------------------ retrieval mode


def _ict_queries(count):
  # TensorFlow: imported where it is used; realm_jax_tasks registers the tasks.
  import realm_jax_tasks  # noqa: F401,PLC0415
  from realm_jax.batches import seqio_batches  # noqa: PLC0415
  dataset = seqio_batches.get_task("ict_toy").get_dataset(split="train", shuffle=False,
                                                          sequence_length=None).take(count)
  rows = list(dataset.as_numpy_iterator())
  return (np.stack([r["query_ids"] for r in rows]), np.stack([r["query_mask"] for r in rows]),
          np.array([r["block_uid"] for r in rows], np.int64))


def _recall_bounds(scores, source, ks, tol=1e-3):
  """NumPy recall@k of the source block, as (certain, possible) fractions.

  scores: [n, num_blocks]; source: [n] the source block's row. A block within `tol` of the
  source's score may rank either side of it after rounding, so such ties count as possible.
  """
  own = scores[np.arange(len(source)), source][:, None]  # [n, 1]
  surely_ahead = (scores > own + tol).sum(axis=1)  # [n]
  maybe_ahead = (scores > own - tol).sum(axis=1) - 1  # [n], not counting the source itself
  return {k: (np.mean(maybe_ahead < k), np.mean(surely_ahead < k)) for k in ks}


def test_retrieval_mode_ict_recall_equals_a_numpy_brute_force(world, capsys):
  code = _main(*_world_args(world, "--gin.TASK='ict_toy'", "--gin.evaluate_main.mode='retrieval'",
                            "--gin.evaluate_main.split='train'",
                            "--gin.evaluate_main.max_examples=64"))
  out, err = _output(capsys)
  assert code == 0, err
  path = os.path.join(world.run_dir, "predictions", f"ict_toy_train_retrieval_index{STEP}"
                      ".metrics.json")
  assert len(out) == 1 and out[0].startswith("evaluate: retrieval ict_toy/train") and path in out[0]
  metrics = json.load(open(path, encoding="utf-8"))["metrics"]

  query_ids, query_mask, block_uid = _ict_queries(64)
  embed = jax.jit(lambda p, i, m: RealmRetriever(TINY).apply(
      {"params": p}, i, jax.numpy.zeros_like(i), m, method=RealmRetriever.embed_queries))
  query_emb = np.asarray(embed(world.params["retriever"], query_ids, query_mask))  # [64, proj]
  scores = query_emb @ world.embeddings.T  # [64, num_blocks]
  uids = world.store.uids.view(np.int64)  # [num_blocks]
  source = np.array([np.flatnonzero(uids == uid)[0] for uid in block_uid])  # all in the prefix
  num_blocks = world.store.num_blocks
  assert metrics["num_queries"] == 64 and metrics["num_blocks"] == num_blocks
  for k, (certain, possible) in _recall_bounds(scores, source, KS).items():
    assert certain <= metrics[f"recall@{k}"] <= possible, (k, metrics)
    assert possible - certain <= 2 / 64  # near-ties are rare: the check stays sharp
    assert metrics[f"chance@{k}"] == pytest.approx(k / num_blocks)
    assert f"recall@{k} {metrics[f'recall@{k}']:.4f} (chance {k / num_blocks:.4f})" in out[0]


def test_retrieval_before_a_run_has_checkpoints_uses_the_index_checkpoint(world, library_qa,
                                                                           capsys, tmp_path):
  """A pretraining run before its first checkpoint: index 0 was built from another run's
  (the ICT) checkpoint, named in its manifest. Its QA recall equals the qa mode's, whose
  question tower here is the same checkpoint."""
  run_dir = str(tmp_path / "pretrain")
  store_lib.publish_index(run_dir, 0, world.embeddings, block_store_id=world.store.store_id,
                          checkpoint=world.step_dir, extra={"checkpoint_step": STEP})
  code = _main(f"--gin.RUN_DIR='{run_dir}'", f"--gin.evaluate_main.block_store='{world.store_dir}'",
               "--gin.evaluate_main.mode='retrieval'", "--gin.evaluate_main.max_examples=8")
  out, err = _output(capsys)
  assert code == 0, err
  assert f"index step 0 (query tower from {world.step_dir})" in out[0]
  metrics = json.load(open(os.path.join(run_dir, "predictions",
                                        "toy_qa_test_retrieval_index0.metrics.json")))["metrics"]
  assert metrics["num_questions"] == 8 and "chance@5" not in metrics
  for k in KS:
    assert metrics[f"recall@{k}"] == library_qa.metrics[f"recall@{k}"]


# ------------------------------------------------------------------------------ bm25 mode

BM25_DOCS = [  # (title, text), one block each
    ("Zorblat", "Zorblat is a river in Quendia. It flows into the Marrow Sea."),
    ("Pell Vantry", "Pell Vantry was born in Ostrava Hollow and became a glassblower."),
    ("Quendia", "Quendia is a country. Its capital is Lirrick."),
    ("Marrow Sea", "The Marrow Sea is cold."),
]
# (question, answers, regex answers, the blocks whose body holds an answer, the rank of the first
# of them in a BM25 ranking; None: no block has one)
BM25_QUESTIONS = [
    # Only block 1 has "was", "pell", "vantry" and "born".
    ("Where was Pell Vantry born?", ["Ostrava Hollow"], [r"Ostrava\s+Hol+ow"], [1], 0),
    ("Who painted the Glass Tower?", ["Emmerich Sollo"], ["Emmerich"], [], None),
    # "capital" occurs only in block 2, which also has "quendia" twice (title and body).
    ("What is the capital of Quendia?", ["Lirrick"], ["Lir+ick"], [2], 0),
    # No word of it occurs anywhere: all blocks score 0, ranked by id, so block 2 is third.
    ("Which nation?", ["country"], ["c[aeiou]untry"], [2], 2),
]


@pytest.fixture(scope="module")
def bm25_world(tmp_path_factory):
  """A BlockStore of BM25_DOCS (built with the project's builder) and BM25_QUESTIONS as a
  user's own QA files: plain answers and regex answers."""
  root = tmp_path_factory.mktemp("bm25")
  source = root / "docs.jsonl"
  with open(source, "w", encoding="utf-8") as f:
    for title, text in BM25_DOCS:
      f.write(json.dumps({"title": title, "text": text}) + "\n")
  store_dir = str(root / "blocks")
  corpus_build.build_block_store(sources_lib.JsonlSource(str(source)), store_dir, max_block_len=64)
  store = block_store_lib.BlockStore.open(store_dir)
  assert [store.title(i) for i in range(store.num_blocks)] == [t for t, _ in BM25_DOCS]
  for name, column in (("plain", 1), ("regex", 2)):
    (root / name).mkdir()
    with open(root / name / "test.jsonl", "w", encoding="utf-8") as f:
      for row in BM25_QUESTIONS:
        f.write(json.dumps({"question": row[0], "answer": row[column]}) + "\n")
  return types.SimpleNamespace(root=root, store=store, store_dir=store_dir,
                               plain=str(root / "plain"), regex=f"regex:{root / 'regex'}")


def test_bm25_premises_hold(bm25_world):
  """Which bodies hold which answers, checked with the metric itself (not the job)."""
  store = bm25_world.store
  for _, answers, patterns, blocks, _ in BM25_QUESTIONS:
    for found, match in ((answers, "string"), (patterns, "regex")):
      holding = [b for b in range(store.num_blocks)
                 if metrics_lib.has_answer(store.body(b), found, match=match)]
      assert holding == blocks, (found, holding)


def test_bm25_mode_recall_on_your_own_questions_and_corpus(bm25_world, capsys, tmp_path,
                                                          forget_qa_files):
  ranks = [row[-1] for row in BM25_QUESTIONS]
  ks = (1, 4)  # (1, 5, 20, 100) clipped to the 4 blocks
  expected = {f"recall@{k}": float(np.mean([r is not None and r < k for r in ranks]))
              for k in ks}
  assert expected == {"recall@1": 0.5, "recall@4": 0.75}
  expected |= {"num_questions": 4, "num_blocks": 4}
  names = {}
  for task in (bm25_world.plain, bm25_world.regex):
    output = str(tmp_path / f"bm25_{task.startswith('regex:')}.jsonl")
    code = _main("--gin.RUN_DIR=None", f"--gin.TASK='{task}'", "--gin.evaluate_main.mode='bm25'",
                 f"--gin.evaluate_main.block_store='{bm25_world.store_dir}'",
                 f"--gin.evaluate_main.output='{output}'")
    out, err = _output(capsys)
    assert code == 0, err
    metrics_path = output[:-len(".jsonl")] + ".metrics.json"
    saved = json.load(open(metrics_path, encoding="utf-8"))
    assert saved["task"].startswith("qa_regex_files_" if task.startswith("regex:")
                                    else "qa_files_")
    assert saved == {"mode": "bm25", "run_dir": None, "task": saved["task"], "split": "test",
                     "block_store": bm25_world.store_dir, "bm25": {"k1": 0.9, "b": 0.4},
                     "metrics": expected}
    assert out == [f"evaluate: bm25 {saved['task']}/test, 4 blocks of {bm25_world.store_dir} "
                   f"(k1 0.9, b 0.4): recall@1 0.5000, recall@4 0.7500, num_questions 4, "
                   f"num_blocks 4; metrics {metrics_path}"]
    assert any("BM25 index of 4 blocks" in line for line in err), err
    assert any("questions 4/4 (100.0%)" in line for line in err), err
    names[task] = saved["task"]

  # With a run directory: the metrics go next to the retrieval mode's.
  run_dir = tmp_path / "run"
  run_dir.mkdir()
  code = _main(f"--gin.RUN_DIR='{run_dir}'", f"--gin.TASK='{bm25_world.plain}'",
               "--gin.evaluate_main.mode='bm25'",
               f"--gin.evaluate_main.block_store='{bm25_world.store_dir}'")
  out, err = _output(capsys)
  assert code == 0, err
  name = names[bm25_world.plain]
  saved = json.load(open(run_dir / "predictions" / f"{name}_test_bm25.metrics.json",
                         encoding="utf-8"))
  assert saved["run_dir"] == str(run_dir) and saved["metrics"] == expected


def test_bm25_mode_ict_recall_equals_the_library(private_cache, capsys, tmp_path):
  """ICT queries are decoded to text: the job's recall equals BM25Index over the toy store's
  text with the task's queries decoded here (by position: [CLS] sentence [SEP])."""
  del private_cache  # the toy world is generated into it
  import realm_jax_tasks  # noqa: PLC0415
  from realm_jax.data import vocab as vocab_lib  # noqa: PLC0415
  from realm_jax.evaluation import bm25  # noqa: PLC0415
  output = str(tmp_path / "ict.jsonl")
  code = _main("--gin.RUN_DIR=None", "--gin.TASK='ict_toy'", "--gin.evaluate_main.mode='bm25'",
               "--gin.evaluate_main.split='train'", "--gin.evaluate_main.max_examples=32",
               f"--gin.evaluate_main.output='{output}'")
  out, err = _output(capsys)
  assert code == 0, err
  assert len(out) == 1 and out[0].startswith("evaluate: bm25 ict_toy/train, ")
  metrics = json.load(open(tmp_path / "ict.metrics.json", encoding="utf-8"))["metrics"]

  query_ids, query_mask, block_uid = _ict_queries(32)
  vocab = vocab_lib.default_vocabulary()
  texts = [vocab.decode(ids[mask.astype(bool)][1:-1]) for ids, mask in zip(query_ids, query_mask)]
  store = block_store_lib.BlockStore.open(realm_jax_tasks.toy_block_store_dir())
  index = bm25.BM25Index(store.title(b) + " " + store.body(b) for b in range(store.num_blocks))
  ids, _ = index.top_k(texts, 100)  # [32, 100]
  hits = store.uids.view(np.int64)[ids] == block_uid[:, None]  # [32, 100]
  assert metrics["num_queries"] == 32 and metrics["num_blocks"] == store.num_blocks
  for k in KS:
    assert metrics[f"recall@{k}"] == float(hits[:, :k].any(axis=1).mean()), k
    assert metrics[f"chance@{k}"] == pytest.approx(k / store.num_blocks)
  assert metrics["recall@5"] > 0.5  # the query sentence stays in the store's block


BM25_CONFIG_ERRORS = {  # name: (arguments besides mode 'bm25' and RUN_DIR=None, expected text)
    "checkpoint_step": (["--gin.evaluate_main.checkpoint_step=3"],
                        "evaluate_main.checkpoint_step=3 does not apply to mode 'bm25'"),
    "index_step": (["--gin.evaluate_main.index_step=0"],
                   "evaluate_main.index_step=0 does not apply to mode 'bm25'"),
    "index_run_dir": (["--gin.evaluate_main.index_run_dir='/runs/x'"],
                      "evaluate_main.index_run_dir='/runs/x' does not apply"),
    "backend": (["--gin.evaluate_main.backend='scann'"], "backend='scann' does not apply"),
    "reader_beam": (["--gin.evaluate_main.reader_beam=8"],
                    "reader_beam=8 does not apply to mode 'bm25', which ranks the BlockStore's "
                    "own text (no checkpoint, index or reader): leave it at its default 5"),
    "verify_index": (["--gin.evaluate_main.verify_index=False"], "verify_index=False does not"),
    "no_output_without_run_dir": ([], "mode 'bm25' without a run directory (RUN_DIR=None) "
                                  "needs evaluate_main.output"),
    "store_needed": (["--gin.TASK='nq_open'"], "block_store is required for task 'nq_open' (the "
                     "BlockStore whose blocks BM25 ranks)"),
}


READER_CANDIDATES_ERRORS = {
    "unknown": (["--gin.evaluate_main.candidates='dense'"],
                "evaluate_main.candidates='dense'; expected one of index, bm25"),
    "retrieval_mode": (["--gin.evaluate_main.candidates='bm25'",
                        "--gin.evaluate_main.mode='retrieval'"],
                       "candidates='bm25' is what the reader reads (mode 'qa' or --question); "
                       "mode 'retrieval' does not read"),
    "index_step": (["--gin.evaluate_main.candidates='bm25'", "--gin.evaluate_main.index_step=3"],
                   "evaluate_main.index_step=3 does not apply to candidates='bm25', which reads "
                   "no index: leave it at its default None"),
}


@pytest.mark.parametrize("name", sorted(READER_CANDIDATES_ERRORS))
def test_reader_candidates_config_errors_are_one_line(name, capsys):
  args, expected = READER_CANDIDATES_ERRORS[name]
  line = _one_line(capsys, _main("--gin.RUN_DIR='/tmp/never_made'", *args, "--dry_run"), 2,
                   "config error")
  assert expected in line, line


@pytest.mark.parametrize("name", sorted(BM25_CONFIG_ERRORS))
def test_bm25_config_errors_are_one_line(name, capsys):
  args, expected = BM25_CONFIG_ERRORS[name]
  if name != "no_output_without_run_dir":
    args = args + ["--gin.evaluate_main.output='/tmp/never_written.jsonl'"]
  line = _one_line(capsys, _main("--gin.RUN_DIR=None", "--gin.evaluate_main.mode='bm25'", *args,
                                 "--dry_run"), 2, "config error")
  assert expected in line, line


def test_bm25_dry_run_and_run_dir_none_only_for_bm25(capsys):
  code = _main("--gin.RUN_DIR=None", "--gin.evaluate_main.mode='bm25'",
               "--gin.evaluate_main.output='/tmp/never_written.jsonl'", "--dry_run")
  out, err = _output(capsys)
  assert code == 0 and not err, err
  assert out == ["evaluate: dry run ok (bm25, task toy_qa/test, block store the toy store, "
                 "metrics /tmp/never_written.metrics.json; no data read, nothing written)"]
  line = _one_line(capsys, _main("--gin.RUN_DIR=None", "--dry_run"), 2, "config error")
  assert "run_dir=None: expected a directory path" in line and "mode 'bm25'" in line


# ------------------------------------------------------------------------------ every mode


@pytest.mark.parametrize("mode", ["qa", "retrieval", "bm25"])
def test_every_mode_writes_through_the_one_result_writer(world, mode, monkeypatch, capsys,
                                                         tmp_path):
  """One `results.write` per run: the metrics JSON holds the mode, what the mode says it
  evaluated and the metrics (and the predictions' path for "qa"), the summary line ends with
  the files written."""
  written = []
  write = results.write

  def spy(result, output, run_dir):
    written.append(result)
    return write(result, output, run_dir)

  monkeypatch.setattr(results, "write", spy)
  output = str(tmp_path / f"{mode}.jsonl")
  code = _main(*_world_args(world, f"--gin.evaluate_main.mode='{mode}'",
                            "--gin.evaluate_main.max_examples=4",
                            f"--gin.evaluate_main.output='{output}'"))
  out, err = _output(capsys)
  assert code == 0, err
  assert len(written) == 1 and written[0].mode == mode
  metrics_path = output[:-len(".jsonl")] + ".metrics.json"
  saved = json.load(open(metrics_path, encoding="utf-8"))
  has_predictions = mode == "qa"
  assert set(saved) == {"mode", "metrics", *written[0].fields} | (
      {"predictions"} if has_predictions else set())
  assert saved["mode"] == mode and saved["metrics"] == pytest.approx(dict(written[0].metrics))
  assert saved["metrics"]["num_questions"] == 4
  assert os.path.exists(output) == has_predictions
  files = (f"predictions {output}, " if has_predictions else "") + f"metrics {metrics_path}"
  assert out == [f"evaluate: {written[0].summary}: "
                 f"{metrics_lib.format_metrics(written[0].metrics)}; {files}"]


# ------------------------------------------------------------------------------ dry runs


def test_dry_run_without_a_run(tmp_path, capsys):
  run_dir = tmp_path / "not_yet"
  code = _main(f"--gin.RUN_DIR='{run_dir}'", "--dry_run")
  out, err = _output(capsys)
  assert code == 0 and not err, err
  assert len(out) == 1 and out[0].startswith("evaluate: dry run ok (qa, task toy_qa/test, "), out
  assert f"no checkpoints in {run_dir}/checkpoints yet" in out[0]
  assert not run_dir.exists()


def test_dry_run_checks_the_checkpoint_of_a_run(world, capsys):
  code = _main(*_world_args(world, "--dry_run"))
  out, err = _output(capsys)
  assert code == 0, err
  assert f"checkpoint step {STEP} (latest)" in out[0] and f"index steps [{STEP}]" in out[0]


def test_choose_checkpoint_prefers_best_json(tmp_path):
  run_dir = str(tmp_path)
  assert runs.choose_checkpoint(run_dir, None) == (None, "none")
  for step in (5, 10):
    checkpoints.save_checkpoint(run_dir, step, {"retriever": {"w": np.zeros([2], np.float32)}},
                                config=TINY)
  assert runs.choose_checkpoint(run_dir, None) == (10, "latest")
  assert runs.choose_checkpoint(run_dir, 5) == (5, "as asked")
  best = os.path.join(run_dir, checkpoints.BEST_FILE)
  with open(best, "w", encoding="utf-8") as f:
    json.dump({"metric": "eval/exact_match", "mode": "max", "step": 5, "value": 0.5}, f)
  assert runs.choose_checkpoint(run_dir, None) == (5, "best by eval/exact_match=0.5 in best.json")
  with open(best, "w", encoding="utf-8") as f:
    json.dump({"metric": "eval/exact_match", "mode": "max", "step": 1, "value": 0.5}, f)
  step, why = runs.choose_checkpoint(run_dir, None)
  assert step == 10 and why.startswith("latest (best.json names step 1")


def test_k_values_are_clipped_to_the_corpus():
  assert recall.clip_k_values((1, 5, 20, 100), 12) == (1, 5, 12)
  assert recall.clip_k_values((100, 5, 5), 1000) == (5, 100)


# ------------------------------------------------------------------------------ errors


def _one_line(capsys, code, status, prefix):
  out, err = _output(capsys)
  assert code == status, (out, err)
  assert len(err) == 1, err
  assert err[0].startswith(f"evaluate: {prefix}: "), err
  return err[0]


@pytest.fixture(scope="module")
def other_runs(tmp_path_factory):
  """Runs whose checkpoints the qa mode must refuse: another model size; retriever only."""
  root = tmp_path_factory.mktemp("other_runs")
  bigger = config_lib.RealmConfig(bert=config_lib.tiny_bert(hidden_size=64, num_heads=2))
  params = {"retriever": {"w": np.zeros([2], np.float32)}}
  checkpoints.save_checkpoint(str(root / "bigger"), 3, params, config=bigger)
  checkpoints.save_checkpoint(str(root / "ict"), 3, params, config=TINY)
  return root


CONFIG_ERRORS = {  # name: (arguments besides --gin.RUN_DIR, expected text)
    "unknown_binding": (["--gin.evaluate_main.nope=1"], "nope"),
    "unregistered_task": (["--gin.TASK='toy_qaa'"], "unknown task 'toy_qaa'; registered QA "
                          "tasks: curated_trec, nq_open, toy_qa, web_questions"),
    "bad_mode": (["--gin.evaluate_main.mode='exact'"], "mode='exact'; expected one of qa, "
                 "retrieval"),
    "ict_task_in_qa_mode": (["--gin.TASK='ict_toy'"], "'ict_toy' is not a QA task"),
    "split_the_task_lacks": (["--gin.TASK='ict_toy'", "--gin.evaluate_main.mode='retrieval'"],
                             "task 'ict_toy' has splits train"),
    "store_needed": (["--gin.TASK='nq_open'"], "block_store is required for task 'nq_open'"),
    "unknown_flag": (["--no_such_flag"], "no_such_flag"),
}


@pytest.mark.parametrize("name", sorted(CONFIG_ERRORS))
def test_config_errors_are_one_line(name, tmp_path, capsys):
  args, expected = CONFIG_ERRORS[name]
  line = _one_line(capsys, _main(*args, f"--gin.RUN_DIR='{tmp_path}'", "--dry_run"), 2,
                   "config error")
  assert expected in line, line


def test_missing_run_dir_macro_is_a_config_error(capsys):
  line = _one_line(capsys, _main("--dry_run"), 2, "config error")
  assert "required macro RUN_DIR is not set" in line


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_checkpoint_of_another_model_size_is_a_config_error(other_runs, dry_run, capsys):
  args = [f"--gin.RUN_DIR='{other_runs / 'bigger'}'"] + (["--dry_run"] if dry_run else [])
  line = _one_line(capsys, _main(*args), 2, "config error")
  assert "another model size (hidden 64," in line and "this run's model is (hidden 128," in line


def test_an_ict_checkpoint_has_no_reader_for_qa_mode(other_runs, capsys):
  line = _one_line(capsys, _main(f"--gin.RUN_DIR='{other_runs / 'ict'}'", "--dry_run"), 2,
                   "config error")
  assert "no fine-tuned reader" in line and "mode=\"'retrieval'\"" in line


def test_no_published_index_is_a_one_line_runtime_error(world, library_qa, capsys, tmp_path):
  run_dir = str(tmp_path / "no_index")
  checkpoints.save_checkpoint(run_dir, 7, world.params, config=TINY)
  args = (f"--gin.RUN_DIR='{run_dir}'", f"--gin.evaluate_main.block_store='{world.store_dir}'",
          "--gin.evaluate_main.max_examples=8")
  line = _one_line(capsys, _main(*args), 1, "error")
  assert f"{run_dir}/index: no published index" in line
  # The same run searching another run's index (a fine-tuning run over a frozen index).
  code = _main(*args, f"--gin.evaluate_main.index_run_dir='{world.run_dir}'")
  out, err = _output(capsys)
  assert code == 0, err
  assert f"checkpoint step 7 (latest), index step {STEP}" in out[0]
  saved = json.load(open(os.path.join(run_dir, "predictions", "toy_qa_test_step7.metrics.json"),
                         encoding="utf-8"))
  assert saved["metrics"] == pytest.approx(library_qa.metrics)


@pytest.mark.parametrize("mode", ["qa", "retrieval", "bm25"])
def test_a_missing_run_dir_is_a_one_line_runtime_error(tmp_path, mode, capsys):
  run_dir = tmp_path / "missing"
  line = _one_line(capsys, _main(f"--gin.RUN_DIR='{run_dir}'",
                                 f"--gin.evaluate_main.mode='{mode}'"), 1, "error")
  assert f"{run_dir}: no such run directory" in line


def test_a_flipped_byte_in_the_index_is_refused_unless_the_user_opts_out(world, library_qa,
                                                                        capsys, tmp_path):
  run_dir = str(tmp_path / "flipped")
  checkpoints.save_checkpoint(run_dir, STEP, world.params, config=TINY)
  path = store_lib.publish_index(run_dir, STEP, world.embeddings,
                                 block_store_id=world.store.store_id)
  emb_path = os.path.join(path, store_lib.EMBEDDINGS)
  data = bytearray(open(emb_path, "rb").read())
  data[-3] ^= 0x01  # a low mantissa bit of the last embedding
  with open(emb_path, "wb") as f:
    f.write(bytes(data))
  args = (f"--gin.RUN_DIR='{run_dir}'", f"--gin.evaluate_main.block_store='{world.store_dir}'",
          "--gin.evaluate_main.max_examples=8")
  line = _one_line(capsys, _main(*args), 1, "error")
  assert f"{path}: embeddings.npy does not match its sha256 in the manifest" in line
  assert _main(*args, "--gin.evaluate_main.verify_index=False") == 0, _output(capsys)[1]


def test_retrieval_recall_of_an_index_whose_checkpoint_is_pruned(world, library_qa, capsys,
                                                                  tmp_path):
  """The builder publishes the query tower with the index: recall before pretraining can be
  measured after the run, when the trainer has long pruned the checkpoint."""
  run_dir = str(tmp_path / "pruned")
  step_dir = checkpoints.save_checkpoint(run_dir, STEP, world.params, config=TINY)
  builder.build_index(run_dir, STEP, store=world.store, batch_size=128, progress=None)
  shutil.rmtree(step_dir)
  code = _main(f"--gin.RUN_DIR='{run_dir}'", f"--gin.evaluate_main.block_store='{world.store_dir}'",
               "--gin.evaluate_main.mode='retrieval'", "--gin.evaluate_main.max_examples=8")
  out, err = _output(capsys)
  assert code == 0, err
  assert f"index step {STEP} (query tower from {step_dir})" in out[0]
  metrics = json.load(open(os.path.join(
      run_dir, "predictions", f"toy_qa_test_retrieval_index{STEP}.metrics.json")))["metrics"]
  for k in KS:
    assert metrics[f"recall@{k}"] == library_qa.metrics[f"recall@{k}"]


def test_your_own_question_files_by_path(world, library_qa, capsys, tmp_path,
                                        forget_qa_files):
  """The 8 questions the library answered, written as a user's own files: ORQA JSON lines in a
  directory, a comma-separated .csv given as the file itself, and regex answers."""
  examples = library_qa.examples
  mine = tmp_path / "mine"
  mine.mkdir()
  with open(mine / "test.jsonl", "w", encoding="utf-8") as f:
    for e in examples:
      f.write(json.dumps({"question": e.question, "answer": list(e.answers)}) + "\n")
  single = tmp_path / "questions.csv"
  with open(single, "w", encoding="utf-8", newline="") as f:
    writer = csv.writer(f)
    for e in examples:
      writer.writerow([e.question, repr(list(e.answers))])
  regex_dir = tmp_path / "regex"
  regex_dir.mkdir()
  with open(regex_dir / "test.jsonl", "w", encoding="utf-8") as f:
    for e in examples:  # each answer as an exact, escaped pattern
      f.write(json.dumps({"question": e.question, "answer": [re.escape(a) + "$"
                                                             for a in e.answers]}) + "\n")
  for task, metric in ((str(mine), "exact_match"), (str(single), "exact_match"),
                       (f"regex:{regex_dir}", "regex_match")):
    output = str(tmp_path / f"{metric}_{len(task)}.jsonl")
    code = _main(*_world_args(world, f"--gin.TASK='{task}'",
                              f"--gin.evaluate_main.output='{output}'"))
    out, err = _output(capsys)
    assert code == 0, err
    saved = json.load(open(output.replace(".jsonl", ".metrics.json"), encoding="utf-8"))
    assert saved["task"].startswith("qa_regex_files_" if metric == "regex_match"
                                     else "qa_files_")
    got = saved["metrics"]
    if metric == "exact_match":
      assert got == pytest.approx(library_qa.metrics), (task, got)
    else:  # the library's predictions, scored by the regex metric directly
      expected = np.mean([metrics_lib.regex_match(p["prediction"], [re.escape(a) + "$"
                                                                     for a in e.answers])
                          for p, e in zip(library_qa.predictions, examples)])
      assert got["regex_match"] == pytest.approx(expected) and got["invalid_answer_patterns"] == 0
    assert got["num_questions"] == 8
  # A bad record names the file and line.
  with open(mine / "test.jsonl", "a", encoding="utf-8") as f:
    f.write('{"question": "Who?"}\n')
  line = _one_line(capsys, _main(*_world_args(world, f"--gin.TASK='{mine}/'")), 1, "error")
  assert f"{mine / 'test.jsonl'}:9: field 'answer' is missing" in line
