"""Tests for realm_jax.data.qa_datasets: readers, ORQA's re-split, the benchmark registry.

Expected values are written by hand, except the re-split, which is compared with direct calls of
the TF op ORQA uses (that op *is* the specification).
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from realm_jax.data import qa_datasets


def write_bytes(path, data: bytes) -> str:
  with open(path, "wb") as f:
    f.write(data)
  return str(path)


def write_jsonl(path, records) -> str:
  lines = [json.dumps(r, ensure_ascii=False) for r in records]
  return write_bytes(path, ("\n".join(lines) + "\n").encode("utf-8"))


def orqa_reference_is_dev(question: str) -> bool:
  """ORQA's create_data_splits.py rule, one scalar call per question."""
  return int(tf.strings.to_hash_bucket_fast(question, 100000).numpy()) % 10 == 0


# ----------------------------------------------------------------------------------------------
# read_orqa_jsonl: good input.
# ----------------------------------------------------------------------------------------------


def test_read_orqa_jsonl_reads_records_in_order(tmp_path):
  path = write_bytes(
      tmp_path / "qa.jsonl",
      b'\xef\xbb\xbf{"question": "who wrote hamlet", "answer": ["Shakespeare"]}\r\n'
      b"\n"
      b"   \n"
      b'{"question": "caf\xc3\xa9 ?", "answer": ["a", "b"], "id": 7}\n')
  examples = qa_datasets.read_orqa_jsonl(path)
  assert examples == [
      qa_datasets.QAExample("who wrote hamlet", ("Shakespeare",), False, f"{path}:1"),
      # Blank lines 2-3 are skipped but still counted; the extra "id" field is ignored.
      qa_datasets.QAExample("café ?", ("a", "b"), False, f"{path}:4"),
  ]
  regex_examples = qa_datasets.read_orqa_jsonl(path, answers_are_regex=True)
  assert all(ex.answers_are_regex for ex in regex_examples)


def test_question_is_kept_verbatim(tmp_path):
  # The re-split hashes the exact question, so surrounding spaces must survive.
  path = write_jsonl(tmp_path / "qa.jsonl", [{"question": " spaced ", "answer": ["x"]}])
  assert qa_datasets.read_orqa_jsonl(path)[0].question == " spaced "


def test_qa_example_rejects_a_bare_string_as_answers():
  with pytest.raises(TypeError, match="sequence of str"):
    qa_datasets.QAExample("q", "Paris")
  assert qa_datasets.QAExample("q", ["a", "b"]).answers == ("a", "b")


# ----------------------------------------------------------------------------------------------
# read_orqa_jsonl: bad input, each named by file, line and field.
# ----------------------------------------------------------------------------------------------

GOOD_LINE = b'{"question": "q1", "answer": ["a1"]}\n'


@pytest.mark.parametrize(
    "bad_line, field, reason, fragment",
    [
        (b'{"question": "q2", "answer": ["a2"]\n', "line", "malformed_json", "malformed JSON"),
        (b'{"question": "q2"}\n', "answer", "missing_field", "'answer' is missing"),
        (b'{"answer": ["a2"]}\n', "question", "missing_field", "'question' is missing"),
        (b'{"question": "q2", "answer": []}\n', "answer", "empty_answers", "empty"),
        (b'{"question": "q2", "answer": "a2"}\n', "answer", "wrong_type", "list of strings"),
        (b'{"question": "q2", "answer": ["a2", 3]}\n', "answer[1]", "wrong_type", "got int"),
        (b'{"question": 17, "answer": ["a2"]}\n', "question", "wrong_type", "got int"),
        (b'{"question": "  ", "answer": ["a2"]}\n', "question", "empty_question", "empty"),
        (b'{"question": "q2", "answer": ["ok", " "]}\n', "answer[1]", "blank_answer", "blank"),
        (b'["q2", ["a2"]]\n', "line", "not_an_object", "JSON object"),
        (b'{"question": "q\xff2", "answer": ["a2"]}\n', "line", "not_utf8", "not valid UTF-8"),
        (b'{"question": "q\\ud800", "answer": ["a2"]}\n', "question", "not_utf8", "surrogate"),
    ],
)
def test_read_orqa_jsonl_bad_line_names_file_line_and_field(tmp_path, bad_line, field, reason,
                                                            fragment):
  path = write_bytes(tmp_path / "bad.jsonl", GOOD_LINE + bad_line + GOOD_LINE)
  with pytest.raises(qa_datasets.QADataError) as info:
    qa_datasets.read_orqa_jsonl(path)
  error = info.value
  assert isinstance(error, ValueError)
  message = str(error)
  assert message.startswith(f"{path}:2: "), message
  assert fragment in message
  if field != "line":
    assert f"'{field}'" in message
  assert (error.path, error.line, error.field, error.reason) == (path, 2, field, reason)


def test_missing_answer_field_hints_at_answers_spelling(tmp_path):
  path = write_bytes(tmp_path / "bad.jsonl", b'{"question": "q", "answers": ["a"]}\n')
  with pytest.raises(qa_datasets.QADataError, match="found 'answers'"):
    qa_datasets.read_orqa_jsonl(path)


def test_read_orqa_jsonl_skip_mode_counts_bad_lines(tmp_path):
  path = write_bytes(
      tmp_path / "mixed.jsonl",
      GOOD_LINE                                      # line 1: good
      + b'{"question": "q", "answer": [}\n'          # line 2: malformed_json
      + b'{"question": "q"}\n'                       # line 3: missing_field
      + b'{"question": "q", "answer": []}\n'         # line 4: empty_answers
      + b'{"question": "\xc3\x28", "answer": ["a"]}\n'  # line 5: not_utf8
      + b'{"question": "q", "answer": [1]}\n'        # line 6: wrong_type
      + b'{"question": "q", "answer": []}\n'         # line 7: empty_answers
      + b'{"question": "last", "answer": ["z"]}\n')  # line 8: good
  examples, report = qa_datasets.read_orqa_jsonl(path, on_error="skip", max_reported=3)
  assert [ex.question for ex in examples] == ["q1", "last"]
  assert [ex.source for ex in examples] == [f"{path}:1", f"{path}:8"]
  assert dict(report.counts) == {"malformed_json": 1, "missing_field": 1, "empty_answers": 2,
                                 "not_utf8": 1, "wrong_type": 1}
  assert report.num_skipped == 6
  assert report.num_kept == 2
  assert len(report.examples) == 3
  assert [e.split(": ")[0] for e in report.examples] == [f"{path}:2", f"{path}:3", f"{path}:4"]
  assert "skipped 6" in report.summary()


def test_on_error_must_be_raise_or_skip(tmp_path):
  path = write_bytes(tmp_path / "ok.jsonl", GOOD_LINE)
  with pytest.raises(ValueError, match="on_error"):
    qa_datasets.read_orqa_jsonl(path, on_error="ignore")


# ----------------------------------------------------------------------------------------------
# read_dpr_csv.
# ----------------------------------------------------------------------------------------------


def test_read_dpr_csv_list_literal_with_quotes_and_commas(tmp_path):
  path = write_bytes(
      tmp_path / "qa.csv",
      "who wrote \"long day's journey\"?\t['Eugene O\\'Neill', \"O'Neill, Eugene\"]\n"
      "capital of france\t[\"Paris\"]\n".encode("utf-8"))
  examples = qa_datasets.read_dpr_csv(path)
  assert examples == [
      qa_datasets.QAExample("who wrote \"long day's journey\"?",
                            ("Eugene O'Neill", "O'Neill, Eugene"), False, f"{path}:1"),
      qa_datasets.QAExample("capital of france", ("Paris",), False, f"{path}:2"),
  ]


def test_read_dpr_csv_never_executes_the_answer_column(tmp_path, monkeypatch):
  marker = tmp_path / "PWNED"
  calls = []
  monkeypatch.setattr(os, "system", lambda command: calls.append(command))
  path = write_bytes(
      tmp_path / "evil.csv",
      f"q\t__import__('os').system('touch {marker}')\n".encode("utf-8"))
  with pytest.raises(ValueError) as info:
    qa_datasets.read_dpr_csv(path)
  assert isinstance(info.value, qa_datasets.QADataError)
  assert str(info.value).startswith(f"{path}:1: field 'answers'")
  assert info.value.reason == "bad_answer_literal"
  assert calls == [] and not marker.exists()


@pytest.mark.parametrize(
    "line, field, reason",
    [
        (b"q\t['a']\textra\n", "line", "wrong_column_count"),
        (b"no tab here\n", "line", "wrong_column_count"),
        (b"q\t'Paris'\n", "answers", "wrong_type"),
        (b"q\t[1, 2]\n", "answers[0]", "wrong_type"),
        (b"q\t[]\n", "answers", "empty_answers"),
        (b"q\t['unclosed\n", "answers", "bad_answer_literal"),
        (b"q\t['caf\xe9']\n", "line", "not_utf8"),  # Latin-1 byte, not UTF-8
    ],
)
def test_read_dpr_csv_bad_lines(tmp_path, line, field, reason):
  path = write_bytes(tmp_path / "bad.csv", b"good\t['x']\n" + line)
  with pytest.raises(qa_datasets.QADataError) as info:
    qa_datasets.read_dpr_csv(path)
  assert str(info.value).startswith(f"{path}:2: ")
  assert (info.value.line, info.value.field, info.value.reason) == (2, field, reason)
  examples, report = qa_datasets.read_dpr_csv(path, on_error="skip")
  assert [ex.question for ex in examples] == ["good"]
  assert dict(report.counts) == {reason: 1}


# ----------------------------------------------------------------------------------------------
# ORQA's re-split.
# ----------------------------------------------------------------------------------------------

RESPLIT_QUESTIONS = (
    ["", " ", "who wrote hamlet?", "Who wrote Hamlet?", "who wrote hamlet? ", "Café?",
     "Cafe\u0301?", "日本の首都はどこですか", "¿Dónde está?", "emoji 😀 question",
     "tab\tinside", "new\nline", "quote \" and \\ backslash", "null\x00byte"]
    + [f"what is question number {i} about?" for i in range(186)])


def test_orqa_dev_bucket_equals_the_tf_op():
  assert len(RESPLIT_QUESTIONS) == 200
  expected = [orqa_reference_is_dev(q) for q in RESPLIT_QUESTIONS]
  assert [qa_datasets.is_orqa_dev(q) for q in RESPLIT_QUESTIONS] == expected
  assert qa_datasets.orqa_dev_mask(RESPLIT_QUESTIONS).tolist() == expected
  buckets = qa_datasets.orqa_dev_bucket(RESPLIT_QUESTIONS)
  assert buckets.dtype == np.int64 and buckets.shape == (200,)
  assert buckets.tolist() == [
      int(tf.strings.to_hash_bucket_fast(q, 100000).numpy()) % 10 for q in RESPLIT_QUESTIONS]


def test_orqa_hash_values_are_pinned():
  # Recorded from TF 2.20 (FarmHash Fingerprint64 % 100000). TF guarantees the fingerprint is
  # stable; if this ever changes, every ORQA split computed with it changes.
  values = [int(tf.strings.to_hash_bucket_fast(q, 100000).numpy())
            for q in ["", "who wrote hamlet?", "Café?", "what is the capital of france"]]
  assert values == [97263, 60799, 6588, 44781]
  assert qa_datasets.orqa_dev_bucket(["", "who wrote hamlet?", "Café?"]).tolist() == [3, 9, 8]


def test_resplit_of_synthetic_questions_is_about_ten_percent_and_keeps_order():
  examples = [qa_datasets.QAExample(f"synthetic question number {i}?", ("a",)) for i in range(500)]
  train, dev = qa_datasets.resplit(examples)
  # Deterministic: 53 of 500 land in dev (expected ~50; binomial sd ~6.7).
  assert len(dev) == 53
  assert len(train) == 447
  assert all(orqa_reference_is_dev(ex.question) for ex in dev[:10])
  assert not any(orqa_reference_is_dev(ex.question) for ex in train[:10])
  assert train == [ex for ex in examples if ex not in dev]  # order preserved, a partition
  assert dev == sorted(dev, key=examples.index)


def test_resplit_edge_cases():
  assert qa_datasets.resplit([]) == ([], [])
  assert qa_datasets.orqa_dev_bucket([]).shape == (0,)
  with pytest.raises(TypeError):
    qa_datasets.orqa_dev_bucket("a single string")


@pytest.mark.parametrize(
    "answer, max_tokens, keep",
    [
        ("Barack Obama", 5, True),
        ("one two three four five", 5, True),
        ("one two three four five six", 5, False),
        ("  spaced \t out  ", 5, True),  # 2 whitespace tokens
        ("", 5, False),
        ("a b c", 2, False),
    ],
)
def test_nq_open_keep_answer(answer, max_tokens, keep):
  assert qa_datasets.nq_open_keep_answer(answer, max_tokens=max_tokens) is keep


# ----------------------------------------------------------------------------------------------
# The registry and load_benchmark.
# ----------------------------------------------------------------------------------------------


def test_benchmark_registry():
  sizes = {name: dict(spec.split_sizes) for name, spec in qa_datasets.BENCHMARKS.items()}
  assert sizes == {
      "nq_open": {"train": 79168, "dev": 8757, "test": 3610},
      "web_questions": {"train": 3417, "dev": 361, "test": 2032},
      "curated_trec": {"train": 1353, "dev": 133, "test": 694},
  }
  assert {n: s.answers_are_regex for n, s in qa_datasets.BENCHMARKS.items()} == {
      "nq_open": False, "web_questions": False, "curated_trec": True}


def test_load_benchmark_presplit_layout(tmp_path):
  for split, n in [("train", 3), ("dev", 2), ("test", 1)]:
    write_jsonl(tmp_path / f"{split}.jsonl",
                [{"question": f"{split} q{i}", "answer": [f"a{i}"]} for i in range(n)])
  splits = qa_datasets.load_benchmark("nq_open", str(tmp_path), check_sizes=False)
  # Already split: no re-split, the files are taken as they are.
  assert {k: [ex.question for ex in v] for k, v in splits.items()} == {
      "train": ["train q0", "train q1", "train q2"], "dev": ["dev q0", "dev q1"],
      "test": ["test q0"]}


def test_load_benchmark_original_layout_resplits_train(tmp_path):
  questions = [f"web question {i}?" for i in range(40)]
  write_jsonl(tmp_path / "WebQuestions-train.txt",
              [{"question": q, "answer": ["x"]} for q in questions])
  write_jsonl(tmp_path / "WebQuestions-test.txt",
              [{"question": "test q", "answer": ["y"]}])
  splits = qa_datasets.load_benchmark("web_questions", str(tmp_path), check_sizes=False)
  expected_dev = [q for q in questions if orqa_reference_is_dev(q)]
  assert [ex.question for ex in splits["dev"]] == expected_dev
  assert [ex.question for ex in splits["train"]] == [q for q in questions
                                                      if q not in expected_dev]
  assert [ex.question for ex in splits["test"]] == ["test q"]

  with pytest.raises(qa_datasets.SplitSizeError) as info:
    qa_datasets.load_benchmark("web_questions", str(tmp_path))
  message = str(info.value)
  assert "benchmark 'web_questions'" in message
  assert f"split 'train': expected 3417, found {40 - len(expected_dev)}" in message
  assert f"split 'dev': expected 361, found {len(expected_dev)}" in message
  assert "split 'test': expected 2032, found 1" in message
  assert "WebQuestions-train.txt" in message and "check_sizes=False" in message


def test_load_benchmark_curated_trec_with_dpr_test_csv(tmp_path):
  write_jsonl(tmp_path / "CuratedTrec-train.txt",
              [{"question": f"trec {i}", "answer": ["19[89]0"]} for i in range(5)])
  write_bytes(tmp_path / "curatedtrec-test.qa.csv", b"when?\t['1990|1991']\n")
  splits = qa_datasets.load_benchmark("curated_trec", str(tmp_path), check_sizes=False)
  assert len(splits["train"]) + len(splits["dev"]) == 5
  assert splits["test"] == [qa_datasets.QAExample(
      "when?", ("1990|1991",), True, str(tmp_path / "curatedtrec-test.qa.csv") + ":1")]
  assert all(ex.answers_are_regex for split in splits.values() for ex in split)


def test_load_benchmark_missing_and_incomplete_layouts(tmp_path):
  with pytest.raises(FileNotFoundError, match="no training or test file"):
    qa_datasets.load_benchmark("nq_open", str(tmp_path), check_sizes=False)
  write_jsonl(tmp_path / "NQ-open.train.jsonl", [{"question": "q", "answer": ["a"]}])
  with pytest.raises(FileNotFoundError, match="NQ-open.dev.jsonl"):
    qa_datasets.load_benchmark("nq_open", str(tmp_path), check_sizes=False)
  write_jsonl(tmp_path / "train.jsonl", [{"question": "q", "answer": ["a"]}])
  with pytest.raises(qa_datasets.QADataError, match=r"\['dev.jsonl', 'test.jsonl'\] is missing"):
    qa_datasets.load_benchmark("nq_open", str(tmp_path), check_sizes=False)
  with pytest.raises(ValueError, match="unknown benchmark 'trivia_qa'"):
    qa_datasets.load_benchmark("trivia_qa", str(tmp_path))


def test_load_benchmark_skip_mode_merges_reports(tmp_path):
  write_bytes(tmp_path / "train.jsonl", GOOD_LINE + b'{"question": "q"}\n')
  write_bytes(tmp_path / "dev.jsonl", GOOD_LINE)
  write_bytes(tmp_path / "test.jsonl", b"not json\n" + GOOD_LINE)
  splits, report = qa_datasets.load_benchmark("web_questions", str(tmp_path), check_sizes=False,
                                              on_error="skip")
  assert {k: len(v) for k, v in splits.items()} == {"train": 1, "dev": 1, "test": 1}
  assert dict(report.counts) == {"missing_field": 1, "malformed_json": 1}
  assert report.num_kept == 3
  with pytest.raises(qa_datasets.QADataError, match=r"train.jsonl:2: field 'answer'"):
    qa_datasets.load_benchmark("web_questions", str(tmp_path), check_sizes=False)


# ----------------------------------------------------------------------------------------------
# TFDS (mocked: no network, no prepared data).
# ----------------------------------------------------------------------------------------------


def test_from_tfds_with_mock_data():
  import tensorflow_datasets as tfds  # noqa: PLC0415
  questions = [f"tfds question {i}" for i in range(30)]

  def as_dataset_fn(builder, split, *args, **kwargs):
    del args, kwargs
    answer_key = "answer" if builder.name == "natural_questions_open" else "answers"
    if split == "train":
      qs, answers = questions, [[f"a{i}", f"b{i}"] for i in range(30)]
    else:
      qs, answers = ["held out"], [["z"]]
    return tf.data.Dataset.from_tensor_slices(
        {"question": qs, answer_key: tf.ragged.constant(answers)})

  with tfds.testing.mock_data(as_dataset_fn=as_dataset_fn):
    train = qa_datasets.from_tfds("nq_open", "train")
    assert train[3] == qa_datasets.QAExample(
        "tfds question 3", ("a3", "b3"), False, "tfds:natural_questions_open/train:3")
    web = qa_datasets.from_tfds("web_questions", "test")
    assert web == [qa_datasets.QAExample("held out", ("z",), False, "tfds:web_questions/test:0")]
    splits = qa_datasets.load_benchmark_from_tfds("nq_open", check_sizes=False)
    expected_dev = [q for q in questions if orqa_reference_is_dev(q)]
    assert [ex.question for ex in splits["dev"]] == expected_dev
    assert len(splits["train"]) == 30 - len(expected_dev)
    assert [ex.question for ex in splits["test"]] == ["held out"]
    with pytest.raises(qa_datasets.SplitSizeError, match="expected 79168"):
      qa_datasets.load_benchmark_from_tfds("nq_open")
  with pytest.raises(ValueError, match="no TFDS builder"):
    qa_datasets.load_benchmark_from_tfds("curated_trec")
