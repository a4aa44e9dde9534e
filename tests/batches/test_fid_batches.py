"""FiD fine-tuning batches (`batches.fid`): the extractive job's reader rows and retrieval, plus
one answer's target tokens, on a hand-worked example; the batch source resumes exactly; and
`FinetuneJob(reader='fid')` builds its model, schema and batches from them."""

import json

import gin
import jax
import numpy as np
import pytest

import realm_jax_tasks  # registers the tasks
from realm_jax import jobs
from realm_jax.batches import fid as fid_batches
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.data import vocab as vocab_lib
from realm_jax.data.qa_datasets import QAExample
from realm_jax.gin_utils import ConfigError
from realm_jax.jobs.base import RunContext
from realm_jax.models import config as config_lib
from realm_jax.models import fid as fid_lib
from realm_jax.models import fid_qa
from realm_jax.training import partitioning

CLS, SEP, PAD = vocab_lib.CLS_ID, vocab_lib.SEP_ID, vocab_lib.PAD_ID
DOCS = [("Alpha", "Alpha was born in Paris in 1811."),
        ("Beta", "Beta lives in Rome."),
        ("Gamma", "Gamma founded the Red Guild.")]


@pytest.fixture(scope="module", autouse=True)
def cache(private_cache):
  return private_cache


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  root = tmp_path_factory.mktemp("fid")
  path = root / "docs.jsonl"
  path.write_text("".join(json.dumps({"title": t, "text": x}) + "\n" for t, x in DOCS))
  corpus_build.build_block_store(sources_lib.JsonlSource(str(path)), str(root / "blocks"))
  return block_store_lib.BlockStore.open(str(root / "blocks"))


def test_answer_targets_take_the_first_answer_that_fits():
  vocab = vocab_lib.default_vocabulary()
  march = vocab.encode("March 24, 1811")  # march 24 , 1811
  assert len(march) == 4
  targets, mask, chosen = fid_batches.answer_targets(
      [["March 24, 1811", "1811"], ["a much longer answer than fits here", "Rome"],
       ["far too long an answer for five"]], vocab, max_answer_length=5)
  # Question 0: its first answer (4 wordpieces + EOS = 5) fits exactly.
  np.testing.assert_array_equal(targets[0], [*march, SEP])
  np.testing.assert_array_equal(mask[0], [1] * 5)
  # Question 1: the first does not fit, the second does.
  np.testing.assert_array_equal(targets[1], [*vocab.encode("Rome"), SEP, PAD, PAD, PAD])
  np.testing.assert_array_equal(mask[1], [1, 1, 0, 0, 0])
  # Question 2: none fits: no token counts.
  np.testing.assert_array_equal(targets[2], [PAD] * 5)
  assert not mask[2].any()
  np.testing.assert_array_equal(chosen, [0, 1, -1])


def test_rows_and_targets_of_a_hand_worked_example(store):
  vocab = vocab_lib.default_vocabulary()
  examples = [QAExample(question="Where was Alpha born?", answers=("Paris", "France")),
              QAExample(question="Who lives in Rome?", answers=("Beta",))]
  retrieved = np.array([[0, 2, 1], [1, 0, 2]])
  batch = fid_batches.build_fid_batch(store, examples, retrieved, max_answer_length=4,
                                      vocab=vocab, reader_beam=2, reader_len=24,
                                      question_len=16)
  # Question 0, block 0: [CLS] where was alpha born ? [SEP] alpha was born in paris in 1811 .
  # [SEP], type ids 0 on "[CLS] question [SEP]", 1 on the body and its [SEP].
  question = vocab.encode("Where was Alpha born?")
  body = vocab.encode(DOCS[0][1])
  row = [CLS, *question, SEP, *body, SEP]
  np.testing.assert_array_equal(batch["reader_ids"][0, 0, :len(row)], row)
  assert not batch["reader_ids"][0, 0, len(row):].any()
  np.testing.assert_array_equal(batch["reader_mask"][0, 0], [1] * len(row) + [0] * (24 - len(row)))
  np.testing.assert_array_equal(batch["reader_type_ids"][0, 0],
                                [0] * (len(question) + 2) + [1] * (len(body) + 1)
                                + [0] * (24 - len(row)))
  # Question 0, block 1 is block 2 (Gamma); question 1, block 0 is block 1 (Beta).
  gamma = [CLS, *question, SEP, *vocab.encode(DOCS[2][1]), SEP]
  np.testing.assert_array_equal(batch["reader_ids"][0, 1, :len(gamma)], gamma)
  rome = vocab.encode("Who lives in Rome?")
  beta = [CLS, *rome, SEP, *vocab.encode(DOCS[1][1]), SEP]
  np.testing.assert_array_equal(batch["reader_ids"][1, 0, :len(beta)], beta)
  # Targets: "paris" [SEP] pad pad; "beta" [SEP] pad pad (one wordpiece each).
  np.testing.assert_array_equal(batch["answer_targets"],
                                [[vocab.encode("Paris")[0], SEP, PAD, PAD],
                                 [vocab.encode("Beta")[0], SEP, PAD, PAD]])
  np.testing.assert_array_equal(batch["answer_mask"], [[1, 1, 0, 0], [1, 1, 0, 0]])
  np.testing.assert_array_equal(batch["answer_index"], [0, 0])
  # The retriever labels of the whole beam, as the extractive batch's: "Paris" in Alpha's
  # block (retrieved first for question 0), "Beta" in Beta's (first for question 1).
  np.testing.assert_array_equal(batch["retriever_correct"], [[True, False, False],
                                                             [True, False, False]])
  inputs = fid_batches.fid_model_inputs(batch)
  assert sorted(inputs) == sorted(fid_batches.FID_MODEL_KEYS)
  spec = fid_batches.fid_batch_spec(beam=3, reader_beam=2, reader_len=24, max_answer_length=4)
  assert {k: (v.shape[1:], v.dtype) for k, v in inputs.items()} == {
      k: (s.shape, s.dtype) for k, s in spec.items()}
  with pytest.raises(ValueError, match="regex answers"):
    fid_batches.build_fid_batch(store, [QAExample("q?", ("P.*",), answers_are_regex=True)],
                                retrieved[:1], max_answer_length=4, reader_beam=2,
                                reader_len=24)


class FakeRetriever:
  """The index's interface for OpenQABatches: a fixed ranking per question length."""

  def __init__(self, num_blocks, proj=8):
    self.block_emb = np.ones((num_blocks, proj), np.float32)
    self.num_blocks = num_blocks

  def retrieve(self, question_ids, question_mask, k):
    return self.search(self.embed_queries(question_ids, question_mask), k)

  # What re-ranking reads besides: the question embeddings and the search on them.
  def embed_queries(self, question_ids, question_mask):
    lengths = np.asarray(question_mask).sum(-1).astype(np.float32)  # [B]
    return np.stack([lengths, np.ones_like(lengths), *[np.zeros_like(lengths)] * 6], -1)

  def search(self, question_emb, k):
    ids = (question_emb[:, :1].astype(int) + np.arange(k)[None]) % self.num_blocks
    return -np.arange(k, dtype=np.float32)[None].repeat(len(ids), 0), ids

  @property
  def searcher(self):
    return self

  def set_query_params(self, params, config=None):
    self.query_params = params


def _ctx(tmp_path):
  config = config_lib.RealmConfig(bert=config_lib.tiny_bert(), proj_size=8)
  return RunContext(run_dir=str(tmp_path), model_config=config, batch_size=2, global_batch=2,
                    seed=0, mesh=partitioning.make_mesh(-1, 1),
                    rules=partitioning.DEFAULT_RULES, init_checkpoint=None)


@pytest.mark.parametrize("objective, document_tower", [(None, False), ("adist", False),
                                                       ("adist", True)])
def test_the_fid_job_builds_its_model_schema_and_resumable_batches(objective, document_tower,
                                                                    tmp_path):
  """By default the batches hold what the reader reads; with a retriever objective also the
  question rows and the frozen index's embeddings of the read blocks; with the document tower
  trained (and re-ranking 4 blocks) also the read blocks' document-tower rows."""
  ctx = _ctx(tmp_path)
  job = jobs.FinetuneJob(task="toy_qa", reader="fid", reader_beam=2, reader_len=64,
                         retriever_beam=6, fid=jobs.finetune.fid_config(decoder_layers=1,
                                                                        max_answer_length=8),
                         retriever_objective=objective, train_document_tower=document_tower,
                         document_beam=4 if document_tower else None)
  job.configure(ctx)
  model = job.build_model(ctx)
  assert isinstance(model, fid_qa.FidReaderModel) and model.fid.decoder_layers == 1
  assert model.fid.bert == ctx.model_config.bert and model.fid.max_answer_length == 8
  assert model.retriever_objective == (objective or "none")
  assert model.rerank_depth == (4 if document_tower else 0)
  assert job.optimizer_options()["trainable"].keywords == {
      "train_question_tower": objective is not None, "train_document_tower": document_tower}
  spec = job.abstract_batch(ctx, model)
  expected_keys = fid_batches.FID_MODEL_KEYS + (
      fid_batches.QUESTION_TOWER_KEYS if objective else ()) + (
          fid_batches.DOCUMENT_TOWER_KEYS if document_tower else ())
  assert sorted(spec) == sorted(expected_keys)
  if document_tower:
    assert spec["document_ids"].shape == (2, 2, job.store.max_block_len)
  params = jax.jit(model.init)(jax.random.PRNGKey(0)) if document_tower else None
  batches = job.build_batches(ctx, model)
  assert isinstance(batches, fid_batches.FidBatches)
  batches.set_retriever(FakeRetriever(job.store.num_blocks))
  if document_tower:
    with pytest.raises(RuntimeError, match="re-ranking reads the live document tower"):
      next(batches)
    batches = job.build_batches(ctx, model)
    batches.set_retriever(FakeRetriever(job.store.num_blocks))
    batches.set_query_params(params["retriever"])
  first = [next(batches) for _ in range(3)]
  assert {k: (v.shape, v.dtype) for k, v in first[0].items()} == {
      k: (s.shape, s.dtype) for k, s in spec.items()}
  assert first[0]["answer_mask"].any(axis=1).all()  # toy answers fit 8 wordpieces
  if objective:  # FakeRetriever's index embeddings (ones) of the 2 read blocks
    np.testing.assert_array_equal(first[0]["retrieved_block_emb"], np.ones((2, 2, 8)))
  # Resume: a new source restored to the state after batch 0 yields batches 1, 2 again.
  again = job.build_batches(ctx, model)
  again.set_retriever(FakeRetriever(job.store.num_blocks))
  resumed = job.build_batches(ctx, model)
  resumed.set_retriever(FakeRetriever(job.store.num_blocks))
  if document_tower:
    again.set_query_params(params["retriever"])
    resumed.set_query_params(params["retriever"])
  next(again)
  resumed.restore(again.state())
  for expected in first[1:]:
    batch = next(resumed)
    for key in expected:
      np.testing.assert_array_equal(batch[key], expected[key])


def test_the_answer_blocks_control_scores_the_first_blocks_of_the_beam(tmp_path, clean_gin):
  """With `objective_beam` the batches carry the frozen index's embeddings of the beam's first
  `objective_beam` blocks, not only of the `reader_beam` read; more than the beam is refused."""
  del clean_gin
  ctx = _ctx(tmp_path)
  settings = dict(task="toy_qa", reader="fid", reader_beam=2, reader_len=64, retriever_beam=6,
                  fid=jobs.finetune.fid_config(decoder_layers=1, max_answer_length=8),
                  retriever_objective="answer_blocks")
  job = jobs.FinetuneJob(**settings)
  job.configure(ctx)
  gin.bind_parameter("answer_blocks_beam.objective_beam", 5)
  model = job.build_model(ctx)
  assert (model.scored_beam, model.reader_beam) == (5, 2)
  spec = job.abstract_batch(ctx, model)
  assert spec["retrieved_block_emb"].shape == (2, 5, ctx.model_config.proj_size)
  retriever = FakeRetriever(job.store.num_blocks)
  retriever.block_emb = np.arange(job.store.num_blocks, dtype=np.float32)[:, None].repeat(8, 1)
  batches = job.build_batches(ctx, model)
  batches.set_retriever(retriever)
  batch = next(batches)
  assert batch["retrieved_block_emb"].shape == (2, 5, 8)
  # FakeRetriever ranks blocks (length, length + 1, ...) for a question of that many tokens.
  lengths = batch["question_mask"].sum(-1)
  expected = (lengths[:, None] + np.arange(5)[None]) % job.store.num_blocks  # [Q, 5] block ids
  np.testing.assert_array_equal(batch["retrieved_block_emb"][..., 0], expected)
  gin.bind_parameter("answer_blocks_beam.objective_beam", 7)
  with pytest.raises(ValueError, match="the objective scores the first 7 blocks of a beam of 6"):
    job.build_batches(ctx, job.build_model(ctx))


def test_the_fid_job_warm_starts_its_encoder_from_a_bert(tmp_path):
  ctx = _ctx(tmp_path)
  job = jobs.FinetuneJob(task="toy_qa", reader="fid")
  model = fid_qa.FidReaderModel(ctx.model_config,
                                fid_lib.FidConfig.from_bert(ctx.model_config.bert,
                                                            decoder_layers=1))
  import jax  # pylint: disable=import-outside-toplevel
  from realm_jax.models import realm  # pylint: disable=import-outside-toplevel

  def random_params(init_fn, seed):  # the shapes, without running init (seconds)
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: rng.normal(0, 0.02, s.shape).astype(s.dtype),
                        jax.eval_shape(init_fn, jax.random.PRNGKey(0)))

  fresh = random_params(model.init, 0)
  pretrain = random_params(realm.RealmPretrainModel(ctx.model_config).init, 1)
  params, taken = job.warm_start(pretrain, fresh, "pretrain/5")
  assert taken == "retriever, FiD encoder (BERT of the encoder; decoder fresh)"
  bert = {k: v for k, v in pretrain["encoder"]["bert"].items() if k != "pooler"}
  for ours, theirs in zip(jax.tree.leaves(params["fid"]["encoder"]), jax.tree.leaves(bert)):
    np.testing.assert_array_equal(ours, theirs)
  for ours, theirs in zip(jax.tree.leaves(params["fid"]["decoder"]),
                          jax.tree.leaves(fresh["fid"]["decoder"])):
    np.testing.assert_array_equal(ours, theirs)
  again, taken = job.warm_start({**pretrain, "fid": params["fid"]}, fresh, "fid/5")
  assert taken == "retriever, FiD reader"


@pytest.mark.parametrize("setting, match", [
    (dict(reader="generative"), "expected one of extractive, fid"),
    (dict(reader="fid", peft="lora"), "not available with reader='fid'"),
    (dict(reader="fid", retriever_objective="marginal"), "no counterpart with the FiD reader"),
    (dict(reader="fid", train_document_tower=True), "nothing trains the document tower"),
    (dict(fid=jobs.finetune.FidSettings()), "set FinetuneJob.reader='fid'"),
    (dict(reader="fid", fid=jobs.finetune.FidSettings((("num_heads", 3),))), "FidConfig: "),
    (dict(reader="fid", task="curated_trec"), "regex answers"),
])
def test_fid_settings_that_do_not_fit_are_one_line_config_errors(setting, match, tmp_path):
  job = jobs.FinetuneJob(**{"task": "toy_qa", **setting})
  with pytest.raises(ConfigError, match=match):
    job.configure(_ctx(tmp_path))


def test_fid_config_in_gin_refuses_the_encoder_and_unknown_fields():
  with pytest.raises(ConfigError, match="the encoder is the run's MODEL_CONFIG BERT"):
    jobs.finetune.fid_config(bert=None)
  with pytest.raises(ConfigError, match="unknown field"):
    jobs.finetune.fid_config(decoder_layer=2)


# -- precomputed targets (Atlas's MLM pretext, realm_jax_tasks.atlas)


def test_answer_targets_take_precomputed_ids_as_they_are():
  vocab = vocab_lib.default_vocabulary()
  rome = vocab.encode("Rome")
  targets, mask, chosen = fid_batches.answer_targets(
      [["an answer string never encoded"], ["Rome"], ["x"]], vocab, max_answer_length=5,
      answer_ids=[(1, 5000, 2, 5001), None, (1, 5000, 5001, 5002, 5003)])
  # Question 0: its ids (sentinel 1, 5000, sentinel 2, 5001) and EOS, exactly 5.
  np.testing.assert_array_equal(targets[0], [1, 5000, 2, 5001, SEP])
  np.testing.assert_array_equal(mask[0], [1] * 5)
  # Question 1: no ids, its answer encoded.
  np.testing.assert_array_equal(targets[1], [*rome, SEP, PAD, PAD, PAD])
  # Question 2: 5 ids and EOS do not fit 5 positions; its answer string is not a fallback.
  assert not targets[2].any() and not mask[2].any()
  np.testing.assert_array_equal(chosen, [0, 0, -1])


def test_a_pretext_example_trains_on_its_ids_and_reads_its_sentinels(store):
  """A question holding a sentinel's name, read by the sentinel vocabulary: the reader row
  holds the sentinel's id; the targets are the example's ids, not its answer string."""
  from realm_jax.data import sentinels  # pylint: disable=import-outside-toplevel
  vocab = sentinels.sentinel_vocabulary()
  where, was, born, mark, alpha = [vocab_lib.default_vocabulary().token_to_id(t)
                                   for t in ("where", "was", "born", "?", "alpha")]
  example = fid_batches.TargetedExample(question="Where was [unused0] born?",
                                        answers=("[unused0] alpha",), answer_ids=(1, alpha))
  batch = fid_batches.build_fid_batch(store, [example], np.array([[0, 1]]),
                                      max_answer_length=4, vocab=vocab, reader_beam=2,
                                      reader_len=24, question_len=16)
  question = [CLS, where, was, 1, born, mark, SEP]
  np.testing.assert_array_equal(batch["question_ids"][0, :7], question)
  row = [*question, *vocab.encode(DOCS[0][1]), SEP]
  np.testing.assert_array_equal(batch["reader_ids"][0, 0, :len(row)], row)
  np.testing.assert_array_equal(batch["answer_targets"], [[1, alpha, SEP, PAD]])
  np.testing.assert_array_equal(batch["answer_mask"], [[1, 1, 1, 0]])


def test_precomputed_targets_join_examples_by_their_index_in_the_split():
  examples = [QAExample("q two", ("a",), source="t/train:2"),
              QAExample("q zero", ("b",), source="t/train:0")]
  targets = [("q zero", (1, 7)), ("q one", (1, 8)), ("q two", (1, 9))]
  joined = fid_batches.with_answer_ids(examples, targets)
  assert [(e.question, e.answers, e.source, e.answer_ids) for e in joined] == [
      ("q two", ("a",), "t/train:2", (1, 9)), ("q zero", ("b",), "t/train:0", (1, 7))]
  with pytest.raises(ValueError, match="another question's"):
    fid_batches.with_answer_ids([QAExample("q one", ("a",), source="t/train:0")], targets)
  with pytest.raises(ValueError, match="no precomputed target"):
    fid_batches.with_answer_ids([QAExample("q", ("a",), source="t/train:3")], targets)


def test_a_tasks_question_vocabulary():
  from realm_jax.data import sentinels  # pylint: disable=import-outside-toplevel
  assert fid_batches.question_vocabulary("toy_qa") is vocab_lib.default_vocabulary()
  assert isinstance(fid_batches.question_vocabulary("atlas_pretext_toy"),
                    sentinels.SentinelVocabulary)
  assert fid_batches.task_answer_ids("toy_qa", "dev") is None


def test_a_pretext_task_needs_the_fid_reader(tmp_path):
  job = jobs.FinetuneJob(task="atlas_pretext_toy")
  with pytest.raises(ConfigError, match="set FinetuneJob.reader='fid'"):
    job.configure(_ctx(tmp_path))


def test_a_fid_checkpoint_of_another_shape_is_a_one_line_config_error(tmp_path):
  ctx = _ctx(tmp_path)
  job = jobs.FinetuneJob(task="toy_qa", reader="fid")
  import jax  # pylint: disable=import-outside-toplevel

  def shapes(**fields):
    model = fid_qa.FidReaderModel(ctx.model_config, fid_lib.FidConfig.from_bert(
        ctx.model_config.bert, **{"decoder_layers": 1, "max_answer_length": 16, **fields}))
    return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype),
                        jax.eval_shape(model.init, jax.random.PRNGKey(0)))

  fresh = shapes()
  params, taken = job.warm_start(fresh, fresh, "same/5")
  assert taken == "retriever, FiD reader"
  width = ctx.model_config.bert.hidden_size
  with pytest.raises(ConfigError, match=rf"position_embeddings.*is \(32, {width}\) there, "
                                        rf"\(16, {width}\) here.*max_answer_length"):
    job.warm_start({**fresh, "fid": shapes(max_answer_length=32)["fid"]}, fresh, "longer/5")
  with pytest.raises(ConfigError, match="parameter tree is not this run's"):
    job.warm_start({**fresh, "fid": shapes(decoder_layers=2)["fid"]}, fresh, "deeper/5")
  # A checkpoint with a copy head, warm-starting a run without one, names the setting.
  with pytest.raises(ConfigError, match="copy_head"):
    job.warm_start({**fresh, "fid": shapes(copy_head=True)["fid"]}, fresh, "copying/5")


class FixedBeam(FakeRetriever):
  """Every question retrieves blocks 0, 1, 2 in that order, its embedding a fixed vector."""

  def __init__(self, question_emb):
    super().__init__(3)
    self.question_emb = question_emb

  def embed_queries(self, question_ids, question_mask):
    return np.repeat(self.question_emb[None], len(question_ids), 0)

  def search(self, question_emb, k):
    return (-np.arange(k, dtype=np.float32)[None].repeat(len(question_emb), 0),
            np.arange(k)[None].repeat(len(question_emb), 0))


def test_the_reader_reads_the_best_of_the_beam_re_ranked_by_the_live_document_tower(store):
  """document_beam=3: the stale beam (0, 1, 2) re-scored by the live document tower (applied by
  flax to each block's row, scored in NumPy); the reader and the document tower read its best
  2, in that order."""
  from realm_jax.models.retriever import RealmRetriever  # pylint: disable=import-outside-toplevel
  config = config_lib.RealmConfig(bert=config_lib.tiny_bert(), proj_size=8,
                                  share_embedders=False)
  fid = jobs.finetune.fid_config(decoder_layers=1, max_answer_length=8).build(config.bert)
  model = fid_qa.FidReaderModel(config, fid, reader_beam=2, retriever_objective="adist",
                                train_document_tower=True, document_beam=3)
  retriever_params = jax.jit(model.init)(jax.random.PRNGKey(1))["retriever"]
  question_emb = np.random.default_rng(0).normal(size=8).astype(np.float32)
  rows = store.embedder_inputs(np.arange(3))
  live = np.asarray(RealmRetriever(config).apply(
      {"params": retriever_params}, *rows, deterministic=True,
      method=RealmRetriever.embed_documents)) @ question_emb  # [3]
  best = np.argsort(-live, kind="stable")[:2]
  assert not np.array_equal(best, [0, 1])  # the random tower re-orders (the test can fail)
  batches = fid_batches.FidBatches("toy_qa", batch_size=2, store=store, model=model,
                                   retriever=FixedBeam(question_emb), retriever_beam=3,
                                   reader_len=64, max_examples=8)
  batches.set_query_params(retriever_params)
  batch = next(batches)
  for question in range(2):
    for k, block in enumerate(best):
      np.testing.assert_array_equal(batch["document_ids"][question, k], rows[0][block])
      # The reader row's body (type 1) is the same block's body.
      reader = batch["reader_ids"][question, k][batch["reader_type_ids"][question, k] == 1]
      document = rows[0][block][rows[1][block] == 1]
      np.testing.assert_array_equal(reader, document)
