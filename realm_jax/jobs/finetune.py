"""`finetune`: open-QA fine-tuning (REALM_SPEC 25-29; ORQA's recipe, used for REALM's numbers).

Questions are retrieved with the live question tower from the run's index (or BM25's blocks,
or none for the closed book); the retriever and the reader warm-start from `init_checkpoint`,
and EM on `eval_split` picks the best checkpoint. Two readers: 'extractive' (ORQA's span
reader, `models.open_qa_model`) or 'fid' (Atlas's Fusion-in-Decoder, `models.fid_qa`), whose
question tower trains only by Atlas's objectives. Details: docs/design/models_and_jobs.md.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import gin

from realm_jax import gin_utils
from realm_jax.gin_utils import ConfigError
from realm_jax.jobs.base import RunContext, global_spec, require
from realm_jax.jobs.index_job import IndexJob

READERS = ("extractive", "fid")


@dataclasses.dataclass(frozen=True)
class FidSettings:
  """The FiD reader's settings from gin (`fid_config`): FidConfig fields other than `bert`,
  whose encoder is the run's model config's BERT (`build`)."""
  fields: tuple[tuple[str, Any], ...] = ()

  def build(self, bert: Any) -> Any:
    """`FidConfig.from_bert(bert, **fields)`: the decoder shaped like the encoder unless set
    here; a one-line ConfigError on a bad value."""
    from realm_jax.models import fid  # pylint: disable=g-import-not-at-top
    try:
      return fid.FidConfig.from_bert(bert, **dict(self.fields))
    except (TypeError, ValueError) as e:
      raise ConfigError(f"FidConfig: {gin_utils.one_line(e)}") from e


@gin.configurable("FidConfig")
def fid_config(**fields: Any) -> FidSettings:
  """The FiD reader of `FinetuneJob(reader='fid')` from gin (`FidConfig.decoder_layers = 2`,
  `FinetuneJob.fid = @FidConfig()`): fields of `realm_jax.models.fid.FidConfig` except `bert`
  (the encoder is the run's %MODEL_CONFIG BERT, warm-started from its checkpoint); unset ones
  follow `FidConfig.from_bert` (a decoder shaped like the encoder)."""
  from realm_jax.models import fid  # pylint: disable=g-import-not-at-top
  known = {f.name for f in dataclasses.fields(fid.FidConfig)} - {"bert"}
  unknown = sorted(set(fields) - known)
  if unknown:
    raise ConfigError(f"FidConfig: unknown field(s) {unknown}"
                      + (" (the encoder is the run's MODEL_CONFIG BERT)" if "bert" in unknown
                         else f"; expected some of {sorted(known)}"))
  return FidSettings(tuple(sorted(fields.items())))


class AnswerBlocksBeam(NamedTuple):
  """What `answer_blocks_beam` binds: `FidReaderModel.objective_beam` and
  `targets_in_read_blocks` (the defaults: unset)."""
  objective_beam: Optional[int] = None
  targets_in_read_blocks: bool = False


@gin.configurable
def answer_blocks_beam(objective_beam: Optional[int] = None,
                       targets_in_read_blocks: bool = False) -> AnswerBlocksBeam:
  """`FidReaderModel.objective_beam` and `targets_in_read_blocks` of the FiD reader's
  "answer_blocks" control (`--gin.answer_blocks_beam.objective_beam=100`: its objective scores
  the beam's first 100 blocks, not only the `reader_beam` read; None: those; with
  `targets_in_read_blocks`, only the read ones can be targets). A gin setting of its own, not
  FinetuneJob fields: a control for one experiment stays out of the settings that every
  fine-tuning's bench fingerprint resolves (`bench/ablations.fingerprint`)."""
  return AnswerBlocksBeam(objective_beam, targets_in_read_blocks)


@gin.configurable
@dataclasses.dataclass
class FinetuneJob(IndexJob):
  """OpenQAModel (or FidReaderModel) on a QA task (toy_qa, nq_open, web_questions,
  curated_trec) or your own QA files (`task`: a path, or `regex:<path>` for regex answers;
  realm_jax_tasks.register_qa_files). Details: docs/design/models_and_jobs.md.

  Attributes:
    retriever_beam: blocks per question for the retriever loss (5000).
    reader_beam: blocks the reader reads (5).
    reader_len: reader row length (320): the full width of the reader rows.
    question_len: fixed question length (longer questions are left out, counted).
    max_occurrences: gold-span slots per (question, block).
    train_document_tower: also train the document tower (with an index builder alongside).
    document_beam: blocks re-embedded per question (FiD: re-ranked before reading); None.
    eval_split: the split evaluated at every checkpoint ("" disables).
    eval_examples: evaluate only the first this many questions of it (None: all).
    peft: 'none', 'lora' or 'adapters' (realm_jax.models.peft): only those train.
    lora_rank: r of each LoRA update (A [in, r] @ B [r, out]).
    lora_alpha: LoRA's alpha: the update is scaled by alpha / r.
    lora_targets: kernels LoRA updates: 'query', 'key', 'value', 'out', 'intermediate', 'output'.
    adapter_size: the adapters' bottleneck width (peft='adapters').
    length_bucket: cut training reader rows to a multiple of this many wordpieces (0: off).
    retriever_objective: "marginal" (REALM_SPEC 28), "none" or Atlas's (None: the reader's).
    candidates: 'index', 'bm25' (DrQA's pipeline, no index) or 'none' (FiD's closed book).
    reader: 'extractive' (ORQA's span reader, the default) or 'fid' (Atlas's FiD reader).
    fid: the FiD reader's settings, `@FidConfig()` in gin; None: the defaults.
    few_shot: train on only this many questions of the train split (None: all).
    few_shot_seed: the seed of that sample.
  """
  retriever_beam: int = 5000
  reader_beam: int = 5
  reader_len: int = 320
  question_len: int = 64
  max_occurrences: int = 32
  train_document_tower: bool = False
  document_beam: Optional[int] = None
  eval_split: str = "dev"
  eval_examples: Optional[int] = None
  peft: str = "none"
  lora_rank: int = 8
  lora_alpha: float = 16.0
  lora_targets: Sequence[str] = ("query", "value")
  adapter_size: int = 64
  length_bucket: int = 0
  candidates: str = "index"
  reader: str = "extractive"
  fid: Any = None
  few_shot: Optional[int] = None
  few_shot_seed: int = 0
  retriever_objective: Optional[str] = None

  name = "finetune"

  def __post_init__(self):
    super().__post_init__()
    # The retriever of question texts when there is no index to watch: the BM25Searcher of
    # candidates='bm25', qa_batches.ClosedBook of 'none'; set by `start`.
    self.text_retriever = None

  def configure(self, ctx: RunContext) -> None:
    import realm_jax_tasks  # pylint: disable=g-import-not-at-top  (registers the tasks)
    from realm_jax.batches import seqio_batches  # pylint: disable=g-import-not-at-top
    from realm_jax.data import answer_match  # pylint: disable=g-import-not-at-top
    self.check_retriever_objective()
    self.check_candidates()
    self.check_reader(ctx)
    from realm_jax.batches import qa_batches  # pylint: disable=g-import-not-at-top
    try:
      qa_batches.check_few_shot(self.few_shot)
    except ValueError as e:
      raise ConfigError(f"FinetuneJob.{e}") from e
    try:
      seqio_batches.check_row_bucket(self.length_bucket)
    except ValueError as e:
      raise ConfigError(f"FinetuneJob.length_bucket: {e}") from e
    if realm_jax_tasks.is_qa_path(self.task):
      try:
        self.task = realm_jax_tasks.register_qa_files(self.task)
      except ValueError as e:
        raise ConfigError(f"{gin_utils.binding('TASK', self.task)}: {e}") from e
    try:
      task = seqio_batches.get_task(self.task)
    except seqio_batches.UnknownTaskError as e:
      raise ConfigError(f"FinetuneJob.task: {gin_utils.one_line(e)}") from e
    if "question_ids" not in task.output_features:
      raise ConfigError(f"FinetuneJob.task={self.task!r} is not a QA task (job 'finetune' needs "
                        f"one of toy_qa, nq_open, web_questions, curated_trec)")
    if self.reader == "fid":
      if answer_match.answers_are_regex(task):
        raise ConfigError(f"FinetuneJob.reader='fid' generates answer texts: task "
                          f"{self.task!r} has regex answers (CuratedTrec), none to train on")
    elif "answer_ids" in task.output_features:  # precomputed decoder targets (batches.fid)
      raise ConfigError(f"FinetuneJob.task={self.task!r} has decoder targets (Atlas's pretext: "
                        f"sentinel sequences), which only the generative reader trains on: set "
                        f"FinetuneJob.reader='fid'")
    splits = tuple(task.splits)
    for what, split in (("the training split", "train"), ("FinetuneJob.eval_split",
                                                          self.eval_split)):
      if split and split not in splits:
        raise ConfigError(f"{what} {split!r}: task {self.task!r} has splits {', '.join(splits)}"
                          + (" (eval_split='' evaluates nothing)" if split == self.eval_split
                             else ""))
    self.open_store()

  def default_objective(self) -> str:
    """The reader's own `retriever_objective`: ORQA's "marginal" for the extractive reader,
    "none" (the question tower only retrieves) for FiD."""
    return "none" if self.reader == "fid" else "marginal"

  def resolved_objective(self) -> str:
    """`retriever_objective`, None read as `default_objective`."""
    return self.default_objective() if self.retriever_objective is None else (
        self.retriever_objective)

  def check_retriever_objective(self) -> None:
    """`retriever_objective` resolved (`resolved_objective`) and checked in one line:
    IndexJob's check for the extractive reader's objectives (an objective only the FiD reader
    serves, such as "none", said so); the FiD reader's are `check_reader`'s."""
    from realm_jax.models import retriever_objectives  # pylint: disable=g-import-not-at-top
    self.retriever_objective = self.resolved_objective()
    if self.reader == "fid":
      return
    objective = retriever_objectives.get(self.retriever_objective)
    if (objective is not None and not objective.serves(retriever_objectives.EXTRACTIVE)
        and objective.serves(retriever_objectives.FID)):
      raise ConfigError(f"FinetuneJob.retriever_objective={self.retriever_objective!r} is the "
                        f"FiD reader's (reader='fid'): the extractive reader's question tower "
                        f"trains by 'marginal' (ORQA's losses) or one of Atlas's objectives")
    super().check_retriever_objective()

  def check_candidates(self) -> None:
    """A one-line ConfigError unless `candidates` is known and fits the other settings: BM25's
    beam trains no retriever."""
    from realm_jax.evaluation import bm25  # pylint: disable=g-import-not-at-top
    if self.candidates not in bm25.READER_CANDIDATES:
      raise ConfigError(f"FinetuneJob.candidates={self.candidates!r}; expected one of "
                        f"{', '.join(bm25.READER_CANDIDATES)}")
    if self.candidates == "none":
      self.check_closed_book()
    if self.candidates == "bm25":
      for setting, value, default in (
          ("train_document_tower", self.train_document_tower, False),
          ("retriever_objective", self.retriever_objective, self.default_objective())):
        if value != default:
          raise ConfigError(f"FinetuneJob.{setting}={value!r} trains the retriever, and "
                            f"candidates='bm25' has none to train (BM25 ranks): leave it at "
                            f"{default!r}")

  def check_closed_book(self) -> None:
    """candidates='none' (closed book): a one-line ConfigError unless the reader is FiD, reads
    one row and nothing of a retriever or an index is set; `retriever_beam` becomes 1."""
    if self.reader != "fid":
      raise ConfigError(f"FinetuneJob.candidates='none' (closed book) reads no block: it needs "
                        f"the generative reader, reader='fid' (the {self.reader!r} reader's "
                        f"answers are spans of the blocks it reads)")
    for setting, value, default in (
        ("reader_beam", self.reader_beam, 1),
        ("retriever_objective", self.resolved_objective(), "none"),
        ("train_document_tower", self.train_document_tower, False),
        ("retriever_lr_scale", self.retriever_lr_scale, 1.0),
        ("freeze_retriever_steps", self.freeze_retriever_steps, 0),
        ("refresh_in_lockstep", self.refresh_in_lockstep, False),
        ("first_index_checkpoint_dir", self.first_index_checkpoint_dir, None)):
      if value != default:
        raise ConfigError(f"FinetuneJob.{setting}={value!r} does not fit candidates='none' "
                          f"(closed book: one row per question, the question alone; no "
                          f"retriever, no index): set it to {default!r}")
    self.retriever_beam = 1  # the closed book's beam: one empty slot (NULL_BLOCK)

  def check_reader(self, ctx: RunContext) -> None:
    """A one-line ConfigError unless `reader` is known and fits the other settings (the FiD
    reader trains no document tower, its question tower only by its own objectives, and has
    no PEFT)."""
    if self.reader not in READERS:
      raise ConfigError(f"FinetuneJob.reader={self.reader!r}; expected one of "
                        f"{', '.join(READERS)}")
    if self.reader != "fid":
      if self.fid is not None:
        raise ConfigError("FinetuneJob.fid is the FiD reader's: set FinetuneJob.reader='fid' "
                          "too (or leave fid unset)")
      if answer_blocks_beam() != AnswerBlocksBeam():
        raise ConfigError("answer_blocks_beam is the FiD reader's answer_blocks control: set "
                          "FinetuneJob.reader='fid' too (or leave it unset)")
      return
    from realm_jax.models import fid_qa  # pylint: disable=g-import-not-at-top
    try:
      fid_qa.check_objective(self.resolved_objective(), self.objective_temperature)
    except ValueError as e:
      raise ConfigError(f"FinetuneJob.{e}") from e
    if self.peft != "none":
      raise ConfigError(f"FinetuneJob.peft={self.peft!r} is not available with reader='fid' "
                        f"(the FiD reader has no PEFT yet): leave it at 'none'")
    if self.fid is not None and not isinstance(self.fid, FidSettings):
      raise ConfigError(f"FinetuneJob.fid is a {type(self.fid).__name__}: bind "
                        f"FinetuneJob.fid = @FidConfig()")
    self.build_model(ctx)  # the FidConfig's values and the model's settings checked

  def fid_model_config(self, ctx: RunContext) -> Any:
    """The FiD reader's FidConfig: `fid`'s settings over the run's BERT."""
    return (self.fid or FidSettings()).build(ctx.model_config.bert)

  def build_model(self, ctx: RunContext) -> Any:
    from realm_jax.models import open_qa_model  # pylint: disable=g-import-not-at-top
    if self.reader == "fid":
      from realm_jax.models import fid_qa  # pylint: disable=g-import-not-at-top
      try:
        return fid_qa.FidReaderModel(
            ctx.model_config, self.fid_model_config(ctx), reader_beam=self.reader_beam,
            retriever_objective=self.resolved_objective(),
            objective_temperature=self.objective_temperature,
            closed_book=self.candidates == "none",
            train_document_tower=self.train_document_tower, document_beam=self.document_beam,
            **answer_blocks_beam()._asdict())
      except ValueError as e:
        raise ConfigError(f"FinetuneJob: {e}") from e
    try:
      return open_qa_model.OpenQAModel(self.peft_model_config(ctx), reader_beam=self.reader_beam,
                                       train_document_tower=self.train_document_tower,
                                       document_beam=self.document_beam,
                                       retriever_objective=self.retriever_objective,
                                       objective_temperature=self.objective_temperature,
                                       peft=self.peft_config())
    except ValueError as e:
      raise ConfigError(f"FinetuneJob: {e}") from e

  def abstract_batch(self, ctx: RunContext, model: Any) -> dict[str, Any]:
    from realm_jax.batches import qa_batches  # pylint: disable=g-import-not-at-top
    if self.reader == "fid":
      from realm_jax.batches import fid as fid_batches  # pylint: disable=g-import-not-at-top
      towers = ({"question_len": self.question_len, "proj_size": ctx.model_config.proj_size}
                if model.train_question_tower else {})  # the trained towers' inputs
      if model.train_document_tower:
        towers["block_len"] = self.store.max_block_len
      return global_spec(fid_batches.fid_batch_spec(
          beam=min(self.retriever_beam, self.store.num_blocks), reader_beam=self.reader_beam,
          reader_len=self.reader_len, max_answer_length=model.fid.max_answer_length,
          scored_beam=model.scored_beam, **towers), ctx.global_batch)
    spec = qa_batches.open_qa_batch_spec(
        question_len=self.question_len, beam=min(self.retriever_beam, self.store.num_blocks),
        proj_size=ctx.model_config.proj_size, reader_beam=self.reader_beam,
        reader_len=self.reader_len, max_occurrences=self.max_occurrences,
        document_beam=model.num_reembedded, block_len=self.store.max_block_len)
    return global_spec(spec, ctx.global_batch)

  def build_batches(self, ctx: RunContext, model: Any) -> Any:
    """Reads the split's questions (the retriever is the index watcher, set by `start`)."""
    import realm_jax_tasks  # pylint: disable=g-import-not-at-top,unused-import  (registers tasks)
    from realm_jax.batches import qa_batches  # pylint: disable=g-import-not-at-top
    from realm_jax.batches import seqio_batches  # pylint: disable=g-import-not-at-top
    batches_class = qa_batches.OpenQABatches
    if self.reader == "fid":
      from realm_jax.batches import fid as fid_batches  # pylint: disable=g-import-not-at-top
      batches_class = fid_batches.FidBatches
    try:
      batches = batches_class(
          self.task, batch_size=ctx.batch_size, store=self.store, model=model, seed=ctx.seed,
          retriever_beam=self.retriever_beam, reader_len=self.reader_len,
          question_len=self.question_len, max_occurrences=self.max_occurrences,
          few_shot=self.few_shot, few_shot_seed=self.few_shot_seed)
    except seqio_batches.UnknownTaskError as e:
      raise ConfigError(f"FinetuneJob.task: {gin_utils.one_line(e)}") from e
    except ValueError as e:
      if self.few_shot is None:
        raise
      raise ConfigError(f"FinetuneJob.few_shot: {gin_utils.one_line(e)}") from e
    if not self.length_bucket:
      return batches
    return seqio_batches.LengthBucketed(batches, keys=qa_batches.READER_ROW_KEYS,
                                        mask_key="reader_mask", length_bucket=self.length_bucket,
                                        name="reader")

  def warm_start(self, checkpoint: Mapping[str, Any], params: dict, source: str
                 ) -> tuple[dict, str]:
    """The retriever, and the reader: a fine-tuning checkpoint's reader, or a pretraining
    checkpoint's encoder BERT under a fresh span head (REALM initialises the reader from the
    knowledge-augmented encoder). The closed book (candidates='none') has no retriever."""
    if "retriever" in params:
      params = self.warm_start_retriever(checkpoint, params, source)
    if self.reader == "fid":
      return self._warm_start_fid(checkpoint, params, source)
    if "reader" in checkpoint:
      return {**params, "reader": checkpoint["reader"]}, "retriever, reader"
    if "encoder" in checkpoint:
      reader = {**params["reader"], "bert": checkpoint["encoder"]["bert"]}
      return {**params, "reader": reader}, "retriever, reader BERT (from the encoder)"
    return params, "retriever"

  def warm_start_extra(self, knob: str, checkpoint: Mapping[str, Any], params: dict,
                       source: str) -> tuple[dict, str]:
    """`encoder_checkpoint`: the reader's BERT under a fresh span head (ORQA's reader starts
    from BERT: fine-tuning without REALM pretraining), overriding `init_checkpoint`'s reader.
    Any checkpoint with an encoder: a BERT's, an mlm run's, or a pretraining run's (REALM's
    encoder beside another retriever, the paper's "baseline retriever + REALM encoder")."""
    encoder = require(checkpoint, "encoder", knob, source)
    if self.reader == "fid":
      return self._fid_encoder(params, encoder["bert"], knob, source), "FiD encoder (BERT)"
    return {**params, "reader": {**params["reader"], "bert": encoder["bert"]}}, "reader BERT"

  def _warm_start_fid(self, checkpoint: Mapping[str, Any], params: dict, source: str
                      ) -> tuple[dict, str]:
    """FiD's parameters: a FiD fine-tuning checkpoint's reader whole, else its encoder from the
    BERT of a pretraining checkpoint's encoder (or an extractive fine-tuning checkpoint's
    reader), its decoder fresh. The closed book (no retriever) needs one of them."""
    retriever = "retriever, " if "retriever" in params else ""
    if "fid" in checkpoint:  # e.g. an Atlas pretext run's (experiments/atlas_toy_pretext.gin)
      return ({**params, "fid": self._same_fid_shapes(params["fid"], checkpoint["fid"], source)},
              f"{retriever}FiD reader")
    for key, what in (("encoder", "the encoder"), ("reader", "the extractive reader")):
      if key in checkpoint:
        return ({**params, "fid": self._fid_encoder(params, checkpoint[key]["bert"],
                                                    "init_checkpoint", source)},
                f"{retriever}FiD encoder (BERT of {what}; decoder fresh)")
    if not retriever:
      raise ConfigError(f"init_checkpoint {source}: no fid, encoder or reader params for the "
                        f"closed-book reader (has {sorted(checkpoint)}; the closed book has no "
                        f"retriever)")
    return params, "retriever"

  @staticmethod
  def _same_fid_shapes(ours: Any, theirs: Any, source: str) -> Any:
    """`theirs` (a checkpoint's FiD reader), after a one-line ConfigError unless its tree and
    shapes are this run's (a decoder of other layers or `max_answer_length` positions)."""
    import jax  # pylint: disable=g-import-not-at-top
    if jax.tree_util.tree_structure(ours) != jax.tree_util.tree_structure(theirs):
      raise ConfigError(f"init_checkpoint {source}: its FiD reader's parameter tree is not this "
                        f"run's (another FidConfig.decoder_layers or copy_head?): set FidConfig "
                        f"as in the checkpoint's run (its fid_config.json)")
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ours), jax.tree.leaves(theirs)):
      if tuple(a.shape) != tuple(b.shape):
        raise ConfigError(f"init_checkpoint {source}: FiD parameter {jax.tree_util.keystr(path)}"
                          f" is {tuple(b.shape)} there, {tuple(a.shape)} here (another "
                          f"FidConfig, e.g. max_answer_length?): set FidConfig as in the "
                          f"checkpoint's run (its fid_config.json)")
    return theirs

  @staticmethod
  def _fid_encoder(params: dict, bert: Any, knob: str, source: str) -> dict:
    from realm_jax.models import fid  # pylint: disable=g-import-not-at-top
    try:
      return fid.encoder_from_bert(params["fid"], bert)
    except ValueError as e:
      raise ConfigError(f"{knob} {source}: {gin_utils.one_line(e)}") from e

  def index_hook(self, batches: Any):
    hook = super().index_hook(batches)
    question_tower = self.question_tower_fn()

    def retrieve_with_live_tower(step: int, state: Any):
      metrics = hook(step, state)
      # The next questions are retrieved with the live question tower (LoRA merged).
      batches.set_query_params(question_tower(state.params))
      return metrics

    return retrieve_with_live_tower

  def start(self, ctx: RunContext, model: Any, batches: Any):
    if self.reader == "fid":
      import jax  # pylint: disable=g-import-not-at-top
      from realm_jax.models import fid_qa  # pylint: disable=g-import-not-at-top
      if jax.process_index() == 0:  # what `python -m realm_jax.evaluate` rebuilds it from
        fid_qa.write_fid_config(ctx.run_dir, model.fid, reader_beam=self.reader_beam,
                                reader_len=self.reader_len, **fid_qa.retrieval_settings(model))
    if self.candidates in ("bm25", "none"):
      from realm_jax.batches import qa_batches  # pylint: disable=g-import-not-at-top
      from realm_jax.evaluation import bm25  # pylint: disable=g-import-not-at-top
      # No index to watch: BM25's ranking never changes and the closed book reads no block, so
      # no hook either.
      self.text_retriever = (bm25.BM25Searcher(self.store, ctx.model_config.proj_size)
                             if self.candidates == "bm25" else qa_batches.ClosedBook())
      batches.set_retriever(self.text_retriever)
      hooks = []
    else:
      hooks, _, _ = super().start(ctx, model, batches)
    if not self.eval_split:
      return hooks, None, None
    eval_fn, best = self._eval_fn(ctx, model)
    return hooks, eval_fn, best

  def _eval_fn(self, ctx: RunContext, model: Any):
    """EM (regex match for CuratedTrec) and recall@k on `eval_split` with the live parameters
    and the index in use, through `evaluation.qa` (what `python -m realm_jax.evaluate`
    reports)."""
    import jax  # pylint: disable=g-import-not-at-top
    from realm_jax.batches import qa_batches  # pylint: disable=g-import-not-at-top
    from realm_jax.evaluation import qa as qa_lib  # pylint: disable=g-import-not-at-top
    examples = qa_batches.qa_task_examples(self.task, self.eval_split,
                                           max_examples=self.eval_examples)
    answer_metric = ("regex_match" if examples and examples[0].answers_are_regex
                     else "exact_match")
    watcher, store, text_retriever = self.watcher, self.store, self.text_retriever
    vocab = None
    if self.reader == "fid":  # the task's question vocabulary (Atlas's pretext reads sentinels)
      from realm_jax.batches import fid as fid_batches  # pylint: disable=g-import-not-at-top
      vocab = fid_batches.question_vocabulary(self.task)

    def eval_fn(step, state):
      del step
      params = jax.device_get(qa_batches.host_local_params(state.params))
      # BM25 (or the closed book) is its own searcher; a dense retriever's is the index in use.
      retriever = watcher.current if text_retriever is None else text_retriever
      results, _ = qa_lib.evaluate(
          model, params, examples,
          searcher=retriever.searcher if text_retriever is None else text_retriever,
          store=store, block_emb=retriever.block_emb, batch_size=ctx.batch_size,
          reader_len=self.reader_len, vocab=vocab)
      return {f"eval/{name}": float(value) for name, value in results.items()}

    return eval_fn, f"eval/{answer_metric}"

  # -- parameter-efficient fine-tuning (`peft`)

  def peft_config(self) -> Any:
    """The model's PeftConfig (None for peft='none'); a ValueError on a bad setting (which
    `build_model`, the first to ask, reports as a ConfigError)."""
    from realm_jax.models import peft as peft_lib  # pylint: disable=g-import-not-at-top
    if self.peft == "none":
      return None
    if self.train_document_tower:
      raise ConfigError(f"peft={self.peft!r} trains the reader and the question tower only: "
                        f"it cannot train the document tower (train_document_tower=True)")
    return peft_lib.PeftConfig(self.peft, lora_rank=self.lora_rank,
                               lora_alpha=self.lora_alpha, lora_targets=self.lora_targets)

  def peft_model_config(self, ctx: RunContext) -> Any:
    """The run's model config, with the adapters of peft='adapters'."""
    if self.peft != "adapters":
      return ctx.model_config
    if isinstance(self.adapter_size, bool) or not isinstance(self.adapter_size, int) or (
        self.adapter_size < 1):
      raise ConfigError(f"adapter_size={self.adapter_size!r}; expected an integer >= 1 with "
                        f"peft='adapters'")
    return ctx.model_config.replace(**{"bert.adapter_size": self.adapter_size})

  def optimizer_options(self) -> dict[str, Any]:
    options = super().optimizer_options()
    if self.reader == "fid":
      from realm_jax.models import fid_qa  # pylint: disable=g-import-not-at-top
      from realm_jax.models import retriever_objectives  # pylint: disable=g-import-not-at-top
      objective = retriever_objectives.get(self.resolved_objective())
      # The reader; the question tower too when an objective trains it, and the document tower
      # when asked (else the index stays exact).
      options["trainable"] = functools.partial(
          fid_qa.trainable_mask, train_question_tower=objective.trains_retriever,
          train_document_tower=self.train_document_tower)
    config = self.peft_config()
    if config is not None:
      options["trainable"] = config.trainable_mask
      if config.method == "lora":  # the question tower's factors are the retriever's too
        options["retriever_keys"] = ("retriever", "peft/retriever")
    return options

  def peft_checkpoints(self, ctx: RunContext, model: Any) -> Any:
    if getattr(model, "peft", None) is None:  # the FiD reader has none
      return None
    from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
    return checkpoints.PeftCheckpoints(run_dir=ctx.run_dir, trainable=model.peft.trainable_mask,
                                       settings=model.peft.to_dict(),
                                       base_config=ctx.model_config)

  def describe(self) -> str:
    what = {"none": "", "lora": f"LoRA r {self.lora_rank} alpha {self.lora_alpha:g} on "
                                f"{'/'.join(self.lora_targets)}",
            "adapters": f"adapters of {self.adapter_size}"}.get(self.peft, "")
    candidates = {"bm25": "candidates: BM25's blocks (no index)",
                  "none": "closed book (no retrieval, no index)"}.get(self.candidates, "")
    reader = ""
    if self.reader == "fid":
      fields = dict(self.fid.fields) if self.fid is not None else {}
      reader = ("reader FiD (generative; " + ", ".join(
          f"{k} {v}" for k, v in fields.items()) + ")") if fields else "reader FiD (generative)"
    few_shot = ("" if self.few_shot is None
                else f"few-shot: {self.few_shot} training questions (sample seed "
                     f"{self.few_shot_seed})")
    return ", ".join(filter(None, [super().describe(), what, candidates, reader, few_shot]))

  def question_tower_fn(self):
    """`params -> the question tower's retriever params` the live retrieval uses (LoRA merged,
    jitted; the "retriever" subtree as it is otherwise)."""
    config = self.peft_config()
    if config is None or config.method != "lora":
      return lambda params: params["retriever"]
    import jax  # pylint: disable=g-import-not-at-top
    from realm_jax.models import peft as peft_lib  # pylint: disable=g-import-not-at-top
    return jax.jit(lambda params: peft_lib.merged_params(
        {"retriever": params["retriever"],
         peft_lib.PEFT_KEY: {"retriever": params[peft_lib.PEFT_KEY]["retriever"]}},
        config)["retriever"])
