"""RetroMAE batches (Xiao et al. 2022): a block's two masked copies, built on the host.

RetroMAE pre-trains the document tower as a masked auto-encoder's encoder: the encoder reads a
moderately masked block (`encoder_mask_rate`, BERT's 80/10/10 replacement, its own MLM loss)
and gives one sentence embedding; a one-layer decoder reconstructs every position but `[CLS]`
from that embedding (column 0) and the unmasked wordpieces, each query row seeing its own
uniform sample of the others (`decoder_mask_rate`, `decoder_attention_mask` [P, L]). All the
sampling is here (NumPy, seeded), so `realm_jax.models.retromae` stays pure JAX.
`RetroMaeBatches` builds these from block batches, resumably. Where this follows the paper or
the authors' code: docs/design/data_index_batches.md.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from realm_jax.data.vocab import CLS_ID, MASK_ID, SEP_ID

ENCODER_MASK_RATE = 0.3
DECODER_MASK_RATE = 0.5
# BERT's replacement of a masked encoder wordpiece: [MASK], a random id, or kept.
REPLACE_WITH_MASK = 0.8
REPLACE_WITH_RANDOM = 0.1
# The block features a RetroMAE batch is built from (an `ict_<corpus>` task has them).
BLOCK_KEYS = ("block_ids", "block_type_ids", "block_mask")


def _rounded(rate: float, counts: np.ndarray) -> np.ndarray:
  """round(rate * counts), halves up (not NumPy's to-even), as int64."""
  return np.floor(rate * np.asarray(counts) + 0.5).astype(np.int64)


def encoder_slots(block_len: int, encoder_mask_rate: float) -> int:
  """Encoder MLM slots per block: enough for the masks of a block of `block_len` maskable
  wordpieces (M, at least 1)."""
  return max(1, int(_rounded(encoder_mask_rate, block_len)))


def decoder_slots(block_len: int, decoder_predictions: Optional[int] = None) -> int:
  """Decoder query rows per block (P): every position but [CLS] (L - 1), or at most
  `decoder_predictions`."""
  every = max(1, int(block_len) - 1)
  return every if decoder_predictions is None else min(every, int(decoder_predictions))


def retromae_batch_spec(block_len: int, *, encoder_mask_rate: float = ENCODER_MASK_RATE,
                        decoder_predictions: Optional[int] = None) -> dict[str, Any]:
  """The per-example shapes and dtypes of a `build_retromae_batch` batch, declared once.

  Returns:
    {key: jax.ShapeDtypeStruct of one example}: block_ids, block_type_ids, block_mask,
    encoder_ids [L] int32; encoder_positions, encoder_targets [M] int32, encoder_weights [M]
    float32; decoder_positions, decoder_targets [P] int32, decoder_weights [P] float32;
    decoder_attention_mask [P, L] bool.
  """
  import jax  # pylint: disable=g-import-not-at-top
  length = int(block_len)
  m = encoder_slots(length, encoder_mask_rate)
  p = decoder_slots(length, decoder_predictions)
  shapes = {"block_ids": [length], "block_type_ids": [length], "block_mask": [length],
            "encoder_ids": [length], "encoder_positions": [m], "encoder_targets": [m],
            "encoder_weights": [m], "decoder_positions": [p], "decoder_targets": [p],
            "decoder_weights": [p], "decoder_attention_mask": [p, length]}
  dtypes = {"encoder_weights": np.float32, "decoder_weights": np.float32,
            "decoder_attention_mask": np.bool_}
  return {key: jax.ShapeDtypeStruct(tuple(shape), dtypes.get(key, np.int32))
          for key, shape in shapes.items()}


def maskable_positions(block_ids: np.ndarray, block_mask: np.ndarray) -> np.ndarray:
  """[B, L] bool: the wordpieces either masking may hide (real, not [CLS] or [SEP])."""
  return (block_mask != 0) & (block_ids != CLS_ID) & (block_ids != SEP_ID)


def _ranks(keys: np.ndarray) -> np.ndarray:
  """Each entry's rank along the last axis (0 = smallest): one argsort and a scatter."""
  order = np.argsort(keys, axis=-1, kind="stable")
  ranks = np.empty_like(order)
  np.put_along_axis(ranks, order, np.broadcast_to(np.arange(keys.shape[-1]), keys.shape),
                    axis=-1)
  return ranks


def _first_k(candidates: np.ndarray, counts: np.ndarray, rng: np.random.Generator
             ) -> np.ndarray:
  """A uniform random subset of `counts[...]` of each row's True `candidates` (bool, same
  shape): random keys, the `counts` smallest among the candidates."""
  keys = np.where(candidates, rng.random(candidates.shape), np.inf)
  return candidates & (_ranks(keys) < np.asarray(counts)[..., None])


def mask_encoder_input(block_ids: np.ndarray, block_mask: np.ndarray, *,
                       rng: np.random.Generator, encoder_mask_rate: float, slots: int,
                       vocab_size: int) -> dict[str, np.ndarray]:
  """The encoder's masked copy of a batch of blocks (block_ids, block_mask int [B, L]) and its MLM
  targets: `encoder_mask_rate` of each block's maskable wordpieces (at least one) in M = `slots`
  target slots; random replacements drawn from [0, vocab_size).

  Returns:
    encoder_ids int32 [B, L]; encoder_positions, encoder_targets int32 [B, M] (sorted, 0 in
    unused slots); encoder_weights float32 [B, M].
  """
  ids = np.asarray(block_ids)
  maskable = maskable_positions(ids, np.asarray(block_mask))
  available = maskable.sum(axis=1)
  counts = np.where(available > 0, np.maximum(_rounded(encoder_mask_rate, available), 1), 0)
  if counts.max(initial=0) > slots:
    raise ValueError(f"{counts.max()} encoder masks do not fit {slots} slots")
  chosen = _first_k(maskable, counts, rng)  # [B, L]
  # [B, L] BERT's replacement draw for every position; only the chosen ones use it.
  draw = rng.random(ids.shape)
  random_ids = rng.integers(0, vocab_size, size=ids.shape)
  replaced = np.where(draw < REPLACE_WITH_MASK, MASK_ID,
                      np.where(draw < REPLACE_WITH_MASK + REPLACE_WITH_RANDOM, random_ids, ids))
  encoder_ids = np.where(chosen, replaced, ids).astype(np.int32)
  positions, weights = _packed_positions(chosen, slots)
  return {"encoder_ids": encoder_ids, "encoder_positions": positions,
          "encoder_targets": np.take_along_axis(ids, positions, axis=1).astype(np.int32),
          "encoder_weights": weights}


def _packed_positions(chosen: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
  """The True columns of each row of `chosen` [B, L], ascending, packed into `slots`
  (positions int32 [B, slots], 0 past a row's count; weights float32 [B, slots])."""
  length = chosen.shape[1]
  # Chosen columns sort first, in order; the rest after them.
  order = np.argsort(np.where(chosen, 0, 1) * length + np.arange(length), axis=1)[:, :slots]
  weights = np.take_along_axis(chosen, order, axis=1)
  return np.where(weights, order, 0).astype(np.int32), weights.astype(np.float32)


def decoder_inputs(block_ids: np.ndarray, block_mask: np.ndarray, *,
                   rng: np.random.Generator, decoder_mask_rate: float, slots: int
                   ) -> dict[str, np.ndarray]:
  """The decoder's predicted positions, targets and per-row attention mask (module docstring).

  A block with more predictable positions than P = `slots` gets a uniform sample of P of them;
  each row hides `decoder_mask_rate` of its other maskable positions.

  Returns:
    decoder_positions, decoder_targets int32 [B, P]; decoder_weights float32 [B, P];
    decoder_attention_mask bool [B, P, L] (column 0: the sentence embedding).
  """
  ids = np.asarray(block_ids)
  real = np.asarray(block_mask) != 0
  batch, length = ids.shape
  predictable = real.copy()
  predictable[:, 0] = False  # the [CLS] slot holds the sentence embedding
  predicted = _first_k(predictable, np.minimum(predictable.sum(axis=1), slots), rng)
  positions, weights = _packed_positions(predicted, slots)  # [B, P]
  used = weights > 0
  columns = np.arange(length)
  is_self = columns[None, None, :] == positions[:, :, None]  # [B, P, L]
  maskable = maskable_positions(ids, real)[:, None, :]
  # [B, P, L] the other maskable positions of each row, and how many of them it does not see.
  others = maskable & ~is_self
  hidden = _first_k(others, _rounded(decoder_mask_rate, others.sum(axis=2)), rng)
  always = real & ~maskable_positions(ids, real)  # [CLS] and the [SEP]s
  visible = ((others & ~hidden) | (always[:, None, :] & ~is_self)) & used[:, :, None]
  visible[:, :, 0] = True  # the sentence embedding (the [CLS] slot), for every row
  return {"decoder_positions": positions,
          "decoder_targets": np.take_along_axis(ids, positions, axis=1).astype(np.int32),
          "decoder_weights": weights, "decoder_attention_mask": visible}


def build_retromae_batch(blocks: Mapping[str, np.ndarray], *, rng: np.random.Generator,
                         encoder_mask_rate: float = ENCODER_MASK_RATE,
                         decoder_mask_rate: float = DECODER_MASK_RATE,
                         decoder_predictions: Optional[int] = None,
                         vocab_size: int) -> dict[str, np.ndarray]:
  """One RetroMAE batch from a batch of blocks (`retromae_batch_spec` gives its schema).

  `blocks`: block_ids, block_type_ids, block_mask int [B, L] (`[CLS] title [SEP] body [SEP]`,
  padded); `rng` is the only source of randomness; `vocab_size` bounds the random encoder
  replacements. Returns {key: array [B, ...]}, the keys of `retromae_batch_spec`.
  """
  ids = np.asarray(blocks["block_ids"]).astype(np.int32)
  mask = np.asarray(blocks["block_mask"]).astype(np.int32)
  length = ids.shape[1]
  batch = {"block_ids": ids, "block_type_ids": np.asarray(blocks["block_type_ids"], np.int32),
           "block_mask": mask}
  batch.update(mask_encoder_input(ids, mask, rng=rng, encoder_mask_rate=encoder_mask_rate,
                                  slots=encoder_slots(length, encoder_mask_rate),
                                  vocab_size=vocab_size))
  batch.update(decoder_inputs(ids, mask, rng=rng, decoder_mask_rate=decoder_mask_rate,
                              slots=decoder_slots(length, decoder_predictions)))
  return batch


def check_rates(encoder_mask_rate: Any, decoder_mask_rate: Any,
                decoder_predictions: Any = None) -> Optional[str]:
  """What is wrong with the masking settings (one line), or None."""
  for name, rate, low in (("encoder_mask_rate", encoder_mask_rate, "(0"),
                          ("decoder_mask_rate", decoder_mask_rate, "[0")):
    if (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1
        or (low == "(0" and rate == 0)):
      return f"{name}={rate!r}: expected a fraction in {low}, 1)"
  if decoder_predictions is not None and (
      isinstance(decoder_predictions, bool) or not isinstance(decoder_predictions, int)
      or decoder_predictions < 1):
    return f"decoder_predictions={decoder_predictions!r}: expected None or a positive integer"
  return None


class RetroMaeBatches:
  """Block batches (e.g. `SeqioBatches` of an `ict_<corpus>` task's `BLOCK_KEYS`) -> RetroMAE
  batches; resumable (the masks of the n-th batch come from the seed (seed, shard, n), so a
  restored stream draws the same ones). `blocks` needs `__next__`, `state`, `restore`,
  `batches_consumed` and `element_spec()` (`shard_index` if it has one).
  """

  def __init__(self, blocks: Any, *, seed: int, vocab_size: int,
               encoder_mask_rate: float = ENCODER_MASK_RATE,
               decoder_mask_rate: float = DECODER_MASK_RATE,
               decoder_predictions: Optional[int] = None):
    problem = check_rates(encoder_mask_rate, decoder_mask_rate, decoder_predictions)
    if problem:
      raise ValueError(problem)
    self.blocks = blocks
    self.seed = int(seed)
    self.vocab_size = int(vocab_size)
    self.encoder_mask_rate = float(encoder_mask_rate)
    self.decoder_mask_rate = float(decoder_mask_rate)
    self.decoder_predictions = decoder_predictions

  def element_spec(self) -> dict[str, Any]:
    block_len = int(self.blocks.element_spec()["block_ids"].shape[0])
    return retromae_batch_spec(block_len, encoder_mask_rate=self.encoder_mask_rate,
                               decoder_predictions=self.decoder_predictions)

  def __iter__(self) -> "RetroMaeBatches":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    blocks = next(self.blocks)
    shard = int(getattr(self.blocks, "shard_index", 0))
    rng = np.random.default_rng([self.seed, shard, int(self.blocks.batches_consumed)])
    return build_retromae_batch(blocks, rng=rng, encoder_mask_rate=self.encoder_mask_rate,
                                decoder_mask_rate=self.decoder_mask_rate,
                                decoder_predictions=self.decoder_predictions,
                                vocab_size=self.vocab_size)

  def state(self) -> dict[str, Any]:
    return self.blocks.state()

  def restore(self, state: Mapping[str, Any]) -> None:
    self.blocks.restore(state)
