r"""Can the toy RETRO learn to copy from its neighbours at all? A synthetic copy task.

  python bench/retro_copy.py [--steps 1500] [--eval_every 100] [--write]

The toy world's positive control (bench/retro.py's `retro_own_document`) gains little from
neighbours that hold the very text it predicts. This isolates the model and its optimiser from
the toy world: the decoder of gin_configs/experiments/toy_retro.gin (its RetroConfig, batch,
learning rate and `optim.bert_optimizer`), trained on random wordpieces, where nothing but the
neighbours predicts anything:

  sequence   two chunks of m uniformly random wordpieces, c0 c1 (n = 2m);
  chunk 0's  k = 2 neighbours: c0 c1 itself (its own text and continuation, RETRO's trivial
             copy) and a random distractor chunk with its continuation, in random order;
  chunk 1's  neighbours: random (its readers lie past the sequence).

Tokens 1 .. m - 1 of c0 are unpredictable (loss log V for the V = --drawn wordpieces they are
drawn from); tokens of c1, read by positions m - 1 .. 2m - 2, are in a neighbour one position
after the reader's aligned token: a model that copies drives their loss towards log 2 (both
neighbours hold a token at that offset; only content tells the own one from the distractor) and
below. Rows (--rows): the toy RetroConfig with rotary positions in the cross-attentions
(`cross_attention_positions`, the default) or without, and its neighbour encoder 2 layers deep
(RETRO's and the toy gin's) or 1; --adam_eps sets the optimizer's epsilon. Reported: the
copyable tokens' mean loss (nats) on 64 fresh sequences every --eval_every steps, and the
first step where it falls under 1 nat. `--write` puts the table into the section "RETRO
copying from its neighbours (synthetic)" of bench/docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

import flax.linen as nn  # noqa: E402
import gin  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from bench import report  # noqa: E402
from realm_jax import gin_utils  # noqa: E402
from realm_jax import train as train_lib  # noqa: E402,F401  (registers the run gins' names)
from realm_jax.jobs import retro as retro_job  # noqa: E402
from realm_jax.models import retro  # noqa: E402
from realm_jax.training import optim  # noqa: E402

SECTION = "RETRO copying from its neighbours (synthetic)"
GIN = "gin_configs/experiments/toy_retro.gin"
FIRST_ID = 1000  # draw wordpieces from FIRST_ID on: no [PAD], [CLS], [unused*]
NUM_NEIGHBOURS = 2
EVAL_SEQUENCES = 64
COPIED = 1.0  # nats: "copies" once the copyable tokens' loss falls under this
DEFAULT_ROWS = ("rotary:2", "none:2", "rotary:1")


def toy_settings() -> tuple[retro.RetroConfig, int, float]:
  """(RetroConfig, batch size, peak learning rate) of the toy RETRO gin."""
  # gin resolves `include 'gin_configs/...'` as a package resource first; with the repository
  # on sys.path (for `bench`) gin_configs is a namespace package without files: hide it.
  sys.path.remove(REPO)
  try:
    gin_utils.parse_gin([GIN], ["RUN_DIR='/unused'"])
  finally:
    sys.path.insert(0, REPO)
  config = retro_job.retro_config()
  batch = gin.query_parameter("%BATCH_SIZE")
  learning_rate = gin.query_parameter("%LEARNING_RATE")
  gin.clear_config()
  return config, int(batch), float(learning_rate)


def copy_batch(rng: np.random.Generator, batch: int, config: retro.RetroConfig, drawn: int
               ) -> tuple[np.ndarray, np.ndarray]:
  """(input_ids [B, 2m], neighbour_ids [B, 2, k, 2m]) of the copy task (module docstring),
  wordpieces drawn uniformly from the `drawn` ids from FIRST_ID."""
  m = config.chunk_size

  def draw(*shape):
    return rng.integers(FIRST_ID, FIRST_ID + drawn, shape).astype(np.int32)

  ids = draw(batch, 2 * m)  # [B, 2m]: c0 c1
  neighbours = draw(batch, 2, NUM_NEIGHBOURS, 2 * m)  # [B, l, k, 2m]: random
  # [B]: where chunk 0's own text goes among its k neighbours.
  own = rng.integers(0, NUM_NEIGHBOURS, batch)
  neighbours[np.arange(batch), 0, own] = ids
  return ids, neighbours


def copyable_loss(losses: jax.Array, m: int) -> tuple[jax.Array, jax.Array]:
  """(mean loss of the targets in c1, mean loss of c0's targets) from per-token losses
  [B, 2m - 1] (entry t predicts token t + 1)."""
  return losses[:, m - 1:].mean(), losses[:, :m - 1].mean()


def run(config: retro.RetroConfig, batch: int, learning_rate: float, steps: int,
        eval_every: int, seed: int, drawn: int, eps: float) -> list[dict[str, float]]:
  """Trains on fresh copy batches; [{step, copyable, other}] every eval_every steps."""
  model = retro.RetroModel(config)
  params = jax.jit(lambda key: nn.unbox(retro.init_params(config, key, NUM_NEIGHBOURS)))(
      jax.random.PRNGKey(seed))
  optimizer = optim.bert_optimizer(learning_rate, steps, eps=eps)
  state = optimizer.init(params)
  m = config.chunk_size

  def losses_of(p, ids, neighbours):
    logits = model.apply({"params": p}, ids, neighbours, None)
    return retro.next_token_losses(logits, ids)  # [B, 2m - 1]

  @jax.jit
  def step(p, s, ids, neighbours):
    loss, grads = jax.value_and_grad(lambda q: losses_of(q, ids, neighbours).mean())(p)
    updates, s = optimizer.update(grads, s, p)
    return optax.apply_updates(p, updates), s, loss

  @jax.jit
  def evaluate(p, ids, neighbours):
    return copyable_loss(losses_of(p, ids, neighbours), m)

  rng = np.random.default_rng(seed)
  eval_ids, eval_neighbours = copy_batch(np.random.default_rng(seed + 10_000), EVAL_SEQUENCES,
                                         config, drawn)
  curve = []
  for i in range(steps + 1):
    if i % eval_every == 0:
      copy, other = evaluate(params, eval_ids, eval_neighbours)
      curve.append({"step": i, "copyable": float(copy), "other": float(other)})
      print(f"  step {i}: copyable {float(copy):.3f} nats, other {float(other):.3f}",
            flush=True)
    if i < steps:
      params, state, _ = step(params, state, *copy_batch(rng, batch, config, drawn))
  return curve


def parse_row(row: str) -> tuple[bool, int]:
  """'rotary:2' -> (cross_attention_positions, encoder_layers)."""
  positions, _, layers = row.partition(":")
  if positions not in ("rotary", "none") or not layers.isdigit() or int(layers) < 1:
    raise SystemExit(f"--rows {row!r}: expected POSITIONS:ENCODER_LAYERS, e.g. rotary:2")
  return positions == "rotary", int(layers)


def row_label(positions: bool, layers: int, toy: retro.RetroConfig) -> str:
  toy_gin = positions and layers == toy.encoder_layers
  return (f"{'rotary' if positions else 'none (content only)'}, {layers} encoder layer"
          f"{'s' if layers > 1 else ''}{' (the toy gin)' if toy_gin else ''}")


def first_copy_step(curve: list[dict[str, float]]) -> str:
  hits = [point["step"] for point in curve if point["copyable"] < COPIED]
  return f"{hits[0]:,}" if hits else f"not by {curve[-1]['step']:,}"


def render(results: dict[str, list[dict[str, float]]], config: retro.RetroConfig, batch: int,
           learning_rate: float, args: argparse.Namespace, seconds: float) -> str:
  steps = [point["step"] for point in next(iter(results.values()))]
  shown = [s for s in steps if s in (0, 100, 300) or s == steps[-1] or
           (s % 500 == 0)]
  unpredictable = math.log(args.drawn)
  lines = [
      f"`python bench/retro_copy.py --steps {args.steps} --eval_every {args.eval_every} "
      f"--seed {args.seed} --drawn {args.drawn} --adam_eps {args.adam_eps:g}"
      f"{' --learning_rate %g' % args.learning_rate if args.learning_rate else ''}"
      f"{' --rows ' + ' '.join(args.rows) if tuple(args.rows) != DEFAULT_ROWS else ''}` "
      f"({seconds / 60:.0f} minutes). The toy RETRO "
      f"({GIN}: {config.num_layers} layers of width {config.hidden_size}, CCA in layers "
      f"{', '.join(str(i + 1) for i in config.cca_layers)} counted from 1, m = "
      f"{config.chunk_size}, r = {config.neighbour_len}, k = {NUM_NEIGHBOURS}; batch {batch}, "
      f"peak learning rate {learning_rate:g}, `optim.bert_optimizer` over the run's steps, "
      f"epsilon {args.adam_eps:g}) "
      f"trained on random wordpieces where chunk 0's neighbours hold its own text and "
      f"continuation beside a random distractor (the module docstring of bench/retro_copy.py). "
      f"Mean loss in nats, on {EVAL_SEQUENCES} fresh sequences, of the copyable tokens "
      f"(chunk 1, read by the CCA from its aligned neighbour token + 1) and of the others "
      f"(chunk 0, unpredictable: log {args.drawn:,} = {unpredictable:.2f}; the wordpieces "
      f"are drawn uniformly from {args.drawn:,} of the {config.vocab_size:,}).",
      "",
      "| cross-attention positions, neighbour encoder | " + " | ".join(f"step {s:,}" for s in shown)
      + " | copies (loss < 1 nat) from step |",
      "|---|" + "---|" * (len(shown) + 1)]
  for name, curve in results.items():
    by_step = {point["step"]: point for point in curve}
    lines.append(f"| {name} | " + " | ".join(
        f"{by_step[s]['copyable']:.2f} ({by_step[s]['other']:.2f})" for s in shown)
        + f" | {first_copy_step(curve)} |")
  lines += ["", "Cells: copyable tokens' loss (the other tokens' loss)."]
  return "\n".join(lines) + "\n"


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=1500)
  parser.add_argument("--eval_every", type=int, default=100)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--learning_rate", type=float, default=None,
                      help="peak learning rate (default: the toy RETRO gin's)")
  parser.add_argument("--adam_eps", type=float, default=1e-6,
                      help="the optimizer's epsilon (default: BERT's 1e-6, the RETRO job's)")
  parser.add_argument("--drawn", type=int, default=1000,
                      help="how many distinct wordpieces the sequences are drawn from (the toy "
                           "world's BlockStore: 1,880 from id 1000 on, 641 of them cover 90%% "
                           "of its tokens)")
  parser.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS),
                      help="rows as POSITIONS:ENCODER_LAYERS, POSITIONS 'rotary' or 'none' "
                           "(RetroConfig.cross_attention_positions), ENCODER_LAYERS the "
                           "neighbour encoder's depth (the toy gin's: 2)")
  parser.add_argument("--write", action="store_true",
                      help=f"write the section {SECTION!r} of bench/docs/benchmarks.md")
  args = parser.parse_args(argv)
  config, batch, learning_rate = toy_settings()
  learning_rate = args.learning_rate or learning_rate
  start = time.time()
  results = {}
  for row in args.rows:
    positions, layers = parse_row(row)
    print(f"cross_attention_positions={positions}, encoder_layers={layers}", flush=True)
    row_config = dataclasses.replace(config, cross_attention_positions=positions,
                                     encoder_layers=layers)
    results[row_label(positions, layers, config)] = run(
        row_config, batch, learning_rate, args.steps, args.eval_every, args.seed, args.drawn,
        args.adam_eps)
  body = render(results, config, batch, learning_rate, args, time.time() - start)
  print(body)
  if args.write:
    report.write_section(SECTION, body)


if __name__ == "__main__":
  main()
