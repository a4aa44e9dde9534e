"""Atlas's retriever objectives (Izacard et al. 2022, section 2.2) beside REALM's marginal
likelihood (REALM_SPEC 16, 28): a gin choice (`PretrainJob.retriever_objective`,
`FinetuneJob.retriever_objective`).

Atlas trains the retriever with a loss of its own (emdr2, pdist, loop, adist) built from the
reader's output held fixed, `q = softmax(s / T)` against the reader's target; the reader then
keeps its own loss under the fixed scores `sg(s)`. Each loss takes rows `scores [N, K]`, targets
[N, K] and `weights [N]` and returns `(loss, aux)` as `losses.py` (loss_sum, weight_sum,
row_losses); weight-0 rows count nowhere, a row with every candidate impossible (-inf) has loss
0 (REALM_SPEC 28). Scores are REALM's plain dot product (REALM_SPEC 2). The registry (`Objective`,
`register`) declares what each reader computes for each objective. Formulas and departures from
Atlas: docs/design/models_and_jobs.md.
"""

from __future__ import annotations

import enum
import math
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp

from realm_jax.models import losses

Array = jax.Array

_NEG = float(jnp.finfo(jnp.float32).min)  # a finite -inf: its logsumexp stays finite


def _prepare(scores: Array, values: Array, weights: Array):
  """float32 inputs with rows of weight 0 and impossible (-inf) candidates made 0.

  Returns:
    (scores [N, K], values [N, K], weights [N], possible [N, K] bool, defined [N] bool): a row is
    defined when it has weight and at least one possible candidate. NaN counts as possible, so
    it reaches the loss (the trainer stops on it) instead of being hidden.
  """
  scores = scores.astype(jnp.float32)
  values = values.astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  live = weights > 0  # [N]
  possible = (values != -jnp.inf) & live[:, None]  # [N, K]
  values = jnp.where(possible, values, 0.0)
  scores = jnp.where(live[:, None], scores, 0.0)
  return scores, values, weights, possible, jnp.any(possible, axis=-1)


def _weighted(row_losses: Array, weights: Array, defined: Array) -> tuple[Array, dict]:
  """`(loss, aux)` from per-row losses: undefined rows give 0 and keep their weight."""
  row_losses = jnp.where(defined, row_losses, 0.0)
  loss_sum = jnp.sum(row_losses * weights)
  weight_sum = jnp.sum(weights)
  return losses._safe_divide(loss_sum, weight_sum), {  # pylint: disable=protected-access
      "loss_sum": loss_sum, "weight_sum": weight_sum, "row_losses": row_losses}


def marginal_loss(scores: Array, log_likelihoods: Array, weights: Array, *,
                  temperature: float = 1.0) -> tuple[Array, dict]:
  """REALM's marginal likelihood over the candidates of each row (REALM_SPEC 16, 28).

  `loss_row = -log sum_k softmax(s / T)_k p(y | z_k, x)`, differentiable in both the scores and
  the log-likelihoods: the reader and the retriever trained by one loss.

  Args:
    scores: [N, K] retrieval scores f(x, z_k).
    log_likelihoods: [N, K] log p(y | z_k, x); -inf where y is impossible under z_k.
    weights: [N] non-negative row weights, 0 for padding.
    temperature: T (1: REALM).

  Returns:
    (loss, aux): aux["loss_sum"], aux["weight_sum"], aux["row_losses"] [N] (module docstring).
  """
  scores, values, weights, possible, defined = _prepare(scores, log_likelihoods, weights)
  log_q = jax.nn.log_softmax(scores / temperature, axis=-1)  # [N, K]
  joint = jnp.where(possible, log_q + values, _NEG)  # [N, K]
  return _weighted(-jax.nn.logsumexp(joint, axis=-1), weights, defined)


def emdr2_loss(scores: Array, log_likelihoods: Array, weights: Array, *,
               temperature: float = 1.0) -> tuple[Array, dict]:
  """EMDR^2 (Sachan et al. 2021; Atlas's "EMDR^2"): REALM's marginal with the reader held fixed.

  `loss_row = -log sum_k q_k sg(p(y | z_k, x))`, `q = softmax(s / T)`: the retriever moves its
  probability towards the candidates under which the reader predicts y. In pretraining at T = 1
  it trains exactly as REALM's marginal does (design notes). Args and returns as
  `marginal_loss`.
  """
  return marginal_loss(scores, jax.lax.stop_gradient(log_likelihoods), weights,
                       temperature=temperature)


def _distillation(scores: Array, target_logits: Array, support: Array, weights: Array,
                  defined: Array, temperature: float) -> tuple[Array, dict]:
  """`KL(softmax(target_logits over support) || softmax(scores / T))` per row.

  Args:
    scores, weights: prepared (`_prepare`).
    target_logits: [N, K] finite logits of the target (held fixed by the callers).
    support: [N, K] bool, the candidates the target may put mass on.
    defined: [N] bool, rows that have a target.
    temperature: T.
  """
  log_target = jax.nn.log_softmax(jnp.where(support, target_logits, _NEG), axis=-1)  # [N, K]
  target = jnp.exp(log_target)
  log_q = jax.nn.log_softmax(scores / temperature, axis=-1)  # [N, K]
  # 0 log 0 = 0: candidates outside the support (exp underflows to exactly 0) add nothing.
  terms = jnp.where(target > 0, target * (log_target - log_q), 0.0)
  return _weighted(jnp.sum(terms, axis=-1), weights, defined)


def pdist_loss(scores: Array, log_likelihoods: Array, weights: Array, *,
               temperature: float = 1.0) -> tuple[Array, dict]:
  """Perplexity distillation (Atlas's "PDist").

  `loss_row = KL(p || q)`, `p_k = softmax_k(sg(log p(y | z_k, x)))` (an impossible candidate
  gets 0), `q = softmax(s / T)`. The log-likelihoods are summed over the target's tokens, not
  length-normalised as in Atlas's code.

  Args:
    scores: [N, K] retrieval scores.
    log_likelihoods: [N, K] log p(y | z_k, x); -inf where y is impossible under z_k.
    weights: [N] row weights, 0 for padding.
    temperature: T of the retriever's softmax.

  Returns:
    (loss, aux) as `marginal_loss`.
  """
  scores, values, weights, possible, defined = _prepare(
      scores, jax.lax.stop_gradient(log_likelihoods), weights)
  return _distillation(scores, values, possible, weights, defined, temperature)


def loop_loss(scores: Array, log_likelihoods: Array, weights: Array, *,
              temperature: float = 1.0) -> tuple[Array, dict]:
  """Leave-one-out perplexity distillation (Atlas's "LOOP") for a reader with one row per
  candidate.

  `loss_row = KL(p || q)` with `p_k ∝ exp(-log p(y | Z \\ z_k, x))`: the more the prediction of y
  worsens without candidate k, the more mass. The prediction without k is REALM's marginal over
  the other candidates, their fixed prior renormalised (no extra reader pass; design notes).
  Args and returns as `pdist_loss`.
  """
  scores, values, weights, possible, defined = _prepare(
      scores, jax.lax.stop_gradient(log_likelihoods), weights)
  num_candidates = scores.shape[-1]
  log_prior = jax.nn.log_softmax(jax.lax.stop_gradient(scores), axis=-1)  # [N, K]
  joint = jnp.where(possible, log_prior + values, _NEG)  # [N, K]
  # [K, K]: others[k, j] = j is still there when k is left out.
  others = ~jnp.eye(num_candidates, dtype=bool)
  # [N, K(left out), K]
  kept = others[None] & possible[:, None, :]
  log_num = jax.nn.logsumexp(jnp.where(kept, joint[:, None, :], _NEG), axis=-1)  # [N, K]
  log_den = jax.nn.logsumexp(jnp.where(others[None], log_prior[:, None, :], _NEG), axis=-1)
  remaining = jnp.any(kept, axis=-1)  # [N, K]: some possible candidate is left
  log_left_out = jnp.where(remaining, log_num, 0.0) - jnp.where(remaining, log_den, 0.0)
  several = jnp.sum(possible, axis=-1) >= 2  # [N]
  # Several possible: every candidate's left-out prediction is finite. One: it alone matters.
  target_logits = jnp.where(several[:, None], -log_left_out, 0.0)
  support = several[:, None] | possible
  return _distillation(scores, target_logits, support, weights, defined, temperature)


def left_out_loop_loss(scores: Array, left_out_log_likelihoods: Array, weights: Array, *,
                       temperature: float = 1.0) -> tuple[Array, dict]:
  """LOOP for a reader that reads the candidates jointly (Atlas's FiD): the leave-one-out
  predictions come from the reader itself, not from a marginal (`loop_loss`).

  `loss_row = KL(p || q)`, `p_k = softmax_k(-sg(log p(y | Z \\ z_k, x)))`, `q = softmax(s / T)`.

  Args:
    scores: [N, K] retrieval scores.
    left_out_log_likelihoods: [N, K] finite log p(y | Z \\ z_k, x), the reader reading every
      candidate but k.
    weights: [N] row weights, 0 for padding.
    temperature: T of the retriever's softmax.

  Returns:
    (loss, aux) as `marginal_loss`.
  """
  return pdist_loss(scores, -jax.lax.stop_gradient(left_out_log_likelihoods), weights,
                    temperature=temperature)


def adist_loss(scores: Array, attention_scores: Array, weights: Array, *,
               temperature: float = 1.0) -> tuple[Array, dict]:
  """Attention distillation (Atlas's "ADist", from Izacard & Grave 2021).

  `loss_row = KL(p || q)`, `p = softmax_k(sg(a_k))`, `a_k` the reader's attention relevance of
  candidate k (`attention_relevance`), `q = softmax(s / T)`. With one row per candidate, `a_k`
  compares candidates only through the softmax over k (departures from Atlas: design notes).
  Args and returns as `pdist_loss`, with `attention_scores` [N, K] in place of the
  log-likelihoods.
  """
  return pdist_loss(scores, attention_scores, weights, temperature=temperature)


# ------------------------------------------------------------------------------ the registry

# The readers an objective may serve (`FinetuneJob.reader`'s names). "extractive": REALM's readers,
# one row per candidate (fine-tuning's span reader, and pretraining's masked-LM encoder, which
# serves the objectives alike); "fid": Atlas's Fusion-in-Decoder reader (`models.fid_qa`).
EXTRACTIVE = "extractive"
FID = "fid"


class Target(enum.Enum):
  """What a reader computes for an objective, one value per block [N, K] held fixed: the
  `values` of the objective's loss."""

  LIKELIHOODS = "log p(y | z_k, x): the reader reading block k (the FiD decoder: block k alone)"
  LEFT_OUT_LIKELIHOODS = "log p(y | Z \\ z_k, x): the FiD decoder reading every block but k"
  ATTENTION = "a_k: the reader's attention relevance of block k"
  ANSWER_BLOCKS = "0 for a block that holds an answer string, -inf for the others"

  @property
  def needs_reader(self) -> bool:
    """False when the batch alone knows the target: the objective may then score blocks the
    reader does not read (FiD's `objective_beam`)."""
    return self is not Target.ANSWER_BLOCKS

  @property
  def lower_is_preferred(self) -> bool:
    """The block the target prefers has the lowest value (LOOP: the one whose absence hurts
    the prediction most)."""
    return self is Target.LEFT_OUT_LIKELIHOODS


# What each reader can compute (None: nothing), in the order its objectives are listed.
READER_TARGETS = {
    EXTRACTIVE: (Target.LIKELIHOODS, Target.ATTENTION),
    FID: (None, Target.ATTENTION, Target.LIKELIHOODS, Target.LEFT_OUT_LIKELIHOODS,
          Target.ANSWER_BLOCKS)}
_READER_SUFFIX = {EXTRACTIVE: "", FID: " with the FiD reader"}


class Objective:
  """A retriever objective: one subclass per `retriever_objective` value, added by `register`.
  The models and jobs read its declarations (class attributes), never its name.

  Attributes:
    name: the gin setting's value.
    targets: {reader: Target or None}: the readers it serves and what each computes for it
      (None: nothing); another reader refuses it.
    joint: its loss is the reader's own and trains reader and retriever at once (REALM's
      marginal): the reader reads the live scores and the model adds nothing.
    trains_retriever: False: the retriever only retrieves (no loss, no targets).
    no_temperature: why `objective_temperature` must stay 1; None: the objective takes it.
    per_token_targets: under pretraining's `marginalization="per_token"`, one row per masked
      token rather than per example (EMDR^2: Atlas's code marginalises per token).
    refusals: {reader: why} said, for a reader it does not serve, instead of the list of names.
    loss_fn: the loss over rows when every reader's is the same (`staticmethod(pdist_loss)`);
      a subclass whose loss depends on the reader overrides `loss` instead.
  """

  name: str = ""
  targets: Mapping[str, Target | None] = {}
  joint: bool = False
  trains_retriever: bool = True
  no_temperature: str | None = None
  per_token_targets: bool = False
  refusals: Mapping[str, str] = {}
  loss_fn: Callable[..., tuple[Array, dict]] | None = None

  @property
  def takes_temperature(self) -> bool:
    return self.no_temperature is None

  def serves(self, reader: str) -> bool:
    return reader in self.targets

  def target(self, reader: str) -> Target | None:
    return self.targets[reader]

  def loss(self, reader: str, scores: Array, values: Array, weights: Array, *,
           temperature: float) -> tuple[Array, dict]:
    """`(loss, aux)` over rows (module docstring): `values` [N, K] the reader's `target`. An
    objective that trains no retriever ('none') has no loss."""
    if self.loss_fn is None:
      raise NotImplementedError(f"retriever_objective={self.name!r} has no loss")
    return self.loss_fn(scores, values, weights, temperature=temperature)


_REGISTRY: dict[str, Objective] = {}


def register(cls: type[Objective]) -> type[Objective]:
  """Registers an Objective subclass under its `name` (a decorator too); a ValueError for a
  name taken or a target its reader cannot compute."""
  if not cls.name or cls.name in _REGISTRY:
    raise ValueError(f"retriever objective {cls.name!r}: "
                     f"{'already registered' if cls.name else 'no name'}")
  for reader, target in cls.targets.items():
    if target not in READER_TARGETS.get(reader, ()):
      raise ValueError(f"retriever objective {cls.name!r}: reader {reader!r} cannot compute "
                       f"{target}")
  _REGISTRY[cls.name] = cls()
  return cls


def unregister(name: str) -> None:
  """Removes a registered objective (a test's, after the test)."""
  del _REGISTRY[name]


def get(name: str) -> Objective | None:
  """The objective registered as `name`; None for another name."""
  return _REGISTRY.get(name) if isinstance(name, str) else None


def names(reader: str) -> tuple[str, ...]:
  """The objectives `reader` serves, by what it computes (`READER_TARGETS`), then as
  registered."""
  order = READER_TARGETS[reader]
  served = [o for o in _REGISTRY.values() if o.serves(reader)]
  return tuple(o.name for o in sorted(served, key=lambda o: order.index(o.target(reader))))


def check_objective(name: str, temperature: float, reader: str = EXTRACTIVE) -> Objective:
  """The objective `name` for `reader`; a ValueError (one line, naming the setting) unless
  `reader` serves it and `temperature` is a finite number > 0 it takes, or 1 where it takes
  none (REALM's score has no temperature, REALM_SPEC 2)."""
  objective = get(name)
  if objective is None or not objective.serves(reader):
    if objective is not None and reader in objective.refusals:
      raise ValueError(f"retriever_objective={name!r} {objective.refusals[reader]}")
    raise ValueError(f"retriever_objective={name!r}: not one of {', '.join(names(reader))}"
                     f"{_READER_SUFFIX[reader]}")
  if objective.takes_temperature:
    if (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature) or temperature <= 0):
      raise ValueError(f"objective_temperature={temperature!r}: expected a finite number > 0")
  elif isinstance(temperature, bool) or temperature != 1:
    takers = [n for n in names(reader) if _REGISTRY[n].takes_temperature]
    raise ValueError(f"objective_temperature={temperature!r} applies to {', '.join(takers)}; "
                     f"{objective.no_temperature}: leave it at 1.0")
  return objective


@register
class Marginal(Objective):
  """REALM's marginal likelihood (`marginal_loss`), the reader's own loss."""
  name = "marginal"
  targets = {EXTRACTIVE: Target.LIKELIHOODS}
  joint = True
  no_temperature = "REALM's marginal has no temperature (REALM_SPEC 2)"
  refusals = {FID: "has no counterpart with the FiD reader (its answer loss reads the K blocks "
                   "together, no marginal over blocks): use 'adist', 'emdr2', 'pdist' or "
                   "'loop' to train the question tower, or 'none'"}
  loss_fn = staticmethod(marginal_loss)


@register
class NoObjective(Objective):
  """The FiD reader's default: its question tower only retrieves."""
  name = "none"
  targets = {FID: None}
  trains_retriever = False
  no_temperature = "retriever_objective='none' trains no retriever"


@register
class Emdr2(Objective):
  """EMDR^2 (`emdr2_loss`)."""
  name = "emdr2"
  targets = {EXTRACTIVE: Target.LIKELIHOODS, FID: Target.LIKELIHOODS}
  per_token_targets = True
  loss_fn = staticmethod(emdr2_loss)


@register
class Pdist(Objective):
  """Perplexity distillation (`pdist_loss`)."""
  name = "pdist"
  targets = {EXTRACTIVE: Target.LIKELIHOODS, FID: Target.LIKELIHOODS}
  loss_fn = staticmethod(pdist_loss)


@register
class Loop(Objective):
  """Leave-one-out perplexity distillation: REALM's readers leave block k out of their marginal
  (`loop_loss`), the FiD decoder reads every block but k (`left_out_loop_loss`)."""
  name = "loop"
  targets = {EXTRACTIVE: Target.LIKELIHOODS, FID: Target.LEFT_OUT_LIKELIHOODS}

  def loss(self, reader, scores, values, weights, *, temperature):
    left_out = self.target(reader) is Target.LEFT_OUT_LIKELIHOODS
    return (left_out_loop_loss if left_out else loop_loss)(scores, values, weights,
                                                           temperature=temperature)


@register
class Adist(Objective):
  """Attention distillation (`adist_loss`)."""
  name = "adist"
  targets = {EXTRACTIVE: Target.ATTENTION, FID: Target.ATTENTION}
  loss_fn = staticmethod(adist_loss)


@register
class AnswerBlocks(Objective):
  """A control, not Atlas's (`models.fid_qa`): PDist's distillation of the uniform
  distribution over the blocks that hold an answer string, a target the batch knows."""
  name = "answer_blocks"
  targets = {FID: Target.ANSWER_BLOCKS}
  loss_fn = staticmethod(pdist_loss)


def attention_relevance(attention_probs: Sequence[Array], value_norms: Sequence[Array],
                        query_weights: Array, key_mask: Array) -> Array:
  """Atlas's attention score of each reader row: attention weights (before dropout) times value
  norms, averaged over layers, heads and the query positions, summed over the block's key
  positions (the formula: docs/design/models_and_jobs.md). 0 for a row without query weight.

  Args:
    attention_probs: per layer, [rows, heads, length, length] (query, key).
    value_norms: per layer, [rows, heads, length] (key).
    query_weights: [rows, length] non-negative weights of the attending positions.
    key_mask: [rows, length] the attended positions that count.

  Returns:
    [rows] float32.
  """
  query_weights = query_weights.astype(jnp.float32)
  key_mask = key_mask.astype(jnp.float32)
  total = 0.0
  for probs, norms in zip(attention_probs, value_norms, strict=True):
    # Keys first: [rows, heads, length] weighted value norms of the counted keys.
    keys = norms.astype(jnp.float32) * key_mask[:, None, :]
    total = total + jnp.einsum("rhqk,rhk,rq->r", probs.astype(jnp.float32), keys, query_weights)
  heads = attention_probs[0].shape[1]
  return losses._safe_divide(  # pylint: disable=protected-access
      total, len(attention_probs) * heads * jnp.sum(query_weights, axis=-1))
