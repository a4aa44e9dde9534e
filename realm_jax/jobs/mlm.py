"""`mlm`: masked language modelling of the encoder, a stand-in for BERT where there is none.

REALM starts its encoder and its retriever from BERT; at paper scale convert BERT with
`python -m realm_jax.convert.hf`. On the toy world this job trains the toy BERT
(docs/toy_bert.md), continuing from `init_checkpoint`'s encoder when one is given (its second
and third phases).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import gin

from realm_jax.jobs.base import RunContext, SeqioJob, require


@gin.configurable
@dataclasses.dataclass
class MlmJob(SeqioJob):
  """BertMlmModel on an `mlm_<corpus>` task."""

  name = "mlm"
  feature_keys = "BLOCK_MLM_KEYS"
  warm_start_bert_only = True

  def build_model(self, ctx: RunContext) -> Any:
    from realm_jax.models import realm  # pylint: disable=g-import-not-at-top
    return realm.BertMlmModel(ctx.model_config)

  def warm_start(self, checkpoint: Mapping[str, Any], params: dict, source: str
                 ) -> tuple[dict, str]:
    """The encoder (BERT and its MLM head) of a converted BERT or an mlm checkpoint."""
    encoder = require(checkpoint, "encoder", "init_checkpoint", source,
                      "; continued masked language modelling needs one")
    return {**params, "encoder": encoder}, "encoder (BERT and MLM head)"
