"""Parity with the transformers REALM port (REALM_SPEC 1-6, 16, 28): random weights, fp32.

The reference is transformers==4.46.3's `models/deprecated/realm`, run on the same inputs; the
checkpoints go through our importer from files on disk (safetensors and pytorch_model.bin).
"""

import pytest

from realm_jax.convert import parity

TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=["tiny", "base"])
def result(request):
  return parity.run(request.param)


def test_every_quantity_within_tolerance(result):
  expected = {"embedder/projected", "scorer/relevance_tied", "scorer/relevance_untied",
              "encoder/logits_at_masks", "encoder/marginal_loss", "reader/span_logits",
              "reader/retriever_loss", "reader/reader_loss"}
  assert set(result.max_abs_diff) == expected
  too_far = {k: v for k, v in result.max_abs_diff.items() if not v <= TOLERANCE}
  assert not too_far, f"{result.size}: differences above {TOLERANCE}: {too_far}"


def test_reader_predicts_the_same_block_and_span(result):
  assert result.predictions_equal
