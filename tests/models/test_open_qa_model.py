"""Open-QA fine-tuning: feature builder labels by hand, losses against NumPy and against the
transformers port's RealmReader, prediction mapped to the original text, gradients."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from realm_jax.convert import hf
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.data import vocab as vocab_lib
from realm_jax.data.qa_datasets import QAExample
from realm_jax.batches import qa_batches
from realm_jax.models import config as model_config
from realm_jax.models import open_qa_model
from realm_jax.models.reader import enumerate_spans, span_correctness
from realm_jax.models.retriever import RealmRetriever

CLS, SEP = vocab_lib.CLS_ID, vocab_lib.SEP_ID
# One layer: every test compiles a few BERTs, and compilation dominates the run time.
CONFIG = model_config.RealmConfig(bert=model_config.tiny_bert(num_layers=1), proj_size=16,
                                  span_hidden_size=16)
READER_LEN = 32
DOCS = [
    # block 0: each answer below occurs twice in the body.
    {"title": "Tessavar",
     "text": "Zoë Müller founded Tessavar in Paris. Later Zoë Müller left Paris."},
    # block 1: an 11-wordpiece answer.
    {"title": "Numbers",
     "text": "one two three four five six seven eight nine ten eleven twelve are numbers."},
    # block 2: CuratedTrec-style regex answers.
    {"title": "Eiffel", "text": "The Eiffel Tower opened in 1889 in Paris."},
    {"title": "Rome", "text": "Rome is the capital of Italy."},
]


@pytest.fixture(scope="module")
def vocab():
  return vocab_lib.default_vocabulary()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  directory = tmp_path_factory.mktemp("open_qa_store")
  path = directory / "docs.jsonl"
  path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in DOCS),
                  encoding="utf-8")
  corpus_build.build_block_store(sources_lib.JsonlSource(str(path)), str(directory / "store"),
                                 max_block_len=64)
  with block_store_lib.BlockStore.open(str(directory / "store")) as opened:
    assert [opened.body(i) for i in range(len(DOCS))] == [d["text"] for d in DOCS]
    yield opened


def _ids(vocab, text):
  return vocab.encode(text)


def _gold(batch, q, r):
  starts, ends = batch["reader_gold_starts"][q, r], batch["reader_gold_ends"][q, r]
  assert np.all((starts == -1) == (ends == -1))
  return sorted(zip(starts[starts >= 0].tolist(), ends[ends >= 0].tolist()))


# ------------------------------------------------------------------------------ features


def test_reader_inputs_and_labels_by_hand(store, vocab):
  # Question: who founded tessa ##var ?  -> 5 wordpieces, the block starts at position 7.
  # Body of block 0: zoe(0) muller(1) founded(2) tessa(3) ##var(4) in(5) paris(6) .(7)
  #                  later(8) zoe(9) muller(10) left(11) paris(12) .(13)
  example = QAExample("who founded tessavar?", ("Zoë Müller", "paris"))
  batch = qa_batches.build_open_qa_batch(store, [example], np.array([[0, 3, 1]]), vocab=vocab,
                                      reader_beam=2, reader_len=READER_LEN)
  question = _ids(vocab, "who founded tessavar?")
  body = store.body_tokens(0).tolist()
  assert len(question) == 5 and len(body) == 14
  row = [CLS, *question, SEP, *body, SEP]
  np.testing.assert_array_equal(batch["reader_ids"][0, 0, :len(row)], row)
  assert not batch["reader_ids"][0, 0, len(row):].any()
  np.testing.assert_array_equal(batch["reader_mask"][0, 0], np.arange(READER_LEN) < len(row))
  np.testing.assert_array_equal(batch["reader_type_ids"][0, 0],
                                (np.arange(READER_LEN) >= 7) & (np.arange(READER_LEN) < 22))
  np.testing.assert_array_equal(batch["reader_block_mask"][0, 0],
                                (np.arange(READER_LEN) >= 7) & (np.arange(READER_LEN) < 21))
  np.testing.assert_array_equal(batch["question_ids"][0, :7], [CLS, *question, SEP])
  # Every occurrence of every answer: "Zoë Müller" twice, "paris" twice (wordpieces are
  # lower-cased, so "paris" finds "Paris" in the reader).
  assert _gold(batch, 0, 0) == [(7, 8), (13, 13), (16, 17), (19, 19)]
  assert _gold(batch, 0, 1) == []  # block 3 (Rome) has no answer
  # The retriever label is a raw, case-sensitive substring of the body (ORQA's HasAnswer):
  # "Zoë Müller" is in block 0; "paris" (lower case) is in no body.
  np.testing.assert_array_equal(batch["retriever_correct"], [[True, False, False]])
  only_lower = QAExample("who founded tessavar?", ("paris",))
  batch = qa_batches.build_open_qa_batch(store, [only_lower], np.array([[0, 2]]), vocab=vocab,
                                      reader_beam=2, reader_len=READER_LEN)
  np.testing.assert_array_equal(batch["retriever_correct"], [[False, False]])
  assert _gold(batch, 0, 0) == [(13, 13), (19, 19)]
  assert batch["example_mask"].tolist() == [True]


def test_answers_longer_than_max_span_width_are_never_correct(store, vocab):
  eleven = "one two three four five six seven eight nine ten eleven"
  ten = "one two three four five six seven eight nine ten"
  assert len(_ids(vocab, eleven)) == 11
  example = QAExample("count?", (eleven,))  # "count ?" -> 2 wordpieces, block starts at 4
  batch = qa_batches.build_open_qa_batch(store, [example], np.array([[1]]), vocab=vocab,
                                      reader_beam=1, reader_len=READER_LEN)
  assert batch["retriever_correct"].tolist() == [[True]]  # the string is in the block...
  assert _gold(batch, 0, 0) == []  # ...but no span of <= 10 wordpieces can be it
  batch = qa_batches.build_open_qa_batch(store, [QAExample("count?", (ten,))], np.array([[1]]),
                                      vocab=vocab, reader_beam=1, reader_len=READER_LEN)
  assert _gold(batch, 0, 0) == [(4, 13)]


def test_overflowing_block_is_cut_and_ends_with_sep(store, vocab):
  example = QAExample("who founded tessavar?", ("Zoë Müller", "left Paris"))
  batch = qa_batches.build_open_qa_batch(store, [example], np.array([[0]]), vocab=vocab,
                                      reader_beam=1, reader_len=16)
  body = store.body_tokens(0).tolist()
  # 16 - (1 + 5 + 1) - 1 = 8 body wordpieces fit; the last position is forced to [SEP].
  np.testing.assert_array_equal(batch["reader_ids"][0, 0],
                                [CLS, *_ids(vocab, "who founded tessavar?"), SEP, *body[:8], SEP])
  assert batch["reader_mask"][0, 0].all()
  assert batch["reader_block_mask"][0, 0].tolist() == [False] * 7 + [True] * 8 + [False]
  assert batch["reader_type_ids"][0, 0].tolist() == [0] * 7 + [1] * 9
  # Only occurrences inside the kept part are gold; the retriever label sees the whole block.
  assert _gold(batch, 0, 0) == [(7, 8)]
  assert batch["retriever_correct"].tolist() == [[True]]
  # Offsets of the kept tokens point into the original body text.
  assert qa_batches.span_text(store, batch, 0, 0, 7, 8) == "Zoë Müller"
  assert qa_batches.span_text(store, batch, 0, 0, 13, 14) == "Paris."
  assert qa_batches.span_text(store, batch, 0, 0, 6, 8) == ""  # starts on [SEP]: not a block span
  # A block whose text did not re-tokenise to its stored wordpieces has no offsets: the text
  # falls back to the joined (lower-cased) wordpieces.
  batch["reader_offsets_valid"][0, 0] = False
  assert qa_batches.span_text(store, batch, 0, 0, 7, 11) == "zoe muller founded tessavar"


def test_questions_are_never_truncated(store, vocab):
  example = QAExample("who founded tessavar?", ("x",), source="dev.jsonl:3")
  with pytest.raises(ValueError, match=r"dev.jsonl:3.*never truncated"):
    qa_batches.build_open_qa_batch(store, [example], np.array([[0]]), vocab=vocab, reader_beam=1,
                                reader_len=READER_LEN, question_len=6)
  with pytest.raises(ValueError, match="no room for the block"):
    qa_batches.build_open_qa_batch(store, [example], np.array([[0]]), vocab=vocab, reader_beam=1,
                                reader_len=8)
  # Padding to the batch's longest question (rounded up to 8) or to a fixed length.
  short = QAExample("who?", ("x",))
  batch = qa_batches.build_open_qa_batch(store, [example, short], np.array([[0], [0]]),
                                      vocab=vocab, reader_beam=1, reader_len=READER_LEN)
  assert batch["question_ids"].shape == (2, 8)
  np.testing.assert_array_equal(batch["question_mask"].sum(1), [7, 4])
  # Each reader row holds its own question unpadded: the block starts right after it.
  assert batch["reader_block_mask"][1, 0].argmax() == 4
  with pytest.raises(ValueError, match="smaller than reader_beam"):
    qa_batches.build_open_qa_batch(store, [example], np.array([[0]]), vocab=vocab, reader_beam=2)
  with pytest.raises(ValueError, match="out of range"):
    qa_batches.build_open_qa_batch(store, [example], np.array([[7]]), vocab=vocab, reader_beam=1)


def test_regex_answers_mark_spans_whose_original_text_fully_matches(store, vocab):
  # Body of block 2: the(0) e(1) ##iff(2) ##el(3) tower(4) opened(5) in(6) 1889(7) in(8)
  #                  paris(9) .(10); question "when?" -> 2 wordpieces, block starts at 4.
  example = QAExample("when?", (r"18\d\d", "eiffel tower", "Paris", "("), answers_are_regex=True)
  batch = qa_batches.build_open_qa_batch(store, [example], np.array([[2, 0, 3]]), vocab=vocab,
                                      reader_beam=2, reader_len=READER_LEN)
  # "1889" (position 11), "Eiffel Tower" (IGNORECASE, 5..8) and "Paris" (13); not "Paris."
  # (a prefix match only), and the invalid pattern "(" matches nothing.
  assert _gold(batch, 0, 0) == [(5, 8), (11, 11), (13, 13)]
  assert [qa_batches.span_text(store, batch, 0, 0, s, e) for s, e in _gold(batch, 0, 0)] == [
      "Eiffel Tower", "1889", "Paris"]
  assert _gold(batch, 0, 1) == [(4 + 6, 4 + 6), (4 + 12, 4 + 12)]  # "Paris" in block 0, twice
  # Retriever label: re.search over the body.
  assert batch["retriever_correct"].tolist() == [[True, True, False]]
  # Regex mode follows the examples unless told otherwise.
  london = QAExample("when?", ("Lond.n",), answers_are_regex=True)
  batch = qa_batches.build_open_qa_batch(store, [london], np.array([[2]]), vocab=vocab,
                                      reader_beam=1, reader_len=READER_LEN)
  assert batch["retriever_correct"].tolist() == [[False]] and _gold(batch, 0, 0) == []
  with pytest.raises(ValueError, match="mix regex"):
    qa_batches.build_open_qa_batch(store, [example, QAExample("q", ("a",))],
                                np.array([[2], [2]]), vocab=vocab, reader_beam=1)


def test_title_match_only_with_title_and_body_labels(store, vocab):
  example = QAExample("what?", ("Numbers",))  # in block 1's title, not its body ("numbers")
  for label_text, expected in (("body", False), ("title_and_body", True)):
    batch = qa_batches.build_open_qa_batch(store, [example], np.array([[1]]), vocab=vocab,
                                        reader_beam=1, reader_len=READER_LEN,
                                        retriever_label_text=label_text)
    assert batch["retriever_correct"].tolist() == [[expected]]


# ------------------------------------------------------------------------------ model


@pytest.fixture(scope="module")
def model():
  return open_qa_model.OpenQAModel(CONFIG, reader_beam=2)


@pytest.fixture(scope="module")
def params(model):
  return jax.jit(model.init)(jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def block_emb():
  return np.random.default_rng(0).normal(size=(len(DOCS), 16)).astype(np.float32)


def _batch(store, vocab, block_emb, ids=((0, 3, 1), (3, 2, 1), (1, 2, 0), (3, 0, 2)),
           first=QAExample("who founded tessavar?", ("Zoë Müller",)), **kwargs):
  """Four questions, beam 3, reader beam 2: the shapes every model test shares (so compiled
  functions are reused)."""
  examples = [first,
              QAExample("capital of italy?", ("Madrid",)),  # nothing correct anywhere
              QAExample("when did the eiffel tower open?", ("1889",)),
              QAExample("who founded tessavar?", ("Paris",))]
  return qa_batches.build_open_qa_batch(store, examples, np.array(ids), vocab=vocab,
                                     reader_beam=2, reader_len=READER_LEN, block_emb=block_emb,
                                     question_len=16, max_occurrences=8, **kwargs)


def _np_marginal_log_loss(logits, correct):
  logits = np.asarray(logits, np.float64)
  if not correct.any():
    return 0.0
  top = logits.max()
  total = top + np.log(np.exp(logits - top).sum())
  good = logits[correct]
  return total - (good.max() + np.log(np.exp(good - good.max()).sum()))


@functools.lru_cache(maxsize=None)
def _probe(model):
  """eval_fn, scores, logits and question embeddings, in one jitted function per model."""
  def probe(params, batch):
    scores, logits, _, _ = model.forward(params, batch)
    return model.eval_fn(params, batch), scores, logits, model.embed_questions(params, batch)
  return jax.jit(probe)


def test_losses_equal_numpy_marginal_log_loss(store, vocab, block_emb, model, params):
  batch = qa_batches.model_inputs(_batch(store, vocab, block_emb))
  probe = _probe(model)
  aux, scores, logits, question_emb = probe(params, batch)
  scores, logits = np.asarray(scores), np.asarray(logits)
  # Scores: the live question embedding against the frozen index rows.
  np.testing.assert_allclose(scores, np.einsum("qp,qkp->qk", question_emb,
                                               batch["retrieved_block_emb"]), rtol=1e-5)
  starts, ends = enumerate_spans(READER_LEN, CONFIG.max_span_width)
  retriever, reader = [], []
  for q in range(4):
    retriever.append(_np_marginal_log_loss(scores[q], batch["retriever_correct"][q]))
    correct = np.zeros(logits.shape[1:], bool)  # [reader_beam, spans]
    for r in range(2):
      for s, e in zip(batch["reader_gold_starts"][q, r], batch["reader_gold_ends"][q, r]):
        correct[r] |= (starts == s) & (ends == e) & (s >= 0)
    reader.append(_np_marginal_log_loss(logits[q].reshape(-1), correct.reshape(-1)))
  assert retriever[1] == 0.0 and reader[1] == 0.0  # nothing correct: zero loss
  assert reader[0] > 0 and retriever[0] > 0
  np.testing.assert_allclose(aux["retriever_loss_sum"], sum(retriever), rtol=1e-5)
  np.testing.assert_allclose(aux["reader_loss_sum"], sum(reader), rtol=1e-5)
  np.testing.assert_allclose(aux["loss_sum"], sum(retriever) + sum(reader), rtol=1e-5)
  assert float(aux["weight_sum"]) == 4
  assert float(aux["retriever_any_correct_sum"]) == 3  # question 1 has no correct block
  assert float(aux["reader_any_correct_sum"]) == 3
  means = open_qa_model.summarize(aux)
  np.testing.assert_allclose(means["loss"], (sum(retriever) + sum(reader)) / 4, rtol=1e-5)
  np.testing.assert_allclose(means["reader_any_correct"], 0.75)
  # The train step writes these means: the trainer takes the model's own summarize.
  from realm_jax.training import trainer  # pylint: disable=import-outside-toplevel
  written = trainer._summarize_fn(model, None)(aux)  # pylint: disable=protected-access
  np.testing.assert_allclose(written["retriever_loss"], sum(retriever) / 4, rtol=1e-5)

  # Padding questions count for nothing; sharding the batch over devices changes no sum.
  padded = dict(batch, example_mask=np.array([True, True, False, False]))
  padded_aux = probe(params, padded)[0]
  np.testing.assert_allclose(padded_aux["loss_sum"], sum(retriever[:2]) + sum(reader[:2]),
                             rtol=1e-5)
  assert float(padded_aux["weight_sum"]) == 2
  mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
  sharded = probe(params, jax.device_put(batch, NamedSharding(mesh, P("data"))))[0]
  for key in aux:
    np.testing.assert_allclose(sharded[key], aux[key], rtol=1e-5, atol=1e-6)


def test_parity_with_transformers_realm_reader_losses(store, vocab, block_emb, model, params,
                                                      tmp_path):
  import torch  # noqa: PLC0415  (test extra)
  import transformers  # noqa: PLC0415  (test extra)
  reader_beam = 2
  hf_config = transformers.RealmConfig(
      vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
      intermediate_size=64, max_position_embeddings=512, retriever_proj_size=16,
      span_hidden_size=16, max_span_width=10, reader_beam_size=reader_beam,
      hidden_act="gelu_new")
  torch.manual_seed(0)
  hf_reader = transformers.RealmReader(hf_config)
  generator = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for p in hf_reader.parameters():
      p.add_(0.05 * torch.randn(p.shape, generator=generator))
  hf_reader.eval()
  # The port cannot write RealmReader as safetensors (its unused MLM head shares a bias).
  hf_reader.save_pretrained(tmp_path, safe_serialization=False)
  config, reader_params, _ = hf.load_checkpoint(str(tmp_path))
  # The same shapes as our tiny config, so the fixture's model (and its compiled functions)
  # serve; only the reader weights come from the port.
  assert open_qa_model.OpenQAModel(config, reader_beam=reader_beam) == model
  params = {"retriever": params["retriever"], "reader": reader_params}

  # Question 0 is the one compared; the other rows are padding (example_mask False).
  answers = ("Zoë Müller", "paris", "Rome")
  batch = _batch(store, vocab, block_emb, ids=((0, 2, 3), (3, 2, 1), (1, 2, 0), (3, 0, 2)),
                 first=QAExample("who founded tessavar?", answers),
                 example_mask=np.array([True, False, False, False]))
  batch = qa_batches.model_inputs(batch)
  aux, scores, _, _ = _probe(model)(params, batch)
  starts, ends = enumerate_spans(READER_LEN, config.max_span_width)
  relevance = np.asarray(scores)[0]  # [beam]

  # The port's own gold spans: its RealmRetriever.block_has_answer over the same reader rows,
  # with answers tokenised by its RealmTokenizer.
  tokenizer = transformers.RealmTokenizer(vocab_lib.bundled_vocab_path())
  answer_ids = tokenizer(list(answers), add_special_tokens=False).input_ids
  assert answer_ids == [vocab.encode(a) for a in answers]
  retriever = transformers.RealmRetriever(np.array([b"unused"], dtype=object), tokenizer)

  class ConcatInputs:
    input_ids = torch.tensor(batch["reader_ids"][0], dtype=torch.long)

  _, hf_starts, hf_ends = retriever.block_has_answer(ConcatInputs, answer_ids)
  with torch.no_grad():
    out = hf_reader(
        input_ids=torch.tensor(batch["reader_ids"][0], dtype=torch.long),
        attention_mask=torch.tensor(batch["reader_mask"][0], dtype=torch.long),
        token_type_ids=torch.tensor(batch["reader_type_ids"][0], dtype=torch.long),
        relevance_score=torch.tensor(relevance),
        block_mask=torch.tensor(batch["reader_block_mask"][0]),
        start_positions=torch.tensor(hf_starts, dtype=torch.long),
        end_positions=torch.tensor(hf_ends, dtype=torch.long),
        has_answers=torch.tensor(batch["retriever_correct"][0]))
  # Same labels from independent constructions...
  ours_correct = np.asarray(span_correctness(
      starts, ends, batch["reader_gold_starts"], batch["reader_gold_ends"]))[0]
  np.testing.assert_array_equal(ours_correct, out.reader_correct.numpy())
  assert ours_correct.any() and batch["retriever_correct"][0].tolist() == [True, False, True]
  # ...and the same losses.
  assert abs(float(aux["retriever_loss_sum"]) - float(out.retriever_loss)) <= 1e-5
  assert abs(float(aux["reader_loss_sum"]) - float(out.reader_loss)) <= 1e-5
  assert float(out.reader_loss) > 0 and float(out.retriever_loss) > 0


def test_predict_batch_global_argmax_in_original_casing(store, vocab, model, params):
  # Rig the span scorer: a zero output layer gives every valid span the logit 0, so the joint
  # logit is the block's retrieval score, and argmax ties go to the first span in width-major
  # order: the first wordpiece of the best-scoring block.
  rigged = jax.tree.map(lambda x: x, params)
  output = rigged["reader"]["span_head"]["output"]
  rigged["reader"]["span_head"]["output"] = jax.tree.map(jnp.zeros_like, output)
  # Index rows: question . row = 0 for every row but the one for block 0 (Zoë Müller ...),
  # which gets the highest score although it is retrieved second.
  batch = _batch(store, vocab, np.zeros((len(DOCS), 16), np.float32),
                 ids=((3, 0, 2), (3, 2, 1), (1, 2, 0), (3, 0, 2)))
  question_emb = np.asarray(_probe(model)(rigged, qa_batches.model_inputs(batch))[3])
  batch["retrieved_block_emb"][0, 1] = 5.0 * question_emb[0] / np.sum(question_emb[0] ** 2)
  predict = jax.jit(model.predict_batch)
  predictions = predict(rigged, batch)
  assert int(predictions["block_index"][0]) == 1 and int(predictions["block_id"][0]) == 0
  assert (int(predictions["start"][0]), int(predictions["end"][0])) == (7, 7)
  np.testing.assert_allclose(predictions["logit"][0], 5.0, rtol=1e-4)
  np.testing.assert_array_equal(predictions["retrieved_block_ids"][0], [3, 0, 2])
  assert qa_batches.answer_texts(store, batch, predictions, vocab)[0] == "Zoë"
  assert qa_batches.span_text(store, batch, 0, 1, 7, 8) == "Zoë Müller"
  assert qa_batches.span_text(store, batch, 0, 1, 9, 11) == "founded Tessavar"

  # Unrigged: the prediction is the global argmax of the joint logits.
  predictions = predict(params, batch)
  logits = np.asarray(_probe(model)(params, qa_batches.model_inputs(batch))[2])[0]
  starts, ends = enumerate_spans(READER_LEN, CONFIG.max_span_width)  # [reader_beam, spans]
  block, span = np.unravel_index(np.argmax(logits), logits.shape)
  assert (int(predictions["block_index"][0]), int(predictions["start"][0]),
          int(predictions["end"][0])) == (block, int(starts[span]), int(ends[span]))
  text = qa_batches.answer_texts(store, batch, predictions, vocab)[0]
  assert text and text in store.body(int(predictions["block_id"][0]))


def _grad_norms(tree):
  return {name: float(sum(jnp.sum(jnp.abs(x)) for x in jax.tree.leaves(sub)))
          for name, sub in tree.items()}


def test_gradients_reach_the_question_tower_and_not_a_frozen_document_tower(store, vocab,
                                                                             block_emb, params):
  # No dropout: the same gradient paths, a much cheaper compilation.
  untied = CONFIG.replace(share_embedders=False, **{"bert.hidden_dropout": 0.0,
                                                    "bert.attention_dropout": 0.0})
  frozen = open_qa_model.OpenQAModel(untied, reader_beam=2)
  # Untied towers that start equal, as when fine-tuning starts from a tied checkpoint.
  tower = params["retriever"]["embedder"]
  params = {"retriever": {"query_embedder": tower, "document_embedder": tower},
            "reader": params["reader"]}
  assert jax.tree.structure(params) == jax.tree.structure(
      jax.eval_shape(frozen.init, jax.random.PRNGKey(0)))
  batch = qa_batches.model_inputs(_batch(store, vocab, block_emb, document_beam=2))

  def grads(model):
    def loss(params):
      # The training loss, plus the scores and embeddings it used (one compilation each).
      question_emb = model.embed_questions(params, batch)
      document_emb = RealmRetriever(untied).apply(
          {"params": params["retriever"]}, batch["document_ids"], batch["document_type_ids"],
          batch["document_mask"], method=RealmRetriever.embed_documents)
      scores = model.retrieval_scores(params, batch, question_emb)
      return model.loss_fn(params, batch, jax.random.PRNGKey(4))[0], (
          question_emb, scores, document_emb)

    return jax.jit(jax.grad(loss, has_aux=True))(params)

  g, _ = grads(frozen)
  retriever = _grad_norms(g["retriever"])
  assert retriever["query_embedder"] > 0 and retriever["document_embedder"] == 0
  assert _grad_norms(g)["reader"] > 0

  live = open_qa_model.OpenQAModel(untied, reader_beam=2, train_document_tower=True)
  assert live.num_reembedded == 2
  g, (question_emb, scores, document_emb) = grads(live)
  retriever = _grad_norms(g["retriever"])
  assert retriever["query_embedder"] > 0 and retriever["document_embedder"] > 0
  # The first document_beam scores come from the live document tower, the rest from the index.
  np.testing.assert_allclose(scores[:, :2], np.einsum("qp,qkp->qk", question_emb, document_emb),
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(scores[:, 2:], np.einsum("qp,qkp->qk", question_emb,
                                                      batch["retrieved_block_emb"][:, 2:]),
                             rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="document_beam"):
    live.retrieval_scores(params, qa_batches.model_inputs(_batch(store, vocab, block_emb)),
                          question_emb)


def test_hf_open_qa_params_fit_the_model(model, params):
  tree = open_qa_model.params_from_hf_open_qa({"query_embedder": params["retriever"]["embedder"],
                                               "reader": params["reader"]})
  assert jax.tree.structure(tree) == jax.tree.structure(params)
  axes = model.logical_axes()
  assert jax.tree.structure(axes, is_leaf=lambda x: isinstance(x, P)) == \
      jax.tree.structure(params)


def test_reader_rows_cut_to_a_length_bucket_change_no_loss_logit_or_prediction(store, vocab,
                                                                               block_emb, model,
                                                                               params):
  """Fine-tuning's reader rows cut as `FinetuneJob.length_bucket` cuts them, against the padded
  rows as the reference: the same losses, metrics and gradients, the same joint logit for every
  span of the cut rows, the same prediction; a cut into a real token changes the losses."""
  from realm_jax.batches import seqio_batches  # pylint: disable=import-outside-toplevel
  from realm_jax.index import builder  # pylint: disable=import-outside-toplevel
  examples = [QAExample("who founded tessavar?", ("Zoë Müller",)),
              QAExample("when did the eiffel tower open?", ("1889",)),
              QAExample("who founded tessavar?", ("Paris",))]
  padded = qa_batches.model_inputs(qa_batches.build_open_qa_batch(
      store, examples, np.array([(0, 3, 1), (2, 1, 0), (3, 0, 2)]), vocab=vocab, reader_beam=2,
      reader_len=64, block_emb=block_emb, question_len=16, max_occurrences=8))
  longest = int(padded["reader_mask"].sum(axis=-1).max())
  width = builder.bucket_width(padded["reader_mask"], 8)
  assert longest <= width < 64
  cut = seqio_batches.cut_rows(padded, qa_batches.READER_ROW_KEYS, width)
  assert cut["reader_block_mask"].shape == (3, 2, width)

  @jax.jit
  def run(p, batch):
    aux = model.eval_fn(p, batch)
    grads = jax.grad(lambda q: model.eval_fn(q, batch)["loss_sum"])(p)
    return aux, grads, model.forward(p, batch)[1], model.predict_batch(p, batch)

  # Weights of std 0.5: a token more or less moves the span logits far beyond the tolerance.
  rng = np.random.default_rng(3)
  params = jax.tree.map(lambda x: rng.normal(0, 0.5, x.shape).astype(x.dtype), params)
  reference_aux, reference_grads, reference_logits, reference_prediction = run(params, padded)
  aux, grads, logits, prediction = run(params, cut)
  assert float(reference_aux["reader_loss_sum"]) > 0
  for key in reference_aux:
    np.testing.assert_allclose(aux[key], reference_aux[key], rtol=1e-5, atol=1e-5, err_msg=key)
  for got, reference in zip(jax.tree.leaves(grads), jax.tree.leaves(reference_grads)):
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-6)
  # [Q, reader_beam, spans]: every span of the cut rows is a span of the padded ones; the ones
  # inside a block (the others have `invalid_span_logit`, -10000, added) have the same logit.
  full_index = {span: i for i, span in enumerate(zip(*enumerate_spans(64, CONFIG.max_span_width)))}
  same = [full_index[span] for span in zip(*enumerate_spans(width, CONFIG.max_span_width))]
  reference_logits = np.asarray(reference_logits)
  valid = reference_logits[..., same] > -5000
  assert valid.any() and np.array_equal(np.asarray(logits) > -5000, valid)
  np.testing.assert_allclose(np.asarray(logits)[valid], reference_logits[..., same][valid],
                             rtol=1e-5, atol=1e-5)
  for key in ("block_index", "start", "end", "block_id"):
    np.testing.assert_array_equal(prediction[key], reference_prediction[key], err_msg=key)
  np.testing.assert_allclose(prediction["logit"], reference_prediction["logit"], rtol=1e-5)
  # The comparison can fail: one position less drops the longest row's final [SEP], and its
  # spans' logits move by over 100 times the tolerance.
  too_short = seqio_batches.cut_rows(padded, qa_batches.READER_ROW_KEYS, longest - 1)
  kept = [full_index[span]
          for span in zip(*enumerate_spans(longest - 1, CONFIG.max_span_width))]
  valid = reference_logits[..., kept] > -5000
  moved = np.asarray(run(params, too_short)[2])[valid] - reference_logits[..., kept][valid]
  assert np.abs(moved).max() > 1e-3
