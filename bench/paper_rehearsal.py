r"""Paper-shape rehearsal: BERT-base REALM pretraining beside the index builder, 1M blocks.

  python bench/paper_rehearsal.py --work /tmp/rehearsal --json run.json --write   # a GPU
  python bench/paper_rehearsal.py --work /tmp/r --size tiny --blocks 4000 --matmul_n 512 \
      --batch_size 2 --checkpoint_every 20 --seconds 300                  # the script, on a CPU
  python bench/paper_rehearsal.py --from_json bench/results/paper_rehearsal/<gpu>.json --write

What runs is what a REALM run runs (docs/paper_scale.md), side by side on one device:
  trainer  `realm_jax.train.train_main` with the pretrain job (`PretrainJob`), the gin of
           gin_configs/runs/pretrain.gin, BERT-base (gin_configs/models/base.gin) in --dtype
           compute: each step retrieves K = 8 candidates from the run's current index
           (`IndexWatcher`, exact search on the device), assembles the batch on the host from the
           BlockStore, runs the compiled step, checkpoints every --checkpoint_every steps
           (Orbax, asynchronously) and swaps in a newer index when the builder publishes one
           (looked for every --index_check_every steps; not in lockstep: the paper's way).
  builder  `python -m realm_jax.build_index` (gin_configs/runs/build_index.gin) following the
           run: it embeds every block with the newest checkpoint's document tower and
           publishes the index atomically, again and again.
The driver stops both once the trainer has swapped in the first refreshed index and run
--after_swap_steps more steps (or after --seconds).

What is synthetic, because timing does not depend on it: the corpus (--blocks blocks of
random wordpieces, each filling its 288 positions; `corpus_build.write_tokenized_block_store`); the
masked queries (`SyntheticPretrainJob`: random wordpieces, 9 masks each, instead of a seqio
task); the warm start (random BERT-base weights, LayerNorms at 1 and 0); and the step-0 index
(random unit vectors published as step 0 with the warm start as its checkpoint, so that the
first real refresh is the one timed). Each trainer and builder is its own process with jax's
allocator growing on demand (`XLA_PYTHON_CLIENT_PREALLOCATE=false`), as they share the device.

Measured (trainer metrics from `<run>/metrics.jsonl`, `train_main.metrics_format="jsonl"`):
  * train step, alone (before the first refresh starts) and beside the builder: compute time
    (`perf/steps_per_s`: the compiled step) and wall time per step (everything: retrieval,
    batch assembly, hooks, checkpoint saves);
  * MFU of the step alone, over the device's matmul peak measured in the same run
    (`bench.embedding_throughput.measure_matmul_peak` at --matmul_n in --dtype), the FLOPs
    counted as `bench.vs_transformers.train_step_flops` counts them;
  * the refresh: seconds from the checkpoint it embeds to its publication, the builder's own
    embedding seconds and blocks/s (from the index manifest);
  * staleness: the trainer's `retrieval/staleness_steps` when it swaps the refreshed index in
    (steps since the checkpoint it was built from), and the index's age in seconds then.

`--json FILE` keeps the run's figures (the trainer's records, the builder's log, the refreshed
index's manifest); `--from_json FILE` renders a kept run again. `--write` replaces the section
"Paper-shape rehearsal (<accelerator>)" of bench/docs/benchmarks.md (BERT-base on an accelerator
only). A run on the kept H100 figures: bench/results/paper_rehearsal/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

import gin  # noqa: E402
import numpy as np  # noqa: E402

from realm_jax.data import vocab as vocab_lib  # noqa: E402
from realm_jax.jobs.pretrain import PretrainJob  # noqa: E402

SECTION = "Paper-shape rehearsal"
QUERY_LEN = 96
MAX_MASKS = 10  # mask slots per query; 9 real, as bench/vs_transformers.py
_DRIVER_ALLOCATOR = "platform"


# ------------------------------------------------------------------------------ the trainer's input


class SyntheticMaskedQueries:
  """Masked-query batches of random wordpieces: `[CLS] ... [SEP]` rows of `query_len`, with
  `max_masks - 1` positions replaced by [MASK] (their wordpieces the targets) and one padding
  slot, as the pretraining tasks pad theirs. Batch b is a function of (seed, b): resumable."""

  def __init__(self, batch_size: int, *, query_len: int = QUERY_LEN, max_masks: int = MAX_MASKS,
               vocab_size: int = 30522, seed: int = 0):
    self.batch_size, self.query_len, self.max_masks = batch_size, query_len, max_masks
    self.vocab_size, self.seed = vocab_size, seed
    self._consumed = 0

  def __iter__(self) -> "SyntheticMaskedQueries":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([self.seed, self._consumed])
    self._consumed += 1
    b, length, real = self.batch_size, self.query_len, self.max_masks - 1
    ids = rng.integers(1000, self.vocab_size, (b, length)).astype(np.int32)  # [B, L]
    ids[:, 0], ids[:, -1] = vocab_lib.CLS_ID, vocab_lib.SEP_ID
    positions = np.zeros((b, self.max_masks), np.int32)  # [B, M]
    targets = np.zeros((b, self.max_masks), np.int32)
    weights = np.zeros((b, self.max_masks), np.float32)
    for row in range(b):
      chosen = np.sort(rng.choice(np.arange(1, length - 1), real, replace=False))
      positions[row, :real] = chosen
      targets[row, :real] = ids[row, chosen]
      weights[row, :real] = 1.0
      ids[row, chosen] = vocab_lib.MASK_ID
    # Random source uids: no query comes from a block of the store (nothing to remove).
    uids = rng.integers(0, 2**62, (b,), dtype=np.int64)
    return {"query_ids": ids, "query_mask": np.ones_like(ids), "mlm_positions": positions,
            "mlm_targets": targets, "mlm_weights": weights, "source_uid": uids}

  def element_spec(self) -> dict[str, Any]:
    import jax  # pylint: disable=g-import-not-at-top
    spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
    return {"query_ids": spec((self.query_len,), np.int32),
            "query_mask": spec((self.query_len,), np.int32),
            "mlm_positions": spec((self.max_masks,), np.int32),
            "mlm_targets": spec((self.max_masks,), np.int32),
            "mlm_weights": spec((self.max_masks,), np.float32),
            "source_uid": spec((), np.int64)}

  def state(self) -> dict[str, Any]:
    return {"task": "synthetic", "seed": self.seed, "batches_consumed": self._consumed}

  def restore(self, state: dict[str, Any]) -> None:
    self._consumed = int(state["batches_consumed"])


@gin.configurable
@dataclasses.dataclass
class SyntheticPretrainJob(PretrainJob):
  """The pretrain job on `SyntheticMaskedQueries` instead of a seqio task; everything else
  (retrieval from the run's index, candidates, model, warm start, index watcher) is
  `PretrainJob`'s."""
  task: str = "synthetic"

  def configure(self, ctx: Any) -> None:
    self.check_retriever_objective()
    self.open_store()

  def _batches(self, ctx: Any, retriever: Any = None, **options: Any) -> Any:
    del options  # shuffle / num_epochs of the evaluation stream: random queries either way
    from realm_jax.batches import pretraining_batches  # pylint: disable=g-import-not-at-top
    masked = SyntheticMaskedQueries(ctx.batch_size, vocab_size=ctx.model_config.bert.vocab_size,
                                    seed=ctx.seed)
    return pretraining_batches.PretrainingBatches(masked, self.store, retriever=retriever,
                                                  num_candidates=self.num_candidates,
                                                  null_document=self.null_document)


# ------------------------------------------------------------------------------ setup


def model_config(size: str, dtype: str) -> Any:
  """The RealmConfig the trainer's gin builds (`model_gin_lines`)."""
  from realm_jax.models import config as config_lib  # pylint: disable=g-import-not-at-top
  bert = (config_lib.base_bert(dtype=dtype) if size == "base" else
          config_lib.tiny_bert(hidden_size=128, num_heads=2, intermediate_size=512, dtype=dtype))
  return config_lib.RealmConfig(bert=bert)


def model_gin_lines(size: str, dtype: str) -> list[str]:
  if size == "base":
    return ["include 'gin_configs/models/base.gin'", f"model_config.base_bert.dtype = '{dtype}'"]
  return ["include 'gin_configs/models/tiny.gin'", "model_config.tiny_bert.hidden_size = 128",
          "model_config.tiny_bert.num_heads = 2", "model_config.tiny_bert.intermediate_size = 512",
          f"model_config.tiny_bert.dtype = '{dtype}'"]


def write_synthetic_store(dest: str, num_blocks: int, block_len: int, seed: int = 0) -> str:
  """A BlockStore of `num_blocks` random blocks `[CLS] title(8) [SEP] body [SEP]` filling
  `block_len`; returns its store_id."""
  from realm_jax.data import corpus_build  # pylint: disable=g-import-not-at-top
  vocab = vocab_lib.default_vocabulary()
  rng = np.random.default_rng(seed)
  title_len = 8
  body_len = block_len - title_len - 3
  tokens = rng.integers(1000, vocab.vocab_size, (num_blocks, block_len), dtype=np.uint16)
  tokens[:, 0] = vocab_lib.CLS_ID
  tokens[:, 1 + title_len] = vocab_lib.SEP_ID
  tokens[:, -1] = vocab_lib.SEP_ID
  return corpus_build.write_tokenized_block_store(
      dest, tokens, np.full(num_blocks, title_len, np.int32), np.full(num_blocks, body_len,
                                                                       np.int32),
      vocab=vocab, source={"kind": "synthetic", "seed": seed, "blocks": num_blocks})


def random_params(config: Any, seed: int = 0) -> dict:
  """RealmPretrainModel-shaped params drawn on the host (no init program compiled): normal
  0.02, LayerNorm scales 1 and biases 0."""
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax.training import optim, partitioning, trainer  # pylint: disable=g-import-not-at-top
  from realm_jax.models import realm  # pylint: disable=g-import-not-at-top
  step = trainer.make_train_step(realm.RealmPretrainModel(config), optim.bert_optimizer(1e-4, 10),
                                 mesh=partitioning.make_mesh(devices=jax.devices("cpu")[:1]))
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = jax.tree_util.keystr(path)
    if "LayerNorm" in name or "layer_norm" in name.lower():
      return (np.ones if name.endswith("['scale']") else np.zeros)(leaf.shape, leaf.dtype)
    if name.endswith("['bias']"):
      return np.zeros(leaf.shape, leaf.dtype)
    return (0.02 * rng.standard_normal(leaf.shape, dtype=np.float32)).astype(leaf.dtype)

  return jax.tree_util.tree_map_with_path(draw, step.abstract_state.params)


def publish_random_index(run_dir: str, num_blocks: int, dim: int, store_id: str,
                         checkpoint_dir: str, seed: int = 0) -> str:
  """Index step 0: random unit vectors, recorded as built from the warm start."""
  from realm_jax.index import store as store_lib  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  vectors = rng.standard_normal((num_blocks, dim), dtype=np.float32)
  vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
  return store_lib.publish_index(run_dir, 0, vectors, block_store_id=store_id,
                                 checkpoint=checkpoint_dir,
                                 extra={"checkpoint_step": 0, "synthetic": True})


# ------------------------------------------------------------------------------ the run


def read_metrics(path: str) -> list[dict]:
  """The trainer's metrics.jsonl records (a line being written is skipped)."""
  if not os.path.exists(path):
    return []
  records = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        pass
  return records


def _tail(path: str, lines: int = 15) -> str:
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      return "".join(f.readlines()[-lines:])
  except OSError:
    return ""


def _start(cmd: list[str], log_path: str, env: dict) -> subprocess.Popen:
  from realm_jax_launch import local  # pylint: disable=g-import-not-at-top
  log = open(log_path, "w", encoding="utf-8")
  return subprocess.Popen(local.tied_to_parent(cmd), cwd=REPO_ROOT, env=env, stdout=log,
                          stderr=subprocess.STDOUT)


def run(args: argparse.Namespace) -> dict:
  """Sets up, runs trainer and builder side by side, stops them; returns the raw figures."""
  import jax  # pylint: disable=g-import-not-at-top
  from bench.embedding_throughput import measure_matmul_peak  # pylint: disable=g-import-not-at-top
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.index import store as store_lib  # pylint: disable=g-import-not-at-top
  from realm_jax_launch import local  # pylint: disable=g-import-not-at-top

  t0 = time.time()
  work = os.path.abspath(args.work)
  run_dir = os.path.join(work, "run")
  if os.path.exists(work) and os.listdir(work):
    raise SystemExit(f"--work {work}: not empty (each rehearsal starts from nothing)")
  os.makedirs(run_dir)
  device = jax.devices()[0]
  peak = measure_matmul_peak(device, args.matmul_n, dtype=args.dtype)
  print(f"matmul peak ({args.dtype}, {args.matmul_n}^3): {peak['flops_per_s'] / 1e9:.1f} "
        f"GFLOP/s on {device.device_kind}", flush=True)

  start = time.time()
  store_dir = os.path.join(work, "blocks")
  store_id = write_synthetic_store(store_dir, args.blocks, args.block_len)
  store_seconds = time.time() - start
  print(f"BlockStore: {args.blocks:,} blocks of {args.block_len} in {store_seconds:.0f}s",
        flush=True)

  config = model_config(args.size, args.dtype)
  start = time.time()
  init_dir = ckpt_lib.save_checkpoint(os.path.join(work, "init"), 0, random_params(config),
                                      config=config)
  publish_random_index(run_dir, args.blocks, config.proj_size, store_id, init_dir)
  setup_seconds = time.time() - start
  print(f"warm start {init_dir} and index 0 in {setup_seconds:.0f}s", flush=True)

  gin_path = os.path.join(work, "rehearsal.gin")
  lines = model_gin_lines(args.size, args.dtype) + [
      "include 'gin_configs/runs/pretrain.gin'",
      "train_main.job = @SyntheticPretrainJob()",
      f"SyntheticPretrainJob.block_store = '{store_dir}'",
      f"SyntheticPretrainJob.index_check_every = {args.index_check_every}",
      "SyntheticPretrainJob.num_candidates = 8",
      # No evaluation batches: the rehearsal times training and refreshing only.
      "SyntheticPretrainJob.eval_batches = 0",
      f"RUN_DIR = '{run_dir}'", "TASK = 'synthetic'", f"BATCH_SIZE = {args.batch_size}",
      "NUM_STEPS = 1000000", f"INIT_CHECKPOINT = '{init_dir}'",
      f"train_main.checkpoint_every = {args.checkpoint_every}",
      f"train_main.log_every = {args.log_every}", "train_main.keep = 2",
      "train_main.metrics_format = 'jsonl'"]
  with open(gin_path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")

  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONUNBUFFERED="1",
             PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])))
  if env.get("XLA_PYTHON_CLIENT_ALLOCATOR") == _DRIVER_ALLOCATOR:
    del env["XLA_PYTHON_CLIENT_ALLOCATOR"]  # the driver's, not the jobs' (see main)
  trainer_log, builder_log = os.path.join(work, "trainer.log"), os.path.join(work, "builder.log")
  launched = time.time()
  trainer = _start([sys.executable, os.path.abspath(__file__), "trainer",
                    f"--gin_file={gin_path}"], trainer_log, env)
  builder = _start([sys.executable, "-m", "realm_jax.build_index",
                    "--gin_file=gin_configs/runs/build_index.gin", f"--gin.RUN_DIR='{run_dir}'",
                    f"--gin.BLOCK_STORE='{store_dir}'",
                    f"--gin.build_index_main.batch_size={args.builder_batch}",
                    "--gin.build_index_main.poll_seconds=1.0", "--gin.build_index_main.keep=2"],
                   builder_log, env)
  metrics_path = os.path.join(run_dir, "metrics.jsonl")
  deadline = launched + args.seconds
  outcome = f"stopped after --seconds {args.seconds}"
  refreshed: Optional[dict] = None
  last_report = time.time()
  try:
    while time.time() < deadline:
      time.sleep(1.0)
      ended = [(name, proc.returncode) for name, proc in (("trainer", trainer),
                                                          ("builder", builder))
               if proc.poll() is not None]
      if ended:  # what was measured so far is still reported
        outcome = f"the {ended[0][0]} exited early with status {ended[0][1]}"
        break
      if time.time() - last_report >= 30:
        last_report = time.time()
        records = read_metrics(metrics_path)
        print(f"[{time.time() - launched:.0f}s] trainer step "
              f"{records[-1]['step'] if records else 'none yet'}; indexes "
              f"{store_lib.list_indexes(run_dir)}; builder: "
              f"{_tail(builder_log, 1).strip()[-120:]}", flush=True)
      if refreshed is None:
        steps = [s for s in store_lib.list_indexes(run_dir) if s > 0]
        if steps:
          refreshed = store_lib.load_index(store_lib.index_dir(run_dir, steps[0]),
                                           verify=False).manifest
          print(f"index {steps[0]} published ({refreshed['build_seconds']:.0f}s to build)",
                flush=True)
      else:
        records = read_metrics(metrics_path)
        swapped = [r for r in records if r.get("retrieval/index_step", 0) >= refreshed["step"]]
        if swapped and records[-1]["step"] - swapped[0]["step"] >= args.after_swap_steps:
          outcome = "the refreshed index swapped in"
          break
  finally:
    stopped = local.stop_processes([trainer, builder])
  print(f"stopped: {outcome}; {stopped}", flush=True)
  from bench import report  # pylint: disable=g-import-not-at-top
  return {"peak": peak, "device_kind": device.device_kind, "platform": device.platform,
          "host": report.machine(),
          "config": config, "store_seconds": store_seconds, "setup_seconds": setup_seconds,
          "launched": launched, "records": read_metrics(metrics_path), "refreshed": refreshed,
          "outcome": outcome, "total_seconds": time.time() - t0,
          "builder_log": _tail(builder_log, 10_000), "trainer_log": _tail(trainer_log, 40)}


# ------------------------------------------------------------------------------ analysis

_LOG_TIME = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) "
_BUILDING = re.compile(_LOG_TIME + r".*building index (\d+) from")
# `builder.log_progress`'s line: "embedding: blocks 12,800/1,000,000 (1.3%) | 772 blocks/s | ...".
_EMBEDDING = re.compile(_LOG_TIME + r".*embedding: blocks ([\d,]+)/([\d,]+) "
                        r".*?\| ([\d,.]+) blocks/s")


def builder_events(log_text: str) -> dict:
  """From the builder's log (timestamps in this machine's local time): when it started
  building each index, {step: unix time}, and its progress lines [(unix time, blocks done,
  blocks, blocks/s)] in order."""
  def when(match) -> float:
    return time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")) + \
        int(match.group(2)) / 1000
  started, progress = {}, []
  for line in log_text.splitlines():
    if (m := _BUILDING.match(line)):
      started[int(m.group(3))] = when(m)
    elif (m := _EMBEDDING.match(line)):
      number = lambda text: float(text.replace(",", ""))  # noqa: E731
      progress.append((when(m), number(m.group(3)), number(m.group(4)), number(m.group(5))))
  return {"started": started, "progress": progress}


def analyse(r: dict, args: argparse.Namespace) -> dict:
  """Phase figures from the trainer's records, the builder's log and the refreshed index's
  manifest. The builder's refresh starts when it begins building from the first checkpoint;
  the trainer is "alone" before that and "beside the builder" from then until the refreshed
  index is published (or the run was stopped). A refresh the run stopped before it finished is
  projected from the builder's last measured rate (marked so)."""
  from bench.vs_transformers import train_step_flops  # pylint: disable=g-import-not-at-top
  records = [x for x in r["records"] if "perf/steps_per_s" in x]
  if len(records) < 3:
    raise SystemExit(f"too few trainer records ({len(records)}) to analyse; the trainer's log "
                     f"ends:\n{r['trainer_log']}")
  events = r.get("builder_events") or builder_events(r["builder_log"])
  started = {int(step): t for step, t in events["started"].items() if int(step) > 0}
  refreshed = r["refreshed"]
  refresh_step = min(started) if started else None
  refresh_start = started[refresh_step] if started else None
  refresh_end = float(refreshed["published_unix"]) if refreshed is not None else None
  progress = [p for p in events["progress"] if refresh_start is not None and p[0] >= refresh_start]
  if refresh_end is not None:
    progress = [p for p in progress if p[0] <= refresh_end]

  def phase(lo: float, hi: float) -> dict:
    # Intervals between consecutive records lying wholly inside [lo, hi].
    walls, computes = [], []
    for a, b in zip(records, records[1:]):
      if a["time"] >= lo and b["time"] <= hi:
        walls.append((b["time"] - a["time"]) / (b["step"] - a["step"]))
        computes.append(1.0 / b["perf/steps_per_s"])
    if not walls:
      return {"intervals": 0}
    return {"intervals": len(walls), "wall_s": statistics.median(walls),
            "compute_s": statistics.median(computes)}

  alone = phase(0.0, refresh_start if refresh_start is not None else float("inf"))
  beside = ({"intervals": 0} if refresh_start is None else
            phase(refresh_start, refresh_end if refresh_end is not None else float("inf")))
  bert = r["config"]["bert"] if isinstance(r["config"], dict) else dataclasses.asdict(
      r["config"].bert)
  proj = r["config"]["proj_size"] if isinstance(r["config"], dict) else r["config"].proj_size
  step_flops = train_step_flops(batch=args.batch_size, candidates=8, query_len=QUERY_LEN,
                                block_len=args.block_len, reader_len=QUERY_LEN + args.block_len,
                                mlm_positions=MAX_MASKS, hidden=bert["hidden_size"],
                                intermediate=bert["intermediate_size"],
                                layers=bert["num_layers"], vocab=bert["vocab_size"], proj=proj)
  refresh = None
  if refresh_start is not None:
    refresh = {"step": refresh_step, "finished": refresh_end is not None}
    if progress:
      last = progress[-1]
      refresh.update(done=last[1], blocks=last[2], blocks_per_s=last[3],
                     # the builder's rate over its last minute of progress lines
                     recent_blocks_per_s=_recent_rate(progress))
    if refresh_end is not None:
      refresh["seconds"] = refresh_end - refresh_start
      extra = refreshed.get("extra") or {}
      refresh.update(embed_seconds=extra.get("embed_seconds"),
                     blocks_per_s=extra.get("blocks_per_s"))
    elif progress:
      rate = refresh["recent_blocks_per_s"] or refresh["blocks_per_s"]
      refresh["projected_seconds"] = (last[0] - refresh_start) + (last[2] - last[1]) / rate
  swap = None
  if refreshed is not None:
    swapped = [x for x in r["records"] if x.get("retrieval/index_step", 0) >= refreshed["step"]]
    if swapped:
      first = swapped[0]
      swap = {"step": first["step"], "staleness_steps": first.get("retrieval/staleness_steps"),
              "age_s": first["time"] - refresh_start, "wait_s": first["time"] - refresh_end}
  elif refresh is not None and "projected_seconds" in refresh and beside["intervals"]:
    # The trainer keeps stepping at its rate beside the builder until the index is published.
    refresh["projected_staleness_steps"] = refresh["projected_seconds"] / beside["wall_s"]
  first = records[0]
  return {"alone": alone, "beside": beside, "step_flops": step_flops, "swap": swap,
          "refresh": refresh, "first_record_s": first["time"] - r["launched"],
          "first_record_step": first["step"], "last_step": r["records"][-1]["step"],
          "refresh_start_s": None if refresh_start is None else refresh_start - r["launched"]}


def _recent_rate(progress: list, window_s: float = 60.0) -> Optional[float]:
  """Blocks/s between the last progress line and the first within `window_s` before it."""
  last = progress[-1]
  earlier = [p for p in progress if last[0] - p[0] >= window_s]
  if not earlier:
    return None
  ref = earlier[-1]
  return (last[1] - ref[1]) / (last[0] - ref[0])


def markdown(r: dict, a: dict, args: argparse.Namespace) -> str:
  """The docs section from the run's figures."""
  bert = r["config"]["bert"] if isinstance(r["config"], dict) else dataclasses.asdict(
      r["config"].bert)
  peak = r["peak"]["flops_per_s"]
  lines = [
      f"`python bench/paper_rehearsal.py --work DIR --blocks {args.blocks} --batch_size "
      f"{args.batch_size} --checkpoint_every {args.checkpoint_every} --seconds {args.seconds:g} "
      f"--dtype {args.dtype} --json FILE` on {r['device_kind']}; whole run "
      f"{r['total_seconds']:.0f}s ({r['outcome']})"
      + (f"; the figures are kept in {args.from_json}." if args.from_json else "."),
      "",
      f"One device holds both jobs, as bench/paper_rehearsal.py describes: the trainer "
      f"(`train_main`, the pretrain job, {'BERT-base' if bert['num_layers'] == 12 else 'BERT'}: "
      f"{bert['num_layers']} layers, hidden {bert['hidden_size']}, {bert['dtype']} compute, "
      f"float32 parameters; batch {args.batch_size} (REALM's 512 over 64 TPUs), K = 8 "
      f"candidates, query {QUERY_LEN}, block {args.block_len}; exact search; checkpoint every "
      f"{args.checkpoint_every} steps; index looked for every {args.index_check_every} steps) "
      f"and the builder (`build_index`, batch {args.builder_batch}) over a synthetic BlockStore "
      f"of {args.blocks:,} full blocks (written in {r['store_seconds']:.0f}s). Random weights, "
      f"queries and step-0 index; the first refresh is the one timed. Matmul peak in the same "
      f"run: {args.dtype} {args.matmul_n}^3, **{peak / 1e12:.1f} TFLOP/s**. FLOPs per step "
      f"counted as bench/vs_transformers.py counts them: {a['step_flops'] / 1e12:.2f} TFLOP.",
      "",
      "| train step | steps timed | compute s/step | wall s/step | examples/s (wall) | "
      "MFU (compute) |",
      "|---|---|---|---|---|---|",
  ]
  for name, ph in (("alone", a["alone"]), ("beside the builder's refresh", a["beside"])):
    if ph["intervals"]:
      lines.append(
          f"| {name} | {ph['intervals'] * args.log_every} | {ph['compute_s']:.3f} | "
          f"{ph['wall_s']:.3f} | {args.batch_size / ph['wall_s']:.1f} | "
          f"{100 * a['step_flops'] / ph['compute_s'] / peak:.0f}% |")
    else:
      lines.append(f"| {name} | 0 | - | - | - | - |")
  lines.append("")
  f = a["refresh"]
  if f is not None:
    lines += ["| refresh | value |", "|---|---|",
              f"| checkpoint embedded | step {f['step']}, the builder starting "
              f"{a['refresh_start_s']:.0f}s after launch |"]
    if f["finished"]:
      lines += [f"| refresh: the builder's restore, embedding and publication | "
                f"{f['seconds']:.0f} s |",
                f"| of which embedding ({args.blocks:,} blocks) | {f['embed_seconds']:.0f} s, "
                f"{f['blocks_per_s']:,.0f} blocks/s |"]
    elif "done" in f:
      lines += [f"| embedded when the run stopped | {f['done']:,.0f} of {f['blocks']:,.0f} "
                f"blocks ({100 * f['done'] / f['blocks']:.1f}%) |",
                f"| builder's rate beside the trainer (last minute) | "
                f"{f['recent_blocks_per_s'] or f['blocks_per_s']:,.0f} blocks/s |"]
      if "projected_seconds" in f:
        lines.append(f"| refresh, projected at that rate | about {f['projected_seconds']:.0f} s "
                     f"(not measured to the end) |")
      if "projected_staleness_steps" in f:
        lines.append(f"| staleness at the swap, projected | about "
                     f"{f['projected_staleness_steps']:.0f} steps (trainer steps during the "
                     f"refresh at the rate beside it) |")
    if a["swap"] is not None:
      s = a["swap"]
      lines += [f"| swapped in at trainer step | {s['step']} ({s['wait_s']:.0f} s after "
                f"publication) |",
                f"| staleness at the swap | {s['staleness_steps']:.0f} steps, index "
                f"{s['age_s']:.0f} s old |"]
    lines.append("")
  lines.append(
      f"Trainer start to its first metrics (imports, warm start, index load, compile, "
      f"{a['first_record_step']} steps): {a['first_record_s']:.0f}s; last step {a['last_step']}.")
  alone, beside = a["alone"], a["beside"]
  if alone["intervals"] and beside["intervals"] and f is not None:
    rate = f.get("recent_blocks_per_s") or f.get("blocks_per_s")
    seconds = f.get("seconds") or f.get("projected_seconds")
    staleness = (a["swap"] or {}).get("staleness_steps") or f.get("projected_staleness_steps")
    text = (f"Beside the builder the trainer's step takes {beside['wall_s'] / alone['wall_s']:.1f}x "
            f"as long ({alone['compute_s'] / beside['compute_s']:.2f} of its speed alone), while "
            f"the builder embeds {rate:,.0f} blocks/s: one device time-shares the two jobs. REALM "
            f"re-embeds on 16 TPUs of its own beside the 64 that train (REALM_SPEC 19).")
    if seconds and staleness:
      how = "" if f["finished"] else ", projected from the builder's rate when the run stopped"
      text += (f" Here one refresh of {args.blocks:,} blocks takes about {seconds:.0f} s, "
               f"about {staleness:.0f} trainer steps{how}: the index is that stale when "
               f"swapped in (the paper: a refresh about every 500 steps).")
    lines += ["", text]
  return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--work", help="an empty or new directory for the run")
  parser.add_argument("--from_json", help="render a kept run's figures (its --json) instead "
                                          "of running")
  parser.add_argument("--blocks", type=int, default=1_000_000)
  parser.add_argument("--block_len", type=int, default=288)
  parser.add_argument("--size", choices=("base", "tiny"), default="base",
                      help="tiny: a check of the script itself (hidden 128), never written")
  parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                      help="compute dtype of trainer and builder, and of the matmul peak")
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--checkpoint_every", type=int, default=100)
  parser.add_argument("--index_check_every", type=int, default=10)
  parser.add_argument("--log_every", type=int, default=10)
  parser.add_argument("--builder_batch", type=int, default=256)
  parser.add_argument("--after_swap_steps", type=int, default=20)
  parser.add_argument("--seconds", type=float, default=900.0,
                      help="stop trainer and builder after this long whatever happened")
  parser.add_argument("--matmul_n", type=int, default=8192)
  parser.add_argument("--json", help="keep the run's figures here")
  parser.add_argument("--write", action="store_true",
                      help=f"write the section {SECTION!r} of bench/docs/benchmarks.md")
  return parser


def args_from_json(r: dict, argv: Sequence[str] = ()) -> argparse.Namespace:
  """A kept run's arguments (its --json's "args"), `argv`'s flags taking precedence."""
  argv = list(argv)
  return _parser().parse_args(argv + [x for k, v in r["args"].items()
                                      if k not in ("work", "json", "write", "from_json")
                                      and v is not None and f"--{k}" not in argv
                                      for x in (f"--{k}", str(v))])


def main(argv: Optional[list[str]] = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if argv[:1] == ["trainer"]:  # the trainer process: train_main with SyntheticPretrainJob known
    from realm_jax import gin_utils  # pylint: disable=g-import-not-at-top
    from realm_jax import train  # pylint: disable=g-import-not-at-top
    gin_utils.exit_process(train.main(["realm_jax.train"] + argv[1:]), "train")
  parser = _parser()
  args = parser.parse_args(argv)
  if args.from_json:
    with open(args.from_json, encoding="utf-8") as f:
      r = json.load(f)
    args = args_from_json(r, argv)
  elif not args.work:
    parser.error("--work is required (or --from_json)")
  else:
    if args.write and args.size != "base":
      parser.error("--write records BERT-base only")
    # The driver only measures the peak: its allocator hands the memory back to the jobs.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", _DRIVER_ALLOCATOR)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the jobs on SIGTERM too
    r = run(args)
    r["config"] = dataclasses.asdict(r["config"])
    r["builder_events"] = builder_events(r["builder_log"])
    if args.json:  # the raw figures first: they are kept even if the analysis fails
      with open(args.json, "w", encoding="utf-8") as f:
        json.dump({**r, "args": {k: v for k, v in vars(args).items() if k != "write"}}, f,
                  indent=1)
  a = analyse(r, args)
  body = markdown(r, a, args)
  print("\n" + body, flush=True)
  if args.write:
    if r.get("platform", "gpu") == "cpu" or args.size != "base":
      parser.error("--write records BERT-base runs on an accelerator only")
    from bench import report  # pylint: disable=g-import-not-at-top
    report.write_section(SECTION, body, accelerator=r["device_kind"], host=r.get("host"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
