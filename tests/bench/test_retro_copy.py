"""bench/retro_copy.py: the copy task's sequences and neighbours, and which losses it reads."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import retro_copy  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.models import retro  # noqa: E402  pylint: disable=wrong-import-position

CONFIG = retro.RetroConfig.tiny(vocab_size=retro_copy.FIRST_ID + 50)  # m = 4, r = 8


def test_chunk_zero_has_its_own_text_and_continuation_among_random_neighbours():
  ids, neighbours = retro_copy.copy_batch(np.random.default_rng(0), 64, CONFIG, drawn=50)
  m, k = CONFIG.chunk_size, retro_copy.NUM_NEIGHBOURS
  assert ids.shape == (64, 2 * m) and neighbours.shape == (64, 2, k, 2 * m)
  assert ids.min() >= retro_copy.FIRST_ID and ids.max() < retro_copy.FIRST_ID + 50
  own = (neighbours[:, 0] == ids[:, None]).all(axis=-1)  # [B, k]
  assert (own.sum(axis=1) == 1).all()  # exactly one neighbour is the sequence itself
  assert 0 < own[:, 0].mean() < 1  # in either slot
  # Chunk 1's neighbours do not hold the sequence (they are never read inside it).
  assert not (neighbours[:, 1] == ids[:, None]).all(axis=-1).any()


def test_copyable_loss_reads_the_targets_of_chunk_one():
  m = 4
  # [B = 1, 2m - 1]: entry t predicts token t + 1; entries m - 1 .. 2m - 2 predict chunk 1.
  losses = np.array([[1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 40.0]])
  copyable, other = retro_copy.copyable_loss(losses, m)
  assert copyable == 25.0 and other == 2.0


def test_rows_parse_and_bad_ones_name_the_flag():
  assert retro_copy.parse_row("rotary:2") == (True, 2)
  assert retro_copy.parse_row("none:1") == (False, 1)
  for bad in ("rotary", "sideways:2", "rotary:0"):
    with pytest.raises(SystemExit, match="--rows"):
      retro_copy.parse_row(bad)
