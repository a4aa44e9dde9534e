"""Atlas's MLM pretext with retrieval (`realm_jax_tasks.atlas`, gin_configs/experiments/
atlas_toy_pretext.gin): a hand-worked example's units (a salient span and a word's `##`
pieces stay whole), the task's examples (shapes, train/dev by the record's hash, the sentinel
ids surviving tf.data, each example restoring one sentence of its split's records), then a short
pretext run through `python -m realm_jax.train` that trains the FiD reader and the question tower
and scores dev EM over the sentinel targets, and a fine-tuning run warm-started from its
checkpoint that loads its FiD encoder, decoder and question tower.

The corpus is the toy world's first 40 documents and X its first 30 pretraining records; the
"pretraining" checkpoint is a fresh RealmPretrainModel (the retriever its index is built from).
"""

import hashlib
import json
import logging
import os

import jax
import numpy as np
import pytest
import seqio

import realm_jax_tasks
from realm_jax import checkpoints
from realm_jax import train
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import salient_spans
from realm_jax.data import sentinels
from realm_jax.data import tensorflow_setup
from realm_jax.data import toy_world
from realm_jax.data import vocab as vocab_lib
from realm_jax.evaluation import metrics
from realm_jax.evaluation import qa as qa_lib
from realm_jax.index import builder
from realm_jax.index import store as store_lib
from realm_jax.models import fid_qa
from realm_jax_tasks import atlas

import toy_runs  # tests/toy_runs.py

# = gin_configs/models/toy.gin's sizes.
TINY = toy_runs.TINY
TASK = "atlas_pretext_pretexttest"
DEV_PERCENT = 20

pytestmark = pytest.mark.usefixtures("one_device")


@pytest.fixture(scope="module")
def records(private_cache, tmp_path_factory):
  del private_cache
  path = os.path.join(toy_world.toy_world_dir(), toy_world.PRETRAIN_FILE)
  chosen = []
  for record in salient_spans.read_precomputed(path):
    chosen.append(record)
    if len(chosen) == 30:
      break
  out = str(tmp_path_factory.mktemp("pretext") / "records.jsonl")
  salient_spans.write_precomputed(out, chosen)
  realm_jax_tasks.register_atlas_pretext_task("pretexttest", pretrain_records=out,
                                              dev_percent=DEV_PERCENT,
                                              max_target_len=atlas.TOY_MAX_TARGET_LEN)
  yield chosen
  seqio.TaskRegistry.remove(TASK)


def test_a_salient_span_and_a_words_pieces_are_single_units():
  vocab = sentinels.sentinel_vocabulary()
  sentence = "Alice met Bob Smith in Tessavar."
  ids, starts, limits = vocab.tokenize_with_offsets(sentence)
  # alice met bob smith in tessa ##var . ; "Bob Smith" is bytes 10..19.
  assert [vocab.id_to_token(i) for i in ids] == ["alice", "met", "bob", "smith", "in", "tessa",
                                                 "##var", "."]
  units = atlas.unit_starts(ids, starts, limits, [(10, 19)], vocab)
  np.testing.assert_array_equal(units, [1, 1, 1, 0, 1, 1, 0, 1])
  seen = set()
  for seed in range(200):
    example = atlas.make_pretext_example(sentence, [(10, 19)],
                                         rng=np.random.default_rng(seed), vocab=vocab,
                                         noise_density=0.3)
    question, targets = example["question_ids"], example["answer_ids"]
    # 6 units: round(1.8) = 2 noise units in one span, [unused0] (id 1) in place of it.
    assert list(question[:1]) + list(question[-1:]) == [vocab_lib.CLS_ID, vocab_lib.SEP_ID]
    assert list(question).count(1) == 1 and targets[0] == 1 and 1 not in targets[1:]
    at = list(question).index(1)
    restored = list(question[1:at]) + list(targets[1:]) + list(question[at + 1:-1])
    assert restored == ids
    masked = set(targets[1:].tolist())
    for whole in ({ids[2], ids[3]}, {ids[5], ids[6]}):  # bob smith; tessa ##var
      assert whole <= masked or not whole & masked
    assert vocab.encode(example["question"]) == list(question[1:-1])
    assert example["answers"][0].startswith("[unused0]")
    seen.add(example["question"])
  assert "Alice met [unused0] Tessavar." in seen  # "Bob Smith in" masked whole
  assert "Alice met Bob Smith in [unused0]" in seen  # "Tessavar ." at the end


def test_the_tasks_examples_restore_their_splits_sentences(records):
  vocab = vocab_lib.default_vocabulary()
  sentence_ids = {"train": set(), "dev": set()}
  for record in records:
    bucket = int(hashlib.sha256(record["text"].encode("utf-8")).hexdigest()[:8], 16) % 100
    data = record["text"].encode("utf-8")
    for start, limit in zip(record["sentence_byte_start"], record["sentence_byte_limit"]):
      sentence_ids["dev" if bucket < DEV_PERCENT else "train"].add(
          tuple(vocab.encode(data[start:limit].decode("utf-8"))))
  assert sentence_ids["train"] and sentence_ids["dev"]
  task = seqio.get_mixture_or_task(TASK)
  assert set(task.splits) == {"train", "dev"}
  sentinel_vocab = sentinels.sentinel_vocabulary()
  noise = total = 0
  for split in ("train", "dev"):
    dataset = task.get_dataset(sequence_length=None, split=split, shuffle=False)
    examples = list(tensorflow_setup.numpy_iterator(dataset))
    assert examples
    for ex in examples:
      question, targets = ex["question_ids"], ex["answer_ids"]
      assert question.dtype == np.int32 and question.ndim == 1 and targets.dtype == np.int32
      assert question[0] == vocab_lib.CLS_ID and question[-1] == vocab_lib.SEP_ID
      assert len(question) <= atlas.QUESTION_LEN and len(targets) + 1 <= 16
      # Spans k = 0, 1, ... are sentinels 1, 2, ... in the question and the target alike.
      in_question = [int(i) for i in question if 1 <= i <= 99]
      in_target = [int(i) for i in targets if 1 <= i <= 99]
      assert in_question == in_target == list(range(1, len(in_target) + 1))
      assert targets[0] == 1
      # The sentinels survive the text: the question text reads back to its ids.
      text = ex["question"].decode("utf-8")
      assert sentinel_vocab.encode(text) == question[1:-1].tolist()
      assert "[unused0]" in text
      # Filling each sentinel with its span gives back a sentence of this split's records.
      spans, current = {}, None
      for i in targets.tolist():
        if 1 <= i <= 99:
          current = i
          spans[current] = []
        else:
          spans[current].append(i)
      restored = [piece for i in question[1:-1].tolist()
                  for piece in (spans[i] if 1 <= i <= 99 else [i])]
      assert tuple(restored) in sentence_ids[split]
      noise += len(targets) - len(spans)
      total += len(restored)
      # The dev EM's reference: the target, detokenised; a decode of exactly the target
      # scores 1.
      answers = [a.decode("utf-8") for a in ex["answers"]]
      assert len(answers) == 1 and answers[0].startswith("[unused0]")
      assert metrics.exact_match(fid_qa.detokenize(targets, sentinel_vocab), answers)
  # About 15% of the words are noise (whole words and salient spans: a little more wordpieces).
  assert 0.12 < noise / total < 0.30, noise / total


@pytest.fixture(scope="module")
def world(records, tmp_path_factory):
  del records
  root = tmp_path_factory.mktemp("pretext_run")
  store_dir, init, params = toy_runs.pretraining_start(root)
  store = block_store_lib.BlockStore.open(store_dir)
  embeddings = builder.embed_blocks(params["retriever"], TINY, store, batch_size=64,
                                    progress=None)
  return root, store, store_dir, init, embeddings


def _train(world, gin_file, name, init, steps, *bindings):
  root, store, store_dir, first, embeddings = world
  run_dir = str(root / name)
  # The frozen index of the pretraining checkpoint, for the pretext and the fine-tuning alike.
  store_lib.publish_index(run_dir, 0, embeddings, block_store_id=store.store_id,
                          checkpoint=first)
  code = train.main([
      "train", f"--gin_file={gin_file}", f"--gin.RUN_DIR='{run_dir}'",
      f"--gin.INIT_CHECKPOINT='{init}'", f"--gin.BLOCK_STORE='{store_dir}'",
      f"--gin.NUM_STEPS={steps}", "--gin.BATCH_SIZE=8",
      f"--gin.train_main.checkpoint_every={steps}", "--gin.train_main.log_every=1",
      "--gin.FinetuneJob.retriever_beam=8",
      "--gin.FinetuneJob.length_bucket=0", "--gin.FidConfig.decoder_layers=1", *bindings])
  assert code == 0
  return run_dir


@pytest.mark.usefixtures("clean_gin")
def test_a_pretext_run_warm_starts_fine_tuning_reader_and_question_tower(world, caplog,
                                                                         monkeypatch):
  init = world[3]
  # The dev evaluation reads the questions with the task's sentinel-reading vocabulary.
  vocabularies = []
  evaluate = qa_lib.evaluate

  def spy(*args, **kwargs):
    vocabularies.append(kwargs.get("vocab"))
    return evaluate(*args, **kwargs)

  monkeypatch.setattr(qa_lib, "evaluate", spy)
  pretext = _train(world, "gin_configs/experiments/atlas_toy_pretext.gin", "pretext", init, 2,
                   f"--gin.TASK='{TASK}'", "--gin.FinetuneJob.eval_examples=8")
  trained, _, metadata = checkpoints.restore_params(pretext, 2)
  assert sorted(metadata["param_items"]) == ["fid", "retriever"]
  with open(os.path.join(pretext, "best.json"), encoding="utf-8") as f:
    best = json.load(f)
  # The dev EM of greedy sentinel sequences picked the checkpoint (a number in [0, 1]).
  assert best["metric"] == "eval/exact_match" and 0.0 <= best["value"] <= 1.0
  assert vocabularies and all(isinstance(v, sentinels.SentinelVocabulary) for v in vocabularies)
  with open(os.path.join(pretext, "fid_config.json"), encoding="utf-8") as f:
    assert json.load(f)["fid"]["max_answer_length"] == atlas.TOY_MAX_TARGET_LEN
  # ADist trained the question tower (the toy model's tied embedder) against the frozen index.
  start, _, _ = checkpoints.restore_params(os.path.dirname(os.path.dirname(init)), 1)
  assert any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(trained["retriever"]),
                                                       jax.tree.leaves(start["retriever"])))

  # Fine-tuning on toy QA from the pretext's checkpoint; learning rate 0, so its step-1
  # parameters are what it warm-started from.
  caplog.set_level(logging.INFO)
  step_dir = checkpoints.checkpoint_path(pretext, 2)
  finetuned = _train(world, "gin_configs/experiments/atlas_toy_finetune.gin", "finetune",
                     step_dir, 1, "--gin.LEARNING_RATE=0.0", "--gin.FinetuneJob.eval_split=''")
  assert any("retriever, FiD reader" in r.getMessage() for r in caplog.records)
  loaded, _, _ = checkpoints.restore_params(finetuned, 1)
  decoder = loaded["fid"]["decoder"]
  assert "layer_0" in decoder and "layer_1" not in decoder
  for part in ("decoder", "encoder"):
    for x, y in zip(jax.tree.leaves(loaded["fid"][part]), jax.tree.leaves(trained["fid"][part])):
      np.testing.assert_array_equal(x, y)
  np.testing.assert_array_equal(decoder["position_embeddings"]["embedding"],
                                trained["fid"]["decoder"]["position_embeddings"]["embedding"])
  for x, y in zip(jax.tree.leaves(loaded["retriever"]), jax.tree.leaves(trained["retriever"])):
    np.testing.assert_array_equal(x, y)
