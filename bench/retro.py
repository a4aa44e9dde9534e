r"""RETRO against the same decoder without retrieval, and RETRO-fitting, on two corpora.

  python bench/retro.py [--seeds 0 1 2] [--corpora toy pydocs] [--out /tmp/retro_bench]
      [--steps N] [--write]

Rows, per corpus and seed (paired by seed: one seed sets the initialisation and data order of
each row of it):
  baseline  the decoder without retrieval (`RETRIEVAL=False`)
  retro     the same decoder with the neighbour encoder and CCA, trained together
  retrofit  the baseline's final checkpoint, its decoder frozen, only the encoder and the CCA
            trained (RETRO section 4), for as many steps as the others
  retro_own_document  a positive control, not a result: RETRO without its rule against
            trivial copies (`RetroJob.exclude_own_document=False`), so that a chunk retrieves
            its own text and continuation; it shows what the model does with neighbours that
            hold the text it predicts
Every run is gin_configs/experiments/toy_retro.gin (`python -m realm_jax.train`; m = 16,
l = 2 chunks, k = 2 neighbours in training) over the corpus's chunk database, keyed by the
shipped toy BERT. Corpora: `toy` (the toy world's, built once next to its BlockStore) and
`pydocs` (Python's documentation, `python -m realm_jax.data.python_docs`, built into --out).
Each run is evaluated on the held-out documents (the last 5% by id: never trained on, never
retrieved) by `realm_jax.evaluation.retro.evaluate_retro`, with the training's k:
bits per byte with retrieval and without, the loss on salient-span tokens (names and dates)
and on the others, and RETRO's filtered evaluation (only chunks whose longest common token
substring with their neighbours is at most half the chunk).

Cells are kept in bench/results/retro/ (`<corpus>_seed<s>_<row>.json`, with the commit, date and
a fingerprint of the gins and options that made them) and reused, as bench/ablations.py keeps
its own; `--write` puts the table, the paired differences and the cells' provenance into the
section "RETRO on the toy world and Python's documentation" of bench/docs/benchmarks.md ("RETRO
on the wiki world" for `--corpora wiki`). `--steps N` trains every row N steps instead of the
gin's, with runs (`<out>/<corpus>/seed<s>_steps<N>`), cells (bench/results/retro_steps<N>/)
and a section (", trained N steps") of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

from bench import ablations  # noqa: E402  pylint: disable=wrong-import-position
from bench import report  # noqa: E402  pylint: disable=wrong-import-position

SECTION = "RETRO on the toy world and Python's documentation"
DEFAULT_CELLS = os.path.join(REPO, "bench", "results", "retro")
GIN = "gin_configs/experiments/toy_retro.gin"
FINGERPRINT_GINS = (GIN, "gin_configs/runs/retro.gin")  # and what they include
CORPORA = ("toy", "pydocs", "wiki")
DEFAULT_CORPORA = ("toy", "pydocs")  # SECTION's; the wiki world's has WIKI_SECTION
WIKI_SECTION = "RETRO on the wiki world"
ROWS = (("baseline", "decoder without retrieval"),
        ("retro", "RETRO (trained with retrieval)"),
        ("retrofit", "RETRO-fitted baseline (decoder frozen)"),
        ("retro_own_document", "RETRO, own document retrievable (positive control)"))
EVAL_SEQUENCES = 256
MAX_OVERLAP = 0.5  # the filtered evaluation's threshold in the table
CELL_FORMAT = 4  # 2: the filtered evaluation at every threshold; 3: training minutes;
# 4: rotary positions in the cross-attentions (RetroConfig.cross_attention_positions)


# ------------------------------------------------------------------------------ corpora


def key_bert(corpus: str) -> str:
  """The BERT that keys a corpus's chunks: the wiki world's English BERT for its text, the toy
  BERT for the others."""
  from realm_jax import data  # pylint: disable=g-import-not-at-top
  return data.WIKI_BERT_DIR if corpus == "wiki" else data.TOY_BERT_DIR


def chunk_database(corpus: str, out: str) -> tuple[str, Optional[str]]:
  """(the corpus's chunk database, the BlockStore it was built over; None: the toy world's,
  which the evaluation finds itself), built on first use, then reused. The wiki world's text is
  its documents (the Vital Articles' leads, docs/wiki_world.md)."""
  from realm_jax.index import chunks  # pylint: disable=g-import-not-at-top
  from realm_jax.jobs import retro  # pylint: disable=g-import-not-at-top
  if corpus == "toy":
    return retro.toy_chunk_database(chunks.TOY_CHUNK_LEN), None
  from realm_jax.data import corpus_build  # pylint: disable=g-import-not-at-top
  from realm_jax.data import python_docs  # pylint: disable=g-import-not-at-top
  from realm_jax.data import sources as sources_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.data import wiki  # pylint: disable=g-import-not-at-top
  if corpus == "wiki":
    docs = wiki.world_dir()
  else:
    docs = os.path.join(out, "pydocs")
    if not os.path.exists(docs):
      python_docs.generate(docs, seed=0)
  blocks = os.path.join(out, f"{corpus}_blocks")
  if not os.path.exists(blocks):
    corpus_build.build_block_store(sources_lib.JsonlSource(os.path.join(docs, "docs.jsonl")),
                                   blocks)
  return retro.cached_chunk_database(blocks, chunks.TOY_CHUNK_LEN, key_bert(corpus)), blocks


def database_identity(path: str) -> dict:
  """What a cell's results depend on in its database (not where it lies): the BlockStore's
  id, the chunking and the keys' sha256."""
  with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
    manifest = json.load(f)
  return {"block_store_id": manifest["block_store_id"], "chunk_len": manifest["chunk_len"],
          "num_chunks": manifest["num_chunks"],
          "key_index_sha256": manifest["key_index"]["sha256"]}


# ------------------------------------------------------------------------------ cells


def _train(run_dir: str, database: str, seed: int, bindings: Sequence[str],
           steps: Optional[int]) -> None:
  """One `python -m realm_jax.train` run of the toy RETRO gin (resumed if interrupted)."""
  from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
  if checkpoints.training_done(run_dir):
    return
  cmd = [sys.executable, "-m", "realm_jax.train", f"--gin_file={GIN}",
         f"--gin.RUN_DIR={run_dir!r}", f"--gin.CHUNK_DATABASE={database!r}",
         f"--gin.train_main.seed={seed}", *(f"--gin.{b}" for b in bindings)]
  if steps is not None:
    cmd.append(f"--gin.NUM_STEPS={steps}")
  os.makedirs(os.path.dirname(run_dir), exist_ok=True)
  started = time.monotonic()
  with open(run_dir + ".log", "a", encoding="utf-8") as log:
    code = subprocess.call(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
  _train_seconds.append((started, time.monotonic() - started))
  if code:
    raise SystemExit(f"retro: {' '.join(cmd)} exited with {code}; see {run_dir}.log")


# `progress.format_duration`: "0:03:05", or "4.2s" under 10 seconds.
_TRAINED = re.compile(r"trained to step \d+ in (?:(\d+):(\d\d):(\d\d)|([\d.]+)s)\b")
_train_seconds: list[tuple[float, float]] = []  # (when a training started, its seconds)


def training_minutes(run_dir: str) -> float:
  """Minutes the trainer took for `run_dir` (its log's last "trained to step N in H:MM:SS", or
  "in S.Ss" under 10 seconds)."""
  try:
    with open(run_dir + ".log", encoding="utf-8") as f:
      found = _TRAINED.findall(f.read())
  except OSError:
    return 0.0
  if not found:
    return 0.0
  hours, minutes, seconds, short = found[-1]
  if short:
    return float(short) / 60
  return int(hours) * 60 + int(minutes) + int(seconds) / 60


def _trained_now(since: float) -> float:
  """Seconds of trainings run by this process since `since` (counted by training_minutes)."""
  return sum(seconds for started, seconds in _train_seconds if started >= since)


def _final_checkpoint(run_dir: str) -> str:
  from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
  step = checkpoints.latest_checkpoint_step(run_dir)
  if step is None:
    raise SystemExit(f"retro: {run_dir} has no checkpoint")
  return checkpoints.checkpoint_path(run_dir, step)


def seed_runs_dir(out: str, corpus: str, seed: int, steps: Optional[int]) -> str:
  """One seed's runs: `<out>/<corpus>/seed<s>`, `seed<s>_steps<N>` at another length."""
  return os.path.join(out, corpus, f"seed{seed}" + (f"_steps{steps}" if steps else ""))


def run_cell(corpus: str, seed: int, row: str, out: str, database: str,
             block_store: Optional[str], steps: Optional[int]) -> dict:
  """Trains the cell's run (the retrofit row after its seed's baseline) and evaluates it."""
  from realm_jax.evaluation import retro as retro_eval  # pylint: disable=g-import-not-at-top
  start = time.monotonic()
  seed_dir = seed_runs_dir(out, corpus, seed, steps)
  bindings = {"baseline": ["RETRIEVAL=False"], "retro": [],
              "retro_own_document": ["RetroJob.exclude_own_document=False"]}.get(row)
  if row == "retrofit":
    baseline = os.path.join(seed_dir, "baseline")
    _train(baseline, database, seed, ["RETRIEVAL=False"], steps)
    bindings = ["RETROFIT=True", f"INIT_CHECKPOINT={_final_checkpoint(baseline)!r}"]
  run_dir = os.path.join(seed_dir, row)
  _train(run_dir, database, seed, bindings, steps)
  result = retro_eval.evaluate_retro(run_dir, max_sequences=EVAL_SEQUENCES,
                                     block_store=block_store)
  # The run's own training time (a run trained earlier and only evaluated now counts it too).
  minutes = training_minutes(run_dir) + (time.monotonic() - start - _trained_now(start)) / 60
  return {"corpus": corpus, "seed": seed, "row": row, "minutes": minutes,
          **cell_figures(result, run_dir)}


def cell_figures(result: dict, run_dir: str) -> dict:
  """The figures a cell keeps, from `evaluate_retro`'s result and the run's config."""
  from realm_jax.evaluation import retro as retro_eval  # pylint: disable=g-import-not-at-top
  config, run_keys = retro_eval.read_run_config(run_dir)
  on, off = result.get("retrieval"), result["no_retrieval"]
  kinds = result["by_kind"]
  filtered = next(x for x in result["by_overlap"] if x["max_overlap"] == MAX_OVERLAP)
  figures = {
      "step": result["step"], "target_tokens": result["target_tokens"],
      "bpb": (on or off)["bits_per_byte"], "bpb_no_retrieval": off["bits_per_byte"],
      "loss": (on or off)["loss"], "loss_no_retrieval": off["loss"],
      "salient_share": kinds["salient"]["share"],
      "loss_salient": kinds["salient"]["retrieval" if on else "no_retrieval"]["loss"],
      "loss_other": kinds["other"]["retrieval" if on else "no_retrieval"]["loss"],
      "filtered_share": filtered["tokens"] / result["target_tokens"],
      "bpb_filtered": _bpb(filtered),
      "overlap_histogram": result["overlap_histogram"],
      # RETRO's filtered evaluation at every threshold: bits per byte over the chunks whose
      # overlap with their neighbours is at most alpha.
      "overlap_curve": [
          {"max_overlap": x["max_overlap"], "token_share": x["tokens"] / result["target_tokens"],
           "bpb": _bpb(x), "bpb_no_retrieval": _bpb(x, retrieval=False)}
          for x in result["by_overlap"]],
  }
  figures.update(model_costs(config, run_keys))
  return figures


def _bpb(subset: dict, retrieval: bool = True) -> Optional[float]:
  """A filtered subset's bits per byte (with retrieval when the run has it); None when no
  chunk passed the filter (the positive control: every chunk overlaps its own text)."""
  figures = (subset.get("retrieval") if retrieval else None) or subset.get("no_retrieval")
  return None if figures is None else figures.get("bits_per_byte")


def model_costs(config: Any, run_config: dict) -> dict:
  """Parameters (all, trained) and forward FLOPs per token of a run's model (`config`, a
  RetroConfig) as it runs (`run_config`: retrieval, retrofit, num_neighbours,
  chunks_per_sequence)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax.models import retro  # pylint: disable=g-import-not-at-top
  shapes = jax.eval_shape(lambda: nn.unbox(retro.init_params(config, jax.random.PRNGKey(0))))
  counts = retro.parameter_counts(shapes)
  context = config.chunk_size * int(run_config["chunks_per_sequence"])
  k = int(run_config["num_neighbours"]) if run_config["retrieval"] else 0
  return {"params": counts["total"] if k else counts["decoder"],
          "params_trained": counts["retrieval"] if run_config.get("retrofit") else (
              counts["total"] if k else counts["decoder"]),
          "flops_per_token": retro.flops_per_token(config, context, k)}


def cell_fingerprint(corpus: str, database: str, steps: Optional[int]) -> str:
  return ablations.fingerprint({"bench": "retro", "cell_format": CELL_FORMAT, "corpus": corpus,
                                "steps": steps,
                                "eval_sequences": EVAL_SEQUENCES,
                                "database": database_identity(database)},
                               gins=FINGERPRINT_GINS, excluded=())


def cells_dir(steps: Optional[int]) -> str:
  """Where the cells of runs of `steps` steps are kept (None: the gin's length)."""
  return DEFAULT_CELLS if steps is None else f"{DEFAULT_CELLS}_steps{steps}"


def run(out: str, corpora: Sequence[str], seeds: Sequence[int], steps: Optional[int],
        cells: str) -> dict:
  """{(corpus, row): {seed: cell}}, every cell made or reused."""
  results: dict = {}
  for corpus in corpora:
    database, block_store = chunk_database(corpus, out)
    fp = cell_fingerprint(corpus, database, steps)
    for seed in seeds:
      for row, label in ROWS:
        path = os.path.join(cells, f"{corpus}_seed{seed}_{row}.json")
        cell = ablations.load_cell(path, fp)
        if cell is None:
          print(f"retro: {corpus}, seed {seed}: {label} ...", flush=True)
          ablations.claim_runs_dir(seed_runs_dir(out, corpus, seed, steps), fp)
          cell = run_cell(corpus, seed, row, out, database, block_store, steps)
          ablations.save_cell(path, cell, fp)
          print(f"retro: {corpus}, seed {seed}, {row}: bits per byte {cell['bpb']:.4f} "
                f"(without retrieval {cell['bpb_no_retrieval']:.4f}), "
                f"{cell['minutes']:.1f} min", flush=True)
        results.setdefault((corpus, row), {})[seed] = cell
  return results


# ------------------------------------------------------------------------------ the report


def table(results: dict, corpora: Sequence[str]) -> str:
  header = ("| corpus | row | params (trained) | forward FLOPs / token | bits/byte, retrieval | "
            "bits/byte, no retrieval | loss: salient spans / other (nats) | "
            f"bits/byte, chunks with overlap <= {MAX_OVERLAP:g} |")
  lines = [header, "|" + "---|" * 8]
  for corpus in corpora:
    for row, label in ROWS:
      cells = results.get((corpus, row), {})
      if not cells:
        continue
      values = lambda key: [c[key] for c in cells.values()]  # noqa: E731
      first = next(iter(cells.values()))
      on = ablations.mean_sd_cell(values("bpb"), 4) if row != "baseline" else "-"
      lines.append(
          f"| {corpus} | {label} | {first['params']:,} ({first['params_trained']:,}) | "
          f"{first['flops_per_token'] / 1e6:.2f} M | {on} | "
          f"{ablations.mean_sd_cell(values('bpb_no_retrieval'), 4)} | "
          f"{ablations.mean_sd_cell(values('loss_salient'))} / "
          f"{ablations.mean_sd_cell(values('loss_other'))} | "
          f"{ablations.mean_sd_cell(values('bpb_filtered'), 4)} |")
  return "\n".join(lines)


def differences(results: dict, corpora: Sequence[str]) -> str:
  """Paired differences (mean over seeds, standard error, whether every seed agrees)."""
  out = []
  pairs = (("retro", "bpb", "baseline", "bpb_no_retrieval",
            "RETRO (retrieval on) minus the baseline, bits per byte"),
           ("retro", "bpb", "retro", "bpb_no_retrieval",
            "RETRO with retrieval minus the same model without, bits per byte"),
           ("retrofit", "bpb", "baseline", "bpb_no_retrieval",
            "RETRO-fitted minus its baseline, bits per byte"),
           ("retrofit", "bpb", "retro", "bpb", "RETRO-fitted minus RETRO from scratch"),
           ("retro_own_document", "bpb", "retro", "bpb",
            "the positive control (own document retrievable) minus RETRO, bits per byte"),
           ("retro", "loss_salient", "baseline", "loss_salient",
            "salient-span loss, RETRO minus the baseline (nats)"),
           ("retro", "loss_other", "baseline", "loss_other",
            "other tokens' loss, RETRO minus the baseline (nats)"))
  for corpus in corpora:
    for row_a, key_a, row_b, key_b, label in pairs:
      a, b = results.get((corpus, row_a), {}), results.get((corpus, row_b), {})
      seeds = sorted(set(a) & set(b))
      if not seeds:
        continue
      d = ablations.paired_difference([a[s][key_a] for s in seeds],
                                      [b[s][key_b] for s in seeds])
      agree = "every seed agrees" if d.all_agree else "the seeds do not agree"
      out.append(f"- {corpus}: {label}: {ablations.format_difference(seeds, d)}; {agree}")
  return "\n".join(out)


def _mean(results: dict, corpus: str, row: str, key: str) -> Optional[float]:
  cells = results.get((corpus, row), {})
  return sum(c[key] for c in cells.values()) / len(cells) if cells else None


def leakage_table(results: dict, corpora: Sequence[str]) -> str:
  """Bits per byte by the filtered evaluation's threshold, a row per corpus and row."""
  alphas = None
  lines = []
  for corpus in corpora:
    for row, label in ROWS:
      cells = list(results.get((corpus, row), {}).values())
      if not cells or "overlap_curve" not in cells[0]:
        continue
      curves = [{x["max_overlap"]: x for x in c["overlap_curve"]} for c in cells]
      alphas = alphas or sorted(curves[0])
      def entry(a):
        bpbs = [c[a]["bpb"] for c in curves]
        share = sum(c[a]["token_share"] for c in curves) / len(curves)
        if any(b is None for b in bpbs):  # no chunk that low in some seed
          return f"- ({share:.0%})"
        return f"{sum(bpbs) / len(bpbs):.4f} ({share:.0%})"

      lines.append(f"| {corpus} | {label} | " + " | ".join(entry(a) for a in alphas) + " |")
  if not lines:
    return ""
  header = "| corpus | row | " + " | ".join(f"alpha <= {a:g}" for a in alphas) + " |"
  return "\n".join([header, "|" + "---|" * (2 + len(alphas))] + lines)


# What the positive control's neighbours save, as a share of its bits without them, for the
# reading to say that the model reads them fully (copying would save about half) or in part.
READS_FULLY, READS_IN_PART = 0.25, 0.05


def reading(results: dict, corpora: Sequence[str]) -> str:
  """What the rows say, in numbers: each sentence names the rows it compares."""
  out = []
  for corpus in corpora:
    m = lambda row, key: _mean(results, corpus, row, key)  # noqa: E731
    base, retro, control = m("baseline", "bpb"), m("retro", "bpb"), m("retro_own_document", "bpb")
    if base is None or retro is None:
      continue
    off = m("retro", "bpb_no_retrieval")
    text = (f"{corpus}: RETRO reads {retro:.3f} bits per byte against the baseline's {base:.3f} "
            f"({'better' if retro < base else 'worse'}); the same RETRO model without its "
            f"neighbours reads {off:.3f}: its neighbours give it {off - retro:.3f}, while "
            f"without them it trails the baseline by {off - base:.3f}, so trained with "
            f"retrieval the decoder became a weaker language model by more than its "
            f"neighbours give back" if retro > base else
            f"{corpus}: RETRO reads {retro:.3f} bits per byte against the baseline's {base:.3f}; "
            f"without its neighbours it reads {off:.3f}" + (
                f": its neighbours give it {off - retro:.3f} of its {base - retro:.3f} lead, "
                f"so the rest comes from how it trained, not from what it retrieves"
                if off - retro < 0.5 * (base - retro) else ""))
    fitted = m("retrofit", "bpb")
    if fitted is not None:
      text += (f". RETRO-fitting the baseline moves it from {base:.3f} to {fitted:.3f}")
    if control is not None:
      control_off = m("retro_own_document", "bpb_no_retrieval")
      gain = control_off - control
      text += (f". The positive control, allowed its own document (the chunk it reads and the "
               f"continuation it predicts), reads {control:.3f} with its neighbours and "
               f"{control_off:.3f} without")
      # A model that reads its neighbours copies the continuation: about half the tokens
      # (the second chunk of each sequence) become nearly free, half the bits.
      if gain > READS_FULLY * control_off:
        text += (f": neighbours that hold the text give it {gain:.3f}, so the CCA reads them "
                 f"and what the real rows lack is neighbours of other documents that do")
      elif gain > READS_IN_PART * control_off:
        text += (f": neighbours that hold the text give it {gain:.3f} ({gain / control_off:.0%} "
                 f"of its bits, where copying the continuation would save about half), against "
                 f"{off - retro:.3f} from the neighbours of other documents that the real rows "
                 f"get: the model has begun to read its neighbours, and what they hold decides "
                 f"what reading buys")
      else:
        text += (f": even neighbours that hold the very text it predicts give it only "
                 f"{gain:.3f}, so at this scale and length of training the model barely reads "
                 f"its neighbours, whatever they hold")
    share = m("retro", "filtered_share")
    if share is not None:
      text += (f". {share:.0%} of the held-out target tokens lie in chunks whose overlap with "
               f"their neighbours is at most {MAX_OVERLAP:g}")
    out.append(f"- {text}.")
  return "\n".join(out)


def keys_description(corpora: Sequence[str]) -> str:
  """Which BERT keys the chunks of `corpora`, for the section's first paragraph."""
  toy = [c for c in corpora if c != "wiki"]
  parts = ([f"the chunk keys of {'both corpora' if len(toy) == 2 else 'the ' + toy[0]} from "
            "the shipped toy BERT, which has read only the toy world's generated text"]
           if toy else [])
  if "wiki" in corpora:
    parts.append("the wiki world's chunk keys from its English BERT (realm_jax/data/assets/"
                 "wiki_bert, trained on the wiki world's train articles)")
  return "; ".join(parts)


def command(corpora: Sequence[str], seeds: Sequence[int], steps: Optional[int] = None) -> str:
  """The command that writes the section of these cells."""
  return (f"python bench/retro.py --seeds {' '.join(map(str, seeds))} --corpora "
          f"{' '.join(corpora)}{f' --steps {steps}' if steps else ''} --write")


def markdown(results: dict, corpora: Sequence[str], seeds: Sequence[int],
             steps: Optional[int] = None) -> str:
  cells = [c for by_seed in results.values() for c in by_seed.values()]
  minutes = sum(c["minutes"] for c in cells)
  first = cells[0] if cells else {}
  return "\n".join([
      f"`{command(corpora, seeds, steps)}` ({minutes:.0f} minutes of runs; cells kept in "
      f"{os.path.relpath(cells_dir(steps), REPO)}/ with their commit and date). Each row is "
      f"gin_configs/experiments/toy_retro.gin (decoder of 4 layers, width 128, CCA in layers 2 "
      f"and 4, a one-layer neighbour encoder, Adam's epsilon 1e-8, m = 16, sequences of 2 "
      f"chunks, k = 2 neighbours of 32 tokens; {keys_description(corpora)}) "
      f"trained "
      f"{first.get('step', '?')} steps; evaluated on {EVAL_SEQUENCES} held-out sequences (the "
      f"last 5% of each corpus's documents: never trained on, never retrieved) with the "
      f"training's k. Bits per byte count the UTF-8 bytes of the targets' detokenised text "
      f"(lower case, as the uncased vocabulary). Salient spans: names and dates found by the "
      f"'union' annotator in the documents' text ({first.get('salient_share', 0):.0%} of the "
      f"held-out target tokens on the corpus of the first cell). Overlap: RETRO's filtered "
      f"evaluation, the longest common token substring of a chunk and its neighbours over the "
      f"chunk's length. Cells: mean ± standard deviation over seeds.",
      "",
      table(results, corpora),
      "",
      "Paired differences:",
      "",
      differences(results, corpora),
      "",
      "RETRO's filtered evaluation: bits per byte (retrieval on; the baseline: its only "
      "figure) over the held-out chunks whose longest common token substring with their "
      "neighbours is at most alpha of the chunk, and the share of target tokens those chunks "
      "hold (mean over seeds):",
      "",
      leakage_table(results, corpora),
      "",
      "Reading (means over the seeds):",
      "",
      reading(results, corpora),
  ])


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--corpora", nargs="+", choices=CORPORA, default=list(DEFAULT_CORPORA),
                      help="corpora (default: %(default)s; 'wiki', the wiki world's text, "
                           "alone has a section of its own)")
  parser.add_argument("--out", default="/tmp/retro_bench",
                      help="run directories and the Python-docs corpus (resumable)")
  parser.add_argument("--steps", type=int, default=None,
                      help="training steps of every run (default: the gin's); with it, the "
                           "runs, cells and section are the length's own (runs in "
                           "<out>/<corpus>/seed<s>_steps<N>, cells in "
                           "bench/results/retro_steps<N>, the section's title ends ', trained "
                           "N steps')")
  parser.add_argument("--cells", default=None,
                      help="where finished cells are kept (default: "
                           f"{os.path.relpath(DEFAULT_CELLS, REPO)}, with --steps N "
                           f"{os.path.relpath(DEFAULT_CELLS, REPO)}_steps<N>)")
  parser.add_argument("--write", action="store_true",
                      help=f"write the section {SECTION!r} of bench/docs/benchmarks.md")
  args = parser.parse_args(argv)
  if args.steps is not None and args.steps < 1:
    parser.error("--steps: a positive count")
  if args.write and "wiki" in args.corpora and args.corpora != ["wiki"]:
    parser.error(f"--write: 'wiki' alone ({WIKI_SECTION!r}), or the others ({SECTION!r})")
  if args.write and args.cells is not None:
    parser.error("--write: the section cites the default --cells; leave it out")
  results = run(os.path.abspath(args.out), args.corpora, args.seeds, args.steps,
                args.cells or cells_dir(args.steps))
  body = markdown(results, args.corpora, args.seeds, args.steps)
  print("\n" + body, flush=True)
  if args.write:
    title = WIKI_SECTION if args.corpora == ["wiki"] else SECTION
    report.write_section(title + (f", trained {args.steps} steps" if args.steps else ""), body)
  return 0


if __name__ == "__main__":
  sys.exit(main())
