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
# Block length of the toy BlockStore and ICT blocks, in wordpieces. REALM uses 288
# (REALM_SPEC 7); toy documents are short, and 288-wordpiece rows would be mostly padding
# (docs/design/tasks_and_launch.md).
TOY_BLOCK_LEN = 128
# The toy BERT's reading worlds are cut into blocks of this length, and its reading rows hold one:
# its own constant, so that resizing the toy world's blocks does not change how the shipped toy
# BERT is rebuilt (docs/toy_bert.md: its sha256).
TOY_BERT_BLOCK_LEN = 128
# ICT keeps the query sentence in its block (ORQA removes it with p = 0.9): a toy document of a
# few short sentences without one of them is that sentence's complement, which the retriever
# then learns (measurements: docs/design/tasks_and_launch.md).
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
# reads, beside candidates most of which do not state the answer, so that it learns not to
# trust every block (why: docs/design/tasks_and_launch.md). Never a verbatim repeat.
TOY_BERT_DISTRACT_MIX = reading.ReadingMix(random_token_fraction=0.3, distractor_fraction=0.45,
                                           null_fraction=0.1, copy_fraction=0.0,
                                           body_mask_probability=0.15)
# Target slots of a toy BERT row: the sentence's masks and the body's (0.15 of up to 128).
TOY_BERT_MAX_MASKS = 32
# The toy BERT's first phase (`experiments/toy_bert_copy.gin`): every sentence read beside its
# own verbatim repeat, half with BERT's random tokens masked, in short rows (48 + 80
# wordpieces): copying is what reading starts from (docs/toy_bert.md).
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
