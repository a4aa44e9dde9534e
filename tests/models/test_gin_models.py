"""gin_configs/models/*.gin parse and build the named model sizes."""

import os

import gin
import jax
import numpy as np
import pytest

from realm_jax.models.config import RealmConfig
from realm_jax.models.retriever import RealmRetriever

GIN_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "gin_configs", "models")
SHAPES = {  # size: (layers, hidden, heads, intermediate)
    "tiny": (2, 32, 4, 64),
    "small": (4, 256, 4, 1024),
    "base": (12, 768, 12, 3072),
}


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _model_config(size, bindings=()):
  gin.parse_config_files_and_bindings([os.path.join(GIN_DIR, f"{size}.gin")], list(bindings))
  return gin.query_parameter("%MODEL_CONFIG").scoped_configurable_fn()


@pytest.mark.parametrize("size", sorted(SHAPES))
def test_model_gin_builds_its_size(size):
  config = _model_config(size)
  assert isinstance(config, RealmConfig)
  bert = config.bert
  assert (bert.num_layers, bert.hidden_size, bert.num_heads, bert.intermediate_size) == \
      SHAPES[size]
  assert bert.vocab_size == 30522 and config.proj_size == 128 and config.share_embedders
  # Shapes only (no allocation): the retriever builds at this size.
  q = np.zeros((1, 8), np.int32)
  c = np.zeros((1, 2, 8), np.int32)
  shapes = jax.eval_shape(lambda: RealmRetriever(config).init(jax.random.PRNGKey(0), q, q, q,
                                                              c, c, c))
  word = shapes["params"]["embedder"]["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert word.value.shape == (30522, SHAPES[size][1])


def test_overrides_on_the_command_line_reach_the_config():
  config = _model_config("base", ["model_config.base_bert.dtype = 'bfloat16'",
                                  "model_config.RealmConfig.share_embedders = False"])
  assert config.bert.dtype == "bfloat16" and not config.share_embedders
