"""The BERT a recipe starts from: `--bert` checked (its weights, its config.json, its
vocabulary), its shape as the gin bindings that size every tower, and one line describing it."""

from __future__ import annotations

import os
from typing import Any, Optional

from realm_jax import gin_utils

# A BERT wider x deeper than the toy model's (hidden 128, 2 layers): the recipe runs its
# trainings one after the other and keeps glibc's malloc defaults (docs/own_corpus.md).
TOY_BERT_WIDTH_X_LAYERS = 128 * 2


def bert_config(directory: str):
  """The BertConfig of a transformers BERT directory (its config.json)."""
  from realm_jax.convert import hf  # pylint: disable=g-import-not-at-top
  return hf.bert_config_from_hf(hf.read_config(directory))


def larger_than_toy(directory: Optional[str]) -> bool:
  """Whether the BERT in `directory` is larger (width x layers) than the toy model."""
  if directory is None:
    return False
  config = bert_config(directory)
  return config.hidden_size * config.num_layers > TOY_BERT_WIDTH_X_LAYERS


# The BertConfig fields that decide the shape of the towers a BERT warm-starts.
BERT_SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "hidden_act", "max_position_embeddings", "type_vocab_size", "layer_norm_eps")


def bert_shape_bindings(directory: Optional[str]) -> tuple[tuple[str, Any], ...]:
  """Gin bindings ((name, value) pairs) that give every tower the shape of the BERT in
  `directory` (its config.json), so that a BERT of any size (the toy BERT, all-MiniLM-L6-v2,
  BERT-base) warm-starts the toy gins' model; () for random weights (the toy model's shape).
  Dropout stays the toy model's."""
  if directory is None:
    return ()
  config = bert_config(directory)
  return tuple((f"model_config.tiny_bert.{field}", getattr(config, field))
               for field in BERT_SHAPE_FIELDS)


def describe_bert(directory: Optional[str], ict_from_bert: bool) -> str:
  """One line on the BERT a run started from: its directory and shape, and what it started."""
  if directory is None:
    return "none (every tower from random weights of the toy model's shape)"
  config = bert_config(directory)
  towers = ("the retriever (ICT's towers), the encoder and the readers" if ict_from_bert
            else "the encoder and the readers; ICT's towers from random weights")
  return (f"{directory} (hidden {config.hidden_size}, {config.num_layers} layers, "
          f"{config.num_heads} heads, intermediate {config.intermediate_size}): {towers}")


def toy_bert_dir(choice: str, world: str = "toy") -> Optional[str]:
  """`--bert`: 'shipped' (the world's: realm_jax/data/assets/toy_bert, or wiki_bert for the
  wiki world), 'none' (None: random weights) or a transformers BERT directory
  (BertForMaskedLM, or BertModel, whose MLM head then starts fresh); ValueError when it has no
  weights, an unreadable config.json, or another WordPiece vocabulary than the one the corpus
  is tokenised with."""
  from realm_jax import toy_bert  # pylint: disable=g-import-not-at-top
  from realm_jax.data import vocab  # pylint: disable=g-import-not-at-top
  directory = {"shipped": toy_bert.SHIPPED_DIRS[world], "none": None}.get(choice, choice)
  if directory is None:
    return None
  if not os.path.isfile(os.path.join(directory, "model.safetensors")):
    raise ValueError(f"--bert {choice}: no model.safetensors in {directory}")
  sha256 = toy_bert.weights_sha256(directory) if choice == "shipped" else None
  expected = toy_bert.shipped_sha256(world)
  if sha256 is not None and sha256 != expected:
    raise ValueError(f"--bert shipped: {directory}/model.safetensors has sha256 {sha256}, "
                     f"not the shipped {expected} (docs/{toy_bert.DOCS[world]}); a partial "
                     f"checkout? `python -m realm_jax.toy_bert --world {world}` rebuilds it")
  try:
    bert_config(directory)
  except (OSError, ValueError, KeyError) as e:
    raise ValueError(f"--bert {choice}: {gin_utils.one_line(e)}"
                     + (" missing from its config.json" if isinstance(e, KeyError) else "")
                     ) from e
  vocab_file = os.path.join(directory, "vocab.txt")
  if os.path.isfile(vocab_file):
    with open(vocab_file, encoding="utf-8") as theirs, open(
        vocab.bundled_vocab_path(), encoding="utf-8") as ours:
      if theirs.read().split() != ours.read().split():
        raise ValueError(f"--bert {choice}: {vocab_file} is not the BERT uncased WordPiece "
                         f"vocabulary the corpus is tokenised with ({vocab.bundled_vocab_path()}"
                         f"): the blocks' ids would mean other wordpieces to this BERT")
  return directory
