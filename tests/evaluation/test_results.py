"""results.write: the files and the summary line every mode of `python -m realm_jax.evaluate`
leaves, under the run directory or at an output path."""

import json

import pytest

from realm_jax.evaluation import results

PREDICTIONS = [{"question": "Who?", "prediction": "Ann", "answers": ["Ann"], "correct": True},
               {"correct": False, "prediction": "Rome", "question": "Where?", "answers": ["Ostia"]}]


def _result(predictions=None):
  mode = "qa" if predictions is not None else "bm25"
  return results.Result(mode, results.file_stem(mode, "toy_qa", "test", 7),
                        {"run_dir": "/runs/x", "task": "toy_qa", "split": "test"},
                        {"exact_match": 0.5, "recall@5": 0.25, "num_questions": 2},
                        "toy_qa/test, checkpoint step 7 (latest)", predictions)


def test_file_stems_name_the_task_split_and_checkpoint_or_index():
  assert results.file_stem("qa", "toy_qa", "test", 7) == "toy_qa_test_step7"
  assert results.file_stem("retrieval", "ict_toy", "train", 0) == "ict_toy_train_retrieval_index0"
  assert results.file_stem("bm25", "toy_qa", "dev") == "toy_qa_dev_bm25"
  assert results.output_paths(None, "/runs/x", "s") == ("/runs/x/predictions/s.jsonl",
                                                       "/runs/x/predictions/s.metrics.json")
  assert results.output_paths("/tmp/out.jsonl", None, "s") == ("/tmp/out.jsonl",
                                                              "/tmp/out.metrics.json")


def test_predictions_and_metrics_under_the_run_directory(tmp_path, capsys):
  run_dir = tmp_path / "run"
  path = results.write(_result(PREDICTIONS), None, str(run_dir))
  predictions = run_dir / "predictions" / "toy_qa_test_step7.jsonl"
  assert path == str(run_dir / "predictions" / "toy_qa_test_step7.metrics.json")
  saved = json.loads((run_dir / "predictions" / "toy_qa_test_step7.metrics.json").read_text())
  assert saved == {"mode": "qa", "run_dir": "/runs/x", "task": "toy_qa", "split": "test",
                   "predictions": str(predictions),
                   "metrics": {"exact_match": 0.5, "recall@5": 0.25, "num_questions": 2}}
  records = [json.loads(line) for line in predictions.read_text().splitlines()]
  assert [list(r)[:2] for r in records] == [["question", "prediction"]] * 2
  assert records[1] == PREDICTIONS[1]
  assert capsys.readouterr().out.splitlines() == [
      f"evaluate: toy_qa/test, checkpoint step 7 (latest): exact_match 0.5000, recall@5 0.2500, "
      f"num_questions 2; predictions {predictions}, metrics {path}"]
  assert not list(run_dir.rglob("*.tmp-*"))


def test_metrics_alone_at_an_output_path(tmp_path, capsys):
  output = str(tmp_path / "bm25.jsonl")
  path = results.write(_result(), output, None)
  assert path == str(tmp_path / "bm25.metrics.json")
  assert not (tmp_path / "bm25.jsonl").exists()
  saved = json.loads((tmp_path / "bm25.metrics.json").read_text())
  assert saved["mode"] == "bm25" and "predictions" not in saved
  assert capsys.readouterr().out.endswith(f"num_questions 2; metrics {path}\n")


def test_a_prediction_without_its_text_writes_nothing(tmp_path):
  with pytest.raises(ValueError, match="prediction 0 lacks"):
    results.write(_result([{"question": "Who?"}]), None, str(tmp_path))
  assert not list(tmp_path.rglob("*.json*"))
