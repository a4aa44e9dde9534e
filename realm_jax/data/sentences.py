"""Rule-based English sentence splitting with UTF-8 byte offsets.

Blocks are packed from whole sentences and a salient-span query is one sentence (REALM_SPEC 7,
9), so every pipeline needs the same sentence boundaries. The authors' release shipped them
precomputed (`sentence_byte_start/limit`); for other text we split with a small deterministic
rule set instead of a model: a sentence ends at `.`, `!` or `?` (plus closing quotes or
brackets) followed by whitespace and a token that can start a sentence, unless the period
ends a known abbreviation or a single-letter initial; a line break ends a sentence too.
"""

from __future__ import annotations

import re

# Words that end with a period without ending the sentence.
ABBREVIATIONS = frozenset("""
mr mrs ms dr prof sr jr st mt ft gen col lt sgt capt cmdr adm gov sen rep rev hon
vs etc al cf eg ie approx dept est inc ltd co corp no nos vol vols pp fig figs ed eds
jan feb mar apr jun jul aug sep sept oct nov dec ca c b d fl
""".split())

# A candidate boundary: terminal punctuation, optional closing quotes/brackets, whitespace.
_BOUNDARY = re.compile(r"""([.!?]+)(["'\u2019\u201d)\]]*)(\s+)""")
_WORD_START = re.compile(r"\w+")
_STARTS_SENTENCE = re.compile(r"""["'\u2018\u201c(\[]*[\w\u00c0-\uffff]""")
_DOTTED_ACRONYM = re.compile(r"(?:\b\w\.)+\w$")
_LINES = re.compile(r"[^\n]+")
_LOOK_BACK = 64  # characters before a period that can decide whether it ends a sentence


def _ends_with_abbreviation(line: str, period: int) -> bool:
  """Whether `line[:period]`, the text before a period, ends in an abbreviation or an initial
  ("J. R. R.").

  Only the last _LOOK_BACK characters are searched (`\b` still sees the character before
  them), so a line of n characters is split in O(n), not O(n^2): the word before the period
  decides unless it is longer than any abbreviation, and a dotted acronym needs only its last
  letter-period-letter.
  """
  window = max(0, period - _LOOK_BACK)
  # The word before the period, read backwards: one match instead of a search that tries
  # every start in the window.
  match = _WORD_START.match(line[window:period][::-1])
  if not match:
    return False
  word = match.group()[::-1]
  if len(word) == 1 and word.isalpha():
    return True
  if word.lower() in ABBREVIATIONS:
    return True
  # Dotted acronyms such as "U.S." or "e.g.": their last word before the period is one
  # character (a period precedes it), so a longer word needs no search.
  return len(word) == 1 and bool(_DOTTED_ACRONYM.search(line, window, period))


def split_sentences(text: str) -> list[tuple[int, int]]:
  """Sentence spans of `text`.

  Args:
    text: raw text.

  Returns:
    [(byte_start, byte_limit)] into `text.encode("utf-8")`, in order, each without leading or
    trailing whitespace; empty for text with no non-space characters.
  """
  char_spans = []
  for paragraph in _LINES.finditer(text):
    line, line_start = paragraph.group(), paragraph.start()
    start = 0
    for boundary in _BOUNDARY.finditer(line):
      end = boundary.end(2)  # after the punctuation and closing quotes
      rest = boundary.end()  # where the next sentence would start (no copy of the rest)
      if rest == len(line) or not _STARTS_SENTENCE.match(line, rest):
        continue
      if boundary.group(1) == ".":
        # Lower-case continuation after a period is rarely a new sentence ("approx. five").
        if line[rest].islower() or _ends_with_abbreviation(line, boundary.start(1)):
          continue
      char_spans.append((line_start + start, line_start + end))
      start = boundary.end()
    char_spans.append((line_start + start, line_start + len(line)))

  spans = []
  ascii_only = text.isascii()  # character offsets are byte offsets
  char, byte = 0, 0  # a character offset and its byte offset; spans come in order
  for start, end in char_spans:
    segment = text[start:end]
    stripped = segment.strip()
    if not stripped:
      continue
    start += len(segment) - len(segment.lstrip())
    end = start + len(stripped)
    if ascii_only:
      spans.append((start, end))
      continue
    # Bytes counted by encoding each stretch once (not character by character).
    byte += len(text[char:start].encode("utf-8"))
    byte_start = byte
    byte += len(stripped.encode("utf-8"))
    char = end
    spans.append((byte_start, byte))
  return spans
