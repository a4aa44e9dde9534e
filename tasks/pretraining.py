"""seqio tasks over a corpus: REALM's masked queries (REALM_SPEC 9-11), the ICT warm start
(REALM_SPEC 14), Contriever's crop pairs, and the toy BERT's MLM and reading examples.

Examples are built in Python (`realm_jax.data.masking`, `realm_jax.data.ict`,
`realm_jax.data.contriever`, `realm_jax.batches.reading`: code the tests check against
hand-worked cases) and handed to tf.data through a generator. A record's randomness is
`np.random.default_rng([seed, record_index])`, so an example does not depend on which others
were skipped, shuffled or sharded away. Each task's features: docs/design/tasks_and_launch.md.
"""

from __future__ import annotations

import collections
import functools
import logging
from typing import Callable, Iterator, Sequence, Union

import numpy as np
import seqio
import tensorflow as tf

from realm_jax.data import block_store as block_store_lib
from realm_jax.data import contriever as contriever_lib
from realm_jax.data import ict as ict_lib
from realm_jax.data import masking
from realm_jax.batches import reading
from realm_jax.data import salient_spans
from realm_jax.data import vocab as vocab_lib
from realm_jax.batches import pretraining_batches

PathOrFn = Union[str, Callable[[], str]]
MASKING_STRATEGIES = ("salient_span", "random_span", "random_token", "random_token_knowledge")

log = logging.getLogger(__name__)


def _resolve(path: PathOrFn) -> str:
  """Paths may be given lazily so registering a task never builds or downloads data."""
  return path() if callable(path) else path


def uid_to_int64(uid: int) -> np.int64:
  """The uint64 uid as the int64 with the same bits (tf.data has no uint64 comparisons)."""
  return np.array(uid, np.uint64).view(np.int64)[()]


def _fields(vocabulary: seqio.Vocabulary, **fields: tuple
            ) -> tuple[dict[str, tf.TensorSpec], dict[str, seqio.Feature]]:
  """A task's generator signature and output features from one declaration per field:
  `name=(shape, dtype, has_vocabulary)`; token-id fields carry `vocabulary` (for decoding)."""
  signature = {name: tf.TensorSpec(shape, dtype) for name, (shape, dtype, _) in fields.items()}
  features = {
      name: seqio.Feature(vocabulary if tokens else seqio.PassThroughVocabulary(size=0),
                          add_eos=False, dtype=dtype, rank=len(shape))
      for name, (shape, dtype, tokens) in fields.items()}
  return signature, features


def _records(block_store: PathOrFn, pretrain_records: PathOrFn | None,
             annotator: str) -> Iterator[tuple[dict, int]]:
  """(REALM-schema record, source uid) pairs.

  With `pretrain_records` (JSONL/TFRecord with precomputed spans) the text is X and has no source
  block, unless a record names its block (`salient_spans.SOURCE_UID`: the corpus annotated once
  by `salient_spans.annotate_blocks`); without, X is the corpus itself (REALM's Wikipedia
  setting): every block's body is annotated and its own uid is the source to exclude from
  retrieval (REALM_SPEC 12).
  """
  if pretrain_records is not None:
    for record in salient_spans.read_precomputed(_resolve(pretrain_records)):
      yield record, record.get(salient_spans.SOURCE_UID, 0)
    return
  store = block_store_lib.BlockStore.open(_resolve(block_store), verify="fast")
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


_ICT_SKIP_WARNED: set[tuple] = set()  # (store, seed, probability) already warned about


def _ict_record(example: dict) -> dict:
  """An ICT-shaped example (ICT's or Contriever's) as the task's record: the rows and the uid
  as int64 (what TensorFlow holds)."""
  rows = ("query_ids", "query_mask", "block_ids", "block_type_ids", "block_mask")
  return {name: example[name] for name in rows} | {
      "block_uid": uid_to_int64(example["block_uid"])}


def _ict_examples(*, block_store: PathOrFn, seed: int, query_len: int, block_len: int,
                  remove_probability: float) -> Iterator[dict]:
  vocab = vocab_lib.default_vocabulary()
  store = block_store_lib.BlockStore.open(_resolve(block_store), verify="fast")
  skips = masking.SkipCounter()
  made = 0
  for block_id in range(store.num_blocks):
    example = ict_lib.make_ict_example(
        store.title(block_id), store.body(block_id), rng=np.random.default_rng([seed, block_id]),
        vocab=vocab, query_len=query_len, block_len=block_len,
        remove_probability=remove_probability, skips=skips)
    if example is None:
      continue
    made += 1
    yield _ict_record(example)
  skipped = sum(skips.values())
  # Every pass over the task skips the same blocks (each block's rng is fixed): say it once.
  warning_key = (store.path, store.store_id, seed, remove_probability)
  if skipped > 0.1 * store.num_blocks and warning_key not in _ICT_SKIP_WARNED:
    _ICT_SKIP_WARNED.add(warning_key)
    # Short documents: a one-sentence block loses its only sentence with probability
    # remove_probability, and an empty body is no block to retrieve.
    log.warning("ICT skipped %d of %d blocks of %s (%.0f%%; %s): blocks of one sentence lose "
                "it with probability ict_remove_probability=%g. For short documents, keep "
                "more sentences with a lower ict_remove_probability (0.0 keeps them all, as the "
                "toy world does; train: --gin.IctJob.ict_remove_probability=P; "
                "registering the corpus yourself: realm_jax_tasks.register_pretraining_tasks)",
                skipped, store.num_blocks,
                store.path, 100 * skipped / store.num_blocks, skips.summary(),
                remove_probability)
  else:
    log.info("ICT examples: %d, %s", made, skips.summary())


def _contriever_examples(*, block_store: PathOrFn, seed: int, data_seed: int | None,
                         query_len: int, block_len: int, min_ratio: float, max_ratio: float
                         ) -> Iterator[dict]:
  """One crop pair of every block. Block b's rng is `default_rng([seed, b])`, or with the data
  seed of an epoch (SeqioBatches hands each epoch its own) `default_rng([seed, data_seed, b])`:
  every epoch of a training run draws new crops, as Contriever crops on the fly, and a resumed
  run redraws the same ones."""
  vocab = vocab_lib.default_vocabulary()
  store = block_store_lib.BlockStore.open(_resolve(block_store), verify="fast")
  skips = masking.SkipCounter()
  made = 0
  for block_id in range(store.num_blocks):
    rng = np.random.default_rng([seed, block_id] if data_seed is None
                                else [seed, int(data_seed), block_id])
    example = contriever_lib.make_contriever_example(
        store.title(block_id), store.body(block_id), rng=rng, vocab=vocab, query_len=query_len,
        block_len=block_len, min_ratio=min_ratio, max_ratio=max_ratio, skips=skips)
    if example is None:
      continue
    made += 1
    yield _ict_record(example)
  log.info("Contriever examples: %d, %s", made, skips.summary())


def _toy_bert_examples(*, block_store: PathOrFn, seed: int, query_len: int, block_len: int,
                       max_masks: int, passes: int, strategy: str, annotator: str
                       ) -> Iterator[dict]:
  """`passes` examples of every block (BERT's dupe_factor), each with its own rng: a sentence
  of the block (annotated by `annotator`) masked by `strategy`, read with the block's body."""
  vocab = vocab_lib.default_vocabulary()
  store = block_store_lib.BlockStore.open(_resolve(block_store), verify="fast")
  spans = salient_spans.get_annotator(annotator)
  masker = masking.get_masker(strategy)
  skips = masking.SkipCounter()
  reader_len = query_len + block_len  # a longer body is cut at its end (reader_inputs)
  for pass_index in range(passes):
    for block_id in range(store.num_blocks):
      record = salient_spans.annotate_record(store.title(block_id), store.body(block_id), spans)
      query = masking.make_masked_query(
          record, strategy=masker, rng=np.random.default_rng([seed, pass_index, block_id]),
          vocab=vocab, query_len=query_len, max_masks=max_masks, skips=skips)
      if query is None:
        continue
      # [1, 1, reader_len] each: `[CLS] masked sentence [SEP] body [SEP]`
      ids, type_ids, mask = pretraining_batches.reader_inputs(
          store, query.query_ids[None], query.query_mask[None], [[block_id]],
          reader_len=reader_len)
      yield {"input_ids": ids[0, 0], "type_ids": type_ids[0, 0], "input_mask": mask[0, 0],
             "mlm_positions": query.mlm_positions, "mlm_targets": query.mlm_targets,
             "mlm_weights": query.mlm_weights}
  log.info("toy BERT examples: %s", skips.summary())


def _reading_examples(*, worlds: Callable[[], Sequence[tuple[str, str]]], seed: int,
                      passes: int, query_len: int, reader_len: int, max_masks: int,
                      mix: reading.ReadingMix) -> Iterator[dict]:
  """`passes` reading examples of every passage of every world (see realm_jax.batches.reading),
  the worlds interleaved so that any run of examples mixes them."""
  vocab = vocab_lib.default_vocabulary()
  opened = []
  for store_dir, records_path in worlds():
    store = block_store_lib.BlockStore.open(store_dir, verify="fast")
    records = list(salient_spans.read_precomputed(records_path))
    opened.append((store, reading.blocks_by_title(store), records))
  skips = masking.SkipCounter()
  contexts = collections.Counter()
  for pass_index in range(passes):
    for record_index in range(max(len(records) for _, _, records in opened)):
      for world_index, (store, title_blocks, records) in enumerate(opened):
        if record_index >= len(records):
          continue
        example = reading.make_reading_example(
            records[record_index], store, title_blocks,
            rng=np.random.default_rng([seed, pass_index, world_index, record_index]), mix=mix,
            query_len=query_len, reader_len=reader_len, max_masks=max_masks, vocab=vocab,
            skips=skips)
        if example is None:
          continue
        contexts[example.pop("context")] += 1
        yield example
  log.info("reading examples: contexts %s, %s", dict(contexts), skips.summary())


def _mlm_fields(vocabulary: seqio.Vocabulary, length: int, max_masks: int):
  """The toy BERT's example fields (`mlm_<corpus>` and reading tasks alike)."""
  return _fields(
      vocabulary,
      input_ids=([length], tf.int32, True), type_ids=([length], tf.int32, False),
      input_mask=([length], tf.int32, False), mlm_positions=([max_masks], tf.int32, False),
      mlm_targets=([max_masks], tf.int32, True), mlm_weights=([max_masks], tf.float32, False))


def register_reading_task(name: str, *, worlds: Callable[[], Sequence[tuple[str, str]]],
                          seed: int = 0, passes: int = 8, query_len: int = 64,
                          block_len: int = 128, max_masks: int = 10,
                          mix: reading.ReadingMix = reading.ReadingMix()) -> str:
  """Registers the toy BERT's reading task `name` (features as `mlm_<corpus>`).

  Args:
    worlds: returns (BlockStore directory, pretraining-text records) of every world to read
      (called on first use, so registering builds nothing).
    seed: example randomness seed.
    passes: examples of every passage per pass over the task (each drawn anew).
    query_len, block_len: the masked sentence's and the block's lengths; rows are their sum.
    max_masks: target slots.
    mix: the draw of masking and context (realm_jax.batches.reading.ReadingMix).
  """
  signature, features = _mlm_fields(vocab_lib.seqio_vocabulary(), query_len + block_len,
                                    max_masks)
  generator = functools.partial(_reading_examples, worlds=worlds, seed=seed, passes=passes,
                                query_len=query_len, reader_len=query_len + block_len,
                                max_masks=max_masks, mix=mix)
  _add(name, _generator_source(generator, signature), features)
  return name


def _generator_source(generator_fn: Callable[[], Iterator[dict]],
                      signature: dict[str, tf.TensorSpec]) -> seqio.FunctionDataSource:
  def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None):
    del split, shuffle_files, seed  # one split; example order is the corpus order
    return tf.data.Dataset.from_generator(generator_fn, output_signature=signature)
  return seqio.FunctionDataSource(dataset_fn, splits=("train",))


def _seeded_generator_source(generator_fn: Callable[..., Iterator[dict]],
                             signature: dict[str, tf.TensorSpec]) -> seqio.FunctionDataSource:
  """As `_generator_source`, but the data seed seqio is given (SeqioBatches: one per epoch;
  None when none is) reaches `generator_fn(data_seed=...)`."""
  def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None):
    del split, shuffle_files  # one split; example order is the corpus order
    return tf.data.Dataset.from_generator(functools.partial(generator_fn, data_seed=seed),
                                          output_signature=signature)
  return seqio.FunctionDataSource(dataset_fn, splits=("train",))


def _ict_fields(vocabulary: seqio.Vocabulary, query_len: int, block_len: int):
  """An ICT example's fields (`ict_<corpus>` and `contriever_<corpus>` alike)."""
  return _fields(
      vocabulary,
      query_ids=([query_len], tf.int32, True), query_mask=([query_len], tf.int32, False),
      block_ids=([block_len], tf.int32, True), block_type_ids=([block_len], tf.int32, False),
      block_mask=([block_len], tf.int32, False), block_uid=([], tf.int64, False))


def register_contriever_task(corpus: str, *, block_store: PathOrFn, seed: int = 0,
                             query_len: int = 64, block_len: int = 288,
                             min_crop_ratio: float = contriever_lib.MIN_CROP_RATIO,
                             max_crop_ratio: float = contriever_lib.MAX_CROP_RATIO) -> str:
  """Registers `contriever_<corpus>`: Contriever's pairs of independent random crops of each
  block (realm_jax.data.contriever) with ICT's features, so that `ContrieverJob`
  (realm_jax.jobs.ict) trains `IctModel` on them; returns the task name.

  Args:
    seed: example randomness seed (each epoch's data seed is mixed in).
    query_len, block_len: the rows' lengths (ICT's 64 and 288; the toy world's blocks: 128).
    min_crop_ratio, max_crop_ratio: a crop's length as a fraction of its block's body
      (Contriever: 0.1 and 0.5).

  Raises:
    ValueError: crop ratios outside 0 < min <= max <= 1.
  """
  contriever_lib.check_crop_ratios(min_crop_ratio, max_crop_ratio)
  signature, features = _ict_fields(vocab_lib.seqio_vocabulary(), query_len, block_len)
  generator = functools.partial(
      _contriever_examples, block_store=block_store, seed=seed, query_len=query_len,
      block_len=block_len, min_ratio=float(min_crop_ratio), max_ratio=float(max_crop_ratio))
  name = f"contriever_{corpus}"
  _add(name, _seeded_generator_source(generator, signature), features)
  return name


def register_corpus_for_task(task_name: str, block_store: str,
                             pretrain_records: str | None = None,
                             ict_remove_probability: float = 0.9,
                             min_crop_ratio: float = contriever_lib.MIN_CROP_RATIO,
                             max_crop_ratio: float = contriever_lib.MAX_CROP_RATIO
                             ) -> str | None:
  """Registers the corpus that an unregistered `mlm_<corpus>`, `ict_<corpus>` or
  `realm_<corpus>_<strategy>` task name names (a `contriever_<corpus>` name: that task alone)
  over `block_store` (X = `pretrain_records`, or the corpus itself), and says so in a warning:
  a misspelt task name would otherwise silently become a corpus of its own. How `train` and
  `evaluate` reach a BlockStore built by `python -m realm_jax.build_corpus`; ICT's blocks are
  the store's own length (`max_block_len`).

  Returns:
    The corpus registered, or None (the task exists already, or the name names no corpus).
  """
  if task_name in seqio.TaskRegistry.names():
    return None
  if task_name.startswith("contriever_") and len(task_name) > len("contriever_"):
    corpus = task_name[len("contriever_"):]
    log.warning("task %r is not registered: registering Contriever's crop pairs of corpus %r "
                "over the BlockStore %s; if %r is a typo, fix the task name", task_name, corpus,
                block_store, task_name)
    store = block_store_lib.BlockStore.open(_resolve(block_store), verify="fast")
    register_contriever_task(corpus, block_store=block_store, block_len=store.max_block_len,
                             min_crop_ratio=min_crop_ratio, max_crop_ratio=max_crop_ratio)
    return corpus
  corpus = None
  for prefix in ("mlm_", "ict_"):
    if task_name.startswith(prefix):
      corpus = task_name[len(prefix):]
  if task_name.startswith("realm_"):
    for strategy in MASKING_STRATEGIES:
      if task_name.endswith(f"_{strategy}"):
        corpus = task_name[len("realm_"):-len(strategy) - 1]
  if not corpus:
    return None
  known = sorted(n[len("ict_"):] for n in seqio.TaskRegistry.names() if n.startswith("ict_"))
  log.warning("task %r is not registered: registering corpus %r over the BlockStore %s "
              "(mlm_%s, ict_%s, realm_%s_<strategy>); if %r is a typo, fix the task name "
              "(corpora registered so far: %s)", task_name, corpus, block_store, corpus, corpus,
              corpus, task_name, ", ".join(known) or "none")
  store = block_store_lib.BlockStore.open(_resolve(block_store), verify="fast")
  register_pretraining_tasks(corpus, block_store=block_store, pretrain_records=pretrain_records,
                             block_len=store.max_block_len,
                             ict_remove_probability=ict_remove_probability)
  return corpus


def register_pretraining_tasks(corpus: str, *, block_store: PathOrFn,
                               pretrain_records: PathOrFn | None = None,
                               annotator: str = "union", seed: int = 0, query_len: int = 96,
                               max_masks: int = 10, ict_query_len: int = 64,
                               block_len: int = 288,
                               ict_remove_probability: float = 0.9,
                               mlm_max_masks: int = 10,
                               mlm_passes: int = 10,
                               mlm_strategy: str = "salient_span") -> list[str]:
  """Registers `realm_<corpus>_<strategy>` for each masking strategy, `ict_<corpus>` and
  `mlm_<corpus>` (the toy BERT's examples); returns the task names.

  Args:
    block_store: BlockStore directory (or a function returning it, called on first use).
    pretrain_records: pretraining text X in the REALM release schema (precomputed spans); None
      uses the corpus blocks themselves, annotated with `annotator`
      (realm_jax.data.salient_spans.ANNOTATORS).
    query_len, max_masks: masked query shape (REALM: 96, 10).
    ict_query_len, block_len, ict_remove_probability: ICT example shape (64, 288, 0.9).
    mlm_max_masks, mlm_passes, mlm_strategy: toy-BERT target slots, examples of each block per
      pass over the task (BERT's dupe_factor, 10), and the masking (a `masking.MASKERS` name);
      its rows are ict_query_len + block_len.
  """
  vocabulary = vocab_lib.seqio_vocabulary()
  names = []
  masked_signature, masked_features = _fields(
      vocabulary,
      query_ids=([query_len], tf.int32, True), query_mask=([query_len], tf.int32, False),
      mlm_positions=([max_masks], tf.int32, False), mlm_targets=([max_masks], tf.int32, True),
      mlm_weights=([max_masks], tf.float32, False), source_uid=([], tf.int64, False))
  for strategy in MASKING_STRATEGIES:
    name = f"realm_{corpus}_{strategy}"
    generator = functools.partial(
        _masked_query_examples, block_store=block_store, pretrain_records=pretrain_records,
        annotator=annotator, strategy=strategy, seed=seed, query_len=query_len,
        max_masks=max_masks)
    _add(name, _generator_source(generator, masked_signature), masked_features)
    names.append(name)

  ict_signature, ict_features = _ict_fields(vocabulary, ict_query_len, block_len)
  generator = functools.partial(
      _ict_examples, block_store=block_store, seed=seed, query_len=ict_query_len,
      block_len=block_len, remove_probability=ict_remove_probability)
  _add(f"ict_{corpus}", _generator_source(generator, ict_signature), ict_features)
  names.append(f"ict_{corpus}")

  mlm_signature, mlm_features = _mlm_fields(vocabulary, ict_query_len + block_len,
                                            mlm_max_masks)
  generator = functools.partial(_toy_bert_examples, block_store=block_store, seed=seed,
                                query_len=ict_query_len, block_len=block_len,
                                max_masks=mlm_max_masks, passes=mlm_passes,
                                strategy=mlm_strategy, annotator=annotator)
  _add(f"mlm_{corpus}", _generator_source(generator, mlm_signature), mlm_features)
  names.append(f"mlm_{corpus}")
  return names


def _add(name: str, source: seqio.DataSource, features: dict[str, seqio.Feature], **kwargs):
  # Re-registering (e.g. a notebook importing twice) replaces the task instead of failing.
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(name, source=source, output_features=features, **kwargs)
