"""`python -m realm_jax.evaluate --released DIR`, in-process, against transformers: a tiny
random-weight `RealmForOpenQA` saved as the release is (`save_pretrained` of the model and of its
`RealmRetriever`), a handful of NQ-style questions under $REALM_JAX_QA_DATA, and transformers'
own predictions (`predicted_answer_ids`, decoded) as the reference for ours. One-line errors for
a bad directory, the dry run and the help."""

import json
import os

import numpy as np
import pytest
import torch
import transformers

from realm_jax import evaluate as entry
from realm_jax.data import vocab as vocab_lib
from realm_jax.data.answer_match import exact_match

NUM_BLOCKS = 300
NUM_QUESTIONS = 8
# Non-default prediction settings, so reading them from config.json is what the test checks.
HF_SETTINGS = dict(reader_beam_size=4, reader_seq_len=40, max_span_width=5)
WORDS = ("river city king war music film team school church island bridge tower queen army "
         "ocean garden empire novel album song battle castle forest village market temple "
         "harbor valley mountain desert lake palace museum theater railway station").split()
NAMES = ("Tessavar Orlando Mirela Kastov Paris Quintana Eldor Ravenna Oslo Zubin Nadia "
         "Brontë").split()


def _block_text(rng: np.random.Generator) -> str:
  """Two or three sentences of words and names (names keep their case, and some split into
  several wordpieces), 15 to 40 words: some rows overflow reader_seq_len, some do not."""
  sentences = []
  for _ in range(int(rng.integers(2, 4))):
    words = [str(rng.choice(NAMES)) if rng.random() < 0.25 else str(rng.choice(WORDS))
             for _ in range(int(rng.integers(5, 14)))]
    words.insert(int(rng.integers(0, len(words))), str(int(rng.integers(1800, 2000))))
    sentences.append(" ".join(words) + ".")
  return " ".join(sentences)


def _question(rng: np.random.Generator) -> str:
  words = " ".join(str(rng.choice(WORDS + NAMES)) for _ in range(int(rng.integers(2, 5))))
  return f"which {words} was first?"


def _randomize(model: torch.nn.Module, tokenizer) -> None:
  """Every parameter perturbed (biases and LayerNorm scales too), then random block embeddings
  without the direction all questions share: a random question tower maps every question near
  one vector, which would put the same blocks first for all of them."""
  generator = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=generator)
      p.copy_(1.0 + 0.1 * noise if name.endswith("LayerNorm.weight") else 0.2 * noise)
    model.eval()
    probes = [_question(np.random.default_rng(100 + i)) for i in range(64)]
    shared = model.embedder(**tokenizer(probes, return_tensors="pt", padding=True)
                            ).projected_score.mean(0)  # [proj]
    shared = shared / shared.norm()
    block_emb = torch.randn(model.block_emb.shape, generator=generator)  # [num_blocks, proj]
    model.block_emb.copy_(block_emb - (block_emb @ shared)[:, None] * shared[None, :])


def _block_text_of(directory, block_id: int) -> str:
  """A block's text as the released directory holds it."""
  return np.load(os.path.join(directory, "block_records.npy"),
                 allow_pickle=True)[block_id].decode("utf-8")


@pytest.fixture(scope="module")
def released(tmp_path_factory):
  """(the released directory, the questions, transformers' answers and block ids)."""
  directory = tmp_path_factory.mktemp("realm-orqa-tiny-openqa")
  rng = np.random.default_rng(0)
  records = np.array([_block_text(rng).encode("utf-8") for _ in range(NUM_BLOCKS)],
                     dtype=object)  # [num_blocks] bytes, as the release's block_records.npy
  tokenizer = transformers.RealmTokenizerFast(vocab_file=vocab_lib.bundled_vocab_path())
  config = transformers.RealmConfig(
      hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
      retriever_proj_size=16, span_hidden_size=16, max_position_embeddings=64,
      num_block_records=NUM_BLOCKS, **HF_SETTINGS)
  model = transformers.RealmForOpenQA(config, retriever=transformers.RealmRetriever(records,
                                                                                    tokenizer))
  _randomize(model, tokenizer)
  # The release's layout: pytorch_model.bin (the port's tied MLM biases refuse safetensors).
  model.save_pretrained(directory, safe_serialization=False)
  model.retriever.save_pretrained(directory)

  # The reference: transformers reads the directory back and answers one question at a time.
  retriever = transformers.RealmRetriever.from_pretrained(str(directory))
  reference = transformers.RealmForOpenQA.from_pretrained(str(directory), retriever=retriever)
  reference.eval()
  questions = [_question(rng) for _ in range(NUM_QUESTIONS)]
  answers, block_ids = [], []
  for question in questions:
    inputs = retriever.tokenizer([question], return_tensors="pt")
    with torch.no_grad():
      out = reference(**inputs, return_dict=True)
      question_emb = reference.embedder(**inputs).projected_score  # [1, proj]
      beam = torch.topk(question_emb @ reference.block_emb.T, k=config.reader_beam_size).indices
    answers.append(retriever.tokenizer.decode(out.predicted_answer_ids))
    block_ids.append(int(beam[0, int(out.reader_output.block_idx)]))
  return directory, questions, answers, block_ids, retriever.tokenizer


@pytest.fixture()
def qa_data(tmp_path, monkeypatch):
  """$REALM_JAX_QA_DATA/nq_open/ with ORQA-split JSONL files; returns a writer of its test
  split (the train and dev splits hold one question each, sizes unchecked)."""
  root = tmp_path / "qa"
  (root / "nq_open").mkdir(parents=True)
  monkeypatch.setenv("REALM_JAX_QA_DATA", str(root))
  monkeypatch.setenv("REALM_JAX_QA_CHECK_SIZES", "0")

  def write(split: str, examples: list[tuple[str, list[str]]]) -> None:
    with open(root / "nq_open" / f"{split}.jsonl", "w", encoding="utf-8") as f:
      for question, answer in examples:
        f.write(json.dumps({"question": question, "answer": answer}) + "\n")

  for split in ("train", "dev"):
    write(split, [("who wrote it?", ["nobody"])])
  return write


def test_predictions_and_exact_match_equal_transformers(released, qa_data, tmp_path, capsys):
  directory, questions, hf_answers, hf_block_ids, tokenizer = released
  # The reference itself must be able to tell a wrong prediction: real, distinct answers.
  assert all(hf_answers) and len(set(hf_answers)) >= NUM_QUESTIONS // 2, hf_answers
  assert len(set(hf_block_ids)) >= NUM_QUESTIONS // 2, hf_block_ids
  # Even questions have transformers' answer as the gold answer, odd ones an answer no block
  # holds: exact match is 0.5 exactly when every answer agrees with transformers'.
  gold = [[answer] if i % 2 == 0 else ["no such answer"] for i, answer in enumerate(hf_answers)]
  qa_data("test", list(zip(questions, gold)))
  output = tmp_path / "out" / "nq_released.jsonl"

  code = entry.main(["evaluate", "--released", str(directory), "--task", "nq_open",
                     "--output", str(output), "--batch_size", "3"])
  out, err = capsys.readouterr()
  assert code == 0, err
  predictions = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
  assert [p["question"] for p in predictions] == questions
  ours = [p["prediction"] for p in predictions]
  # Ours are the spans' original text (original casing); transformers decodes its wordpieces:
  # the same span gives the same text once ours goes through its tokenizer.
  assert [tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids)
          for text in ours] == hf_answers, (ours, hf_answers)
  assert [p["predicted_block_id"] for p in predictions] == hf_block_ids
  assert all(text in _block_text_of(directory, p["predicted_block_id"])
             for text, p in zip(ours, predictions))
  beam = HF_SETTINGS["reader_beam_size"]  # the evidence kept: the blocks the reader read
  assert [len(p["block_ids"]) for p in predictions] == [beam] * NUM_QUESTIONS

  record = json.loads(output.with_name("nq_released.metrics.json").read_text(encoding="utf-8"))
  metrics = record["metrics"]
  assert metrics["exact_match"] == 0.5
  assert metrics["exact_match"] == np.mean([exact_match(a, g) for a, g in zip(ours, gold)])
  assert metrics["num_questions"] == NUM_QUESTIONS and metrics["skipped_questions"] == 0
  assert {"recall@1", "recall@5", "recall@20", "recall@100"} <= set(metrics)
  assert record["mode"] == "qa" and record["task"] == "nq_open" and record["split"] == "test"
  assert (record["reader_beam"], record["reader_len"], record["max_span_width"]) == (
      HF_SETTINGS["reader_beam_size"], HF_SETTINGS["reader_seq_len"],
      HF_SETTINGS["max_span_width"])
  assert record["num_blocks"] == NUM_BLOCKS and record["backend"] == "exact"
  assert out.startswith("evaluate: nq_open/test, released model ") and "exact_match 0.5000" in out
  assert "questions 8/8 (100.0%)" in err  # the progress line


def test_a_directory_without_block_records_is_one_line_naming_the_file(released, tmp_path,
                                                                        capsys):
  directory = tmp_path / "partial"
  directory.mkdir()
  for name in ("config.json", "vocab.txt"):
    (directory / name).write_bytes((released[0] / name).read_bytes())
  code = entry.main(["evaluate", "--released", str(directory), "--task", "nq_open"])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 1 and len(err) == 1, err
  assert "missing pytorch_model.bin or model.safetensors, block_records.npy" in err[0]

  (directory / "model.ckpt-1000.index").write_bytes(b"")  # the TensorFlow release's layout
  assert entry.main(["evaluate", "--released", str(directory), "--task", "nq_open"]) == 1
  assert "TensorFlow release is not read here" in capsys.readouterr().err


def test_a_reader_checkpoint_or_a_cased_vocabulary_is_refused(released, tmp_path, capsys):
  directory = tmp_path / "copy"
  directory.mkdir()
  for name in ("config.json", "vocab.txt", "tokenizer_config.json", "block_records.npy"):
    (directory / name).write_bytes((released[0] / name).read_bytes())
  (directory / "pytorch_model.bin").write_bytes(b"")  # never read: the checks come first
  args = ["evaluate", "--released", str(directory), "--task", "nq_open", "--dry_run"]
  config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
  (directory / "config.json").write_text(json.dumps({**config, "architectures": ["RealmReader"]}))
  assert entry.main(args) == 1
  assert "needs a RealmForOpenQA directory" in capsys.readouterr().err
  (directory / "config.json").write_text(json.dumps(config))
  tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
  (directory / "tokenizer_config.json").write_text(
      json.dumps({**tokenizer_config, "do_lower_case": False}))
  assert entry.main(args) == 1
  assert "do_lower_case is false" in capsys.readouterr().err


def test_dry_run_checks_the_directory_task_and_split_without_weights(released, qa_data, capsys):
  qa_data("test", [("who wrote it?", ["nobody"])])
  directory = str(released[0])
  assert entry.main(["evaluate", f"--released={directory}", "--task", "nq_open",
                     "--dry_run"]) == 0
  out = capsys.readouterr().out
  assert out.startswith("evaluate: dry run ok (released model ") and "(300 blocks)" in out
  assert "reader top 4 of 40 wordpieces" in out
  assert entry.main(["evaluate", "--released", directory, "--task", "nq_open", "--split",
                     "validation", "--dry_run"]) == 2
  assert "--split validation: task nq_open has splits train, dev, test" in capsys.readouterr().err
  assert entry.main(["evaluate", "--released", directory, "--task", "nq", "--dry_run"]) == 2
  assert "not a registered QA task" in capsys.readouterr().err


def test_help_of_the_released_mode_and_of_the_gin_mode(capsys):
  assert entry.main(["evaluate", "--released", "DIR", "--help"]) == 0
  out = capsys.readouterr().out
  assert "--released DIR" in out and "--task TASK" in out and "block_records.npy" in out
  assert entry.main(["evaluate", "--help"]) == 0
  assert "python -m realm_jax.evaluate --released DIR --task nq_open" in capsys.readouterr().out
  assert entry.main(["evaluate", "--released", "DIR", "--batch_size", "0", "--task", "x"]) == 2
