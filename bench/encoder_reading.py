r"""Does REALM's encoder still read after pretraining? Reading accuracy of the toy BERT and of
pretraining checkpoints' encoders, side by side.

  python bench/encoder_reading.py RUN_DIR:STEP [RUN_DIR:STEP ...] [--examples 500]

REALM's fine-tuned reader starts from the pretrained encoder, so an encoder that has stopped
reading its blocks makes a worse reader than the BERT it started from. For the shipped toy BERT
and each checkpoint's knowledge-augmented encoder this measures what `realm_jax.toy_bert`
measures (masked name and date wordpieces predicted exactly, one salient span per sentence),
beside the block that states the span ("own"), with the null document ("null") and beside
another document's block ("other"), on two sets of sentences: the held-out reading world's
(`toy_bert.heldout_examples`, which neither model trained on) and the toy world's own
pretraining text X (the sentences REALM pretraining masks).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from realm_jax import checkpoints  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax import toy_bert  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.batches import reading  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.convert import hf  # noqa: E402  pylint: disable=wrong-import-position
# pylint: disable-next=wrong-import-position
from realm_jax.data import block_store as block_store_lib  # noqa: E402
from realm_jax.data import salient_spans  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.data import toy_world  # noqa: E402  pylint: disable=wrong-import-position

CONTEXTS = (("own", "own"), ("null", "null"), ("other", "distractor"))


def toy_world_examples(num_examples: int, context: str) -> dict[str, np.ndarray]:
  """`toy_bert.heldout_examples`' rows over the toy world's X and its BlockStore."""
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  store = block_store_lib.BlockStore.open(realm_jax_tasks.toy_block_store_dir(), verify="fast")
  title_blocks = reading.blocks_by_title(store)
  path = os.path.join(toy_world.toy_world_dir(), toy_world.PRETRAIN_FILE)
  rows = []
  for index, record in enumerate(salient_spans.read_precomputed(path)):
    if len(rows) == num_examples:
      break
    row = reading.make_reading_example(
        record, store, title_blocks, rng=np.random.default_rng([index]),
        query_len=toy_bert.QUERY_LEN, reader_len=toy_bert.READER_LEN,
        max_masks=toy_bert.MAX_MASKS, strategy="salient_span", context=context)
    if row is not None:
      rows.append(row)
  return {k: np.stack([r[k] for r in rows]) for k in rows[0] if k != "context"}


def accuracies(params, config, num_examples: int) -> dict[str, float]:
  """{"<set> <context>": wordpiece accuracy} for both sets and the three contexts."""
  out = {}
  for context_name, context in CONTEXTS:
    for set_name, make in (("held-out", lambda c: toy_bert.heldout_examples(num_examples,
                                                                             context=c)),
                           ("toy X", lambda c: toy_world_examples(num_examples, c))):
      out[f"{set_name} {context_name}"] = toy_bert.reading_accuracy(
          params, config, make(context))["wordpiece_accuracy"]
  return out


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("checkpoints", nargs="*", metavar="RUN_DIR:STEP",
                      help="pretraining checkpoints whose encoders to measure")
  parser.add_argument("--examples", type=int, default=500, help="sentences per set")
  args = parser.parse_args()
  config, params, _ = hf.load_checkpoint(toy_bert.SHIPPED_DIR)
  rows = [("the toy BERT (shipped)", accuracies(params, config, args.examples))]
  for spec in args.checkpoints:
    run_dir, _, step = spec.rpartition(":")
    params, config, _ = checkpoints.restore_params(run_dir, int(step))
    rows.append((f"{run_dir} step {step}", accuracies(params["encoder"], config,
                                                      args.examples)))
  keys = list(rows[0][1])
  print("| encoder | " + " | ".join(keys) + " |")
  print("|---" * (len(keys) + 1) + "|")
  for name, values in rows:
    print(f"| {name} | " + " | ".join(f"{values[k]:.3f}" for k in keys) + " |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
