"""bench/copy_circuit.py: where a copy row repeats its words, and the attention means, by hand."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import copy_circuit  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax import toy_bert  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.data import vocab  # noqa: E402  pylint: disable=wrong-import-position


def test_copy_positions_hold_the_masked_words_in_real_copy_rows(private_cache):
  """On held-out copy rows of the toy reading world, the repeat holds each target's word at
  the position `copy_positions` gives, for random tokens and for a masked salient span."""
  del private_cache
  for strategy in ("random_token", "salient_span"):
    rows = toy_bert.heldout_examples(20, context="copy", strategy=strategy)
    copies = copy_circuit.copy_positions(rows["type_ids"], rows["input_mask"],
                                         rows["mlm_positions"])
    weights = rows["mlm_weights"] > 0
    held = np.take_along_axis(rows["input_ids"], copies, axis=1)
    assert weights.sum() > 20
    np.testing.assert_array_equal(held[weights], rows["mlm_targets"][weights])
    # and in the sentence itself, the target's position is masked
    masked = np.take_along_axis(rows["input_ids"], rows["mlm_positions"], axis=1)
    assert (masked[weights] == vocab.MASK_ID).all()


def test_neighbour_mass_by_hand():
  # One row of 5 positions, 4 real. Head 0 attends to the previous position (position 0 to
  # itself), head 1 uniformly over the real positions.
  n, heads, length = 1, 2, 5
  probs = np.zeros([n, heads, length, length])
  for p in range(length):
    probs[0, 0, p, max(p - 1, 0)] = 1.0
    probs[0, 1, p, :4] = 0.25
  mask = np.array([[1, 1, 1, 1, 0]])
  previous, following = copy_circuit.neighbour_mass(probs, mask)
  # pairs (p, p-1) with both real: p = 1, 2, 3
  np.testing.assert_allclose(previous, [1.0, 0.25])
  np.testing.assert_allclose(following, [0.0, 0.25])


def test_copy_mass_splits_targets_inside_a_span():
  # Targets at 2 and 3 (3 follows a target), and at 6; padding slot last. Copies at 10, 11, 14.
  positions = np.array([[2, 3, 6, 0]])
  copies = np.array([[10, 11, 14, 0]])
  weights = np.array([[1.0, 1.0, 1.0, 0.0]])
  probs = np.zeros([1, 2, 16, 16])
  probs[0, 0, 2, 10], probs[0, 0, 3, 11], probs[0, 0, 6, 14] = 0.5, 0.2, 0.3
  probs[0, 1, 2, 10], probs[0, 1, 6, 14] = 0.1, 0.4
  probs[0, :, 0, 0] = 0.9  # the padding slot's, never counted
  out = copy_circuit.copy_mass(probs, positions, copies, weights)
  total, count = out["after a word"]
  assert count == 2
  np.testing.assert_allclose(total, [0.5 + 0.3, 0.1 + 0.4])
  total, count = out["after a target"]
  assert count == 1
  np.testing.assert_allclose(total, [0.2, 0.0])
