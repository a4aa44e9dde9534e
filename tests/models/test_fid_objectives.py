"""Atlas's retriever objectives with the FiD reader (`models.fid_qa.FidReaderModel`,
query-side fine-tuning), each checked against a construction of its own: the per-passage
likelihoods against FiD passes over one passage sliced out by hand, the leave-one-out ones
against passes with the passage physically removed (both also with the copy head, which must
not copy from a passage left out), ADist's targets against a separate pass's
cross-attention, the loss against NumPy retrieval scores and `retriever_objectives`; the
objective's gradient reaches the question tower only; `FinetuneJob` refuses what does not fit.
"""

import dataclasses
import functools

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax import jobs
from realm_jax.data import vocab as vocab_lib
from realm_jax.gin_utils import ConfigError
from realm_jax.jobs.base import RunContext
from realm_jax.models import config as config_lib
from realm_jax.models import fid as fid_lib
from realm_jax.models import fid_qa
from realm_jax.models import retriever_objectives
from realm_jax.models.retriever import RealmRetriever
from realm_jax.training import partitioning

# A wide initialiser: the passages' likelihoods then differ by nats, not by rounding.
FID = fid_lib.FidConfig.tiny(initializer_range=0.5)
# The same reader with the copy head (`FidConfig.copy_head`): the decodes over part of the memory
# must leave out the copy head's keys and tokens too.
FID_COPY = dataclasses.replace(FID, copy_head=True)
# Untied towers: the document tower is a separate subtree that must get no gradient.
REALM = config_lib.RealmConfig(bert=FID.bert, proj_size=8, share_embedders=False)
CLS, SEP, PAD = vocab_lib.CLS_ID, vocab_lib.SEP_ID, vocab_lib.PAD_ID
K = 3
TEMPERATURE = 0.5
OBJECTIVES = ("adist", "emdr2", "pdist", "loop")
# Atlas's, and the control whose target is the read blocks that hold an answer.
TRAINED = (*OBJECTIVES, "answer_blocks")


def model_for(objective, fid=FID):
  return fid_qa.FidReaderModel(REALM, fid, reader_beam=K, retriever_objective=objective,
                               objective_temperature=TEMPERATURE if objective != "none" else 1.0)


@pytest.fixture(scope="module")
def params():
  return jax.jit(model_for("none").init)(jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def copy_params():
  return jax.jit(model_for("none", FID_COPY).init)(jax.random.PRNGKey(0))


def readers(params, copy_params):
  """(config, parameters, batch) of the plain reader and of the copy head's, whose batch's
  answers are tokens of the passages (20, 21, 30 are in none), so that copying counts."""
  copyable = hand_batch()
  copyable["answer_targets"] = np.array([[9, 12, SEP, PAD], [14, SEP, PAD, PAD],
                                         [11, SEP, PAD, PAD]], np.int32)
  return {"plain": (FID, params, hand_batch()), "copy": (FID_COPY, copy_params, copyable)}


def hand_batch():
  """Three questions (the last one padding), K=3 rows of length 7 `[CLS] q [SEP] body [SEP]`
  with different paddings; answers of 2 and 1 tokens + EOS; a retrieved beam of 4 whose first
  3 blocks are read: the first question's answer is in its second and third, the second's
  only in its fourth (not read)."""
  ids = np.array([[[CLS, 5, SEP, 7, 8, 9, SEP], [CLS, 5, SEP, 10, SEP, PAD, PAD],
                   [CLS, 5, SEP, 11, 12, SEP, PAD]],
                  [[CLS, 6, 4, SEP, 13, SEP, PAD], [CLS, 6, 4, SEP, 14, 15, SEP],
                   [CLS, 6, 4, SEP, 16, 17, SEP]],
                  [[CLS, 6, SEP, 10, SEP, PAD, PAD], [CLS, 6, SEP, 11, 12, SEP, PAD],
                   [CLS, 6, SEP, 9, SEP, PAD, PAD]]], np.int32)
  mask = (ids != PAD).astype(np.int32)
  question_end = np.argmax(ids == SEP, axis=-1)  # [Q, K] the first [SEP]
  type_ids = (np.arange(ids.shape[-1]) > question_end[..., None]).astype(np.int32) * mask
  targets = np.array([[20, 21, SEP, PAD], [30, SEP, PAD, PAD], [30, SEP, PAD, PAD]], np.int32)
  answer_mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]], np.int32)
  question_ids = np.array([[CLS, 5, SEP, PAD], [CLS, 6, 4, SEP], [CLS, 6, SEP, PAD]], np.int32)
  rng = np.random.default_rng(0)
  return {"reader_ids": ids, "reader_type_ids": type_ids, "reader_mask": mask,
          "answer_targets": targets, "answer_mask": answer_mask,
          "retriever_correct": np.array([[0, 1, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0]], bool),
          "example_mask": np.array([True, True, False]),
          "question_ids": question_ids, "question_type_ids": np.zeros_like(question_ids),
          "question_mask": (question_ids != PAD).astype(np.int32),
          "retrieved_block_emb": rng.normal(size=(3, 4, 8)).astype(np.float32)}


def summed_log_probs(params, ids, mask, type_ids, targets, answer_mask, fid=FID):
  """The reference: a plain FiD pass over the rows given, its log-softmax in NumPy, summed over
  the counted answer tokens -> [Q]."""
  logits = fid_lib.FidModel(fid).apply(
      {"params": params["fid"]}, ids, mask, fid_lib.shift_right(jnp.asarray(targets), CLS),
      type_ids)
  logits = np.asarray(logits, np.float64)
  log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
      -1, keepdims=True)) - logits.max(-1, keepdims=True)
  picked = np.take_along_axis(log_probs, np.asarray(targets)[..., None], axis=-1)[..., 0]
  return (picked * answer_mask).sum(-1)


def assert_spread(values):
  """The passages' values differ clearly: comparing them per passage means something."""
  values = np.asarray(values)[:2]  # the real questions
  assert (values.max(-1) - values.min(-1)).min() > 1e-2, values


@pytest.mark.parametrize("reader", ["plain", "copy"])
@pytest.mark.parametrize("objective", ["emdr2", "pdist"])
def test_per_passage_likelihoods_are_fid_passes_over_one_passage(params, copy_params, objective,
                                                                 reader):
  fid, params, batch = readers(params, copy_params)[reader]
  got = jax.jit(model_for(objective, fid).objective_targets)(params, batch)  # [Q, K]
  expected = np.stack([
      summed_log_probs(params, batch["reader_ids"][:, k:k + 1], batch["reader_mask"][:, k:k + 1],
                       batch["reader_type_ids"][:, k:k + 1], batch["answer_targets"],
                       batch["answer_mask"], fid) for k in range(K)], axis=1)
  assert_spread(expected)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reader", ["plain", "copy"])
def test_left_out_likelihoods_are_fid_passes_with_the_passage_removed(params, copy_params, reader):
  fid, params, batch = readers(params, copy_params)[reader]
  got = jax.jit(model_for("loop", fid).objective_targets)(params, batch)  # [Q, K]
  expected = np.stack([
      summed_log_probs(params, *(np.delete(batch[key], k, axis=1)
                                 for key in ("reader_ids", "reader_mask", "reader_type_ids")),
                       batch["answer_targets"], batch["answer_mask"], fid) for k in range(K)],
      axis=1)
  assert_spread(expected)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  # And not the all-passages likelihood: each decode really misses its passage.
  together = summed_log_probs(params, batch["reader_ids"], batch["reader_mask"],
                              batch["reader_type_ids"], batch["answer_targets"],
                              batch["answer_mask"], fid)
  assert np.abs(np.asarray(got) - together[:, None])[:2].min() > 1e-3


def test_adist_targets_are_the_passage_attention_of_a_separate_pass(params):
  batch = hand_batch()
  got = jax.jit(model_for("adist").objective_targets)(params, batch)  # [Q, K]
  _, state = fid_lib.FidModel(FID).apply(
      {"params": params["fid"]}, batch["reader_ids"], batch["reader_mask"],
      fid_lib.shift_right(jnp.asarray(batch["answer_targets"]), CLS), batch["reader_type_ids"],
      mutable=["intermediates"])
  probs, norms = fid_lib.cross_attention_maps(state["intermediates"])
  expected = fid_lib.passage_attention_scores(probs, norms, batch["answer_mask"],
                                              batch["reader_mask"])
  assert_spread(expected)
  np.testing.assert_allclose(got, expected, rtol=1e-6)


def _np_log_softmax(x):
  x = np.asarray(x, np.float64)
  shifted = x - x.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@pytest.mark.parametrize("objective", TRAINED)
def test_loss_is_the_answer_loss_plus_the_objective_on_numpy_scores(params, objective):
  model = model_for(objective)
  batch = hand_batch()
  loss, aux = jax.jit(model.loss_fn)(params, batch, None)
  example = batch["example_mask"].astype(np.float64)
  weights = batch["answer_mask"] * example[:, None]  # [Q, T]
  tokens = weights.sum(-1)  # [Q] each question's counted tokens: its objective row weight
  answer_sum = -(summed_log_probs(params, batch["reader_ids"], batch["reader_mask"],
                                  batch["reader_type_ids"], batch["answer_targets"],
                                  weights)).sum()
  # The retrieval scores by hand: the live question tower's embeddings . the index's.
  question_emb = np.asarray(RealmRetriever(REALM).apply(
      {"params": params["retriever"]}, batch["question_ids"], batch["question_type_ids"],
      batch["question_mask"], method=RealmRetriever.embed_queries))  # [Q, proj]
  scores = np.einsum("qp,qkp->qk", question_emb, batch["retrieved_block_emb"][:, :K])
  targets = np.asarray(model.objective_targets(params, batch))  # checked above
  function = {"adist": retriever_objectives.adist_loss,
              "emdr2": retriever_objectives.emdr2_loss,
              "pdist": retriever_objectives.pdist_loss,
              "loop": retriever_objectives.left_out_loop_loss,
              "answer_blocks": retriever_objectives.pdist_loss}[objective]
  _, objective_aux = function(scores, targets, tokens, temperature=TEMPERATURE)
  # The same in NumPy: EMDR^2's marginal, or the KL of a target softmax to softmax(s / T).
  log_q = _np_log_softmax(scores / TEMPERATURE)
  if objective == "answer_blocks":
    # Uniform over the first question's answer blocks (its 2nd and 3rd); the second question
    # has none among the 3 read, so no objective: KL(p || q) = -log 2 - mean of log q there.
    rows = np.array([-np.log(2) - log_q[0, 1:3].mean(), 0.0, 0.0])
  elif objective == "emdr2":
    joint = log_q + targets
    rows = -(joint.max(-1) + np.log(np.exp(joint - joint.max(-1, keepdims=True)).sum(-1)))
  else:
    log_p = _np_log_softmax(-targets if objective == "loop" else targets)
    rows = (np.exp(log_p) * (log_p - log_q)).sum(-1)
  np.testing.assert_allclose(objective_aux["loss_sum"], (rows * tokens).sum(), rtol=1e-5)
  np.testing.assert_allclose(aux["objective_loss_sum"], objective_aux["loss_sum"], rtol=1e-5)
  np.testing.assert_allclose(aux["answer_loss_sum"], answer_sum, rtol=1e-5)
  # One denominator, the counted answer tokens: loss = loss_sum / weight_sum, which is what
  # keeps the trainer's microbatched gradient exact.
  assert float(aux["weight_sum"]) == tokens.sum() == 5.0
  np.testing.assert_allclose(loss, (answer_sum + (rows * tokens).sum()) / tokens.sum(),
                             rtol=1e-5)
  means = model.summarize(aux)
  np.testing.assert_allclose(means["answer_loss"] + means["retriever_objective"], means["loss"],
                             rtol=1e-6)
  preferred = -targets if objective == "loop" else targets
  agree = (scores.argmax(-1) == preferred.argmax(-1))[:2].mean()
  np.testing.assert_allclose(means["retriever_agreement"], agree)
  # Whether the target's and the retriever's favourite read block holds an answer, per
  # answered question (the first two; only the first has an answer's block among its K).
  holds = batch["retriever_correct"][:, :K]
  rows_ = np.arange(2)
  np.testing.assert_allclose(means["target_top_answer"],
                             holds[rows_, preferred.argmax(-1)[:2]].mean())
  np.testing.assert_allclose(means["retriever_top_answer"],
                             holds[rows_, scores.argmax(-1)[:2]].mean())
  if objective == "answer_blocks":
    assert float(means["target_top_answer"]) == 0.5


def test_answer_blocks_over_the_beam_scores_blocks_the_reader_does_not_read(params):
  """objective_beam=4: the whole beam of `hand_batch` is scored, so the second question, whose
  answer is only in its 4th block (not read), gets a target too."""
  model = fid_qa.FidReaderModel(REALM, FID, reader_beam=K, retriever_objective="answer_blocks",
                                objective_temperature=TEMPERATURE, objective_beam=4)
  batch = hand_batch()
  _, aux = jax.jit(model.loss_fn)(params, batch, None)
  question_emb = np.asarray(RealmRetriever(REALM).apply(
      {"params": params["retriever"]}, batch["question_ids"], batch["question_type_ids"],
      batch["question_mask"], method=RealmRetriever.embed_queries))
  scores = np.einsum("qp,qkp->qk", question_emb, batch["retrieved_block_emb"])  # [Q, 4]
  log_q = _np_log_softmax(scores / TEMPERATURE)
  tokens = (batch["answer_mask"] * batch["example_mask"][:, None]).sum(-1)  # [3, 2, 0]
  # Question 0: uniform over its blocks 1 and 2; question 1: all on its block 3.
  rows = np.array([-np.log(2) - log_q[0, 1:3].mean(), -log_q[1, 3], 0.0])
  np.testing.assert_allclose(aux["objective_loss_sum"], (rows * tokens).sum(), rtol=1e-5)
  means = model.summarize(aux)
  # Both answered questions' target tops hold an answer; the retriever's top, over 4 blocks.
  assert float(means["target_top_answer"]) == 1.0
  holds = batch["retriever_correct"][:2]
  np.testing.assert_allclose(means["retriever_top_answer"],
                             holds[np.arange(2), scores[:2].argmax(-1)].mean())
  grads = jax.grad(lambda p: model.loss_fn(p, batch, None)[1]["objective_loss_sum"])(params)
  assert any(np.any(leaf) for leaf in jax.tree.leaves(grads["retriever"]["query_embedder"]))
  assert not any(np.any(leaf) for leaf in jax.tree.leaves(grads["fid"]))


def test_targets_in_read_blocks_score_the_beam_but_target_only_the_read(params):
  """objective_beam=4 with targets_in_read_blocks: the 4th block is scored (a negative) but
  never a target, so the second question, whose answer is only there, has no objective."""
  model = fid_qa.FidReaderModel(REALM, FID, reader_beam=K, retriever_objective="answer_blocks",
                                objective_temperature=TEMPERATURE, objective_beam=4,
                                targets_in_read_blocks=True)
  batch = hand_batch()
  assert batch["retriever_correct"][1, 3] and not batch["retriever_correct"][1, :K].any()
  _, aux = jax.jit(model.loss_fn)(params, batch, None)
  question_emb = np.asarray(RealmRetriever(REALM).apply(
      {"params": params["retriever"]}, batch["question_ids"], batch["question_type_ids"],
      batch["question_mask"], method=RealmRetriever.embed_queries))
  scores = np.einsum("qp,qkp->qk", question_emb, batch["retrieved_block_emb"])  # [Q, 4]
  log_q = _np_log_softmax(scores / TEMPERATURE)  # normalised over all 4 scored blocks
  tokens = (batch["answer_mask"] * batch["example_mask"][:, None]).sum(-1)
  # Question 0: uniform over its read blocks 1 and 2, against all four; question 1: none.
  expected = (-np.log(2) - log_q[0, 1:3].mean()) * tokens[0]
  np.testing.assert_allclose(aux["objective_loss_sum"], expected, rtol=1e-5)
  targets = np.asarray(model.objective_targets(params, batch))
  assert np.isneginf(targets[:, K:]).all() and np.isneginf(targets[1]).all()
  with pytest.raises(ValueError, match=r"set objective_beam above reader_beam=3 \(got 3\)"):
    fid_qa.FidReaderModel(REALM, FID, reader_beam=K, retriever_objective="answer_blocks",
                          objective_temperature=TEMPERATURE, objective_beam=K,
                          targets_in_read_blocks=True)


@pytest.fixture(scope="module")
def answer_grads(params):
  """The gradient of the reader's answer loss alone (no objective)."""
  return jax.grad(lambda p: model_for("none").loss_fn(p, hand_batch(), None)[0])(params)


@pytest.mark.parametrize("objective", TRAINED)
def test_the_objective_trains_only_the_question_tower(params, answer_grads, objective):
  """The objective's gradient: the question tower only (no document tower, no reader); the
  reader's gradient of the total loss is the answer loss's alone."""
  batch = hand_batch()
  model = model_for(objective)
  # Eager: at these sizes faster than compiling the backward passes.
  objective_grads = jax.grad(lambda p: model.loss_fn(p, batch, None)[1]["objective_loss_sum"])(
      params)
  total = jax.grad(lambda p: model.loss_fn(p, batch, None)[0])(params)
  for leaf in jax.tree.leaves(objective_grads["fid"]):
    assert not np.any(leaf)
  for leaf in jax.tree.leaves(objective_grads["retriever"]["document_embedder"]):
    assert not np.any(leaf)
  assert any(np.any(leaf) for leaf in
             jax.tree.leaves(objective_grads["retriever"]["query_embedder"]))
  for ours, reference in zip(jax.tree.leaves(total["fid"]), jax.tree.leaves(answer_grads["fid"])):
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-7)
  assert not any(np.any(leaf) for leaf in jax.tree.leaves(answer_grads["retriever"]))


def test_trainable_mask_trains_the_question_tower_only_with_an_objective(params):
  frozen = fid_qa.trainable_mask(params)
  assert not any(jax.tree.leaves(frozen["retriever"])) and all(jax.tree.leaves(frozen["fid"]))
  trained = fid_qa.trainable_mask(params, train_question_tower=True)
  assert all(jax.tree.leaves(trained["retriever"]["query_embedder"]))
  assert not any(jax.tree.leaves(trained["retriever"]["document_embedder"]))
  assert all(jax.tree.leaves(trained["fid"]))
  # Tied towers: the one embedder is the question tower (the index stays frozen regardless).
  tied = {"retriever": {"embedder": {"kernel": np.zeros(2)}}, "fid": {"bias": np.zeros(2)}}
  assert fid_qa.trainable_mask(tied, True) == {"retriever": {"embedder": {"kernel": True}},
                                               "fid": {"bias": True}}


def _ctx(tmp_path):
  config = config_lib.RealmConfig(bert=config_lib.tiny_bert(), proj_size=8)
  return RunContext(run_dir=str(tmp_path), model_config=config, batch_size=2, global_batch=2,
                    seed=0, mesh=partitioning.make_mesh(-1, 1),
                    rules=partitioning.DEFAULT_RULES, init_checkpoint=None)


@pytest.mark.parametrize("setting, match", [
    (dict(few_shot=0), "few_shot=0: expected a positive number of training questions"),
    (dict(reader="fid", few_shot=True), "few_shot=True: expected a positive number"),
    (dict(reader="fid", retriever_objective="marginal"),
     "retriever_objective='marginal' has no counterpart with the FiD reader"),
    (dict(reader="fid", retriever_objective="atlas"), "not one of none, adist, emdr2"),
    (dict(reader="fid", objective_temperature=0.5), "retriever_objective='none' trains no"),
    (dict(reader="fid", retriever_objective="pdist", objective_temperature=0.0),
     "expected a finite number > 0"),
    (dict(reader="fid", train_document_tower=True),
     "train_document_tower=True with retriever_objective='none': nothing trains the document"),
    (dict(reader="fid", retriever_objective="adist", document_beam=20),
     "document_beam=20 re-ranks with the live document tower: set train_document_tower=True"),
    (dict(reader="fid", retriever_objective="adist", train_document_tower=True,
          document_beam=3), r"document_beam=3 re-ranks fewer blocks than the reader reads"),
    (dict(reader="fid", retriever_objective="loop", peft="lora"), "peft='lora' is not available"),
    (dict(reader="fid", retriever_objective="emdr2", candidates="bm25"),
     "candidates='bm25' has none to train"),
    (dict(retriever_objective="none"), "'none' is the FiD reader's"),
])
def test_finetune_job_refuses_what_does_not_fit_in_one_line(setting, match, tmp_path):
  job = jobs.FinetuneJob(**{"task": "toy_qa", **setting})
  with pytest.raises(ConfigError, match=match) as error:
    job.configure(_ctx(tmp_path))
  assert "\n" not in str(error.value)


@pytest.mark.parametrize("setting, objective_beam, match", [
    (dict(reader="fid", retriever_objective="adist"), 20,
     "objective_beam=20 scores blocks the reader does not read: only "
     "retriever_objective='answer_blocks'"),
    (dict(reader="fid", retriever_objective="answer_blocks"), 3,
     r"objective_beam=3 scores fewer blocks than the reader reads \(reader_beam=5\)"),
    (dict(), 20, "answer_blocks_beam is the FiD reader's answer_blocks control"),
])
def test_the_answer_blocks_beam_is_a_gin_setting_checked_in_one_line(setting, objective_beam,
                                                                     match, tmp_path, clean_gin):
  del clean_gin
  gin.bind_parameter("answer_blocks_beam.objective_beam", objective_beam)
  job = jobs.FinetuneJob(**{"task": "toy_qa", **setting})
  with pytest.raises(ConfigError, match=match) as error:
    job.configure(_ctx(tmp_path))
  assert "\n" not in str(error.value)


def test_the_answer_blocks_beam_reaches_the_model(tmp_path, clean_gin):
  del clean_gin
  gin.bind_parameter("answer_blocks_beam.objective_beam", 20)
  gin.bind_parameter("answer_blocks_beam.targets_in_read_blocks", True)
  job = jobs.FinetuneJob(task="toy_qa", reader="fid", retriever_objective="answer_blocks",
                         objective_temperature=0.25)
  model = job.build_model(_ctx(tmp_path))
  assert (model.objective_beam, model.targets_in_read_blocks, model.scored_beam) == (20, True, 20)
  gin.clear_config()
  gin.bind_parameter("answer_blocks_beam.targets_in_read_blocks", True)
  with pytest.raises(ConfigError, match="answer_blocks_beam is the FiD reader's"):
    jobs.FinetuneJob(task="toy_qa").configure(_ctx(tmp_path))


@pytest.mark.parametrize("objective", [None, "none", "adist", "answer_blocks"])
def test_finetune_job_passes_the_objective_to_the_fid_model(objective, tmp_path):
  ctx = _ctx(tmp_path)
  job = jobs.FinetuneJob(task="toy_qa", reader="fid", retriever_objective=objective,
                         objective_temperature=1.0 if objective in (None, "none") else 0.25)
  job.check_retriever_objective()
  job.check_reader(ctx)
  model = job.build_model(ctx)
  assert model.retriever_objective == (objective or "none")
  trainable = job.optimizer_options()["trainable"]
  assert isinstance(trainable, functools.partial) and trainable.func is fid_qa.trainable_mask
  trained = objective in ("adist", "answer_blocks")
  assert trainable.keywords == {"train_question_tower": trained, "train_document_tower": False}
  assert model.train_question_tower == trained and not model.train_document_tower
  if trained:
    assert model.objective_temperature == 0.25


# ------------------------------------------------- the document tower trained (Atlas's full retriever)


def document_batch():
  """`hand_batch` with the K read blocks' document-tower rows `[CLS] title [SEP] body [SEP]`
  [Q, K, 6] (`document_ids`...), as `build_open_qa_batch(document_beam=K)` gives them."""
  batch = hand_batch()
  ids = np.array([[[CLS, 40, SEP, 7, 8, SEP], [CLS, 41, SEP, 10, SEP, PAD],
                   [CLS, 42, SEP, 11, 12, SEP]],
                  [[CLS, 43, SEP, 13, SEP, PAD], [CLS, 44, SEP, 14, 15, SEP],
                   [CLS, 45, SEP, 16, SEP, PAD]],
                  [[CLS, 41, SEP, 10, SEP, PAD], [CLS, 42, SEP, 11, 12, SEP],
                   [CLS, 46, SEP, 9, SEP, PAD]]], np.int32)
  mask = (ids != PAD).astype(np.int32)
  type_ids = (np.arange(6) > 2).astype(np.int32) * mask
  return {**batch, "document_ids": ids, "document_type_ids": type_ids, "document_mask": mask}


def document_model(objective):
  return dataclasses.replace(model_for(objective), train_document_tower=True)


@pytest.mark.parametrize("objective", ["adist", "pdist"])
def test_with_the_document_tower_the_scores_are_live_on_both_sides(params, objective):
  """s_k = q . d_k with d_k the live document tower applied to each block's row alone (flax,
  one block at a time), not the index's embeddings; the objective reads those scores."""
  model = document_model(objective)
  batch = document_batch()
  question_emb = np.asarray(RealmRetriever(REALM).apply(
      {"params": params["retriever"]}, batch["question_ids"], batch["question_type_ids"],
      batch["question_mask"], method=RealmRetriever.embed_queries))  # [Q, proj]
  block_emb = np.stack([np.stack([np.asarray(RealmRetriever(REALM).apply(
      {"params": params["retriever"]}, batch["document_ids"][q, k][None],
      batch["document_type_ids"][q, k][None], batch["document_mask"][q, k][None],
      method=RealmRetriever.embed_documents))[0] for k in range(K)]) for q in range(3)])
  scores = np.einsum("qp,qkp->qk", question_emb, block_emb)  # [Q, K]
  np.testing.assert_allclose(model.retrieval_scores(params, batch), scores, rtol=1e-5,
                             atol=1e-6)
  stale = np.einsum("qp,qkp->qk", question_emb, batch["retrieved_block_emb"][:, :K])
  assert not np.allclose(scores, stale, atol=1e-3)  # the index's embeddings are not read
  _, aux = model.loss_fn(params, batch, None)
  tokens = (batch["answer_mask"] * batch["example_mask"][:, None]).sum(-1)
  function = {"adist": retriever_objectives.adist_loss,
              "pdist": retriever_objectives.pdist_loss}[objective]
  _, expected = function(scores, model.objective_targets(params, batch), tokens,
                         temperature=TEMPERATURE)
  np.testing.assert_allclose(aux["objective_loss_sum"], expected["loss_sum"], rtol=1e-5)
  with pytest.raises(ValueError, match="carries 2 blocks per question"):
    model.retrieval_scores(params, {**batch, "document_ids": batch["document_ids"][:, :2]})


def test_with_the_document_tower_the_objective_trains_both_towers(params, answer_grads):
  batch = document_batch()
  model = document_model("emdr2")
  objective_grads = jax.grad(lambda p: model.loss_fn(p, batch, None)[1]["objective_loss_sum"])(
      params)
  total = jax.grad(lambda p: model.loss_fn(p, batch, None)[0])(params)
  for tower in ("query_embedder", "document_embedder"):
    assert any(np.any(leaf) for leaf in jax.tree.leaves(objective_grads["retriever"][tower]))
  for leaf in jax.tree.leaves(objective_grads["fid"]):
    assert not np.any(leaf)
  for ours, reference in zip(jax.tree.leaves(total["fid"]), jax.tree.leaves(answer_grads["fid"])):
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-7)


def test_trainable_mask_trains_the_document_tower_when_asked(params):
  both = fid_qa.trainable_mask(params, train_question_tower=True, train_document_tower=True)
  assert all(jax.tree.leaves(both["retriever"])) and all(jax.tree.leaves(both["fid"]))
  model = fid_qa.FidReaderModel(REALM, FID, reader_beam=K, retriever_objective="adist",
                                train_document_tower=True, document_beam=10)
  assert (model.num_reembedded, model.rerank_depth) == (K, 10)
  assert (model_for("adist").num_reembedded, model_for("adist").rerank_depth) == (0, 0)
