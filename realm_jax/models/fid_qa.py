"""Generative open-QA fine-tuning with the Fusion-in-Decoder reader (`models.fid`): the
`FinetuneJob(reader='fid')` model, Atlas's reader (Izacard et al. 2022) over this project's
retrieval.

`FidReaderModel` is the trainer's model interface (`models.realm`: init / logical_axes /
loss_fn / eval_fn / summarize, plus the predictor's `embed_questions` / `predict_batch` /
`answer_texts`) over the batches of `realm_jax.batches.fid` (`build_fid_batch`):

* **Retrieval**: as the extractive job (`models.open_qa`): the question tower searches the run's
  frozen index for the top `retriever_beam` blocks, the reader reads the first `reader_beam`
  (K). The retriever is NOT trained here: the FiD loss has no path to the retrieval scores, the
  optimizer leaves `params["retriever"]` exactly as it was warm-started (`trainable_mask`), and
  Atlas's retriever objectives with this reader (ADist from the decoder's cross-attention,
  EMDR^2, PDist, LOOP) are future work (`FinetuneJob` refuses `retriever_objective` other than
  "marginal", `train_document_tower` and `peft` with `reader='fid'`).
* **Reader rows**: one per read block, `[CLS] question [SEP] body [SEP]` with type ids 0 / 1,
  exactly the extractive reader's rows (`batches.open_qa.build_open_qa_batch`): the FiD encoder
  reads each on its own, the decoder reads all K at once (`models.fid`).
* **Targets**: ONE answer per question: the first of the question's answers (in the task's
  order) whose wordpieces plus EOS fit `FidConfig.max_answer_length` (`batches.fid.
  answer_targets`); a question none of whose answers fits counts no token (its loss is 0).
* **Loss**: `fid.answer_loss`, the teacher-forced token cross entropy over the counted tokens of
  the batch (answer and EOS), in nats per token (`loss_sum / weight_sum`, exact under
  microbatches).
* **Prediction**: greedy decoding (`fid.greedy_decode`, at most `max_answer_length` tokens),
  detokenised with the project's WordPiece vocabulary (`detokenize`); EM is then ORQA's
  `metrics.exact_match` on the text, as for the extractive reader.

Parameters: `{"retriever": RealmRetriever params, "fid": FidModel params}` (the checkpoints'
RealmConfig is the run's model config, the retriever's; the FidConfig is written beside the run,
`<run_dir>/fid_config.json`, for `python -m realm_jax.evaluate`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from realm_jax import fileio
from realm_jax.data import vocab as vocab_lib
from realm_jax.models import fid as fid_lib
from realm_jax.models.config import BertConfig, RealmConfig
from realm_jax.models.realm import ParamsFromBoxedInit, dropout_rngs, init_retriever_params
from realm_jax.models.retriever import RealmRetriever, relevance_scores

Array = jax.Array
Params = Any
Batch = dict[str, Any]

__all__ = ["FID_CONFIG_FILE", "FidReaderModel", "detokenize", "fid_config_from_dict",
           "fid_config_to_dict", "read_fid_config", "summarize", "trainable_mask",
           "write_fid_config"]

FID_CONFIG_FILE = "fid_config.json"

# Wordpiece detokenisation: BERT's basic tokenizer splits punctuation off words, so "O'Brien"
# comes back as "o ' brien" and "Jean-Luc" as "jean - luc"; ORQA's normalisation drops the
# punctuation but keeps the spaces, so those would miss. Glued back as HF's
# `clean_up_tokenization` does (plus hyphens and slashes inside words, decimal points and
# thousands separators inside numbers: "3 . 5" -> "3.5", "1 , 000" -> "1,000", but "24 , 1811"
# -> "24, 1811").
_CLEANUPS = ((re.compile(r"(\d) \. (\d)"), r"\1.\2"), (re.compile(r"(\d) , (\d{3})\b"), r"\1,\2"),
             (re.compile(r" ([.,!?;:%)\]])"), r"\1"), (re.compile(r"([(\[$]) "), r"\1"),
             (re.compile(r" ' "), "'"), (re.compile(r" (n't|'s|'m|'re|'ve|'ll|'d)\b"), r"\1"),
             (re.compile(r"(\w) ([-/]) (\w)"), r"\1\2\3"))


def detokenize(ids: Sequence[int], vocab: vocab_lib.WordPieceVocabulary, *,
               eos_id: int = vocab_lib.SEP_ID) -> str:
  """Generated wordpiece ids -> answer text: cut at the first EOS, [PAD] and [CLS] dropped,
  `##` continuations glued (`WordPieceVocabulary.decode`), then the spaces the basic tokenizer
  put around punctuation removed where the original text had none (`_CLEANUPS`)."""
  ids = [int(i) for i in ids]
  if eos_id in ids:
    ids = ids[:ids.index(eos_id)]
  text = vocab.decode([i for i in ids if i not in (vocab_lib.PAD_ID, vocab_lib.CLS_ID)])
  for pattern, replacement in _CLEANUPS:
    text = pattern.sub(replacement, text)
  return text.strip()


def trainable_mask(params: Params) -> Params:
  """The optimizer's `trainable`: the FiD reader trains, the retriever stays as it is."""
  return {key: jax.tree.map(lambda _, on=key != "retriever": on, tree)
          for key, tree in params.items()}


# ------------------------------------------------------------------ the FidConfig on disk


def fid_config_to_dict(config: fid_lib.FidConfig) -> dict:
  """The FidConfig as JSON-able settings; the encoder's BertConfig included (`bert`)."""
  return dataclasses.asdict(config)


def fid_config_from_dict(settings: dict, bert: BertConfig | None = None) -> fid_lib.FidConfig:
  """The FidConfig of `fid_config_to_dict`; `bert` (e.g. the checkpoint's model config's)
  replaces the stored encoder config when given."""
  settings = dict(settings)
  stored = settings.pop("bert", None)
  if bert is None:
    if stored is None:
      raise ValueError("the FiD settings hold no encoder config ('bert') and none was given")
    fields = {f.name for f in dataclasses.fields(BertConfig)}
    bert = BertConfig(**{k: (tuple(v) if isinstance(v, list) else v)
                         for k, v in stored.items() if k in fields})
  return fid_lib.FidConfig(bert=bert, **settings)


def write_fid_config(run_dir: str, config: fid_lib.FidConfig, **extra: Any) -> str:
  """`<run_dir>/fid_config.json` (atomically): the reader's FidConfig and `extra` settings."""
  path = os.path.join(run_dir, FID_CONFIG_FILE)
  fileio.write_json_atomically(path, {"fid": fid_config_to_dict(config), **extra})
  return path


def read_fid_config(run_dir: str, bert: BertConfig | None = None) -> fid_lib.FidConfig:
  """The FidConfig a `reader='fid'` fine-tuning run wrote; FileNotFoundError without one."""
  with open(os.path.join(run_dir, FID_CONFIG_FILE), encoding="utf-8") as f:
    return fid_config_from_dict(json.load(f)["fid"], bert)


# ------------------------------------------------------------------------------ the model


@dataclasses.dataclass(frozen=True)
class FidReaderModel(ParamsFromBoxedInit):
  """Question tower + FiD reader over a frozen index (module docstring).

  Batch (`batches.fid.build_fid_batch`, `fid_model_inputs`): reader_ids, reader_type_ids,
  reader_mask [Q, reader_beam, reader_len]; answer_targets, answer_mask [Q, T] (T <=
  max_answer_length); retriever_correct [Q, beam]; example_mask [Q].

  Attributes:
    config: the run's RealmConfig (the question tower's; the checkpoints record it).
    fid: the reader's FidConfig (its `bert` is the encoder, warm-started from a BERT).
    reader_beam: blocks the reader reads (K).
  """

  config: RealmConfig
  fid: fid_lib.FidConfig
  reader_beam: int = 5

  # What the batch source and the predictor ask every open-QA model.
  train_document_tower = False
  num_reembedded = 0
  generative = True
  # What `predict_batch` reads (the predictor passes only these: the other arrays of a
  # `build_open_qa_batch` change width from batch to batch, which would recompile the decoding).
  prediction_keys = ("reader_ids", "reader_type_ids", "reader_mask", "retrieved_block_ids",
                     "retrieved_block_emb", "question_emb")

  def __post_init__(self):
    if self.reader_beam < 1:
      raise ValueError(f"reader_beam must be positive, got {self.reader_beam}")

  def _boxed_init(self, rng: Array) -> Params:
    retriever_rng, fid_rng = jax.random.split(rng)
    return {"retriever": init_retriever_params(self.config, retriever_rng),
            "fid": fid_lib.init_params(self.fid, fid_rng)}

  def _check_rows(self, batch: Batch) -> None:
    if batch["reader_ids"].shape[1] != self.reader_beam:
      raise ValueError(f"the batch has {batch['reader_ids'].shape[1]} reader blocks per "
                       f"question, the model reader_beam={self.reader_beam}")

  def logits(self, params: Params, batch: Batch, rng: Array | None = None) -> Array:
    """Teacher-forced answer logits [Q, T, V] of the batch's targets."""
    self._check_rows(batch)
    decoder_input_ids = fid_lib.shift_right(batch["answer_targets"], self.fid.bos_id)
    return fid_lib.FidModel(self.fid).apply(
        {"params": params["fid"]}, batch["reader_ids"], batch["reader_mask"], decoder_input_ids,
        batch["reader_type_ids"], deterministic=rng is None, rngs=dropout_rngs(rng))

  def _sums(self, params: Params, batch: Batch, rng: Array | None) -> tuple[Array, dict]:
    logits = self.logits(params, batch, rng)  # [Q, T, V]
    example_mask = batch["example_mask"].astype(jnp.float32)  # [Q]
    weights = batch["answer_mask"].astype(jnp.float32) * example_mask[:, None]  # [Q, T]
    loss, aux = fid_lib.answer_loss(logits, batch["answer_targets"], weights)
    # [Q, T] teacher-forced argmax = target: token accuracy, and whole answers right.
    hit = (jnp.argmax(logits, axis=-1) == batch["answer_targets"]).astype(jnp.float32)
    answered = jnp.any(weights > 0, axis=-1)  # [Q] a target to train on
    answer_hit = jnp.all((hit > 0) | (weights == 0), axis=-1) & answered
    retriever_correct = batch["retriever_correct"].astype(bool)  # [Q, beam]
    return loss, {
        "loss_sum": aux["loss_sum"],
        "weight_sum": aux["weight_sum"],
        "token_correct_sum": jnp.sum(hit * weights),
        "answer_correct_sum": jnp.sum(answer_hit.astype(jnp.float32) * example_mask),
        "answered_sum": jnp.sum(answered.astype(jnp.float32) * example_mask),
        "example_sum": jnp.sum(example_mask),
        "retriever_any_correct_sum": jnp.sum(jnp.any(retriever_correct, -1) * example_mask),
        "reader_any_correct_sum": jnp.sum(
            jnp.any(retriever_correct[:, :self.reader_beam], -1) * example_mask),
    }

  def loss_fn(self, params: Params, batch: Batch, rng: Array) -> tuple[Array, dict]:
    """(mean answer-token cross entropy, summed aux) with dropout."""
    return self._sums(params, batch, rng)

  def eval_fn(self, params: Params, batch: Batch) -> dict:
    """Summed aux values, deterministic."""
    return self._sums(params, batch, None)[1]

  def summarize(self, aux: dict) -> dict[str, Array]:
    return summarize(aux)

  # -- prediction (`evaluation.evaluate.Predictor`)

  def embed_questions(self, params: Params, batch: Batch, rng: Array | None = None) -> Array:
    """[Q, question_len] question ids -> [Q, proj] question embeddings (the search's)."""
    return RealmRetriever(self.config).apply(
        {"params": params["retriever"]}, batch["question_ids"], batch.get("question_type_ids"),
        batch["question_mask"], deterministic=rng is None, rngs=dropout_rngs(rng),
        method=RealmRetriever.embed_queries)

  def predict_batch(self, params: Params, batch: Batch) -> dict[str, Array]:
    """Greedy answers of the reader over the batch's reader rows
    (`build_open_qa_batch`'s, which are the FiD rows).

    Returns:
      answer_tokens int32 [Q, max_answer_length] (answer, EOS, pad), logit [Q] (the answer's
      log-probability, EOS included), block_index / block_id [Q] (-1: FiD reads the K blocks
      together, no single block holds its answer), retrieval_scores [Q, beam] (question .
      index embedding, with `question_emb` from the batch when given, as the extractive
      reader's) and retrieved_block_ids [Q, beam].
    """
    self._check_rows(batch)
    cfg = self.fid
    tokens = fid_lib.greedy_decode(params["fid"], cfg, batch["reader_ids"],
                                   batch["reader_mask"], cfg.max_answer_length,
                                   batch["reader_type_ids"])  # [Q, T]
    logits = fid_lib.FidModel(cfg).apply(
        {"params": params["fid"]}, batch["reader_ids"], batch["reader_mask"],
        fid_lib.shift_right(tokens, cfg.bos_id), batch["reader_type_ids"])
    log_prob = fid_lib.sequence_log_probs(logits, tokens, cfg.eos_id)  # [Q]
    question_emb = batch.get("question_emb")
    if question_emb is None:
      question_emb = self.embed_questions(params, batch)
    retrieved = jnp.asarray(batch["retrieved_block_ids"])  # [Q, beam]
    scores = (relevance_scores(question_emb, batch["retrieved_block_emb"])
              if "retrieved_block_emb" in batch else jnp.zeros(retrieved.shape, jnp.float32))
    none = jnp.full(tokens.shape[:1], -1, jnp.int32)
    return {"answer_tokens": tokens, "logit": log_prob, "block_index": none, "block_id": none,
            "retrieval_scores": scores, "retrieved_block_ids": retrieved}

  def answer_texts(self, store, batch: Batch, predictions: dict,
                   vocab: vocab_lib.WordPieceVocabulary | None = None) -> list[str]:
    """The generated answers as text (`detokenize`); `store` and `batch` are not read (the
    extractive reader's signature)."""
    del store, batch
    vocab = vocab or vocab_lib.default_vocabulary()
    return [detokenize(row, vocab, eos_id=self.fid.eos_id)
            for row in np.asarray(predictions["answer_tokens"])]


def summarize(aux: dict) -> dict[str, Array]:
  """Means from summed aux values: loss and token accuracy per counted answer token; answer
  accuracy (every target token the teacher-forced argmax), answerable (a target fits) and
  recall (an answer in the beam / in the K blocks read) per question."""

  def ratio(numerator: str, denominator: str) -> Array:
    den = aux[denominator]
    return jnp.where(den > 0, aux[numerator] / jnp.maximum(den, 1e-12), 0.0)

  return {"loss": ratio("loss_sum", "weight_sum"),
          "token_accuracy": ratio("token_correct_sum", "weight_sum"),
          "answer_accuracy": ratio("answer_correct_sum", "answered_sum"),
          "answerable": ratio("answered_sum", "example_sum"),
          "retriever_any_correct": ratio("retriever_any_correct_sum", "example_sum"),
          "reader_any_correct": ratio("reader_any_correct_sum", "example_sum")}
