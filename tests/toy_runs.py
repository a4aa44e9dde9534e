"""What the end-to-end fine-tuning tests start from (tests/test_fid_finetune_run.py,
test_closed_book_run.py, test_atlas_pretext_run.py): the toy model's sizes, a BlockStore of the
toy world's first documents and an untrained pretraining checkpoint."""

import os

import jax

from realm_jax import checkpoints
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.data import toy_world
from realm_jax.models import config as config_lib
from realm_jax.models import realm

# = gin_configs/models/toy.gin's sizes (what toy_finetune_fid.gin includes).
TINY = config_lib.RealmConfig(
    bert=config_lib.tiny_bert(hidden_size=128, num_heads=2, intermediate_size=512),
    span_hidden_size=64, retriever_pooling="mean")


def pretraining_start(root) -> tuple[str, str, dict]:
  """(the BlockStore directory of the toy world's first 40 documents, an untrained TINY
  pretraining checkpoint's step directory, its parameters), under `root`."""
  store_dir = str(root / "blocks")
  source = sources_lib.JsonlSource(os.path.join(toy_world.toy_world_dir(), toy_world.CORPUS_FILE))
  corpus_build.build_block_store(source, store_dir, limit=40, max_block_len=128)
  params = realm.RealmPretrainModel(TINY).init(jax.random.PRNGKey(0))
  init = checkpoints.save_checkpoint(str(root / "pretrain"), 1, params, config=TINY)
  return store_dir, init, params
