"""Open-domain QA evaluation: exact match, CuratedTrec regex match, retrieval recall.

REALM reports its open-QA numbers with ORQA's evaluation code (REALM_SPEC items 31-33); the
retrieval recall later papers compare against is DPR's. Both are here: ORQA's answer matching
(re-exported from ``realm_jax.data.answer_match``), DPR's ``SimpleTokenizer`` / ``has_answer``,
``top_k_recall`` and ``format_metrics`` (the summary line of `python -m realm_jax.evaluate`).
The few differences from the authors' code concern inputs ``realm_jax.data.qa_datasets``
already rejects. Design notes: docs/design/training_and_commands.md.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

# ORQA's answer matching lives in the data layer, under the QA tasks that name its metric
# functions (and that may not import the evaluation); it is part of this module's interface too.
from realm_jax.data.answer_match import (REGEX_FLAGS, compile_pattern, curated_trec_regex_match,
                                         exact_match, invalid_patterns, normalize_answer,
                                         orqa_exact_match, reference_list, regex_match)

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

# The k values REALM/ORQA/DPR tables report.
DEFAULT_RECALL_KS = (5, 10, 50, 100)


@functools.cache
def _category_class(prefixes: str) -> str:
  """A regex character class body (no brackets) of every code point whose Unicode general
  category starts with one of ``prefixes``; built once, on first use (~0.3 s). Stands in for
  ``\\p{...}``, which the stdlib ``re`` lacks (``\\w`` leaves out NFD's combining marks)."""
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
  return re.compile(f"({alpha_num})|({non_space})", REGEX_FLAGS)


class SimpleTokenizer:
  """DPR's (originally DrQA's) ``SimpleTokenizer``, with the stdlib ``re`` module: a token is a
  run of letters, digits and combining marks, or any single other character that is neither a
  separator nor a control code point (DPR's ``([\\p{L}\\p{N}\\p{M}]+)|([^\\p{Z}\\p{C}])``)."""

  def tokenize(self, text: str, *, uncased: bool = False) -> list[str]:
    """Splits ``text`` (not normalised here) into DPR tokens, lower-cased if ``uncased``."""
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
          for answer in reference_list(answers, "has_answer")]


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

  "string": the answer's NFD, lower-cased ``SimpleTokenizer`` tokens occur at token boundaries
  in the text's ("art" is not in "party"). "regex" (CuratedTrec): the NFD pattern is
  ``search``-ed, unanchored; one that does not compile is a miss. ``answers``: one string or a
  list. ValueError on an unknown ``match`` or an empty answer list (DPR returns False).
  """
  refs = reference_list(answers, "has_answer")
  text = unicodedata.normalize("NFD", text)
  if match == "string":
    return tokens_have_answer(has_answer_tokens(text, tokenizer), answers_tokens(refs, tokenizer))
  if match == "regex":
    for pattern in refs:
      compiled = compile_pattern(unicodedata.normalize("NFD", pattern))
      if compiled is not None and compiled.search(text) is not None:
        return True
    return False
  raise ValueError(f"has_answer: match must be 'string' or 'regex', got {match!r}")


def top_k_recall(retrieved_has_answer: Any,
                 ks: Sequence[int] = DEFAULT_RECALL_KS) -> dict[str, float]:
  """Top-k retrieval recall (REALM_SPEC item 33): ``{"recall@k": share of questions with an
  answer among their first k blocks}``.

  Args:
    retrieved_has_answer: [num_questions, num_retrieved] bools (or 0/1), columns in rank order.
    ks: the cut-offs; a k above ``num_retrieved`` uses every retrieved block.

  ValueError unless 2-D, non-empty, 0/1, with positive integer ks.
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
  # Rank of the first answer-bearing block; inf when none, so no k ever counts it.
  first_hit = np.where(hits.any(axis=1), hits.argmax(axis=1), np.inf)  # [num_questions]
  result = {}
  for k in ks:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k <= 0:
      raise ValueError(f"top_k_recall: every k must be a positive integer, got {k!r}")
    result[f"recall@{int(k)}"] = float(np.mean(first_hit < k))
  return result


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
