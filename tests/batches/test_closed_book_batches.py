"""Closed-book batches (Atlas's baseline without retrieval, `FinetuneJob.candidates='none'`): a
beam of NULL_BLOCK ids (`qa_batches.ClosedBook`) gives reader rows `[CLS] question [SEP]` alone,
checked on hand-worked questions with the BERT uncased vocabulary's ids written out; the job
builds its schema and resumable batches from them, with no index and no retriever."""

import json

import jax
import numpy as np
import pytest

from realm_jax import jobs
from realm_jax.batches import fid as fid_batches
from realm_jax.batches import qa_batches
from realm_jax.batches.pretraining_batches import NULL_BLOCK
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.data import vocab as vocab_lib
from realm_jax.data.qa_datasets import QAExample
from realm_jax.jobs.base import RunContext
from realm_jax.models import config as config_lib
from realm_jax.models import fid_qa
from realm_jax.training import partitioning

# BERT uncased: [CLS] 101, [SEP] 102; "where was alpha born ?" and "who lives in rome ?".
CLS, SEP = 101, 102
WHERE_WAS_ALPHA_BORN = [2073, 2001, 6541, 2141, 1029]
WHO_LIVES_IN_ROME = [2040, 3268, 1999, 4199, 1029]
PARIS, BETA = 3000, 8247
DOCS = [("Alpha", "Alpha was born in Paris in 1811."), ("Beta", "Beta lives in Rome.")]
EXAMPLES = [QAExample(question="Where was Alpha born?", answers=("Paris", "France")),
            QAExample(question="Who lives in Rome?", answers=("Beta",))]


@pytest.fixture(scope="module", autouse=True)
def cache(private_cache):
  return private_cache


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  root = tmp_path_factory.mktemp("closed_book")
  path = root / "docs.jsonl"
  path.write_text("".join(json.dumps({"title": t, "text": x}) + "\n" for t, x in DOCS))
  corpus_build.build_block_store(sources_lib.JsonlSource(str(path)), str(root / "blocks"))
  return block_store_lib.BlockStore.open(str(root / "blocks"))


def test_the_closed_book_retrieves_null_blocks_only():
  scores, ids = qa_batches.ClosedBook().retrieve_texts(["a?", "b?", "c?"], 2)
  np.testing.assert_array_equal(ids, np.full((3, 2), -1))
  np.testing.assert_array_equal(scores, np.zeros((3, 2)))
  assert ids.dtype == np.int32 and scores.dtype == np.float32 and NULL_BLOCK == -1
  assert qa_batches.ranks_texts(qa_batches.ClosedBook())
  assert qa_batches.is_closed_book(qa_batches.ClosedBook())


def test_closed_book_rows_hold_the_question_alone(store):
  """Question 0: [CLS] where was alpha born ? [SEP] = 101 2073 2001 6541 2141 1029 102, then
  padding to reader_len 10: no passage token, type ids 0, mask on the 7 question positions."""
  null = np.full((2, 1), NULL_BLOCK)
  batch = fid_batches.build_fid_batch(store, EXAMPLES, null, np.zeros((2, 1)),
                                      max_answer_length=3, reader_beam=1, reader_len=10,
                                      question_len=8)
  np.testing.assert_array_equal(batch["reader_ids"], [
      [[CLS, *WHERE_WAS_ALPHA_BORN, SEP, 0, 0, 0]],
      [[CLS, *WHO_LIVES_IN_ROME, SEP, 0, 0, 0]]])
  np.testing.assert_array_equal(batch["reader_mask"], [[[1] * 7 + [0] * 3]] * 2)
  np.testing.assert_array_equal(batch["reader_type_ids"], np.zeros((2, 1, 10)))
  assert not batch["reader_block_mask"].any()  # no block token anywhere
  np.testing.assert_array_equal(batch["reader_gold_starts"], -np.ones((2, 1, 1)))
  # Nothing retrieved: no retriever label is true, no embedding is gathered.
  np.testing.assert_array_equal(batch["retriever_correct"], [[False], [False]])
  np.testing.assert_array_equal(batch["retrieved_block_ids"], [[-1], [-1]])
  assert "retrieved_block_emb" not in batch
  # The targets are the retrieval batches': the first answer that fits, then EOS ([SEP]).
  np.testing.assert_array_equal(batch["answer_targets"], [[PARIS, SEP, 0], [BETA, SEP, 0]])
  np.testing.assert_array_equal(batch["answer_mask"], [[1, 1, 0], [1, 1, 0]])
  # The question row is the question tower's row, padded to the reader's length.
  np.testing.assert_array_equal(batch["question_ids"][0, :7], batch["reader_ids"][0, 0, :7])


def test_a_closed_book_question_needs_no_room_for_a_block(store):
  # 7 positions: [CLS] question [SEP] fills reader_len exactly (a retrieved block would not fit).
  batch = qa_batches.build_open_qa_batch(store, EXAMPLES[:1], [[NULL_BLOCK]], reader_beam=1,
                                         reader_len=7)
  np.testing.assert_array_equal(batch["reader_ids"][0, 0], [CLS, *WHERE_WAS_ALPHA_BORN, SEP])
  with pytest.raises(ValueError, match="leaves no room for the block"):
    qa_batches.build_open_qa_batch(store, EXAMPLES[:1], [[0]], reader_beam=1, reader_len=7)
  with pytest.raises(ValueError, match="does not fit reader_len=6"):
    qa_batches.build_open_qa_batch(store, EXAMPLES[:1], [[NULL_BLOCK]], reader_beam=1,
                                   reader_len=6)


def test_null_blocks_only_as_the_whole_beam(store):
  with pytest.raises(ValueError, match="NULL_BLOCK, the closed book, only as the whole beam"):
    qa_batches.build_open_qa_batch(store, EXAMPLES, [[0, NULL_BLOCK], [1, 0]], reader_beam=1,
                                   reader_len=16)
  with pytest.raises(ValueError, match="no block embeddings or document rows"):
    qa_batches.build_open_qa_batch(store, EXAMPLES, np.full((2, 1), NULL_BLOCK), reader_beam=1,
                                   reader_len=16, block_emb=np.ones((2, 4), np.float32))


def _ctx(tmp_path):
  config = config_lib.RealmConfig(bert=config_lib.tiny_bert(), proj_size=8)
  return RunContext(run_dir=str(tmp_path), model_config=config, batch_size=2, global_batch=2,
                    seed=0, mesh=partitioning.make_mesh(-1, 1),
                    rules=partitioning.DEFAULT_RULES, init_checkpoint=None)


def test_the_closed_book_job_builds_its_model_schema_and_resumable_batches(tmp_path):
  ctx = _ctx(tmp_path)
  job = jobs.FinetuneJob(task="toy_qa", reader="fid", candidates="none", reader_beam=1,
                         reader_len=32, retriever_beam=100,
                         fid=jobs.finetune.fid_config(decoder_layers=1, max_answer_length=8))
  job.configure(ctx)
  assert job.retriever_beam == 1  # the beam's one empty slot
  model = job.build_model(ctx)
  assert isinstance(model, fid_qa.FidReaderModel) and model.closed_book
  # No retriever: the parameters are the reader's alone (shapes only, nothing initialised).
  assert sorted(jax.eval_shape(model.init, jax.random.PRNGKey(0))) == ["fid"]
  spec = job.abstract_batch(ctx, model)
  assert sorted(spec) == sorted(fid_batches.FID_MODEL_KEYS)
  assert spec["reader_ids"].shape == (2, 1, 32) and spec["retriever_correct"].shape == (2, 1)
  batches = job.build_batches(ctx, model)
  batches.set_retriever(qa_batches.ClosedBook())
  first = [next(batches) for _ in range(3)]
  assert {k: (v.shape, v.dtype) for k, v in first[0].items()} == {
      k: (s.shape, s.dtype) for k, s in spec.items()}
  vocab = vocab_lib.default_vocabulary()
  for batch in first:  # every row is [CLS] question [SEP] and nothing after it
    lengths = batch["reader_mask"][:, 0].sum(-1)
    for row, length in zip(batch["reader_ids"][:, 0], lengths):
      assert row[0] == CLS and row[length - 1] == SEP and not row[length:].any()
      assert vocab.decode(row[1:length - 1].tolist()).endswith("?")
  again = job.build_batches(ctx, model)
  again.set_retriever(qa_batches.ClosedBook())
  next(again)
  resumed = job.build_batches(ctx, model)
  resumed.set_retriever(qa_batches.ClosedBook())
  resumed.restore(again.state())
  for expected in first[1:]:
    batch = next(resumed)
    for key in expected:
      np.testing.assert_array_equal(batch[key], expected[key])
