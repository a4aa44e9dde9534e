r"""The toy world's two training steps against the float32 matmul peak, measured in one run.

  python bench/toy_step.py                                # prints the table
  python bench/toy_step.py --rounds 7 --write             # and writes docs/benchmarks.md
  python bench/toy_step.py --before /tmp/before --allocator_env --write
                                   # + the landed code's figures and this code with the allocator
                                   #   settings (see "Page faults"), each in its own process

Steps, each built as `python -m realm_jax.train` builds it from its experiment gin (the model
config, batch size, learning rate, schedule and job-specific options are read from the gin, so
the bench follows the configs):

  mlm       gin_configs/experiments/toy_bert.gin: `BertMlmModel`, the toy BERT's masked language
            modelling step (batch 32 rows of 64 + 128 = 192 wordpieces, 10 mask slots).
  pretrain  gin_configs/experiments/toy_pretrain.gin: `RealmPretrainModel`, the toy REALM
            pretraining step (8 queries of 96 x 8 candidates: retriever towers over 8 x 96 and
            64 x 128 rows, reader over 64 rows of 96 + 128 = 224, MLM head at 8 x 8 x 10 mask
            slots; the null document at slot 0).

Both are `trainer.make_train_step(model, optim.bert_optimizer(...), mesh=..., rules=...,
learning_rate_fn=...)`: one jitted XLA program with forward, backward, global-norm clipping,
Adam, weight decay, the schedule and the step's metrics, the state donated. Batches are
synthetic but shaped and padded like the real ones (packed `[CLS] query [SEP] block [SEP]`
rows, real lengths drawn from the toy data's range, so about half of every row is padding);
the step's cost does not depend on the token values.

Timing: every step is compiled first (ahead of time, not timed) and run `--warmup` times
(not timed). Then `--rounds` rounds, each of one peak matmul and `--steps_per_round` steps of
each job, so that a shared machine's load falls on the peak and the steps alike. Seconds per
step are the median over all timed steps; the peak is the best (fastest) of the rounds'
matmuls, the conservative choice (a higher peak gives a lower share), its median is printed too.

Peak: float32 [n, n] x [n, n] (n = `--matmul_n`, 4096), jitted, 2 n^3 FLOPs, as
bench/embedding_throughput.py measures it.

FLOPs: the headline count is analytic, the matmul FLOPs of the model's forward pass times 3
(forward + backward), the MFU convention of bench/vs_transformers.py:

  T(L) = N (8 L H^2 + 4 L H I + 4 L^2 H)   one row of L tokens through N layers: Q, K, V and
                                            output projections, feed-forward, attention scores
                                            and context
  E(L) = T(L) + 2 H^2 + 2 H P               a retriever row: + pooler and projection
  MLM head, per mask slot: 2 H^2 + 2 H V    transform and the tied decoder over V words

  mlm       B T(L) + B M (2 H^2 + 2 H V)
  pretrain  B E(Lq) + B K E(Lb) + B K T(Lq + Lb) + B K M (2 H^2 + 2 H V) + 2 B K P

Elementwise work, the embedding gathers, the scatter-add of their gradient and the optimizer
are not counted (every row counts its full padded length: the model computes it). Printed
beside it: XLA's own count (`cost_analysis()["flops"]`) of the lowered step (before
optimisation, what `TrainStep.flops` reports) and of the compiled one; they count the
elementwise ops and the optimizer as well, so they are somewhat above the analytic count.

Page faults: XLA:CPU takes each step's temporary buffers (300 MB for mlm, 1 GB for pretrain)
from malloc, and glibc serves allocations that large with fresh mmaps and unmaps them when
freed, so every step faults all of that memory in again (4 KB pages, zeroed by the kernel): the
page faults per step are printed. `--allocator_env` also measures this checkout in a process
started with `MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967296` (one
heap, no mmap, freed memory kept for reuse), what a launcher could set for the trainer; the
settings must be in place before XLA starts its threads, so they are environment variables of a
new process, not something the step can change.

`--before DIR`: DIR is a checkout of other code (e.g. `git worktree add /tmp/before HEAD`, the
landed code); this same file is run first in a subprocess with DIR's `realm_jax` on the import
path and this checkout's gin configs (so both measure the same shapes), and its figures are
printed and written beside this run's. Each configuration is a separate process with its own
peak; compare shares of the peak, not seconds, when the machine's load may change between them.

`--write` replaces the section "Toy training steps" of docs/benchmarks.md (bench/report.py).
"""

from __future__ import annotations

import argparse
import inspect
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
# The code measured: this checkout's realm_jax, or TOY_STEP_CODE_ROOT's (set by --before for
# the subprocess that measures another checkout).
_CODE_ROOT = os.environ.get("TOY_STEP_CODE_ROOT", REPO_ROOT)
for _root in (REPO_ROOT, _CODE_ROOT):  # the second ends up first on the path
  if _root in sys.path:
    sys.path.remove(_root)
  sys.path.insert(0, _root)

import numpy as np  # noqa: E402
from realm_jax_launch import local as launch_local  # noqa: E402

SECTION = "Toy training steps"
JOBS = {
    "mlm": "gin_configs/experiments/toy_bert.gin",
    "pretrain": "gin_configs/experiments/toy_pretrain.gin",
}
# Feature lengths of the jobs' tasks (realm_jax/train.py `_abstract_batch`, tasks/toy.py).
MLM_QUERY_LEN, BLOCK_LEN, MAX_MASKS = 64, 128, 10
_CAPTURE = None  # the gin configurable that reads the run gin's macros (registered once)
# glibc malloc settings of `--allocator_env` (see the module docstring): the launcher's.
ALLOCATOR_ENV = launch_local.ALLOCATOR_ENV


# ------------------------------------------------------------------------------------------
# The steps, as the trainer builds them.


def read_job(job: str) -> dict:
  """The train job's settings from its experiment gin (this checkout's gin configs)."""
  import gin  # pylint: disable=g-import-not-at-top
  import realm_jax.train  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

  global _CAPTURE
  if _CAPTURE is None:
    @gin.configurable("toy_step_bench")
    def capture(model_config=gin.REQUIRED, batch_size=gin.REQUIRED,
                learning_rate=gin.REQUIRED, num_steps=gin.REQUIRED):
      return {"model_config": model_config, "batch_size": batch_size,
              "learning_rate": learning_rate, "num_steps": num_steps}
    _CAPTURE = capture
  capture = _CAPTURE

  gin.clear_config()
  cwd = os.getcwd()
  os.chdir(REPO_ROOT)  # gin's `include 'gin_configs/...'` resolves from here
  try:
    gin.parse_config_files_and_bindings(
        [os.path.join(REPO_ROOT, JOBS[job])],
        ["RUN_DIR = '/nonexistent'", "INIT_CHECKPOINT = None",
         "toy_step_bench.model_config = %MODEL_CONFIG", "toy_step_bench.batch_size = %BATCH_SIZE",
         "toy_step_bench.learning_rate = %LEARNING_RATE",
         "toy_step_bench.num_steps = %NUM_STEPS"])
  finally:
    os.chdir(cwd)
  settings = capture()

  def train_main_value(name: str, default: Any) -> Any:
    try:
      return gin.query_parameter(f"train_main.{name}")
    except ValueError:
      return default

  settings.update(
      job=job, gin_file=JOBS[job], warmup_steps=train_main_value("warmup_steps", None),
      mesh_shape=tuple(train_main_value("mesh_shape", (-1, 1))),
      num_candidates=int(train_main_value("num_candidates", 8)),
      null_document=bool(train_main_value("null_document", True)),
      retriever_lr_scale=float(train_main_value("retriever_lr_scale", 1.0)),
      freeze_retriever_steps=int(train_main_value("freeze_retriever_steps", 0)))
  gin.clear_config()
  return settings


def make_step(settings: dict):
  """(model, TrainStep) as realm_jax/train.py `train_main` builds them."""
  from realm_jax.models import realm  # pylint: disable=g-import-not-at-top
  from realm_jax.training import optim  # pylint: disable=g-import-not-at-top
  from realm_jax.training import partitioning  # pylint: disable=g-import-not-at-top
  from realm_jax.training import trainer  # pylint: disable=g-import-not-at-top
  config = settings["model_config"]
  if settings["job"] == "mlm":
    model = realm.BertMlmModel(config)
  else:
    model = realm.RealmPretrainModel(config,
                                     null_index=0 if settings["null_document"] else None)
  mesh = partitioning.make_mesh(*settings["mesh_shape"])
  lr, steps, warmup = settings["learning_rate"], settings["num_steps"], settings["warmup_steps"]
  schedule = optim.bert_learning_rate_schedule(lr, steps, warmup)
  options = {}
  if "retriever_keys" in inspect.signature(optim.bert_optimizer).parameters:
    # As train.py passes them (older code has no such options: the plain optimizer).
    options = {"retriever_lr_scale": settings["retriever_lr_scale"],
               "freeze_retriever_steps": settings["freeze_retriever_steps"],
               "retriever_keys": ("retriever",)}
  optimizer = optim.bert_optimizer(lr, steps, warmup_steps=warmup, **options)
  step = trainer.make_train_step(model, optimizer, mesh=mesh, rules=partitioning.DEFAULT_RULES,
                                 learning_rate_fn=schedule)
  return model, step


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


def synthetic_batch(settings: dict, seed: int = 0) -> dict[str, np.ndarray]:
  """A host batch of the job's shapes. Real lengths follow the toy data: masked sentences of
  12-40 wordpieces, blocks of 30-126 (toy documents: median 54 with title)."""
  rng = np.random.default_rng(seed)
  config = settings["model_config"]
  vocab = config.bert.vocab_size
  batch_size = settings["batch_size"]
  masks = rng.integers(1, MAX_MASKS + 1, batch_size)

  def mlm_slots(query_lens):
    positions = np.zeros((batch_size, MAX_MASKS), np.int32)
    weights = np.zeros((batch_size, MAX_MASKS), np.float32)
    for r in range(batch_size):
      m = min(int(masks[r]), int(query_lens[r]) - 2)
      positions[r, :m] = np.sort(rng.choice(np.arange(1, query_lens[r] - 1), m, replace=False))
      weights[r, :m] = 1.0
    targets = rng.integers(1000, vocab, (batch_size, MAX_MASKS)).astype(np.int32)
    return positions, targets, weights

  if settings["job"] == "mlm":
    query_lens = rng.integers(12, 41, batch_size)
    rows = _packed_rows(rng, batch_size, MLM_QUERY_LEN + BLOCK_LEN, query_lens,
                        rng.integers(30, BLOCK_LEN - 1, batch_size), vocab)
    positions, targets, weights = mlm_slots(query_lens)
    return {"input_ids": rows["ids"], "type_ids": rows["types"], "input_mask": rows["mask"],
            "mlm_positions": positions, "mlm_targets": targets, "mlm_weights": weights}

  import realm_jax.train as train_lib  # pylint: disable=g-import-not-at-top
  query_len, k = train_lib.QUERY_LEN, settings["num_candidates"]
  query_lens = rng.integers(12, 41, batch_size)
  query = _packed_rows(rng, batch_size, query_len, query_lens, np.zeros(batch_size, int), vocab)
  block_lens = rng.integers(30, BLOCK_LEN - 1, (batch_size, k))
  if settings["null_document"]:
    block_lens[:, 0] = 2  # the null document: [CLS] [SEP]
  flat_block_lens = block_lens.reshape(-1)
  blocks = _packed_rows(rng, batch_size * k, BLOCK_LEN, np.zeros(batch_size * k, int) + 1,
                        flat_block_lens - 1, vocab)
  blocks["types"][:] = 0
  reader = _packed_rows(rng, batch_size * k, query_len + BLOCK_LEN,
                        np.repeat(query_lens, k), flat_block_lens - 1, vocab)
  for r in range(batch_size * k):  # the reader row starts with its query
    q = int(query_lens[r // k])
    reader["ids"][r, :q] = query["ids"][r // k, :q]
  positions, targets, weights = mlm_slots(query_lens)
  shape = lambda x: x.reshape(batch_size, k, -1)
  return {"query_ids": query["ids"], "query_type_ids": query["types"],
          "query_mask": query["mask"], "candidate_input_ids": shape(blocks["ids"]),
          "candidate_type_ids": shape(blocks["types"]), "candidate_mask": shape(blocks["mask"]),
          "reader_ids": shape(reader["ids"]), "reader_type_ids": shape(reader["types"]),
          "reader_mask": shape(reader["mask"]), "mlm_positions": positions,
          "mlm_targets": targets, "mlm_weights": weights,
          "example_mask": np.ones(batch_size, np.float32)}


def analytic_flops(settings: dict, batch: dict) -> float:
  """Forward + backward matmul FLOPs of one step (see the module docstring)."""
  config = settings["model_config"]
  b = config.bert
  H, I, N, V, P = b.hidden_size, b.intermediate_size, b.num_layers, b.vocab_size, config.proj_size

  def t(length):
    return N * (8 * length * H * H + 4 * length * H * I + 4 * length * length * H)

  def e(length):
    return t(length) + 2 * H * H + 2 * H * P

  head = 2 * H * H + 2 * H * V
  if settings["job"] == "mlm":
    rows, length = batch["input_ids"].shape
    masks = batch["mlm_positions"].shape[1]
    forward = rows * t(length) + rows * masks * head
  else:
    bsz, k, lb = batch["candidate_input_ids"].shape
    lq, lr = batch["query_ids"].shape[1], batch["reader_ids"].shape[2]
    masks = batch["mlm_positions"].shape[1]
    forward = (bsz * e(lq) + bsz * k * e(lb) + bsz * k * t(lr) + bsz * k * masks * head
               + 2 * bsz * k * P)
  return 3.0 * forward


def _xla_flops(stage) -> Optional[float]:
  try:
    analysis = stage.cost_analysis()
  except Exception:  # noqa: BLE001 - a diagnostic only
    return None
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else None
  return float(analysis["flops"]) if analysis and "flops" in analysis else None


class Job:
  """One step compiled, its state and batch on the device, ready to time."""

  def __init__(self, name: str):
    import jax  # pylint: disable=g-import-not-at-top
    from realm_jax.training import partitioning  # pylint: disable=g-import-not-at-top
    self.name = name
    self.settings = read_job(name)
    self.model, self.step = make_step(self.settings)
    host = synthetic_batch(self.settings)
    self.padding = 1.0 - float(np.mean(host["input_mask" if name == "mlm" else "reader_mask"]))
    self.batch = partitioning.shard_batch(host, self.step.mesh)
    self.state = self.step.init_state(0)
    start = time.perf_counter()
    lowered = self.step.lower(self.state, self.batch)
    self.compiled = lowered.compile()
    self.compile_s = time.perf_counter() - start
    self.flops = analytic_flops(self.settings, host)
    self.xla_flops_lowered = _xla_flops(lowered)
    self.xla_flops_compiled = _xla_flops(self.compiled)
    self.num_params = sum(int(x.size) for x in jax.tree.leaves(self.state.params))
    self.times: list[float] = []
    self.faults: list[int] = []  # minor page faults of each run
    self.loss = None

  def run(self) -> float:
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    with self.step._context():  # pylint: disable=protected-access
      self.state, metrics = self.compiled(self.state, self.batch)
    self.state.step.block_until_ready()
    seconds = time.perf_counter() - start
    self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
    if self.loss is None:
      self.loss = float(metrics["train/loss"])
    return seconds


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


def measure(jobs: list[str], args) -> dict:
  """Compiles, warms up, then times interleaved rounds; returns JSON-able results."""
  import jax  # pylint: disable=g-import-not-at-top
  import realm_jax  # pylint: disable=g-import-not-at-top
  here = os.path.dirname(os.path.dirname(os.path.abspath(realm_jax.__file__)))
  if os.path.realpath(here) != os.path.realpath(_CODE_ROOT):
    raise RuntimeError(f"realm_jax imported from {here}, not from {_CODE_ROOT}")
  started = time.perf_counter()
  built = [Job(name) for name in jobs]
  peak = Peak(args.matmul_n)
  for job in built:
    for _ in range(args.warmup):
      job.run()
    job.faults.clear()
  load_before = os.getloadavg()[0]
  timed_start = time.perf_counter()
  for _ in range(args.rounds):
    peak.times.append(peak.run())
    for job in built:
      for _ in range(args.steps_per_round):
        job.times.append(job.run())
  peak.times.append(peak.run())
  timed_s = time.perf_counter() - timed_start
  peak_best = min(peak.times)
  results = {
      "code_root": _CODE_ROOT, "jax": jax.__version__, "device": jax.devices()[0].device_kind,
      "peak": {"n": peak.n, "best_s": peak_best, "median_s": statistics.median(peak.times),
               "gflops": peak.flops / peak_best / 1e9,
               "median_gflops": peak.flops / statistics.median(peak.times) / 1e9},
      "rounds": args.rounds, "steps_per_round": args.steps_per_round,
      "load_before": load_before, "timed_s": timed_s,
      "niceness": os.nice(0),
      "allocator_env": {k: os.environ[k] for k in ALLOCATOR_ENV if k in os.environ},
      "total_s": time.perf_counter() - started, "jobs": {}}
  for job in built:
    median = statistics.median(job.times)
    gflops = job.flops / median / 1e9
    results["jobs"][job.name] = {
        "gin_file": job.settings["gin_file"], "batch_size": job.settings["batch_size"],
        "batch_shapes": {k: list(v.shape) for k, v in job.batch.items()},
        "padding": job.padding, "params": job.num_params, "compile_s": job.compile_s,
        "median_s": median, "best_s": min(job.times), "gflops": gflops,
        "share": gflops / results["peak"]["gflops"], "flops": job.flops,
        "xla_flops_lowered": job.xla_flops_lowered,
        "xla_flops_compiled": job.xla_flops_compiled, "loss": job.loss,
        "steps_timed": len(job.times), "page_faults": statistics.median(job.faults)}
  return results


# ------------------------------------------------------------------------------------------
# Output.


def _fmt_flops(value: Optional[float]) -> str:
  return "n/a" if value is None else f"{value / 1e9:.1f}"


def print_results(label: str, results: dict) -> None:
  peak = results["peak"]
  env = " ".join(f"{k}={v}" for k, v in results["allocator_env"].items()) or "default allocator"
  print(f"[{label}] code {results['code_root']} ({env}): matmul peak {peak['gflops']:.1f} "
        f"GFLOP/s best ({peak['median_gflops']:.1f} median) of {results['rounds'] + 1} runs of "
        f"{peak['n']}^3; 1-minute load average {results['load_before']:.1f}", flush=True)
  for name, r in results["jobs"].items():
    lowered, compiled = r["xla_flops_lowered"], r["xla_flops_compiled"]
    ratio = "" if lowered is None else f" (x{lowered / r['flops']:.2f} of analytic)"
    print(f"[{label}] {name:8s} {r['median_s']:.4f} s/step (best {r['best_s']:.4f}), "
          f"{r['gflops']:.1f} GFLOP/s, {100 * r['share']:.1f}% of peak | FLOPs/step analytic "
          f"{_fmt_flops(r['flops'])} G, XLA lowered {_fmt_flops(lowered)} G{ratio}, compiled "
          f"{_fmt_flops(compiled)} G | {r['page_faults']:,.0f} page faults/step | loss "
          f"{r['loss']:.4f}", flush=True)


def _markdown(args, runs: list[tuple[str, dict]]) -> str:
  """The docs section: `runs` are (label, results); this process's run is labelled "after"
  (or "this checkout")."""
  import jax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top
  command = "python bench/toy_step.py"
  if os.nice(0):
    command = f"nice -n {os.nice(0)} " + command
  for flag in ("rounds", "steps_per_round", "warmup"):
    command += f" --{flag} {getattr(args, flag)}"
  if args.before is not None:
    command += " --before DIR"
  if args.allocator_env:
    command += " --allocator_env"
  command += " --write"
  results = dict(runs)["after" if "after" in dict(runs) else "this checkout"]
  table = ["| step | code | seconds / step (median) | GFLOP/s | **share of the peak** | "
           "matmul peak, same run (GFLOP/s) | page faults / step |",
           "|---|---|---|---|---|---|---|"]
  for name in results["jobs"]:
    for label, res in runs:
      r = res["jobs"][name]
      table.append(f"| {name} | {label} | {r['median_s']:.3f} | {r['gflops']:.1f} | "
                   f"**{100 * r['share']:.0f}%** | {res['peak']['gflops']:.1f} | "
                   f"{r['page_faults']:,.0f} |")
  flops_rows = ["| step | batch | padding (mlm rows; pretrain reader rows) | FLOPs / step, "
                "analytic | XLA, lowered | XLA, "
                "compiled |", "|---|---|---|---|---|---|"]
  for name, r in results["jobs"].items():
    shapes = r["batch_shapes"]
    if name == "mlm":
      batch_text = "x".join(map(str, shapes["input_ids"]))
    else:
      batch_text = (f"queries {'x'.join(map(str, shapes['query_ids']))}, candidates "
                    f"{'x'.join(map(str, shapes['candidate_input_ids']))}, reader "
                    f"{'x'.join(map(str, shapes['reader_ids']))}")
    xl, xc = r["xla_flops_lowered"], r["xla_flops_compiled"]
    xla = (f"{_fmt_flops(xl)} G ({xl / r['flops']:.2f}x) | {_fmt_flops(xc)} G ({xc / r['flops']:.2f}x)"
           if xl is not None and xc is not None else "n/a | n/a")
    flops_rows.append(f"| {name} | {batch_text} | {100 * r['padding']:.0f}% | "
                      f"{r['flops'] / 1e9:.2f} G | {xla} |")
  labels = {
      "before": "the landed code (HEAD, a `git worktree`, run by `--before` in a subprocess "
                "with this checkout's gins, so both measure the same shapes)",
      "after": "this checkout",
      "after, allocator env": "this checkout in a process started with "
                              + " ".join(f"`{k}={v}`" for k, v in ALLOCATOR_ENV.items())
                              + " (`--allocator_env`)",
  }
  text = (
      f"`{command}` (jax {jax.__version__}, jaxlib {jaxlib.__version__}, one `cpu` device, "
      f"float32). The toy world's two train steps, each built as `python -m realm_jax.train` "
      f"builds it from its gin (gin_configs/experiments/toy_bert.gin: job `mlm`; "
      f"toy_pretrain.gin: job `pretrain`; both at the toy BERT's shape, hidden 128, 2 layers, "
      f"2 heads, intermediate 512, vocab 30522): `trainer.make_train_step` with "
      f"`optim.bert_optimizer`, forward, backward and update in one jitted program, on "
      f"synthetic batches padded like the real ones. Each configuration runs in its own "
      f"process: compiled and warmed up first, then {args.rounds} rounds of one 4096^3 float32 "
      f"matmul (the peak) and {args.steps_per_round} steps of each job, interleaved; seconds "
      f"are medians of the steps, the peak is the best of that process's matmuls, so each "
      f"share is against a peak measured alongside it. 1-minute load average before the "
      f"timed rounds: " + ", ".join(f"{res['load_before']:.1f} ({label})" for label, res in runs)
      + f" on {os.cpu_count()} cores.\n\n"
      "FLOPs: the analytic matmul count (forward x 3; module docstring of bench/toy_step.py); "
      "elementwise work, gathers, the embedding gradient's scatter-add and the optimizer are not "
      "counted. XLA's own counts of the same step (`cost_analysis()`, which also counts "
      "elementwise ops and the optimizer) agree within a few percent:\n\n"
      + "\n".join(flops_rows) + "\n\n" + "\n".join(table) + "\n\n"
      + "".join(f"- {label}: {labels.get(label, label)}\n" for label, _ in runs))
  if args.notes:
    text += "\n" + open(args.notes, encoding="utf-8").read().strip() + "\n"
  return text


def _child(args, label: str, code_root: str, extra_env: dict) -> dict:
  """Runs this bench in a subprocess (other code and/or environment); its results."""
  handle, out = tempfile.mkstemp(prefix=f"toy_step_{label.replace(' ', '_')}_", suffix=".json")
  os.close(handle)
  command = [sys.executable, os.path.abspath(__file__), "--json", out,
             "--rounds", str(args.rounds), "--steps_per_round", str(args.steps_per_round),
             "--warmup", str(args.warmup), "--matmul_n", str(args.matmul_n),
             "--jobs", *args.jobs]
  env = dict(os.environ, TOY_STEP_CODE_ROOT=os.path.abspath(code_root), **extra_env)
  try:
    subprocess.run(command, env=env, check=True)
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
                      help="steps to measure (default both)")
  parser.add_argument("--rounds", type=int, default=5,
                      help="timed rounds (one peak matmul + --steps_per_round steps per job)")
  parser.add_argument("--steps_per_round", type=int, default=3)
  parser.add_argument("--warmup", type=int, default=2, help="untimed steps per job after compile")
  parser.add_argument("--matmul_n", type=int, default=4096, help="side of the peak's matmul")
  parser.add_argument("--before", metavar="DIR", default=None,
                      help="a checkout of other code (the landed one) to measure first, in a "
                           "subprocess, with this checkout's gin configs")
  parser.add_argument("--allocator_env", action="store_true",
                      help="also measure this checkout in a process started with "
                           + " ".join(f"{k}={v}" for k, v in ALLOCATOR_ENV.items()))
  parser.add_argument("--json", metavar="PATH", default=None, help="also write results as JSON")
  parser.add_argument("--notes", metavar="PATH", default=None,
                      help="markdown appended to the written section (analysis of the run)")
  parser.add_argument("--write", action="store_true",
                      help=f"replace the section '{SECTION}' of docs/benchmarks.md")
  args = parser.parse_args(argv)

  before = env_run = None
  if args.before is not None:
    before = _child(args, "before", args.before, {})
  if args.allocator_env:
    env_run = _child(args, "allocator env", REPO_ROOT, ALLOCATOR_ENV)
  results = measure(args.jobs, args)
  runs = [("before", before)] if before else []
  runs.append(("after" if before or env_run else "this checkout", results))
  if env_run:
    runs.append(("after, allocator env", env_run))
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
