"""A run on your data resumes from another checkout: `--bert` is the same BERT when its weights
are, wherever its directory lies; other weights or other flags are refused."""

import json
import os
import shutil

import pytest

import realm_jax
from realm_jax.pipeline import recipes

# The shipped toy BERT's config: a recipe reads the BERT's shape when it is built.
TOY_BERT_CONFIG = os.path.join(os.path.dirname(realm_jax.__file__), "data", "assets", "toy_bert",
                               "config.json")


def _bert_dir(root, name: str, weights: bytes) -> str:
  directory = os.path.join(root, name)
  os.makedirs(directory)
  shutil.copy(TOY_BERT_CONFIG, directory)
  with open(os.path.join(directory, "model.safetensors"), "wb") as f:
    f.write(weights)
  return directory


def _recipe(out: str, bert: str) -> recipes.OwnDataRecipe:
  return recipes.OwnDataRecipe(out, documents="/data/docs.jsonl", questions="/data/qa",
                               toy_bert=bert)


def _record(recipe: recipes.OwnDataRecipe, **changes) -> None:
  with open(os.path.join(recipe.out, "own_data.json"), "w", encoding="utf-8") as f:
    json.dump({"arguments": {**recipe.arguments, **changes}}, f)


def test_a_moved_bert_with_the_same_weights_resumes(tmp_path):
  then = _bert_dir(tmp_path, "checkout_a", b"weights")
  now = _bert_dir(tmp_path, "checkout_b", b"weights")
  recipe = _recipe(str(tmp_path / "run"), now)
  _record(recipe, **{"--bert": then})
  recipe._check_same_arguments()  # pylint: disable=protected-access


def test_other_weights_are_refused_naming_both_directories(tmp_path):
  then = _bert_dir(tmp_path, "checkout_a", b"weights")
  now = _bert_dir(tmp_path, "checkout_b", b"other weights")
  recipe = _recipe(str(tmp_path / "run"), now)
  _record(recipe, **{"--bert": then})
  with pytest.raises(recipes.InputError, match="--bert .*checkout_a.* then, .*checkout_b.* now"):
    recipe._check_same_arguments()  # pylint: disable=protected-access


def test_a_recorded_bert_that_is_gone_is_refused(tmp_path):
  now = _bert_dir(tmp_path, "checkout_b", b"weights")
  recipe = _recipe(str(tmp_path / "run"), now)
  _record(recipe, **{"--bert": str(tmp_path / "removed")})
  with pytest.raises(recipes.InputError, match="--bert"):
    recipe._check_same_arguments()  # pylint: disable=protected-access


def test_same_weights_do_not_excuse_another_flag(tmp_path):
  then = _bert_dir(tmp_path, "checkout_a", b"weights")
  now = _bert_dir(tmp_path, "checkout_b", b"weights")
  recipe = _recipe(str(tmp_path / "run"), now)
  _record(recipe, **{"--bert": then, "--max_block_len": 999})
  with pytest.raises(recipes.InputError, match="--max_block_len 999 then"):
    recipe._check_same_arguments()  # pylint: disable=protected-access
