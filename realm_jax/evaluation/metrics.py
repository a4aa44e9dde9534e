"""Open-domain QA evaluation: exact match, CuratedTrec regex match, retrieval recall.

REALM reports its open-QA numbers with ORQA's evaluation code (REALM_SPEC items 31-33); the
retrieval recall that later papers compare against is DPR's. Both are reproduced here:

* ``normalize_answer`` / ``exact_match`` / ``regex_match`` and the seqio metric functions
  ``orqa_exact_match`` / ``curated_trec_regex_match``: ORQA's answer matching, from
  ``realm_jax.data.answer_match`` (the QA tasks name those metric functions, so they live under
  both the tasks and this module).
* ``SimpleTokenizer`` / ``has_answer``: DPR's ``qa_validation.has_answer``. In "string" mode the
  text and each answer are NFD-normalised, tokenised and lower-cased, and the answer's token
  sequence is looked for in the text's; in "regex" mode the pattern is ``search``-ed (not
  ``match``-ed) in the NFD text.
* ``top_k_recall``: share of questions with an answer-bearing block among the first k retrieved.
* ``format_metrics``: a metrics dict as the one summary line `python -m realm_jax.evaluate`
  prints.

Where the authors' code and this module differ, the function's docstring says so; every
difference concerns inputs the data loaders in ``realm_jax.data.qa_datasets`` already reject (empty
reference lists, answers without a single token).
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
  return re.compile(f"({alpha_num})|({non_space})", REGEX_FLAGS)


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

  "string": NFD-normalise the text and each answer, tokenise both with ``SimpleTokenizer``,
  lower-case, and look for the answer's token sequence at token boundaries in the text (so "art"
  is not found in "party"). "regex": NFD-normalise the text and each pattern and ``search`` the
  text (unanchored, unlike ORQA's ``regex_match``) with IGNORECASE | UNICODE | MULTILINE; a pattern
  that does not compile is a miss.

  Differences from DPR, both for inputs ``realm_jax.data.qa_datasets`` rejects anyway: an empty
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
