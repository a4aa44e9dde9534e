"""Checks of your corpus and questions before anything trains, and the settings chosen from
them: a train, dev and test split, none empty, every record well formed; the block length
from the documents; ICT's removal probability from the BlockStore's sentences; the answers
looked for in the corpus. Each failure is an `InputError`: one line naming the file (and the
record and field)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

# The name the recipe's messages carry (`python -m realm_jax.recipe`).
PROG = "recipe"
# Fine-tuning trains on train, picks its checkpoint on dev (and the verdict on pretraining
# reads dev); the table reports test.
QA_SPLITS = ("train", "dev", "test")
# The block length chosen from the documents: the smallest multiple of BLOCK_LEN_MULTIPLE that
# holds BLOCK_LEN_QUANTILE of the first SAMPLED_DOCUMENTS documents whole, within
# [MIN_BLOCK_LEN, REALM's 288]. Multiples of 32: the index builder cuts each batch to such a
# bucket anyway (`build_index_main.length_bucket`). A longer document becomes several blocks,
# as a Wikipedia article does.
SAMPLED_DOCUMENTS = 2000
BLOCK_LEN_QUANTILE = 0.9
BLOCK_LEN_MULTIPLE = 32
MIN_BLOCK_LEN = 64
# ICT's removal probability chosen from the BlockStore: the highest of ORQA's 0.9, 0.8, ..., 0.0
# at which the blocks ICT cannot use (one sentence, removed: no body left) stay at most this
# share of the corpus, the share past which ICT itself warns (realm_jax_tasks.pretraining).
ICT_MAX_SKIPPED = 0.1
ORQA_REMOVE_PROBABILITY = 0.9
# Less than this share of a split's questions answerable in the corpus stops the recipe.
DEFAULT_MIN_ANSWERABLE = 0.5


class InputError(Exception):
  """Your corpus or questions cannot be used, or `--out` holds another run's: one line naming
  the file (and the record and field where there is one), raised before anything trains."""


def absolute_questions(questions: str) -> str:
  """`--questions` with its path made absolute (the children run from the repository root),
  `regex:` kept."""
  from realm_jax_tasks import open_qa  # pylint: disable=g-import-not-at-top
  regex, path = open_qa.qa_path(questions)
  return (open_qa.REGEX_PREFIX if regex else "") + path


def check_questions(questions: str) -> dict[str, tuple[str, list]]:
  """Your question files read whole and checked: {split: (file, its QAExamples)} for train,
  dev and test, each example's `source` its "file:line".

  Raises:
    InputError: no such path, a split missing or empty, or a bad record (naming its file, line
      and field).
  """
  import realm_jax_tasks  # pylint: disable=g-import-not-at-top
  try:
    splits = realm_jax_tasks.read_qa_files(questions)
  except ValueError as e:  # QADataError (a bad record) is one too, and names file:line, field
    raise InputError(f"--questions: {e}") from e
  missing = [split for split in QA_SPLITS if split not in splits]
  if missing:
    found = ", ".join(f"{split} ({file})" for split, (file, _) in splits.items())
    raise InputError(
        f"--questions {questions}: no {' or '.join(missing)} split (found {found}): the recipe "
        f"fine-tunes on train, picks its checkpoints on dev and reports test, so it needs a "
        f"directory with train, dev and test as .jsonl (ORQA's form, {{\"question\", "
        f"\"answer\": [...]}} per line) or .csv/.tsv (DPR's)")
  for split, (file, examples) in splits.items():
    if not examples:
      raise InputError(f"{file}: no questions (the {split} split of --questions is empty)")
  return {split: splits[split] for split in QA_SPLITS}


def document_lengths(source, limit: int = SAMPLED_DOCUMENTS) -> list[int]:
  """Wordpieces of `[CLS] title [SEP] text [SEP]` of the first `limit` documents of a
  `sources.make_source` source (REALM's records: of each block).

  Raises:
    InputError: a bad record among them, named as build_corpus names it.
  """
  from realm_jax.data import sources as sources_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  vocab = vocab_lib.default_vocabulary()
  lengths = []
  for item in source:
    if isinstance(item, sources_lib.BadRecord):
      raise InputError(f"--documents: {item.message}")
    lengths.append(3 + len(vocab.encode(item.title)) + len(vocab.encode(item.text)))
    if len(lengths) >= limit:
      break
  return lengths


def choose_block_len(lengths: Sequence[int]) -> tuple[int, str]:
  """(max_block_len, why) from documents' wordpiece lengths (`document_lengths`): the smallest
  multiple of BLOCK_LEN_MULTIPLE that holds BLOCK_LEN_QUANTILE of them whole, within
  [MIN_BLOCK_LEN, REALM's 288]."""
  from realm_jax.data import block_store as block_store_lib  # pylint: disable=g-import-not-at-top
  if not lengths:
    raise InputError("--documents: no documents")
  lengths = np.asarray(lengths)  # [documents]
  # The least length that this share of the documents does not exceed.
  quantile = float(np.quantile(lengths, BLOCK_LEN_QUANTILE, method="inverted_cdf"))
  block_len = int(np.clip(-(-quantile // BLOCK_LEN_MULTIPLE) * BLOCK_LEN_MULTIPLE,
                          MIN_BLOCK_LEN, block_store_lib.DEFAULT_MAX_BLOCK_LEN))
  whole = float(np.mean(lengths <= block_len))
  return block_len, (
      f"chosen from the documents: {BLOCK_LEN_QUANTILE:.0%} of the first {len(lengths):,} have "
      f"at most {quantile:.0f} wordpieces as [CLS] title [SEP] text [SEP] (median "
      f"{np.median(lengths):.0f}), and blocks of {block_len} hold {whole:.0%} of them whole: "
      f"the smallest multiple of {BLOCK_LEN_MULTIPLE} to hold {BLOCK_LEN_QUANTILE:.0%}, within "
      f"{MIN_BLOCK_LEN}..{block_store_lib.DEFAULT_MAX_BLOCK_LEN} (REALM's, for Wikipedia's long "
      f"articles); a longer document becomes several blocks; --max_block_len sets it")


def sentence_counts(store) -> np.ndarray:
  """The sentences of each block's body as ICT splits them (`data.sentences`). int [blocks]."""
  from realm_jax.data import sentences  # pylint: disable=g-import-not-at-top
  return np.array([len(sentences.split_sentences(store.body(block_id)))
                   for block_id in range(store.num_blocks)], np.int64)


def choose_ict_remove_probability(counts: Sequence[int]) -> tuple[float, str]:
  """(ICT's removal probability, why) from each block's sentence count (`sentence_counts`):
  the highest of 0.9, 0.8, ..., 0.0 at which the one-sentence blocks ICT cannot use (their
  sentence removed, no body is left) stay at most ICT_MAX_SKIPPED of the blocks."""
  counts = np.asarray(counts)  # [blocks]
  one = float(np.mean(counts == 1)) if counts.size else 0.0
  # ICT loses a one-sentence block with probability p: about one * p of the corpus.
  probability = next(p / 10 for p in range(round(ORQA_REMOVE_PROBABILITY * 10), -1, -1)
                     if one * p / 10 <= ICT_MAX_SKIPPED + 1e-9)
  lost_at_orqa = one * ORQA_REMOVE_PROBABILITY
  orqa = ("ORQA's" if probability == ORQA_REMOVE_PROBABILITY else
          f"at ORQA's {ORQA_REMOVE_PROBABILITY:g} it would lose {lost_at_orqa:.0%}: the highest "
          f"of 0.9, 0.8, ... to keep the loss within the")
  return probability, (
      f"chosen from the BlockStore: {one:.0%} of its {counts.size:,} blocks are one sentence, "
      f"which ICT cannot use when it removes that sentence (no body is left), so at "
      f"{probability:g} it loses about {one * probability:.0%} of the blocks; {orqa} "
      f"{ICT_MAX_SKIPPED:.0%} past which ICT warns; --ict_remove_probability sets it")


def check_answers(splits: dict[str, tuple[str, list]], texts, min_answerable: float
                  ) -> list[str]:
  """Whether the questions' answers occur in the corpus at all (`texts`: the block bodies, as
  recall reads them): the lines to print about the questions whose answers occur nowhere (no
  retriever can find them; they count as misses), one per split that has some.

  Raises:
    InputError: in some split, less than `min_answerable` of the questions has an answer in
      the corpus: the questions are not this corpus's (naming the file and the first ones).
  """
  from realm_jax.evaluation import recall  # pylint: disable=g-import-not-at-top
  examples = [e for _, split_examples in splits.values() for e in split_examples]
  found = recall.answers_in_corpus(examples, texts)  # [all questions]
  lines, begin = [], 0
  for split, (file, split_examples) in splits.items():
    absent = [e for e, ok in zip(split_examples, found[begin:begin + len(split_examples)])
              if not ok]
    begin += len(split_examples)
    if not absent:
      continue
    first = "; ".join(f"{e.source}: answers {list(e.answers)}" for e in absent[:3])
    share = 1 - len(absent) / len(split_examples)
    if share < min_answerable:
      raise InputError(
          f"{file}: {len(absent):,} of {len(split_examples):,} {split} questions have no answer "
          f"anywhere in --documents (only {share:.0%} do, less than --min_answerable "
          f"{min_answerable:g}): are these the questions of this corpus? First: {first}")
    lines.append(f"{PROG}: {len(absent):,} of {len(split_examples):,} {split} questions have "
                 f"no answer anywhere in the corpus (no retriever can find one; they count as "
                 f"misses): {first}")
  return lines


def pretraining_verdict(before: dict, after: dict, step: int) -> str:
  """One plain line: did pretraining improve retrieval over the warm start? `before`, `after`:
  the dev recall metrics ({"recall@k": ...}) of the warm start's index and of the index of the
  pretrained checkpoint `step`; improved means higher at a recall cut-off."""
  ks = sorted((k for k in before if k.startswith("recall@")), key=lambda k: int(k[7:]))
  higher = [k for k in ks if after[k] > before[k]]
  figures = ", ".join(f"{k} {before[k]:.3f} -> {after[k]:.3f}" for k in ks)
  if not higher:
    how = "Pretraining did not improve retrieval over the warm start"
  elif len(higher) == len(ks):
    how = "Pretraining improved retrieval over the warm start"
  else:
    how = (f"Pretraining improved retrieval over the warm start at {', '.join(higher)} only")
  return (f"{how}: dev {figures} (the warm start's index -> that of pretraining checkpoint "
          f"{step}).")
