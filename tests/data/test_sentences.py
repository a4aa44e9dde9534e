"""The sentence splitter equals its definition on slices (the rules of the module docstring,
written the direct way, which copies the rest of the line at every candidate boundary) on
random text full of abbreviations, initials, acronyms and long words."""

import itertools
import re

import numpy as np

from realm_jax.data import sentences


def _reference(text):
  """The rules applied to slices: O(n^2) on a long line, obviously right."""
  char_spans = []
  for paragraph in re.finditer(r"[^\n]+", text):
    line, line_start = paragraph.group(), paragraph.start()
    start = 0
    for boundary in re.finditer(r"""([.!?]+)(["'\u2019\u201d)\]]*)(\s+)""", line):
      end, rest = boundary.end(2), line[boundary.end():]
      if not rest or not re.match(r"""["'\u2018\u201c(\[]*[\w\u00c0-\uffff]""", rest):
        continue
      if boundary.group(1) == ".":
        prefix = line[:boundary.start(1)]
        word = re.search(r"(\w+)$", prefix)
        if word and ((len(word.group(1)) == 1 and word.group(1).isalpha())
                     or word.group(1).lower() in sentences.ABBREVIATIONS
                     or re.search(r"(?:\b\w\.)+\w$", prefix)):
          continue
        if rest[0].islower():
          continue
      char_spans.append((line_start + start, line_start + end))
      start = boundary.end()
    char_spans.append((line_start + start, line_start + len(line)))
  offsets = [0, *itertools.accumulate(len(c.encode("utf-8")) for c in text)]
  spans = []
  for start, end in char_spans:
    segment = text[start:end]
    if segment.strip():
      start += len(segment) - len(segment.lstrip())
      spans.append((offsets[start], offsets[start + len(segment.strip())]))
  return spans


PIECES = ["Dr.", "J.", "R.", "U.S.", "e.g.", "approx.", "five", "The", "end.", "Über", "x" * 70,
          "y" * 70 + ".", "a.b.c" + "d" * 66 + ".", "It", "rains!", "(Yes)", "\"Quote.\"",
          "what?", "No.", "\n", "etc.", "Mr", "'s", "1912.", "café.", "Ça"]


def test_equals_the_definition_on_random_text():
  rng = np.random.default_rng(0)
  for _ in range(300):
    words = rng.choice(PIECES, size=rng.integers(1, 60))
    separators = rng.choice([" ", "  ", " \t"], size=len(words))
    text = "".join(w + s for w, s in zip(words, separators))
    assert sentences.split_sentences(text) == _reference(text), text
