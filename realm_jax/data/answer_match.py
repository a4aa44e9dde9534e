"""Whether a predicted answer matches the references: ORQA's exact match and CuratedTrec's regex
match (REALM_SPEC items 31-32), and the seqio metric functions the QA tasks name.

``exact_match``: ORQA's ``exact_match_score`` (the SQuAD normalisation plus Unicode NFD), maxed
over the references. ``regex_match``: ORQA's CuratedTrec metric, ``re.compile(ref, IGNORECASE |
UNICODE | MULTILINE).match(prediction)`` (anchored at the start, no full match needed; an
invalid pattern is a miss). ``orqa_exact_match`` / ``curated_trec_regex_match`` are the seqio
metric functions; ``answers_are_regex`` reads a task's metric. It sits under the tasks, the
batches and the evaluation (`realm_jax.evaluation.metrics`). Where the authors' code and this
module differ, the function's docstring says so.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["REGEX_FLAGS", "answers_are_regex", "compile_pattern", "curated_trec_regex_match",
           "exact_match", "invalid_patterns", "normalize_answer", "orqa_exact_match",
           "reference_list", "regex_match"]

# ORQA and DPR both compile answer patterns with these flags.
REGEX_FLAGS = re.IGNORECASE | re.UNICODE | re.MULTILINE
_PUNCTUATION = frozenset(string.punctuation)
# ``\b`` is Unicode-aware for str patterns, exactly as in ORQA's (Python 3) code; that includes its
# quirk that a combining mark is not a word character, so NFD "the\u0301" loses its "the".
_ARTICLES = re.compile(r"\b(a|an|the)\b")

# Errors ``re.compile`` can raise on a hostile or broken pattern. DPR catches BaseException; that
# would also swallow KeyboardInterrupt, so only what a bad pattern can cause is caught.
_PATTERN_ERRORS = (re.error, OverflowError, RecursionError, ValueError, TypeError)


def normalize_answer(text: str) -> str:
  """ORQA's answer normalisation (REALM_SPEC item 31).

  In this order: Unicode NFD, lower-case, drop every ASCII punctuation character
  (``string.punctuation``), replace the whole words a/an/the by a space, collapse whitespace.

  Args:
    text: a prediction or a reference answer.

  Returns:
    The normalised string.
  """
  text = unicodedata.normalize("NFD", text)
  text = text.lower()
  text = "".join(ch for ch in text if ch not in _PUNCTUATION)
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def reference_list(references: str | Sequence[str], what: str) -> tuple[str, ...]:
  """Returns ``references`` as a non-empty tuple; a lone string is one reference.

  A bare string is accepted as a single reference because iterating it would silently compare
  the prediction with its characters. `what` names the caller in the errors.
  """
  if isinstance(references, str):
    return (references,)
  refs = tuple(references)
  if not refs:
    # ORQA's ``max`` over an empty list raises too: an example without references cannot be scored.
    raise ValueError(f"{what}: the list of references is empty; every example needs at least one")
  for i, ref in enumerate(refs):
    if not isinstance(ref, str):
      raise TypeError(f"{what}: reference {i} is {type(ref).__name__} {ref!r}, expected str")
  return refs


def exact_match(prediction: str, references: str | Sequence[str]) -> bool:
  """ORQA's exact match: True iff ``normalize_answer(prediction) == normalize_answer(ref)`` for
  some reference (a single string counts as one); no reference is a ValueError, as in ORQA.
  """
  refs = reference_list(references, "exact_match")
  normalized_prediction = normalize_answer(prediction)
  return any(normalized_prediction == normalize_answer(ref) for ref in refs)


def compile_pattern(pattern: str) -> re.Pattern[str] | None:
  """Compiles an answer pattern with ORQA/DPR's flags; None when it is not a valid regex."""
  try:
    return re.compile(pattern, REGEX_FLAGS)
  except _PATTERN_ERRORS:
    return None


def invalid_patterns(patterns: Sequence[str]) -> list[str]:
  """The answer patterns that are not valid regular expressions (each scores as a miss)."""
  return [p for p in patterns if compile_pattern(p) is None]


def regex_match(prediction: str, patterns: str | Sequence[str]) -> bool:
  """ORQA's CuratedTrec metric (REALM_SPEC item 32): True iff some pattern, compiled with
  IGNORECASE | UNICODE | MULTILINE, ``.match``es the raw prediction (anchored at the start,
  trailing text allowed). A pattern that does not compile is a miss, as in ORQA; no pattern at
  all is a ValueError.
  """
  for pattern in reference_list(patterns, "regex_match"):
    compiled = compile_pattern(pattern)
    if compiled is not None and compiled.match(prediction) is not None:
      return True
  return False


def _target_references(target: Any, index: int) -> tuple[str, ...]:
  """The reference strings of one seqio target: a list of strings, one string, or a mapping (or
  QAExample) with ``answers``."""
  if isinstance(target, Mapping):
    if "answers" not in target:
      raise ValueError(
          f"target {index}: a dict target needs an 'answers' field, got keys {sorted(target)}")
    target = target["answers"]
  elif hasattr(target, "answers") and not isinstance(target, (str, bytes)):
    target = target.answers
  if isinstance(target, (str, bytes)):
    target = [target]
  refs = []
  for ref in target:
    refs.append(ref.decode("utf-8") if isinstance(ref, bytes) else ref)
  return reference_list(refs, f"target {index}")


def _prediction_text(prediction: Any, index: int) -> str:
  if isinstance(prediction, bytes):
    return prediction.decode("utf-8")
  if not isinstance(prediction, str):
    raise TypeError(
        f"prediction {index} is {type(prediction).__name__} {prediction!r}, expected str")
  return prediction


def _percent_correct(targets: Sequence[Any], predictions: Sequence[Any], score_fn,
                     name: str) -> dict[str, float]:
  targets = list(targets)
  predictions = list(predictions)
  if len(targets) != len(predictions):
    raise ValueError(
        f"{name}: {len(targets)} targets but {len(predictions)} predictions; they must pair up")
  if not targets:
    raise ValueError(f"{name}: no examples to score")
  correct = sum(
      bool(score_fn(_prediction_text(p, i), _target_references(t, i)))
      for i, (t, p) in enumerate(zip(targets, predictions)))
  return {name: 100.0 * correct / len(targets)}


def orqa_exact_match(targets: Sequence[Any], predictions: Sequence[Any]) -> dict[str, float]:
  """seqio metric function: ORQA exact match, ``{"exact_match": percent in [0, 100]}``.

  `targets`: per example, the reference answers (a list of strings, a string, or a dict or
  ``QAExample`` with ``answers``; bytes decoded as UTF-8); `predictions`: per example, the
  answer string. ValueError when the lengths differ, there is no example, or a target has no
  reference.
  """
  return _percent_correct(targets, predictions, exact_match, "exact_match")


def curated_trec_regex_match(targets: Sequence[Any],
                             predictions: Sequence[Any]) -> dict[str, float]:
  """seqio metric function: ORQA's CuratedTrec regex match, ``{"regex_match": percent}``; its
  targets are reference patterns, in any form ``orqa_exact_match`` accepts, and it raises as
  that does."""
  return _percent_correct(targets, predictions, regex_match, "regex_match")


def answers_are_regex(task: Any) -> bool:
  """Whether a QA task's references are regular expressions (CuratedTrec), from its metric: the
  task (anything with `metric_fns`, a seqio task) scores with `curated_trec_regex_match`."""
  return curated_trec_regex_match in tuple(getattr(task, "metric_fns", ()))
