r"""realm_jax against the transformers REALM port: pretraining step and retriever embedding.

  python bench/vs_transformers.py [--batch 1] [--steps 2] [--write]    # BERT-base, CPU
  python bench/vs_transformers.py --batch 2 --steps 3 --write           # >= 48 GB of memory
  python bench/vs_transformers.py --device gpu --batch 2 --steps 10 --embed_batch 64
  python bench/vs_transformers.py --device gpu --dtype bfloat16 --batch 4 --steps 8 --embed_batch 64

Both implementations run in one process, on the same device, from the same weights (the port's
random weights imported into ours with `realm_jax.convert.hf`, as the parity check does), on
the same batch, with the same thread count, and their timed runs interleave (ours, theirs,
ours, ...) so that a shared machine's load falls on both alike.

Shapes: BERT-base (12 layers, hidden 768, 12 heads, intermediate 3072, vocab 30522), proj 128,
K = 8 candidates, query 96, block 288, reader rows `[CLS] query [SEP] block [SEP]` of
96 + 288 = 384 (`realm_jax.batches.pretraining_batches.pretraining_batch_spec`), 10 mask slots
per query.

1. Pretraining train step, examples/s (`--batch` examples of K candidates each; default 1:
   in float32 without rematerialisation each example keeps 7-9 GB of activations for the
   backward pass on either side (measured: XLA's temporary buffers, the tensors autograd
   saves), and both sides stay resident so that their steps can interleave; 1 is what a
   24 GB machine holds):
   ours    `trainer.make_train_step(RealmPretrainModel(config), optim.bert_optimizer(...),
           mesh=partitioning.make_mesh(...))`: one jitted step = query + candidate towers
           (tied), relevance scores, knowledge-augmented encoder with MLM logits at the 10 mask
           positions only, per-token marginal MLM loss, gradients, global-norm clipping, Adam
           without bias correction, weight decay, lr schedule, and the step's metrics
           (retrieval utility, null-document probability, gradient norm).
   theirs  `RealmScorer` (query embedder + candidate embedder over the K candidates, tied) ->
           `relevance_score` -> `RealmKnowledgeAugEncoder(..., relevance_score, labels,
           mlm_mask)`, whose loss is the same per-token marginal MLM loss but whose MLM head
           computes logits at all 384 positions of every reader row; `loss.backward()`,
           `clip_grad_norm_(1.0)`, `torch.optim.AdamW` (decay off for biases and LayerNorms,
           as ours). Eager PyTorch, as the port is written.
   Dropout: `--dropout` (default 0.0) is set for both, hidden and attention; both run in
   training mode (`model.train()`, ours with a dropout key). At 0 the two step-0 losses must
   agree, which the run checks and reports.
2. Retriever embedding, blocks/s of the document tower at block length 288, eval mode, batch
   `--embed_batch`: ours `RealmRetriever.embed_documents` jitted; theirs `RealmEmbedder`
   under `torch.inference_mode()`. Best of `--embed_repeats` interleaved runs.
3. MFU: achieved matmul FLOP/s over this device's matmul peak in the compute dtype (`--dtype`,
   float32 by default), measured in the same run by
   `bench.embedding_throughput.measure_matmul_peak` (jitted 4096^3, best of 5 before and 5
   after). FLOPs are counted analytically (`forward_flops`): 2 x (weights in matmuls) x
   tokens, plus the attention score and context matmuls (4 L^2 H per sequence per layer), x3
   for forward + backward; elementwise work, the embedding gathers and the optimizer are not
   counted. Each side is credited with what it computes: the port's MLM decoder runs at every
   reader position (2 H V FLOPs per position), ours at the mask slots only.
4. Threads: `--threads` (default: every core this process may use). torch gets
   `torch.set_num_threads(N)`; XLA's CPU thread pool is sized from the process's CPU affinity,
   which is pinned to N cores before either library starts its pool. (XLA has no
   intra-op-threads flag: `intra_op_parallelism_threads` is a TensorFlow session option;
   `--intra_op_parallelism_threads=N` in XLA_FLAGS aborts with "Unknown flag", and without the
   dashes it is silently ignored.)

`--device gpu` runs the same comparison with jax on its first GPU and torch on `cuda`, both in
full float32 at the default `--dtype float32` (`jax_default_matmul_precision=float32`, torch's
TF32 off), torch timed with `torch.cuda.synchronize()`, jax's allocator not preallocating (the
two share the GPU's memory, about 9 GB per example per side in float32); use more `--steps` and
a larger `--embed_batch` there. Its `--write` section is named after the GPU, beside the CPU's.

`--dtype bfloat16` (default float32) runs both sides in the usual mixed precision of each
framework, bfloat16 compute over float32 parameters: ours with `bert.dtype="bfloat16"` (the
config imported from the port, `with_compute_dtype`; dense layers, attention products and
embeddings in bfloat16, attention softmax, LayerNorms and the residual stream float32, as
realm_jax/models/bert.py says), for the train step and the embedder alike; the port's forward
passes (scorer and encoder in the train step, the embedder) under `torch.autocast(device_type,
dtype=torch.bfloat16)`, the backward pass and the optimizer outside it, as PyTorch recommends
(on CUDA autocast keeps softmax, LayerNorm and the log-softmax in float32). The MFU peak and the
diagnostic matmuls are then bfloat16 products on both sides, and on a GPU the float32 run's
precision forcing (`jax_default_matmul_precision=float32`, TF32 off) is not applied: both
libraries keep their defaults. The two step-0 losses then agree only approximately (the two
sides round to bfloat16 at different points); the run reports both and their difference.

`--write` replaces the section "Versus the transformers REALM port" of bench/docs/benchmarks.md
(bench/report.py `write_section`); with `--dtype bfloat16` the section "Versus the transformers
REALM port, bfloat16" instead (as bench/embedding_throughput.py names its bfloat16 section),
beside the float32 one (on a GPU: "Versus the transformers REALM port, bfloat16 (<GPU>)").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from typing import Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)
# transformers would import TensorFlow as well when it is installed; the port is PyTorch.
os.environ.setdefault("USE_TF", "0")

import numpy as np  # noqa: E402

SECTION = "Versus the transformers REALM port"
DTYPES = ("float32", "bfloat16")


def section_title(dtype: str = "float32") -> str:
  """The docs section of a run: the float32 one, or its own section per other compute dtype
  (named as bench/embedding_throughput.py names its bfloat16 section)."""
  return SECTION if dtype == "float32" else f"{SECTION}, {dtype}"

# BERT-base REALM, as transformers.RealmConfig() defaults.
BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
            intermediate_size=3072, retriever_proj_size=128)
# A smoke-test size for the script itself (`--size tiny`); the docs take BASE only.
TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, retriever_proj_size=16)
NUM_CANDIDATES = 8
QUERY_LEN = 96
BLOCK_LEN = 288
READER_LEN = QUERY_LEN + BLOCK_LEN
MAX_MASKS = 10


# ------------------------------------------------------------------------------ FLOP count


def encoder_flops(length: int, hidden: int, intermediate: int, layers: int) -> int:
  """Forward matmul FLOPs of a BERT encoder over one sequence of `length` tokens.

  Per layer: Q, K, V and output projections 4 x 2 L H^2; feed-forward 2 x 2 L H I; attention
  scores Q K^T and probabilities x V 2 x 2 L^2 H.
  """
  L, H, I = length, hidden, intermediate
  return layers * (8 * L * H * H + 4 * L * H * I + 4 * L * L * H)


def embedder_flops(length: int, hidden: int, intermediate: int, layers: int,
                   proj: int) -> int:
  """One retriever tower over one sequence: encoder + pooler (2 H^2) + projection (2 H P)."""
  return encoder_flops(length, hidden, intermediate, layers) + 2 * hidden * hidden + \
      2 * hidden * proj


def forward_flops(*, batch: int, candidates: int, query_len: int, block_len: int,
                  reader_len: int, mlm_positions: int, hidden: int, intermediate: int,
                  layers: int, vocab: int, proj: int) -> int:
  """Forward matmul FLOPs of one REALM pretraining step (x3 for forward + backward).

    B embedder(Lq) + B K embedder(Lb) + B K encoder(Lr)
    + B K mlm_positions (2 H^2 + 2 H V)       MLM transform and the tied decoder
    + 2 B K P                                 relevance scores

  `mlm_positions` is the number of reader positions the MLM head is applied to: the mask slots
  M for ours, every position Lr for the port.
  """
  B, K, H, V, P = batch, candidates, hidden, vocab, proj
  return (B * embedder_flops(query_len, H, intermediate, layers, P)
          + B * K * embedder_flops(block_len, H, intermediate, layers, P)
          + B * K * encoder_flops(reader_len, H, intermediate, layers)
          + B * K * mlm_positions * (2 * H * H + 2 * H * V)
          + 2 * B * K * P)


def train_step_flops(**shapes) -> int:
  """Forward + backward: the backward pass costs two forward passes (x3 in all)."""
  return 3 * forward_flops(**shapes)


# ------------------------------------------------------------------------------ inputs


def make_batch(batch: int, candidates: int, query_len: int, block_len: int, masks: int,
               vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
  """A pretraining batch with the model's keys (`pretraining_batches.pretraining_batch_spec`),
  full-length rows.

  Reader rows are query + block (`[CLS] q [SEP]` + `[CLS] b [SEP]`-shaped ids, types 0 then
  1); the mask slots are distinct positions inside the query, the last slot of each example
  padding (weight 0) as the data pipeline pads them. Speed does not depend on the values.
  """
  rng = np.random.default_rng(seed)
  low = min(1000, vocab // 2)  # past BERT's [unused] and special tokens
  ids = lambda *shape: rng.integers(low, vocab, shape).astype(np.int32)
  query = ids(batch, query_len)
  blocks = ids(batch, candidates, block_len)
  reader = np.concatenate([np.repeat(query[:, None], candidates, 1), blocks], axis=2)
  reader_types = np.concatenate(
      [np.zeros((batch, candidates, query_len), np.int32),
       np.ones((batch, candidates, block_len), np.int32)], axis=2)
  positions = np.zeros((batch, masks), np.int32)
  targets = np.zeros((batch, masks), np.int32)
  weights = np.zeros((batch, masks), np.float32)
  for b in range(batch):
    real = masks - 1
    positions[b, :real] = np.sort(rng.choice(np.arange(1, query_len - 1), real, replace=False))
    targets[b, :real] = ids(real)
    weights[b, :real] = 1.0
  return {
      "query_ids": query, "query_type_ids": np.zeros_like(query),
      "query_mask": np.ones_like(query),
      "candidate_input_ids": blocks, "candidate_type_ids": np.zeros_like(blocks),
      "candidate_mask": np.ones_like(blocks),
      "reader_ids": reader, "reader_type_ids": reader_types, "reader_mask": np.ones_like(reader),
      "mlm_positions": positions, "mlm_targets": targets, "mlm_weights": weights,
      "example_mask": np.ones((batch,), np.float32),
  }


def port_inputs(batch: dict[str, np.ndarray], device: Any = "cpu") -> dict[str, Any]:
  """The same batch as the port's keyword arguments (labels -100 except at the masks)."""
  import torch  # pylint: disable=g-import-not-at-top
  b, reader_len = batch["reader_ids"].shape[0], batch["reader_ids"].shape[2]
  labels = np.full((b, reader_len), -100, np.int64)
  mlm_mask = np.zeros((b, reader_len), np.int64)
  for i in range(b):
    for pos, target, weight in zip(batch["mlm_positions"][i], batch["mlm_targets"][i],
                                   batch["mlm_weights"][i]):
      if weight > 0:
        labels[i, pos] = target
        mlm_mask[i, pos] = 1
  t = lambda x: torch.as_tensor(np.asarray(x, np.int64), device=device)
  return {
      "scorer": dict(input_ids=t(batch["query_ids"]), attention_mask=t(batch["query_mask"]),
                     token_type_ids=t(batch["query_type_ids"]),
                     candidate_input_ids=t(batch["candidate_input_ids"]),
                     candidate_attention_mask=t(batch["candidate_mask"]),
                     candidate_token_type_ids=t(batch["candidate_type_ids"])),
      "encoder": dict(input_ids=t(batch["reader_ids"]), attention_mask=t(batch["reader_mask"]),
                      token_type_ids=t(batch["reader_type_ids"]), labels=t(labels),
                      mlm_mask=t(mlm_mask)),
  }


# ------------------------------------------------------------------------------ the port


def build_port(model_kwargs: dict, candidates: int, dropout: float, seed: int = 0,
               randomize: bool = False):
  """transformers RealmScorer (tied towers) and RealmKnowledgeAugEncoder, in training mode."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  config = transformers.RealmConfig(**model_kwargs, num_candidates=candidates,
                                    hidden_dropout_prob=dropout,
                                    attention_probs_dropout_prob=dropout)
  torch.manual_seed(seed)
  scorer = transformers.RealmScorer(config)
  encoder = transformers.RealmKnowledgeAugEncoder(config)
  if randomize:  # biases and LayerNorms off their 0/1 init, as the parity check does
    from realm_jax.convert import parity  # pylint: disable=g-import-not-at-top
    parity._randomize(scorer, seed)  # pylint: disable=protected-access
    parity._randomize(encoder, seed + 1)  # pylint: disable=protected-access
  scorer.train()
  encoder.train()
  return scorer, encoder


def port_optimizer(scorer, encoder, learning_rate: float = 3e-5, weight_decay: float = 0.01):
  """AdamW over both models' parameters, decay off for biases and LayerNorms (as ours)."""
  import torch  # pylint: disable=g-import-not-at-top
  decay, no_decay = [], []
  for model in (scorer, encoder):
    for name, p in model.named_parameters():
      (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(p)
  return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                            {"params": no_decay, "weight_decay": 0.0}],
                           lr=learning_rate, betas=(0.9, 0.999), eps=1e-6)


def port_autocast(model, dtype: str = "float32"):
  """The context the port's forward passes run in: none for float32, else PyTorch's mixed
  precision, `torch.autocast` to `dtype` on the device of `model`'s parameters (which stay
  float32; autocast casts them per op, and on CUDA keeps softmax, LayerNorm, log-softmax in
  float32)."""
  import torch  # pylint: disable=g-import-not-at-top
  if dtype == "float32":
    return contextlib.nullcontext()
  device_type = next(model.parameters()).device.type
  return torch.autocast(device_type=device_type, dtype=getattr(torch, dtype))


def port_train_step(scorer, encoder, optimizer, inputs: dict, clip_norm: float = 1.0,
                    phases: dict | None = None, dtype: str = "float32") -> float:
  """One step of the port: scorer -> encoder marginal MLM loss -> backward -> clip -> AdamW.

  Returns the loss (before the update). `phases`, if given, collects seconds per phase
  (forward, backward, optimizer; on a GPU with a synchronisation at each boundary). `dtype`
  other than float32: the forward passes under `torch.autocast` to it (`port_autocast`); the
  backward pass outside, as PyTorch recommends (it runs each op in the dtype autocast chose
  for its forward), and no loss scaling, which bfloat16's float32 exponent range does not need.
  """
  import torch  # pylint: disable=g-import-not-at-top
  def sync():  # phase boundaries on an accelerator (no-op on CPU)
    if phases is not None and loss.is_cuda:
      torch.cuda.synchronize()

  t0 = time.perf_counter()
  optimizer.zero_grad(set_to_none=True)
  with port_autocast(scorer, dtype):  # one context: its cast weights are reused by both
    scores = scorer(**inputs["scorer"]).relevance_score
    loss = encoder(**inputs["encoder"], relevance_score=scores).loss
  sync()
  t1 = time.perf_counter()
  loss.backward()
  sync()
  t2 = time.perf_counter()
  params = [p for group in optimizer.param_groups for p in group["params"]]
  torch.nn.utils.clip_grad_norm_(params, clip_norm)
  optimizer.step()
  value = float(loss.detach())  # waits for an accelerator
  # Gradients freed now rather than at the next step's start: the other side runs in between.
  optimizer.zero_grad(set_to_none=True)
  t3 = time.perf_counter()
  if phases is not None:
    for name, seconds in (("forward", t1 - t0), ("backward", t2 - t1), ("optimizer", t3 - t2)):
      phases.setdefault(name, []).append(seconds)
  return value


def port_embed(embedder, inputs: dict, dtype: str = "float32"):
  """The port's document tower in eval mode under `torch.inference_mode()` (and autocast to
  `dtype` when not float32, `port_autocast`): [n, proj], in the dtype its last op computed."""
  import torch  # pylint: disable=g-import-not-at-top
  was_training = embedder.training
  embedder.eval()
  try:
    with torch.inference_mode(), port_autocast(embedder, dtype):
      return embedder(**inputs).projected_score
  finally:
    embedder.train(was_training)


# ------------------------------------------------------------------------------ ours


def import_port_weights(scorer, encoder):
  """(RealmConfig, {"retriever", "encoder"} params) from the port's models, through
  realm_jax.convert.hf (the importer that reads checkpoints), without a trip to disk."""
  from realm_jax.convert import hf  # pylint: disable=g-import-not-at-top

  def numpy_state(model):
    # Copies: the port's optimizer updates its tensors in place later.
    return {k: v.detach().cpu().float().numpy().copy() for k, v in model.state_dict().items()}

  hf_config = scorer.config.to_dict()
  config, retriever, _ = hf.convert_state_dict(numpy_state(scorer), hf_config, "scorer")
  encoder_config, encoder_params, _ = hf.convert_state_dict(numpy_state(encoder),
                                                            encoder.config.to_dict(), "encoder")
  if not config.share_embedders or encoder_config != config:
    raise AssertionError(f"imported configs differ: {config} vs {encoder_config}")
  return config, {"retriever": retriever, "encoder": encoder_params}


def with_compute_dtype(config, dtype: str):
  """`config` (a RealmConfig, as `import_port_weights` returns it) computing in `dtype`: its one
  BertConfig, which every tower (query, documents, reader) is built from, gets `dtype`;
  `param_dtype` stays float32, so the imported parameters are stored as they were."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  return dataclasses.replace(config, bert=dataclasses.replace(config.bert, dtype=dtype))


def build_ours(config, params, device, total_steps: int = 10_000,
               learning_rate: float = 3e-5, seed: int = 0,
               compiler_options: dict | None = None):
  """Our jitted train step (`trainer.make_train_step`) and its state holding `params`.

  `compiler_options` go to XLA (the test passes a cheaper CPU build; the benchmark none).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from realm_jax.models import realm  # pylint: disable=g-import-not-at-top
  from realm_jax.training import optim, partitioning, trainer  # pylint: disable=g-import-not-at-top

  model = realm.RealmPretrainModel(config)
  optimizer = optim.bert_optimizer(learning_rate, total_steps)
  mesh = partitioning.make_mesh(devices=[device])
  step = trainer.make_train_step(
      model, optimizer, mesh=mesh,
      learning_rate_fn=optim.bert_learning_rate_schedule(learning_rate, total_steps),
      compiler_options=compiler_options)
  expected = jax.tree_util.tree_structure(step.abstract_state.params)
  if jax.tree_util.tree_structure(params) != expected:
    raise AssertionError("imported parameter tree differs from RealmPretrainModel.init's")
  # TrainStep.init_state would draw random parameters; the state is built around the
  # imported ones instead (the optimizer state does not depend on their values).
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
  state = trainer.TrainState(step=jnp.zeros([], jnp.int32), params=params,
                             opt_state=optimizer.init(params),
                             rng=jax.random.key_data(jax.random.key(seed)))
  state = jax.device_put(state, step.state_sharding)
  return step, state


def our_train_step(step, state, batch):
  """One step; returns (new state, loss before the update as a float). Blocks until done."""
  import jax  # pylint: disable=g-import-not-at-top
  state, metrics = step(state, batch)
  jax.block_until_ready((state, metrics))
  return state, float(metrics["train/loss"])


def our_embedder(config):
  """Jitted `RealmRetriever.embed_documents` (eval mode): (retriever params, ids, types,
  mask) -> [n, proj]."""
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax.models.retriever import RealmRetriever  # pylint: disable=g-import-not-at-top

  @jax.jit
  def embed(params, ids, types, mask):
    return RealmRetriever(config).apply({"params": params}, ids, types, mask,
                                        method=RealmRetriever.embed_documents)
  return embed


# ------------------------------------------------------------------------------ the run


def _pin_threads(threads: int | None) -> int:
  """Restricts this process to `threads` cores (XLA sizes its pool from the affinity)."""
  cores = sorted(os.sched_getaffinity(0))
  if threads is None:
    return len(cores)
  if not 1 <= threads <= len(cores):
    raise SystemExit(f"--threads {threads}: this process may use {len(cores)} cores")
  os.sched_setaffinity(0, cores[:threads])
  return threads


class _SavedTensors:
  """Counts the bytes autograd saves for the backward pass (activations; parameters left
  out), through `torch.autograd.graph.saved_tensors_hooks`."""

  def __init__(self, *models):
    self._params = {p.untyped_storage().data_ptr() for m in models for p in m.parameters()}
    self._storages: dict[int, int] = {}
    self._hooks = None

  def _pack(self, tensor):
    try:
      storage = tensor.untyped_storage()
      if storage.data_ptr() not in self._params:
        self._storages[storage.data_ptr()] = storage.nbytes()
    except (RuntimeError, NotImplementedError):
      # Tensors without a plain storage (views of sparse or meta tensors) are not counted; the
      # figure is a memory note in the report, not a timing.
      pass
    return tensor

  def __enter__(self):
    import torch  # pylint: disable=g-import-not-at-top
    self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
    self._hooks.__enter__()
    return self

  def __exit__(self, *exc):
    self._hooks.__exit__(*exc)

  @property
  def nbytes(self) -> int:
    return sum(self._storages.values())


def _release_memory() -> None:
  """Hands freed heap memory back to the OS (glibc keeps freed blocks under 32 MB, and the
  port frees gigabytes of them per step), so the side that runs next has room. Untimed."""
  import ctypes  # pylint: disable=g-import-not-at-top
  import gc  # pylint: disable=g-import-not-at-top
  gc.collect()
  torch = sys.modules.get("torch")
  if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
    torch.cuda.empty_cache()  # the caching allocator's blocks, for jax's turn
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):
    pass


def _available_gb() -> float | None:
  try:
    with open("/proc/meminfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) / 2**20
  except OSError:
    pass
  return None


def _versions() -> dict[str, str]:
  import flax  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  return {"python": platform.python_version(), "jax": jax.__version__,
          "jaxlib": jaxlib.__version__, "flax": flax.__version__, "optax": optax.__version__,
          "torch": torch.__version__, "transformers": transformers.__version__}


def _torch_backend(torch_device) -> str:
  import torch  # pylint: disable=g-import-not-at-top
  if torch_device.type == "cuda":
    return f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
  parts = []
  if torch.backends.mkl.is_available():
    parts.append("MKL")
  if torch.backends.mkldnn.is_available():
    parts.append(f"oneDNN {'.'.join(map(str, torch.backends.mkldnn.version()))}"
                 if hasattr(torch.backends.mkldnn, "version") else "oneDNN")
  parts.append(f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
  return ", ".join(parts)


def _torch_matmul_gflops(torch_device, n: int, reps: int = 5, dtype: str = "float32") -> float:
  """Diagnostic only (not the MFU peak): the peak helper's `dtype` [n,n]x[n,n] product run
  through torch (MKL/oneDNN on CPU), to tell library speed from framework overhead."""
  import torch  # pylint: disable=g-import-not-at-top
  g = torch.Generator(device="cpu").manual_seed(0)
  a = torch.randn(n, n, generator=g).to(torch_device, getattr(torch, dtype))
  b = torch.randn(n, n, generator=g).to(torch_device, getattr(torch, dtype))
  times = []
  for i in range(reps + 1):
    start = time.perf_counter()
    torch.matmul(a, b)
    if torch_device.type == "cuda":
      torch.cuda.synchronize()
    if i:
      times.append(time.perf_counter() - start)
  return 2.0 * n ** 3 / min(times) / 1e9


def _layer_matmuls(torch_device, jax_device, rows: int, hidden: int, intermediate: int,
                   reps: int = 15, dtype: str = "float32") -> dict[str, float]:
  """Diagnostic: GFLOP/s of the BERT feed-forward matmul [rows, H] x [H, I] in `dtype` (the
  models' compute dtype), both libraries, interleaved, best of `reps`."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  x = rng.standard_normal((rows, hidden), dtype=np.float32)
  w = rng.standard_normal((hidden, intermediate), dtype=np.float32)
  # Cast on the device (numpy has no bfloat16 of its own for torch.from_numpy).
  xj, wj = (jax.device_put(a, jax_device).astype(dtype) for a in (x, w))
  xt, wt = (torch.from_numpy(a).to(torch_device, getattr(torch, dtype)) for a in (x, w))
  mm = jax.jit(jnp.matmul)
  mm(xj, wj).block_until_ready()
  torch.matmul(xt, wt)
  best = {"jax": float("inf"), "torch": float("inf")}
  for _ in range(reps):
    start = time.perf_counter()
    mm(xj, wj).block_until_ready()
    best["jax"] = min(best["jax"], time.perf_counter() - start)
    start = time.perf_counter()
    torch.matmul(xt, wt)
    if torch_device.type == "cuda":
      torch.cuda.synchronize()
    best["torch"] = min(best["torch"], time.perf_counter() - start)
  flops = 2.0 * rows * hidden * intermediate
  return {k: flops / v / 1e9 for k, v in best.items()}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batch", type=int, default=1,
                      help="examples (of K candidates each) per train step; each example "
                           "needs about 9 GB per side on CPU (float32 activations kept for the "
                           "backward pass), so 1 fits a 24 GB machine with both sides resident")
  parser.add_argument("--steps", type=int, default=2, help="timed train steps per side")
  parser.add_argument("--embed_batch", type=int, default=16, help="blocks per embedding call")
  parser.add_argument("--embed_repeats", type=int, default=3,
                      help="timed embedding calls per side; the best is reported")
  parser.add_argument("--dropout", type=float, default=0.0,
                      help="hidden and attention dropout of both sides (train mode)")
  parser.add_argument("--threads", type=int, default=None,
                      help="threads for both (default: every core this process may use)")
  parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
  parser.add_argument("--dtype", choices=DTYPES, default="float32",
                      help="compute dtype of both sides (parameters stay float32): ours "
                           "`bert.dtype`, the port `torch.autocast`; bfloat16 writes its own "
                           "section")
  parser.add_argument("--matmul_n", type=int, default=4096)
  parser.add_argument("--size", choices=("base", "tiny"), default="base",
                      help="tiny: a quick check of the script (hidden 32), never written")
  parser.add_argument("--write", action="store_true",
                      help=f"write the section {SECTION!r} of bench/docs/benchmarks.md (with "
                           f"--dtype bfloat16: {section_title('bfloat16')!r})")
  args = parser.parse_args(argv)
  if args.write and args.size != "base":
    parser.error("--write records BERT-base only")
  total_start = time.perf_counter()

  # Before jax or torch start their thread pools.
  threads = _pin_threads(args.threads if args.device == "cpu" else None)
  if args.device == "gpu":
    # jax would take 75% of the GPU's memory at its first use; the port needs its share.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  import torch  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from bench.embedding_throughput import flops_per_block, measure_matmul_peak  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(threads)
  if args.device == "gpu":
    if not torch.cuda.is_available():
      raise SystemExit("--device gpu: torch sees no CUDA device")
    try:
      jax_device = jax.devices("gpu")[0]
    except RuntimeError as e:
      raise SystemExit(f"--device gpu: jax has no GPU backend ({e})") from e
    torch_device = torch.device("cuda")
    if args.dtype == "float32":
      # Full float32 on both sides: JAX's default GPU precision would use TF32, torch's not.
      jax.config.update("jax_default_matmul_precision", "float32")
      torch.backends.cuda.matmul.allow_tf32 = False
      torch.backends.cudnn.allow_tf32 = False
    # bfloat16: both libraries' defaults. Every model matmul takes bfloat16 inputs, so the
    # float32 comparison's forcing would not apply to them, and mixed precision is what it is
    # as each framework ships it.
  else:
    jax_device = jax.devices("cpu")[0]
    torch_device = torch.device("cpu")
  versions = _versions()
  print(f"threads: {threads} (torch {torch.get_num_threads()}); jax device "
        f"{jax_device.device_kind}; torch device {torch_device}; compute dtype {args.dtype}; "
        f"{versions}", flush=True)

  available = _available_gb()
  needed = 6 + 9.5 * args.batch  # both models, Adam states, one side's activations (measured)
  if args.device == "cpu" and available is not None and available < needed:
    print(f"WARNING: {available:.0f} GB available, about {needed:.0f} GB needed at --batch "
          f"{args.batch}; the run may be killed for memory", flush=True)

  # The peak in the models' compute dtype: bfloat16 products run at another (higher) peak.
  peak = measure_matmul_peak(jax_device, args.matmul_n, dtype=args.dtype)
  print(f"matmul peak: {peak['flops_per_s'] / 1e9:.1f} GFLOP/s ({args.dtype})", flush=True)

  # ---------------------------------------------------------------- models, same weights
  start = time.perf_counter()
  scorer, encoder = build_port(BASE if args.size == "base" else TINY, NUM_CANDIDATES,
                               args.dropout, seed=0)
  config, params = import_port_weights(scorer, encoder)
  # The compute dtype, after the import's check that both models' configs agree; the one
  # config serves our train step and our embedder alike.
  config = with_compute_dtype(config, args.dtype)
  scorer.to(torch_device)
  encoder.to(torch_device)
  optimizer = port_optimizer(scorer, encoder)
  step, state = build_ours(config, params, jax_device)
  retriever_params = jax.device_put(params["retriever"], jax_device)
  del params
  print(f"models built, weights imported: {time.perf_counter() - start:.0f}s", flush=True)

  b = config.bert
  shapes = dict(batch=args.batch, candidates=NUM_CANDIDATES, query_len=QUERY_LEN,
                block_len=BLOCK_LEN, reader_len=READER_LEN, hidden=b.hidden_size,
                intermediate=b.intermediate_size, layers=b.num_layers, vocab=b.vocab_size,
                proj=config.proj_size)
  ours_flops = train_step_flops(**shapes, mlm_positions=MAX_MASKS)
  theirs_flops = train_step_flops(**shapes, mlm_positions=READER_LEN)
  block_flops = embedder_flops(BLOCK_LEN, b.hidden_size, b.intermediate_size, b.num_layers,
                               config.proj_size)
  assert block_flops == flops_per_block(config, BLOCK_LEN), "FLOP counts disagree"

  # ---------------------------------------------------------------- 2. embedding
  # First, while both towers still hold the same (imported) weights.
  rng = np.random.default_rng(1)
  n = args.embed_batch
  low = min(1000, b.vocab_size // 2)
  ids = rng.integers(low, b.vocab_size, (n, BLOCK_LEN)).astype(np.int32)
  types = np.zeros_like(ids)
  types[:, BLOCK_LEN // 4:] = 1
  mask = np.ones_like(ids)
  embed = our_embedder(config)
  jids, jtypes, jmask = (jax.device_put(x, jax_device) for x in (ids, types, mask))
  tinputs = {k: torch.as_tensor(x.astype(np.int64), device=torch_device)
             for k, x in (("input_ids", ids), ("token_type_ids", types),
                          ("attention_mask", mask))}

  # Both compared in float32 (in bfloat16 mode both come out bfloat16, which torch's .numpy()
  # does not take).
  ours_emb = np.asarray(embed(retriever_params, jids, jtypes, jmask), np.float32)  # compiles
  theirs_emb = port_embed(scorer.embedder, tinputs, args.dtype).float().cpu().numpy()
  embed_diff = float(np.max(np.abs(ours_emb - theirs_emb)))
  ours_embed_times, theirs_embed_times = [], []
  for _ in range(args.embed_repeats):  # interleaved
    start = time.perf_counter()
    embed(retriever_params, jids, jtypes, jmask).block_until_ready()
    ours_embed_times.append(time.perf_counter() - start)
    start = time.perf_counter()
    port_embed(scorer.embedder, tinputs, args.dtype)
    if torch_device.type == "cuda":
      torch.cuda.synchronize()
    theirs_embed_times.append(time.perf_counter() - start)
  print(f"embedding {n} blocks: ours {min(ours_embed_times):.2f}s, theirs "
        f"{min(theirs_embed_times):.2f}s (max |diff| {embed_diff:.1e})", flush=True)
  del retriever_params, jids, jtypes, jmask, embed, tinputs
  _release_memory()

  # ---------------------------------------------------------------- 1. train step
  batch = make_batch(args.batch, NUM_CANDIDATES, QUERY_LEN, BLOCK_LEN, MAX_MASKS,
                     b.vocab_size, seed=0)
  inputs = port_inputs(batch, torch_device)
  ours_batch = jax.device_put(batch, step.batch_sharding)

  start = time.perf_counter()
  # Compiled ahead of time (the same executable a call would compile), for its memory figure.
  compiled = step.lower(state, ours_batch).compile()
  ours_compile_s = time.perf_counter() - start
  memory = compiled.memory_analysis()
  ours_temp_gb = memory.temp_size_in_bytes / 1e9 if memory is not None else float("nan")
  start = time.perf_counter()
  state, ours_loss0 = our_train_step(compiled, state, ours_batch)  # step 0, warm-up
  ours_first_s = time.perf_counter() - start
  print(f"ours: compile {ours_compile_s:.1f}s (temp buffers {ours_temp_gb:.1f} GB), step 0 "
        f"{ours_first_s:.1f}s, loss {ours_loss0:.6f}", flush=True)
  start = time.perf_counter()
  with _SavedTensors(scorer, encoder) as saved:  # the warm-up only: not timed
    theirs_loss0 = port_train_step(scorer, encoder, optimizer, inputs, dtype=args.dtype)
  theirs_first_s = time.perf_counter() - start
  theirs_saved_gb = saved.nbytes / 1e9
  _release_memory()
  print(f"theirs: step 0 {theirs_first_s:.1f}s (activations saved for backward "
        f"{theirs_saved_gb:.1f} GB), loss {theirs_loss0:.6f}; step-0 |diff| "
        f"{abs(ours_loss0 - theirs_loss0):.1e}", flush=True)

  ours_times, theirs_times, phases = [], [], {}
  for i in range(args.steps):  # interleaved: ours, theirs, ours, theirs, ...
    start = time.perf_counter()
    state, _ = our_train_step(compiled, state, ours_batch)
    ours_times.append(time.perf_counter() - start)
    start = time.perf_counter()
    port_train_step(scorer, encoder, optimizer, inputs, phases=phases, dtype=args.dtype)
    theirs_times.append(time.perf_counter() - start)
    _release_memory()  # outside the timed region
    print(f"step {i + 1}: ours {ours_times[-1]:.2f}s, theirs {theirs_times[-1]:.2f}s",
          flush=True)
  del state, step, compiled, ours_batch, inputs, optimizer, encoder, scorer
  _release_memory()

  # ---------------------------------------------------------------- diagnostics, peak again
  rows = args.batch * NUM_CANDIDATES * READER_LEN
  layer_mm = _layer_matmuls(torch_device, jax_device, rows, b.hidden_size,
                            b.intermediate_size, dtype=args.dtype)
  torch_mm = _torch_matmul_gflops(torch_device, args.matmul_n, dtype=args.dtype)
  peak_after = measure_matmul_peak(jax_device, args.matmul_n, dtype=args.dtype)
  print(f"matmul peak after: {peak_after['flops_per_s'] / 1e9:.1f} GFLOP/s; torch "
        f"{args.matmul_n}^3: {torch_mm:.1f} GFLOP/s; [{rows},{b.hidden_size}]x"
        f"[{b.hidden_size},{b.intermediate_size}]: jax {layer_mm['jax']:.1f}, torch "
        f"{layer_mm['torch']:.1f} GFLOP/s", flush=True)
  if peak_after["flops_per_s"] > peak["flops_per_s"]:
    peak = peak_after
  total_s = time.perf_counter() - total_start

  r = {
      "args": args, "config": config, "threads": threads, "versions": versions, "peak": peak,
      "jax_device": jax_device, "torch_device": torch_device,
      "torch_backend": _torch_backend(torch_device),
      "ours_flops": ours_flops, "theirs_flops": theirs_flops, "block_flops": block_flops,
      "ours_loss0": ours_loss0, "theirs_loss0": theirs_loss0,
      "ours_first_s": ours_first_s, "theirs_first_s": theirs_first_s,
      "ours_compile_s": ours_compile_s, "ours_temp_gb": ours_temp_gb,
      "theirs_saved_gb": theirs_saved_gb,
      "ours_times": ours_times, "theirs_times": theirs_times, "phases": phases,
      "ours_embed_times": ours_embed_times, "theirs_embed_times": theirs_embed_times,
      "embed_diff": embed_diff, "torch_mm": torch_mm, "layer_mm": layer_mm, "rows": rows,
      "total_s": total_s,
      "load": os.getloadavg()[0],
  }
  body = markdown(r)
  print("\n" + body, flush=True)
  if args.write:
    from bench import report  # pylint: disable=g-import-not-at-top
    title = section_title(args.dtype)
    report.write_section(title, body, accelerator=(
        jax_device.device_kind if args.device == "gpu" else None))
    print(f"\nwrote the section {title!r} of {report.BENCHMARKS_MD}", flush=True)
  return 0


def markdown(r: dict) -> str:
  """The docs section from the run's measurements."""
  args, peak = r["args"], r["peak"]
  bc = r["config"].bert
  peak_flops = peak["flops_per_s"]
  best = lambda xs: min(xs)
  med = lambda xs: statistics.median(xs)
  ours_s, theirs_s = best(r["ours_times"]), best(r["theirs_times"])
  ours_eps, theirs_eps = args.batch / ours_s, args.batch / theirs_s
  ours_gf, theirs_gf = r["ours_flops"] / ours_s, r["theirs_flops"] / theirs_s
  common_gf_theirs = r["ours_flops"] / theirs_s
  n = args.embed_batch
  ours_bps, theirs_bps = n / best(r["ours_embed_times"]), n / best(r["theirs_embed_times"])
  v = r["versions"]
  on_gpu = args.device == "gpu"
  device = (f"GPU {r['jax_device'].device_kind}" if on_gpu
            else f"CPU ({r['threads']} threads each)")
  loss_diff = abs(r["ours_loss0"] - r["theirs_loss0"])
  phases = {k: med(x) for k, x in r["phases"].items()}
  # getattr: run records made before --dtype existed (and the tests' hand-made ones) are float32.
  dtype = getattr(args, "dtype", "float32")
  mixed = dtype != "float32"
  cmd = (f"python bench/vs_transformers.py --batch {args.batch} --steps {args.steps} "
         f"--embed_batch {args.embed_batch} --embed_repeats {args.embed_repeats}"
         + (f" --dropout {args.dropout}" if args.dropout else "")
         + (f" --threads {args.threads}" if args.threads else "")
         + (" --device gpu" if args.device == "gpu" else "")
         + (f" --dtype {dtype}" if mixed else "") + " --write")
  # What "float32" said in the float32 run, in the dtype used.
  numerics = (f"{dtype} compute, float32 parameters (ours `bert.dtype=\"{dtype}\"`, the port's "
              f"forward passes under `torch.autocast(..., dtype=torch.{dtype})`, its backward "
              f"and optimizer outside)" if mixed else "float32")
  autocast = f"autocast {dtype}"

  if on_gpu:
    precision = (f"both with {numerics}, and at both libraries' default matmul precision (the "
                 "float32 run's `jax_default_matmul_precision=float32` and TF32-off are not "
                 f"applied: the models' matmuls take {dtype} inputs)" if mixed else
                 "both in full float32 (`jax_default_matmul_precision=float32`, torch's TF32 "
                 "off)")
    placement = (f"{device}, both sides on it, {precision}; torch timed with "
                 "`torch.cuda.synchronize()`, jax with `block_until_ready()`; jax's allocator "
                 "not preallocating, as the two share the GPU's memory.")
  else:
    placement = (f"{device}: torch `set_num_threads({r['threads']})`, XLA's pool sized by the "
                 f"process's CPU affinity, pinned to the same {r['threads']} cores"
                 + (f"; both with {numerics}." if mixed else "."))
  lines = [
      f"`{cmd}` (whole run {r['total_s']:.0f}s; 1-minute load average at the end "
      f"{r['load']:.1f} on {os.cpu_count()} host cores; the timed runs of the two sides "
      f"interleave and the best of each is reported). jax {v['jax']} (jaxlib "
      f"{v['jaxlib']}, flax {v['flax']}, optax {v['optax']}), torch {v['torch']} "
      f"({r['torch_backend']}), transformers {v['transformers']}, Python {v['python']}; "
      + placement,
      "",
      f"Shapes, both sides: {'BERT-base' if args.size == 'base' else 'tiny'} ({bc.num_layers} "
      f"layers, hidden {bc.hidden_size}, {bc.num_heads} heads, intermediate "
      f"{bc.intermediate_size}, vocab {bc.vocab_size}), proj {r['config'].proj_size}, K = "
      f"{NUM_CANDIDATES} candidates, query {QUERY_LEN}, block {BLOCK_LEN}, reader rows "
      f"{READER_LEN}, {MAX_MASKS} mask slots ({MAX_MASKS - 1} real); train batch "
      f"{args.batch} example(s) x {NUM_CANDIDATES} candidates, "
      f"{f'{dtype} compute (ours), {autocast} (port), float32 parameters' if mixed else 'float32'}"
      f", dropout {args.dropout:g} on both (training mode). Same weights: the port's random "
      f"weights imported into ours with `realm_jax.convert.hf`. Step-0 loss: ours "
      f"{r['ours_loss0']:.6f}, port {r['theirs_loss0']:.6f} (|diff| {loss_diff:.1e}"
      + (f", relative {loss_diff / abs(r['theirs_loss0']):.1e}: in {dtype} the two sides round "
         f"at different points, so they agree only approximately" if mixed else "")
      + f"); document embeddings max |diff| {r['embed_diff']:.1e}.",
      "",
      "What one train step includes. **Ours**: `trainer.make_train_step(RealmPretrainModel"
      "(config), optim.bert_optimizer(3e-5, 10000), mesh=partitioning.make_mesh(...))`, one "
      "jitted XLA program: query and candidate towers (tied), scores, reader with MLM logits "
      "at the mask slots only, per-token marginal loss, backward, global-norm clip, Adam "
      "without bias correction, weight decay, lr schedule, metrics. **Port**: `RealmScorer` "
      "(query + K candidates, tied) -> `RealmKnowledgeAugEncoder(relevance_score=..., "
      "labels=..., mlm_mask=...)` (the same per-token marginal loss, MLM logits at all "
      f"{READER_LEN} positions) -> `loss.backward()` -> `clip_grad_norm_(1.0)` -> "
      "`torch.optim.AdamW` step, eager. Warm-up: ours is compiled ahead of time "
      f"({r['ours_compile_s']:.0f}s), then one untimed step each (ours {r['ours_first_s']:.0f}s, "
      f"port {r['theirs_first_s']:.0f}s), then {args.steps} timed steps each, interleaved.",
      "",
      f"Memory bounds the batch ({args.batch}): our step's XLA temporary buffers are "
      f"{r['ours_temp_gb']:.1f} GB (`memory_analysis()`), the port saves "
      f"{r['theirs_saved_gb']:.1f} GB of activations for its backward pass "
      f"(`saved_tensors_hooks`), both "
      f"{f'with {dtype} compute ({autocast} on the port)' if mixed else 'in float32'} without "
      f"rematerialisation, and both sides stay resident so that their steps can interleave"
      + (" on the GPU." if on_gpu else
         ", on a machine shared with other jobs. Freed heap memory goes back to the OS between "
         "steps (`malloc_trim`, untimed), so every step of either side faults its activation "
         "memory in afresh, as XLA's per-execution temporary buffer does anyway."),
      "",
      f"MFU peer in the same run: `measure_matmul_peak` of bench/embedding_throughput.py, jitted "
      f"{dtype} {peak['n']}^3 matmul, best of 5 before and 5 after: **{peak_flops / 1e9:.1f} "
      f"GFLOP/s** (best of both: the quietest moment, so load during the timed runs lowers "
      f"both sides' MFU alike; the ours / port ratios, from interleaved runs, are the robust "
      f"figures). FLOPs counted by `forward_flops` (x3 for forward + backward): B E(Lq) + B K "
      f"E(Lb) + B K T(Lr) + B K m (2 H^2 + 2 H V) + 2 B K P, with T(L) = N (8 L H^2 + 4 L H I "
      f"+ 4 L^2 H) (4 projections, feed-forward, attention scores and context) and E(L) = T(L) "
      f"+ 2 H^2 + 2 H P (pooler, projection); m = MLM positions, {MAX_MASKS} for ours, "
      f"{READER_LEN} for the port. Elementwise ops, gathers and the optimizer are not counted. "
      f"Per step: ours **{r['ours_flops'] / 1e12:.2f} TFLOP**, port **"
      f"{r['theirs_flops'] / 1e12:.2f} TFLOP** ({r['theirs_flops'] / r['ours_flops']:.2f}x: the "
      f"port's vocabulary decoder at every reader position). Per block embedded: "
      f"{r['block_flops'] / 1e9:.1f} GFLOP.",
      "",
      "| benchmark | realm_jax | transformers port | ours / port |",
      "|---|---|---|---|",
      f"| train step: seconds, best (median) | {ours_s:.2f} ({med(r['ours_times']):.2f}) | "
      f"{theirs_s:.2f} ({med(r['theirs_times']):.2f}) | {ours_s / theirs_s:.2f}x time |",
      f"| train step: **examples/s** | **{ours_eps:.3f}** | **{theirs_eps:.3f}** | "
      f"**{ours_eps / theirs_eps:.2f}x** |",
      f"| train step: achieved GFLOP/s (own count) | {ours_gf / 1e9:.1f} | {theirs_gf / 1e9:.1f} "
      f"| {ours_gf / theirs_gf:.2f}x |",
      f"| train step: **MFU** (own count) | **{100 * ours_gf / peak_flops:.0f}%** | "
      f"**{100 * theirs_gf / peak_flops:.0f}%** | |",
      f"| train step: MFU counting only REALM's mask-slot FLOPs for both | "
      f"{100 * ours_gf / peak_flops:.0f}% | {100 * common_gf_theirs / peak_flops:.0f}% | |",
      f"| embedding ({n} blocks of {BLOCK_LEN}, eval): **blocks/s** | **{ours_bps:.2f}** | "
      f"**{theirs_bps:.2f}** | **{ours_bps / theirs_bps:.2f}x** |",
      f"| embedding: achieved GFLOP/s | {ours_bps * r['block_flops'] / 1e9:.1f} | "
      f"{theirs_bps * r['block_flops'] / 1e9:.1f} | |",
      f"| embedding: **MFU** | **{100 * ours_bps * r['block_flops'] / peak_flops:.0f}%** | "
      f"**{100 * theirs_bps * r['block_flops'] / peak_flops:.0f}%** | |",
      "",
      f"Diagnostics from the same run{f', in {dtype}' if mixed else ''}: the peak's "
      f"{peak['n']}^3 product through torch (best of 5): {r['torch_mm']:.1f} GFLOP/s (XLA: "
      f"{peak_flops / 1e9:.1f}); the feed-forward matmul "
      f"at the train step's shape, [{r['rows']}, {bc.hidden_size}] x [{bc.hidden_size}, "
      f"{bc.intermediate_size}], best of 15 interleaved calls each: XLA "
      f"{r['layer_mm']['jax']:.1f}, torch {r['layer_mm']['torch']:.1f} GFLOP/s. Port step, "
      f"median seconds by phase: forward {phases.get('forward', float('nan')):.2f}, backward "
      f"{phases.get('backward', float('nan')):.2f}, clip + AdamW "
      f"{phases.get('optimizer', float('nan')):.2f}.",
  ]
  lines += ["", _verdict(r, ours_eps / theirs_eps, ours_bps / theirs_bps, ours_gf, theirs_gf,
                         peak_flops, phases)]
  if not on_gpu:
    lines += ["", "`--device gpu` runs the same comparison on a GPU and writes its own section, "
              "named after the GPU."]
  return "\n".join(lines)


def _verdict(r, train_ratio, embed_ratio, ours_gf, theirs_gf, peak_flops, phases) -> str:
  """What the numbers say, and why the slower side is slower (from the diagnostics)."""
  del peak_flops
  out = []
  extra = r["theirs_flops"] / r["ours_flops"]
  throughput = ours_gf / theirs_gf
  mm = r["layer_mm"]
  mm_ratio = mm["jax"] / mm["torch"]
  on_gpu = r["args"].device == "gpu"
  library = (f"at the step's feed-forward shape XLA's {'GPU' if on_gpu else 'CPU'} dot reaches "
             f"{mm['jax']:.0f} GFLOP/s and torch's ({'cuBLAS' if on_gpu else 'MKL'}) "
             f"{mm['torch']:.0f}, {mm_ratio:.2f}x")
  if train_ratio >= 1:
    out.append(
        f"Train step: ours does {train_ratio:.2f}x the port's examples/s = {extra:.2f}x fewer "
        f"FLOPs (the port's MLM head decodes all {READER_LEN} positions of every reader row "
        f"into the {r['config'].bert.vocab_size}-word vocabulary; the loss needs the {MAX_MASKS - 1} masked ones) x "
        f"{throughput:.2f}x the port's throughput on the FLOPs each computes "
        f"({ours_gf / 1e9:.0f} vs {theirs_gf / 1e9:.0f} GFLOP/s).")
    if mm_ratio >= throughput:
      out.append(f"The throughput gap is the matmul library: {library}.")
    else:
      step_s = statistics.median(r["theirs_times"])
      opt_s = phases.get("optimizer", float("nan"))
      outside = throughput / mm_ratio
      share = (f"Part of the throughput gap is the matmul library ({library}); the rest, "
               f"{outside:.2f}x, is outside the matmuls." if mm_ratio >= 1 else
               f"The matmul library favours the port ({library}); ours gains {outside:.2f}x "
               "outside the matmuls.")
      out.append(
          f"{share} Measured there: the "
          f"port's clip + AdamW (torch's default{'' if on_gpu else ', per-tensor on CPU'}) "
          f"takes {opt_s:.2f}s of its {step_s:.2f}s step, where ours is fused into the "
          f"compiled step; not measured separately: the port's elementwise work (the tanh GELU "
          f"as separate ops, softmax, LayerNorm, the vocabulary-wide log-softmax) runs one "
          f"kernel at a time, XLA fuses it.")
  else:
    out.append(
        f"Train step: **ours is slower**, {train_ratio:.2f}x the port's examples/s, although "
        f"the port computes {extra:.2f}x our FLOPs; {library}.")
  if embed_ratio >= 1:
    out.append(
        f"Embedding (identical work: eval forward passes of the same tower): ours does "
        f"{embed_ratio:.2f}x the port's blocks/s; "
        + (f"the matmul library ({mm_ratio:.2f}x at the feed-forward shape) accounts for "
           f"{'all' if mm_ratio >= embed_ratio else 'most'} of it." if mm_ratio >= 0.9 * embed_ratio
           else f"the matmul library accounts for {mm_ratio:.2f}x of it, the rest is outside "
           f"the matmuls." if mm_ratio >= 1
           else f"the matmul library favours the port ({mm_ratio:.2f}x), so all of it, "
           f"{embed_ratio / mm_ratio:.2f}x, is gained outside the matmuls."))
  else:
    out.append(f"Embedding: **ours is slower**, {embed_ratio:.2f}x the port's blocks/s on "
               f"identical work.")
  if train_ratio < 1 or embed_ratio < 1:
    if mm_ratio < 1:
      # bfloat16 compute is the fix offered to a float32 run; a bfloat16 run has it already.
      mixed = getattr(r["args"], "dtype", "float32") != "float32"
      fix = (("a faster XLA GPU dot for these shapes (its GEMM autotuning; cuBLAS is "
              "faster here), not a change to the model" if mixed else
              "bfloat16 compute (`bert.dtype=\"bfloat16\"`), which runs on the tensor cores")
             if on_gpu else
             "XLA's oneDNN or XNNPACK dot paths for x86 (this jaxlib has "
             "`--xla_cpu_use_onednn` and `--xla_cpu_use_xnnpack`)"
             + ("" if mixed else ", or bfloat16 compute (`bert.dtype=\"bfloat16\"`) on a CPU "
                "with AVX512-BF16"))
      out.append(
          f"Why: the matmuls themselves ({library}); the model is matmul-bound, so that ratio "
          f"carries over. What would fix it: {fix}.")
    else:
      out.append(
          f"Why: not the matmul library ({library}), so the time is lost outside the matmuls "
          f"(elementwise work, layouts and copies in the compiled program); a `jax.profiler` "
          f"trace of the step shows which ops, and fusing or removing them is the fix.")
  return " ".join(out)


if __name__ == "__main__":
  sys.exit(main())
