"""A tiny generative (FiD) fine-tuning run through `python -m realm_jax.train` with
gin_configs/experiments/atlas_toy_finetune.gin (toy_finetune_fid.gin's reader, its question
tower trained by ADist against the frozen index), in-process: it trains the reader and the
question tower and leaves the index as it was, picks its checkpoint by the dev EM of generated
answers, resumes exactly (4 steps straight == 2 steps, then resumed to 4: identical parameters),
and `python -m realm_jax.evaluate` generates answers and writes them with their evidence, scored
by the extractive reader's EM. (toy_finetune_fid.gin's frozen question tower is its trainable
mask, tests/models/test_fid_objectives.py.)

The corpus is the toy world's first documents (an index of the whole toy store takes long); the
"pretraining" checkpoint is a fresh RealmPretrainModel (the retriever its index is built from,
the encoder BERT the FiD encoder starts from).
"""

import json
import os

import jax
import numpy as np
import pytest

from realm_jax import checkpoints
from realm_jax import evaluate as evaluate_entry
from realm_jax import train
from realm_jax.data import block_store as block_store_lib
from realm_jax.evaluation import metrics
from realm_jax.evaluation import modes
from realm_jax.evaluation import qa as qa_lib
from realm_jax.index import builder
from realm_jax.index import search
from realm_jax.index import store as store_lib

import toy_runs  # tests/toy_runs.py

TINY = toy_runs.TINY

pytestmark = pytest.mark.usefixtures("one_device", "clean_gin")


@pytest.fixture(scope="module")
def world(private_cache, tmp_path_factory):
  del private_cache
  root = tmp_path_factory.mktemp("fid_run")
  store_dir, init, params = toy_runs.pretraining_start(root)
  store = block_store_lib.BlockStore.open(store_dir)
  embeddings = builder.embed_blocks(params["retriever"], TINY, store, batch_size=64,
                                    progress=None)
  return root, store, store_dir, init, embeddings


def _run(world, name, steps, *bindings):
  root, store, store_dir, init, embeddings = world
  run_dir = str(root / name)
  if store_lib.latest_index_step(run_dir) is None:
    store_lib.publish_index(run_dir, 0, embeddings, block_store_id=store.store_id,
                            checkpoint=init)
  code = train.main([
      "train", "--gin_file=gin_configs/experiments/atlas_toy_finetune.gin",
      f"--gin.RUN_DIR='{run_dir}'", f"--gin.INIT_CHECKPOINT='{init}'",
      f"--gin.BLOCK_STORE='{store_dir}'", f"--gin.NUM_STEPS={steps}", "--gin.BATCH_SIZE=8",
      "--gin.train_main.checkpoint_every=2", "--gin.train_main.log_every=1",
      "--gin.FinetuneJob.eval_examples=8", "--gin.FinetuneJob.retriever_beam=8",
      "--gin.FinetuneJob.length_bucket=0", "--gin.FidConfig.max_answer_length=6",
      "--gin.FidConfig.decoder_layers=1", *bindings])
  assert code == 0
  return run_dir


def test_fid_fine_tuning_runs_resumes_exactly_and_evaluates_with_evidence(world, capsys):
  straight = _run(world, "straight", 4)
  # The resumed pair skips the dev evaluations: identical parameters then also show that
  # evaluating leaves training as it was.
  no_eval = "--gin.FinetuneJob.eval_split=''"
  _run(world, "resumed", 2, no_eval)
  resumed = _run(world, "resumed", 4, no_eval)
  a, _, metadata = checkpoints.restore_params(straight, 4)
  b, _, _ = checkpoints.restore_params(resumed, 4)
  assert sorted(metadata["param_items"]) == ["fid", "retriever"]
  assert metadata["extra"]["trainer"]["mesh"] == {"data": 1, "model": 1}  # one_device
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)
  # The question tower (the toy model's tied embedder) trained; the document side, the index
  # the objective's scores read, is the one published before the run.
  init, _, _ = checkpoints.restore_params(os.path.dirname(os.path.dirname(world[3])), 1)
  assert any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a["retriever"]),
                                                       jax.tree.leaves(init["retriever"])))
  assert store_lib.latest_index_step(straight) == 0
  np.testing.assert_array_equal(
      store_lib.load_index(store_lib.index_dir(straight, 0)).embeddings, world[4])
  with open(os.path.join(straight, "best.json"), encoding="utf-8") as f:
    assert json.load(f)["metric"] == "eval/exact_match"
  with open(os.path.join(straight, "fid_config.json"), encoding="utf-8") as f:
    assert json.load(f)["fid"]["max_answer_length"] == 6

  capsys.readouterr()
  code = evaluate_entry.main([
      "evaluate", "--gin_file=gin_configs/experiments/toy_eval.gin",
      f"--gin.RUN_DIR='{straight}'", f"--gin.evaluate_main.block_store='{world[2]}'",
      "--gin.evaluate_main.max_examples=4", "--gin.evaluate_main.batch_size=4"])
  assert code == 0
  out = capsys.readouterr().out
  assert "exact_match" in out
  path = os.path.join(straight, "predictions")
  files = [f for f in os.listdir(path) if f.endswith(".jsonl")]
  with open(os.path.join(path, files[0]), encoding="utf-8") as f:
    predictions = [json.loads(line) for line in f]
  assert len(predictions) == 4
  for p in predictions:
    assert isinstance(p["prediction"], str) and len(p["block_ids"]) == 5
    assert len(p["block_scores"]) == 5 and p["predicted_block_id"] == -1
    assert p["correct"] == metrics.exact_match(p["prediction"], p["answers"])



def test_training_the_document_tower_re_ranks_the_stale_beam_in_evaluation(world, capsys):
  """`train_document_tower=True, document_beam=8` (Atlas's full retriever training with
  over-retrieval and re-ranking): the run trains, the index stays as published (no refresh),
  the run's fid_config.json says how it retrieved, and the evaluation reads the best 5 of the
  index's top 8 re-ranked by the checkpoint's document tower, recomputed here by hand (flax
  towers, NumPy search and sort)."""
  from realm_jax.batches import qa_batches  # pylint: disable=import-outside-toplevel
  from realm_jax.data import vocab as vocab_lib  # pylint: disable=import-outside-toplevel
  from realm_jax.models.retriever import RealmRetriever  # pylint: disable=import-outside-toplevel
  root, store, _, init, embeddings = world
  # A stale index: its rows shuffled over the blocks, so that the live tower's ranking of its
  # beam differs from the index's (the comparison below can fail).
  index = embeddings[np.random.default_rng(0).permutation(len(embeddings))]
  store_lib.publish_index(str(root / "document_tower"), 0, index, block_store_id=store.store_id,
                          checkpoint=init)
  run_dir = _run(world, "document_tower", 2, "--gin.FinetuneJob.train_document_tower=True",
                 "--gin.FinetuneJob.document_beam=8")
  with open(os.path.join(run_dir, "fid_config.json"), encoding="utf-8") as f:
    written = json.load(f)
  assert (written["train_document_tower"], written["document_beam"]) == (True, 8)
  assert store_lib.latest_index_step(run_dir) == 0
  with open(os.path.join(run_dir, "best.json"), encoding="utf-8") as f:
    step = json.load(f)["step"]
  params, _, _ = checkpoints.restore_params(run_dir, step)
  capsys.readouterr()
  assert evaluate_entry.main([
      "evaluate", "--gin_file=gin_configs/experiments/toy_eval.gin",
      f"--gin.RUN_DIR='{run_dir}'", f"--gin.evaluate_main.block_store='{world[2]}'",
      "--gin.evaluate_main.max_examples=4", "--gin.evaluate_main.batch_size=4"]) == 0
  path = os.path.join(run_dir, "predictions")
  files = [f for f in os.listdir(path) if f.endswith(".jsonl")]
  with open(os.path.join(path, files[0]), encoding="utf-8") as f:
    predictions = [json.loads(line) for line in f]
  retriever = RealmRetriever(TINY)
  reordered = 0
  expected = {}  # question -> (the re-ranked top 5, their live scores)
  for p in predictions:
    ids, mask, _ = qa_batches.question_arrays([p["question"]], vocab_lib.default_vocabulary())
    question = np.asarray(retriever.apply({"params": params["retriever"]}, ids,
                                          np.zeros_like(ids), mask,
                                          method=RealmRetriever.embed_queries))[0]  # [proj]
    stale = np.argsort(-(index @ question), kind="stable")[:8]  # the index's top 8
    live = np.asarray(retriever.apply(
        {"params": params["retriever"]}, *store.embedder_inputs(stale),
        method=RealmRetriever.embed_documents)) @ question  # [8]
    order = np.argsort(-live, kind="stable")[:5]
    best = stale[order]
    assert p["block_ids"][:5] == best.tolist()
    np.testing.assert_allclose(p["block_scores"][:5], live[order], rtol=1e-4, atol=1e-4)
    reordered += best.tolist() != stale[:5].tolist()
    expected[p["question"]] = best, live[order]
  assert reordered == len(predictions)  # the live tower re-orders the stale beams
  # A free-text question re-ranks as well, and shows the live scores of its evidence.
  model, device_params = modes.open_qa_model(run_dir, TINY, step, reader_beam=5)
  assert model.rerank_depth == 8
  predictor = qa_lib.Predictor(model, device_params, searcher=search.ExactSearcher(index),
                               store=store)
  question = predictions[0]["question"]
  evidence = predictor.answer(question)["evidence"]
  assert [e["block_id"] for e in evidence] == expected[question][0].tolist()
  np.testing.assert_allclose([e["score"] for e in evidence], expected[question][1], rtol=1e-4,
                             atol=1e-4)
