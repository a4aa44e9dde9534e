"""bench/text_statistics.py: what a masked query hits, counted by hand on one record."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import text_statistics  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.data import masking  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.data.vocab import default_vocabulary  # noqa: E402  pylint: disable=wrong-import-position

# "Zoe Tessavar was born in 1843." Bytes: "Tessavar" 4..12 (tessa ##var), "1843" 25..29.
TEXT = "Zoe Tessavar was born in 1843."
RECORD = {"title": "Zoe", "text": TEXT, "sentence_byte_start": [0],
          "sentence_byte_limit": [len(TEXT)], "span_byte_start": [4, 25],
          "span_byte_limit": [12, 29]}


def query(masked):
  """A MaskedQuery of RECORD's sentence (zoe tessa ##var was born in 1843 .) masking the
  sentence wordpiece indices `masked`."""
  n = len(masked)
  positions = np.zeros([10], np.int32)
  positions[:n] = [1 + i for i in masked]
  weights = np.zeros([10], np.float32)
  weights[:n] = 1
  return masking.MaskedQuery(query_ids=np.zeros([16], np.int32),
                             query_mask=np.zeros([16], np.int32), mlm_positions=positions,
                             mlm_targets=np.zeros([10], np.int32), mlm_weights=weights,
                             source_uid=np.uint64(0), span_byte_start=-1, span_byte_limit=-1,
                             sentence_index=0)


def test_mask_hits_counts_by_hand():
  vocab = default_vocabulary()
  hits = text_statistics.MaskHits()
  # "tessa" masked, "##var" visible: salient and partly visible; "was": not salient.
  hits.add(RECORD, query([1, 3]), vocab.tokenize_with_offsets)
  # "tessa ##var" masked whole, and "1843" (a one-piece span): both salient, neither visible.
  hits.add(RECORD, query([1, 2, 6]), vocab.tokenize_with_offsets)
  # "born": no salient mask in this query.
  hits.add(RECORD, query([4]), vocab.tokenize_with_offsets)
  assert (hits.queries, hits.masks, hits.salient_masks, hits.queries_with_salient_mask,
          hits.partly_visible) == (3, 6, 4, 2, 1)
  table = text_statistics.hits_table({"by hand": hits})
  assert "| by hand | 3 | 2.00 | 66.7% | 66.7% | 25.0% |" in table


def test_mask_hits_draws_one_query_per_record_and_skips_none_here():
  rows = text_statistics.mask_hits([RECORD] * 4, {"salient": "salient_span"})
  # Salient-span masking masks one whole span: every query hits, no span partly visible.
  h = rows["salient"]
  assert (h.queries, h.queries_with_salient_mask, h.partly_visible) == (4, 4, 0)
  assert h.salient_masks == h.masks
