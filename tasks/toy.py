"""Tasks over the embedded toy world (realm_jax.data.toy_world), the CPU default of every job.

The world and its BlockStore are generated into the cache on first use (seconds), in the same
formats as real data: `corpus.jsonl` -> BlockStore, `pretrain.jsonl` (REALM release schema with
precomputed salient spans), `qa/{train,dev,test}.jsonl` (ORQA JSONL, already split).
"""

from __future__ import annotations

import functools
import os

from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.batches import reading
from realm_jax.data import qa_datasets
from realm_jax.data import toy_world
from realm_jax_tasks.open_qa import register_qa_task
from realm_jax_tasks.pretraining import (MASKING_STRATEGIES, register_pretraining_tasks,
                                         register_reading_task)

TOY_TASKS = tuple(f"realm_toy_{s}" for s in MASKING_STRATEGIES) + (
    "ict_toy", "mlm_toy", "toy_qa", "mlm_toy_copy", "mlm_toy_reading", "mlm_toy_distract")
# Block length of the toy BlockStore and of the toy ICT blocks, in wordpieces. REALM uses 288
# (REALM_SPEC 7); toy documents are short (median 54 wordpieces with title, 99% under 180), so
# 288-wordpiece rows would be mostly padding, and attention over padding is most of a CPU
# step. At 128 a longer document is packed into two or three blocks, as a long Wikipedia
# article is into many.
TOY_BLOCK_LEN = 128
# The toy BERT's reading worlds are cut into blocks of this length, and its reading rows hold one:
# its own constant, so that resizing the toy world's blocks does not change how the shipped toy
# BERT is rebuilt (docs/toy_bert.md: its sha256).
TOY_BERT_BLOCK_LEN = 128
# ICT keeps the query sentence in its block (ORQA removes it with p = 0.9). ORQA's blocks are 288
# wordpieces of many sentences, so removing one leaves the block nearly whole; a toy document has
# 2-6 short templated sentences, and without one of them it is that sentence's complement. At
# p = 0.9 the retriever learns the complement (a block scores higher without the query's
# sentence than with it) and finds the source block in the real index in the top 5 for 0.9% of
# sentences (width 32) and 4.7% (width 128); keeping the sentence, 7.1% and 60% (chance 0.19%;
# all four with [CLS] pooling, before the toy model pooled the mean). With the shipped toy model
# (mean pooling, 400 steps of batch 64 from random weights, its query tower still reading
# [MASK]s) at p = 0.9: toy QA test recall@5 0.263 against 0.437, and REALM pretraining from it
# ended at retrieval utility 0.005 against 0.070 and masked-span accuracy 0.060 with retrieval
# against 0.056 without (0.062 and 0.062).
TOY_ICT_REMOVE_PROBABILITY = 0.0
# The toy BERT (`experiments/toy_bert.gin`) reads the worlds of these seeds
# (`toy_world.reading_world_dir`: no name shared with the toy world); its reading accuracy is
# measured on the world of `TOY_BERT_HELDOUT_SEED`, which it never reads in training.
TOY_BERT_READING_SEEDS = tuple(range(1, 9))
TOY_BERT_HELDOUT_SEED = 100
# The toy BERT's mix of examples (realm_jax.batches.reading.ReadingMix).
TOY_BERT_MIX = reading.ReadingMix(random_token_fraction=0.5, distractor_fraction=0.05,
                                  null_fraction=0.05, copy_fraction=0.7,
                                  body_mask_probability=0.15)
# The toy BERT's third phase (`experiments/toy_bert_distract.gin`): reading as REALM's encoder
# reads, beside retrieved candidates most of which do not state the answer. After phase 2 (70%
# verbatim repeats, 5% distractors) the toy BERT trusts whatever block it reads: beside another
# document's block it gets 1.5% of the toy world's masked name and date wordpieces right, fewer
# than the 3.7% it gets with the null document, and most of REALM's candidates are another
# document's blocks, so REALM pretraining taught it to ignore its blocks altogether. Here a
# block is another document's as often as its own, and never a verbatim repeat.
TOY_BERT_DISTRACT_MIX = reading.ReadingMix(random_token_fraction=0.3, distractor_fraction=0.45,
                                           null_fraction=0.1, copy_fraction=0.0,
                                           body_mask_probability=0.15)
# Target slots of a toy BERT row: the sentence's masks and the body's (0.15 of up to 128).
TOY_BERT_MAX_MASKS = 32
# The toy BERT's first phase (`experiments/toy_bert_copy.gin`): every sentence read beside its
# own verbatim repeat, half of them with BERT's random tokens masked, in short rows (48 + 80
# wordpieces). Copying a word from where it stands again is what reading starts from; rows
# where it is the only way to lower the loss, and many targets per row, teach it in a couple of
# thousand steps. Trained on the full mix from the start, the model spent thousands of steps
# learning what names look like before its context began to help (docs/toy_bert.md).
TOY_BERT_COPY_MIX = reading.ReadingMix(random_token_fraction=0.5, distractor_fraction=0.0,
                                       null_fraction=0.0, copy_fraction=1.0,
                                       body_mask_probability=0.15)
TOY_BERT_COPY_QUERY_LEN, TOY_BERT_COPY_BLOCK_LEN = 48, 80


def toy_block_store_dir() -> str:
  """The toy corpus as a BlockStore, built once next to the cached world."""
  return block_store_dir(toy_world.toy_world_dir())


def block_store_dir(world: str, block_len: int = TOY_BLOCK_LEN) -> str:
  """A generated world's corpus as a BlockStore of `block_len`, built once next to it."""
  store = f"{world}-blocks{block_len}"
  try:
    block_store_lib.BlockStore.open(store, verify="fast")
    return store
  except block_store_lib.BlockStoreError:
    pass
  source = sources_lib.JsonlSource(os.path.join(world, toy_world.CORPUS_FILE))
  try:
    corpus_build.build_block_store(source, store, overwrite=os.path.exists(store),
                                   max_block_len=block_len)
  except block_store_lib.BlockStoreError:
    # Another process published the same store first (same input, same bytes): use it.
    block_store_lib.BlockStore.open(store, verify="fast")
  return store


def reading_world(seed: int) -> tuple[str, str]:
  """(BlockStore directory, pretraining-text path) of the reading world of `seed`."""
  world = toy_world.reading_world_dir(seed)
  return (block_store_dir(world, TOY_BERT_BLOCK_LEN),
          os.path.join(world, toy_world.PRETRAIN_FILE))


def _reading_worlds() -> list[tuple[str, str]]:
  return [reading_world(seed) for seed in TOY_BERT_READING_SEEDS]


def _toy_pretrain_records() -> str:
  return os.path.join(toy_world.toy_world_dir(), toy_world.PRETRAIN_FILE)


@functools.lru_cache(maxsize=None)
def _toy_qa_split(split: str) -> tuple:
  path = os.path.join(toy_world.toy_world_dir(), toy_world.qa_file(split))
  return tuple(qa_datasets.read_orqa_jsonl(path))


def register_toy_tasks() -> tuple[str, ...]:
  register_pretraining_tasks("toy", block_store=toy_block_store_dir,
                             pretrain_records=_toy_pretrain_records, block_len=TOY_BLOCK_LEN,
                             ict_remove_probability=TOY_ICT_REMOVE_PROBABILITY)
  register_qa_task("toy_qa", _toy_qa_split)
  register_reading_task("mlm_toy_copy", worlds=_reading_worlds,
                        query_len=TOY_BERT_COPY_QUERY_LEN, block_len=TOY_BERT_COPY_BLOCK_LEN,
                        max_masks=TOY_BERT_MAX_MASKS, mix=TOY_BERT_COPY_MIX)
  register_reading_task("mlm_toy_reading", worlds=_reading_worlds,
                        block_len=TOY_BERT_BLOCK_LEN,
                        max_masks=TOY_BERT_MAX_MASKS, mix=TOY_BERT_MIX)
  register_reading_task("mlm_toy_distract", worlds=_reading_worlds,
                        block_len=TOY_BERT_BLOCK_LEN,
                        max_masks=TOY_BERT_MAX_MASKS, mix=TOY_BERT_DISTRACT_MIX)
  return TOY_TASKS
