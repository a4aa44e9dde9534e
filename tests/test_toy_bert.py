"""realm_jax.toy_bert: the held-out reading examples, the reading accuracy (against a NumPy count
over the encoder's logits) and the build command (train job -> BertForMaskedLM directory)."""

import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from realm_jax import toy_bert
from realm_jax.convert import hf
from realm_jax.models import config as model_config
from realm_jax.models.reader import RealmKnowledgeAugEncoder
from realm_jax import checkpoints

pytestmark = pytest.mark.usefixtures("one_device", "private_cache")
# The shipped toy BERT reads 0.190 of 200 held-out masked wordpieces with context, 0.077
# without and 0.075 beside another document's block (docs/toy_bert.md): floors with a margin.
READS_WITH_CONTEXT = 0.16
NOT_MISLED_BY_A_DISTRACTOR = 0.8  # with another document's block / without context


def test_heldout_examples_read_the_same_sentences_with_and_without_context():
  own = toy_bert.heldout_examples(16, context="own")
  null = toy_bert.heldout_examples(16, context="null")
  distractor = toy_bert.heldout_examples(16, context="distractor")
  assert own["input_ids"].shape == (16, toy_bert.READER_LEN)
  assert own["mlm_positions"].shape == (16, toy_bert.MAX_MASKS)
  for key in ("mlm_positions", "mlm_targets", "mlm_weights"):
    np.testing.assert_array_equal(own[key], null[key])
    np.testing.assert_array_equal(own[key], distractor[key])
  # The same queries, another body: the rows agree up to the query's [SEP] and differ after.
  query_end = (own["type_ids"] == 1).argmax(1)  # [16]: the body's first position
  for i in range(16):
    np.testing.assert_array_equal(own["input_ids"][i, :query_end[i]],
                                  distractor["input_ids"][i, :query_end[i]])
  assert (own["input_ids"] != distractor["input_ids"]).any(1).all()
  # The null rows are `[CLS] q [SEP] [SEP]`: the own rows minus the body.
  assert (null["input_mask"].sum(1) < own["input_mask"].sum(1)).all()
  assert (null["type_ids"].sum(1) == 1).all()


def test_reading_accuracy_counts_argmax_hits_per_wordpiece_and_per_span():
  config = model_config.RealmConfig(bert=model_config.tiny_bert())
  examples = toy_bert.heldout_examples(10, context="own")
  params = nn.unbox(RealmKnowledgeAugEncoder(config).init(
      jax.random.PRNGKey(0), examples["input_ids"][:1, None], examples["type_ids"][:1, None],
      examples["input_mask"][:1, None], examples["mlm_positions"][:1])["params"])
  # Make some targets right: the argmax of the untrained model at those slots.
  logits = np.asarray(RealmKnowledgeAugEncoder(config).apply(
      {"params": params}, examples["input_ids"][:, None], examples["type_ids"][:, None],
      examples["input_mask"][:, None], examples["mlm_positions"]))[:, 0]
  predicted = logits.argmax(-1)  # [N, M]
  examples = dict(examples, mlm_targets=examples["mlm_targets"].copy())
  examples["mlm_targets"][:4] = np.where(examples["mlm_weights"][:4] > 0, predicted[:4],
                                         examples["mlm_targets"][:4])  # 4 spans right
  examples["mlm_targets"][4, 0] = predicted[4, 0]  # one more wordpiece, not its whole span
  weights = examples["mlm_weights"] > 0
  hits = (predicted == examples["mlm_targets"]) & weights
  result = toy_bert.reading_accuracy(params, config, examples, batch_size=3)  # padded batches
  assert result["examples"] == 10
  assert result["wordpiece_accuracy"] == pytest.approx(hits.sum() / weights.sum())
  spans = [bool(hits[i][weights[i]].all()) for i in range(10)]
  assert result["span_accuracy"] == pytest.approx(np.mean(spans))
  assert 0.4 <= result["span_accuracy"] < 1.0


def test_build_writes_the_trained_encoder_as_a_bert_for_masked_lm(tmp_path, clean_gin, capsys):
  out = str(tmp_path / "toy_bert")
  toy_bert.build(str(tmp_path / "work"), out, steps=2, copy_steps=2, distract_steps=2,
                 bindings=["--gin.BATCH_SIZE=8", "--gin.train_main.checkpoint_every=2",
                           "--gin.MlmJob.shuffle_buffer=64"])
  # Each phase continued from the last checkpoint of the one before.
  copied = tmp_path / "work" / "copy" / "checkpoints" / "2"
  read = tmp_path / "work" / "run" / "checkpoints" / "2"
  printed = capsys.readouterr().out
  assert copied.is_dir() and "job mlm, task mlm_toy_copy" in printed
  assert "job mlm, task mlm_toy_reading" in printed and f"warm start from {copied}" in printed
  assert "job mlm, task mlm_toy_distract" in printed and f"warm start from {read}" in printed
  with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
    hf_config = json.load(f)
  assert hf_config["architectures"] == ["BertForMaskedLM"]
  assert (hf_config["hidden_size"], hf_config["num_hidden_layers"],
          hf_config["num_attention_heads"], hf_config["intermediate_size"]) == (128, 2, 2, 512)
  config, params, _ = hf.load_checkpoint(out)
  trained, _, _ = checkpoints.restore_params(str(tmp_path / "work" / "distract"), 2)
  for path, value in jax.tree_util.tree_leaves_with_path(trained["encoder"]):
    got = params
    for key in path:
      got = got[key.key]
    np.testing.assert_array_equal(got, value, err_msg=str(path))
  assert config.bert.position_init == "normal"  # an initialisation choice, not a weight
  assert len(toy_bert.weights_sha256(out)) == 64


def test_the_shipped_toy_bert_is_the_documented_one_and_reads():
  """The shipped weights: their sha256 is the documented one (docs/toy_bert.md), they load
  through convert.hf as a BERT-tiny, and on held-out sentences (a reading world never read in
  training) they read: masked names and dates are right far more often beside the block that
  states them than with the null document, and beside another document's block they are not
  much worse than with the null document (not misled into copying from it). Thresholds:
  measured 200-example accuracies (docs) less a margin for the sample."""
  config, _, _ = hf.load_checkpoint(toy_bert.SHIPPED_DIR)
  assert (config.bert.hidden_size, config.bert.num_layers, config.bert.num_heads,
          config.bert.intermediate_size, config.bert.vocab_size) == (128, 2, 2, 512, 30522)
  measured = toy_bert.measure(toy_bert.SHIPPED_DIR, 200)
  assert measured["sha256"] == toy_bert.SHIPPED_SHA256
  with_context, without = measured["with_context"], measured["without_context"]
  distractor = measured["with_distractor"]
  assert with_context["wordpiece_accuracy"] > READS_WITH_CONTEXT, with_context
  assert with_context["wordpiece_accuracy"] > 2 * without["wordpiece_accuracy"], (with_context,
                                                                                  without)
  assert (distractor["wordpiece_accuracy"]
          > NOT_MISLED_BY_A_DISTRACTOR * without["wordpiece_accuracy"]), (distractor, without)


def test_the_shipped_english_bert_is_the_documented_one_and_reads_english():
  """The wiki world's English BERT (`--world wiki`): its sha256 is the documented one
  (docs/wiki_world.md), it loads as a BERT-tiny, and on sentences of the wiki world's test
  articles, which it never read, it reads: masked names and dates are right more often beside
  the block that states them than with the null document (measured on 200: 0.097 against 0.080),
  and far more often than the toy BERT gets them (0.010), which never read English."""
  config, _, _ = hf.load_checkpoint(toy_bert.SHIPPED_DIRS["wiki"])
  assert (config.bert.hidden_size, config.bert.num_layers, config.bert.vocab_size) == (
      128, 2, 30522)
  measured = toy_bert.measure(toy_bert.SHIPPED_DIRS["wiki"], 200, "wiki")
  assert measured["sha256"] == toy_bert.WIKI_SHIPPED_SHA256
  with_context = measured["with_context"]["wordpiece_accuracy"]
  without = measured["without_context"]["wordpiece_accuracy"]
  assert with_context > 0.09 and with_context > 1.1 * without, measured
  toy_config, toy_params, _ = hf.load_checkpoint(toy_bert.SHIPPED_DIR)
  toy = toy_bert.reading_accuracy(toy_params, toy_config,
                                  toy_bert.heldout_examples(200, context="own", world="wiki"))
  assert with_context > 3 * toy["wordpiece_accuracy"], toy


def test_the_wiki_world_has_no_third_phase(capsys):
  with pytest.raises(SystemExit):
    toy_bert.main(["--world", "wiki", "--distract_steps", "5"])
  assert "the wiki world's BERT has no third phase" in capsys.readouterr().err
