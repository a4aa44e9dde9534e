"""Generative open-QA fine-tuning with the Fusion-in-Decoder reader (`models.fid`): the
`FinetuneJob(reader='fid')` model, Atlas's reader (Izacard et al. 2022) over this project's
retrieval.

`FidReaderModel` is the trainer's model interface (`models.realm`: init / logical_axes /
loss_fn / eval_fn / summarize, plus the predictor's `embed_questions` / `predict_batch` /
`answer_texts`) over the batches of `realm_jax.batches.fid` (`build_fid_batch`):

* **Retrieval**: as the extractive job (`models.open_qa_model`): the question tower searches the
  run's frozen index for the top `retriever_beam` blocks, the reader reads the first
  `reader_beam` (K). With `retriever_objective="none"` (the default) the retriever is NOT
  trained: the FiD loss has no path to the retrieval scores, and the optimizer leaves
  `params["retriever"]` exactly as it was warm-started (`trainable_mask`).
* **Query-side fine-tuning** (Atlas sec. 2.2 and 2.4; `retriever_objective` "adist", "emdr2",
  "pdist" or "loop"): the question tower trains, the document side stays the frozen index's
  embeddings (the batch's `retrieved_block_emb` of the K read blocks; an untied document tower
  is masked out of the optimizer). The retrieval scores of the read blocks are recomputed in
  the graph with the live question tower, `s_k = q . d_k` [Q, K] (as the extractive reader
  does), and `retriever_objectives` distils a target the reader computes, held fixed
  (stop_gradient: no gradient from the objective reaches the reader), into `softmax(s / T)`:
    adist  `fid.passage_attention_scores` of the training pass's decoder cross-attention
           (weights times value norms, averaged over layers, heads and the answer tokens,
           summed over each passage's tokens), `adist_loss`;
    emdr2  `log p(y | z_k, x)`, the decoder reading passage k ALONE (`fid.
           passage_log_likelihoods`: the training pass's memory split into K one-passage
           memories), summed over the answer's tokens and EOS, `emdr2_loss` (sequence level);
    pdist  the same likelihoods, `pdist_loss` (summed, not length-normalised: its docstring);
    loop   `log p(y | Z \\ z_k, x)`, the decoder reading every passage but k (`fid.
           left_out_log_likelihoods`: K decodes over the training pass's memory, decode k
           blind to passage k), `retriever_objectives.left_out_loop_loss`.
  And a control that is not Atlas's, to tell a target's quality from the distillation itself:
    answer_blocks  0 for the read blocks that contain an answer string (the batch's
           `retriever_correct`), impossible for the others: `pdist_loss` distils the uniform
           distribution over the answer's blocks (the weak supervision of DPR's fine-tuning);
           a question none of whose K blocks holds an answer has no objective. Its target needs
           no reader, so it may score more of the beam than the K read (`objective_beam`: the
           first L blocks of the beam, a question with an answer among them has a target),
           which tells whether seeing only the K read blocks is what loses retrieval.
           `targets_in_read_blocks` keeps the beam's other blocks scored but never a target
           (the questions trained and their targets are those of the K read): it tells the
           other blocks' scores, as negatives, from the targets they add.
  Whatever the objective, the logs say how often its target's preferred block and the
  retriever's top block hold an answer (`summarize`): a target worse at it than the retriever
  teaches the retriever to miss.
  Only the chosen objective's extra work runs: adist sows the training pass's cross-attention;
  emdr2 / pdist / loop run K more decodes per question (no dropout) over the training pass's
  memory keys and values, never a second encoder pass. A question without a target to train
  on has no objective either. Departures from Atlas's code: the likelihoods are summed, not
  length-normalised (its `ppmean`), and EMDR^2 marginalises the sequence's likelihood (the
  paper's form) rather than each token's; its target passes run in eval mode, here the
  decodes run without dropout but read the training pass's encodings (dropout included in
  training), and ADist reads the training pass's attention (Atlas's "std" modes); the rest as
  `retriever_objectives` says (no `temperature_gold`, no 1/sqrt(d), the KL summed over blocks).
* **Training the document tower** (`train_document_tower=True`, with an objective: Atlas's full
  retriever training): the K read blocks are re-embedded in the graph by the live document tower
  from their `[CLS] title [SEP] body [SEP]` rows (the batch's `document_ids`...), so
  `s_k = q . d_k` is live on both sides and the objective trains both towers. The index that
  chose the beam goes stale as the tower moves; instead of refreshing it (the index builder
  alongside, as in pretraining), Atlas's cheaper option re-ranks a larger beam
  (`document_beam` = L > K: `index.rerank`): the first L blocks of the stale index's beam are
  re-embedded on the host with the live tower (eval mode), re-ordered by their live scores,
  and the reader reads the best K. The dev and test evaluations re-rank the same way.
* **Reader rows**: one per read block, `[CLS] question [SEP] body [SEP]` with type ids 0 / 1,
  exactly the extractive reader's rows (`batches.qa_batches.build_open_qa_batch`): the FiD encoder
  reads each on its own, the decoder reads all K at once (`models.fid`).
* **Targets**: ONE answer per question: the first of the question's answers (in the task's
  order) whose wordpieces plus EOS fit `FidConfig.max_answer_length` (`batches.fid.
  answer_targets`); a question none of whose answers fits counts no token (its loss is 0).
* **Loss**: `fid.answer_loss`, the teacher-forced token cross entropy over the counted tokens of
  the batch (answer and EOS), in nats per token (`loss_sum / weight_sum`, exact under
  microbatches). With an objective, `loss_sum` adds the objective's sum with each question's
  row weighted by its counted answer tokens, so both terms share the one denominator
  `weight_sum` (the counted tokens) and microbatching stays exact: loss = mean token cross
  entropy + the token-weighted mean over questions of the objective (the per-question mean
  when the answers are equally long).
* **Prediction**: greedy decoding (`fid.greedy_decode`, at most `max_answer_length` tokens),
  detokenised with the project's WordPiece vocabulary (`detokenize`); EM is then ORQA's
  `metrics.exact_match` on the text, as for the extractive reader.

* **Closed book** (`closed_book=True`, `FinetuneJob.candidates='none'`: Atlas's closed-book
  baseline, the same encoder-decoder with no retrieval): one reader row per question,
  `[CLS] question [SEP]` alone (`batches.qa_batches.build_open_qa_batch` over a beam of
  `NULL_BLOCK`), so the decoder's memory holds the question's tokens only; no retriever at all
  (no parameters, no objective), the same loss, decoding and EM.

Parameters: `{"retriever": RealmRetriever params, "fid": FidModel params}` (the checkpoints'
RealmConfig is the run's model config, the retriever's; the FidConfig is written beside the run,
`<run_dir>/fid_config.json`, for `python -m realm_jax.evaluate`); closed book: `{"fid"}` only.
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
from realm_jax.models import losses
from realm_jax.models import retriever_objectives
from realm_jax.models.config import BertConfig, RealmConfig
from realm_jax.models.realm import ParamsFromBoxedInit, dropout_rngs, init_retriever_params
from realm_jax.models.retriever import RealmRetriever, relevance_scores
from realm_jax.models.retriever_objectives import FID, Target

Array = jax.Array
Params = Any
Batch = dict[str, Any]

__all__ = ["FID_CONFIG_FILE", "RETRIEVAL_SETTINGS", "FidReaderModel",
           "check_objective", "detokenize", "fid_config_from_dict", "fid_config_to_dict",
           "read_fid_config", "read_retrieval_settings", "retrieval_settings", "summarize",
           "trainable_mask", "write_fid_config"]

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


def check_objective(objective: str, temperature: float) -> retriever_objectives.Objective:
  """The registered objective `objective` if the FiD reader serves it (`retriever_objectives.
  names(FID)`: "none", the question tower only retrieves, or one that trains it) with a valid
  `objective_temperature`; else a ValueError (one line, naming the setting)."""
  return retriever_objectives.check_objective(objective, temperature, reader=FID)


def trainable_mask(params: Params, train_question_tower: bool = False,
                   train_document_tower: bool = False) -> Params:
  """The optimizer's `trainable`: the FiD reader trains; the retriever stays as it is unless
  `train_question_tower` (a retriever objective, `FidReaderModel.train_question_tower`), and
  then only its question tower does: untied towers keep the document tower
  (`document_embedder`) as warm-started, whose embeddings the frozen index holds, unless
  `train_document_tower` (`FidReaderModel.train_document_tower`); tied towers (one `embedder`)
  are the question tower, and the index built from them stays frozen."""

  def trains(path, _) -> bool:
    if path[0].key != "retriever":
      return True
    if path[1].key == "document_embedder":
      return train_document_tower
    return train_question_tower

  return jax.tree_util.tree_map_with_path(trains, params)


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


def _written(run_dir: str) -> dict:
  """`<run_dir>/fid_config.json` as `write_fid_config` wrote it; FileNotFoundError without one."""
  with open(os.path.join(run_dir, FID_CONFIG_FILE), encoding="utf-8") as f:
    return json.load(f)


def read_fid_config(run_dir: str, bert: BertConfig | None = None) -> fid_lib.FidConfig:
  """The FidConfig a `reader='fid'` fine-tuning run wrote; FileNotFoundError without one."""
  return fid_config_from_dict(_written(run_dir)["fid"], bert)


# The FidReaderModel fields that decide how a run's reader retrieves (`retrieval_settings`).
RETRIEVAL_SETTINGS = ("retriever_objective", "objective_temperature", "train_document_tower",
                      "document_beam")


def retrieval_settings(model: "FidReaderModel") -> dict:
  """The model's `RETRIEVAL_SETTINGS`, written to fid_config.json beside the FidConfig so that
  an evaluation retrieves as the run did (a trained document tower re-ranks its beam)."""
  return {name: getattr(model, name) for name in RETRIEVAL_SETTINGS}


def read_retrieval_settings(run_dir: str) -> dict:
  """The `retrieval_settings` a run wrote to its fid_config.json ({} for a file written
  without them: a run whose document tower did not train)."""
  written = _written(run_dir)
  return {name: written[name] for name in RETRIEVAL_SETTINGS if name in written}


# ------------------------------------------------------------------------------ the model


@dataclasses.dataclass(frozen=True)
class FidReaderModel(ParamsFromBoxedInit):
  """Question tower + FiD reader over a frozen index (module docstring).

  Batch (`batches.fid.build_fid_batch`, `fid_model_inputs`): reader_ids, reader_type_ids,
  reader_mask [Q, reader_beam, reader_len]; answer_targets, answer_mask [Q, T] (T <=
  max_answer_length); retriever_correct [Q, beam]; example_mask [Q]; with a retriever objective
  also question_ids, question_type_ids, question_mask [Q, question_len] and retrieved_block_emb
  [Q, >= scored_beam, proj] (the frozen index's embeddings of the beam's first blocks).

  Attributes:
    config: the run's RealmConfig (the question tower's; the checkpoints record it).
    fid: the reader's FidConfig (its `bert` is the encoder, warm-started from a BERT).
    reader_beam: blocks the reader reads (K).
    retriever_objective: "none" (the question tower only retrieves), Atlas's "adist",
      "emdr2", "pdist", "loop" over the K read blocks, or the control "answer_blocks" (module
      docstring; `retriever_objectives.names(FID)`).
    objective_temperature: T of the retriever's softmax(scores / T) (1.0 with "none").
    closed_book: no retrieval (module docstring): the question alone in one row
      (`reader_beam` 1), no retriever parameters, `retriever_objective` "none".
    train_document_tower: the objective trains the document tower too (module docstring,
      "Training the document tower"): the K read blocks are re-embedded in the graph.
    document_beam: with the document tower, L: the first L blocks of the index's beam are
      re-embedded on the host and re-ranked before the reader reads the best K (Atlas's
      over-retrieval with re-ranking, `index.rerank`); None: no re-ranking.
    objective_beam: with "answer_blocks", the objective scores the first this many blocks of
      the beam (>= K; the batch's `retrieved_block_emb` carries them); None: the K read.
    targets_in_read_blocks: with `objective_beam`, only the K read blocks can be the target's
      (the others count as holding no answer: scored as negatives only).
  """

  config: RealmConfig
  fid: fid_lib.FidConfig
  reader_beam: int = 5
  retriever_objective: str = "none"
  objective_temperature: float = 1.0
  closed_book: bool = False
  train_document_tower: bool = False
  document_beam: int | None = None
  objective_beam: int | None = None
  targets_in_read_blocks: bool = False

  # What the batch source and the predictor ask every open-QA model.
  generative = True
  # What `predict_batch` reads (the predictor passes only these: the other arrays of a
  # `build_open_qa_batch` change width from batch to batch, which would recompile the decoding).
  prediction_keys = ("reader_ids", "reader_type_ids", "reader_mask", "retrieved_block_ids",
                     "retrieved_block_emb", "question_emb")

  def __post_init__(self):
    if self.reader_beam < 1:
      raise ValueError(f"reader_beam must be positive, got {self.reader_beam}")
    objective = check_objective(self.retriever_objective, self.objective_temperature)
    if self.closed_book and (self.reader_beam != 1 or objective.trains_retriever):
      raise ValueError(f"the closed-book reader reads one row per question (the question alone) "
                       f"and has no retriever: reader_beam={self.reader_beam} and "
                       f"retriever_objective={self.retriever_objective!r} must be 1 and 'none'")
    if self.train_document_tower and not objective.trains_retriever:
      raise ValueError("train_document_tower=True with retriever_objective='none': nothing "
                       "trains the document tower (the FiD loss has no path to the retrieval "
                       "scores); choose 'adist', 'emdr2', 'pdist' or 'loop'")
    if self.document_beam is not None and not self.train_document_tower:
      raise ValueError(f"document_beam={self.document_beam} re-ranks with the live document "
                       f"tower: set train_document_tower=True (with the tower frozen the "
                       f"index's ranking is already exact)")
    target = objective.target(FID)
    if self.objective_beam is not None and (target is None or target.needs_reader
                                            or self.train_document_tower):
      raise ValueError(f"objective_beam={self.objective_beam} scores blocks the reader does "
                       f"not read: only retriever_objective='answer_blocks' has targets there "
                       f"(its target needs no reader), with the document tower frozen")
    if self.targets_in_read_blocks and (self.objective_beam or 0) <= self.reader_beam:
      raise ValueError(f"targets_in_read_blocks=True leaves the blocks beyond the K read as "
                       f"negatives: set objective_beam above reader_beam={self.reader_beam} "
                       f"(got {self.objective_beam})")
    # Both widen what the reader reads: the first of the beam, then more of it.
    for name, verb in (("document_beam", "re-ranks"), ("objective_beam", "scores")):
      beam = getattr(self, name)
      if beam is not None and beam < self.reader_beam:
        raise ValueError(f"{name}={beam} {verb} fewer blocks than the reader reads "
                         f"(reader_beam={self.reader_beam})")

  @property
  def objective(self) -> retriever_objectives.Objective:
    """The registered `retriever_objective`, whose declarations decide what the reader
    computes (`objective.target(FID)`)."""
    return retriever_objectives.get(self.retriever_objective)

  @property
  def train_question_tower(self) -> bool:
    """Whether a retriever objective trains the question tower (and the batches carry its
    inputs: `batches.fid.QUESTION_TOWER_KEYS`)."""
    return self.objective.trains_retriever

  @property
  def num_reembedded(self) -> int:
    """Blocks per question the batches carry document-tower inputs for (`document_ids`...
    [Q, K, block_len]): the K read blocks when the document tower trains, else 0."""
    return self.reader_beam if self.train_document_tower else 0

  @property
  def scored_beam(self) -> int:
    """The blocks per question the objective scores, the first of the beam: `objective_beam`,
    else the K read (the batches' `retrieved_block_emb` [Q, scored_beam, proj])."""
    return self.objective_beam or self.reader_beam

  @property
  def rerank_depth(self) -> int:
    """L, the blocks of the index's beam re-ranked with the live document tower before reading
    (`index.rerank`; the batches' and the predictor's); 0: none."""
    return self.document_beam or 0

  def _boxed_init(self, rng: Array) -> Params:
    retriever_rng, fid_rng = jax.random.split(rng)  # closed book: the same FiD init
    fid = {"fid": fid_lib.init_params(self.fid, fid_rng)}
    if self.closed_book:
      return fid
    return {"retriever": init_retriever_params(self.config, retriever_rng), **fid}

  def _check_rows(self, batch: Batch) -> None:
    if batch["reader_ids"].shape[1] != self.reader_beam:
      raise ValueError(f"the batch has {batch['reader_ids'].shape[1]} reader blocks per "
                       f"question, the model reader_beam={self.reader_beam}")

  def logits(self, params: Params, batch: Batch, rng: Array | None = None) -> Array:
    """Teacher-forced answer logits [Q, T, V] of the batch's targets."""
    return self._reader_pass(params["fid"], batch, rng)[0]

  def _reader_pass(self, fid_params: Params, batch: Batch, rng: Array | None
                   ) -> tuple[Array, fid_lib.Cross, Array, Array | None]:
    """The teacher-forced pass (dropout with `rng`).

    Returns:
      (logits [Q, T, V]; the memory as the decoder reads it (`fid.Cross`: per decoder layer
      the cross-attention's (keys, values) [Q, K L, heads, kv], and the copy head's) and the
      memory mask bool [Q, K L], for the objectives' decodes;
      with an objective of `Target.ATTENTION`, the passages' attention scores [Q, K] held
      fixed (else None)).
    """
    self._check_rows(batch)
    decoder_input_ids = fid_lib.shift_right(batch["answer_targets"], self.fid.bos_id)
    sow = self.objective.target(FID) is Target.ATTENTION  # the cross-attention maps
    outputs = fid_lib.FidModel(self.fid).apply(
        {"params": fid_params}, batch["reader_ids"], batch["reader_mask"], decoder_input_ids,
        batch["reader_type_ids"], deterministic=rng is None, rngs=dropout_rngs(rng),
        mutable=["intermediates"] if sow else False, method=fid_lib.FidModel.teacher_forced)
    if not sow:
      return (*outputs, None)
    (logits, cross, memory_mask), state = outputs
    probs, norms = fid_lib.cross_attention_maps(state["intermediates"])
    # [Q, K]: Atlas's a_k from the decoder's cross-attention on the answer's tokens.
    attention = fid_lib.passage_attention_scores(probs, norms, batch["answer_mask"],
                                                 batch["reader_mask"])
    return logits, cross, memory_mask, jax.lax.stop_gradient(attention)

  def _targets(self, fid_params: Params, batch: Batch, cross: fid_lib.Cross,
               memory_mask: Array, attention: Array | None) -> Array:
    """What the objective distils, per read block [Q, K], held fixed (its `Target`): the
    attention scores (adist), `log p(y | z_k, x)` (emdr2, pdist) or `log p(y | Z \\ z_k, x)`
    (loop), the latter two from decodes without dropout over the training pass's memory; 0 or
    -inf, the block holds an answer or not (answer_blocks)."""
    target = self.objective.target(FID)
    if target is Target.ATTENTION:
      return attention
    if target is Target.ANSWER_BLOCKS:
      holds_answer = batch["retriever_correct"][:, :self.scored_beam] > 0  # [Q, L]
      if self.targets_in_read_blocks:  # the blocks beyond the K read: negatives only
        holds_answer &= (jnp.arange(self.scored_beam) < self.reader_beam)[None, :]
      return jnp.where(holds_answer, 0.0, -jnp.inf)
    fixed = jax.lax.stop_gradient
    decodes = (fid_lib.left_out_log_likelihoods if target is Target.LEFT_OUT_LIKELIHOODS
               else fid_lib.passage_log_likelihoods)
    return fixed(decodes(fixed(fid_params), self.fid, fixed(cross), memory_mask,
                         self.reader_beam, batch["answer_targets"], batch["answer_mask"]))

  def objective_targets(self, params: Params, batch: Batch, rng: Array | None = None) -> Array:
    """The objective's targets [Q, K] of a batch (as `loss_fn` computes them; deterministic
    without `rng`)."""
    if not self.train_question_tower:
      raise ValueError(f"retriever_objective={self.retriever_objective!r} has no targets")
    _, cross, memory_mask, attention = self._reader_pass(params["fid"], batch, rng)
    return self._targets(params["fid"], batch, cross, memory_mask, attention)

  def retrieval_scores(self, params: Params, batch: Batch, rng: Array | None = None) -> Array:
    """`s_k = q . d_k` of the scored blocks [Q, scored_beam] (the K read, or the first
    `objective_beam` of the beam): the live question tower's embeddings of
    the batch's questions against the frozen index's embeddings of the blocks
    (`retrieved_block_emb`), so the objective's gradient reaches the question tower only; with
    `train_document_tower`, against the live document tower's embeddings of the blocks
    (`document_ids`...), so it reaches both towers."""
    question_emb = self.embed_questions(params, batch, rng)  # [Q, proj]
    if not self.train_document_tower:  # [Q, scored_beam]
      return relevance_scores(question_emb, batch["retrieved_block_emb"][:, :self.scored_beam])
    if batch["document_ids"].shape[1] != self.reader_beam:
      raise ValueError(f"the batch carries {batch['document_ids'].shape[1]} blocks per question "
                       f"for the document tower, the model reads reader_beam="
                       f"{self.reader_beam}")
    document_rng = None if rng is None else jax.random.fold_in(rng, 2)
    block_emb = RealmRetriever(self.config).apply(  # [Q, K, proj] the live document tower's
        {"params": params["retriever"]}, batch["document_ids"], batch["document_type_ids"],
        batch["document_mask"], deterministic=document_rng is None,
        rngs=dropout_rngs(document_rng), method=RealmRetriever.embed_documents)
    return relevance_scores(question_emb, block_emb)

  def _objective_sums(self, params: Params, batch: Batch, rng: Array | None, targets: Array,
                      weights: Array) -> dict:
    """The objective's summed loss (rows weighted by their counted answer tokens, module
    docstring); the answered questions whose retriever's top block is the target's; and the
    answered questions whose target's preferred block, and whose retriever's top block, holds
    an answer (per answered question, not per question with an answer's block read: a batch
    with none read would have no value, and the trainer averages the steps' values)."""
    scores = self.retrieval_scores(params, batch, rng)  # [Q, scored_beam]
    question_weights = jnp.sum(weights, axis=-1)  # [Q] counted tokens, 0 for padding
    _, aux = self.objective.loss(FID, scores, targets, question_weights,
                                 temperature=self.objective_temperature)
    # LOOP's target prefers the block whose absence hurts most: the lowest left-out likelihood.
    preferred = -targets if self.objective.target(FID).lower_is_preferred else targets
    target_top = jnp.argmax(preferred, axis=-1)  # [Q]
    retriever_top = jnp.argmax(scores, axis=-1)  # [Q]
    answered = question_weights > 0  # [Q]
    holds_answer = batch["retriever_correct"][:, :self.scored_beam] > 0  # [Q, scored_beam]

    def count(flags: Array) -> Array:
      return jnp.sum(flags.astype(jnp.float32))

    def top_holds_answer(top: Array) -> Array:  # [Q] -> [Q]
      return jnp.take_along_axis(holds_answer, top[:, None], axis=-1)[:, 0] & answered

    return {"objective_loss_sum": aux["loss_sum"],
            "retriever_agreement_sum": count((retriever_top == target_top) & answered),
            "target_top_answer_sum": count(top_holds_answer(target_top)),
            "retriever_top_answer_sum": count(top_holds_answer(retriever_top))}

  def _sums(self, params: Params, batch: Batch, rng: Array | None) -> tuple[Array, dict]:
    logits, cross, memory_mask, attention = self._reader_pass(params["fid"], batch, rng)
    example_mask = batch["example_mask"].astype(jnp.float32)  # [Q]
    weights = batch["answer_mask"].astype(jnp.float32) * example_mask[:, None]  # [Q, T]
    loss, aux = fid_lib.answer_loss(logits, batch["answer_targets"], weights)
    # [Q, T] teacher-forced argmax = target: token accuracy, and whole answers right.
    hit = (jnp.argmax(logits, axis=-1) == batch["answer_targets"]).astype(jnp.float32)
    answered = jnp.any(weights > 0, axis=-1)  # [Q] a target to train on
    answer_hit = jnp.all((hit > 0) | (weights == 0), axis=-1) & answered
    retriever_correct = batch["retriever_correct"].astype(bool)  # [Q, beam]
    sums = {
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
    if not self.train_question_tower:
      return loss, sums
    targets = self._targets(params["fid"], batch, cross, memory_mask, attention)  # [Q, K]
    # The question tower's dropout apart from the reader's, whose pass stays the one of "none".
    question_rng = None if rng is None else jax.random.fold_in(rng, 1)
    objective = self._objective_sums(params, batch, question_rng, targets, weights)
    sums.update(objective, answer_loss_sum=sums["loss_sum"],
                loss_sum=sums["loss_sum"] + objective["objective_loss_sum"])
    loss = losses._safe_divide(  # pylint: disable=protected-access
        sums["loss_sum"], sums["weight_sum"])
    return loss, sums

  def loss_fn(self, params: Params, batch: Batch, rng: Array) -> tuple[Array, dict]:
    """(mean answer-token cross entropy (+ the objective's token-weighted mean: module
    docstring), summed aux) with dropout."""
    return self._sums(params, batch, rng)

  def eval_fn(self, params: Params, batch: Batch) -> dict:
    """Summed aux values, deterministic."""
    return self._sums(params, batch, None)[1]

  def summarize(self, aux: dict) -> dict[str, Array]:
    return summarize(aux)

  # -- prediction (`evaluation.qa.Predictor`)

  def embed_questions(self, params: Params, batch: Batch, rng: Array | None = None) -> Array:
    """[Q, question_len] question ids -> [Q, proj] question embeddings (the search's)."""
    if self.closed_book:
      raise ValueError("the closed-book reader has no question tower: nothing to embed")
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
      reader's; zeros for the closed book, which retrieves nothing) and retrieved_block_ids
      [Q, beam].
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
    retrieved = jnp.asarray(batch["retrieved_block_ids"])  # [Q, beam]
    scores = jnp.zeros(retrieved.shape, jnp.float32)
    if "retrieved_block_emb" in batch and not self.closed_book:
      question_emb = batch.get("question_emb")
      if question_emb is None:
        question_emb = self.embed_questions(params, batch)
      scores = relevance_scores(question_emb, batch["retrieved_block_emb"])
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
  recall (an answer in the beam / in the K blocks read) per question. With a retriever
  objective also its two terms per counted token (`answer_loss`, `retriever_objective`: they
  add up to `loss`), and per answered question `retriever_agreement` (the retriever's top
  block is the target's top block), `target_top_answer` and `retriever_top_answer` (the
  target's preferred block, and the retriever's top block, holds an answer: each at most the
  share with an answer's block among the blocks the objective scores, the K read by default)."""

  def ratio(numerator: str, denominator: str) -> Array:
    den = aux[denominator]
    return jnp.where(den > 0, aux[numerator] / jnp.maximum(den, 1e-12), 0.0)

  out = {"loss": ratio("loss_sum", "weight_sum"),
         "token_accuracy": ratio("token_correct_sum", "weight_sum"),
         "answer_accuracy": ratio("answer_correct_sum", "answered_sum"),
         "answerable": ratio("answered_sum", "example_sum"),
         "retriever_any_correct": ratio("retriever_any_correct_sum", "example_sum"),
         "reader_any_correct": ratio("reader_any_correct_sum", "example_sum")}
  if "objective_loss_sum" in aux:
    out.update(answer_loss=ratio("answer_loss_sum", "weight_sum"),
               retriever_objective=ratio("objective_loss_sum", "weight_sum"),
               retriever_agreement=ratio("retriever_agreement_sum", "answered_sum"),
               target_top_answer=ratio("target_top_answer_sum", "answered_sum"),
               retriever_top_answer=ratio("retriever_top_answer_sum", "answered_sum"))
  return out
