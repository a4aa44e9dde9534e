r"""Does an encoder copy? Its reading of a sentence beside the sentence's verbatim repeat, and
the attention that copying needs.

  python bench/copy_circuit.py [--world wiki] [--examples 300] [--shipped] [RUN_DIR:STEP ...]

Copying a masked wordpiece from a verbatim repeat of its sentence needs, in a 2-layer BERT, a
layer-0 head on the neighbouring position (so each position carries its neighbour's word) and
a layer-1 head that goes from the masked position to the same word in the repeat
(docs/toy_bert.md, "Body masking, a copying phase, and why copying still does not form"). On
held-out sentences of the world (`toy_bert.heldout_examples`) read beside their verbatim
repeat (the "copy" context: `[CLS] masked sentence [SEP] sentence block [SEP]`) and with the
null document, with BERT's random-token masks and with one salient span masked, this prints
for each encoder and masking:

- wordpiece accuracy beside the repeat and with the null document;
- layer 0: each head's mean attention on the previous and on the next position, over the
  row's real positions;
- the last layer: each head's mean attention from a masked position to the same position of
  the repeat, for targets after a word and after another target (inside a masked span, where
  the previous position holds [MASK]).

Encoders: the world's shipped BERT (`--shipped`; the default when no checkpoint is named) and
mlm or pretraining checkpoints (RUN_DIR:STEP; their knowledge-augmented encoder).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Mapping

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from realm_jax import toy_bert  # noqa: E402  pylint: disable=wrong-import-position

BATCH = 50


def copy_positions(type_ids: np.ndarray, input_mask: np.ndarray,
                   mlm_positions: np.ndarray) -> np.ndarray:
  """[N, M] row position of each target's word in the repeat: a copy row is `[CLS] s [SEP]`
  (segment 0, Q positions) then s again from position Q, so query position p (1 <= p <= Q - 2)
  is repeated at Q + p - 1."""
  query_len = ((type_ids == 0) & (input_mask == 1)).sum(axis=1)  # [N]
  return query_len[:, None] + mlm_positions - 1


def neighbour_mass(probs: np.ndarray, input_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per head, the mean attention on the previous and on the next position: probs [N, H, L, L]
  averaged over the query positions p whose neighbour (p - 1, resp. p + 1) is a real one."""
  real = input_mask.astype(bool)  # [N, L]
  previous = np.diagonal(probs, offset=-1, axis1=2, axis2=3)  # [N, H, L - 1]: probs[p, p - 1]
  following = np.diagonal(probs, offset=1, axis1=2, axis2=3)  # [N, H, L - 1]: probs[p, p + 1]
  pairs = real[:, 1:] & real[:, :-1]  # [N, L - 1]
  def mean(values):
    return (values * pairs[:, None]).sum(axis=(0, 2)) / pairs.sum()
  return mean(previous), mean(following)


def copy_mass(probs: np.ndarray, mlm_positions: np.ndarray, copies: np.ndarray,
              mlm_weights: np.ndarray) -> dict[str, tuple[np.ndarray, int]]:
  """{"after a word", "after a target"}: (per head, the summed attention from a target's
  position to its copy [H]; how many targets), the targets split by whether the position
  before them is another target's."""
  n, m = mlm_positions.shape
  rows = np.repeat(np.arange(n), m)
  weights = mlm_weights > 0  # [N, M]
  # [N, M] whether position - 1 is also a target of the row
  after_target = ((mlm_positions[:, :, None] - 1 == mlm_positions[:, None, :])
                  & weights[:, None, :]).any(axis=2)
  # [N M, H] attention of each target's position on its copy
  mass = probs[rows, :, mlm_positions.reshape(-1), copies.reshape(-1)]
  out = {}
  for name, kind in (("after a word", ~after_target), ("after a target", after_target)):
    chosen = (weights & kind).reshape(-1)
    out[name] = (mass[chosen].sum(axis=0), int(chosen.sum()))
  return out


def measure(params: Mapping[str, Any], config: Any, examples: int, world: str,
            strategy: str) -> dict:
  """Accuracy beside the repeat and with the null document, layer 0's neighbour attention and
  the last layer's attention on the copy (module docstring), for one encoder's parameters and
  one masking `strategy`."""
  import jax  # pylint: disable=import-outside-toplevel
  from flax import traverse_util  # pylint: disable=import-outside-toplevel
  # pylint: disable-next=import-outside-toplevel
  from realm_jax.models.reader import RealmKnowledgeAugEncoder
  rows = {context: toy_bert.heldout_examples(examples, context=context, world=world,
                                             strategy=strategy)
          for context in ("copy", "null")}
  out = {f"accuracy, {context}": toy_bert.reading_accuracy(params, config, rows[context])[
      "wordpiece_accuracy"] for context in rows}

  @jax.jit
  def attention(params, ids, type_ids, mask, positions):
    # per layer [B, heads, L, L], in layer order
    _, state = RealmKnowledgeAugEncoder(config).apply(
        {"params": params}, ids[:, None], type_ids[:, None], mask[:, None], positions,
        mutable=["intermediates"])
    flat = traverse_util.flatten_dict(state["intermediates"])
    layers = sorted((path for path in flat if path[-1] == "attention_probs"),
                    key=lambda path: int(next(p for p in path if p.startswith("layer_"))[6:]))
    return [flat[path][0] for path in layers]

  copy = rows["copy"]
  neighbours, batches = 0.0, 0
  copied = {"after a word": [0.0, 0], "after a target": [0.0, 0]}
  for start in range(0, len(copy["input_ids"]), BATCH):
    batch = {k: v[start:start + BATCH] for k, v in copy.items()}
    probs = [np.asarray(p, np.float64) for p in attention(
        params, batch["input_ids"], batch["type_ids"], batch["input_mask"],
        batch["mlm_positions"])]
    neighbours = neighbours + np.stack(neighbour_mass(probs[0], batch["input_mask"]))  # [2, H]
    batches += 1
    positions = batch["mlm_positions"]
    for name, (total, count) in copy_mass(probs[-1], positions, copy_positions(
        batch["type_ids"], batch["input_mask"], positions), batch["mlm_weights"]).items():
      copied[name][0] = copied[name][0] + total
      copied[name][1] += count
  neighbours = neighbours / batches
  for h in range(neighbours.shape[1]):
    out[f"layer 0 head {h}: previous / next"] = tuple(neighbours[:, h])
  for name, (total, count) in copied.items():
    if count:
      out[f"last layer on the copy, {name} ({count}): heads"] = tuple(total / count)
  return out


def _cell(value) -> str:
  if isinstance(value, tuple):
    return " / ".join(f"{v:.3f}" for v in value)
  return f"{value:.3f}"


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("checkpoints", nargs="*", metavar="RUN_DIR:STEP",
                      help="mlm or pretraining checkpoints whose encoders to measure")
  parser.add_argument("--world", choices=("toy", "wiki"), default="wiki",
                      help="whose held-out sentences, and whose shipped BERT (default: wiki)")
  parser.add_argument("--shipped", action="store_true",
                      help="the world's shipped BERT too (always when no checkpoint is named)")
  parser.add_argument("--examples", type=int, default=300, help="held-out sentences")
  args = parser.parse_args()
  from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  from realm_jax.convert import hf  # pylint: disable=import-outside-toplevel
  encoders = []
  if args.shipped or not args.checkpoints:
    config, params, _ = hf.load_checkpoint(toy_bert.SHIPPED_DIRS[args.world])
    encoders.append((f"the {args.world} world's shipped BERT", params, config))
  for spec in args.checkpoints:
    run_dir, _, step = spec.rpartition(":")
    if not run_dir or not step.isdigit():
      parser.error(f"{spec}: expected RUN_DIR:STEP")
    params, config, _ = checkpoints.restore_params(run_dir, int(step))
    encoders.append((f"{run_dir} step {step}", params["encoder"], config))
  for strategy in ("random_token", "salient_span"):
    rows = [(name, measure(params, config, args.examples, args.world, strategy))
            for name, params, config in encoders]
    keys = list(dict.fromkeys(k for _, values in rows for k in values))
    print(f"\n{args.examples} held-out sentences of the {args.world} world, masks: {strategy} "
          "(a pair: previous / next position, or heads 0 / 1)")
    print("| encoder | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, values in rows:
      print(f"| {name} | " + " | ".join(_cell(values[k]) if k in values else "n/a"
                                         for k in keys) + " |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
