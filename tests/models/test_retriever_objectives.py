"""Atlas's retriever objectives (realm_jax.models.retriever_objectives) against float64 NumPy
references written here from the formulas (hand-written log-softmax, KL and leave-one-out, with
loops), values and gradients in the scores (central finite differences of the references, the
targets held at their values); the stop-gradients; the attention maps BERT sows; and the
objectives wired into the pretraining and fine-tuning models."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax.models import bert as bert_lib
from realm_jax.models import config as model_config
from realm_jax.models import losses
from realm_jax.models import open_qa_model
from realm_jax.models import realm
from realm_jax.models import retriever_objectives as objectives
from realm_jax.models.reader import RealmKnowledgeAugEncoder, RealmReader, enumerate_spans
from realm_jax.models.retriever import RealmRetriever

NEG_INF = -np.inf


# ----------------------------------------------------------------------------------------------
# NumPy references (float64, loops). Each row function returns the row's loss; `targets_from`
# is where a target that depends on the scores (LOOP's prior) reads them, so that finite
# differences in `scores` hold it fixed, as the stop-gradient does.
# ----------------------------------------------------------------------------------------------


def np_log_softmax(values):
  values = np.asarray(values, np.float64)
  top = np.max(values)
  return values - (top + np.log(np.sum(np.exp(values - top))))


def np_kl(target, log_q):
  total = 0.0
  for k, t in enumerate(target):
    if t > 0:
      total += t * (np.log(t) - log_q[k])
  return total


def ref_marginal_row(scores, values, temperature, targets_from):
  del targets_from
  possible = [k for k, v in enumerate(values) if v != NEG_INF]
  if not possible:
    return 0.0
  q = np.exp(np_log_softmax(np.asarray(scores) / temperature))
  return -np.log(sum(q[k] * np.exp(values[k]) for k in possible))


def ref_pdist_row(scores, values, temperature, targets_from):
  del targets_from
  possible = [k for k, v in enumerate(values) if v != NEG_INF]
  if not possible:
    return 0.0
  target = np.zeros(len(values))
  norm = sum(np.exp(values[k]) for k in possible)
  for k in possible:
    target[k] = np.exp(values[k]) / norm
  return np_kl(target, np_log_softmax(np.asarray(scores) / temperature))


def ref_loop_row(scores, values, temperature, targets_from):
  num = len(values)
  possible = [k for k, v in enumerate(values) if v != NEG_INF]
  if not possible:
    return 0.0
  prior = np.exp(np_log_softmax(targets_from))  # the reader's prior, no temperature
  if len(possible) == 1:
    target = np.zeros(num)
    target[possible[0]] = 1.0
  else:
    logits = np.zeros(num)
    for k in range(num):
      # p(y | every candidate but k): the marginal over the others, their prior renormalised.
      kept = [j for j in range(num) if j != k]
      p_without = (sum(prior[j] * np.exp(values[j]) for j in kept if j in possible)
                   / sum(prior[j] for j in kept))
      logits[k] = -np.log(p_without)
    target = np.exp(np_log_softmax(logits))
  return np_kl(target, np_log_softmax(np.asarray(scores) / temperature))


def ref_adist_row(scores, values, temperature, targets_from):
  del targets_from
  target = np.exp(np_log_softmax(values))
  return np_kl(target, np_log_softmax(np.asarray(scores) / temperature))


REFERENCES = {"marginal": ref_marginal_row, "emdr2": ref_marginal_row,
              "pdist": ref_pdist_row, "loop": ref_loop_row, "adist": ref_adist_row}
FUNCTIONS = {"marginal": objectives.marginal_loss, "emdr2": objectives.emdr2_loss,
             "pdist": objectives.pdist_loss, "loop": objectives.loop_loss,
             "adist": objectives.adist_loss}


def ref_loss(name, scores, values, weights, temperature, targets_from=None):
  """(loss, loss_sum, weight_sum): rows of weight 0 are skipped (never read)."""
  targets_from = scores if targets_from is None else targets_from
  loss_sum, weight_sum = 0.0, 0.0
  for n, weight in enumerate(weights):
    if weight == 0:
      continue
    loss_sum += weight * REFERENCES[name](scores[n], values[n], temperature, targets_from[n])
    weight_sum += weight
  return (loss_sum / weight_sum if weight_sum else 0.0), loss_sum, weight_sum


def ref_grad(name, scores, values, weights, temperature, step=1e-6):
  """d loss / d scores by central differences, the targets held at `scores`."""
  scores = np.asarray(scores, np.float64)
  grad = np.zeros_like(scores)
  for index in np.ndindex(*scores.shape):
    if weights[index[0]] == 0:
      continue  # a padded row's scores are never read
    plus, minus = scores.copy(), scores.copy()
    plus[index] += step
    minus[index] -= step
    grad[index] = (ref_loss(name, plus, values, weights, temperature, scores)[0]
                   - ref_loss(name, minus, values, weights, temperature, scores)[0]) / (2 * step)
  return grad


# ----------------------------------------------------------------------------------------------
# Inputs: six rows of five candidates.
# ----------------------------------------------------------------------------------------------

WEIGHTS = np.array([1.0, 2.0, 0.5, 1.0, 0.0, 1.5], np.float32)


def _inputs(name, seed=0):
  """Row 0 all possible; row 1 two impossible (-inf); row 2 one possible; row 3 none (loss 0,
  its weight counts); row 4 padding (weight 0, NaN everywhere); row 5 all possible."""
  rng = np.random.default_rng(seed)
  scores = rng.normal(0.0, 1.5, (6, 5)).astype(np.float32)
  if name == "adist":  # attention relevances: finite, positive
    values = rng.uniform(0.0, 3.0, (6, 5)).astype(np.float32)
  else:  # log-likelihoods
    values = -rng.exponential(2.0, (6, 5)).astype(np.float32)
    values[1, [0, 3]] = NEG_INF
    values[2, [0, 1, 3, 4]] = NEG_INF
    values[3] = NEG_INF
  scores[4] = np.nan
  values[4] = np.nan
  return scores, values


@pytest.mark.parametrize("temperature", [1.0, 0.4])
@pytest.mark.parametrize("name", ["marginal", "emdr2", "pdist", "loop", "adist"])
def test_values_and_score_gradients_match_the_numpy_reference(name, temperature):
  scores, values = _inputs(name)
  fn = functools.partial(FUNCTIONS[name], temperature=temperature)
  loss, aux = fn(scores, values, WEIGHTS)
  expected, loss_sum, weight_sum = ref_loss(name, scores.astype(np.float64),
                                            values.astype(np.float64), WEIGHTS, temperature)
  assert loss.dtype == jnp.float32
  np.testing.assert_allclose(loss, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(aux["loss_sum"], loss_sum, rtol=1e-5, atol=1e-6)
  assert float(aux["weight_sum"]) == weight_sum == 6.0  # the row without a possible one counts
  # Rows without a target (no possible candidate; attention relevances are all finite) and
  # padding: loss 0, no gradient.
  empty = [4] if name == "adist" else [3, 4]
  row_losses = np.asarray(aux["row_losses"])
  np.testing.assert_array_equal(row_losses[empty], 0.0)
  assert np.all(np.delete(row_losses, empty) != 0)

  grad = np.asarray(jax.grad(lambda s: fn(s, values, WEIGHTS)[0])(scores))
  assert np.all(np.isfinite(grad))
  np.testing.assert_array_equal(grad[empty], 0.0)
  expected_grad = ref_grad(name, scores.astype(np.float64), values.astype(np.float64), WEIGHTS,
                           temperature)
  np.testing.assert_allclose(grad, expected_grad, rtol=1e-4, atol=2e-6)


def test_kl_gradient_is_q_minus_target_over_temperature():
  """The hand-derived gradient of KL(t || softmax(s / T)) in s: w / sum(w) (q - t) / T."""
  scores, values = _inputs("pdist", seed=1)
  rows = [0, 5]
  grad = jax.grad(lambda s: objectives.pdist_loss(s, values[rows], WEIGHTS[rows],
                                                  temperature=0.5)[0])(scores[rows])
  for i, n in enumerate(rows):
    q = np.exp(np_log_softmax(scores[n].astype(np.float64) / 0.5))
    t = np.exp(np_log_softmax(values[n].astype(np.float64)))
    expected = WEIGHTS[n] / WEIGHTS[rows].sum() * (q - t) / 0.5
    np.testing.assert_allclose(grad[i], expected, rtol=1e-4, atol=1e-7)


def test_loop_holds_its_prior_fixed():
  """LOOP's target reads the retriever's prior: held fixed, its gradient is not the full
  derivative of the loss (which the reference gives when the prior moves with the scores)."""
  scores, values = _inputs("loop", seed=2)
  grad = jax.grad(lambda s: objectives.loop_loss(s, values, WEIGHTS)[0])(scores)
  scores64, values64 = scores.astype(np.float64), values.astype(np.float64)
  full = np.zeros_like(scores64)
  for index in np.ndindex(*scores.shape):
    if WEIGHTS[index[0]] == 0:
      continue
    plus, minus = scores64.copy(), scores64.copy()
    plus[index] += 1e-6
    minus[index] -= 1e-6
    full[index] = (ref_loss("loop", plus, values64, WEIGHTS, 1.0)[0]
                   - ref_loss("loop", minus, values64, WEIGHTS, 1.0)[0]) / 2e-6
  assert np.max(np.abs(grad - full)) > 1e-3


def test_loop_with_one_possible_candidate_is_its_negative_log_probability():
  scores = np.array([[0.3, -1.0, 2.0, 0.5]], np.float32)
  values = np.array([[NEG_INF, -4.0, NEG_INF, NEG_INF]], np.float32)
  loss, _ = objectives.loop_loss(scores, values, np.ones(1, np.float32), temperature=2.0)
  np.testing.assert_allclose(loss, -np_log_softmax(scores[0] / 2.0)[1], rtol=1e-6)


@pytest.mark.parametrize("name", ["emdr2", "pdist", "loop", "adist"])
def test_the_readers_output_gets_no_gradient(name):
  scores, values = _inputs(name, seed=3)
  grad = jax.grad(lambda v: FUNCTIONS[name](scores, v, WEIGHTS, temperature=0.7)[0])(values)
  np.testing.assert_array_equal(grad, 0.0)


def test_the_marginal_trains_the_reader_too():
  """The control of the test above: without the stop-gradient, the log-likelihoods do get one."""
  scores, values = _inputs("marginal", seed=3)
  grad = np.asarray(jax.grad(lambda v: objectives.marginal_loss(scores, v, WEIGHTS)[0])(values))
  assert np.all(np.isfinite(grad)) and np.abs(grad[[0, 1, 2, 5]]).max() > 0.01
  np.testing.assert_array_equal(grad[[3, 4]], 0.0)


@pytest.mark.parametrize("marginalization", ["per_token", "per_example"])
def test_marginal_rows_are_realms_marginal_mlm_loss(marginalization):
  """One row per masked token is losses.marginal_mlm_loss per token; one per example, per
  example (the rows the pretraining model builds for EMDR^2)."""
  rng = np.random.default_rng(4)
  scores = rng.normal(size=(3, 4)).astype(np.float32)
  token = -rng.exponential(2.0, (3, 4, 5)).astype(np.float32)  # [B, K, M]
  weights = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [0, 0, 0, 0, 0]], np.float32)
  expected, aux = losses.marginal_mlm_loss(scores, token, weights,
                                           marginalization=marginalization)
  if marginalization == "per_token":
    rows = np.repeat(scores[:, None], 5, axis=1).reshape(-1, 4)
    loss, row_aux = objectives.marginal_loss(rows, np.swapaxes(token, 1, 2).reshape(-1, 4),
                                             weights.reshape(-1))
  else:
    loss, row_aux = objectives.marginal_loss(scores, np.sum(token * weights[:, None], -1),
                                             (weights.sum(-1) > 0).astype(np.float32))
  np.testing.assert_allclose(loss, expected, rtol=1e-6)
  np.testing.assert_allclose(row_aux["loss_sum"], aux["loss_sum"], rtol=1e-6)
  assert float(row_aux["weight_sum"]) == float(aux["weight_sum"])


def test_settings_are_checked():
  objectives.check_objective("pdist", 0.1)
  objectives.check_objective("marginal", 1)
  for objective, temperature, message in [
      ("pdsit", 1.0, "retriever_objective='pdsit': not one of marginal, emdr2, pdist, loop"),
      ("loop", 0.0, "objective_temperature=0.0: expected a finite number > 0"),
      ("loop", float("nan"), "objective_temperature=nan"),
      ("marginal", 0.5, "REALM's marginal has no temperature")]:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
      objectives.check_objective(objective, temperature)


# ----------------------------------------------------------------------------------------------
# Attention relevance and the maps BERT sows.
# ----------------------------------------------------------------------------------------------


def test_attention_relevance_matches_loops():
  rng = np.random.default_rng(5)
  layers, rows, heads, length = 2, 3, 2, 6
  logits = rng.normal(size=(layers, rows, heads, length, length))
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  norms = rng.uniform(0.5, 2.0, (layers, rows, heads, length))
  query_weights = np.array([[0, 1, 1, 0, 0, 0], [0, 2, 0, 0, 0, 0], [0] * 6], np.float32)
  key_mask = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]], bool)
  got = objectives.attention_relevance(list(probs.astype(np.float32)),
                                       list(norms.astype(np.float32)), query_weights, key_mask)
  for r in range(rows):
    total = 0.0
    for layer in range(layers):
      for h in range(heads):
        for i in range(length):
          for j in range(length):
            if key_mask[r, j]:
              total += query_weights[r, i] * probs[layer, r, h, i, j] * norms[layer, r, h, j]
    den = layers * heads * query_weights[r].sum()
    np.testing.assert_allclose(got[r], total / den if den else 0.0, rtol=1e-5)


def test_bert_sows_attention_weights_and_value_norms_only_when_collected():
  config = model_config.tiny_bert(vocab_size=40, num_layers=2)
  model = bert_lib.BertModel(config)
  rng = np.random.default_rng(6)
  ids = rng.integers(1, 40, (2, 7)).astype(np.int32)
  mask = np.array([[1] * 7, [1] * 5 + [0] * 2], np.int32)
  variables = nn.unbox(model.init(jax.random.PRNGKey(0), ids, None, mask))
  assert set(variables) == {"params"}  # init collects nothing either
  plain = model.apply(variables, ids, None, mask)
  collected, state = model.apply(variables, ids, None, mask, mutable=["intermediates"])
  np.testing.assert_array_equal(collected[0], plain[0])
  layer = state["intermediates"]["layer_0"]["attention"]
  probs, norms = layer["attention_probs"][0], layer["value_norms"][0]
  assert probs.shape == (2, 4, 7, 7) and norms.shape == (2, 4, 7)
  # By hand from layer 0's parameters and the embeddings' output.
  params = variables["params"]
  x = bert_lib.BertEmbeddings(config).apply({"params": params["embeddings"]}, ids,
                                            np.zeros_like(ids), deterministic=True)
  attention = params["layer_0"]["attention"]
  project = lambda name: (np.einsum("ble,ehd->blhd", x, attention[name]["kernel"])
                          + attention[name]["bias"])
  query, key, value = project("query"), project("key"), project("value")
  logits = np.einsum("bqhd,bkhd->bhqk", query, key) / np.sqrt(config.head_dim)
  logits = np.where(mask[:, None, None, :] > 0, logits, -np.inf)
  expected = np.exp(logits - logits.max(-1, keepdims=True))
  expected /= expected.sum(-1, keepdims=True)
  np.testing.assert_allclose(probs, expected, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(norms, np.linalg.norm(value, axis=-1).transpose(0, 2, 1),
                             rtol=1e-5)


# ----------------------------------------------------------------------------------------------
# The pretraining model.
# ----------------------------------------------------------------------------------------------

# One layer: the objectives read the last layer's outputs and every layer's attention alike
# (the averaging over layers is tested on two, test_attention_relevance_matches_loops).
CONFIG = model_config.RealmConfig(
    bert=model_config.tiny_bert(vocab_size=60, num_layers=1, hidden_dropout=0.0,
                                attention_dropout=0.0),
    proj_size=16)
QUERY_LEN, BLOCK_LEN = 6, 8


# The inputs of the retriever and of the knowledge-augmented encoder, in argument order.
RETRIEVER_INPUTS = ("query_ids", "query_type_ids", "query_mask", "candidate_input_ids",
                    "candidate_type_ids", "candidate_mask")
ENCODER_INPUTS = ("reader_ids", "reader_type_ids", "reader_mask", "mlm_positions")


def _pretrain_batch(seed=0):
  """Three examples, four candidates: 3, 1 and 2 real masks; example 2 skipped."""
  rng = np.random.default_rng(seed)
  shapes = {"query": (3, QUERY_LEN), "candidate": (3, 4, BLOCK_LEN),
            "reader": (3, 4, QUERY_LEN + BLOCK_LEN)}
  batch = {}
  for prefix, shape in shapes.items():  # random wordpieces, segment 0, no padding
    ids = "candidate_input_ids" if prefix == "candidate" else f"{prefix}_ids"
    batch[ids] = rng.integers(5, 60, shape).astype(np.int32)
    batch[f"{prefix}_type_ids"] = np.zeros(shape, np.int32)
    batch[f"{prefix}_mask"] = np.ones(shape, np.int32)
  batch["reader_type_ids"][..., QUERY_LEN:] = 1  # the block
  weights = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0]], np.float32)
  batch.update(mlm_positions=np.array([[1, 2, 3], [4, 0, 0], [2, 3, 0]], np.int32),
               mlm_targets=rng.integers(5, 60, weights.shape).astype(np.int32) * (weights > 0),
               mlm_weights=weights, example_mask=np.array([1, 1, 0], np.float32))
  return batch


@jax.jit
def _pretrain_outputs(params, batch):
  """Scores, per-token log-likelihoods and the encoder's attention maps, from the modules."""
  scores = RealmRetriever(CONFIG).apply({"params": params["retriever"]},
                                        *[batch[k] for k in RETRIEVER_INPUTS])[0]
  logits, state = RealmKnowledgeAugEncoder(CONFIG).apply(
      {"params": params["encoder"]}, *[batch[k] for k in ENCODER_INPUTS],
      mutable=["intermediates"])
  token = losses.mlm_token_log_probs(logits, batch["mlm_targets"])
  return scores, token, state["intermediates"]["bert"]


def _np_pretrain_relevance(bert, batch):
  """[B, K] attention of the masked positions on the block (segment 1), weighted by ||v||."""
  b_size, k_size, length = batch["reader_ids"].shape
  weights = batch["mlm_weights"] * batch["example_mask"][:, None]
  out = np.zeros((b_size, k_size))
  layers = [bert[f"layer_{i}"]["attention"] for i in range(CONFIG.bert.num_layers)]
  for b in range(b_size):
    if weights[b].sum() == 0:
      continue
    for k in range(k_size):
      row = b * k_size + k
      total = 0.0
      for layer in layers:
        probs, norms = np.asarray(layer["attention_probs"][0]), np.asarray(layer["value_norms"][0])
        for h in range(probs.shape[1]):
          for j, position in enumerate(batch["mlm_positions"][b]):
            keys = batch["reader_type_ids"][b, k] == 1
            total += weights[b, j] * np.sum(probs[row, h, position, keys] * norms[row, h, keys])
      out[b, k] = total / (len(layers) * probs.shape[1] * weights[b].sum())
  return out


def _np_pretrain_objective(name, marginalization, scores, token, bert, batch, temperature):
  """The objective's loss_sum, from the references above."""
  scores, token = np.asarray(scores, np.float64), np.asarray(token, np.float64)
  weights = batch["mlm_weights"] * batch["example_mask"][:, None]
  if name == "emdr2" and marginalization == "per_token":
    rows, values, row_weights = [], [], []
    for b in range(scores.shape[0]):
      for j in range(weights.shape[1]):
        rows.append(scores[b])
        values.append(token[b, :, j])
        row_weights.append(weights[b, j])
    return ref_loss(name, np.array(rows), np.array(values), np.array(row_weights),
                    temperature)[1]
  example_ll = np.sum(token * weights[:, None], axis=-1)  # [B, K]
  values = _np_pretrain_relevance(bert, batch) if name == "adist" else example_ll
  row_weights = (weights.sum(-1) if marginalization == "per_token"
                 else (weights.sum(-1) > 0).astype(np.float64))
  return ref_loss(name, scores, values, row_weights, temperature)[1]


def _eval_and_grads(model, keys):
  """(eval aux, {key: d aux[key] / d params}), deterministic. Eager, not compiled: compiled,
  each model of this file is a compilation of its own; eagerly, the models share their
  operations' compilations."""

  def run(params, batch):
    def stacked(p):  # one forward pass gives the values and, by vmapped VJPs, every gradient
      aux = model.eval_fn(p, batch)
      return jnp.stack([aux[k] for k in keys]), aux

    jacobian, aux = jax.jacrev(stacked, has_aux=True)(params)
    return aux, {k: jax.tree_util.tree_map(lambda g, i=i: g[i], jacobian)
                 for i, k in enumerate(keys)}

  return run


@pytest.fixture(scope="module")
def pretrain_params():
  """RealmPretrainModel(CONFIG)'s parameters (the objective adds none), initialised once."""
  return jax.jit(realm.RealmPretrainModel(CONFIG).init)(jax.random.PRNGKey(0))


def _norm(tree):
  return float(np.sqrt(sum(np.sum(np.square(x)) for x in jax.tree_util.tree_leaves(tree))))


def _assert_trees_close(actual, desired, rtol=1e-4):
  """Leaf by leaf, to rtol of the tree's largest entry (float32 sums round differently)."""
  scale = max(float(np.abs(x).max()) for x in jax.tree_util.tree_leaves(desired))
  for a, b in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(desired),
                  strict=True):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("name,marginalization", [
    ("emdr2", "per_token"), ("emdr2", "per_example"), ("pdist", "per_token"),
    ("loop", "per_example"), ("adist", "per_token")])
def test_pretraining_model_adds_the_objective_to_realms_reader_loss(name, marginalization,
                                                                    pretrain_params):
  marginal = realm.RealmPretrainModel(CONFIG, marginalization=marginalization)
  model = realm.RealmPretrainModel(CONFIG, marginalization=marginalization,
                                   retriever_objective=name, objective_temperature=0.5)
  params = pretrain_params
  batch = _pretrain_batch()
  base, realm_grads = _eval_and_grads(marginal, ("loss_sum",))(params, batch)
  aux, grads = _eval_and_grads(model, ("loss_sum", "reader_loss_sum", "objective_loss_sum"))(
      params, batch)
  # The reader's loss is REALM's marginal MLM loss, value unchanged; metrics as before.
  np.testing.assert_allclose(aux["reader_loss_sum"], base["loss_sum"], rtol=1e-6)
  for key in base:
    if key != "loss_sum":
      np.testing.assert_allclose(aux[key], base[key], rtol=1e-6, err_msg=key)
  expected = _np_pretrain_objective(name, marginalization, *_pretrain_outputs(params, batch),
                                    batch, 0.5)
  np.testing.assert_allclose(aux["objective_loss_sum"], expected, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(aux["loss_sum"], base["loss_sum"] + expected, rtol=1e-4)
  means = realm.summarize(aux)
  np.testing.assert_allclose(means["retriever_objective"], expected / float(aux["weight_sum"]),
                             rtol=1e-4)
  np.testing.assert_allclose(means["reader_loss"] + means["retriever_objective"], means["loss"],
                             rtol=1e-5)

  # The reader's loss trains the encoder only, the objective the retriever only; the encoder's
  # gradient is REALM's.
  assert _norm(grads["reader_loss_sum"]["retriever"]) == 0.0
  assert _norm(grads["objective_loss_sum"]["encoder"]) == 0.0
  assert _norm(grads["objective_loss_sum"]["retriever"]) > 0.0
  _assert_trees_close(grads["loss_sum"]["encoder"], realm_grads["loss_sum"]["encoder"])
  assert abs(_norm(grads["loss_sum"]["retriever"])
             - _norm(realm_grads["loss_sum"]["retriever"])) > 1e-6


@pytest.mark.parametrize("marginalization", ["per_token", "per_example"])
def test_emdr2_at_temperature_1_trains_exactly_as_realms_marginal(marginalization,
                                                                  pretrain_params):
  """Worked by hand: with q = softmax(s) and p_k = p(y | z_k, x), d/ds_k of
  -log sum_j q_j sg(p_j) is q_k - q_k p_k / sum_j q_j p_j, the marginal's own score gradient;
  and the reader's loss under sg(s) has the marginal's reader gradient (the prior is a
  constant to the reader). So with a reader trained on the marginal, EMDR^2 at T = 1 is
  REALM's gradient, both towers; only T != 1 (or Atlas's separate reader loss) tells them
  apart."""
  marginal = realm.RealmPretrainModel(CONFIG, marginalization=marginalization)
  model = realm.RealmPretrainModel(CONFIG, marginalization=marginalization,
                                   retriever_objective="emdr2", objective_temperature=1.0)
  params = pretrain_params
  batch = _pretrain_batch()
  _, realm_grads = _eval_and_grads(marginal, ("loss_sum",))(params, batch)
  _, grads = _eval_and_grads(model, ("loss_sum",))(params, batch)
  assert _norm(realm_grads["loss_sum"]["retriever"]) > 0.0
  _assert_trees_close(grads["loss_sum"], realm_grads["loss_sum"])


def test_pretraining_objective_is_exact_under_microbatches(pretrain_params):
  """The objective's denominator is the reader's (masked tokens), so cutting the batch into
  microbatches of different mask counts leaves the gradient unchanged."""
  from realm_jax.training import trainer  # pylint: disable=import-outside-toplevel
  model = realm.RealmPretrainModel(CONFIG, retriever_objective="pdist")
  params = pretrain_params
  batch = _pretrain_batch()
  batch["example_mask"][:] = 1.0
  whole = jax.jit(functools.partial(trainer.compute_gradients, model, microbatches=1))
  split = jax.jit(functools.partial(trainer.compute_gradients, model, microbatches=3))
  aux, grads = whole(params, batch, jax.random.PRNGKey(1))
  split_aux, split_grads = split(params, batch, jax.random.PRNGKey(1))
  np.testing.assert_allclose(split_aux["objective_loss_sum"], aux["objective_loss_sum"],
                             rtol=1e-5)
  _assert_trees_close(split_grads, grads)


# ----------------------------------------------------------------------------------------------
# The fine-tuning model.
# ----------------------------------------------------------------------------------------------

QA_CONFIG = model_config.RealmConfig(
    bert=model_config.tiny_bert(vocab_size=60, num_layers=1, hidden_dropout=0.0,
                                attention_dropout=0.0),
    proj_size=16, span_hidden_size=16)
READER_LEN, QUESTION_TOKENS, BEAM, READER_BEAM = 16, 4, 4, 2


def _qa_batch(seed=0):
  """Four questions: 0 has a gold span in reader block 0 only, 1 in both blocks (two spans in
  block 1), 2 none (beyond the reader beam only), 3 is padding."""
  rng = np.random.default_rng(seed)
  questions = 4
  types = np.array([0] * QUESTION_TOKENS + [1] * (READER_LEN - QUESTION_TOKENS), np.int32)
  block = np.array([0] * QUESTION_TOKENS + [1] * (READER_LEN - QUESTION_TOKENS - 1) + [0], bool)
  gold_starts = np.full((questions, READER_BEAM, 2), -1, np.int32)
  gold_ends = np.full((questions, READER_BEAM, 2), -1, np.int32)
  gold_starts[0, 0, 0], gold_ends[0, 0, 0] = 5, 6
  gold_starts[1, 0, 0], gold_ends[1, 0, 0] = 7, 7
  gold_starts[1, 1], gold_ends[1, 1] = [4, 9], [5, 11]
  gold_starts[3, 0, 0], gold_ends[3, 0, 0] = 4, 4
  return {
      "question_ids": rng.integers(5, 60, (questions, 6)).astype(np.int32),
      "question_type_ids": np.zeros((questions, 6), np.int32),
      "question_mask": np.ones((questions, 6), np.int32),
      "retrieved_block_emb": rng.normal(size=(questions, BEAM, 16)).astype(np.float32),
      "retriever_correct": np.array([[1, 0, 0, 1], [1, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0]],
                                    bool),
      "reader_ids": rng.integers(5, 60, (questions, READER_BEAM, READER_LEN)).astype(np.int32),
      "reader_type_ids": np.broadcast_to(types, (questions, READER_BEAM, READER_LEN)).copy(),
      "reader_mask": np.ones((questions, READER_BEAM, READER_LEN), np.int32),
      "reader_block_mask": np.broadcast_to(block, (questions, READER_BEAM, READER_LEN)).copy(),
      "reader_gold_starts": gold_starts,
      "reader_gold_ends": gold_ends,
      "example_mask": np.array([True, True, True, False]),
  }


def _np_block_log_likelihoods(logits, batch):
  """[Q, reader_beam] log of the gold spans' share of each block's spans; -inf without one."""
  starts, ends = enumerate_spans(READER_LEN, QA_CONFIG.max_span_width)
  logits = np.asarray(logits, np.float64)
  out = np.full(logits.shape[:2], NEG_INF)
  for q in range(logits.shape[0]):
    for r in range(logits.shape[1]):
      gold = np.zeros(len(starts), bool)
      for s, e in zip(batch["reader_gold_starts"][q, r], batch["reader_gold_ends"][q, r]):
        gold |= (starts == s) & (ends == e)
      if gold.any():
        log_probs = np_log_softmax(logits[q, r])
        out[q, r] = np.log(np.sum(np.exp(log_probs[gold])))
  return out


def _np_qa_relevance(params, batch):
  """[Q, reader_beam] the question tokens' attention on the block, weighted by ||v||."""
  scores = np.zeros(batch["reader_ids"].shape[:2], np.float32)
  _, state = RealmReader(QA_CONFIG).apply(
      {"params": params["reader"]}, batch["reader_ids"], batch["reader_type_ids"],
      batch["reader_mask"], batch["reader_block_mask"], scores, mutable=["intermediates"])
  layer = state["intermediates"]["bert"]["layer_0"]["attention"]
  probs = np.asarray(layer["attention_probs"][0], np.float64)
  norms = np.asarray(layer["value_norms"][0], np.float64)
  questions, beam, _ = batch["reader_ids"].shape
  out = np.zeros((questions, beam))
  for q in range(questions):
    for r in range(beam):
      row = q * beam + r
      queries = batch["reader_type_ids"][q, r] == 0
      keys = batch["reader_type_ids"][q, r] == 1
      total = sum(np.sum(probs[row, h][np.ix_(queries, keys)] * norms[row, h, keys])
                  for h in range(probs.shape[1]))
      out[q, r] = total / (probs.shape[1] * queries.sum())
  return out


def _qa_probe(model):
  """(eval aux, d loss_sum / d (params, retrieved_block_emb), forward's scores and logits);
  eager, as `_eval_and_grads`."""

  def probe(params, batch):
    def loss_sum(p, emb):
      return model.eval_fn(p, dict(batch, retrieved_block_emb=emb))["loss_sum"]

    grads = jax.grad(loss_sum, argnums=(0, 1))(params, batch["retrieved_block_emb"])
    scores, logits, _, _ = model.forward(params, batch)
    return model.eval_fn(params, batch), grads, scores, logits

  return probe


@pytest.fixture(scope="module")
def qa_params():
  return jax.jit(open_qa_model.OpenQAModel(QA_CONFIG, reader_beam=READER_BEAM).init)(
      jax.random.PRNGKey(0))


@pytest.mark.parametrize("name", ["emdr2", "pdist", "loop", "adist"])
def test_fine_tuning_model_adds_the_objective_over_the_reader_beam(name, qa_params):
  marginal = open_qa_model.OpenQAModel(QA_CONFIG, reader_beam=READER_BEAM)
  model = open_qa_model.OpenQAModel(QA_CONFIG, reader_beam=READER_BEAM, retriever_objective=name,
                                    objective_temperature=0.5)
  batch = _qa_batch()
  base, (base_params_grad, base_emb_grad), scores, logits = _qa_probe(marginal)(qa_params, batch)
  aux, (params_grad, emb_grad), _, _ = _qa_probe(model)(qa_params, batch)
  for key in base:  # ORQA's losses and metrics keep their values
    if key != "loss_sum":
      np.testing.assert_allclose(aux[key], base[key], rtol=1e-6, err_msg=key)

  scores = np.asarray(scores, np.float64)[:, :READER_BEAM]
  block_ll = _np_block_log_likelihoods(logits, batch)
  weights = batch["example_mask"].astype(np.float64)
  if name == "adist":  # for the questions with a gold span in the reader beam
    values = _np_qa_relevance(qa_params, batch)
    weights = weights * np.any(block_ll > NEG_INF, axis=-1)
  else:
    values = block_ll
  expected = ref_loss(name, scores, values, weights, 0.5)[1]
  assert expected > 0
  np.testing.assert_allclose(aux["objective_loss_sum"], expected, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(aux["loss_sum"], base["loss_sum"] + expected, rtol=1e-5)
  assert "retriever_objective" in open_qa_model.summarize(aux)

  # Gradients in the retrieved blocks' index embeddings (through the scores): beyond the
  # reader beam only ORQA's retriever loss (kept), inside it the objective replaces what the
  # reader's joint loss gave; the reader's gradient is ORQA's.
  np.testing.assert_allclose(emb_grad[:, READER_BEAM:], base_emb_grad[:, READER_BEAM:],
                             rtol=1e-5, atol=1e-8)
  assert np.abs(emb_grad[:, READER_BEAM:]).max() > 0
  assert np.abs(emb_grad[:2, :READER_BEAM] - base_emb_grad[:2, :READER_BEAM]).max() > 1e-5
  _assert_trees_close(params_grad["reader"], base_params_grad["reader"])
