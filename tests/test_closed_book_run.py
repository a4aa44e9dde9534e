"""Atlas's closed-book baseline (`FinetuneJob.candidates='none'`,
gin_configs/experiments/atlas_toy_closed_book.gin): the FiD reader trained and evaluated with no
retrieval. Its decoder's memory holds the question's tokens only (a hand-worked row); a tiny run
through `python -m realm_jax.train` finishes with no index anywhere, holds no retriever, resumes
exactly (4 steps straight == 2 steps, then resumed to 4: identical parameters), and
`python -m realm_jax.evaluate --gin.evaluate_main.candidates="'none'"` writes its predictions
with empty evidence, scored by the other readers' EM; the settings that make no sense without
retrieval are one-line config errors.

As in tests/test_fid_finetune_run.py the corpus is the toy world's first documents (the store
is never read for a block: the closed book needs one only as the job's BlockStore) and the warm
start a fresh RealmPretrainModel checkpoint (the FiD encoder starts from its encoder's BERT).
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax import checkpoints
from realm_jax import evaluate as evaluate_entry
from realm_jax import train
from realm_jax.batches import fid as fid_batches
from realm_jax.batches import qa_batches
from realm_jax.data.qa_datasets import QAExample
from realm_jax.evaluation import metrics
from realm_jax.models import config as config_lib
from realm_jax.models import fid as fid_lib
from realm_jax.models import fid_qa

import toy_runs  # tests/toy_runs.py

# = gin_configs/models/toy.gin's sizes (what atlas_toy_closed_book.gin includes).
TINY = toy_runs.TINY
GIN = "--gin_file=gin_configs/experiments/atlas_toy_closed_book.gin"
# BERT uncased: [CLS] where was alpha born ? [SEP].
QUESTION_ROW = [101, 2073, 2001, 6541, 2141, 1029, 102]

pytestmark = pytest.mark.usefixtures("one_device", "clean_gin")


@pytest.fixture(scope="module")
def world(private_cache, tmp_path_factory):
  del private_cache
  root = tmp_path_factory.mktemp("closed_book_run")
  store_dir, init, _ = toy_runs.pretraining_start(root)
  return root, store_dir, init


def _train(world, name, steps, *bindings):
  root, store_dir, init = world
  run_dir = str(root / name)
  code = train.main([
      "train", GIN, f"--gin.RUN_DIR='{run_dir}'", f"--gin.INIT_CHECKPOINT='{init}'",
      f"--gin.BLOCK_STORE='{store_dir}'", f"--gin.NUM_STEPS={steps}", "--gin.BATCH_SIZE=8",
      "--gin.train_main.checkpoint_every=2", "--gin.train_main.log_every=1",
      "--gin.FinetuneJob.eval_examples=8", "--gin.FinetuneJob.length_bucket=0",
      "--gin.FidConfig.max_answer_length=6", "--gin.FidConfig.decoder_layers=1", *bindings])
  assert code == 0
  return run_dir


def test_the_decoder_memory_holds_the_question_tokens_only():
  """The closed-book row of "Where was Alpha born?" (7 tokens, reader_len 12): the memory mask
  covers its 7 positions alone, and whatever the 5 padding positions hold, the answer's logits
  are the same (they never enter the memory)."""
  # A NULL_BLOCK beam reads no block: the batch needs no store.
  batch = fid_batches.build_fid_batch(
      None, [QAExample("Where was Alpha born?", ("Paris",))], [[-1]], max_answer_length=4,
      reader_beam=1, reader_len=12)
  ids, mask = batch["reader_ids"], batch["reader_mask"]  # [Q 1, K 1, L 12]
  np.testing.assert_array_equal(ids, [[QUESTION_ROW + [0] * 5]])
  np.testing.assert_array_equal(mask, [[[1] * 7 + [0] * 5]])
  fid = fid_lib.FidConfig.from_bert(config_lib.tiny_bert(), decoder_layers=1,
                                    max_answer_length=4)
  model = fid_qa.FidReaderModel(TINY.replace(bert=config_lib.tiny_bert()), fid, reader_beam=1,
                                closed_book=True)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  assert sorted(params) == ["fid"]  # no retriever
  decoder_in = fid_lib.shift_right(jnp.array([[3000, 102, 0, 0]]), fid.bos_id)

  @jax.jit
  def run(reader_ids):
    return fid_lib.FidModel(fid).apply({"params": params["fid"]}, reader_ids, mask, decoder_in,
                                       np.zeros_like(ids),
                                       method=fid_lib.FidModel.teacher_forced)

  logits, _, memory_mask = run(ids)
  np.testing.assert_array_equal(memory_mask, [[True] * 7 + [False] * 5])
  noise = ids.copy()
  noise[..., 7:] = [2003, 3000, 1999, 6541, 102]  # "is paris in alpha [SEP]" in the padding
  np.testing.assert_allclose(run(noise)[0], logits, rtol=1e-6, atol=1e-6)
  other = ids.copy()
  other[..., 3] = 8247  # "where was beta born ?": the question itself is read
  assert not np.allclose(run(other)[0], logits, atol=1e-4)


def test_closed_book_fine_tuning_needs_no_index_resumes_exactly_and_evaluates(world, capsys):
  straight = _train(world, "straight", 4)
  # The resumed pair skips the dev evaluations: identical parameters then also show that
  # evaluating leaves training as it was.
  no_eval = "--gin.FinetuneJob.eval_split=''"
  _train(world, "resumed", 2, no_eval)
  resumed = _train(world, "resumed", 4, no_eval)
  for run_dir in (straight, resumed):  # no index was needed, none was built
    assert not os.path.exists(os.path.join(run_dir, "index"))
  a, _, metadata = checkpoints.restore_params(straight, 4)
  b, _, _ = checkpoints.restore_params(resumed, 4)
  assert sorted(metadata["param_items"]) == ["fid"]
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)
  with open(os.path.join(straight, "best.json"), encoding="utf-8") as f:
    assert json.load(f)["metric"] == "eval/exact_match"

  capsys.readouterr()
  args = ["evaluate", "--gin_file=gin_configs/experiments/toy_eval.gin",
          f"--gin.RUN_DIR='{straight}'", f"--gin.evaluate_main.block_store='{world[1]}'",
          "--gin.evaluate_main.max_examples=4", "--gin.evaluate_main.batch_size=4"]
  # Without candidates='none' the closed-book checkpoint is refused in one line (no index to
  # look for).
  assert evaluate_entry.main(args) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "is a closed-book reader" in err[0], err
  assert evaluate_entry.main([*args, "--gin.evaluate_main.candidates='none'"]) == 0
  out = capsys.readouterr().out
  assert "closed book (nothing retrieved): exact_match" in out, out
  with open(os.path.join(straight, "best.json"), encoding="utf-8") as f:
    step = json.load(f)["step"]  # what the evaluation reads: the best dev checkpoint
  path = os.path.join(straight, "predictions", f"toy_qa_test_step{step}")
  with open(f"{path}.metrics.json", encoding="utf-8") as f:
    written = json.load(f)
  assert written["candidates"] == "none" and written["index_step"] is None
  assert not any(key.startswith("recall@") for key in written["metrics"])
  with open(f"{path}.jsonl", encoding="utf-8") as f:
    predictions = [json.loads(line) for line in f]
  assert len(predictions) == 4
  for p in predictions:  # empty evidence, the same EM as the other readers
    assert isinstance(p["prediction"], str) and p["block_ids"] == [] and p["block_scores"] == []
    assert p["predicted_block_id"] == -1
    assert p["correct"] == metrics.exact_match(p["prediction"], p["answers"])
  assert written["metrics"]["exact_match"] == np.mean([p["correct"] for p in predictions])


@pytest.mark.parametrize("bindings, match", [
    (["--gin.FinetuneJob.reader='extractive'", "--gin.FinetuneJob.fid=None"],
     "candidates='none' (closed book) reads no block: it needs the generative reader"),
    (["--gin.FinetuneJob.retriever_objective='adist'"],
     "retriever_objective='adist' does not fit candidates='none'"),
    (["--gin.FinetuneJob.reader_beam=5"], "reader_beam=5 does not fit candidates='none'"),
    (["--gin.FinetuneJob.retriever_lr_scale=0.0"],
     "retriever_lr_scale=0.0 does not fit candidates='none'"),
    (["--gin.FinetuneJob.train_document_tower=True"],
     "train_document_tower=True does not fit candidates='none'"),
])
def test_settings_that_need_retrieval_are_one_line_config_errors(bindings, match, capsys,
                                                                 tmp_path):
  code = train.main(["train", GIN, f"--gin.RUN_DIR='{tmp_path}'", "--gin.INIT_CHECKPOINT=None",
                     *bindings, "--dry_run"])
  err = [line for line in capsys.readouterr().err.splitlines()
         if line.startswith("train: ")]
  assert code == 2 and len(err) == 1 and err[0].startswith("train: config error: "), err
  assert match in err[0], err


def test_a_closed_book_searcher_goes_with_a_closed_book_model():
  fid = fid_lib.FidConfig.from_bert(TINY.bert, decoder_layers=1)
  with pytest.raises(ValueError, match="reader_beam=5 and retriever_objective='none'"):
    fid_qa.FidReaderModel(TINY, fid, reader_beam=5, closed_book=True)
  from realm_jax.evaluation import qa as qa_lib  # pylint: disable=import-outside-toplevel
  model = fid_qa.FidReaderModel(TINY, fid, reader_beam=1, closed_book=True)
  with pytest.raises(ValueError, match="its searcher is qa_batches.ClosedBook"):
    qa_lib.Predictor(model, {}, searcher=object(), store=None, block_emb=np.zeros((1, 1)))
  predictor = qa_lib.Predictor(model, {}, searcher=qa_batches.ClosedBook(), store=None)
  assert predictor.closed_book and predictor.block_emb is None
