"""seqio tasks: every registered task yields batches on the toy world."""

import json
import os
import shutil

import numpy as np
import pytest
import seqio

import realm_jax_tasks
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import qa_datasets
from realm_jax.data import sources as sources_lib
from realm_jax.data import toy_world
from realm_jax.data import vocab as vocab_lib
from realm_jax_tasks import open_qa as qa_tasks

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


@pytest.fixture(scope="module", autouse=True)
def cache(private_cache):
  return private_cache


def _first_batch(name, split="train", batch_size=4):
  dataset = seqio.get_mixture_or_task(name).get_dataset(split=split, shuffle=False)
  return next(iter(dataset.padded_batch(batch_size).as_numpy_iterator()))


@pytest.mark.parametrize("strategy", realm_jax_tasks.MASKING_STRATEGIES)
def test_toy_pretraining_tasks_yield_masked_queries(strategy):
  batch = _first_batch(f"realm_toy_{strategy}")
  assert batch["query_ids"].shape == (4, 96) and batch["mlm_positions"].shape == (4, 10)
  for row in range(4):
    ids, positions = batch["query_ids"][row], batch["mlm_positions"][row]
    weights, targets = batch["mlm_weights"][row], batch["mlm_targets"][row]
    assert ids[0] == vocab_lib.CLS_ID and weights.sum() >= 1
    real = weights > 0
    # Every target slot points at a [MASK] inside the query; padding slots are (0, 0, 0).
    assert np.all(ids[positions[real]] == vocab_lib.MASK_ID)
    assert np.all(targets[real] != vocab_lib.MASK_ID)
    assert np.all(positions[~real] == 0) and np.all(targets[~real] == 0)
  # The toy X paraphrases the corpus, so no example has a source block to exclude.
  assert np.all(batch["source_uid"] == 0)


def test_toy_ict_task_yields_query_block_pairs():
  batch = _first_batch("ict_toy")
  assert batch["query_ids"].shape == (4, 64)
  assert batch["block_ids"].shape == (4, realm_jax_tasks.TOY_BLOCK_LEN)
  assert np.all(batch["block_ids"][:, 0] == vocab_lib.CLS_ID)
  store = block_store_lib.BlockStore.open(realm_jax_tasks.toy_block_store_dir())
  uids = set(np.asarray(store.uids).view(np.int64).tolist())
  assert set(batch["block_uid"].tolist()) <= uids


def test_toy_bert_task_masks_a_sentence_read_with_its_own_block():
  batch = _first_batch("mlm_toy")
  length = 64 + realm_jax_tasks.TOY_BLOCK_LEN
  assert batch["input_ids"].shape == (4, length) and batch["mlm_positions"].shape == (4, 10)
  store = block_store_lib.BlockStore.open(realm_jax_tasks.toy_block_store_dir())
  vocab = vocab_lib.default_vocabulary()
  for row in range(4):  # the first pass is in block order
    ids, types = batch["input_ids"][row], batch["type_ids"][row]
    n = int(batch["input_mask"][row].sum())
    first_sep = int(np.flatnonzero(ids == vocab_lib.SEP_ID)[0])
    real = batch["mlm_weights"][row] > 0
    positions, targets = batch["mlm_positions"][row][real], batch["mlm_targets"][row][real]
    # [CLS] sentence [SEP] in segment 0, then the block's body and [SEP] in segment 1.
    assert ids[0] == vocab_lib.CLS_ID and ids[n - 1] == vocab_lib.SEP_ID and not ids[n:].any()
    assert not types[:first_sep + 1].any() and types[first_sep + 1:n].all()
    assert ids[first_sep + 1:n - 1].tolist() == store.body_tokens(row).tolist()
    # The masks are in the sentence, and the sentence is one of the body's: restored, it occurs
    # verbatim in the body, so every target can be read from the context.
    assert np.all(ids[positions] == vocab_lib.MASK_ID) and np.all(positions < first_sep)
    sentence = ids[1:first_sep].copy()
    sentence[positions - 1] = targets
    body = ids[first_sep + 1:n - 1].tolist()
    assert any(body[i:i + len(sentence)] == sentence.tolist() for i in range(len(body)))
    # Whole words (salient spans are whole names and dates): a masked "##" piece follows a
    # masked piece.
    for p, target in zip(positions, targets):
      if vocab.id_to_token(int(target)).startswith("##"):
        assert p - 1 in positions


def test_toy_qa_task_yields_questions_and_answers():
  batch = _first_batch("toy_qa", split="test", batch_size=3)
  world = toy_world.toy_world_dir()
  with open(os.path.join(world, toy_world.qa_file("test")), encoding="utf-8") as f:
    first = json.loads(f.readline())
  assert batch["question"][0].decode() == first["question"]
  assert batch["answers"][0][0].decode() == first["answer"][0]
  ids = batch["question_ids"][0]
  ids = ids[:np.flatnonzero(ids)[-1] + 1]
  assert ids.tolist() == ([vocab_lib.CLS_ID] + vocab_lib.default_vocabulary().encode(
      first["question"]) + [vocab_lib.SEP_ID])
  task = seqio.get_mixture_or_task("toy_qa")
  assert task.postprocess_fn(b"x", example={"answers": [b"Tessa"]}, is_target=True) == ["Tessa"]


def test_pretraining_on_the_corpus_itself_excludes_each_examples_own_block(tmp_path):
  """X = Z (REALM's Wikipedia setting): every example carries its source block's uid."""
  names = realm_jax_tasks.register_pretraining_tasks(
      "toy_blocks", block_store=realm_jax_tasks.toy_block_store_dir, annotator="union")
  assert names == ["realm_toy_blocks_salient_span", "realm_toy_blocks_random_span",
                   "realm_toy_blocks_random_token", "realm_toy_blocks_random_token_knowledge",
                   "ict_toy_blocks", "mlm_toy_blocks"]
  batch = _first_batch("realm_toy_blocks_salient_span")
  store = block_store_lib.BlockStore.open(realm_jax_tasks.toy_block_store_dir())
  uids = np.asarray(store.uids).view(np.int64)
  assert np.all(np.isin(batch["source_uid"], uids))


def test_a_corpus_is_registered_from_a_task_name_and_said(caplog):
  store = realm_jax_tasks.toy_block_store_dir()
  for name in ("toy_qa", "ict_toy", "nq_open_like"):  # registered already, or no corpus named
    assert realm_jax_tasks.register_corpus_for_task(name, store) is None
  assert realm_jax_tasks.register_corpus_for_task("realm_mine_random_span", store) == "mine"
  assert {"mlm_mine", "ict_mine", "realm_mine_salient_span"} <= set(seqio.TaskRegistry.names())
  assert realm_jax_tasks.register_corpus_for_task("ict_mine", store) is None  # now it exists
  assert realm_jax_tasks.register_corpus_for_task("ict_mnie", store) == "mnie"
  warnings = [r.getMessage() for r in caplog.records if "is not registered" in r.getMessage()]
  assert len(warnings) == 2 and "if 'ict_mnie' is a typo" in warnings[1]
  assert "mine" in warnings[1].split("corpora registered so far: ")[1]
  for corpus in ("mine", "mnie"):
    for task in list(seqio.TaskRegistry.names()):
      if corpus in task:
        seqio.TaskRegistry.remove(task)


def test_ict_on_short_documents_warns_with_what_to_change(tmp_path, caplog):
  """One-sentence documents: with ORQA's removal probability 0.9 most blocks lose their only
  sentence and are skipped; that is a warning saying what to change, not an INFO line."""
  docs = [sources_lib.Document(f"Topic {i}", f"Topic {i} is a thing number {i}.", f"m:{i}")
          for i in range(40)]
  corpus_build.build_block_store(docs, str(tmp_path / "short"), max_block_len=32)
  for name, probability in (("short", 0.9), ("short_kept", 0.0)):
    realm_jax_tasks.register_pretraining_tasks(name, block_store=str(tmp_path / "short"),
                                               block_len=32,
                                               ict_remove_probability=probability)
    dataset = seqio.get_mixture_or_task(f"ict_{name}").get_dataset(split="train",
                                                                   shuffle=False)
    count = sum(1 for _ in dataset.as_numpy_iterator())
    warned = [r.getMessage() for r in caplog.records if "ICT skipped" in r.getMessage()]
    if probability:
      assert 0 < count < 40 * 0.5 and len(warned) == 1, (count, warned)
      assert f"ICT skipped {40 - count} of 40 blocks" in warned[0]
      assert "ict_remove_probability=0.9" in warned[0] and "lower" in warned[0]
      # Another pass (training repeats the task) skips the same blocks: no second warning.
      assert sum(1 for _ in dataset.as_numpy_iterator()) == count
      assert len([r for r in caplog.records if "ICT skipped" in r.getMessage()]) == 1
    else:
      assert count == 40 and len(warned) == 1  # no second warning
    for task in list(seqio.TaskRegistry.names()):
      if task.endswith(f"_{name}") or f"_{name}_" in task:
        seqio.TaskRegistry.remove(task)


def test_a_corpus_registered_by_train_takes_its_removal_probability_and_block_length(
    tmp_path, caplog, capsys, clean_gin):
  """`IctJob.ict_remove_probability` reaches the ICT task train registers over the store,
  whose blocks are the store's own length (not padded to 288)."""
  docs = [sources_lib.Document(f"Topic {i}", f"Topic {i} is a thing number {i}.", f"m:{i}")
          for i in range(40)]
  store = str(tmp_path / "short")
  corpus_build.build_block_store(docs, store, max_block_len=32)
  from realm_jax import train  # pylint: disable=g-import-not-at-top
  code = train.main(["train", "--gin_file=gin_configs/experiments/toy_ict.gin",
                     f"--gin.RUN_DIR='{tmp_path / 'run'}'", "--gin.TASK='ict_shortdocs'",
                     f"--gin.BLOCK_STORE='{store}'",
                     "--gin.IctJob.ict_remove_probability=0.0", "--dry_run"])
  assert code == 0, capsys.readouterr().err
  try:
    dataset = seqio.get_mixture_or_task("ict_shortdocs").get_dataset(split="train",
                                                                     shuffle=False)
    examples = list(dataset.as_numpy_iterator())
    # Probability 0: every one-sentence block keeps its sentence (0.9 skips most, above).
    assert len(examples) == 40
    assert examples[0]["block_ids"].shape == (32,)
    assert not [r for r in caplog.records if "ICT skipped" in r.getMessage()]
  finally:
    for task in list(seqio.TaskRegistry.names()):
      if "shortdocs" in task:
        seqio.TaskRegistry.remove(task)


@pytest.fixture
def qa_data(tmp_path, monkeypatch):
  """The toy QA splits laid out as each benchmark's (already split) data directory."""
  world = toy_world.toy_world_dir()
  for name in realm_jax_tasks.BENCHMARK_TASKS:
    shutil.copytree(os.path.join(world, "qa"), tmp_path / name)
  monkeypatch.setenv(qa_tasks.QA_DATA_ENV, str(tmp_path))
  return tmp_path


@pytest.mark.parametrize("name", realm_jax_tasks.BENCHMARK_TASKS)
def test_benchmark_tasks_yield_batches(qa_data, monkeypatch, name):
  monkeypatch.setenv(qa_tasks.CHECK_SIZES_ENV, "0")
  batch = _first_batch(name, split="dev", batch_size=2)
  assert batch["question_ids"].shape[0] == 2 and batch["answers"].shape[0] == 2
  metric = seqio.get_mixture_or_task(name).metric_fns[0].__name__
  assert metric == ("curated_trec_regex_match" if name == "curated_trec" else "orqa_exact_match")


def test_benchmark_split_sizes_are_checked(qa_data, monkeypatch):
  monkeypatch.setenv(qa_tasks.CHECK_SIZES_ENV, "1")
  with pytest.raises(qa_datasets.SplitSizeError, match="79168"):
    _first_batch("nq_open", split="dev")


def test_benchmark_without_data_dir_says_what_to_set(monkeypatch):
  monkeypatch.delenv(qa_tasks.QA_DATA_ENV, raising=False)
  with pytest.raises(FileNotFoundError, match=r"set \$REALM_JAX_QA_DATA"):
    _first_batch("web_questions", split="test")


def test_every_registered_task_is_documented_in_the_readme():
  with open(README, encoding="utf-8") as f:
    readme = f.read()
  missing = [name for name in realm_jax_tasks.ALL_TASKS if f"`{name}`" not in readme]
  assert not missing, f"README does not list tasks {missing}"
