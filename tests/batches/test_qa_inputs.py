"""Open-QA fine-tuning inputs (issue 5 item 4): questions of a seqio QA task, their beam
retrieved with the live question tower, fixed shapes, resumable position."""

import os

import jax
import numpy as np
import pytest

import realm_jax_tasks  # registers the tasks
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.data import toy_world
from realm_jax.data import vocab as vocab_lib
from realm_jax.index import builder
from realm_jax.index import store as store_lib
from realm_jax.models import config as config_lib
from realm_jax.models import open_qa_model
from realm_jax.batches import qa_batches
from realm_jax.models.retriever import RealmRetriever
from realm_jax.index import retrieval

TINY = config_lib.RealmConfig(bert=config_lib.tiny_bert(), proj_size=16)
BEAM = 12


@pytest.fixture(scope="module", autouse=True)
def cache(private_cache):
  return private_cache


def random_params(init_fn, seed, std):
  """Parameters of the right shapes without running init; std 0.5 makes a random question
  tower's embeddings depend visibly on the question."""
  shapes = jax.eval_shape(init_fn, jax.random.PRNGKey(0))
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.normal(0, std, s.shape).astype(s.dtype), shapes)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """The toy world's first 60 documents as a BlockStore, and an index of it."""
  root = tmp_path_factory.mktemp("qa")
  source = sources_lib.JsonlSource(os.path.join(toy_world.toy_world_dir(), toy_world.CORPUS_FILE))
  corpus_build.build_block_store(source, str(root / "blocks"), limit=60)
  store = block_store_lib.BlockStore.open(str(root / "blocks"))
  model = open_qa_model.OpenQAModel(TINY)
  index_params = random_params(model.init, 1, 0.5)
  embeddings = np.asarray(builder.embed_blocks(index_params["retriever"], TINY, store,
                                               batch_size=64, progress=None))
  path = store_lib.publish_index(str(root / "run"), 0, embeddings,
                                 block_store_id=store.store_id, keep=None)
  loaded = store_lib.load_index(path)
  retriever = retrieval.IndexRetriever(loaded, index_params["retriever"], TINY)
  return {"store": store, "model": model, "retriever": retriever, "embeddings": embeddings,
          "index_params": index_params}


def make_batches(setup, **kwargs):
  args = dict(batch_size=4, store=setup["store"], model=setup["model"],
              retriever=setup["retriever"], retriever_beam=BEAM, max_examples=40)
  args.update(kwargs)
  return qa_batches.OpenQABatches("toy_qa", **args)


def test_qa_task_examples_are_the_task_files():
  examples = qa_batches.qa_task_examples("toy_qa", "dev", max_examples=5)
  with open(os.path.join(toy_world.toy_world_dir(), toy_world.qa_file("dev")),
            encoding="utf-8") as f:
    import json  # pylint: disable=import-outside-toplevel
    records = [json.loads(line) for line, _ in zip(f, range(5))]
  assert [e.question for e in examples] == [r["question"] for r in records]
  assert [list(e.answers) for e in examples] == [r["answer"] for r in records]
  assert not any(e.answers_are_regex for e in examples)


def test_batches_retrieve_with_the_live_question_tower(setup):
  batches = make_batches(setup)
  live = random_params(setup["model"].init, 7, 0.5)["retriever"]
  batches.set_query_params(live)
  batch = next(batches)
  questions = [batches.examples[i].question for i in batches._epoch_order()[:4]]  # pylint: disable=protected-access
  ids, mask, _ = qa_batches.question_arrays(questions, vocab_lib.default_vocabulary(),
                                         question_len=64)
  # The live tower (not the index's) applied directly, brute-force top BEAM by NumPy.
  emb = np.asarray(RealmRetriever(TINY).apply(
      {"params": live}, ids, np.zeros_like(ids), mask, deterministic=True,
      method=RealmRetriever.embed_queries), np.float64)  # [4, proj]
  scores = emb @ setup["embeddings"].astype(np.float64).T  # [4, num_blocks]
  np.testing.assert_array_equal(batch["question_ids"], ids)
  expected = np.argsort(-scores, axis=1, kind="stable")[:, :BEAM]
  np.testing.assert_array_equal(batch["retrieved_block_ids"], expected)
  np.testing.assert_allclose(batch["retrieved_block_emb"],
                             setup["embeddings"][expected], rtol=0, atol=0)
  index_tower = np.asarray(RealmRetriever(TINY).apply(
      {"params": setup["index_params"]["retriever"]}, ids, np.zeros_like(ids), mask,
      deterministic=True, method=RealmRetriever.embed_queries), np.float64)
  assert not np.array_equal(np.argsort(-(index_tower @ setup["embeddings"].T), axis=1)[:, :BEAM],
                            expected)  # the check above could tell the two towers apart
  shapes = {k: v.shape for k, v in batch.items()}
  assert shapes["reader_ids"] == (4, 5, 320) and shapes["reader_gold_starts"] == (4, 5, 32)
  assert shapes["retriever_correct"] == (4, BEAM) and shapes["question_mask"] == (4, 64)
  assert not set(qa_batches.HOST_ONLY_KEYS) & set(batch)
  # The declared schema (what a dry run lowers the step on) is what the iterator yields.
  spec = qa_batches.open_qa_batch_spec(question_len=64, beam=BEAM, proj_size=TINY.proj_size,
                                       reader_beam=5, reader_len=320, max_occurrences=32)
  assert {k: (v.shape, np.dtype(v.dtype)) for k, v in batch.items()} == {
      k: ((4,) + v.shape, np.dtype(v.dtype)) for k, v in spec.items()}
  # The retriever label is the raw substring test of an answer in the block body (ORQA).
  for q, question in enumerate(questions):
    example = next(e for e in batches.examples if e.question == question)
    for k in range(BEAM):
      body = setup["store"].body(int(expected[q, k]))
      assert batch["retriever_correct"][q, k] == any(a in body for a in example.answers)


def test_batches_of_bm25s_blocks_rank_the_question_text_with_zero_retrieval_scores(setup):
  """FinetuneJob.candidates='bm25': the beam is BM25's ranking of each question's text, and
  its block embeddings are zeros (the reader adds no retrieval score; DrQA's pipeline)."""
  from realm_jax.evaluation import bm25  # pylint: disable=import-outside-toplevel
  searcher = bm25.BM25Searcher(setup["store"], TINY.proj_size)
  batches = make_batches(setup, retriever=searcher)
  batches.set_query_params(random_params(setup["model"].init, 7, 0.5)["retriever"])  # unused
  batch = next(batches)
  questions = [batches.examples[i].question for i in batches._epoch_order()[:4]]  # pylint: disable=protected-access
  expected, _ = bm25.BM25Index(bm25.block_texts(setup["store"])).top_k(questions, BEAM)
  np.testing.assert_array_equal(batch["retrieved_block_ids"], expected)
  assert batch["retrieved_block_emb"].shape == (4, BEAM, TINY.proj_size)
  assert not batch["retrieved_block_emb"].any()
  for q, question in enumerate(questions):  # the labels as for any beam
    example = next(e for e in batches.examples if e.question == question)
    assert batch["retriever_correct"][q].tolist() == [
        any(a in setup["store"].body(int(b)) for a in example.answers) for b in expected[q]]


def test_resumed_batches_continue_the_stream(setup):
  straight = make_batches(setup, seed=3)
  first = [next(straight) for _ in range(12)]  # 10 batches per epoch: crosses an epoch
  assert straight.state()["epoch"] == 1
  resumed = make_batches(setup, seed=3)
  cut = make_batches(setup, seed=3)
  for _ in range(7):
    next(cut)
  resumed.restore(cut.state())
  for expected in first[7:]:
    got = next(resumed)
    np.testing.assert_array_equal(got["question_ids"], expected["question_ids"])
    np.testing.assert_array_equal(got["retrieved_block_ids"], expected["retrieved_block_ids"])
  other = make_batches(setup, seed=4)
  with pytest.raises(ValueError, match="another input stream"):
    other.restore(cut.state())
  order = make_batches(setup, seed=3)._epoch_order()  # pylint: disable=protected-access
  assert sorted(order.tolist()) == list(range(40))  # an epoch is a permutation


def test_too_long_questions_are_left_out_and_counted(setup):
  batches = make_batches(setup, question_len=12)
  vocab = vocab_lib.default_vocabulary()
  assert batches.skipped_too_long > 0
  assert all(len(vocab.encode(e.question)) + 2 <= 12 for e in batches.examples)
  assert len(batches.examples) + batches.skipped_too_long == 40
  with pytest.raises(ValueError, match="fewer than the per-host batch size"):
    make_batches(setup, question_len=4)


def test_few_shot_trains_on_one_seeded_sample_whatever_the_training_seed(setup):
  every = qa_batches.qa_task_examples("toy_qa", "train", max_examples=40)
  # The sample: 8 distinct questions of the split, in its order, drawn by the sample's seed.
  runs = [make_batches(setup, seed=seed, few_shot=8, few_shot_seed=5) for seed in (0, 1)]
  questions = [[e.question for e in run.examples] for run in runs]
  assert questions[0] == questions[1] and len(set(questions[0])) == 8
  positions = [next(i for i, e in enumerate(every) if e.question == q) for q in questions[0]]
  assert positions == sorted(positions)
  chosen = np.random.default_rng(5).choice(40, size=8, replace=False)
  assert positions == sorted(chosen.tolist())
  other = make_batches(setup, few_shot=8, few_shot_seed=6)
  assert [e.question for e in other.examples] != questions[0]
  # Training reads only the sample, two batches an epoch, ordered by the training seed.
  seen = set()
  for _ in range(4):
    batch = next(runs[1])
    seen.update(tuple(row) for row in batch["question_ids"])
  assert len(seen) == 8 and runs[1].state()["few_shot"] == 8
  # A position saved for another sample is not resumed on this one.
  with pytest.raises(ValueError, match="another input stream"):
    other.restore(runs[1].state())
  with pytest.raises(ValueError, match="has only 40 questions"):
    make_batches(setup, few_shot=41)
  with pytest.raises(ValueError, match="positive number"):
    make_batches(setup, few_shot=0)


def test_the_fine_tuning_job_trains_on_its_few_shot_sample(setup, tmp_path):
  from realm_jax import jobs  # pylint: disable=import-outside-toplevel
  from realm_jax.jobs.base import RunContext  # pylint: disable=import-outside-toplevel
  from realm_jax.training import partitioning  # pylint: disable=import-outside-toplevel
  ctx = RunContext(run_dir=str(tmp_path), model_config=TINY, batch_size=4, global_batch=4,
                   seed=0, mesh=partitioning.make_mesh(-1, 1), rules=partitioning.DEFAULT_RULES,
                   init_checkpoint=None)
  job = jobs.FinetuneJob(task="toy_qa", block_store=setup["store"].path, few_shot=16,
                         few_shot_seed=2, retriever_beam=BEAM)
  job.configure(ctx)
  batches = job.build_batches(ctx, setup["model"])
  every = qa_batches.qa_task_examples("toy_qa", "train")
  assert [e.question for e in batches.examples] == [
      e.question for e in qa_batches.few_shot_sample(every, 16, 2)]
  assert "few-shot: 16 training questions (sample seed 2)" in job.describe()
