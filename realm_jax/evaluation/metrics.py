"""Open-domain QA evaluation: exact match, CuratedTrec regex match, retrieval recall.

REALM reports its open-QA numbers with ORQA's evaluation code (REALM_SPEC items 31-33); the
retrieval recall that later papers compare against is DPR's. Both are reproduced here:

* ``normalize_answer`` / ``exact_match``: ORQA's ``eval_utils.normalize_answer`` and
  ``exact_match_score`` (the SQuAD normalisation plus Unicode NFD), maxed over the references.
* ``regex_match``: ORQA's CuratedTrec metric, ``re.compile(ref, IGNORECASE | UNICODE |
  MULTILINE).match(prediction)`` on the raw prediction. ``.match`` anchors at the start of the
  prediction but does not require a full match; an invalid pattern is a miss.
* ``SimpleTokenizer`` / ``has_answer``: DPR's ``qa_validation.has_answer``. In "string" mode the
  text and each answer are NFD-normalised, tokenised and lower-cased, and the answer's token
  sequence is looked for in the text's; in "regex" mode the pattern is ``search``-ed (not
  ``match``-ed) in the NFD text.
* ``top_k_recall``: share of questions with an answer-bearing block among the first k retrieved.
* ``orqa_exact_match`` / ``curated_trec_regex_match``: seqio metric functions
  ``metric_fn(targets, predictions) -> {name: percent}``.
* ``format_metrics``: a metrics dict as the one summary line `python -m realm_jax.evaluate`
  prints.

Where the authors' code and this module differ, the function's docstring says so; every
difference concerns inputs the data loaders in ``realm_jax.data.open_qa`` already reject (empty
reference lists, answers without a single token).
"""

from __future__ import annotations

import functools
import re
import string
import sys
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

__all__ = [
    "DEFAULT_RECALL_KS",
    "SimpleTokenizer",
    "answers_tokens",
    "curated_trec_regex_match",
    "exact_match",
    "format_metrics",
    "has_answer",
    "has_answer_tokens",
    "invalid_patterns",
    "normalize_answer",
    "orqa_exact_match",
    "regex_match",
    "tokens_have_answer",
    "top_k_recall",
]

# ORQA and DPR both compile answer patterns with these flags.
_REGEX_FLAGS = re.IGNORECASE | re.UNICODE | re.MULTILINE
_PUNCTUATION = frozenset(string.punctuation)
# ``\b`` is Unicode-aware for str patterns, exactly as in ORQA's (Python 3) code; that includes its
# quirk that a combining mark is not a word character, so NFD "the\u0301" loses its "the".
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# The k values REALM/ORQA/DPR tables report.
DEFAULT_RECALL_KS = (5, 10, 50, 100)

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


def _as_reference_list(references: str | Sequence[str], what: str) -> tuple[str, ...]:
  """Returns ``references`` as a non-empty tuple; a lone string is one reference.

  A bare string is accepted as a single reference because iterating it would silently compare
  the prediction with its characters.
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
  """ORQA's exact match: any reference equals the prediction after ``normalize_answer``.

  Args:
    prediction: the predicted answer string.
    references: the reference answers (a single string counts as one reference).

  Returns:
    True iff ``normalize_answer(prediction) == normalize_answer(ref)`` for some reference.

  Raises:
    ValueError: ``references`` is empty (ORQA raises on it as well).
  """
  refs = _as_reference_list(references, "exact_match")
  normalized_prediction = normalize_answer(prediction)
  return any(normalized_prediction == normalize_answer(ref) for ref in refs)


def _compile_or_none(pattern: str) -> re.Pattern[str] | None:
  """Compiles an answer pattern with ORQA/DPR's flags; None when it is not a valid regex."""
  try:
    return re.compile(pattern, _REGEX_FLAGS)
  except _PATTERN_ERRORS:
    return None


def invalid_patterns(patterns: Sequence[str]) -> list[str]:
  """The answer patterns that are not valid regular expressions (each scores as a miss)."""
  return [p for p in patterns if _compile_or_none(p) is None]


def regex_match(prediction: str, patterns: str | Sequence[str]) -> bool:
  """ORQA's CuratedTrec metric (REALM_SPEC item 32).

  Each pattern is compiled with IGNORECASE | UNICODE | MULTILINE and applied with ``.match`` to
  the raw (un-normalised) prediction: anchored at the start, but trailing text after the match is
  allowed. A pattern that does not compile counts as a miss, as in ORQA.

  Args:
    prediction: the predicted answer string.
    patterns: the reference regular expressions (a single string counts as one pattern).

  Returns:
    True iff some pattern matches at the start of the prediction.

  Raises:
    ValueError: ``patterns`` is empty.
  """
  for pattern in _as_reference_list(patterns, "regex_match"):
    compiled = _compile_or_none(pattern)
    if compiled is not None and compiled.match(prediction) is not None:
      return True
  return False


@functools.cache
def _category_class(prefixes: str) -> str:
  """A regex character class body (no brackets) of every code point whose Unicode general
  category starts with one of ``prefixes``; built once, on first use (~0.3 s).

  The stdlib ``re`` has no ``\\p{...}`` classes, so DPR's ``[\\p{L}\\p{N}\\p{M}]`` is spelled out
  as explicit ranges from ``unicodedata``. ``\\w`` would not do: it leaves out combining marks
  (category M), which NFD produces for every accented letter, so "Cafe\\u0301" would split in two.
  """
  ranges = []
  start = None
  for code_point in range(sys.maxunicode + 2):
    inside = (code_point <= sys.maxunicode
              and unicodedata.category(chr(code_point))[0] in prefixes)
    if inside and start is None:
      start = code_point
    elif not inside and start is not None:
      ranges.append((start, code_point - 1))
      start = None
  # \UXXXXXXXX escapes keep "]", "^", "-" and "\" from ever appearing literally in the class.
  return "".join(
      f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in ranges)


@functools.cache
def _simple_tokenizer_regex() -> re.Pattern[str]:
  alpha_num = f"[{_category_class('LNM')}]+"  # DPR: [\p{L}\p{N}\p{M}]+
  non_space = f"[^{_category_class('ZC')}]"  # DPR: [^\p{Z}\p{C}]
  return re.compile(f"({alpha_num})|({non_space})", _REGEX_FLAGS)


class SimpleTokenizer:
  """DPR's (originally DrQA's) ``SimpleTokenizer``, with the stdlib ``re`` module.

  A token is a maximal run of letters, digits and combining marks (Unicode categories L*, N*,
  M*), or any single other character that is neither a separator (Z*) nor a control/format/
  unassigned code point (C*). DPR writes this with the third-party ``regex`` module as
  ``([\\p{L}\\p{N}\\p{M}]+)|([^\\p{Z}\\p{C}])``; here the same classes are enumerated from
  Python's ``unicodedata``. The only possible difference is in code points that one Unicode
  version assigns and the other does not.
  """

  def tokenize(self, text: str, *, uncased: bool = False) -> list[str]:
    """Splits ``text`` into DPR tokens.

    Args:
      text: the text to split (not normalised here; ``has_answer`` applies NFD first).
      uncased: lower-case every token, as DPR's ``Tokens.words(uncased=True)``.

    Returns:
      The tokens, in order.
    """
    tokens = [m.group() for m in _simple_tokenizer_regex().finditer(text)]
    if uncased:
      tokens = [token.lower() for token in tokens]
    return tokens


_DEFAULT_TOKENIZER = SimpleTokenizer()


def _contains_sequence(haystack: Sequence[str], needle: Sequence[str]) -> bool:
  width, first, needle = len(needle), needle[0], list(needle)
  # Only positions that start with the needle's first token are compared whole (as lists, so
  # that a tuple and a list of the same tokens are equal).
  return any(list(haystack[i:i + width]) == needle
             for i in range(len(haystack) - width + 1) if haystack[i] == first)


def has_answer_tokens(text: str, tokenizer: SimpleTokenizer | None = None) -> list[str]:
  """The tokens ``has_answer`` compares in "string" mode: ``text`` NFD-normalised, split by
  ``SimpleTokenizer`` (DPR's by default) and lower-cased."""
  tokenizer = tokenizer or _DEFAULT_TOKENIZER
  return tokenizer.tokenize(unicodedata.normalize("NFD", text), uncased=True)


def answers_tokens(answers: str | Sequence[str],
                   tokenizer: SimpleTokenizer | None = None) -> list[list[str]]:
  """Each answer's ``has_answer_tokens`` (for ``tokens_have_answer``); an empty answer list
  raises, as in ``has_answer``."""
  return [has_answer_tokens(answer, tokenizer)
          for answer in _as_reference_list(answers, "has_answer")]


def tokens_have_answer(text_tokens: Sequence[str],
                       answers_tokens: Sequence[Sequence[str]]) -> bool:
  """``has_answer`` in "string" mode on a text and answers already split by
  ``has_answer_tokens``: whether one answer's tokens occur in ``text_tokens`` as a contiguous
  sequence (an answer without tokens matches nothing). For texts and answers compared many times
  (retrieved blocks against questions), tokenise each once and call this."""
  return any(answer_tokens and _contains_sequence(text_tokens, answer_tokens)
             for answer_tokens in answers_tokens)


def has_answer(text: str,
               answers: str | Sequence[str],
               *,
               match: Literal["string", "regex"] = "string",
               tokenizer: SimpleTokenizer | None = None) -> bool:
  """DPR's ``has_answer``: does a retrieved text contain one of the answers?

  "string": NFD-normalise the text and each answer, tokenise both with ``SimpleTokenizer``,
  lower-case, and look for the answer's token sequence at token boundaries in the text (so "art"
  is not found in "party"). "regex": NFD-normalise the text and each pattern and ``search`` the
  text (unanchored, unlike ORQA's ``regex_match``) with IGNORECASE | UNICODE | MULTILINE; a pattern
  that does not compile is a miss.

  Differences from DPR, both for inputs ``realm_jax.data.open_qa`` rejects anyway: an empty
  answer list raises instead of returning False, and an answer that yields no tokens (empty, or
  only whitespace/control characters) matches nothing, whereas DPR's loop matches it everywhere.

  Args:
    text: the retrieved block or passage.
    answers: the reference answers or patterns (a single string counts as one answer).
    match: "string" or "regex" (CuratedTrec).
    tokenizer: the tokenizer for "string" mode; DPR's ``SimpleTokenizer`` by default.

  Returns:
    True iff some answer occurs in the text.

  Raises:
    ValueError: unknown ``match`` or an empty answer list.
  """
  refs = _as_reference_list(answers, "has_answer")
  text = unicodedata.normalize("NFD", text)
  if match == "string":
    return tokens_have_answer(has_answer_tokens(text, tokenizer), answers_tokens(refs, tokenizer))
  if match == "regex":
    for pattern in refs:
      compiled = _compile_or_none(unicodedata.normalize("NFD", pattern))
      if compiled is not None and compiled.search(text) is not None:
        return True
    return False
  raise ValueError(f"has_answer: match must be 'string' or 'regex', got {match!r}")


def top_k_recall(retrieved_has_answer: Any,
                 ks: Sequence[int] = DEFAULT_RECALL_KS) -> dict[str, float]:
  """Top-k retrieval recall (REALM_SPEC item 33).

  Args:
    retrieved_has_answer: ``[num_questions, num_retrieved]`` booleans (or 0/1 integers); entry
      ``[q, r]`` says whether the r-th retrieved block for question q contains an answer.
      Columns are in rank order.
    ks: the cut-offs. A k larger than ``num_retrieved`` uses every retrieved block.

  Returns:
    ``{"recall@k": fraction}`` for each k: the share (0..1) of questions with an answer among
    their first k blocks.

  Raises:
    ValueError: the input is not 2-D, has no questions, holds values other than 0/1, or a k is
      not a positive integer.
  """
  hits = np.asarray(retrieved_has_answer)
  if hits.ndim != 2:
    raise ValueError(
        f"top_k_recall: expected [num_questions, num_retrieved], got shape {hits.shape}")
  if hits.shape[0] == 0:
    raise ValueError("top_k_recall: no questions (shape[0] == 0); recall is undefined")
  if hits.dtype != np.bool_:
    if not (np.issubdtype(hits.dtype, np.integer) and np.isin(hits, (0, 1)).all()):
      raise ValueError(
          f"top_k_recall: expected booleans or 0/1 integers, got dtype {hits.dtype}")
    hits = hits.astype(np.bool_)
  # first_hit[q] = rank of the first answer-bearing block; infinity when there is none, so that
  # a k beyond num_retrieved never counts a question without a hit.
  first_hit = np.where(hits.any(axis=1), hits.argmax(axis=1), np.inf)  # [num_questions]
  result = {}
  for k in ks:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k <= 0:
      raise ValueError(f"top_k_recall: every k must be a positive integer, got {k!r}")
    result[f"recall@{int(k)}"] = float(np.mean(first_hit < k))
  return result


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
  return _as_reference_list(refs, f"target {index}")


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
  """seqio metric function: ORQA exact match, in percent.

  Args:
    targets: per example, the reference answers: a list of strings, a single string, or a dict
      (or ``QAExample``) with ``answers``. Bytes are decoded as UTF-8.
    predictions: per example, the predicted answer string.

  Returns:
    ``{"exact_match": percent in [0, 100]}``.

  Raises:
    ValueError: the lengths differ, there are no examples, or a target has no references.
  """
  return _percent_correct(targets, predictions, exact_match, "exact_match")


def curated_trec_regex_match(targets: Sequence[Any],
                             predictions: Sequence[Any]) -> dict[str, float]:
  """seqio metric function: ORQA's CuratedTrec regex match (``regex_match``), in percent.

  Args:
    targets: per example, the reference patterns, in any form ``orqa_exact_match`` accepts.
    predictions: per example, the predicted answer string.

  Returns:
    ``{"regex_match": percent in [0, 100]}``.

  Raises:
    ValueError: the lengths differ, there are no examples, or a target has no patterns.
  """
  return _percent_correct(targets, predictions, regex_match, "regex_match")


def format_metrics(metrics: dict) -> str:
  """'exact_match 0.1250, recall@5 0.5000, ..., num_questions 8, skipped 0' (fractions with 4
  decimals, counts as integers; chance@k shown next to its recall@k)."""
  parts = []
  for name, value in metrics.items():
    if name.startswith("chance@"):
      continue
    if name == "skipped_questions":
      parts.append(f"skipped {int(value)}")
    elif isinstance(value, int):
      parts.append(f"{name} {value}")
    else:
      chance = metrics.get(name.replace("recall@", "chance@")) if "recall@" in name else None
      parts.append(f"{name} {value:.4f}"
                   + (f" (chance {chance:.4f})" if chance is not None else ""))
  return ", ".join(parts)
