"""RETRO's evaluation analyses of a trained run (Borgeaud et al. 2022): `evaluate_retro`.

A RETRO job's checkpoint (`realm_jax.jobs.retro`) is evaluated on its held-out sequences with
any number of neighbours per chunk: the next-token loss and bits per byte with retrieval and
without, split by token kind ("salient" entity or date spans, "other"), and RETRO's leakage
analysis (section 2.6): the loss over the chunks whose overlap with their own neighbours is at
most alpha. Design notes: docs/design/training_and_commands.md.

  python -m realm_jax.evaluation.retro RUN_DIR [--step N] [--num_neighbours K] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import sys
from typing import Any, Optional, Sequence, Union

import flax.linen as nn
import jax
import numpy as np

from realm_jax import checkpoints
from realm_jax.batches import retro as retro_batches
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import salient_spans
from realm_jax.data import vocab as vocab_lib
from realm_jax.index import chunks as chunks_lib
from realm_jax.models import retro as retro_model

# Written by RetroJob.start (realm_jax.jobs.retro.RETRO_CONFIG_FILE; jobs imports evaluation,
# not the reverse, so the name is repeated here and a test checks the two agree).
RETRO_CONFIG_FILE = "retro_config.json"
# retro_config.json's keys that are the run's, not RetroConfig fields.
RUN_KEYS = ("retrieval", "retrofit", "num_neighbours", "chunks_per_sequence", "chunk_database",
            "block_store", "exclude_own_document")
OVERLAP_THRESHOLDS = (0.125, 0.25, 0.5, 0.75, 1.0)
HISTOGRAM_BINS = 8  # r(C) in bins of 1/8

__all__ = ["RetroEvalError", "evaluate_retro", "read_run_config", "longest_common_substrings",
           "block_salient_marks", "chunk_salient_marks", "main"]


class RetroEvalError(ValueError):
  """A run, its data or an argument cannot be evaluated; the message names the file or run."""


# ------------------------------------------------------------------------------ the run


def read_run_config(run_dir: str) -> tuple[Any, dict]:
  """(RetroConfig, the run's keys of RUN_KEYS) from `<run_dir>/retro_config.json`."""
  path = os.path.join(run_dir, RETRO_CONFIG_FILE)
  try:
    with open(path, encoding="utf-8") as f:
      values = json.load(f)
  except FileNotFoundError:
    raise RetroEvalError(f"{path}: no such file; not a RETRO run directory (RetroJob.start "
                         f"writes it)") from None
  except (OSError, json.JSONDecodeError) as e:
    raise RetroEvalError(f"{path}: unreadable: {e}") from e
  if not isinstance(values, dict):
    raise RetroEvalError(f"{path}: expected a JSON object")
  run = {key: values.pop(key, None) for key in RUN_KEYS}
  try:
    config = retro_model.RetroConfig(**values)
  except (TypeError, ValueError) as e:
    raise RetroEvalError(f"{path}: not a RetroConfig: {e}") from e
  return config, run


def _restore(run_dir: str, step: Optional[int], config: Any) -> tuple[int, Any]:
  """(step, params["retro"]) of the run's checkpoint `step` (None: the newest)."""
  if step is None:
    step = checkpoints.latest_checkpoint_step(run_dir)
    if step is None:
      raise RetroEvalError(f"{checkpoints.checkpoints_dir(run_dir)}: no finished checkpoint")
  params, _, _ = checkpoints.restore_params(run_dir, int(step))
  if not isinstance(params, dict) or "retro" not in params:
    raise RetroEvalError(f"{checkpoints.checkpoint_path(run_dir, step)}: not a RETRO "
                         f"checkpoint (parameters {sorted(params)}, no 'retro')")
  params = params["retro"]
  shapes = lambda tree: jax.tree.map(lambda x: tuple(x.shape), tree)
  expected = jax.eval_shape(lambda: retro_model.init_params(config, jax.random.PRNGKey(0)))
  if shapes(nn.unbox(expected)) != shapes(params):
    raise RetroEvalError(f"{checkpoints.checkpoint_path(run_dir, step)}: the parameters do not "
                         f"have the shapes of {os.path.join(run_dir, RETRO_CONFIG_FILE)}'s "
                         f"RetroConfig")
  return int(step), params


def _open_block_store(block_store: Union[None, str, block_store_lib.BlockStore], run: dict,
                      database: Any, run_dir: str) -> tuple[block_store_lib.BlockStore, bool]:
  """(the BlockStore the database was built over, whether we opened it): `block_store`, else
  the run's recorded one, else the toy convention (`jobs.retro.toy_chunk_database` builds the
  database as `<store>-retro<m>`, next to its store)."""
  if isinstance(block_store, block_store_lib.BlockStore):
    store, opened = block_store, False
  else:
    path = block_store or run.get("block_store")
    if path is None:
      match = re.fullmatch(r"(.+)-retro\d+", os.path.normpath(database.path))
      if match and os.path.isdir(match.group(1)):
        path = match.group(1)
    if path is None:
      raise RetroEvalError(f"{run_dir}: the BlockStore that chunk database {database.path} was "
                           f"built over (store_id {database.block_store_id[:12]}...) is not "
                           f"recorded: pass block_store")
    try:
      store, opened = block_store_lib.BlockStore.open(path, verify="fast"), True
    except block_store_lib.BlockStoreError as e:
      raise RetroEvalError(f"{run_dir}: {e}") from e
  if store.store_id != database.block_store_id:
    if opened:
      store.close()
    raise RetroEvalError(f"BlockStore {store.path} (store_id {store.store_id[:12]}...) is not "
                         f"the one chunk database {database.path} was built over (store_id "
                         f"{database.block_store_id[:12]}...)")
  return store, opened


# ------------------------------------------------------------------------------ leakage


def longest_common_substrings(chunk_ids: np.ndarray, chunk_mask: np.ndarray,
                              neighbour_ids: np.ndarray, neighbour_mask: np.ndarray
                              ) -> np.ndarray:
  """Per chunk, the longest common contiguous token substring with any of its neighbours.

  Args:
    chunk_ids: [P, m] chunk tokens.
    chunk_mask: [P, m] nonzero on real tokens.
    neighbour_ids: [P, k, r] each chunk's neighbours (retrieved chunk + continuation).
    neighbour_mask: [P, k, r] nonzero on real neighbour tokens.

  Returns:
    [P] int64 lengths; padding matches nothing, so no common substring spans it.
  """
  a = np.where(np.asarray(chunk_mask) > 0, chunk_ids, -1).astype(np.int64)  # [P, m]
  b = np.where(np.asarray(neighbour_mask) > 0, neighbour_ids, -2).astype(np.int64)  # [P, k, r]
  num, length = a.shape
  # run[..., j + 1]: the common substring ending at a[:, i] and b[:, :, j] (dynamic
  # programming over i; run[..., 0] stays 0).
  run = np.zeros((num, b.shape[1], b.shape[2] + 1), np.int64)  # [P, k, r + 1]
  best = np.zeros(num, np.int64)  # [P]
  for i in range(length):
    equal = a[:, i, None, None] == b  # [P, k, r]
    run[..., 1:] = np.where(equal, run[..., :-1] + 1, 0)
    best = np.maximum(best, run.max(axis=(1, 2), initial=0))
  return best


# ------------------------------------------------------------------------------ token kinds


def block_salient_marks(store: block_store_lib.BlockStore, block_id: int,
                        annotator: salient_spans.Annotator,
                        vocab: vocab_lib.WordPieceVocabulary) -> np.ndarray:
  """[body_len] bool: the block's body wordpieces whose original text overlaps a salient span
  of its body text (the annotator's byte spans, the wordpieces' byte ranges from
  `tokenize_with_offsets`, which must give the stored body tokens)."""
  text = store.body(block_id)
  ids, starts, limits = vocab.tokenize_with_offsets(text)
  stored = store.body_tokens(block_id)  # [body_len]
  if not np.array_equal(np.asarray(ids, np.int64), stored.astype(np.int64)):
    differ = [i for i, (x, y) in enumerate(zip(ids, stored)) if x != y]
    where = differ[0] if differ else min(len(ids), stored.size)
    raise RetroEvalError(f"{store.path}: block {block_id}: its body text tokenizes to "
                         f"{len(ids)} wordpieces, not the {stored.size} stored ones (first "
                         f"difference at wordpiece {where}); the store was built with another "
                         f"tokenization, so salient spans cannot be placed on its tokens")
  spans = np.asarray(annotator.annotate(text), np.int64).reshape(-1, 2)  # [s, 2] bytes
  starts = np.asarray(starts, np.int64)[:, None]  # [body_len, 1]
  limits = np.asarray(limits, np.int64)[:, None]  # [body_len, 1]
  return ((starts < spans[None, :, 1]) & (spans[None, :, 0] < limits)).any(axis=1)


def chunk_salient_marks(database: Any, store: block_store_lib.BlockStore, chunk_ids: np.ndarray,
                        annotator: salient_spans.Annotator,
                        vocab: vocab_lib.WordPieceVocabulary) -> np.ndarray:
  """[..., m] bool salient marks of the chunks `chunk_ids` [...] of a chunk database built over
  `store`: a document's stream is its blocks' body wordpieces back to back
  (`chunks.document_stream`), its chunk j is stream[j m, j m + length); padding is False."""
  m = database.chunk_len
  flat = np.asarray(chunk_ids, np.int64).reshape(-1)  # [N]
  db_docs = np.asarray(database.doc_ids)  # [C]
  store_docs = np.asarray(store.doc_ids)  # [num_blocks]
  out = np.zeros((flat.size, m), bool)  # [N, m]
  documents: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}
  for row, chunk in enumerate(flat.tolist()):
    doc = int(db_docs[chunk])
    if doc not in documents:
      first_block, end_block = np.searchsorted(store_docs, doc, "left"), np.searchsorted(
          store_docs, doc, "right")
      if first_block == end_block:
        raise RetroEvalError(f"{store.path}: no block of document {doc} (chunk {chunk} of "
                             f"{database.path})")
      blocks = range(int(first_block), int(end_block))
      tokens = np.concatenate([store.body_tokens(b) for b in blocks])  # [L]
      marks = np.concatenate([block_salient_marks(store, b, annotator, vocab)
                              for b in blocks])  # [L]
      documents[doc] = (tokens, marks, database.document_chunks(doc)[0])
    tokens, marks, first_chunk = documents[doc]
    start = (chunk - first_chunk) * m
    length = int(database.chunk_lengths[chunk])
    if not np.array_equal(tokens[start:start + length],
                          np.asarray(database.chunk_tokens[chunk][:length], tokens.dtype)):
      raise RetroEvalError(f"{database.path}: chunk {chunk} is not wordpieces {start}.."
                           f"{start + length} of document {doc} in {store.path}")
    out[row, :length] = marks[start:start + length]
  return out.reshape(*np.shape(chunk_ids), m)


# ------------------------------------------------------------------------------ losses


@functools.lru_cache(maxsize=4)
def _loss_function(config: Any) -> Any:
  """jitted (params, input_ids [B, n], neighbour_ids [B, l, k, r] or None, neighbour_mask)
  -> [B, n - 1] next-token losses, as `RetroLanguageModel.eval_fn` computes them."""
  model = retro_model.RetroModel(config)

  def losses(params, input_ids, neighbour_ids, neighbour_mask):
    logits = model.apply({"params": params}, input_ids, neighbour_ids, neighbour_mask,
                         deterministic=True)  # [B, n, V]
    return retro_model.next_token_losses(logits, input_ids)  # [B, n - 1]

  return jax.jit(losses)


def _metrics(nats: float, tokens: int, num_bytes: float) -> Optional[dict]:
  """{"loss": nats per token, "bits_per_byte"}; None over no token."""
  if tokens <= 0:
    return None
  return {"loss": float(nats / tokens),
          "bits_per_byte": float(nats / math.log(2) / num_bytes) if num_bytes > 0 else None}


def _check_int(name: str, value: Any, low: int) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
    raise RetroEvalError(f"evaluate_retro: {name}={value!r}, expected an integer >= {low}")
  return int(value)


# ------------------------------------------------------------------------------ evaluation


def evaluate_retro(run_dir: str, *, step: Optional[int] = None,
                   num_neighbours: Optional[int] = None, max_sequences: int = 256,
                   overlap_thresholds: Sequence[float] = OVERLAP_THRESHOLDS,
                   annotator: Union[str, salient_spans.Annotator] = "union",
                   block_store: Union[None, str, block_store_lib.BlockStore] = None,
                   batch_size: int = 16) -> dict:
  """RETRO's evaluation of a run's checkpoint on its held-out sequences (module docstring).

  r(C) of an evaluation chunk C is its longest common token substring with any of its own
  neighbours, over its real length; `by_overlap` keeps, per alpha, the chunks with r(C) <= alpha
  and their target tokens (alpha = 1 keeps all). A baseline run is filtered by the same chunks.

  Args:
    step, num_neighbours: None: the newest checkpoint, the run's k.
    overlap_thresholds: the alphas of `by_overlap`, each in [0, 1].
    annotator: a salient-span annotator (`salient_spans.ANNOTATORS` name or instance).
    block_store: the BlockStore the chunk database was built over; None: the run's recorded one.

  Returns a JSON-ready dict (totals, by_kind, by_overlap, overlap_histogram). Raises
  RetroEvalError (a bad argument, run or data) or checkpoints.CheckpointError.
  """
  run_dir = os.fspath(run_dir)
  max_sequences = _check_int("max_sequences", max_sequences, 1)
  batch_size = _check_int("batch_size", batch_size, 1)
  thresholds = [float(a) for a in overlap_thresholds]
  if not thresholds or any(not 0.0 <= a <= 1.0 for a in thresholds):
    raise RetroEvalError(f"evaluate_retro: overlap_thresholds={list(overlap_thresholds)!r}, "
                         f"expected values in [0, 1]")
  if isinstance(annotator, str):
    annotator = salient_spans.get_annotator(annotator)

  config, run = read_run_config(run_dir)
  retrieval = bool(run["retrieval"]) if run["retrieval"] is not None else True
  k = _check_int("num_neighbours", run["num_neighbours"] if num_neighbours is None
                 else num_neighbours, 1)
  if run["chunk_database"] is None or run["chunks_per_sequence"] is None:
    raise RetroEvalError(f"{os.path.join(run_dir, RETRO_CONFIG_FILE)}: no chunk_database or "
                         f"chunks_per_sequence (written by an older RetroJob); add them")
  try:
    database = chunks_lib.ChunkDatabase.open(run["chunk_database"], verify="fast")
  except chunks_lib.ChunkDatabaseError as e:
    raise RetroEvalError(f"{run_dir}: {e}") from e
  if database.chunk_len != config.chunk_size:
    raise RetroEvalError(f"{run_dir}: chunk database {database.path} has chunks of "
                         f"{database.chunk_len} tokens, the model's chunk_size is "
                         f"{config.chunk_size}")
  vocab = vocab_lib.default_vocabulary()
  if database.manifest.get("vocab_fingerprint") != vocab.fingerprint:
    raise RetroEvalError(f"{database.path}: built with another vocabulary than the default "
                         f"one the job's bits per byte use")
  step, params = _restore(run_dir, step, config)
  store, opened = _open_block_store(block_store, run, database, run_dir)
  try:
    # Neighbours also for a baseline: its filtered evaluation keeps the same chunks.
    batches = retro_batches.RetroBatches(
        database, batch_size=batch_size, chunks_per_sequence=int(run["chunks_per_sequence"]),
        num_neighbours=k, retrieval=True, split="heldout", shuffle=False,
        max_sequences=max_sequences, vocab=vocab, process_index=0, process_count=1,
        # As the run retrieved (False only for the positive control; older runs kept the rule).
        exclude_own_document=run.get("exclude_own_document") is not False)
    salient_chunks = chunk_salient_marks(database, store, batches.chunk_ids, annotator,
                                         vocab)  # [S, l, m]
  finally:
    if opened:
      store.close()
  num = batches.num_sequences
  chunks_per_sequence, m = batches.chunks_per_sequence, database.chunk_len
  n = chunks_per_sequence * m

  losses_fn = _loss_function(config)
  params = jax.device_put(params)
  parts: dict[str, list[np.ndarray]] = {key: [] for key in (
      "input_ids", "input_mask", "neighbour_ids", "neighbour_mask", "retrieval",
      "no_retrieval")}
  # Fixed shapes (one compile per mode): the last batch is padded with masked filler rows,
  # dropped below.
  for first, batch in zip(range(0, num, batch_size), batches.fixed_batches(batch_size)):
    rows = min(batch_size, num - first)
    for key in ("input_ids", "input_mask", "neighbour_ids", "neighbour_mask"):
      parts[key].append(batch[key][:rows])
    if retrieval:
      parts["retrieval"].append(np.asarray(losses_fn(
          params, batch["input_ids"], batch["neighbour_ids"], batch["neighbour_mask"]))[:rows])
    parts["no_retrieval"].append(np.asarray(losses_fn(params, batch["input_ids"], None,
                                                      None))[:rows])
  data = {key: np.concatenate(value) for key, value in parts.items() if value}
  input_ids, input_mask = data["input_ids"], data["input_mask"]  # [S, n]
  weights = input_mask[:, 1:] > 0  # [S, n - 1] real targets
  token_bytes = retro_batches.target_token_bytes(input_ids, input_mask, vocab)  # [S, n - 1]
  salient = salient_chunks.reshape(num, n)[:, 1:] & weights  # [S, n - 1]
  losses = {mode: data[mode].astype(np.float64) for mode in ("retrieval", "no_retrieval")
            if mode in data}  # [S, n - 1] each

  def summary(keep: np.ndarray) -> dict:
    """tokens, bytes and both modes' metrics over the real targets where `keep` [S, n - 1]."""
    keep = keep & weights
    tokens, num_bytes = int(keep.sum()), float(token_bytes[keep].sum())
    out = {"tokens": tokens, "bytes": num_bytes}
    for mode in ("retrieval", "no_retrieval"):
      out[mode] = (_metrics(float(losses[mode][keep].sum()), tokens, num_bytes)
                   if mode in losses else None)
    return out

  # Leakage: r(C) per chunk, exact in integers (longest / length).
  chunk_mask = input_mask.reshape(num * chunks_per_sequence, m)  # [S l, m]
  lengths = chunk_mask.sum(axis=1)  # [S l]
  longest = longest_common_substrings(
      input_ids.reshape(-1, m), chunk_mask,
      data["neighbour_ids"].reshape(num * chunks_per_sequence, k, -1),
      data["neighbour_mask"].reshape(num * chunks_per_sequence, k, -1))  # [S l]
  real_chunk = lengths > 0  # [S l]
  # [n - 1] the chunk of the position each target predicts.
  target_chunk = np.arange(1, n) // m
  by_overlap = []
  for alpha in thresholds:
    kept = real_chunk & (longest <= alpha * lengths + 1e-9)  # [S l]
    keep = kept.reshape(num, chunks_per_sequence)[:, target_chunk]  # [S, n - 1]
    by_overlap.append({"max_overlap": alpha, "chunks": int(kept.sum()), **summary(keep)})
  # Bin i (0-based) holds i/B < r <= (i + 1)/B, i.e. ceil(B r) - 1, computed in integers.
  bins = np.maximum((HISTOGRAM_BINS * longest + lengths - 1) // np.maximum(lengths, 1) - 1, 0)
  counts = np.bincount(bins[real_chunk], minlength=HISTOGRAM_BINS)

  total = summary(np.ones_like(weights))
  kinds = {"salient": summary(salient), "other": summary(~salient)}
  for kind in kinds.values():
    kind["share"] = kind["tokens"] / total["tokens"] if total["tokens"] else None
  return {
      "run_dir": run_dir,
      "step": step,
      "sequences": num,
      "num_neighbours": k,
      "chunks": int(real_chunk.sum()),
      "target_tokens": total["tokens"],
      "target_bytes": total["bytes"],
      "retrieval": total["retrieval"],
      "no_retrieval": total["no_retrieval"],
      "by_kind": kinds,
      "by_overlap": by_overlap,
      "overlap_histogram": {"edges": [i / HISTOGRAM_BINS for i in range(HISTOGRAM_BINS + 1)],
                            "counts": [int(c) for c in counts]},
      "annotator": getattr(annotator, "name", type(annotator).__name__),
  }


# ------------------------------------------------------------------------------ command line


def main(argv: Optional[Sequence[str]] = None) -> int:
  """`python -m realm_jax.evaluation.retro RUN_DIR ...`: prints evaluate_retro's JSON."""
  parser = argparse.ArgumentParser(
      prog="python -m realm_jax.evaluation.retro",
      description="RETRO's evaluation of a RETRO run's checkpoint on its held-out sequences: "
      "loss and bits per byte with and without retrieval, by token kind (salient spans or "
      "other) and over the chunks whose overlap with their neighbours is at most each "
      "threshold (RETRO's leakage-filtered evaluation). Prints the result as JSON.")
  parser.add_argument("run_dir", help="the run directory (retro_config.json, checkpoints/)")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
  parser.add_argument("--num_neighbours", type=int, default=None,
                      help="neighbours per chunk (default: the run's)")
  parser.add_argument("--max_sequences", type=int, default=256,
                      help="held-out sequences evaluated (default: %(default)s)")
  parser.add_argument("--thresholds", type=float, nargs="+", default=list(OVERLAP_THRESHOLDS),
                      help="overlap thresholds alpha in [0, 1] (default: %(default)s)")
  parser.add_argument("--annotator", default="union",
                      help=f"salient-span annotator, one of {sorted(salient_spans.ANNOTATORS)} "
                      f"(default: %(default)s)")
  parser.add_argument("--block_store", default=None,
                      help="the BlockStore the chunk database was built over (default: the "
                      "run's recorded one; the toy world's for the toy database)")
  parser.add_argument("--batch_size", type=int, default=16,
                      help="sequences per forward pass (default: %(default)s)")
  parser.add_argument("--out", default=None, help="also write the JSON to this file")
  args = parser.parse_args(argv)
  try:
    result = evaluate_retro(args.run_dir, step=args.step, num_neighbours=args.num_neighbours,
                            max_sequences=args.max_sequences,
                            overlap_thresholds=args.thresholds, annotator=args.annotator,
                            block_store=args.block_store, batch_size=args.batch_size)
  except (RetroEvalError, checkpoints.CheckpointError, ValueError, ImportError) as e:
    print(f"evaluate_retro: error: {e}", file=sys.stderr)
    return 2
  text = json.dumps(result, indent=2)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      f.write(text + "\n")
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
