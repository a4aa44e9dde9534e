"""The Contriever warm start: the `contriever_<corpus>` seqio task (ICT's signature, crops of
the block drawn anew each epoch), IctModel's score options against a NumPy reference, the
job's one-line config errors, and a short end-to-end run of
`gin_configs/experiments/contriever_toy.gin` whose loss falls."""

import json
import os

import numpy as np
import pytest
import seqio

import realm_jax_tasks
from realm_jax import checkpoints
from realm_jax import train
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.data import vocab as vocab_lib
from realm_jax.models import realm
from realm_jax.models.config import RealmConfig
from realm_jax_tasks import pretraining

GIN = "--gin_file=gin_configs/experiments/contriever_toy.gin"
ICT_KEYS = ("query_ids", "query_mask", "block_ids", "block_type_ids", "block_mask",
            "block_uid")

pytestmark = pytest.mark.usefixtures("one_device")


@pytest.fixture
def small_store(tmp_path):
  """A BlockStore of 12 documents of 3 sentences (one block each, blocks of 48)."""
  docs = [sources_lib.Document(f"Topic {i}", f"Topic {i} is a thing number {i}. It lives in "
                               f"town {i} by the river. Many people visit it every year.",
                               f"m:{i}") for i in range(12)]
  corpus_build.build_block_store(docs, str(tmp_path / "store"), max_block_len=48)
  yield str(tmp_path / "store")
  for name in list(seqio.TaskRegistry.names()):
    if name.endswith("_ctrsmall"):
      seqio.TaskRegistry.remove(name)


def _examples(name, seed=None):
  task = seqio.get_mixture_or_task(name)
  return list(task.get_dataset(split="train", shuffle=False, seed=seed,
                               sequence_length=None).as_numpy_iterator())


def _real(row, mask):
  return row[:int(mask.sum())].tolist()


def test_task_has_icts_signature_and_crops_of_its_block(small_store):
  assert pretraining.register_contriever_task(
      "ctrsmall", block_store=small_store, block_len=48) == "contriever_ctrsmall"
  realm_jax_tasks.register_pretraining_tasks("ctrsmall", block_store=small_store, block_len=48)
  crops = seqio.get_mixture_or_task("contriever_ctrsmall")
  ict = seqio.get_mixture_or_task("ict_ctrsmall")
  assert set(crops.output_features) == set(ICT_KEYS)
  for key in ICT_KEYS:
    assert crops.output_features[key].dtype == ict.output_features[key].dtype
    assert crops.output_features[key].rank == ict.output_features[key].rank
  examples, ict_examples = _examples("contriever_ctrsmall"), _examples("ict_ctrsmall")
  assert len(examples) == 12
  for key in ICT_KEYS:
    assert examples[0][key].shape == ict_examples[0][key].shape, key
    assert examples[0][key].dtype == ict_examples[0][key].dtype, key
  assert examples[0]["query_ids"].shape == (64,) and examples[0]["block_ids"].shape == (48,)

  store = block_store_lib.BlockStore.open(small_store)
  vocab = vocab_lib.default_vocabulary()
  for block_id, example in enumerate(examples):
    assert example["block_uid"] == np.array(store.uids[block_id], np.uint64).view(np.int64)
    body = vocab.encode(store.body(block_id))
    title = vocab.encode(store.title(block_id))
    query = _real(example["query_ids"], example["query_mask"])
    block = _real(example["block_ids"], example["block_mask"])
    assert query[0] == vocab_lib.CLS_ID and query[-1] == vocab_lib.SEP_ID
    assert block[:len(title) + 2] == [vocab_lib.CLS_ID, *title, vocab_lib.SEP_ID]
    for crop in (query[1:-1], block[len(title) + 2:-1]):
      # A contiguous piece of the body, 10%-50% of it.
      assert any(body[s:s + len(crop)] == crop for s in range(len(body))), block_id
      assert max(1, int(0.1 * len(body))) <= len(crop) <= int(0.5 * len(body))


def test_crops_are_drawn_anew_each_epoch_and_again_for_the_same_seed(small_store):
  pretraining.register_contriever_task("ctrsmall", block_store=small_store, block_len=48)
  rows = lambda examples: [e["query_ids"].tolist() + e["block_ids"].tolist() for e in examples]
  fixed, again = rows(_examples("contriever_ctrsmall")), rows(_examples("contriever_ctrsmall"))
  epoch_a, epoch_b = (rows(_examples("contriever_ctrsmall", seed=s)) for s in (11, 12))
  assert fixed == again  # no data seed: each block's rng is fixed
  assert epoch_a == rows(_examples("contriever_ctrsmall", seed=11))  # a resumed epoch
  differ = sum(a != b for a, b in zip(epoch_a, epoch_b))
  assert differ >= 9, differ  # a few blocks may draw the same pair by chance


def test_a_contriever_task_name_registers_that_task_over_a_store(small_store, caplog):
  assert realm_jax_tasks.register_corpus_for_task("contriever_ctrsmall", small_store) == "ctrsmall"
  assert "contriever_ctrsmall" in seqio.TaskRegistry.names()
  assert "ict_ctrsmall" not in seqio.TaskRegistry.names()
  assert any("registering Contriever's crop pairs" in r.getMessage() for r in caplog.records)
  assert realm_jax_tasks.register_corpus_for_task("contriever_ctrsmall", small_store) is None
  with pytest.raises(ValueError, match="min_ratio <= max_ratio"):
    pretraining.register_contriever_task("ctrsmall", block_store=small_store,
                                         min_crop_ratio=0.6, max_crop_ratio=0.5)


def _reference_loss(q, b, similarity, temperature):
  """Mean in-batch cross entropy in NumPy (float64): query i's positive is block i."""
  q, b = q.astype(np.float64), b.astype(np.float64)
  if similarity == "cosine":
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
  scores = q @ b.T / temperature
  scores -= scores.max(axis=1, keepdims=True)
  log_probs = scores - np.log(np.exp(scores).sum(axis=1, keepdims=True))
  return -np.mean(np.diag(log_probs)), np.sum(np.argmax(scores, axis=1) == np.arange(len(q)))


@pytest.mark.parametrize("similarity,temperature", [("dot", 1.0), ("dot", 6.4),
                                                    ("cosine", 0.05), ("cosine", 1.0)])
def test_ict_model_scores_against_numpy(similarity, temperature):
  rng = np.random.default_rng(0)
  # LayerNorm-like embeddings: per-row zero mean, unit variance, then a gain and a shift.
  q = rng.normal(size=(6, 16)).astype(np.float32)
  b = (q + rng.normal(scale=2.0, size=(6, 16))).astype(np.float32) * 1.7 + 0.3
  model = realm.IctModel(RealmConfig(), similarity=similarity, temperature=temperature)
  loss, aux = model._in_batch_loss(q, b)  # pylint: disable=protected-access
  expected, correct = _reference_loss(q, b, similarity, temperature)
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
  assert float(aux["accuracy_sum"]) == correct


def test_ict_model_defaults_are_icts_loss_and_bad_options_raise():
  model = realm.IctModel(RealmConfig())
  assert (model.similarity, model.temperature) == ("dot", 1.0)
  with pytest.raises(ValueError, match="similarity='l2' is not one of dot, cosine"):
    realm.IctModel(RealmConfig(), similarity="l2")
  for bad in (0.0, -1.0, True):
    with pytest.raises(ValueError, match="expected a number > 0"):
      realm.IctModel(RealmConfig(), temperature=bad)


def _one_config_error(capsys, *args):
  code = train.main(["train", GIN, *args, "--dry_run"])
  captured = capsys.readouterr()
  err = [line for line in captured.err.splitlines() if line.strip()]
  assert code == 2 and len(err) == 1, (captured.out, err)
  assert err[0].startswith("train: config error: "), err
  return err[0]


@pytest.mark.parametrize("binding,expected", [
    ("TASK='ict_toy'", "ContrieverJob.task='ict_toy' does not fit job 'contriever' (expected a "
                       "contriever_* task (Contriever's crop pairs of that corpus are the task "
                       "'contriever_toy'))"),
    ("TASK='mlm_toy'", "ContrieverJob.task='mlm_toy' does not fit job 'contriever' (expected a "
                       "contriever_* task)"),
    ("ContrieverJob.max_crop_ratio=1.5", "ContrieverJob.min_crop_ratio=0.1, max_crop_ratio=1.5:"
                                         " expected 0 < min_crop_ratio <= max_crop_ratio <= 1"),
    ("ContrieverJob.similarity='l2'", "ContrieverJob.similarity='l2' is not one of dot, cosine"),
    ("ContrieverJob.temperature=0.0", "ContrieverJob.temperature=0.0: expected a number > 0"),
    ("TASK='contriever_elsewhere'", "ContrieverJob.task: "),
    # ICT's setting is refused by gin when the files are parsed.
    ("ContrieverJob.ict_remove_probability=0.5",
     "Configurable 'ContrieverJob' doesn't have a parameter named 'ict_remove_probability'"),
])
def test_config_errors_are_one_line(binding, expected, tmp_path, capsys, clean_gin):
  line = _one_config_error(capsys, f"--gin.RUN_DIR='{tmp_path}'", f"--gin.{binding}")
  assert expected in line, line


def test_contriever_toy_runs_and_its_loss_falls(tmp_path, capsys, clean_gin):
  run_dir = tmp_path / "contriever"
  code = train.main(["train", GIN, f"--gin.RUN_DIR='{run_dir}'", "--gin.NUM_STEPS=12",
                     "--gin.BATCH_SIZE=16", "--gin.train_main.checkpoint_every=12",
                     "--gin.train_main.log_every=1", "--gin.train_main.metrics_format='jsonl'"])
  captured = capsys.readouterr()
  assert code == 0, captured.err[-3000:]
  assert "train: done (job contriever, task contriever_toy" in captured.out, captured.out
  assert "crops 0.1-0.5 of a block" in captured.out
  with open(run_dir / "metrics.jsonl", encoding="utf-8") as f:
    losses = [r["train/loss"] for r in map(json.loads, f) if "train/loss" in r]
  assert len(losses) == 12 and all(np.isfinite(losses)), losses
  # The first steps' loss is far above chance (ln 16 = 2.77: the untrained towers' embeddings
  # are nearly equal, and their dot products large); twelve steps bring it down.
  assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3]), losses
  assert checkpoints.list_checkpoint_steps(str(run_dir)) == [12]
  params, _, _ = checkpoints.restore_checkpoint_dir(checkpoints.checkpoint_path(str(run_dir), 12))
  assert set(params) == {"retriever"}  # an ICT checkpoint to what follows
  assert os.path.exists(run_dir / "TRAINING_DONE")
