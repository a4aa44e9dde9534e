"""The toy BERT's reading examples (realm_jax.batches.reading) on a small generated world: each row
is `[CLS] masked sentence [SEP] body [SEP]` with the body the kind of context drawn, checked
against rows assembled here from the BlockStore's own token arrays."""

import collections
import os

import numpy as np
import pytest

from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.batches import reading
from realm_jax.data import salient_spans
from realm_jax.data import toy_world as tw
from realm_jax.data.vocab import CLS_ID, MASK_ID, SEP_ID

QUERY_LEN, READER_LEN, MAX_MASKS = 64, 192, 10


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  root = tmp_path_factory.mktemp("reading")
  tw.generate(5, scale=tw.SMALL_SCALE).write(root / "world")
  store_dir = str(root / "blocks")
  corpus_build.build_block_store(sources_lib.JsonlSource(str(root / "world" / tw.CORPUS_FILE)),
                                 store_dir, max_block_len=128)
  store = block_store_lib.BlockStore.open(store_dir)
  records = list(salient_spans.read_precomputed(str(root / "world" / tw.PRETRAIN_FILE)))
  return store, reading.blocks_by_title(store), records


def _example(world, index, max_masks=MAX_MASKS, **kwargs):
  store, title_blocks, records = world
  return reading.make_reading_example(
      records[index], store, title_blocks, rng=np.random.default_rng([index]),
      query_len=QUERY_LEN, reader_len=READER_LEN, max_masks=max_masks, **kwargs)


def _split_row(example):
  """(query tokens incl. [CLS] and [SEP], body tokens without the final [SEP])."""
  ids = example["input_ids"][example["input_mask"] > 0]
  types = example["type_ids"][example["input_mask"] > 0]
  query, rest = ids[types == 0], ids[types == 1]
  assert query[0] == CLS_ID and query[-1] == SEP_ID and rest[-1] == SEP_ID
  return query, rest[:-1]


def _targets(example):
  return example["mlm_targets"][example["mlm_weights"] > 0]


def _contains(haystack, needle):
  n = len(needle)
  return any(list(haystack[i:i + n]) == list(needle) for i in range(len(haystack) - n + 1))


def test_own_context_states_the_masked_span(world):
  store, title_blocks, records = world
  stated = 0
  for index in range(len(records)):
    example = _example(world, index, strategy="salient_span", context="own")
    assert example["context"] == "own"
    query, body = _split_row(example)
    targets = _targets(example)
    # The masked wordpieces are [MASK] in the query and, but for the few facts X restates from
    # another document (the year of an event a person took part in), stand in the body in order.
    assert (query[example["mlm_positions"][example["mlm_weights"] > 0]] == MASK_ID).all()
    stated += _contains(body, targets)
    # The body is exactly one block of the passage's own document (titles are left out).
    bodies = [list(store.body_tokens(b)) for b in title_blocks[records[index]["title"]]]
    assert list(body) in bodies
  assert stated >= 0.95 * len(records)


def test_null_and_distractor_contexts(world):
  store, title_blocks, records = world
  for index in range(20):
    null = _example(world, index, strategy="salient_span", context="null")
    query, body = _split_row(null)
    assert len(body) == 0 and null["input_mask"].sum() == len(query) + 1  # [CLS] q [SEP] [SEP]
    own_query, _ = _split_row(_example(world, index, strategy="salient_span", context="own"))
    np.testing.assert_array_equal(query, own_query)  # the same masked sentence

    distractor = _example(world, index, strategy="salient_span", context="distractor")
    _, body = _split_row(distractor)
    others = [b for b in range(store.num_blocks)
              if list(store.body_tokens(b)) == list(body)]
    assert others and all(store.title(b) != records[index]["title"] for b in others)


def test_copy_context_states_the_sentence_itself_before_the_block(world):
  store, title_blocks, records = world
  for index in range(20):
    for strategy in ("salient_span", "random_token"):
      copy = _example(world, index, strategy=strategy, context="copy")
      own = _example(world, index, strategy=strategy, context="own")
      query, body = _split_row(copy)
      own_query, own_body = _split_row(own)
      np.testing.assert_array_equal(query, own_query)
      # The unmasked sentence: the query with every target put back at its position.
      sentence = query.copy()
      real = copy["mlm_weights"] > 0
      sentence[copy["mlm_positions"][real]] = copy["mlm_targets"][real]
      expected = np.concatenate([sentence[1:-1], own_body])[:READER_LEN - len(query) - 1]
      np.testing.assert_array_equal(body, expected)
      if strategy == "salient_span":  # random tokens are not one run
        assert _contains(body[:len(query) - 2], _targets(copy))


def test_the_mix_draws_each_kind_at_its_rate(world):
  mix = reading.ReadingMix(random_token_fraction=0.3, distractor_fraction=0.2,
                           null_fraction=0.1, copy_fraction=0.25)
  store, title_blocks, records = world
  contexts, random_token = collections.Counter(), 0
  n = 0
  for repeat in range(6):
    for index, record in enumerate(records):
      example = reading.make_reading_example(
          record, store, title_blocks, rng=np.random.default_rng([repeat, index]), mix=mix,
          query_len=QUERY_LEN, reader_len=READER_LEN, max_masks=MAX_MASKS)
      if example is None:
        continue
      n += 1
      contexts[example["context"]] += 1
      query, _ = _split_row(example)
      # Random-token masking leaves some masked positions unmasked or replaced (BERT's 80/10/10)
      # and draws positions anywhere; a salient span is a run of [MASK]s.
      positions = example["mlm_positions"][example["mlm_weights"] > 0]
      contiguous = (np.diff(positions) == 1).all() and (query[positions] == MASK_ID).all()
      random_token += not contiguous
  assert n > 500
  assert abs(contexts["null"] / n - 0.1) < 0.04
  assert abs(contexts["distractor"] / n - 0.2) < 0.05
  assert abs(contexts["copy"] / n - 0.25) < 0.05
  # Not every random-token draw looks non-contiguous (one masked token is a run of one).
  assert 0.15 < random_token / n < 0.35


@pytest.mark.parametrize("context", ["own", "copy", "null"])
def test_body_masking_masks_body_wordpieces_into_free_slots(world, context):
  store, title_blocks, records = world
  masked = body_wordpieces = 0
  for index in range(40):
    for strategy in ("salient_span", "random_token"):
      # The draws of the row come first, so the same seed gives the same row before masking.
      plain = _example(world, index, strategy=strategy, context=context, max_masks=48)
      example = _example(world, index, strategy=strategy, context=context, max_masks=48,
                         mix=reading.ReadingMix(body_mask_probability=0.3))
      ids, plain_ids = example["input_ids"], plain["input_ids"]
      changed = np.flatnonzero(ids != plain_ids)
      # Only body wordpieces change, and only to [MASK]; [SEP], padding and the query do not.
      assert (ids[changed] == MASK_ID).all()
      assert (example["type_ids"][changed] == 1).all()
      assert (plain_ids[changed] != SEP_ID).all() and (example["input_mask"][changed] == 1).all()
      real, plain_real = example["mlm_weights"] > 0, plain["mlm_weights"] > 0
      # The sentence's targets keep their slots; each masked body wordpiece is a target with its
      # own id, in a slot the sentence left free.
      np.testing.assert_array_equal(example["mlm_positions"][plain_real],
                                    plain["mlm_positions"][plain_real])
      np.testing.assert_array_equal(example["mlm_targets"][plain_real],
                                    plain["mlm_targets"][plain_real])
      new = real & ~plain_real
      np.testing.assert_array_equal(np.sort(example["mlm_positions"][new]), changed)
      np.testing.assert_array_equal(example["mlm_targets"][new],
                                    plain_ids[example["mlm_positions"][new]])
      if real.sum() < 48:  # no slot ran out: every draw was kept
        body = (plain["type_ids"] == 1) & (plain["input_mask"] == 1) & (plain_ids != SEP_ID)
        masked += changed.size
        body_wordpieces += body.sum()
  if context == "null":
    assert body_wordpieces == 0
  else:
    assert body_wordpieces > 1000 and abs(masked / body_wordpieces - 0.3) < 0.05


def test_bad_mix_and_unknown_title():
  with pytest.raises(ValueError, match="null_fraction"):
    reading.ReadingMix(null_fraction=1.5)
  with pytest.raises(ValueError, match="exceeds 1"):
    reading.ReadingMix(distractor_fraction=0.4, null_fraction=0.3, copy_fraction=0.4)


def test_a_passage_without_a_document_is_skipped(world):
  store, title_blocks, records = world
  skips = reading.masking.SkipCounter()
  record = dict(records[0], title="No Such Document")
  assert reading.make_reading_example(
      record, store, title_blocks, rng=np.random.default_rng(0), query_len=QUERY_LEN,
      reader_len=READER_LEN, max_masks=MAX_MASKS, skips=skips) is None
  assert skips["title_not_in_corpus"] == 1
  with pytest.raises(ValueError, match="context='other'"):
    _example(world, 0, context="other")
