"""seqio tasks for REALM pretraining (masked queries) and the ICT warm start over a corpus.

Examples are built in Python by `realm_jax.data.masking` / `realm_jax.data.ict` (the same code
the tests check against hand-worked cases) and handed to tf.data through a generator. Each
record's randomness comes from `np.random.default_rng([seed, record_index])`, so an example does
not depend on which others were skipped, shuffled or sharded away.

Features of a pretraining example (REALM_SPEC 9-11):
  query_ids, query_mask      int32 [query_len]   `[CLS] sentence [SEP]`, masked, 0-padded
  mlm_positions, mlm_targets int32 [max_masks]   positions index the query (after [CLS])
  mlm_weights                float32 [max_masks] 0 for padding slots
  source_uid                 int64 []            uint64 content uid of the example's own block
                                                 (bit pattern), 0 when it has none

Features of an ICT example (REALM_SPEC 14):
  query_ids, query_mask                  int32 [ict_query_len]  `[CLS] sentence [SEP]`
  block_ids, block_type_ids, block_mask  int32 [block_len]      `[CLS] title [SEP] body [SEP]`
  block_uid                              int64 []               uint64 uid of the block (bits)
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, Iterator, Union

import numpy as np
import seqio
import tensorflow as tf

from realm_jax.data import corpus as corpus_lib
from realm_jax.data import ict as ict_lib
from realm_jax.data import masking
from realm_jax.data import salient_spans
from realm_jax.data import vocab as vocab_lib

PathOrFn = Union[str, Callable[[], str]]
MASKING_STRATEGIES = ("salient_span", "random_span", "random_token")

log = logging.getLogger(__name__)


def _resolve(path: PathOrFn) -> str:
  """Paths may be given lazily so registering a task never builds or downloads data."""
  return path() if callable(path) else path


def uid_to_int64(uid: int) -> np.int64:
  """The uint64 uid as the int64 with the same bits (tf.data has no uint64 comparisons)."""
  return np.array(uid, np.uint64).view(np.int64)[()]


def _feature(dtype=tf.int32, rank=1, vocabulary=None) -> seqio.Feature:
  return seqio.Feature(vocabulary or seqio.PassThroughVocabulary(size=0), add_eos=False,
                       dtype=dtype, rank=rank)


def _records(block_store: PathOrFn, pretrain_records: PathOrFn | None,
             annotator: str) -> Iterator[tuple[dict, int]]:
  """(REALM-schema record, source uid) pairs.

  With `pretrain_records` (JSONL/TFRecord with precomputed spans) the text is X and has no source
  block; without, X is the corpus itself (REALM's Wikipedia setting): every block's body is
  annotated and its own uid is the source to exclude from retrieval (REALM_SPEC 12).
  """
  if pretrain_records is not None:
    for record in salient_spans.read_precomputed(_resolve(pretrain_records)):
      yield record, 0
    return
  store = corpus_lib.BlockStore.open(_resolve(block_store), verify="fast")
  spans = salient_spans.get_annotator(annotator)
  for block_id in range(store.num_blocks):
    record = salient_spans.annotate_record(store.title(block_id), store.body(block_id), spans)
    yield record, int(store.uids[block_id])


def _masked_query_examples(*, block_store: PathOrFn, pretrain_records: PathOrFn | None,
                           annotator: str, strategy: str, seed: int, query_len: int,
                           max_masks: int) -> Iterator[dict]:
  vocab = vocab_lib.default_vocabulary()
  masker = masking.get_masker(strategy)
  skips = masking.SkipCounter()
  produced = 0
  for index, (record, uid) in enumerate(_records(block_store, pretrain_records, annotator)):
    query = masking.make_masked_query(
        record, strategy=masker, rng=np.random.default_rng([seed, index]), vocab=vocab,
        query_len=query_len, max_masks=max_masks, source_uid=uid, skips=skips)
    if query is None:
      continue
    produced += 1
    yield {"query_ids": query.query_ids, "query_mask": query.query_mask,
           "mlm_positions": query.mlm_positions, "mlm_targets": query.mlm_targets,
           "mlm_weights": query.mlm_weights, "source_uid": uid_to_int64(query.source_uid)}
  log.info("%s masking: %d examples, %s", strategy, produced, skips.summary())


def _ict_examples(*, block_store: PathOrFn, seed: int, query_len: int, block_len: int,
                  remove_probability: float) -> Iterator[dict]:
  vocab = vocab_lib.default_vocabulary()
  store = corpus_lib.BlockStore.open(_resolve(block_store), verify="fast")
  skips = masking.SkipCounter()
  for block_id in range(store.num_blocks):
    example = ict_lib.make_ict_example(
        store.title(block_id), store.body(block_id), rng=np.random.default_rng([seed, block_id]),
        vocab=vocab, query_len=query_len, block_len=block_len,
        remove_probability=remove_probability, skips=skips)
    if example is None:
      continue
    yield {name: example[name] for name in
           ("query_ids", "query_mask", "block_ids", "block_type_ids", "block_mask")} | {
               "block_uid": uid_to_int64(example["block_uid"])}
  log.info("ICT examples: %s", skips.summary())


def _generator_source(generator_fn: Callable[[], Iterator[dict]],
                      signature: dict[str, tf.TensorSpec]) -> seqio.FunctionDataSource:
  def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None):
    del split, shuffle_files, seed  # one split; example order is the corpus order
    return tf.data.Dataset.from_generator(generator_fn, output_signature=signature)
  return seqio.FunctionDataSource(dataset_fn, splits=("train",))


def register_pretraining_tasks(corpus: str, *, block_store: PathOrFn,
                               pretrain_records: PathOrFn | None = None,
                               annotator: str = "union", seed: int = 0, query_len: int = 96,
                               max_masks: int = 10, ict_query_len: int = 64,
                               block_len: int = 288,
                               ict_remove_probability: float = 0.9) -> list[str]:
  """Registers `realm_<corpus>_<strategy>` for each masking strategy and `ict_<corpus>`.

  Args:
    corpus: short corpus name used in the task names.
    block_store: BlockStore directory (or a function returning it, called on first use).
    pretrain_records: pretraining text X in the REALM release schema (precomputed spans); None
      uses the corpus blocks themselves, annotated with `annotator`.
    annotator: salient-span annotator name (realm_jax.data.salient_spans.ANNOTATORS) for X = Z.
    seed: example randomness seed.
    query_len, max_masks: masked query shape (REALM: 96, 10).
    ict_query_len, block_len, ict_remove_probability: ICT example shape (64, 288, 0.9).

  Returns:
    The registered task names.
  """
  vocabulary = vocab_lib.seqio_vocabulary()
  names = []
  masked_signature = {
      "query_ids": tf.TensorSpec([query_len], tf.int32),
      "query_mask": tf.TensorSpec([query_len], tf.int32),
      "mlm_positions": tf.TensorSpec([max_masks], tf.int32),
      "mlm_targets": tf.TensorSpec([max_masks], tf.int32),
      "mlm_weights": tf.TensorSpec([max_masks], tf.float32),
      "source_uid": tf.TensorSpec([], tf.int64),
  }
  masked_features = {
      "query_ids": _feature(vocabulary=vocabulary), "query_mask": _feature(),
      "mlm_positions": _feature(), "mlm_targets": _feature(vocabulary=vocabulary),
      "mlm_weights": _feature(dtype=tf.float32), "source_uid": _feature(tf.int64, rank=0),
  }
  for strategy in MASKING_STRATEGIES:
    name = f"realm_{corpus}_{strategy}"
    generator = functools.partial(
        _masked_query_examples, block_store=block_store, pretrain_records=pretrain_records,
        annotator=annotator, strategy=strategy, seed=seed, query_len=query_len,
        max_masks=max_masks)
    _add(name, _generator_source(generator, masked_signature), masked_features)
    names.append(name)

  ict_signature = {
      "query_ids": tf.TensorSpec([ict_query_len], tf.int32),
      "query_mask": tf.TensorSpec([ict_query_len], tf.int32),
      "block_ids": tf.TensorSpec([block_len], tf.int32),
      "block_type_ids": tf.TensorSpec([block_len], tf.int32),
      "block_mask": tf.TensorSpec([block_len], tf.int32),
      "block_uid": tf.TensorSpec([], tf.int64),
  }
  ict_features = {
      "query_ids": _feature(vocabulary=vocabulary), "query_mask": _feature(),
      "block_ids": _feature(vocabulary=vocabulary), "block_type_ids": _feature(),
      "block_mask": _feature(), "block_uid": _feature(tf.int64, rank=0),
  }
  generator = functools.partial(
      _ict_examples, block_store=block_store, seed=seed, query_len=ict_query_len,
      block_len=block_len, remove_probability=ict_remove_probability)
  _add(f"ict_{corpus}", _generator_source(generator, ict_signature), ict_features)
  names.append(f"ict_{corpus}")
  return names


def _add(name: str, source: seqio.DataSource, features: dict[str, seqio.Feature], **kwargs):
  # Re-registering (e.g. a notebook importing twice) replaces the task instead of failing.
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(name, source=source, output_features=features, **kwargs)
