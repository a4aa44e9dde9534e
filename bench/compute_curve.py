r"""REALM minus the ORQA-style baseline as pretraining grows: the compute curve.

  python bench/compute_curve.py [--world toy|wiki] [--multiples 1 4 16] [--seeds 0 1 2]
      [--report_only] [--write]

The paper pretrains 200k steps at batch 512; the toy recipe 400 steps at batch 8, where REALM ties
the ORQA-style baseline. This bench moves pretraining compute alone: for each multiple m of the
toy recipe's pretraining (400 steps), REALM's row of bench/ablations.py is made with 400 x m
steps, and the ORQA-style baseline beside it from the same seed's ICT warm start; the warm start,
fine-tuning and evaluation are the recipe's at every length. REALM's retriever fine-tuned with
the BERT reader (Table 2's mixed row) splits REALM minus the baseline into the retriever's part
and the encoder's. Each cell is one of bench/ablations.py's (`ablations.run`, rows "realm",
"orqa" and "realm_retriever_bert_encoder"), kept per length in
`bench/results/compute_curve/toy_<steps>/` and reused; the 1x cells are the Table 2 bench's own
(bench/results/ablations/), the same runs. Seeds: those asked for at every length, and 0-4 at 1x.

The wiki world (`--world wiki`, docs/wiki_world.md): the wiki recipe (`recipe.WikiRecipe`, its
English BERT and settings, the retriever held for the first half of every length) with 1x its
200 pretraining steps. Per seed one ICT warm start, one ORQA-style baseline and one BM25 reader
are shared by every length; each length adds a REALM pretraining, its fine-tuning and
evaluation, and the mixed row's fine-tuning of the same pretraining. A cell
(`<cells>/wiki_<steps>/seed<s>.json`) holds the three rows of one seed and length, and the
reading of REALM's encoder at the checkpoint it fine-tunes (`toy_bert.measure` on 300 held-out
test-article sentences).

`--oracle_blocks n` (wiki world): REALM pretrained with n blocks of another article that state
the masked span first among its candidates (`PretrainJob.oracle_blocks`), in runs
(`steps<N>_oracle<n>`) and cells (`wiki_<N>_oracle<n>/`) of their own, against the seed's shared
baseline: whether the encoder learns to read, and the retriever to find, when blocks that can
help are always there. `--encoder_lr x` (wiki world): REALM's encoder pretrained at peak learning
rate x instead of the recipe's 3e-4, its retriever's rate kept (`retriever_lr_scale` scaled to
match), in runs (`steps<N>_enclr<x>`) and cells (`wiki_<N>_enclr<x>/`) of their own: whether an
encoder that keeps more of the BERT's copying (bench/copy_circuit.py) lets REALM gain.
`--bert DIR` (wiki world): the baseline's reader and REALM's encoder from another English BERT
(as `python -m realm_jax.toy_bert --world wiki --out DIR` writes one), each seed's runs apart
(`wiki_runs.seed_dir`) and cells `wiki_<N>_bert<h>/`: whether an encoder that reads a stating
block lets REALM gain. `--candidates k` (wiki world): REALM pretrained with k candidates per
masked query instead of 8 (`PretrainJob.num_candidates`), runs `steps<N>_cand<k>`: whether a
retriever whose gradient reaches more blocks learns to find those that state the span. The
variants combine.

The toy world's reading is measured on each seed's REALM pretraining under --out at its last
checkpoint (the one fine-tuning starts from), and kept in `toy_<steps>/seed<s>_reading.json`; at
1x, where the Table 2 bench keeps cells alone, the pretraining is made again from the seed.

Per length: REALM minus the baseline, paired by seed (mean ± standard error, each seed's value,
whether every seed agrees), on test EM and on zero-shot test recall@5, and REALM's retrieval
utility and masked-span accuracy at its last pretraining checkpoint (mean ± standard deviation)
and its reading (mean). `--write` adds the plot of both worlds (bench/docs/compute_curve.png).
A cell is made in about 4 + 6m minutes on 2 cores (16x, beside another run: a toy cell took 98
minutes, a wiki cell 75); run it in the background: every finished cell is kept, and a stopped
run resumes from the cells and the runs under --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Callable, Mapping, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import ablations  # noqa: E402  pylint: disable=wrong-import-position
from bench import report  # noqa: E402  pylint: disable=wrong-import-position
from bench import wiki_runs  # noqa: E402  pylint: disable=wrong-import-position

TOY_STEPS = 400  # experiments/toy_pretrain.gin's NUM_STEPS: the 1x of the axis
DEFAULT_MULTIPLES = (1, 4, 16)
DEFAULT_SEEDS = (0, 1, 2)
ONE_X_SEEDS = (0, 1, 2, 3, 4)
# REALM, the ORQA-style baseline, and REALM's retriever with the BERT reader (Table 2's mixed row):
# with it, REALM minus the baseline splits into the retriever's part and the encoder's.
MIXED = "realm_retriever_bert_encoder"
ROWS = ("realm", "orqa", MIXED)
CELLS = os.path.join(REPO, "bench", "results", "compute_curve")
# The reading: held-out sentences per context (`toy_bert.measure_params`).
READING_SENTENCES = 300
# The encoder's masked-wordpiece accuracy beside the stating block, with the null document and
# beside another document's block (`toy_bert.measure`'s keys).
READING = ("with_context", "without_context", "with_distractor")
PLOT = os.path.join(REPO, "bench", "docs", "compute_curve.png")
SECTIONS = {world: f"REALM against the ORQA-style baseline as pretraining grows ({world} world)"
            for world in ("toy", "wiki")}
# experiments/toy_pretrain.gin's peak learning rate and retriever scale, which the wiki recipe
# pretrains with (tests/bench/test_compute_curve.py reads them from the gin).
PRETRAIN_LR, RETRIEVER_LR_SCALE = 3e-4, 0.3


def steps_of(multiple: int) -> int:
  return TOY_STEPS * multiple


def cells_dir(multiple: int, cells: str = CELLS) -> str:
  """Where a length's cells are kept: the Table 2 bench's at 1x (the same rows and runs), else
  `<cells>/toy_<steps>`."""
  return ablations.DEFAULT_CELLS if multiple == 1 else os.path.join(cells,
                                                                    f"toy_{steps_of(multiple)}")


def seeds_at(multiple: int, seeds: Sequence[int]) -> tuple[int, ...]:
  """The seeds of one length: those asked for, and 0-4 at 1x."""
  return tuple(sorted(set(seeds) | (set(ONE_X_SEEDS) if multiple == 1 else set())))


def pretrain_steps_option(multiple: int) -> Optional[int]:
  """`ablations.run`'s pretrain_steps: None (the recipe's) at 1x, so its cells are Table 2's."""
  return None if multiple == 1 else steps_of(multiple)


def toy_options(multiple: int, toy_bert: Optional[str]) -> dict:
  """`ablations.toy_cell_options` of one length of the toy world."""
  return ablations.toy_cell_options(toy_bert=toy_bert, ict_from_bert=False,
                                    pretrain_steps=pretrain_steps_option(multiple),
                                    finetune_steps=None)


def kept_rows(multiple: int, seeds: Sequence[int], toy_bert: Optional[str],
              cells: str = CELLS) -> dict[str, dict[int, dict]]:
  """{row: {seed: cell}} of the kept, current cells of one length (nothing is made)."""
  options = toy_options(multiple, toy_bert)
  rows: dict[str, dict[int, dict]] = {}
  for name in ROWS:
    fingerprint = ablations.row_fingerprint(ablations.ROW_BY_NAME[name], options)
    for seed in seeds:
      path = os.path.join(cells_dir(multiple, cells), f"seed{seed}_{name}.json")
      cell = ablations.load_cell(path, fingerprint)
      if cell is not None:
        rows.setdefault(name, {})[seed] = cell
  return rows


def make_rows(multiple: int, seeds: Sequence[int], out: str, toy_bert: Optional[str],
              cells: str = CELLS) -> dict[str, dict[int, dict]]:
  """{row: {seed: cell}} of one length, its missing cells made (`ablations.run`)."""
  return ablations.run(os.path.join(out, f"toy_{steps_of(multiple)}"), ROWS, seeds=tuple(seeds),
                       pretrain_steps=pretrain_steps_option(multiple), finetune_steps=None,
                       toy_bert=toy_bert, cells=cells_dir(multiple, cells))


def reading_path(multiple: int, seed: int, cells: str = CELLS) -> str:
  """Where the reading of one toy REALM pretraining is kept (1x too: the Table 2 bench keeps no
  pretrained model to read)."""
  return os.path.join(cells, f"toy_{steps_of(multiple)}", f"seed{seed}_reading.json")


def toy_readings(multiple: int, seeds: Sequence[int], out: str, toy_bert: Optional[str],
                 cells: str = CELLS, make: bool = True) -> dict[int, dict]:
  """{seed: reading cell} of one length of the toy world: the reading of REALM's encoder at its
  last pretraining checkpoint (the one its fine-tuning starts from), measured on the run under
  `out` (`ablations.realm_pretraining`: made again when missing, as at 1x) and kept."""
  fingerprint = ablations.fingerprint({**toy_options(multiple, toy_bert),
                                       "reading_sentences": READING_SENTENCES})
  readings = {}
  for seed in seeds:
    path = reading_path(multiple, seed, cells)
    cell = ablations.load_cell(path, fingerprint)
    if cell is None and make:
      from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
      print(f"compute_curve: toy world, seed {seed}, {steps_of(multiple)} steps: the encoder's "
            "reading ...", flush=True)
      run_dir = ablations.realm_pretraining(os.path.join(out, f"toy_{steps_of(multiple)}"), seed,
                                            pretrain_steps=pretrain_steps_option(multiple),
                                            toy_bert=toy_bert)
      step = checkpoints.latest_checkpoint_step(run_dir)
      cell = {"reading": encoder_reading(run_dir, step, "toy"), "step": step,
              "pretraining": ablations.pretraining_id(run_dir)}
      ablations.save_cell(path, cell, fingerprint)
    if cell is not None:
      readings[seed] = cell
  return readings


def with_readings(rows: Mapping[str, Mapping[int, dict]],
                  readings: Mapping[int, dict]) -> dict[str, dict[int, dict]]:
  """`rows` with each REALM cell given its seed's kept reading (as a wiki cell holds one)."""
  realm = {seed: {**cell, "reading": readings[seed]["reading"]} if seed in readings else cell
           for seed, cell in rows.get("realm", {}).items()}
  return {**rows, "realm": realm} if realm else dict(rows)


def curve_line(multiple: int, rows: Mapping[str, Mapping[int, dict]],
               steps: Optional[int] = None) -> list[str]:
  """One length's row of the table: steps (default: the toy world's), seeds, REALM - baseline
  on EM and recall@5, that EM difference's two parts (the retriever's: the mixed row - baseline;
  the encoder's: REALM - the mixed row), REALM's utility, masked-span accuracy and reading (mean
  over seeds)."""
  steps = steps_of(multiple) if steps is None else steps
  cells = []
  for a, b, key in (("realm", "orqa", ablations.EM), ("realm", "orqa", ablations.RECALL),
                    (MIXED, "orqa", ablations.EM), ("realm", MIXED, ablations.EM)):
    pair = ablations.paired(rows, a, b, key)
    if pair is None:
      cells.append("n/a")
      continue
    seeds, difference = pair
    agree = "; every seed agrees" if difference.all_agree and len(seeds) > 1 else ""
    cells.append(ablations.format_difference(seeds, difference) + agree)
  realm = rows.get("realm", {})
  for key in ("retrieval_utility", "mlm_accuracy"):
    cells.append(ablations.mean_sd_cell([cell.get(key) for cell in realm.values()]))
  readings = [cell["reading"] for cell in realm.values() if cell.get("reading")]
  reading = (" / ".join(f"{sum(r[key] for r in readings) / len(readings):.3f}" for key in READING)
             if readings else "n/a")
  if readings and len(readings) < len(realm):
    reading += f" ({len(readings)} seeds)"
  cells.append(reading)
  return [f"{steps:,} ({multiple}x)", str(len(realm)), *cells]


def table(rows_by_multiple: Mapping[int, Mapping[str, Mapping[int, dict]]],
          steps: Callable[[int], int] = steps_of) -> str:
  """The curve: a row per length (`steps` turns a multiple into pretraining steps)."""
  header = ["pretraining steps", "REALM seeds", "REALM - baseline, test EM",
            "REALM - baseline, zero-shot test recall@5",
            "of which REALM's retriever: REALM retriever + BERT reader - baseline, test EM",
            "of which REALM's encoder: REALM - REALM retriever + BERT reader, test EM",
            "REALM's retrieval utility",
            "REALM's masked-span accuracy",
            "REALM's encoder reading: stating block / null / another block"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for multiple in sorted(rows_by_multiple):
    lines.append("| " + " | ".join(curve_line(multiple, rows_by_multiple[multiple],
                                              steps(multiple))) + " |")
  return "\n".join(lines)


# ---------------------------------------------------------------------------- the wiki world


def wiki_steps(multiple: int, smoke: bool = False) -> int:
  return wiki_runs.recipe_steps("pretrain", smoke) * multiple


@dataclasses.dataclass(frozen=True)
class Variant:
  """REALM's wiki-world pretraining changed in one or more ways (every field unset: the
  recipe's). A variant's runs and cells are its own (`suffix`), against the seed's baseline."""
  oracle: int = 0  # PretrainJob.oracle_blocks: blocks stating the masked span, first
  encoder_lr: Optional[float] = None  # the encoder's peak rate (`encoder_lr_bindings`)
  bert: Optional[str] = None  # another English BERT's directory, for every run of the seed
  candidates: Optional[int] = None  # PretrainJob.num_candidates (the recipe's 8)

  @property
  def is_set(self) -> bool:
    return bool(self.oracle or self.encoder_lr or self.bert or self.candidates)

  def run_suffix(self) -> str:
    """The pretraining run's suffix: "_oracle<n>", "_enclr<x>", "_cand<k>" (the BERT names the
    seed's directory instead: `wiki_runs.seed_dir`)."""
    return ((f"_oracle{self.oracle}" if self.oracle else "")
            + (f"_enclr{self.encoder_lr:g}" if self.encoder_lr else "")
            + (f"_cand{self.candidates}" if self.candidates else ""))

  def suffix(self) -> str:
    """The cells' suffix: the run's, then "_bert<h>" (`wiki_runs.bert_suffix`)."""
    return self.run_suffix() + wiki_runs.bert_suffix(self.bert)

  def options(self) -> dict:
    """What the cells' fingerprint adds for it (the BERT's sha256 is `world_options`')."""
    return {**({"oracle_blocks": self.oracle} if self.oracle else {}),
            **({"encoder_lr": self.encoder_lr} if self.encoder_lr else {}),
            **({"num_candidates": self.candidates} if self.candidates else {})}

  def pretrain_bindings(self) -> list[str]:
    """REALM's pretraining bindings beside the recipe's."""
    return (([f"PretrainJob.oracle_blocks={self.oracle}"] if self.oracle else [])
            + (encoder_lr_bindings(self.encoder_lr) if self.encoder_lr else [])
            + ([f"PretrainJob.num_candidates={self.candidates}"] if self.candidates else []))

  def texts(self) -> list[tuple[str, str, str]]:
    """What `--write` adds for each field set: (its command-line flag, its words in the
    section's title, its sentence in the section's description)."""
    texts = []
    if self.oracle:
      texts.append((
          f" --oracle_blocks {self.oracle}",
          f", REALM with {self.oracle} oracle block{'s' * (self.oracle > 1)}",
          f"; REALM pretrained with {self.oracle} block(s) of another article that state the "
          "masked span first among its candidates (`PretrainJob.oracle_blocks`, "
          "realm_jax/batches/stating_blocks.py), its retrieval utility measured with them"))
    if self.encoder_lr:
      rate = PRETRAIN_LR * RETRIEVER_LR_SCALE
      texts.append((
          f" --encoder_lr {self.encoder_lr:g}",
          f", REALM's encoder at learning rate {self.encoder_lr:g}",
          f"; REALM's encoder pretrained at peak learning rate {self.encoder_lr:g} (the "
          f"recipe's {PRETRAIN_LR:g}), its retriever's rate kept ({rate:g}: "
          f"`PretrainJob.retriever_lr_scale` {rate / self.encoder_lr:g})"))
    if self.candidates:
      texts.append((
          f" --candidates {self.candidates}", f", REALM with {self.candidates} candidates",
          f"; REALM pretrained with {self.candidates} candidates per masked query, the null "
          "document among them (`PretrainJob.num_candidates`; the recipe's 8)"))
    if self.bert:
      sha256 = wiki_runs.bert_sha256(self.bert)
      texts.append((
          f" --bert {self.bert}", f", from the English BERT {sha256[:8]}",
          f"; the encoder and the readers (the baseline's and REALM's) from the English BERT "
          f"{self.bert} (model.safetensors' sha256 {sha256}) instead of the shipped one, in "
          "runs of their own"))
    return texts


RECIPE = Variant()


def wiki_options(multiple: int, smoke: bool = False, variant: Variant = RECIPE) -> dict:
  """What a wiki cell is fingerprinted with besides the gins: the world's options
  (`wiki_runs.world_options`, the English BERT's sha256 among them), the length, the reading's
  size, and the variant's (`Variant.options`)."""
  return {**wiki_runs.world_options(ablations.EVAL_SPLIT, smoke, variant.bert),
          "pretrain_steps": wiki_steps(multiple, smoke),
          "reading_sentences": READING_SENTENCES, **variant.options()}


def encoder_lr_bindings(encoder_lr: float) -> list[str]:
  """The pretraining's peak learning rate `encoder_lr`, the retriever's scale changed so that its
  own peak rate stays the recipe's (PRETRAIN_LR x RETRIEVER_LR_SCALE)."""
  from realm_jax import gin_utils  # pylint: disable=import-outside-toplevel
  return [gin_utils.binding("LEARNING_RATE", encoder_lr),
          gin_utils.binding("PretrainJob.retriever_lr_scale",  # 12 digits: no 2.9999999999999996
                            float(f"{PRETRAIN_LR * RETRIEVER_LR_SCALE / encoder_lr:.12g}"))]


def wiki_cell_path(multiple: int, seed: int, cells: str = CELLS, smoke: bool = False,
                   variant: Variant = RECIPE) -> str:
  return os.path.join(cells, f"wiki_{wiki_steps(multiple, smoke)}{variant.suffix()}",
                      f"seed{seed}.json")


def wiki_recipe(multiple: int, seed: int, out: str, smoke: bool = False, mixed: bool = False,
                variant: Variant = RECIPE):
  """The wiki recipe of one seed and length under `out` (`wiki_runs.recipe`: `seed<s>/steps<N>`,
  1x being the Table 2 bench's REALM run). `mixed`: its fine-tuning slot is the mixed row's
  (REALM's retriever, the BERT reader), as the Table 2 bench names it. `variant`: REALM's
  pretraining in a run of its own (`Variant.run_suffix`), from another BERT in a seed directory
  of its own (`wiki_runs.seed_dir`)."""
  steps = wiki_steps(multiple, smoke)
  ablations.wiki_seed_dir(out, seed, smoke, variant.bert)
  kwargs = {"finetune_name": MIXED, "finetune_reader": "bert"} if mixed else {}
  pretrain_bindings = variant.pretrain_bindings()
  if pretrain_bindings:
    kwargs["pretrain_bindings"] = pretrain_bindings
  return wiki_runs.recipe(out, seed, f"steps{steps}{variant.run_suffix()}", pretrain_steps=steps,
                          smoke=smoke, bert=variant.bert, **kwargs)


def encoder_reading(run_dir: str, step: int, world: str,
                    num_sentences: int = READING_SENTENCES) -> dict:
  """The reading (`toy_bert.measure_params`: held-out sentences beside the stating block, the
  null document and another document's block) of a pretraining checkpoint's encoder."""
  from realm_jax import checkpoints, toy_bert  # pylint: disable=import-outside-toplevel
  params, config, _ = checkpoints.restore_params(run_dir, step)
  measured = toy_bert.measure_params(params["encoder"], config, num_sentences, world)
  return {name: measured[name]["wordpiece_accuracy"] for name in READING}


def wiki_cell(summary: dict, reading: dict, minutes: float) -> dict:
  """One seed and length of the wiki world: REALM's row and the baseline's, as
  `ablations.paired` reads them, from the wiki recipe's summary."""
  utility = summary["retrieval_utility"]["last"]
  return {
      "realm": {ablations.EM: summary["qa"]["realm"]["exact_match"],
                ablations.RECALL: summary["recall"]["pretrained"]["recall@5"],
                "retrieval_utility": utility, "mlm_accuracy": summary["mlm_accuracy_realm"],
                "reading": reading},
      "orqa": {ablations.EM: summary["qa"]["orqa"]["exact_match"],
               ablations.RECALL: summary["recall"]["warm_start"]["recall@5"]},
      "bm25_reader_em": summary["qa"]["bm25_reader"]["exact_match"],
      "pretrain_checkpoint": summary["pretrain_checkpoint"], "minutes": minutes,
      "recipe": summary}


def wiki_rows(multiple: int, seeds: Sequence[int], out: str, cells: str = CELLS,
              make: bool = True, smoke: bool = False,
              variant: Variant = RECIPE) -> dict[str, dict[int, dict]]:
  """{row: {seed: cell}} of one length of the wiki world, its missing cells made (`make`), REALM's
  rows of `variant`."""
  fingerprint = ablations.fingerprint(wiki_options(multiple, smoke, variant))
  rows: dict[str, dict[int, dict]] = {}
  for seed in seeds:
    path = wiki_cell_path(multiple, seed, cells, smoke, variant)
    cell = ablations.load_cell(path, fingerprint)
    if cell is None and make:
      print(f"compute_curve: wiki world, seed {seed}, {wiki_steps(multiple, smoke)} steps ...",
            flush=True)
      start = time.monotonic()
      run = wiki_recipe(multiple, seed, out, smoke, variant=variant)
      summary = run.run()
      step = summary["pretrain_checkpoint"]["step"]
      reading = encoder_reading(run.pretrain, step, "wiki",
                                wiki_runs.SMOKE_STEPS["reading"] if smoke else READING_SENTENCES)
      cell = wiki_cell(summary, reading, (time.monotonic() - start) / 60)
      ablations.save_cell(path, cell, fingerprint)
    if cell is not None and MIXED not in cell and make:
      print(f"compute_curve: wiki world, seed {seed}, {wiki_steps(multiple, smoke)} steps: "
            "REALM's retriever with the BERT reader ...", flush=True)
      summary = wiki_recipe(multiple, seed, out, smoke, mixed=True, variant=variant).run()
      cell = {**cell, MIXED: {ablations.EM: summary["qa"]["realm"]["exact_match"],
                              ablations.RECALL: summary["recall"]["pretrained"]["recall@5"]},
              "recipe_mixed": summary}
      ablations.save_cell(path, cell, fingerprint)
    if cell is not None:
      for name in ROWS:
        if name in cell:
          rows.setdefault(name, {})[seed] = cell[name]
  return rows


# ---------------------------------------------------------------------------- the plot


def curve_points(rows_by_multiple: Mapping[int, Mapping[str, Mapping[int, dict]]],
                 steps: Callable[[int], int], key: str) -> list[tuple[int, float, float, int]]:
  """[(pretraining steps, mean paired REALM - baseline difference of `key`, its standard error
  (NaN for one seed), seeds)] of the lengths that have a pair, by steps."""
  points = []
  for multiple in sorted(rows_by_multiple):
    pair = ablations.paired(rows_by_multiple[multiple], "realm", "orqa", key)
    if pair is not None:
      seeds, difference = pair
      points.append((steps(multiple), difference.mean, difference.standard_error, len(seeds)))
  return points


def kept_curve(world: str, cells: str, toy_bert: Optional[str],
               multiples: Sequence[int] = DEFAULT_MULTIPLES) -> dict[int, dict]:
  """{multiple: rows} of a world's kept cells (seeds 0-4, nothing made), the toy world's
  REALM cells with their readings."""
  curve = {}
  for multiple in multiples:
    if world == "wiki":
      curve[multiple] = wiki_rows(multiple, ONE_X_SEEDS, "", cells, make=False)
    else:
      curve[multiple] = with_readings(
          kept_rows(multiple, ONE_X_SEEDS, toy_bert, cells),
          toy_readings(multiple, ONE_X_SEEDS, "", toy_bert, cells, make=False))
  return curve


def plot(curves: Mapping[str, Mapping[int, dict]], path: str = PLOT) -> None:
  """The curve as a PNG: REALM minus the baseline on test EM and on zero-shot test recall@5
  against pretraining steps (log axis), a line per world, error bars of one standard error."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
  steps = {"toy": steps_of, "wiki": wiki_steps}
  figure, axes = pyplot.subplots(1, 2, figsize=(10, 4))
  for ax, (key, what) in zip(axes, ((ablations.EM, "test EM"),
                                    (ablations.RECALL, "zero-shot test recall@5"))):
    for world, curve in curves.items():
      points = curve_points(curve, steps[world], key)
      if points:
        x, mean, se, _ = zip(*points)
        ax.errorbar(x, mean, yerr=[0.0 if e != e else e for e in se], marker="o", capsize=4,
                    label=f"{world} world (1x = {steps[world](1)} steps)")
    ax.axhline(0.0, color="gray", linewidth=0.8)
    ax.set_xscale("log")
    ticks = sorted({x for world, curve in curves.items()
                    for x, *_ in curve_points(curve, steps[world], key)})
    ax.set_xticks(ticks, [f"{x:,}" for x in ticks])
    ax.minorticks_off()
    ax.set_xlabel("REALM pretraining steps (log)")
    ax.set_ylabel(f"REALM - ORQA-style, {what}")
    ax.legend()
  figure.suptitle("REALM minus the ORQA-style baseline as pretraining grows "
                  "(mean over paired seeds ± one standard error)", fontsize=10)
  figure.tight_layout()
  # No software version or date in the file: the same cells make the same bytes.
  figure.savefig(path, dpi=100, metadata={"Software": None})
  pyplot.close(figure)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--world", choices=("toy", "wiki"), default="toy",
                      help="the toy world (default; 1x = 400 steps) or the wiki world (1x = its "
                           "recipe's 200)")
  parser.add_argument("--multiples", nargs="+", type=int, default=DEFAULT_MULTIPLES,
                      help="pretraining lengths as multiples of the world's recipe's "
                           "(default: %(default)s)")
  parser.add_argument("--seeds", nargs="+", type=int, default=DEFAULT_SEEDS,
                      help="seeds at every length (default: %(default)s; 0-4 at 1x as well)")
  parser.add_argument("--out", default=None,
                      help="run directories (default /tmp/realm_compute_curve/toy for the toy "
                           f"world, {wiki_runs.DEFAULT_OUT} for the wiki world's, shared with "
                           "bench/ablations.py --world wiki)")
  parser.add_argument("--cells", default=CELLS,
                      help="where the cells are kept, a directory per world and length "
                           f"(default: {os.path.relpath(CELLS, REPO)}; the toy world's 1x cells "
                           "are bench/ablations.py's)")
  parser.add_argument("--report_only", action="store_true",
                      help="make nothing: the table of the kept cells")
  parser.add_argument("--write", action="store_true",
                      help="write the table into bench/docs/benchmarks.md (a section per world) "
                           "and, on a CPU, the plot of both worlds' kept cells "
                           "(bench/docs/compute_curve.png)")
  parser.add_argument("--smoke", action="store_true",
                      help="the wiki world's cells at a tiny size (ICT 8 steps, 1x = 4 "
                           "pretraining steps, fine-tuning 4, reading 16 sentences): the bench "
                           "itself checked; its cells go to --cells, nothing is written")
  parser.add_argument("--oracle_blocks", type=int, default=0,
                      help="with --world wiki: REALM pretrained with this many blocks that "
                           "state the masked span first among its candidates "
                           "(PretrainJob.oracle_blocks; the experiment that separates retrieval "
                           "from reading), in runs and cells of its own and a section of its "
                           "own; the baseline is the seed's shared one")
  parser.add_argument("--encoder_lr", type=float, default=None,
                      help="with --world wiki: REALM's encoder pretrained at this peak learning "
                           f"rate (the recipe's: {PRETRAIN_LR:g}), the retriever's rate kept, in "
                           "runs and cells of its own and a section of its own")
  parser.add_argument("--bert", default=None,
                      help="with --world wiki: the encoder and the readers (the baseline's and "
                           "REALM's) from this English BERT directory (transformers layout, as "
                           "`python -m realm_jax.toy_bert --world wiki --out` writes it) instead "
                           "of the shipped one, in seed directories (seed<s>_bert<sha256, 8 "
                           "digits>) and cells of its own and a section of its own")
  parser.add_argument("--candidates", type=int, default=None,
                      help="with --world wiki: REALM pretrained with this many candidates per "
                           "masked query, the null document among them (PretrainJob."
                           "num_candidates; the recipe's: 8), in runs and cells of its own and a "
                           "section of its own; the baseline is the seed's shared one")
  args = parser.parse_args()
  if any(m < 1 for m in args.multiples):
    parser.error("--multiples: positive integers")
  if args.smoke and (args.world != "wiki" or args.write or args.cells == CELLS):
    parser.error("--smoke: with --world wiki and a --cells of its own, never --write")
  if args.oracle_blocks and (args.world != "wiki" or args.oracle_blocks < 0):
    parser.error("--oracle_blocks: a positive count, with --world wiki")
  if args.encoder_lr is not None and (args.world != "wiki" or not args.encoder_lr > 0):
    parser.error("--encoder_lr: a positive learning rate, with --world wiki")
  if args.candidates is not None and (args.world != "wiki" or args.candidates < 2):
    parser.error("--candidates: at least 2 (the null document and one block), with --world wiki")
  if args.bert is not None:
    if args.world != "wiki":
      parser.error("--bert: with --world wiki")
    if not os.path.isfile(os.path.join(args.bert, "model.safetensors")):
      parser.error(f"--bert {args.bert}: no model.safetensors there (a transformers BERT "
                   "directory, as `python -m realm_jax.toy_bert --world wiki --out` writes it)")
    args.bert = os.path.abspath(args.bert)
  variant = Variant(args.oracle_blocks, args.encoder_lr, args.bert, args.candidates)
  from realm_jax import recipe as recipe_lib  # pylint: disable=import-outside-toplevel
  toy_bert = recipe_lib.toy_bert_dir("shipped")
  cells = os.path.abspath(args.cells)
  out = os.path.abspath(args.out or ("/tmp/realm_compute_curve/toy" if args.world == "toy"
                                     else wiki_runs.DEFAULT_OUT))
  os.chdir(REPO)  # the recipe's children run from the repository root
  rows_by_multiple = {}
  for multiple in sorted(set(args.multiples)):
    # A smoke run and a variant make the seeds asked for alone (no 0-4 at 1x).
    seeds = (tuple(sorted(set(args.seeds))) if args.smoke or variant.is_set
             else seeds_at(multiple, args.seeds))
    if args.world == "wiki":
      rows_by_multiple[multiple] = wiki_rows(multiple, seeds, out, cells,
                                             make=not args.report_only, smoke=args.smoke,
                                             variant=variant)
    else:
      rows = (kept_rows(multiple, seeds, toy_bert, cells) if args.report_only
              else make_rows(multiple, seeds, out, toy_bert, cells))
      readings = toy_readings(multiple, args.seeds, out, toy_bert, cells,
                              make=not args.report_only)
      rows_by_multiple[multiple] = with_readings(rows, readings)
  text = table(rows_by_multiple, (lambda m: wiki_steps(m, args.smoke)) if args.world == "wiki"
               else steps_of)
  print("\n" + text)
  if args.write:
    paths: dict[int, list[str]] = {}  # {seed: its cell files at every length}
    for m in rows_by_multiple:
      for seed in (sorted(set(args.seeds)) if variant.is_set else seeds_at(m, args.seeds)):
        paths.setdefault(seed, []).extend(
            [wiki_cell_path(m, seed, cells, variant=variant)] if args.world == "wiki"
            else
            [os.path.join(cells_dir(m, cells), f"seed{seed}_{name}.json") for name in ROWS])
    # The standard sections name the axis; a variant names the lengths it measured.
    lengths = ("1x, 4x and 16x" if not variant.is_set else
               ", ".join(f"{m}x" for m in sorted(set(args.multiples))))
    what = (f"REALM's row of bench/ablations.py pretrained for {lengths} the recipe's 400 "
            "steps, the ORQA-style baseline beside it from the same seed's ICT warm start"
            if args.world == "toy" else
            f"the wiki recipe (docs/wiki_world.md) with {lengths} its 200 pretraining "
            "steps, the retriever held for the first half of each, the ORQA-style baseline "
            "and its ICT warm start shared by "
            + ("a seed" if variant.is_set else "the lengths of a seed"))
    flags, title = f"--world {args.world}", SECTIONS[args.world]
    if variant.is_set:
      flags += (f" --multiples {' '.join(map(str, sorted(set(args.multiples))))} --seeds "
                f"{' '.join(map(str, args.seeds))}")
    for flag, named, described in variant.texts():
      flags, title, what = flags + flag, title + named, what + described
    body = (f"`python bench/compute_curve.py {flags} --write` on "
            f"{ablations.cells_machines(paths)}: {what}; the warm start, fine-tuning and "
            "evaluation are the recipe's at every length. Differences are REALM minus the "
            "baseline, paired by seed: mean ± standard error (each seed's value). EM and "
            "zero-shot recall@5 on the test questions; fine-tuning picks its checkpoint on "
            "dev. Reading: masked-wordpiece accuracy of REALM's encoder on held-out sentences "
            "(`toy_bert.measure`).\n\n" + text)
    import jax  # pylint: disable=import-outside-toplevel
    device = jax.devices()[0]
    # Cells made on an accelerator get a section of their own, named after it.
    report.write_section(title, body,
                         accelerator=None if device.platform == "cpu" else device.device_kind)
    if device.platform == "cpu" and not variant.is_set:
      plot({world: kept_curve(world, cells, toy_bert) for world in ("toy", "wiki")})
      print(f"compute_curve: wrote {os.path.relpath(PLOT, REPO)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
