"""qa.evaluate / answer_question / results.write_predictions_jsonl on a toy corpus whose
retrieval and reader are rigged, so exact match and recall are known by hand."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.data import vocab as vocab_lib
from realm_jax.data.qa_datasets import QAExample
from realm_jax.batches import qa_batches
from realm_jax.evaluation import qa as qa_lib
from realm_jax.evaluation import results as results_lib
from realm_jax.index.search import ExactSearcher
from realm_jax.models import config as model_config
from realm_jax.models import open_qa_model

CONFIG = model_config.RealmConfig(bert=model_config.tiny_bert(num_layers=1), proj_size=16,
                                  span_hidden_size=16)
DOCS = [("France", "Paris is the capital of France."),
        ("Italy", "Rome is the capital of Italy."),
        ("England", "London is the capital of England."),
        ("Germany", "Berlin is the capital of Germany.")]
# Question embeddings: component i is the score of block i (the index rows are one-hot).
QUESTIONS = {
    "What is the capital of France?": [4.0, 3.0, 2.0, 1.0],  # ranks 0, 1, 2, 3
    "What is the capital of Italy?": [3.0, 2.0, 4.0, 1.0],  # ranks 2, 0, 1, 3: Rome third
    "What is the capital of Spain?": [1.0, 2.0, 3.0, 4.0],  # Madrid is nowhere
}
READER_LEN = 24
KS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  directory = tmp_path_factory.mktemp("evaluate_store")
  path = directory / "docs.jsonl"
  path.write_text("".join(json.dumps({"title": t, "text": x}) + "\n" for t, x in DOCS))
  corpus_build.build_block_store(sources_lib.JsonlSource(str(path)), str(directory / "store"),
                                 max_block_len=32)
  with block_store_lib.BlockStore.open(str(directory / "store")) as opened:
    yield opened


@pytest.fixture(scope="module")
def model():
  return open_qa_model.OpenQAModel(CONFIG, reader_beam=2)


@pytest.fixture(scope="module")
def rigged_params(model):
  """A span scorer whose every valid span has logit 0: the joint logit is the block's
  retrieval score and ties go to the first span (width-major), so the prediction is the first
  word of the best-scoring block."""
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  head = params["reader"]["span_head"]
  head["output"] = jax.tree.map(jnp.zeros_like, head["output"])
  return params


@pytest.fixture(scope="module")
def index():
  block_emb = np.zeros((len(DOCS), 16), np.float32)
  block_emb[np.arange(len(DOCS)), np.arange(len(DOCS))] = 1.0
  searcher = ExactSearcher(block_emb, mesh=Mesh(np.array(jax.devices()[:1]), ("docs",)))
  return block_emb, searcher


def embed_fn(questions):
  emb = np.zeros((len(questions), 16), np.float32)
  for i, question in enumerate(questions):
    emb[i, :4] = QUESTIONS[question]
  return emb


def _examples(regex=False):
  answers = ([r"Par[a-z]+"], [r"Rom."], [r"Madrid"]) if regex else (
      ["Paris"], ["Rome", "Roma"], ["Madrid"])
  return [QAExample(q, tuple(a), answers_are_regex=regex, source=f"test:{i}")
          for i, (q, a) in enumerate(zip(QUESTIONS, answers))]


@pytest.mark.parametrize("regex", [False, True])
def test_rigged_exact_match_and_recall(store, model, rigged_params, index, regex):
  _, searcher = index
  # batch_size 2: the second batch holds one question and one padding copy.
  results, predictions = qa_lib.evaluate(
      model, rigged_params, _examples(regex), searcher=searcher, store=store, batch_size=2,
      k_values=KS, embed_fn=embed_fn, reader_len=READER_LEN, question_len=16)
  name = "regex_match" if regex else "exact_match"
  assert results == {name: pytest.approx(1 / 3), "recall@1": pytest.approx(1 / 3),
                     "recall@2": pytest.approx(1 / 3), "recall@3": pytest.approx(2 / 3),
                     "recall@4": pytest.approx(2 / 3), "num_questions": 3,
                     "skipped_questions": 0, **({"invalid_answer_patterns": 0} if regex else {})}
  assert [p["prediction"] for p in predictions] == ["Paris", "London", "Berlin"]
  assert [p["correct"] for p in predictions] == [True, False, False]
  assert [p["block_ids"] for p in predictions] == [[0, 1], [2, 0], [3, 2]]
  assert predictions[1]["block_scores"] == [4.0, 3.0]
  assert [p["predicted_block_id"] for p in predictions] == [0, 2, 3]
  assert predictions[0]["question"] == "What is the capital of France?"
  assert predictions[1]["answers"] == (["Rom."] if regex else ["Rome", "Roma"])


def test_an_invalid_answer_pattern_is_a_counted_and_reported_miss(store, model, rigged_params,
                                                                   index, caplog):
  _, searcher = index
  examples = _examples(regex=True)
  # "Par[" does not compile; "Par.s" would have matched the prediction "Paris".
  examples[0] = dataclasses.replace(examples[0], answers=("Par[", "Rome("))
  results, predictions = qa_lib.evaluate(
      model, rigged_params, examples, searcher=searcher, store=store, batch_size=2,
      k_values=KS, embed_fn=embed_fn, reader_len=READER_LEN, question_len=16)
  assert predictions[0]["prediction"] == "Paris" and not predictions[0]["correct"]
  assert results["regex_match"] == 0.0 and results["invalid_answer_patterns"] == 2
  assert "2 answer pattern(s) are not valid regular expressions" in caplog.text
  assert "'Par['" in caplog.text


def test_recall_by_orqa_substring_label_is_case_sensitive(store, model, rigged_params, index):
  _, searcher = index
  lower = [QAExample("What is the capital of France?", ("paris",))]
  kwargs = dict(searcher=searcher, store=store, batch_size=2, k_values=(1,),
                embed_fn=embed_fn, reader_len=READER_LEN, question_len=16)
  results, _ = qa_lib.evaluate(model, rigged_params, lower, **kwargs)
  assert results["recall@1"] == 1.0 and results["exact_match"] == 1.0  # DPR's uncased match
  results, _ = qa_lib.evaluate(model, rigged_params, lower, recall_match="substring",
                               **kwargs)
  assert results["recall@1"] == 0.0  # ORQA's label: "paris" is not a substring of "Paris ..."


def test_a_question_too_long_to_read_is_skipped_counted_and_scored_as_a_miss(
    store, model, rigged_params, index):
  _, searcher = index
  too_long = QAExample("why " * 20 + "?", ("Paris",), source="dev.jsonl:7")
  lines = []
  results, predictions = qa_lib.evaluate(
      model, rigged_params, [too_long] + _examples(), searcher=searcher, store=store,
      batch_size=2, k_values=KS, embed_fn=embed_fn, reader_len=READER_LEN, question_len=16,
      progress=lines.append)
  assert results["skipped_questions"] == 1 and results["num_questions"] == 4
  assert results["exact_match"] == pytest.approx(1 / 4)  # the skipped question is a miss
  assert results["recall@3"] == pytest.approx(2 / 4)
  assert predictions[0]["prediction"] == "" and "question_len=16" in predictions[0]["skipped"]
  assert [p["prediction"] for p in predictions[1:]] == ["Paris", "London", "Berlin"]
  assert lines[-1].startswith("questions 3/3 (100.0%) | ") and "ETA" in lines[-1]
  assert "| exact_match so far 0.3333 |" in lines[-1]


def test_predictions_jsonl_in_the_authors_format(store, model, rigged_params, index, tmp_path):
  _, searcher = index
  _, predictions = qa_lib.evaluate(
      model, rigged_params, _examples(), searcher=searcher, store=store, batch_size=4,
      k_values=KS, embed_fn=embed_fn, reader_len=READER_LEN, question_len=16)
  path = tmp_path / "out" / "predictions.jsonl"
  results_lib.write_predictions_jsonl(str(path), predictions)
  lines = path.read_text(encoding="utf-8").splitlines()
  assert len(lines) == 3
  records = [json.loads(line) for line in lines]
  assert list(records[0])[:2] == ["question", "prediction"]
  assert records[0]["question"] == "What is the capital of France?"
  assert records[0]["prediction"] == "Paris"
  assert records[2]["block_ids"] == [3, 2] and records[2]["block_scores"] == [4.0, 3.0]
  assert not list(tmp_path.glob("out/*.tmp-*"))
  with pytest.raises(ValueError, match="prediction 1 lacks"):
    results_lib.write_predictions_jsonl(str(path), [records[0], {"question": "q"}])
  assert path.read_text(encoding="utf-8").splitlines() == lines  # the old file is intact


def test_answer_question_returns_the_answer_and_its_evidence(store, model, rigged_params,
                                                              index):
  _, searcher = index
  result = qa_lib.answer_question(
      model, rigged_params, "What is the capital of Italy?", searcher=searcher, store=store,
      embed_fn=embed_fn, reader_len=READER_LEN, num_evidence=3)
  assert result["answer"] == "London" and result["block_id"] == 2
  assert result["score"] == pytest.approx(4.0)
  assert [e["title"] for e in result["evidence"]] == ["England", "France", "Italy"]
  assert [e["score"] for e in result["evidence"]] == [4.0, 3.0, 2.0]
  assert [e["has_prediction"] for e in result["evidence"]] == [True, False, False]
  assert result["evidence"][2]["snippet"] == "Rome is the capital of Italy."


def test_default_path_searches_with_the_models_question_tower(store, model, rigged_params):
  block_emb = np.random.default_rng(1).normal(size=(len(DOCS), 16)).astype(np.float32)
  # The default mesh: 4 blocks sharded over 8 devices (shard padding in the embeddings).
  searcher = ExactSearcher(block_emb)
  assert searcher.embeddings.shape[0] > len(DOCS)
  examples = _examples()
  results, predictions = qa_lib.evaluate(
      model, rigged_params, examples, searcher=searcher, store=store, batch_size=4,
      k_values=(2,), reader_len=READER_LEN, question_len=16)
  ids, mask, _ = qa_batches.question_arrays([e.question for e in examples],
                                         vocab_lib.default_vocabulary(), question_len=16)
  question_emb = np.asarray(jax.jit(model.embed_questions)(
      rigged_params, {"question_ids": ids, "question_mask": mask}))
  scores = question_emb @ block_emb.T  # [questions, blocks]
  for q, prediction in enumerate(predictions):
    expected = np.argsort(-scores[q])[:2]
    assert prediction["block_ids"] == expected.tolist()
    np.testing.assert_allclose(prediction["block_scores"], scores[q, expected], rtol=1e-4)
    # Rigged reader: the first word of the best block.
    assert prediction["prediction"] == DOCS[expected[0]][1].split()[0]
  assert results["num_questions"] == 3
  with pytest.raises(ValueError, match="another corpus"):
    qa_lib.evaluate(model, rigged_params, examples,
                    searcher=ExactSearcher(block_emb[:3]), store=store)


def test_reader_rows_cut_to_a_length_bucket_predict_as_full_rows(store, model, index,
                                                                  monkeypatch):
  """An untrained reader (its spans depend on every real token): rows cut to the batch's
  longest, rounded up to 8, give the predictions and scores of rows read at full width."""
  _, searcher = index
  params = jax.jit(model.init)(jax.random.PRNGKey(3))
  widths = []
  cut_rows = qa_lib.seqio_batches.cut_rows
  monkeypatch.setattr(qa_lib.seqio_batches, "cut_rows",
                      lambda batch, keys, width: widths.append(width) or cut_rows(batch, keys,
                                                                                  width))
  runs = [qa_lib.evaluate(model, params, _examples(), searcher=searcher, store=store,
                          batch_size=2, k_values=KS, embed_fn=embed_fn, reader_len=64,
                          question_len=16, length_bucket=bucket) for bucket in (0, 8)]
  assert widths and all(width < 64 and width % 8 == 0 for width in widths)
  (full_results, full), (cut_results, cut) = runs
  assert cut_results == full_results
  assert [p["prediction"] for p in cut] == [p["prediction"] for p in full]
  assert [p["predicted_block_id"] for p in cut] == [p["predicted_block_id"] for p in full]
