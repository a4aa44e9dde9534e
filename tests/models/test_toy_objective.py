"""A retriever objective registered from outside the package (`retriever_objectives.register`):
a toy that distils the reader's per-block likelihoods sharpened by a fixed temperature. Its loss
against NumPy on hand-made rows; its declarations read by the checks; one step of the FiD
reader's query-side fine-tuning trained by it through the trainer, against NumPy from the
model's own targets and scores. The registration ends with each test (the `toy` fixture)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax.models import fid_qa
from realm_jax.models import open_qa_model
from realm_jax.models import retriever_objectives
from realm_jax.models.retriever_objectives import EXTRACTIVE, FID, Target
from realm_jax.training import optim
from realm_jax.training import partitioning
from realm_jax.training import trainer

import test_fid_objectives as fid_objectives  # tests/models/: the tiny FiD reader and its batch

FIXED_TEMPERATURE = 0.5


class Sharpened(retriever_objectives.Objective):
  """KL(softmax(sg(log p(y | z_k, x)) / 0.5) || softmax(s)): PDist with a sharper target and
  a temperature of its own, so `objective_temperature` must stay 1."""

  name = "toy_sharpened"
  targets = {FID: Target.LIKELIHOODS}
  no_temperature = "the toy's temperature is fixed"

  def loss(self, reader, scores, values, weights, *, temperature):
    del reader, temperature
    log_target = jax.nn.log_softmax(jax.lax.stop_gradient(values) / FIXED_TEMPERATURE, -1)
    log_q = jax.nn.log_softmax(scores, axis=-1)
    rows = jnp.sum(jnp.exp(log_target) * (log_target - log_q), axis=-1)
    loss_sum, weight_sum = jnp.sum(rows * weights), jnp.sum(weights)
    loss = jnp.where(weight_sum > 0, loss_sum / jnp.maximum(weight_sum, 1e-12), 0.0)
    return loss, {"loss_sum": loss_sum, "weight_sum": weight_sum, "row_losses": rows}


@pytest.fixture
def toy():
  retriever_objectives.register(Sharpened)
  yield retriever_objectives.get(Sharpened.name)
  retriever_objectives.unregister(Sharpened.name)


def np_sharpened(scores, values, weights):
  """(loss_sum, d loss_sum / d scores) in float64, from the formula, row by row."""
  loss_sum, grad = 0.0, np.zeros(scores.shape)
  for n, (s, v, w) in enumerate(zip(scores.astype(np.float64), values.astype(np.float64),
                                    weights)):
    p = np.exp(v / FIXED_TEMPERATURE - np.max(v / FIXED_TEMPERATURE))
    p /= p.sum()
    q = np.exp(s - s.max())
    q /= q.sum()
    loss_sum += w * np.sum(p * (np.log(p) - np.log(q)))
    grad[n] = w * (q - p)
  return loss_sum, grad


def test_the_toy_loss_and_its_gradients_match_numpy(toy):
  scores = np.array([[1.0, -0.5, 2.0], [0.3, 0.3, -1.0], [4.0, 0.0, 1.0]], np.float32)
  values = np.array([[-2.0, -0.5, -3.0], [-1.0, -1.5, -0.2], [-7.0, -6.0, -9.0]], np.float32)
  weights = np.array([3.0, 0.0, 2.0], np.float32)
  expected, expected_grad = np_sharpened(scores, values, weights)

  def loss_sum(s, v):
    return toy.loss(FID, s, v, weights, temperature=1.0)[1]["loss_sum"]

  loss, aux = toy.loss(FID, scores, values, weights, temperature=1.0)
  np.testing.assert_allclose(aux["loss_sum"], expected, rtol=1e-5)
  np.testing.assert_allclose(loss, expected / 5.0, rtol=1e-5)
  score_grad, value_grad = jax.grad(loss_sum, argnums=(0, 1))(scores, values)
  np.testing.assert_allclose(score_grad, expected_grad, rtol=1e-5, atol=1e-6)
  assert not np.any(value_grad)  # the target is held fixed


def test_the_checks_read_the_toys_declarations(toy):
  assert toy.takes_temperature is False and toy.trains_retriever and not toy.joint
  assert Sharpened.name in retriever_objectives.names(FID)
  assert Sharpened.name not in retriever_objectives.names(EXTRACTIVE)
  with pytest.raises(ValueError, match="applies to adist, .*; the toy's temperature is fixed: "
                                       "leave it at 1.0"):
    fid_objectives.model_for(Sharpened.name)  # objective_temperature 0.5
  with pytest.raises(ValueError, match="'toy_sharpened': not one of marginal, emdr2, pdist"):
    open_qa_model.OpenQAModel(fid_objectives.REALM, retriever_objective=Sharpened.name)
  with pytest.raises(ValueError, match="retriever objective 'toy_sharpened': already registered"):
    retriever_objectives.register(Sharpened)


def test_the_registration_ends_with_the_test():
  assert retriever_objectives.get(Sharpened.name) is None
  with pytest.raises(ValueError, match="'toy_sharpened': not one of none, adist, emdr2"):
    retriever_objectives.check_objective(Sharpened.name, 1.0, FID)


def test_one_training_step_with_the_toy_trains_the_question_tower(toy):
  del toy
  model = fid_qa.FidReaderModel(fid_objectives.REALM, fid_objectives.FID,
                                reader_beam=fid_objectives.K, retriever_objective=Sharpened.name)
  assert model.train_question_tower  # the toy's declaration, as the job's optimizer reads it
  trainable = functools.partial(fid_qa.trainable_mask,
                                train_question_tower=model.train_question_tower)
  optimizer = optim.bert_optimizer(1e-2, 10, warmup_steps=0, trainable=trainable)
  step = trainer.make_train_step(model, optimizer,
                                 mesh=partitioning.make_mesh(devices=jax.devices()[:1]))
  state = step.init_state(0)
  before = jax.device_get(state.params)
  batch = fid_objectives.hand_batch()
  # The reference: the toy's formula in NumPy over the model's targets and scores (no dropout
  # in the tiny reader), each question weighted by its counted answer tokens.
  targets, scores = jax.device_get(jax.jit(lambda p, b: (
      model.objective_targets(p, b), model.retrieval_scores(p, b)))(before, batch))
  weights = batch["answer_mask"].sum(-1) * batch["example_mask"]
  expected = np_sharpened(scores, targets, weights)[0] / weights.sum()

  state, metrics = step(state, batch)
  metrics = jax.device_get(metrics)
  after = jax.device_get(state.params)
  assert np.isfinite(metrics["train/loss"]) and np.isfinite(metrics["train/retriever_objective"])
  np.testing.assert_allclose(metrics["train/retriever_objective"], expected, rtol=1e-4)

  def moved(tree_before, tree_after):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(
        jax.tree_util.tree_leaves(tree_before), jax.tree_util.tree_leaves(tree_after)))

  retriever_before, retriever_after = before["retriever"], after["retriever"]
  assert moved(retriever_before["query_embedder"], retriever_after["query_embedder"]) > 0
  # The frozen index's document tower stays as it was.
  assert moved(retriever_before["document_embedder"], retriever_after["document_embedder"]) == 0
