"""The generative open-QA model (`models.fid_qa.FidReaderModel`): its loss is FiD's answer loss
on a hand-built batch, the retriever does not train, greedy answers come back as text that
ORQA's EM (the extractive reader's metric) scores, and the FidConfig round-trips on disk."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax.data import vocab as vocab_lib
from realm_jax.evaluation import metrics
from realm_jax.models import fid as fid_lib
from realm_jax.models import fid_qa
from realm_jax.models import config as config_lib

FID = fid_lib.FidConfig.tiny()
REALM = config_lib.RealmConfig(bert=FID.bert, proj_size=8)
CLS, SEP, PAD = vocab_lib.CLS_ID, vocab_lib.SEP_ID, vocab_lib.PAD_ID


@pytest.fixture(scope="module")
def model_and_params():
  model = fid_qa.FidReaderModel(REALM, FID, reader_beam=2)
  return model, jax.jit(model.init)(jax.random.PRNGKey(0))


def hand_batch():
  """Two questions, K=2 rows of length 6 (`[CLS] q [SEP] body [SEP]`, type ids 0/1); the first
  answer is 2 tokens + EOS, the second 1 token + EOS, the last question a padding one."""
  ids = np.array([[[CLS, 5, SEP, 7, 8, SEP], [CLS, 5, SEP, 9, SEP, PAD]],
                  [[CLS, 6, SEP, 10, SEP, PAD], [CLS, 6, SEP, 11, 12, SEP]],
                  [[CLS, 6, SEP, 10, SEP, PAD], [CLS, 6, SEP, 11, 12, SEP]]], np.int32)
  mask = (ids != PAD).astype(np.int32)
  mask[0, 0, :] = 1
  type_ids = np.zeros_like(ids)
  type_ids[..., 3:] = 1
  type_ids *= mask
  targets = np.array([[20, 21, SEP, PAD], [30, SEP, PAD, PAD], [30, SEP, PAD, PAD]], np.int32)
  answer_mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]], np.int32)
  return {"reader_ids": ids, "reader_type_ids": type_ids, "reader_mask": mask,
          "answer_targets": targets, "answer_mask": answer_mask,
          "retriever_correct": np.array([[False, True, False], [False, False, False],
                                         [True, False, False]]),
          "example_mask": np.array([True, True, False])}


def test_loss_is_fids_answer_loss_on_a_hand_built_batch(model_and_params):
  model, params = model_and_params
  batch = hand_batch()
  loss, aux = model.loss_fn(params, batch, None)
  # Directly: FidModel on the shifted targets, answer_loss over the real questions' tokens.
  logits = fid_lib.FidModel(FID).apply(
      {"params": params["fid"]}, batch["reader_ids"], batch["reader_mask"],
      fid_lib.shift_right(jnp.asarray(batch["answer_targets"]), CLS), batch["reader_type_ids"])
  weights = batch["answer_mask"] * batch["example_mask"][:, None]
  expected, expected_aux = fid_lib.answer_loss(logits, batch["answer_targets"], weights)
  np.testing.assert_allclose(loss, expected, rtol=1e-6)
  assert float(aux["weight_sum"]) == 5.0 == float(expected_aux["weight_sum"])
  np.testing.assert_allclose(aux["loss_sum"], expected_aux["loss_sum"], rtol=1e-6)
  means = model.summarize(model.eval_fn(params, batch))
  np.testing.assert_allclose(means["loss"], expected, rtol=1e-6)
  assert float(means["retriever_any_correct"]) == 0.5  # of the 2 real questions
  assert float(means["reader_any_correct"]) == 0.5  # in the first reader_beam=2 blocks
  assert float(means["answerable"]) == 1.0
  # Dropout on (a key) changes nothing at FidConfig.tiny's zero dropout.
  np.testing.assert_allclose(model.loss_fn(params, batch, jax.random.PRNGKey(3))[0], expected,
                             rtol=1e-6)


def test_only_the_reader_trains(model_and_params):
  _, params = model_and_params
  mask = fid_qa.trainable_mask(params)
  assert not any(jax.tree.leaves(mask["retriever"]))
  assert all(jax.tree.leaves(mask["fid"]))


@pytest.mark.parametrize("answer", ["March 24, 1811", "1811", "O'Brien", "Jean-Luc Picard",
                                    "Traebousk Asle", "the Vraeljou Exhibition", "3.5 km",
                                    "Rock and Roll (album)", "AC/DC", "don't stop",
                                    "1,000 metres"])
def test_detokenised_wordpieces_score_as_the_answer(answer):
  """The round trip answer -> wordpieces + EOS + padding -> text is an exact match under the
  extractive reader's metric (ORQA's normalisation)."""
  vocab = vocab_lib.default_vocabulary()
  ids = [*vocab.encode(answer), SEP, PAD, PAD]
  text = fid_qa.detokenize(ids, vocab)
  assert metrics.exact_match(text, [answer]), (answer, text)


def test_generated_answers_are_decoded_and_scored_by_the_same_em(model_and_params):
  """predict_batch's greedy tokens (the same as fid.greedy_decode) -> answer_texts ->
  metrics.exact_match; the answer's log-probability is its teacher-forced one."""
  model, params = model_and_params
  batch = hand_batch()
  batch.update(retrieved_block_ids=np.array([[3, 1, 2], [0, 1, 2], [0, 1, 2]], np.int32),
               question_emb=np.ones((3, 8), np.float32),
               retrieved_block_emb=np.ones((3, 3, 8), np.float32))
  predictions = jax.jit(model.predict_batch)(params, batch)
  expected = fid_lib.greedy_decode(params["fid"], FID, batch["reader_ids"],
                                   batch["reader_mask"], FID.max_answer_length,
                                   batch["reader_type_ids"])
  np.testing.assert_array_equal(predictions["answer_tokens"], expected)
  np.testing.assert_array_equal(predictions["block_id"], [-1, -1, -1])
  np.testing.assert_allclose(predictions["retrieval_scores"], np.full((3, 3), 8.0))
  vocab = vocab_lib.default_vocabulary()
  texts = model.answer_texts(None, batch, predictions, vocab)
  assert texts == [fid_qa.detokenize(row, vocab) for row in np.asarray(expected)]
  # A generation of "March 24, 1811" (then EOS and padding) matches the task's answers.
  tokens = np.asarray(predictions["answer_tokens"]).copy()
  answer = vocab.encode("March 24, 1811")
  tokens[0, :len(answer) + 1] = [*answer, SEP]
  tokens[0, len(answer) + 1:] = PAD
  text = model.answer_texts(None, batch, {"answer_tokens": tokens}, vocab)[0]
  assert metrics.exact_match(text, ["March 24, 1811", "1811"]) and text == "march 24, 1811"


def test_fid_config_round_trips_through_the_run_dir(tmp_path):
  config = fid_lib.FidConfig.from_bert(REALM.bert, decoder_layers=1, max_answer_length=12)
  fid_qa.write_fid_config(str(tmp_path), config, reader_beam=3)
  assert fid_qa.read_fid_config(str(tmp_path)) == config
  assert fid_qa.read_fid_config(str(tmp_path), REALM.bert) == config
