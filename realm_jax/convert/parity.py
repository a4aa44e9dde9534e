"""Numerical parity of our models against the transformers REALM port (random weights).

For a named size, builds each transformers REALM class (embedder, scorer, encoder, reader) with
random, perturbed weights, imports it with `realm_jax.convert.hf.load_checkpoint`, runs both on
the same random inputs and reports the largest absolute differences.

Run `python -m realm_jax.convert.parity --size tiny --size base` to print the table; the tests
in tests/convert/test_parity.py assert every difference is within 1e-4. Needs the test extra
(torch and transformers==4.46.3).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from realm_jax.convert import hf as hf_convert
from realm_jax.models import losses
from realm_jax.models.reader import (RealmKnowledgeAugEncoder, RealmReader, predict_span,
                                     span_correctness)
from realm_jax.models.retriever import RealmEmbedder, RealmRetriever

SIZES = {
    # name: (transformers RealmConfig kwargs, input shapes)
    "tiny": (dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, retriever_proj_size=16, span_hidden_size=16),
             dict(batch=2, candidates=3, query_len=12, block_len=16, reader_len=24, beam=3,
                  masks=4)),
    # BERT-base shapes (12 layers, hidden 768, vocab 30522), one forward pass each.
    "base": (dict(),
             dict(batch=1, candidates=2, query_len=16, block_len=24, reader_len=32, beam=2,
                  masks=3)),
}


@dataclasses.dataclass
class ParityResult:
  size: str
  max_abs_diff: dict[str, float]      # quantity -> max |ours - transformers|
  predictions_equal: bool             # reader (block, start, end) identical
  seconds: float


def _torch():
  import torch
  return torch


def _hf_config(size: str, **extra):
  import transformers
  model_kwargs, _ = SIZES[size]
  return transformers.RealmConfig(**model_kwargs, **extra)


def _randomize(model, seed: int) -> None:
  """Perturbs every parameter so biases and LayerNorms are not at their 0/1 init."""
  torch = _torch()
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=generator)
      if "LayerNorm.weight" in name or "layer_normalization.weight" in name:
        p.copy_(1.0 + 0.1 * noise)
      elif name.endswith("bias"):
        p.copy_(0.05 * noise)
      else:
        p.copy_(0.05 * noise)
  model.eval()


def _save(model, directory: str, safe_serialization: bool = True) -> str:
  model.save_pretrained(directory, safe_serialization=safe_serialization)
  return directory


def _sequences(rng: np.random.Generator, shape: tuple[int, ...], length: int, vocab: int):
  """Random ids with trailing padding (at least 4 real tokens) and two segments."""
  ids = rng.integers(1, vocab, (*shape, length))
  lengths = rng.integers(max(4, length // 2), length + 1, shape)
  lengths.reshape(-1)[0] = length  # one row without padding
  positions = np.arange(length)
  mask = positions < lengths[..., None]
  split = (lengths // 2)[..., None]
  types = ((positions >= split) & mask).astype(np.int64)
  ids = np.where(mask, ids, 0)
  return ids.astype(np.int64), types, mask.astype(np.int64)


def _max_diff(a, b) -> float:
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def embedder_parity(size: str, workdir: str, seed: int = 0) -> dict[str, float]:
  """RealmEmbedder projected embeddings; checkpoint read from model.safetensors."""
  import transformers
  torch = _torch()
  hf_cfg = _hf_config(size)
  model = transformers.RealmEmbedder(hf_cfg)
  _randomize(model, seed)
  config, params, _ = hf_convert.load_checkpoint(_save(model, os.path.join(workdir, "emb")))
  shapes = SIZES[size][1]
  ids, types, mask = _sequences(np.random.default_rng(seed), (shapes["batch"] + 1,),
                                shapes["block_len"], hf_cfg.vocab_size)
  with torch.no_grad():
    expected = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                     token_type_ids=torch.tensor(types)).projected_score.numpy()
  ours = RealmEmbedder(config).apply({"params": params}, ids, types, mask)
  return {"embedder/projected": _max_diff(ours, expected)}


def scorer_parity(size: str, workdir: str, seed: int = 1) -> dict[str, float]:
  """RealmScorer relevance scores, tied towers (pytorch_model.bin) and untied (safetensors)."""
  import transformers
  torch = _torch()
  shapes = SIZES[size][1]
  hf_cfg = _hf_config(size, num_candidates=shapes["candidates"])
  rng = np.random.default_rng(seed)
  q_ids, q_types, q_mask = _sequences(rng, (shapes["batch"],), shapes["query_len"],
                                      hf_cfg.vocab_size)
  c_ids, c_types, c_mask = _sequences(rng, (shapes["batch"], shapes["candidates"]),
                                      shapes["block_len"], hf_cfg.vocab_size)
  results = {}
  for tied in (True, False):
    query_embedder = None if tied else transformers.RealmEmbedder(hf_cfg)
    model = transformers.RealmScorer(hf_cfg, query_embedder=query_embedder)
    _randomize(model, seed + int(tied))
    # The port cannot write a tied scorer as safetensors (shared tensors), so the tied one
    # goes through pytorch_model.bin, which also exercises that reader.
    directory = _save(model, os.path.join(workdir, f"scorer_{tied}"),
                      safe_serialization=not tied)
    config, params, _ = hf_convert.load_checkpoint(directory)
    if config.share_embedders != tied:
      raise AssertionError(f"tied={tied} checkpoint imported with "
                           f"share_embedders={config.share_embedders}")
    with torch.no_grad():
      expected = model(
          input_ids=torch.tensor(q_ids), attention_mask=torch.tensor(q_mask),
          token_type_ids=torch.tensor(q_types), candidate_input_ids=torch.tensor(c_ids),
          candidate_attention_mask=torch.tensor(c_mask),
          candidate_token_type_ids=torch.tensor(c_types)).relevance_score.numpy()
    scores, _, _ = RealmRetriever(config).apply(
        {"params": params}, q_ids, q_types, q_mask, c_ids, c_types, c_mask)
    results[f"scorer/relevance_{'tied' if tied else 'untied'}"] = _max_diff(scores, expected)
  return results


def encoder_parity(size: str, workdir: str, seed: int = 2) -> dict[str, float]:
  """RealmKnowledgeAugEncoder logits at mask positions and the marginal MLM loss."""
  import transformers
  torch = _torch()
  shapes = SIZES[size][1]
  batch, num_candidates, masks = shapes["batch"], shapes["candidates"], shapes["masks"]
  hf_cfg = _hf_config(size, num_candidates=num_candidates)
  model = transformers.RealmKnowledgeAugEncoder(hf_cfg)
  _randomize(model, seed)
  config, params, _ = hf_convert.load_checkpoint(_save(model, os.path.join(workdir, "enc")))
  rng = np.random.default_rng(seed)
  length = shapes["reader_len"]
  ids, types, mask = _sequences(rng, (batch, num_candidates), length, hf_cfg.vocab_size)
  # Mask positions inside the query part; the last slot of every row is padding
  # (position 0, target 0, weight 0), as the data pipeline pads them.
  positions = np.zeros((batch, masks), np.int64)
  targets = np.zeros((batch, masks), np.int64)
  weights = np.zeros((batch, masks), np.float32)
  for b in range(batch):
    positions[b, :masks - 1] = rng.choice(np.arange(1, 4 + masks), masks - 1, replace=False)
    targets[b, :masks - 1] = rng.integers(0, hf_cfg.vocab_size, masks - 1)
    weights[b, :masks - 1] = 1.0
  relevance = rng.normal(size=(batch, num_candidates)).astype(np.float32)
  labels = np.full((batch, length), -100, np.int64)
  mlm_mask = np.zeros((batch, length), np.int64)
  for b in range(batch):
    for j in range(masks - 1):
      labels[b, positions[b, j]] = targets[b, j]
      mlm_mask[b, positions[b, j]] = 1
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                token_type_ids=torch.tensor(types), relevance_score=torch.tensor(relevance),
                labels=torch.tensor(labels), mlm_mask=torch.tensor(mlm_mask))
  # [batch, candidates, length, vocab] -> [batch, candidates, masks, vocab]
  hf_logits = out.logits.numpy().reshape(batch, num_candidates, length, -1)
  hf_at_masks = np.take_along_axis(hf_logits, positions[:, None, :, None], axis=2)
  logits = RealmKnowledgeAugEncoder(config).apply(
      {"params": params}, ids, types, mask, positions)
  token_log_probs = losses.mlm_token_log_probs(logits, targets)
  loss, _ = losses.marginal_mlm_loss(relevance, token_log_probs, weights)
  valid = weights.astype(bool)
  return {
      "encoder/logits_at_masks": _max_diff(np.asarray(logits)[valid[:, None, :].repeat(
          num_candidates, 1)], hf_at_masks[valid[:, None, :].repeat(num_candidates, 1)]),
      "encoder/marginal_loss": _max_diff(loss, out.loss.numpy()),
  }


def reader_parity(size: str, workdir: str, seed: int = 3) -> tuple[dict[str, float], bool]:
  """RealmReader span logits, ORQA losses and the predicted (block, start, end)."""
  import transformers
  torch = _torch()
  shapes = SIZES[size][1]
  beam, length = shapes["beam"], shapes["reader_len"]
  hf_cfg = _hf_config(size, reader_beam_size=beam)
  model = transformers.RealmReader(hf_cfg)
  _randomize(model, seed)
  # The port cannot write RealmReader as safetensors (its unused MLM head shares a bias).
  config, params, _ = hf_convert.load_checkpoint(
      _save(model, os.path.join(workdir, "reader"), safe_serialization=False))
  rng = np.random.default_rng(seed)
  ids, types, mask = _sequences(rng, (beam,), length, hf_cfg.vocab_size)
  # Block tokens: segment 1, except the final [SEP] of each row.
  block_mask = types.astype(bool)
  for b in range(beam):
    block_mask[b, np.flatnonzero(mask[b])[-1]] = False
  relevance = rng.normal(size=(beam,)).astype(np.float32)
  has_answers = np.zeros((beam,), bool)
  has_answers[0] = True
  starts_gold = np.full((beam, 2), -1, np.int64)
  ends_gold = np.full((beam, 2), -1, np.int64)
  first_block = np.flatnonzero(block_mask[0])[0]
  starts_gold[0] = [first_block, first_block + 1]
  ends_gold[0] = [first_block + 1, first_block + 3]

  captured = {}

  def capture(module, inputs, output):  # returns None so the output is left as it is
    captured["logits"] = output[0].clone()

  hook = model.qa_outputs.register_forward_hook(capture)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                token_type_ids=torch.tensor(types), relevance_score=torch.tensor(relevance),
                block_mask=torch.tensor(block_mask), start_positions=torch.tensor(starts_gold),
                end_positions=torch.tensor(ends_gold), has_answers=torch.tensor(has_answers))
  hook.remove()
  # The port adds the retrieval score after its projection returns.
  hf_logits = captured["logits"].numpy() + relevance[:, None]

  logits, starts, ends = RealmReader(config).apply(
      {"params": params}, ids, types, mask, block_mask, relevance)
  logits = np.asarray(logits)
  valid = block_mask[:, np.asarray(starts)] & block_mask[:, np.asarray(ends)]
  if np.any(logits[~valid] > -1000):
    raise AssertionError("an invalid span kept a competitive logit")
  reader_correct = span_correctness(starts, ends, starts_gold, ends_gold)
  retriever_loss = losses.marginal_log_loss(relevance, has_answers)
  reader_loss = losses.marginal_log_loss(logits.reshape(-1), np.asarray(reader_correct)
                                         .reshape(-1))
  block, start, end = predict_span(logits, starts, ends)
  predictions_equal = (int(block), int(start), int(end)) == (
      int(out.block_idx), int(out.start_pos), int(out.end_pos))
  return {
      "reader/span_logits": _max_diff(logits[valid], hf_logits[valid]),
      "reader/retriever_loss": _max_diff(retriever_loss, out.retriever_loss.numpy()),
      "reader/reader_loss": _max_diff(reader_loss, out.reader_loss.numpy()),
  }, predictions_equal


def run(size: str) -> ParityResult:
  """All comparisons for one size, in a temporary directory."""
  if size not in SIZES:
    raise ValueError(f"size={size!r}; expected one of {sorted(SIZES)}.")
  start = time.time()
  diffs: dict[str, float] = {}
  with tempfile.TemporaryDirectory() as workdir:
    diffs.update(embedder_parity(size, workdir))
    diffs.update(scorer_parity(size, workdir))
    diffs.update(encoder_parity(size, workdir))
    reader_diffs, predictions_equal = reader_parity(size, workdir)
    diffs.update(reader_diffs)
  return ParityResult(size, diffs, predictions_equal, time.time() - start)


def markdown(results: list[ParityResult]) -> str:
  """A table of the maxima, one column per size."""
  names = list(results[0].max_abs_diff)
  lines = ["| quantity | " + " | ".join(r.size for r in results) + " |",
           "|---|" + "---|" * len(results)]
  for name in names:
    lines.append(f"| {name} | " + " | ".join(f"{r.max_abs_diff[name]:.2e}" for r in results)
                 + " |")
  lines.append("| reader/predicted (block, start, end) equal | " + " | ".join(
      "yes" if r.predictions_equal else "**no**" for r in results) + " |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--size", action="append", choices=sorted(SIZES),
                      help="model size(s) to compare (default: tiny)")
  parser.add_argument("--tolerance", type=float, default=1e-4)
  args = parser.parse_args(argv)
  from realm_jax import gin_utils  # pylint: disable=g-import-not-at-top

  def compare() -> int:
    sizes = args.size or ["tiny"]
    results = []
    for size in sizes:
      print(f"[parity] {size}: building transformers models, importing, comparing ...",
            flush=True)
      results.append(run(size))
      print(f"[parity] {size}: done in {results[-1].seconds:.1f}s", flush=True)
    print(f"\nmax |realm_jax - transformers {_transformers_version()}| (float32, random "
          f"weights; jax {jax.__version__}, torch {_torch().__version__}, "
          f"{platform.processor() or platform.machine()})\n")
    print(markdown(results))
    worst = max(max(r.max_abs_diff.values()) for r in results)
    ok = worst <= args.tolerance and all(r.predictions_equal for r in results)
    print(f"\n{'PASS' if ok else 'FAIL'}: worst difference {worst:.2e} "
          f"(tolerance {args.tolerance:.0e})")
    return 0 if ok else 1

  # Nothing is expected to fail: any error (e.g. no torch) keeps its traceback in the log.
  return gin_utils.run_command("parity", compare, interrupted="nothing was written",
                               expected=())


def _transformers_version() -> str:
  import transformers
  return transformers.__version__


if __name__ == "__main__":
  from realm_jax import gin_utils  # pylint: disable=g-import-not-at-top
  gin_utils.exit_process(main(), "parity")
