"""realm_jax.evaluation.retrieval.answers_in_corpus: whether a question's answer occurs in any
block, in one pass, against `metrics.has_answer` on every (question, block) pair."""

import numpy as np

from realm_jax.data.open_qa import QAExample
from realm_jax.evaluation import metrics
from realm_jax.evaluation import retrieval

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
  found = retrieval.answers_in_corpus(examples, iter(TEXTS))
  expected = [any(metrics.has_answer(text, e.answers,
                                     match="regex" if e.answers_are_regex else "string")
                  for text in TEXTS) for e in examples]
  np.testing.assert_array_equal(found, expected)
  assert found.tolist() == [False, True, True, True, False, True, False, False]
