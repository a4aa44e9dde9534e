"""RetroMAE batches (realm_jax.batches.retromae): the encoder's masking, the decoder's
predicted positions and position-specific attention mask (hand-worked small blocks), the schema
against a built batch, reproducibility and resumption."""

import numpy as np
import pytest

import realm_jax_tasks  # registers the tasks
from realm_jax.batches import retromae as rb
from realm_jax.batches import seqio_batches
from realm_jax.data.vocab import CLS_ID, MASK_ID, SEP_ID

PAD = 0


def _blocks(*rows, length=None):
  """Blocks [CLS] ... [SEP] (rows of ids without padding) -> block_ids/type/mask [B, L]."""
  length = length or max(len(r) for r in rows)
  ids = np.zeros((len(rows), length), np.int32)
  for b, row in enumerate(rows):
    ids[b, :len(row)] = row
  return {"block_ids": ids, "block_type_ids": np.zeros_like(ids),
          "block_mask": (ids != PAD).astype(np.int32)}


def _visible(batch, b=0):
  """{predicted position: the content-stream columns its row sees} of block b's used rows."""
  rows = zip(batch["decoder_positions"][b], batch["decoder_weights"][b],
             batch["decoder_attention_mask"][b])
  return {int(p): [int(j) for j in np.flatnonzero(m)] for p, w, m in rows if w > 0}


def _random_blocks(rng, batch=64, length=40):
  """Blocks [CLS] title [SEP] body [SEP] of random lengths, padded to `length`."""
  rows = []
  for _ in range(batch):
    title = rng.integers(2000, 3000, size=rng.integers(1, 5))
    body = rng.integers(2000, 3000, size=rng.integers(1, length - len(title) - 2))
    rows.append([CLS_ID, *title, SEP_ID, *body, SEP_ID])
  return _blocks(*rows, length=length)


# -- the decoder's attention mask, by hand


def test_length_five_block_rows_by_hand():
  """[CLS] a b [SEP] [PAD] at decoder rate 0.5. Column 0 is the sentence embedding (the [CLS]
  slot); the rows predict a (1), b (2) and [SEP] (3); the fourth row is unused.

  Row 1: its other maskable position is {2}; round(0.5 * 1) = 1 of it hidden, so it sees the
  sentence embedding and the [SEP]: {0, 3}. Row 2 likewise {0, 3}. Row 3 ([SEP]): two others,
  {1, 2}, one hidden: {0, 1} or {0, 2}, per seed. Padding (4) is never visible."""
  blocks = _blocks([CLS_ID, 2000, 2001, SEP_ID, PAD])
  slots = rb.decoder_slots(5)
  assert slots == 4
  by_seed = {}
  for seed in range(4):
    batch = rb.decoder_inputs(blocks["block_ids"], blocks["block_mask"],
                              rng=np.random.default_rng(seed), decoder_mask_rate=0.5,
                              slots=slots)
    np.testing.assert_array_equal(batch["decoder_positions"], [[1, 2, 3, 0]])
    np.testing.assert_array_equal(batch["decoder_targets"], [[2000, 2001, SEP_ID, CLS_ID]])
    np.testing.assert_array_equal(batch["decoder_weights"], [[1, 1, 1, 0]])
    # The unused row sees the sentence embedding only (no row is all masked).
    assert [int(j) for j in np.flatnonzero(batch["decoder_attention_mask"][0, 3])] == [0]
    by_seed[seed] = _visible(batch)
  assert by_seed[0] == {1: [0, 3], 2: [0, 3], 3: [0, 1]}
  assert by_seed[1] == {1: [0, 3], 2: [0, 3], 3: [0, 2]}
  assert by_seed[2] == {1: [0, 3], 2: [0, 3], 3: [0, 1]}
  assert by_seed[3] == {1: [0, 3], 2: [0, 3], 3: [0, 2]}
  # Decoder rate 0: every row sees every other real position, never itself.
  batch = rb.decoder_inputs(blocks["block_ids"], blocks["block_mask"],
                            rng=np.random.default_rng(0), decoder_mask_rate=0.0, slots=slots)
  assert _visible(batch) == {1: [0, 2, 3], 2: [0, 1, 3], 3: [0, 1, 2]}


def test_title_and_body_block_rows_by_hand():
  """[CLS] t [SEP] a b c d [SEP] [PAD] [PAD], seed 0, rate 0.5: maskable {1, 3, 4, 5, 6}; the
  [SEP]s (2, 7) are seen by every other row. A row of a maskable position has 4 other maskable
  ones and hides round(2) of them; a [SEP] row has 5 and hides round(2.5) = 3."""
  blocks = _blocks([CLS_ID, 3000, SEP_ID, 2000, 2001, 2002, 2003, SEP_ID], length=10)
  batch = rb.decoder_inputs(blocks["block_ids"], blocks["block_mask"],
                            rng=np.random.default_rng(0), decoder_mask_rate=0.5, slots=9)
  np.testing.assert_array_equal(batch["decoder_positions"], [[1, 2, 3, 4, 5, 6, 7, 0, 0]])
  assert _visible(batch) == {
      1: [0, 2, 4, 6, 7],
      2: [0, 3, 6, 7],
      3: [0, 2, 4, 6, 7],
      4: [0, 2, 3, 5, 7],
      5: [0, 2, 4, 6, 7],
      6: [0, 2, 3, 5, 7],
      7: [0, 1, 2, 3],
  }


def test_attention_mask_rules_on_random_blocks():
  rng = np.random.default_rng(7)
  blocks = _random_blocks(rng)
  ids, real = blocks["block_ids"], blocks["block_mask"] > 0
  rate = 0.5
  batch = rb.decoder_inputs(ids, blocks["block_mask"], rng=rng, decoder_mask_rate=rate,
                            slots=rb.decoder_slots(ids.shape[1]))
  maskable = rb.maskable_positions(ids, blocks["block_mask"])
  distinct_rows = 0
  for b in range(len(ids)):
    visible = _visible(batch, b)
    # Every real position but [CLS] is predicted, with its own id as the target.
    assert sorted(visible) == list(np.flatnonzero(real[b])[1:])
    used = batch["decoder_weights"][b] > 0
    np.testing.assert_array_equal(batch["decoder_targets"][b][used],
                                  ids[b][batch["decoder_positions"][b][used]])
    seps = [int(j) for j in np.flatnonzero(ids[b] == SEP_ID)]
    for position, columns in visible.items():
      assert columns[0] == 0 and position not in columns
      assert all(real[b, j] for j in columns)  # padding never
      assert all(j in columns for j in seps if j != position)
      others = int(maskable[b].sum()) - int(maskable[b, position])
      hidden = int(np.floor(rate * others + 0.5))
      assert sum(int(maskable[b, j]) for j in columns) == others - hidden
    distinct_rows += len({tuple(c) for c in visible.values()}) > 1
  # Sampled per row: the rows of a block see different contexts.
  assert distinct_rows > len(ids) // 2


def test_decoder_predictions_cap_samples_a_longer_blocks_positions():
  rng = np.random.default_rng(3)
  long_block = [CLS_ID, *range(2000, 2020), SEP_ID]  # 21 predictable positions
  short_block = [CLS_ID, 2000, 2001, SEP_ID]
  blocks = _blocks(long_block, short_block, length=24)
  slots = rb.decoder_slots(24, decoder_predictions=8)
  assert slots == 8 and rb.decoder_slots(24) == 23
  seen = set()
  for _ in range(5):
    batch = rb.decoder_inputs(blocks["block_ids"], blocks["block_mask"], rng=rng,
                              decoder_mask_rate=0.5, slots=slots)
    positions = batch["decoder_positions"][0]
    assert np.all(batch["decoder_weights"][0] == 1) and len(set(positions)) == 8
    assert np.all(np.diff(positions) > 0) and positions.min() >= 1 and positions.max() <= 21
    seen.add(tuple(positions))
    np.testing.assert_array_equal(batch["decoder_positions"][1], [1, 2, 3, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(batch["decoder_weights"][1], [1, 1, 1, 0, 0, 0, 0, 0])
  assert len(seen) == 5


# -- the encoder's masking


def test_encoder_masks_the_rate_of_maskable_wordpieces_only():
  rng = np.random.default_rng(0)
  blocks = _random_blocks(rng, batch=256)
  ids, mask = blocks["block_ids"], blocks["block_mask"]
  rate = 0.3
  slots = rb.encoder_slots(ids.shape[1], rate)
  out = rb.mask_encoder_input(ids, mask, rng=rng, encoder_mask_rate=rate, slots=slots,
                              vocab_size=30522)
  maskable = rb.maskable_positions(ids, mask)
  counts = out["encoder_weights"].sum(axis=1)
  expected = np.maximum(np.floor(rate * maskable.sum(axis=1) + 0.5), 1)
  np.testing.assert_array_equal(counts, expected)
  masked_kinds = {"mask": 0, "random": 0, "kept": 0}
  for b in range(len(ids)):
    n = int(counts[b])
    positions = out["encoder_positions"][b, :n]
    assert np.all(np.diff(positions) > 0)
    assert np.all(maskable[b, positions])  # never [CLS], [SEP] or padding
    np.testing.assert_array_equal(out["encoder_targets"][b, :n], ids[b, positions])
    assert np.all(out["encoder_positions"][b, n:] == 0)
    untouched = np.ones(ids.shape[1], bool)
    untouched[positions] = False
    np.testing.assert_array_equal(out["encoder_ids"][b, untouched], ids[b, untouched])
    new = out["encoder_ids"][b, positions]
    masked_kinds["mask"] += int(np.sum(new == MASK_ID))
    masked_kinds["kept"] += int(np.sum(new == ids[b, positions]))
    masked_kinds["random"] += int(np.sum((new != MASK_ID) & (new != ids[b, positions])))
  total = sum(masked_kinds.values())
  assert total == counts.sum() and total > 1000
  # BERT's 80 / 10 / 10.
  assert abs(masked_kinds["mask"] / total - 0.8) < 0.04
  assert abs(masked_kinds["random"] / total - 0.1) < 0.03
  assert abs(masked_kinds["kept"] / total - 0.1) < 0.03
  # A one-wordpiece body still gets one mask; rate 0.15 rounds as 0.15 * n.
  one = _blocks([CLS_ID, SEP_ID, 2000, SEP_ID])
  out = rb.mask_encoder_input(one["block_ids"], one["block_mask"], rng=rng,
                              encoder_mask_rate=0.15, slots=1, vocab_size=30522)
  np.testing.assert_array_equal(out["encoder_positions"], [[2]])


# -- the whole batch


class FakeBlocks:
  """A resumable block iterator (the protocol of SeqioBatches that RetroMaeBatches uses)."""

  def __init__(self, blocks, batch_size=4):
    self.blocks, self.batch_size, self.batches_consumed = blocks, batch_size, 0

  def element_spec(self):
    import jax  # pylint: disable=import-outside-toplevel
    return {k: jax.ShapeDtypeStruct(v.shape[1:], np.int32) for k, v in self.blocks.items()}

  def __next__(self):
    start = (self.batches_consumed * self.batch_size) % len(self.blocks["block_ids"])
    self.batches_consumed += 1
    return {k: v[start:start + self.batch_size] for k, v in self.blocks.items()}

  def state(self):
    return {"batches_consumed": self.batches_consumed}

  def restore(self, state):
    self.batches_consumed = state["batches_consumed"]


@pytest.mark.parametrize("decoder_predictions", [None, 6])
def test_schema_matches_a_built_batch(decoder_predictions):
  blocks = _random_blocks(np.random.default_rng(1), batch=8, length=20)
  batches = rb.RetroMaeBatches(FakeBlocks(blocks), seed=0, vocab_size=30522,
                               decoder_predictions=decoder_predictions)
  spec = batches.element_spec()
  batch = next(batches)
  assert set(batch) == set(spec)
  for key, s in spec.items():
    assert batch[key].shape == (4,) + s.shape, key
    assert batch[key].dtype == s.dtype, key
  assert spec["decoder_attention_mask"].shape == (19 if decoder_predictions is None else 6, 20)
  assert spec["encoder_positions"].shape == (6,)  # round(0.3 * 20)


def test_schema_matches_a_batch_of_the_toy_ict_task():
  blocks = seqio_batches.SeqioBatches("ict_toy", batch_size=4, seed=0,
                                      feature_keys=rb.BLOCK_KEYS)
  batches = rb.RetroMaeBatches(blocks, seed=0, vocab_size=30522)
  spec, batch = batches.element_spec(), next(batches)
  assert {k: (s.shape, s.dtype) for k, s in spec.items()} == {
      k: (v.shape[1:], v.dtype) for k, v in batch.items()}
  assert spec["decoder_attention_mask"].shape == (127, 128)  # the toy blocks' 128 wordpieces
  used = batch["decoder_weights"] > 0
  assert np.all(used.sum(axis=1) == batch["block_mask"].sum(axis=1) - 1)


def test_batches_are_seeded_and_resume_exactly():
  blocks = _random_blocks(np.random.default_rng(2), batch=16, length=20)
  first = rb.RetroMaeBatches(FakeBlocks(blocks), seed=5, vocab_size=30522)
  drawn = [next(first) for _ in range(3)]
  again = rb.RetroMaeBatches(FakeBlocks(blocks), seed=5, vocab_size=30522)
  next(again)
  state = again.state()
  resumed = rb.RetroMaeBatches(FakeBlocks(blocks), seed=5, vocab_size=30522)
  resumed.restore(state)
  for expected in drawn[1:]:
    got = next(resumed)
    for key in expected:
      np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
  other = next(rb.RetroMaeBatches(FakeBlocks(blocks), seed=6, vocab_size=30522))
  assert not np.array_equal(other["encoder_ids"], drawn[0]["encoder_ids"])


@pytest.mark.parametrize("settings,expected", [
    ((0.0, 0.5), "encoder_mask_rate=0.0: expected a fraction in (0, 1)"),
    ((0.3, 1.0), "decoder_mask_rate=1.0: expected a fraction in [0, 1)"),
    ((True, 0.5), "encoder_mask_rate=True"),
    ((0.3, 0.5, 0), "decoder_predictions=0: expected None or a positive integer"),
])
def test_bad_rates_are_one_line(settings, expected):
  assert expected in rb.check_rates(*settings)
  assert rb.check_rates(0.3, 0.0, 64) is None
  with pytest.raises(ValueError, match="expected"):
    rb.RetroMaeBatches(None, seed=0, vocab_size=10, encoder_mask_rate=settings[0],
                       decoder_mask_rate=settings[1],
                       decoder_predictions=settings[2] if len(settings) > 2 else None)
