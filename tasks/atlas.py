"""seqio tasks of Atlas's masked-language-modelling pretext (Izacard et al. 2022, sec. 2.3):
`atlas_pretext_<corpus>`, shaped as a QA task so that `FinetuneJob(reader='fid')` trains the
Fusion-in-Decoder reader and (with a retriever objective) the question tower on it.

An example is one sentence of the pretraining text X, T5-span-corrupted in whole units (a word,
or a salient span, never cut: `realm_jax.data.sentinels`): `question` / `question_ids` hold the
sentence with each span replaced by a sentinel `[unused<k>]`, `answer_ids` / `answers` the
target `s_0 span_0 s_1 span_1 ...`. Splits "train" and "dev" by record (`dev_bucket`). X must be
text apart from the retrieval corpus Z: the FiD path does not exclude a query's own block.
Features, skips and reasons: docs/design/tasks_and_launch.md.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from typing import Any, Callable, Sequence, Union

import numpy as np
import seqio
import tensorflow as tf

from realm_jax.data import answer_match
from realm_jax.data import masking
from realm_jax.data import salient_spans
from realm_jax.data import sentinels
from realm_jax.data import vocab as vocab_lib
from realm_jax_tasks.open_qa import _answers_postprocess

PathOrFn = Union[str, Callable[[], str]]
PRETEXT_PREFIX = "atlas_pretext_"
SPLITS = ("train", "dev")
DEV_PERCENT = 5
QUESTION_LEN = 64  # FinetuneJob.question_len's default
# The toy FiD reader's decoder positions (experiments/toy_finetune_fid.gin's max_answer_length),
# EOS included: the pretext's checkpoint warm-starts it, positions and all.
TOY_MAX_TARGET_LEN = 16

log = logging.getLogger(__name__)


def dev_bucket(text: str) -> int:
  """The record's split bucket in [0, 100): sha256 of its text, first 8 hex digits, mod 100."""
  return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16) % 100


def unit_starts(ids: Sequence[int], starts: Sequence[int], limits: Sequence[int],
                salient: Sequence[tuple[int, int]], vocab: vocab_lib.WordPieceVocabulary
                ) -> np.ndarray:
  """bool [n]: where a unit starts in a sentence's wordpieces: at every word
  (`sentinels.word_starts`) except inside a salient span, whose wordpieces (those lying wholly in
  its bytes `salient`, [(start, limit)] relative to the sentence) form one unit with the word
  they start in."""
  units = sentinels.word_starts(ids, vocab)
  starts, limits = np.asarray(starts), np.asarray(limits)
  for start, limit in salient:
    inside = np.flatnonzero((starts >= start) & (limits <= limit))
    units[inside[1:]] = False
  return units


def make_pretext_example(sentence: str, salient: Sequence[tuple[int, int]], *,
                         rng: np.random.Generator, vocab: sentinels.SentinelVocabulary,
                         noise_density: float = sentinels.NOISE_DENSITY,
                         mean_span_length: float = sentinels.MEAN_SPAN_LENGTH,
                         question_len: int = QUESTION_LEN, max_target_len: int | None = None,
                         skips: masking.SkipCounter | None = None) -> dict[str, Any] | None:
  """One pretext example of a sentence (module docstring), or None (counted in `skips`).

  Args:
    salient: the sentence's salient spans as byte [(start, limit)] relative to it (empty:
      units are words).
    vocab: the SentinelVocabulary (the sentinels and the question's read-back).
    noise_density, mean_span_length: T5's 0.15 and 3, in units.
    question_len, max_target_len: the longest `[CLS] query [SEP]`; the longest target with its
      EOS (None: any).

  Returns:
    {"question", "question_ids", "answer_ids", "answers"} (NumPy / str), or None.
  """
  from realm_jax.models import fid_qa  # pylint: disable=g-import-not-at-top  (JAX: lazily)
  skips = skips if skips is not None else masking.SkipCounter()
  ids, starts, limits = vocab.tokenize_with_offsets(sentence)
  units = unit_starts(ids, starts, limits, salient, vocab)
  if units.sum() < 2:
    return skips.skip("pretext/too_short")
  corrupted = sentinels.span_corruption(ids, rng, noise_density=noise_density,
                                        mean_span_length=mean_span_length, unit_starts=units,
                                        sentinels=vocab.sentinel_ids)
  if len(corrupted.inputs) + 2 > question_len:
    return skips.skip("pretext/question_too_long")
  if max_target_len is not None and len(corrupted.targets) + 1 > max_target_len:
    return skips.skip("pretext/target_too_long")
  question = sentinels.corrupted_text(sentence, starts, limits, corrupted.spans)
  if vocab.encode(question) != corrupted.inputs.tolist():
    return skips.skip("pretext/text_round_trip")
  return {"question": question,
          "question_ids": np.asarray([vocab_lib.CLS_ID, *corrupted.inputs, vocab_lib.SEP_ID],
                                     np.int32),
          "answer_ids": corrupted.targets,
          "answers": [fid_qa.detokenize(corrupted.targets, vocab)]}


def _sentences(record: dict) -> list[tuple[str, list[tuple[int, int]]]]:
  """[(sentence text, its salient spans as bytes relative to it)] of a record (a span lying in
  no single sentence is dropped, as salient-span masking drops it)."""
  data = record["text"].encode("utf-8")
  bounds = list(zip(record["sentence_byte_start"], record["sentence_byte_limit"]))
  spans = list(zip(record["span_byte_start"], record["span_byte_limit"]))
  return [(data[start:limit].decode("utf-8"),
           [(a - start, b - start) for a, b in spans if start <= a and b <= limit])
          for start, limit in bounds]


def pretext_examples(records: Sequence[dict], *, seed: int = 0,
                     dev_percent: int = DEV_PERCENT, salient_units: bool = True,
                     **options: Any) -> dict[str, list[dict[str, Any]]]:
  """{split: examples} of every sentence of `records`, in record order (module docstring);
  `options` go to `make_pretext_example`."""
  vocab = sentinels.sentinel_vocabulary()
  skips = masking.SkipCounter()
  splits: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLITS}
  for record_index, record in enumerate(records):
    split = "dev" if dev_bucket(record["text"]) < dev_percent else "train"
    for sentence_index, (sentence, salient) in enumerate(_sentences(record)):
      example = make_pretext_example(
          sentence, salient if salient_units else (), vocab=vocab, skips=skips,
          rng=np.random.default_rng([seed, record_index, sentence_index]), **options)
      if example is not None:
        splits[split].append(example)
  log.info("atlas pretext: %s examples, %s",
           ", ".join(f"{split} {len(examples)}" for split, examples in splits.items()),
           skips.summary())
  return splits


def register_atlas_pretext_task(corpus: str, *, pretrain_records: PathOrFn, seed: int = 0,
                                dev_percent: int = DEV_PERCENT, salient_units: bool = True,
                                noise_density: float = sentinels.NOISE_DENSITY,
                                mean_span_length: float = sentinels.MEAN_SPAN_LENGTH,
                                question_len: int = QUESTION_LEN,
                                max_target_len: int | None = None) -> str:
  """Registers `atlas_pretext_<corpus>` over the pretraining text `pretrain_records` (a REALM-
  schema file, or a function returning its path, read on first use); returns the name.

  Raises:
    ValueError: no `pretrain_records` (module docstring: X must be apart from Z).
  """
  if pretrain_records is None:
    raise ValueError(f"atlas_pretext_{corpus}: pretrain_records is required (the FiD path does "
                     f"not exclude a query's own block from retrieval, so the queries' text X "
                     f"must not be the retrieval corpus itself)")
  name = PRETEXT_PREFIX + corpus

  @functools.lru_cache(maxsize=None)
  def examples() -> dict[str, list[dict[str, Any]]]:
    path = pretrain_records() if callable(pretrain_records) else pretrain_records
    return pretext_examples(
        list(salient_spans.read_precomputed(path)), seed=seed, dev_percent=dev_percent,
        salient_units=salient_units, noise_density=noise_density,
        mean_span_length=mean_span_length, question_len=question_len,
        max_target_len=max_target_len)

  def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None):
    del shuffle_files, seed
    chosen = examples()[split]
    if not chosen:
      raise ValueError(f"task {name!r}: split {split!r} has no examples")
    return tf.data.Dataset.from_generator(
        lambda: iter(chosen),
        output_signature={"question": tf.TensorSpec([], tf.string),
                          "question_ids": tf.TensorSpec([None], tf.int32),
                          "answer_ids": tf.TensorSpec([None], tf.int32),
                          "answers": tf.TensorSpec([None], tf.string)})

  vocabulary = vocab_lib.seqio_vocabulary(sentinels.sentinel_vocabulary())
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name,
      source=seqio.FunctionDataSource(dataset_fn, splits=SPLITS),
      # The question's vocabulary is the one that reads sentinels (`batches.fid.
      # question_vocabulary`): the batch builders encode question texts with it.
      output_features={"question_ids": seqio.Feature(vocabulary, add_eos=False),
                       "answer_ids": seqio.Feature(vocabulary, add_eos=False)},
      postprocess_fn=_answers_postprocess,
      metric_fns=[answer_match.orqa_exact_match])
  return name


def register_toy_pretext_task() -> str:
  """`atlas_pretext_toy` over the toy world's pretraining text (its targets fit the toy FiD
  reader's 16 decoder positions)."""
  from realm_jax_tasks.toy import _toy_pretrain_records  # pylint: disable=g-import-not-at-top
  return register_atlas_pretext_task("toy", pretrain_records=_toy_pretrain_records,
                                     max_target_len=TOY_MAX_TARGET_LEN)
