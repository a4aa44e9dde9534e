"""The wiki world's runs as the benches lay them out, shared by bench/compute_curve.py and
bench/ablations.py's `--world wiki`.

Under one output directory: the BlockStore with its salient spans and the converted English
BERT, shared by every seed; per seed (`seed<s>/`) the ICT warm start, the ORQA-style baseline and
the BM25 reader, shared by every pretraining of the seed; per pretraining a run directory of the
wiki recipe (`recipe.WikiRecipe`): `steps<N>` for REALM pretrained N steps, the Table 2 rows'
own names for the others. REALM's pretraining at the recipe's length is one run for both
benches, and its fine-tunings (REALM's, the mixed rows') are slots of that run. Another English
BERT (`bert`) has its converted copy (`bert_bert<h>`) and its seeds (`seed<s>_bert<h>`) of its
own beside them, h its weights' sha256 (8 digits).
"""

from __future__ import annotations

import functools
import hashlib
import os
from typing import Optional

DEFAULT_OUT = "/tmp/realm_wiki_runs"
# --smoke: a wiki cell at a tiny size (the bench itself checked on a CPU, in minutes).
SMOKE_STEPS = {"ict": 8, "pretrain": 4, "finetune": 4, "reading": 16}


def recipe_steps(stage: str, smoke: bool = False) -> int:
  """The wiki recipe's steps of `stage` ('pretrain', 'finetune'), or the smoke size's."""
  from realm_jax import recipe as recipe_lib  # pylint: disable=import-outside-toplevel
  return SMOKE_STEPS[stage] if smoke else recipe_lib.WIKI_STEPS[stage]


def world_options(eval_split: str, smoke: bool = False, bert: Optional[str] = None) -> dict:
  """What every wiki cell is fingerprinted with besides the gins and its own lengths: the English
  BERT (the shipped one's documented sha256, or that of the `bert` directory's weights), the
  world's questions and text (its manifest), the wiki recipe's settings and the report split."""
  from realm_jax import recipe as recipe_lib  # pylint: disable=import-outside-toplevel
  from realm_jax import toy_bert  # pylint: disable=import-outside-toplevel
  from realm_jax.data import wiki  # pylint: disable=import-outside-toplevel
  with open(os.path.join(wiki.world_dir(), "manifest.json"), encoding="utf-8") as f:
    manifest = f.read()
  return {"wiki_bert_sha256": bert_sha256(bert) if bert else toy_bert.shipped_sha256("wiki"),
          "world_manifest": hashlib.sha256(manifest.encode()).hexdigest(),
          "ict_remove_probability": recipe_lib.WIKI_ICT_REMOVE_PROBABILITY,
          "retriever_frozen_share": recipe_lib.WIKI_RETRIEVER_FROZEN_SHARE,
          "finetune_steps": recipe_steps("finetune", smoke),
          "eval_split": eval_split, **({"smoke": SMOKE_STEPS} if smoke else {})}


@functools.lru_cache(maxsize=None)
def bert_sha256(bert: str) -> str:
  """sha256 of an English BERT directory's weights (`toy_bert.weights_sha256`), hashed once per
  process: a variant's every cell path, seed directory and fingerprint names it."""
  from realm_jax import toy_bert  # pylint: disable=import-outside-toplevel
  return toy_bert.weights_sha256(bert)


def bert_suffix(bert: Optional[str]) -> str:
  """"" for the shipped English BERT, else "_bert<h>" (h: the `bert` directory's weights'
  sha256, 8 digits): what names its converted copy and its seeds' directories."""
  return f"_bert{bert_sha256(bert)[:8]}" if bert else ""


def seed_dir(out: str, seed: int, bert: Optional[str] = None) -> str:
  """`<out>/seed<s>` (`<out>/seed<s>_bert<h>` from another English BERT: `bert_suffix`): one
  seed's runs (a bench claims it for `world_options` before it runs anything there:
  `ablations.wiki_seed_dir`)."""
  return os.path.join(out, f"seed{seed}{bert_suffix(bert)}")


def recipe(out: str, seed: int, run_name: str, *, pretrain_steps: int, smoke: bool = False,
           ict_dir: Optional[str] = None, bert: Optional[str] = None, **kwargs):
  """The wiki recipe of one seed's pretraining `<out>/seed<s>/<run_name>`, sharing the store, the
  BERT, the ICT warm start (or `ict_dir`), the baseline and the BM25 reader as the module says.
  `bert`: an English BERT directory (transformers layout) instead of the shipped one, converted
  to `<out>/bert_bert<h>`, its seeds' runs under `seed_dir`'s own directories.
  kwargs: WikiRecipe's (the fine-tuning slot, the builder, extra pretraining bindings) and
  "finetune_seed_offset" (the slot's fine-tuning alone with seed s + offset)."""
  from realm_jax import recipe as recipe_lib  # pylint: disable=import-outside-toplevel
  from realm_jax.data import wiki  # pylint: disable=import-outside-toplevel
  seed_out = seed_dir(out, seed, bert)
  seeded = [f"train_main.seed={seed}"]
  offset = kwargs.pop("finetune_seed_offset", 0)
  if offset:  # the slot's fine-tuning alone, with another seed (the noise row)
    kwargs["slot_bindings"] = [f"train_main.seed={seed + offset}"]
  run = recipe_lib.WikiRecipe(
      os.path.join(seed_out, run_name), world=wiki.world_dir(),
      toy_bert=bert or recipe_lib.toy_bert_dir("shipped", "wiki"), pretrain_steps=pretrain_steps,
      warm_start_bindings=(recipe_lib.step_bindings("ict", SMOKE_STEPS["ict"]) if smoke
                           else []) + seeded,
      pretrain_bindings=(recipe_lib.step_bindings("pretrain", pretrain_steps) + seeded
                         + list(kwargs.pop("pretrain_bindings", []))),
      finetune_bindings=(recipe_lib.step_bindings("finetune", recipe_steps("finetune", smoke))
                         + seeded),
      **kwargs)
  run.store = os.path.join(out, "store")
  run.bert = os.path.join(out, f"bert{bert_suffix(bert)}")
  run.ict = ict_dir or os.path.join(seed_out, "ict")
  run.orqa, run.bm25_reader = (os.path.join(seed_out, name) for name in ("orqa", "bm25_reader"))
  return run
