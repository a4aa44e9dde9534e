r"""The toy world's training steps, padded and cut to length buckets, measured in one run.

  python bench/toy_step.py                                # prints the tables
  python bench/toy_step.py --rounds 7 --write             # and writes bench/docs/benchmarks.md
  python bench/toy_step.py --allocator_env --write        # + this code in a process started
                                                          #   with the launcher's allocator
                                                          #   settings (see "Page faults")

Steps, each built as `python -m realm_jax.train` builds it from its experiment gin (the model
config, batch size, learning rate and schedule, the job with its settings, and from the job the
model and the optimizer options), so the bench follows the configs:

  mlm       gin_configs/experiments/toy_bert.gin: `BertMlmModel`, the toy BERT's masked language
            modelling step, on synthetic rows (32 rows of 64 + 128 = 192 wordpieces, 10 mask
            slots), padded like its reading tasks' rows.
  pretrain  gin_configs/experiments/toy_pretrain.gin: `PretrainJob`'s `RealmPretrainModel` (8
            masked queries of 96 x 8 candidates: retriever towers over 8 x 96 and 64 x 128 rows,
            the reader over 64 rows of 96 + 128 = 224, the MLM head at 8 x 8 x 10 mask slots).
  finetune  gin_configs/experiments/toy_finetune.gin: `FinetuneJob`'s `OpenQAModel` (16 toy
            questions of 64, a retriever beam of 100 index embeddings, the reader over 16 x 5
            rows of `reader_len` 160 and their spans).

The pretrain and finetune batches are real: the job's own batch code (`build_batches`) over the
toy world's masked sentences or toy QA train questions and the toy BlockStore, with a stand-in
for the index (`RandomIndex`): every query's candidates or beam are distinct blocks drawn at
random, index embeddings random. Only which blocks the index would choose differs; a step's
cost depends on the blocks' lengths, and these are the store's.

Variants of a job with a length bucket (its gin's `length_bucket`, or `--length_bucket`):

  padded    every batch at its full width (the reader rows at query_len + block_len, or
            `reader_len`): the step as it was before length buckets.
  bucketed  the same batches through `seqio_batches.LengthBucketed`, as the job's
            `build_batches` wraps them: the reader rows cut to the smallest multiple of the
            bucket that holds the batch's longest row. Only padding is cut: the first step of
            both, from the same state, must give the same loss (checked, to float32 rounding).

Timing: `--batches` distinct batches per job; every distinct shape is compiled first, ahead of
time and timed (each width a bucket gives is one more compilation: the price of the cut, paid
once per process; a shape another variant compiled first is charged that compilation), then
`--warmup` untimed steps of each variant, then `--rounds` rounds, each of one peak matmul and
`--steps_per_round` steps of every variant of every job, cycling through its batches, so that a
shared machine's load falls on all of them alike. Seconds per step are medians over the timed
steps; the peak is the best (fastest) of the rounds' matmuls, the conservative choice (a higher
peak gives a lower share), its median is printed too. Compare the variants by their ratio in
one run: on a shared machine the seconds move from run to run. "Break-even" is how many steps
the bucketed variant needs to make up its extra compilations.

Peak: float32 [n, n] x [n, n] (n = `--matmul_n`, 4096), jitted, 2 n^3 FLOPs, as
bench/embedding_throughput.py measures it.

FLOPs: the headline count is analytic, the matmul FLOPs of the model's forward pass times 3
(forward + backward), the MFU convention of bench/vs_transformers.py, at each batch's own
widths (a bucketed batch's cut rows count what they hold):

  T(L) = N (8 L H^2 + 4 L H I + 4 L^2 H)   one row of L tokens through N layers: Q, K, V and
                                            output projections, feed-forward, attention scores
                                            and context
  E(L) = T(L) + 2 H^2 + 2 H P               a retriever row: + pooler and projection
  MLM head, per mask slot: 2 H^2 + 2 H V    transform and the tied decoder over V words

  mlm       B T(L) + B M (2 H^2 + 2 H V)
  pretrain  B E(Lq) + B K E(Lb) + B K T(Lr) + B K M (2 H^2 + 2 H V) + 2 B K P

The fine-tuning step has none (its span head is mostly elementwise work): XLA's count only.
Elementwise work, the embedding gathers, the scatter-add of their gradient and the optimizer
are not counted. Printed beside it: XLA's own count (`cost_analysis()["flops"]`) of the first
batch's lowered step (before optimisation, what `TrainStep.flops` reports) and compiled one; they
count the elementwise ops and the optimizer as well, so they are somewhat above the analytic
count.

Page faults: XLA:CPU takes each step's temporary buffers (300 MB for mlm, 1 GB for pretrain)
from malloc, and glibc serves allocations that large with fresh mmaps and unmaps them when
freed, so every step faults all of that memory in again (4 KB pages, zeroed by the kernel): the
page faults per step are printed. `--allocator_env` also measures this checkout in a process
started with `MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967296` (one
heap, no mmap, freed memory kept for reuse), what the launcher sets for the trainer
(`realm_jax_launch.local.ALLOCATOR_ENV`); the settings must be in place before XLA starts its
threads, so they are environment variables of a new process, not something the step can change.

`--write` replaces the section "Toy training steps" of bench/docs/benchmarks.md (bench/report.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT in sys.path:
  sys.path.remove(REPO_ROOT)
sys.path.insert(0, REPO_ROOT)

import numpy as np  # noqa: E402
from realm_jax_launch import local as launch_local  # noqa: E402

SECTION = "Toy training steps"
JOBS = {
    "mlm": "gin_configs/experiments/toy_bert.gin",
    "pretrain": "gin_configs/experiments/toy_pretrain.gin",
    "finetune": "gin_configs/experiments/toy_finetune.gin",
}
# The mlm step's synthetic rows (its reading tasks: tasks/toy.py, tasks/pretraining.py).
MLM_QUERY_LEN, MLM_BLOCK_LEN, MLM_MAX_MASKS = 64, 128, 10
_CAPTURE = None  # the gin configurable that reads the run gin's macros (registered once)
# Seconds of the first compilation of each (job, batch shapes): jax reuses an executable it
# compiled for an identical program in this process, so a variant's shape that another variant
# compiled first is charged what that compilation took, as a run of its own would pay it.
_COMPILE_SECONDS: dict[tuple, float] = {}
# glibc malloc settings of `--allocator_env` (see the module docstring): the launcher's.
ALLOCATOR_ENV = launch_local.ALLOCATOR_ENV


# ------------------------------------------------------------------------------------------
# The steps, as the trainer builds them.


def read_job(name: str, length_bucket: Optional[int] = None) -> dict:
  """The run's settings from the job's experiment gin, and (pretrain, finetune) the job object
  with its gin settings (`length_bucket` replaces the gin's when given)."""
  import gin  # pylint: disable=g-import-not-at-top
  from realm_jax import jobs  # pylint: disable=g-import-not-at-top
  import realm_jax.train  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

  global _CAPTURE
  if _CAPTURE is None:
    @gin.configurable("toy_step_bench")
    def capture(model_config=gin.REQUIRED, batch_size=gin.REQUIRED,
                learning_rate=gin.REQUIRED, num_steps=gin.REQUIRED):
      return {"model_config": model_config, "batch_size": batch_size,
              "learning_rate": learning_rate, "num_steps": num_steps}
    _CAPTURE = capture

  gin.clear_config()
  cwd = os.getcwd()
  os.chdir(REPO_ROOT)  # gin's `include 'gin_configs/...'` resolves from here
  try:
    gin.parse_config_files_and_bindings(
        [os.path.join(REPO_ROOT, JOBS[name])],
        ["RUN_DIR = '/nonexistent'", "INIT_CHECKPOINT = None",
         "toy_step_bench.model_config = %MODEL_CONFIG", "toy_step_bench.batch_size = %BATCH_SIZE",
         "toy_step_bench.learning_rate = %LEARNING_RATE",
         "toy_step_bench.num_steps = %NUM_STEPS"])
    settings = _CAPTURE()
    try:
      warmup = gin.query_parameter("train_main.warmup_steps")
    except ValueError:
      warmup = None
    # The job class as gin configures it (`train_main.job = @PretrainJob()` and its bindings).
    job = {"pretrain": jobs.PretrainJob, "finetune": jobs.FinetuneJob}.get(name)
    job = job() if job is not None else None
  finally:
    os.chdir(cwd)
    gin.clear_config()
  if job is not None and length_bucket is not None:
    job.length_bucket = int(length_bucket)
  settings.update(name=name, gin_file=JOBS[name], warmup_steps=warmup, job=job)
  return settings


def run_context(settings: dict):
  """The `RunContext` train_main gives a job (one host, the default mesh and rules)."""
  from realm_jax.jobs.base import RunContext  # pylint: disable=g-import-not-at-top
  from realm_jax.training import partitioning  # pylint: disable=g-import-not-at-top
  return RunContext(run_dir="/nonexistent", model_config=settings["model_config"],
                    batch_size=settings["batch_size"], global_batch=settings["batch_size"],
                    seed=0, mesh=partitioning.make_mesh(-1, 1), rules=partitioning.DEFAULT_RULES,
                    init_checkpoint=None)


def make_step(settings: dict, model: Any, optimizer_options: dict, mesh: Any):
  """The TrainStep as realm_jax/train.py `train_main` builds it."""
  from realm_jax.training import optim  # pylint: disable=g-import-not-at-top
  from realm_jax.training import partitioning  # pylint: disable=g-import-not-at-top
  from realm_jax.training import trainer  # pylint: disable=g-import-not-at-top
  lr, steps, warmup = settings["learning_rate"], settings["num_steps"], settings["warmup_steps"]
  schedule = optim.bert_learning_rate_schedule(lr, steps, warmup)
  optimizer = optim.bert_optimizer(lr, steps, warmup_steps=warmup, **optimizer_options)
  return trainer.make_train_step(model, optimizer, mesh=mesh, rules=partitioning.DEFAULT_RULES,
                                 learning_rate_fn=schedule)


class RandomIndex:
  """Stands in for the run's index: every query's `k` blocks are distinct blocks of the store
  drawn at random (reproducibly), the index embeddings are random. What `PretrainingBatches`
  and `OpenQABatches` read of a retriever."""

  step = 0

  def __init__(self, store: Any, proj_size: int, seed: int = 0):
    self.rng = np.random.default_rng(seed)
    self.num_blocks = store.num_blocks
    self.block_store_id = store.store_id
    self.block_emb = self.rng.normal(size=(store.num_blocks, proj_size)).astype(np.float32)

  def retrieve(self, query_ids: np.ndarray, query_mask: np.ndarray, *, k: int
               ) -> tuple[np.ndarray, np.ndarray]:
    del query_mask
    draws = self.rng.random((len(query_ids), self.num_blocks))  # [B, num_blocks]
    ids = np.argsort(draws, axis=1)[:, :k].astype(np.int32)  # [B, k] distinct
    return np.zeros(ids.shape, np.float32), ids

  def set_query_params(self, params: Any, config: Any) -> None:
    del params, config  # the question tower does not choose the beam here


def job_batches(settings: dict, num_batches: int) -> tuple[Any, Any, list, Optional[Any]]:
  """(model, optimizer options, the padded host batches, the job's `LengthBucketed` or None)
  of a job with batch code (pretrain, finetune)."""
  from realm_jax.batches import seqio_batches  # pylint: disable=g-import-not-at-top
  job, ctx = settings["job"], run_context(settings)
  job.configure(ctx)
  model = job.build_model(ctx)
  batches = job.build_batches(ctx, model)
  bucketed = batches if isinstance(batches, seqio_batches.LengthBucketed) else None
  padded = bucketed.batches if bucketed is not None else batches
  padded.set_retriever(RandomIndex(job.store, settings["model_config"].proj_size))
  host = [next(padded) for _ in range(num_batches)]
  return model, job.optimizer_options(), host, bucketed


def _packed_rows(rng: np.random.Generator, rows: int, length: int, query_lens: np.ndarray,
                 block_lens: np.ndarray, vocab: int) -> dict[str, np.ndarray]:
  """`[CLS] query [SEP] block [SEP]` rows padded at the end (query_lens include [CLS], [SEP])."""
  ids = np.zeros((rows, length), np.int32)
  types = np.zeros((rows, length), np.int32)
  mask = np.zeros((rows, length), np.int32)
  for r in range(rows):
    q, b = int(query_lens[r]), int(block_lens[r])
    n = min(length, q + b)
    ids[r, :n] = rng.integers(1000, vocab, n)
    ids[r, 0], ids[r, q - 1] = 101, 102
    if b:
      ids[r, n - 1] = 102
    types[r, q:n] = 1
    mask[r, :n] = 1
  return {"ids": ids, "types": types, "mask": mask}


def mlm_batch(settings: dict, seed: int = 0) -> dict[str, np.ndarray]:
  """A synthetic mlm batch: masked sentences of 12-40 wordpieces read beside blocks of 30-126
  (toy documents: median 54 with title), 1-10 weighted mask slots."""
  rng = np.random.default_rng(seed)
  vocab = settings["model_config"].bert.vocab_size
  batch_size = settings["batch_size"]
  query_lens = rng.integers(12, 41, batch_size)
  rows = _packed_rows(rng, batch_size, MLM_QUERY_LEN + MLM_BLOCK_LEN, query_lens,
                      rng.integers(30, MLM_BLOCK_LEN - 1, batch_size), vocab)
  positions = np.zeros((batch_size, MLM_MAX_MASKS), np.int32)
  weights = np.zeros((batch_size, MLM_MAX_MASKS), np.float32)
  for r, masks in enumerate(rng.integers(1, MLM_MAX_MASKS + 1, batch_size)):
    m = min(int(masks), int(query_lens[r]) - 2)
    positions[r, :m] = np.sort(rng.choice(np.arange(1, query_lens[r] - 1), m, replace=False))
    weights[r, :m] = 1.0
  targets = rng.integers(1000, vocab, (batch_size, MLM_MAX_MASKS)).astype(np.int32)
  return {"input_ids": rows["ids"], "type_ids": rows["types"], "input_mask": rows["mask"],
          "mlm_positions": positions, "mlm_targets": targets, "mlm_weights": weights}


def analytic_flops(settings: dict, batch: dict) -> Optional[float]:
  """Forward + backward matmul FLOPs of one step (see the module docstring); None for
  fine-tuning."""
  config = settings["model_config"]
  b = config.bert
  H, I, N, V, P = b.hidden_size, b.intermediate_size, b.num_layers, b.vocab_size, config.proj_size

  def t(length):
    return N * (8 * length * H * H + 4 * length * H * I + 4 * length * length * H)

  def e(length):
    return t(length) + 2 * H * H + 2 * H * P

  head = 2 * H * H + 2 * H * V
  if settings["name"] == "mlm":
    rows, length = batch["input_ids"].shape
    masks = batch["mlm_positions"].shape[1]
    return 3.0 * (rows * t(length) + rows * masks * head)
  if settings["name"] != "pretrain":
    return None
  bsz, k, lb = batch["candidate_input_ids"].shape
  lq, lr = batch["query_ids"].shape[1], batch["reader_ids"].shape[2]
  masks = batch["mlm_positions"].shape[1]
  return 3.0 * (bsz * e(lq) + bsz * k * e(lb) + bsz * k * t(lr) + bsz * k * masks * head
                + 2 * bsz * k * P)


def _xla_flops(stage) -> Optional[float]:
  try:
    analysis = stage.cost_analysis()
  except Exception:  # noqa: BLE001 - a diagnostic only
    return None
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else None
  return float(analysis["flops"]) if analysis and "flops" in analysis else None


def _shape_key(batch: dict) -> tuple:
  return tuple(sorted((key, tuple(value.shape)) for key, value in batch.items()))


def _row_mask(name: str, batch: dict) -> np.ndarray:
  """The mask of the rows a length bucket cuts (the mlm step: its only rows)."""
  return np.asarray(batch["input_mask" if name == "mlm" else "reader_mask"])


class Variant:
  """One step over a list of batches: every shape compiled ahead (timed), its own state."""

  def __init__(self, settings: dict, label: str, step: Any, host_batches: list):
    from realm_jax.training import partitioning  # pylint: disable=g-import-not-at-top
    from realm_jax.training import trainer  # pylint: disable=g-import-not-at-top
    self.name, self.label, self.step = settings["name"], label, step
    self.host = [trainer.device_batch(b) for b in host_batches]
    self.batches = [partitioning.shard_batch(b, step.mesh) for b in self.host]
    self.state = step.init_state(0)  # the same initial state for every variant of a job
    self.compiled: dict[tuple, Any] = {}
    self.compile_s = 0.0
    self.xla_flops_lowered = self.xla_flops_compiled = None
    for batch in self.batches:
      key = _shape_key(batch)
      if key in self.compiled:
        continue
      start = time.perf_counter()
      lowered = step.lower(self.state, batch)
      self.compiled[key] = lowered.compile()
      self.compile_s += _COMPILE_SECONDS.setdefault((self.name, key),
                                                    time.perf_counter() - start)
      if self.xla_flops_lowered is None:
        self.xla_flops_lowered = _xla_flops(lowered)
        self.xla_flops_compiled = _xla_flops(self.compiled[key])
    masks = [_row_mask(self.name, b) for b in self.host]
    self.width = statistics.mean(m.shape[-1] for m in masks)  # the rows as computed
    self.padding = 1.0 - sum(float(m.sum()) for m in masks) / sum(m.size for m in masks)
    flops = [analytic_flops(settings, b) for b in self.host]
    self.flops = None if flops[0] is None else statistics.mean(flops)
    self._cycle = itertools.cycle(range(len(self.batches)))
    self.times: list[float] = []
    self.faults: list[int] = []  # minor page faults of each run
    self.first_loss: Optional[float] = None

  def run(self) -> float:
    batch = self.batches[next(self._cycle)]
    compiled = self.compiled[_shape_key(batch)]
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    with self.step._context():  # pylint: disable=protected-access
      self.state, metrics = compiled(self.state, batch)
    self.state.step.block_until_ready()
    seconds = time.perf_counter() - start
    self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
    if self.first_loss is None:
      self.first_loss = float(metrics["train/loss"])
    return seconds


def build_variants(name: str, args) -> tuple[dict, list[Variant]]:
  """The job's settings and its variants: mlm's one; padded and (with a bucket) bucketed."""
  from realm_jax.batches import seqio_batches  # pylint: disable=g-import-not-at-top
  from realm_jax.training import partitioning  # pylint: disable=g-import-not-at-top
  from realm_jax.training import trainer  # pylint: disable=g-import-not-at-top
  settings = read_job(name, args.length_bucket)
  if name == "mlm":
    from realm_jax.models import realm  # pylint: disable=g-import-not-at-top
    model = realm.BertMlmModel(settings["model_config"])
    step = make_step(settings, model, {}, partitioning.make_mesh(-1, 1))
    return settings, [Variant(settings, "padded", step,
                              [mlm_batch(settings, seed) for seed in range(args.batches)])]
  model, options, padded, bucketed = job_batches(settings, args.batches)
  step = make_step(settings, model, options, partitioning.make_mesh(-1, 1))
  variants = [Variant(settings, "padded", step, padded)]
  if bucketed is not None:
    # The job's own wrapper settings over the same batches: what training would feed the step.
    cut = seqio_batches.LengthBucketed(trainer.ListBatches(padded), keys=bucketed.keys,
                                       mask_key=bucketed.mask_key,
                                       length_bucket=bucketed.length_bucket, name=bucketed.name)
    variants.append(Variant(settings, "bucketed", step, [next(cut) for _ in padded]))
  settings["length_bucket"] = None if bucketed is None else bucketed.length_bucket
  return settings, variants


class Peak:
  """The float32 [n, n] x [n, n] matmul, jitted, for the peak FLOP/s."""

  def __init__(self, n: int):
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
    self.n = n
    self.a = jax.random.normal(key_a, (n, n), jnp.float32)
    self.b = jax.random.normal(key_b, (n, n), jnp.float32)
    self.matmul = jax.jit(jnp.matmul)
    self.matmul(self.a, self.b).block_until_ready()
    self.times: list[float] = []

  def run(self) -> float:
    start = time.perf_counter()
    self.matmul(self.a, self.b).block_until_ready()
    return time.perf_counter() - start

  @property
  def flops(self) -> float:
    return 2.0 * self.n ** 3


def measure(names: list[str], args) -> dict:
  """Builds and compiles every variant, warms up, then times interleaved rounds; returns
  JSON-able results."""
  import jax  # pylint: disable=g-import-not-at-top
  started = time.perf_counter()
  jobs = [build_variants(name, args) for name in names]
  variants = [variant for _, job_variants in jobs for variant in job_variants]
  for _, job_variants in jobs:
    for variant in job_variants:
      variant.run()  # the first step of every variant starts from the same state
    losses = [v.first_loss for v in job_variants]
    if not np.allclose(losses, losses[0], rtol=1e-5):
      raise RuntimeError(f"{job_variants[0].name}: the variants' first losses differ: "
                         f"{dict(zip((v.label for v in job_variants), losses))}")
  peak = Peak(args.matmul_n)
  for variant in variants:
    for _ in range(args.warmup):
      variant.run()
    variant.faults.clear()
    variant.times.clear()
  load_before = os.getloadavg()[0]
  timed_start = time.perf_counter()
  for _ in range(args.rounds):
    peak.times.append(peak.run())
    for variant in variants:
      for _ in range(args.steps_per_round):
        variant.times.append(variant.run())
  peak.times.append(peak.run())
  timed_s = time.perf_counter() - timed_start
  peak_best = min(peak.times)
  results = {
      "jax": jax.__version__, "device": jax.devices()[0].device_kind,
      "peak": {"n": peak.n, "best_s": peak_best, "median_s": statistics.median(peak.times),
               "gflops": peak.flops / peak_best / 1e9,
               "median_gflops": peak.flops / statistics.median(peak.times) / 1e9},
      "rounds": args.rounds, "steps_per_round": args.steps_per_round,
      "batches": args.batches, "load_before": load_before, "timed_s": timed_s,
      "niceness": os.nice(0),
      "allocator_env": {k: os.environ[k] for k in ALLOCATOR_ENV if k in os.environ},
      "total_s": time.perf_counter() - started, "jobs": {}}
  for settings, job_variants in jobs:
    out = results["jobs"][settings["name"]] = {
        "gin_file": settings["gin_file"], "batch_size": settings["batch_size"],
        "length_bucket": settings.get("length_bucket"), "loss": job_variants[0].first_loss,
        "variants": {}}
    for v in job_variants:
      median = statistics.median(v.times)
      gflops = None if v.flops is None else v.flops / median / 1e9
      out["variants"][v.label] = {
          "batch_shapes": {k: list(x.shape) for k, x in v.host[0].items()},
          "widths": sorted({int(_row_mask(v.name, b).shape[-1]) for b in v.host}),
          "width": v.width, "padding": v.padding, "compiles": len(v.compiled),
          "compile_s": v.compile_s, "median_s": median, "best_s": min(v.times),
          "flops": v.flops, "gflops": gflops,
          "share": None if gflops is None else gflops / results["peak"]["gflops"],
          "xla_flops_lowered": v.xla_flops_lowered,
          "xla_flops_compiled": v.xla_flops_compiled, "steps_timed": len(v.times),
          "page_faults": statistics.median(v.faults)}
  return results


# ------------------------------------------------------------------------------------------
# Output.


def _fmt_flops(value: Optional[float]) -> str:
  return "n/a" if value is None else f"{value / 1e9:.1f}"


def break_even(padded: dict, bucketed: dict) -> Optional[float]:
  """Steps after which the bucketed step's extra compilations are paid for (None: never)."""
  saved = padded["median_s"] - bucketed["median_s"]
  extra = bucketed["compile_s"] - padded["compile_s"]
  return max(0.0, extra) / saved if saved > 0 else None


def print_results(label: str, results: dict) -> None:
  peak = results["peak"]
  env = " ".join(f"{k}={v}" for k, v in results["allocator_env"].items()) or "default allocator"
  print(f"[{label}] ({env}): matmul peak {peak['gflops']:.1f} GFLOP/s best "
        f"({peak['median_gflops']:.1f} median) of {results['rounds'] + 1} runs of "
        f"{peak['n']}^3; 1-minute load average {results['load_before']:.1f}", flush=True)
  for name, job in results["jobs"].items():
    base = job["variants"]["padded"]
    for variant, r in job["variants"].items():
      share = ("" if r["share"] is None
               else f", {r['gflops']:.1f} GFLOP/s, {100 * r['share']:.1f}% of peak")
      ratio = "" if variant == "padded" else f" (x{r['median_s'] / base['median_s']:.2f} of padded)"
      print(f"[{label}] {name:8s} {variant:8s} {r['median_s']:.4f} s/step{ratio} (best "
            f"{r['best_s']:.4f}){share} | rows {r['width']:.1f} wide (widths {r['widths']}), "
            f"{100 * r['padding']:.0f}% padding | {r['compiles']} compile(s), "
            f"{r['compile_s']:.1f} s | FLOPs/step analytic {_fmt_flops(r['flops'])} G, XLA "
            f"lowered {_fmt_flops(r['xla_flops_lowered'])} G, compiled "
            f"{_fmt_flops(r['xla_flops_compiled'])} G | {r['page_faults']:,.0f} page "
            f"faults/step", flush=True)
    if "bucketed" in job["variants"]:
      steps = break_even(base, job["variants"]["bucketed"])
      print(f"[{label}] {name:8s} bucket {job['length_bucket']}: break-even after "
            f"{'never' if steps is None else f'{steps:.0f} steps'}", flush=True)


def _markdown(args, runs: list[tuple[str, dict]]) -> str:
  """The docs section: `runs` are (label, results)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top
  command = "python bench/toy_step.py"
  if os.nice(0):
    command = f"nice -n {os.nice(0)} " + command
  for flag in ("rounds", "steps_per_round", "warmup", "batches"):
    command += f" --{flag} {getattr(args, flag)}"
  if args.length_bucket is not None:
    command += f" --length_bucket {args.length_bucket}"
  if args.allocator_env:
    command += " --allocator_env"
  command += " --write"
  table = ["| step | rows | code | seconds / step (median) | x padded | rows' width (mean) | "
           "padding | compilations (s) | break-even (steps) | GFLOP/s | share of the peak | "
           "page faults / step |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for label, res in runs:
    for name, job in res["jobs"].items():
      base = job["variants"]["padded"]
      for variant, r in job["variants"].items():
        steps = break_even(base, r) if variant != "padded" else None
        even = "" if variant == "padded" else ("never" if steps is None else f"{steps:.0f}")
        gflops = "" if r["gflops"] is None else f"{r['gflops']:.1f}"
        share = "" if r["share"] is None else f"**{100 * r['share']:.0f}%**"
        table.append(
            f"| {name} | {variant} | {label} | {r['median_s']:.3f} | "
            f"{r['median_s'] / base['median_s']:.2f} | {r['width']:.1f} | "
            f"{100 * r['padding']:.0f}% | {r['compiles']} ({r['compile_s']:.1f}) | {even} | "
            f"{gflops} | {share} | {r['page_faults']:,.0f} |")
  return (f"`{command}` (jax {jax.__version__}, jaxlib {jaxlib.__version__}, one `cpu` device, "
          f"float32; module docstring of bench/toy_step.py). 1-minute load average before the "
          f"timed rounds: " + ", ".join(f"{res['load_before']:.1f} ({label})"
                                        for label, res in runs)
          + f" on {os.cpu_count()} cores.\n\n" + "\n".join(table) + "\n")


def _child(args, label: str, extra_env: dict) -> dict:
  """Runs this bench in a subprocess with `extra_env`; its results."""
  handle, out = tempfile.mkstemp(prefix=f"toy_step_{label.replace(' ', '_')}_", suffix=".json")
  os.close(handle)
  command = [sys.executable, os.path.abspath(__file__), "--json", out,
             "--rounds", str(args.rounds), "--steps_per_round", str(args.steps_per_round),
             "--warmup", str(args.warmup), "--matmul_n", str(args.matmul_n),
             "--batches", str(args.batches), "--jobs", *args.jobs]
  if args.length_bucket is not None:
    command += ["--length_bucket", str(args.length_bucket)]
  try:
    subprocess.run(command, env=dict(os.environ, **extra_env), check=True)
    with open(out, encoding="utf-8") as f:
      return json.load(f)
  finally:
    if os.path.exists(out):
      os.remove(out)


def main(argv: Optional[list[str]] = None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--jobs", nargs="+", choices=tuple(JOBS), default=list(JOBS),
                      help="steps to measure (default all)")
  parser.add_argument("--rounds", type=int, default=5,
                      help="timed rounds (one peak matmul + --steps_per_round steps per variant)")
  parser.add_argument("--steps_per_round", type=int, default=3)
  parser.add_argument("--warmup", type=int, default=2,
                      help="untimed steps per variant after compiling")
  parser.add_argument("--batches", type=int, default=8,
                      help="distinct batches per job (the bucketed variant's widths vary)")
  parser.add_argument("--length_bucket", type=int, default=None,
                      help="the jobs' length bucket (default: each gin's; 0: padded only)")
  parser.add_argument("--matmul_n", type=int, default=4096, help="side of the peak's matmul")
  parser.add_argument("--allocator_env", action="store_true",
                      help="also measure this checkout in a process started with "
                           + " ".join(f"{k}={v}" for k, v in ALLOCATOR_ENV.items()))
  parser.add_argument("--json", metavar="PATH", default=None, help="also write results as JSON")
  parser.add_argument("--write", action="store_true",
                      help=f"replace the section '{SECTION}' of bench/docs/benchmarks.md")
  args = parser.parse_args(argv)

  env_run = _child(args, "allocator env", ALLOCATOR_ENV) if args.allocator_env else None
  results = measure(args.jobs, args)
  runs = [("default allocator" if env_run else "this checkout", results)]
  if env_run:
    runs.append(("allocator env", env_run))
  for label, res in runs:
    print_results(label, res)
  print(f"timed rounds {results['timed_s']:.0f}s, whole run {results['total_s']:.0f}s, "
        f"1-minute load average before the timed rounds {results['load_before']:.2f}",
        flush=True)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=1)
  if args.write:
    from bench import report  # pylint: disable=g-import-not-at-top
    report.write_section(SECTION, _markdown(args, runs))
  return 0


if __name__ == "__main__":
  sys.exit(main())
