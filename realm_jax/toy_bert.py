r"""The toy BERT: build it, ship it, measure how well it reads.

REALM starts its encoder and (through ICT) its retriever from BERT; the toy world starts them
from the toy BERT, a BERT-tiny the project trains itself on reading worlds that share no name
with the toy world, shipped in BertForMaskedLM layout in `realm_jax/data/assets/toy_bert/`.

  python -m realm_jax.toy_bert --work_dir /tmp/toy_bert [--out DIR] [--copy_steps N] [--steps N]
      [--distract_steps N]
  python -m realm_jax.toy_bert --world wiki --work_dir /tmp/wiki_bert

runs the `mlm` train jobs (copying, reading, reading among distractors; `--world wiki`: the wiki
world's English BERT), each resuming after an interruption, writes the encoder to `--out`
(default: the shipped directory) and prints its held-out reading accuracy and sha256
(`--measure_only`: measure only). Details: docs/toy_bert.md, docs/wiki_world.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Optional, Sequence

import numpy as np

from realm_jax import data

PROG = "toy_bert"
GIN_FILE = "gin_configs/experiments/toy_bert.gin"
COPY_GIN_FILE = "gin_configs/experiments/toy_bert_copy.gin"
DISTRACT_GIN_FILE = "gin_configs/experiments/toy_bert_distract.gin"
SHIPPED_DIR = data.TOY_BERT_DIR
# Each world's phases: (gin file, run name under --work_dir); the shipped directory.
PHASES = {"toy": ((COPY_GIN_FILE, "copy"), (GIN_FILE, "run"), (DISTRACT_GIN_FILE, "distract")),
          "wiki": (("gin_configs/experiments/wiki_bert_copy.gin", "copy"),
                   ("gin_configs/experiments/wiki_bert.gin", "run"))}
SHIPPED_DIRS = {"toy": data.TOY_BERT_DIR, "wiki": data.WIKI_BERT_DIR}
# sha256 of the shipped model.safetensors, as the rebuild command prints it (docs/toy_bert.md).
SHIPPED_SHA256 = "1b0deeca906b1754870f965cecda44ec806cf338ba9fb29322f0777889f95e17"
# sha256 of the English BERT's model.safetensors, as the rebuild command prints it.
WIKI_SHIPPED_SHA256 = "c7902f0157cdac9b2bf31796276fa961301edaddc6e942e1e91742f059d70cbb"
DOCS = {"toy": "toy_bert.md", "wiki": "wiki_world.md"}
# Shapes of the held-out examples: the toy BERT's training rows (toy_bert.gin's task).
QUERY_LEN = 64
READER_LEN = 64 + 128
MAX_MASKS = 10


def shipped_sha256(world: str) -> str:
  """The documented sha256 of `world`'s shipped weights (read when called: tests patch it)."""
  return {"toy": SHIPPED_SHA256, "wiki": WIKI_SHIPPED_SHA256}[world]


def heldout_world(world: str = "toy", seed: Optional[int] = None) -> tuple[str, str]:
  """(BlockStore, salient-span records) of the held-out sentences: the toy BERT's held-out
  reading world (`seed`, default `realm_jax_tasks.toy.TOY_BERT_HELDOUT_SEED`), or the wiki
  world's test articles, which the English BERT never reads."""
  from realm_jax_tasks import toy  # pylint: disable=g-import-not-at-top
  from realm_jax_tasks import wiki  # pylint: disable=g-import-not-at-top
  if world == "wiki":
    return wiki.heldout_world()
  return toy.reading_world(toy.TOY_BERT_HELDOUT_SEED if seed is None else seed)


def heldout_examples(num_examples: int, *, seed: Optional[int] = None,
                     context: str = "own", world: str = "toy",
                     strategy: str = "salient_span") -> dict[str, np.ndarray]:
  """`num_examples` reading examples of the held-out sentences, stacked.

  Args:
    num_examples: how many (the first passages of the world, one masked sentence each).
    seed: the toy reading world (`heldout_world`).
    context: "own" (the block stating the span), "distractor" (another document's block),
      "null" (no block) or "copy" (the sentence's verbatim repeat, then its block); the same
      masked sentences in each.
    world: "toy" or "wiki" (`heldout_world`).
    strategy: the masking, one salient span ("salient_span") or BERT's random tokens
      ("random_token").

  Returns:
    input_ids, type_ids, input_mask [N, READER_LEN]; mlm_positions, mlm_targets, mlm_weights
    [N, MAX_MASKS].
  """
  from realm_jax.data import block_store as block_store_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.batches import reading  # pylint: disable=g-import-not-at-top
  from realm_jax.data import salient_spans  # pylint: disable=g-import-not-at-top
  store_dir, records_path = heldout_world(world, seed)
  store = block_store_lib.BlockStore.open(store_dir, verify="fast")
  title_blocks = reading.blocks_by_title(store)
  examples = []
  for index, record in enumerate(salient_spans.read_precomputed(records_path)):
    if len(examples) == num_examples:
      break
    example = reading.make_reading_example(
        record, store, title_blocks, rng=np.random.default_rng([index]), query_len=QUERY_LEN,
        reader_len=READER_LEN, max_masks=MAX_MASKS, strategy=strategy, context=context)
    if example is not None:
      examples.append(example)
  if len(examples) < num_examples:
    raise ValueError(f"{records_path}: only {len(examples)} reading examples, asked for "
                     f"{num_examples}")
  return {k: np.stack([e[k] for e in examples]) for k in examples[0] if k != "context"}


def reading_accuracy(encoder_params: Any, config: Any, examples: dict[str, np.ndarray], *,
                     batch_size: int = 64) -> dict[str, float]:
  """Masked-wordpiece and whole-span accuracy of the knowledge-augmented encoder (argmax).

  Args:
    encoder_params: `{"bert", "mlm_head"}` (e.g. `convert.hf.load_checkpoint(...)[1]`).
    config: its RealmConfig.
    examples: `heldout_examples(...)`.

  Returns:
    {"wordpiece_accuracy", "span_accuracy", "examples"}.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax.models.reader import RealmKnowledgeAugEncoder  # pylint: disable=g-import-not-at-top

  @jax.jit
  def predict(params, ids, type_ids, mask, positions):
    # [B, 1, M, V] -> [B, M]
    logits = RealmKnowledgeAugEncoder(config).apply(
        {"params": params}, ids[:, None], type_ids[:, None], mask[:, None], positions)
    return logits[:, 0].argmax(-1)

  correct, weights = [], []
  num = len(examples["input_ids"])
  for start in range(0, num, batch_size):
    rows = {k: v[start:start + batch_size] for k, v in examples.items()}
    pad = batch_size - len(rows["input_ids"])  # one compiled shape for every batch
    rows = {k: np.pad(v, [(0, pad)] + [(0, 0)] * (v.ndim - 1)) for k, v in rows.items()}
    predicted = np.asarray(predict(encoder_params, rows["input_ids"], rows["type_ids"],
                                   rows["input_mask"], rows["mlm_positions"]))
    correct.append((predicted == rows["mlm_targets"])[:batch_size - pad])
    weights.append(rows["mlm_weights"][:batch_size - pad] > 0)
  correct, weights = np.concatenate(correct), np.concatenate(weights)  # [N, M]
  span_right = np.where(weights, correct, True).all(axis=1)  # [N]
  return {"wordpiece_accuracy": float((correct & weights).sum() / weights.sum()),
          "span_accuracy": float(span_right.mean()), "examples": int(num)}


def measure(directory: str, num_examples: int = 1000, world: str = "toy") -> dict[str, Any]:
  """Reading accuracy of the BertForMaskedLM in `directory` on `world`'s held-out sentences:
  with the block that states the masked span, without context (the null document), and beside
  another document's block."""
  from realm_jax.convert import hf  # pylint: disable=g-import-not-at-top
  config, params, _ = hf.load_checkpoint(directory)
  return {"sha256": weights_sha256(directory),
          **measure_params(params, config, num_examples, world)}


def measure_params(encoder_params: Any, config: Any, num_examples: int = 1000,
                   world: str = "toy") -> dict[str, Any]:
  """`measure` of an encoder already in memory (`{"bert", "mlm_head"}`, e.g. a pretraining
  checkpoint's "encoder"): {"with_context", "without_context", "with_distractor"}, each
  `reading_accuracy`'s."""
  return {name: reading_accuracy(encoder_params, config, heldout_examples(
      num_examples, context=context, world=world))
          for name, context in (("with_context", "own"), ("without_context", "null"),
                                ("with_distractor", "distractor"))}


def weights_sha256(directory: str) -> str:
  """sha256 of `<directory>/model.safetensors`."""
  from realm_jax import fileio  # pylint: disable=g-import-not-at-top
  return fileio.sha256_file(os.path.join(directory, "model.safetensors"))


def _train(gin_file: str, run_dir: str, steps: Optional[int], bindings: Sequence[str]) -> str:
  """Runs (or resumes) one phase's train job, unless it is finished; returns its last
  checkpoint step directory."""
  from realm_jax import train  # pylint: disable=g-import-not-at-top
  from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
  if checkpoints.training_done(run_dir):
    print(f"{PROG}: {run_dir} is finished; not run again", flush=True)
    return os.path.join(run_dir, "checkpoints", str(checkpoints.latest_checkpoint_step(run_dir)))
  from realm_jax import gin_utils  # pylint: disable=g-import-not-at-top
  argv = [f"python -m realm_jax.{PROG}", f"--gin_file={gin_file}",
          *gin_utils.binding_flags([("RUN_DIR", run_dir)]), *bindings]
  if steps is not None:
    argv += gin_utils.binding_flags([("NUM_STEPS", steps)])
  code = train.main(argv)
  if code == 130:  # the train job was interrupted (and said so): so is this command
    raise KeyboardInterrupt
  if code:
    raise RuntimeError(f"the toy BERT's train job ({gin_file}) exited with status {code}")
  return os.path.join(run_dir, "checkpoints", str(checkpoints.latest_checkpoint_step(run_dir)))


def build(work_dir: str, out: str, *, steps: Optional[int] = None,
          copy_steps: Optional[int] = None, distract_steps: Optional[int] = None,
          bindings: Sequence[str] = (), world: str = "toy") -> str:
  """Trains (or resumes) the phases of `world`'s BERT (`PHASES`; the toy BERT's: copying in
  `<work_dir>/copy`, reading in `<work_dir>/run` and reading among distractors in
  `<work_dir>/distract`), each from the one before's last checkpoint, and writes the last to
  `out`. `copy_steps`, `steps`, `distract_steps`: the phases' lengths, in that order."""
  from realm_jax.convert import hf  # pylint: disable=g-import-not-at-top
  from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
  from realm_jax import gin_utils  # pylint: disable=g-import-not-at-top
  work_dir = os.path.abspath(work_dir)
  phases = [(gin_file, name, phase_steps) for (gin_file, name), phase_steps
            in zip(PHASES[world], (copy_steps, steps, distract_steps))]
  warm_start = []  # the first phase starts from its gin's initialisation
  for gin_file, name, phase_steps in phases:
    run_dir = os.path.join(work_dir, name)
    last = _train(gin_file, run_dir, phase_steps, [*warm_start, *bindings])
    warm_start = gin_utils.binding_flags([("INIT_CHECKPOINT", last)])
  params, config, _ = checkpoints.restore_params(run_dir)  # the last phase's
  hf.write_bert_mlm(out, params["encoder"], config.bert)
  return out


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(prog=f"python -m realm_jax.{PROG}", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--work_dir", default="/tmp/toy_bert",
                      help="the three phases' runs (resumable): <work_dir>/copy, run, distract "
                           "(default %(default)s)")
  parser.add_argument("--world", choices=sorted(PHASES), default="toy",
                      help="which BERT: the toy world's toy BERT (default), or the wiki world's "
                           "English BERT, trained on its train articles (the `wiki` extra)")
  parser.add_argument("--out", default=None,
                      help="where config.json + model.safetensors go (default: the shipped "
                           "realm_jax/data/assets/toy_bert, or wiki_bert with --world wiki)")
  parser.add_argument("--copy_steps", type=int, default=None,
                      help="steps of the first phase, copying (default: NUM_STEPS of "
                           f"{COPY_GIN_FILE})")
  parser.add_argument("--steps", type=int, default=None,
                      help=f"steps of the second phase, reading (default: NUM_STEPS of {GIN_FILE})")
  parser.add_argument("--distract_steps", type=int, default=None,
                      help="steps of the third phase, reading among distractors (default: "
                           f"NUM_STEPS of {DISTRACT_GIN_FILE}; the toy BERT's only)")
  parser.add_argument("--measure_only", action="store_true",
                      help="only measure the reading accuracy of --out")
  parser.add_argument("--examples", type=int, default=1000,
                      help="held-out examples for the reading accuracy (default %(default)s)")
  args, gin_args = parser.parse_known_args(argv)
  args.out = args.out or SHIPPED_DIRS[args.world]
  if args.distract_steps is not None and len(PHASES[args.world]) < 3:
    parser.error(f"--distract_steps: the {args.world} world's BERT has no third phase")
  for flag, path in (("--work_dir", args.work_dir), ("--out", args.out)):
    if os.path.exists(path) and not os.path.isdir(path):
      parser.error(f"{flag} {path} is a file; give a directory (created if missing)")
  from realm_jax import gin_utils  # pylint: disable=g-import-not-at-top
  gin_utils.setup_logging()  # before build() imports Orbax: the train job's progress lines
  os.chdir(gin_utils.REPO_ROOT)  # the gin file is addressed from the repository root

  def run() -> int:
    start = time.monotonic()
    if not args.measure_only:
      build(args.work_dir, args.out, steps=args.steps, copy_steps=args.copy_steps,
            distract_steps=args.distract_steps, bindings=gin_args, world=args.world)
      print(f"{PROG}: wrote {args.out} in {(time.monotonic() - start) / 60:.1f} min", flush=True)
    result = measure(args.out, args.examples, args.world)
    print(json.dumps(result, indent=2))
    return 0

  return gin_utils.run_command(
      PROG, run, interrupted="each phase resumes from its last checkpoint in --work_dir: run "
      "the same command again", expected=(RuntimeError, OSError, ValueError),
      describe=gin_utils.one_line)


if __name__ == "__main__":
  from realm_jax import gin_utils  # pylint: disable=g-import-not-at-top
  gin_utils.exit_process(main(), PROG)
