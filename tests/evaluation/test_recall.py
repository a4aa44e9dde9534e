"""realm_jax.evaluation.recall: `answers_in_corpus` (whether a question's answer occurs in any
block, in one pass) and `answer_hits` (each retrieved block, each block tokenised once), against
`metrics.has_answer` on every (question, block) pair."""

import numpy as np

from realm_jax.data.qa_datasets import QAExample
from realm_jax.evaluation import metrics
from realm_jax.evaluation import recall

TEXTS = ["The party was in Paris, France.", "Caf\u00e9 de Flore opened in 1887.",
         "heapq.heappush(heap, item): Push item onto heap."]


def test_answers_in_corpus_is_has_answer_over_every_block():
  examples = [QAExample("q", ("art",)),  # inside "party": not at token boundaries
              QAExample("q", ("paris, FRANCE",)),  # its punctuation is a token too; any case
              QAExample("q", ("Cafe\u0301 de flore",)),  # NFD and lower case
              QAExample("q", ("nowhere", "heappush")),  # the second answer counts
              QAExample("q", ("1887 heapq",)),  # across two blocks: no
              QAExample("q", (r"\d{4}",), answers_are_regex=True),
              QAExample("q", (r"^Push",), answers_are_regex=True),  # not at a line start
              QAExample("q", ("[unclosed",), answers_are_regex=True)]  # does not compile: a miss
  found = recall.answers_in_corpus(examples, iter(TEXTS))
  expected = [any(metrics.has_answer(text, e.answers,
                                     match="regex" if e.answers_are_regex else "string")
                  for text in TEXTS) for e in examples]
  np.testing.assert_array_equal(found, expected)
  assert found.tolist() == [False, True, True, True, False, True, False, False]


class _Store:
  """The one BlockStore method `answer_hits` reads."""

  def __init__(self, texts):
    self.texts = texts
    self.bodies_read = 0

  def body(self, block_id):
    self.bodies_read += 1
    return self.texts[block_id]


def test_answer_hits_is_has_answer_on_each_retrieved_block():
  examples = [QAExample("q", ("art",)), QAExample("q", ("paris, FRANCE",)),
              QAExample("q", ("nowhere", "heappush")),
              QAExample("q", (r"\d{4}",), answers_are_regex=True)]
  ids = np.array([[0, 1, 2], [0, -1, 0], [2, 2, 1], [1, 0, -1]])  # -1: no result
  store = _Store(TEXTS)
  hits = recall.answer_hits(ids, examples, store)
  expected = [[block_id >= 0 and metrics.has_answer(
      TEXTS[block_id], e.answers, match="regex" if e.answers_are_regex else "string")
               for block_id in row] for e, row in zip(examples, ids)]
  np.testing.assert_array_equal(hits, expected)
  assert hits.tolist() == [[False, False, False],  # "art" only inside "party"
                           [True, False, True],
                           [True, True, False],  # "heappush" in block 2, retrieved twice
                           [True, False, False]]  # 1887 in block 1
  # Plain answers read each block once; the regex row reads its two blocks again.
  assert store.bodies_read == 3 + 2
  # answers_are_regex=True treats every answer as a pattern: "art" is found inside "party".
  assert recall.answer_hits(ids[:1], examples[:1], _Store(TEXTS), True).tolist() == [
      [True, False, False]]
