"""The main job on your own corpus and questions (`python -m realm_jax.recipe --documents ...
--questions ...`): its flags, the checks that stop it before anything trains, the settings it
chooses from the data, the pretrained checkpoint it fine-tunes from (best.json's, not the
last), the commands of its stages (BM25's recall, the reader on BM25's blocks) and its table.
The stages are the entry points, each tested on its own; the whole run takes minutes (one is
reported in docs/own_corpus.md)."""

import json
import os

import numpy as np
import pytest

from realm_jax import checkpoints
from realm_jax import gin_utils
from realm_jax import recipe
from realm_jax import toy_bert

SHIPPED_BERT = toy_bert.SHIPPED_DIR

QUESTIONS = {"train": [("Which function pushes an item onto a heap?", ["heappush"]),
                       ("Which function pops the smallest item?", ["heappop"])],
             "dev": [("Which function splits a string into lines?", ["splitlines"])],
             "test": [("Which function joins path parts?", ["join"]),
                      ("Which function is never documented?", ["frobnicate"])]}


def _write_questions(root, splits=QUESTIONS):
  root.mkdir(parents=True, exist_ok=True)
  for split, rows in splits.items():
    (root / f"{split}.jsonl").write_text("".join(
        json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows))
  return str(root)


# -- flags


@pytest.mark.parametrize("argv,expected", [
    (["--documents", "d.jsonl"], "--documents and --questions go together"),
    (["--questions", "qa"], "--documents and --questions go together"),
    (["--max_block_len", "128"], "--max_block_len: settings of your own corpus"),
    (["--documents", "d", "--questions", "q", "--ict_remove_probability", "1.5"],
     "expected a probability in [0, 1]"),
    (["--documents", "d", "--questions", "q", "--pretrain_steps", "0"], "expected a positive"),
])
def test_flags_are_checked_together(argv, expected, capsys):
  with pytest.raises(SystemExit) as exit_info:
    recipe.parse_args(argv)
  assert exit_info.value.code == 2
  assert expected in capsys.readouterr().err


def test_the_wiki_world_is_a_corpus_and_questions_of_its_own(capsys):
  args = recipe.parse_args(["--world", "wiki", "--bert", "none", "--pretrain_steps", "40"])
  assert args.out == recipe.WIKI_OUT and args.max_block_len is None
  # Its own run lengths where none is given; the toy world keeps its gins'.
  assert (args.ict_steps, args.pretrain_steps, args.finetune_steps) == (None, 40, 150)
  assert recipe.parse_args(["--bert", "none"]).finetune_steps is None
  with pytest.raises(SystemExit):
    recipe.parse_args(["--world", "wiki", "--documents", "d", "--questions", "q"])
  assert "--world wiki and --documents" in capsys.readouterr().err


def test_the_wiki_recipe_pretrains_on_its_spacy_spans(tmp_path):
  run = recipe.WikiRecipe(str(tmp_path / "out"), world="/world", toy_bert=None,
                          pretrain_steps=200)
  # The wiki world's ICT keeps its query sentence half the time, unless one is given.
  assert run.ict_remove_probability == 0.5 and "wiki world" in run.ict_remove_why
  run.max_block_len = 192
  assert run.documents == "/world/docs.jsonl" and run.questions == "/world/qa"
  assert (f"PretrainJob.pretrain_records='{tmp_path}/out/store-spans.jsonl'"
          in run.bindings("pretrain"))
  # The retriever is held for the first half of pretraining, and only there.
  assert "PretrainJob.freeze_retriever_steps=100" in run.bindings("pretrain")
  assert not any("freeze" in b for b in run.bindings("finetune"))
  given = recipe.WikiRecipe(str(tmp_path / "given"), world="/world", toy_bert=None,
                            ict_remove_probability=0.9, pretrain_steps=40)
  assert given.ict_remove_probability == 0.9 and given.ict_remove_why == "as given"
  given.max_block_len = 192
  assert "PretrainJob.freeze_retriever_steps=20" in given.bindings("pretrain")
  own = recipe.OwnDataRecipe(str(tmp_path / "own"), documents="/d.jsonl", questions="/qa")
  own.max_block_len, own.ict_remove_probability = 192, 0.9
  assert not any("pretrain_records" in b for b in own.bindings("pretrain"))


def test_flags_name_files_absolutely_and_pick_the_own_output_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  args = recipe.parse_args(["--documents", "docs.jsonl", "--questions", "regex:qa",
                            "--toy_bert", "none"])
  assert args.documents == str(tmp_path / "docs.jsonl")
  assert args.questions == f"regex:{tmp_path / 'qa'}"
  assert args.out == recipe.OWN_OUT and args.bert is None
  assert recipe.parse_args(["--toy_bert", "none"]).out == recipe.DEFAULT_OUT  # the toy world's
  assert recipe.step_bindings("pretrain", 40) == ["NUM_STEPS=40",
                                                  "train_main.checkpoint_every=8"]
  assert recipe.step_bindings("finetune", None) == []
  assert recipe.step_bindings("ict", 100, 1e-4) == ["NUM_STEPS=100",
                                                    "train_main.checkpoint_every=25",
                                                    "LEARNING_RATE=0.0001"]
  assert recipe.parse_args(["--pretrain_lr", "3e-5"]).pretrain_lr == 3e-5


# -- bad input, named before anything trains


MINILM_CONFIG = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30522,
                 "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
                 "intermediate_size": 1536, "hidden_act": "gelu",
                 "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
                 "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}


def _bert_dir(root, config=MINILM_CONFIG, vocab=None):
  """A transformers BERT directory as `--bert` reads it (the weights are not read here)."""
  from realm_jax.data import vocab as vocab_lib  # pylint: disable=import-outside-toplevel
  root.mkdir(parents=True)
  (root / "config.json").write_text(json.dumps(config))
  (root / "model.safetensors").write_bytes(b"")
  with open(vocab_lib.bundled_vocab_path(), encoding="utf-8") as f:
    (root / "vocab.txt").write_text(vocab if vocab is not None else f.read())
  return str(root)


def test_a_berts_config_sizes_every_tower_of_every_child(tmp_path):
  """all-MiniLM-L6-v2's config.json (hand-copied) becomes the towers' shape in the gins of every
  kind of child; dropout stays the toy gins'."""
  import gin  # pylint: disable=import-outside-toplevel
  from realm_jax import evaluate  # pylint: disable=import-outside-toplevel,unused-import
  directory = _bert_dir(tmp_path / "minilm")
  shape = ("model_config.tiny_bert.vocab_size=30522", "model_config.tiny_bert.hidden_size=384",
           "model_config.tiny_bert.num_layers=6", "model_config.tiny_bert.num_heads=12",
           "model_config.tiny_bert.intermediate_size=1536",
           "model_config.tiny_bert.hidden_act='gelu'",
           "model_config.tiny_bert.max_position_embeddings=512",
           "model_config.tiny_bert.type_vocab_size=2",
           "model_config.tiny_bert.layer_norm_eps=1e-12")
  assert recipe.bert_shape_bindings(directory) == (
      ("model_config.tiny_bert.vocab_size", 30522), ("model_config.tiny_bert.hidden_size", 384),
      ("model_config.tiny_bert.num_layers", 6), ("model_config.tiny_bert.num_heads", 12),
      ("model_config.tiny_bert.intermediate_size", 1536),
      ("model_config.tiny_bert.hidden_act", "gelu"),
      ("model_config.tiny_bert.max_position_embeddings", 512),
      ("model_config.tiny_bert.type_vocab_size", 2),
      ("model_config.tiny_bert.layer_norm_eps", 1e-12))
  assert recipe.bert_shape_bindings(None) == ()
  run = recipe.OwnDataRecipe(str(tmp_path / "out"), documents="/d.jsonl", questions="/qa",
                             toy_bert=directory)
  run.max_block_len, run.ict_remove_probability = 160, 0.2
  for child in ("ict", "pretrain", "finetune", "evaluate"):
    assert run.bindings(child)[:len(shape)] == shape
    assert run.bindings(child)[len(shape):] == tuple(
        gin_utils.binding(name, value) for name, value in run.data_bindings(child))
  gin_utils.parse_gin(["gin_configs/experiments/toy_eval.gin"],
                      ["RUN_DIR='/x'", *run.bindings("evaluate")])
  bert = gin.query_parameter("%MODEL_CONFIG").scoped_configurable_fn().bert
  gin.clear_config()
  assert (bert.hidden_size, bert.num_layers, bert.num_heads, bert.intermediate_size,
          bert.hidden_act) == (384, 6, 12, 1536, "gelu")
  assert bert.hidden_dropout == bert.attention_dropout == 0.0
  assert recipe.describe_bert(directory, True) == (
      f"{directory} (hidden 384, 6 layers, 12 heads, intermediate 1536): the retriever (ICT's "
      f"towers), the encoder and the readers")


def test_a_bad_bert_directory_is_named_before_anything_runs(tmp_path, capsys):
  broken = dict(MINILM_CONFIG)
  del broken["num_attention_heads"]
  cases = [(_bert_dir(tmp_path / "no_heads", config=broken),
            "'num_attention_heads' missing from its config.json"),
           (_bert_dir(tmp_path / "cased", vocab="[PAD]\n[UNK]\nHello\n"),
            "vocab.txt is not the BERT uncased WordPiece vocabulary"),
           (str(tmp_path), "no model.safetensors")]
  for directory, expected in cases:
    with pytest.raises(SystemExit) as exit_info:
      recipe.parse_args(["--bert", directory])
    assert exit_info.value.code == 2
    assert f"--bert {directory}: " in capsys.readouterr().err
    with pytest.raises(ValueError, match=expected):
      recipe.toy_bert_dir(directory)
  assert recipe.parse_args(["--toy_bert", "none"]).bert is None  # the flag's other name


def test_questions_need_three_splits_none_empty_every_record_well_formed(tmp_path):
  good = _write_questions(tmp_path / "good")
  splits = recipe.check_questions(good)
  assert list(splits) == ["train", "dev", "test"]
  assert splits["test"][1][1].source == f"{good}/test.jsonl:2"
  partial = _write_questions(tmp_path / "partial", {"train": QUESTIONS["train"],
                                                    "test": QUESTIONS["test"]})
  with pytest.raises(recipe.InputError, match=r"no dev split \(found train .*, test .*\)"):
    recipe.check_questions(partial)
  with pytest.raises(recipe.InputError, match="no train or dev split"):
    recipe.check_questions(os.path.join(good, "test.jsonl"))  # one file is a test split
  (tmp_path / "good" / "dev.jsonl").write_text("\n")
  with pytest.raises(recipe.InputError, match=r"dev\.jsonl: no questions \(the dev split"):
    recipe.check_questions(good)
  (tmp_path / "good" / "dev.jsonl").write_text('{"question": "Why?", "answers": ["x"]}\n')
  with pytest.raises(recipe.InputError,
                     match=r"dev\.jsonl:1: field 'answer' is missing \(found 'answers'"):
    recipe.check_questions(good)
  with pytest.raises(recipe.InputError, match="no such QA file or directory"):
    recipe.check_questions(str(tmp_path / "nowhere"))


def test_answers_that_occur_nowhere_in_the_corpus_are_named_or_stop_the_recipe(tmp_path):
  splits = recipe.check_questions(_write_questions(tmp_path / "qa"))
  texts = ["heapq.heappush(heap, item): Push item onto heap.", "Pop the smallest: heappop.",
           "str.splitlines(): Return a list of the lines.", "os.path.join(a, *p): Join parts."]
  lines = recipe.check_answers(splits, texts, min_answerable=0.5)
  assert len(lines) == 1, lines
  assert ("1 of 2 test questions have no answer anywhere in the corpus" in lines[0]
          and f"{tmp_path}/qa/test.jsonl:2: answers ['frobnicate']" in lines[0])
  with pytest.raises(recipe.InputError, match=r"test\.jsonl: 1 of 2 test questions have no "
                                              r"answer anywhere .* \(only 50%"):
    recipe.check_answers(splits, texts, min_answerable=0.6)
  assert recipe.check_answers(splits, texts + ["frobnicate"], min_answerable=1.0) == []


def test_a_bad_document_is_named_before_the_corpus_is_built(tmp_path):
  from realm_jax.data import sources as sources_lib  # pylint: disable=import-outside-toplevel
  path = tmp_path / "docs.jsonl"
  path.write_text('{"title": "a", "text": "One. Two."}\n{"title": "b"}\n')
  with pytest.raises(recipe.InputError, match=r"docs\.jsonl:2: .*'text'"):
    recipe.document_lengths(sources_lib.JsonlSource(str(path)))
  with pytest.raises(recipe.InputError, match="no documents"):
    recipe.choose_block_len([])


def test_another_runs_output_directory_is_refused(tmp_path):
  out = tmp_path / "out"
  first = recipe.OwnDataRecipe(str(out), documents="/d.jsonl", questions="/qa")
  (out / "own_data.json").write_text(json.dumps({"arguments": first.arguments}))
  first._check_same_arguments()  # pylint: disable=protected-access
  other = recipe.OwnDataRecipe(str(out), documents="/d.jsonl", questions="/qa",
                               max_block_len=96)
  with pytest.raises(recipe.InputError, match="--max_block_len None then, 96 now.*--fresh"):
    other._check_same_arguments()  # pylint: disable=protected-access


# -- settings chosen from the data


@pytest.mark.parametrize("lengths,expected", [
    ([40] * 90 + [500] * 10, 64),  # short documents: at least 64
    ([30] * 50 + [150] * 40 + [400] * 10, 160),  # 90% within 150: the next multiple of 32
    ([1000] * 10, 288),  # long articles: REALM's 288
])
def test_block_length_holds_nine_documents_in_ten_whole(lengths, expected):
  block_len, why = recipe.choose_block_len(lengths)
  assert block_len == expected
  assert "90% of the first 100 have at most" in why or len(lengths) != 100
  assert "--max_block_len sets it" in why


@pytest.mark.parametrize("one_sentence,expected", [(0.0, 0.9), (0.1, 0.9), (0.2, 0.5),
                                                   (0.47, 0.2), (1.0, 0.1)])
def test_ict_removal_keeps_the_blocks_it_cannot_use_within_a_tenth(one_sentence, expected):
  counts = np.where(np.arange(100) < round(one_sentence * 100), 1, 3)
  probability, why = recipe.choose_ict_remove_probability(counts)
  assert probability == expected
  assert one_sentence * probability <= recipe.ICT_MAX_SKIPPED + 1e-9
  assert f"{one_sentence:.0%} of its 100 blocks are one sentence" in why


# -- the stages' commands, the children recorded rather than run


def _finished_pretraining(run_dir, steps, best):
  """Finished checkpoint directories of `steps` and a best.json naming `best`."""
  for step in steps:
    path = os.path.join(checkpoints.checkpoint_path(run_dir, step))
    os.makedirs(os.path.join(path, checkpoints.METADATA_ITEM))
    open(os.path.join(path, "_CHECKPOINT_METADATA"), "w").close()
  with open(os.path.join(run_dir, checkpoints.BEST_FILE), "w", encoding="utf-8") as f:
    json.dump({"metric": "eval/retrieval/utility", "mode": "max", "step": best, "value": 0.25}, f)


def test_fine_tuning_starts_from_the_best_pretraining_checkpoint_not_the_last(tmp_path):
  run = recipe.OwnDataRecipe(str(tmp_path / "out"), documents="/d.jsonl", questions="/qa")
  _finished_pretraining(run.pretrain, (80, 160, 240, 320, 400), best=160)
  assert run.pretrain_choice() == (160, "best by eval/retrieval/utility=0.25 in best.json")
  assert run.pretrained_checkpoint().resolve() == f"{run.pretrain}/checkpoints/160"
  os.remove(os.path.join(run.pretrain, checkpoints.BEST_FILE))  # no best: the newest
  assert run.pretrain_choice() == (400, "latest")


def _recorded_run(run, monkeypatch):
  """`run.run()` with every child recorded instead of run, `prepare`'s choices made by hand and
  the BERT converted: (commands, the indexes built, what `own_summary` was given). A run counts
  as trained once its trainer was recorded; a trained run's newest checkpoint is 400."""
  from realm_jax.index import store as store_lib  # pylint: disable=import-outside-toplevel
  _finished_pretraining(run.pretrain, (80, 400), best=80)
  commands, trained, indexes = [], set(), {}

  def prepare():
    run.max_block_len, run.ict_remove_probability = 160, 0.2

  def record(cmd):
    commands.append(list(cmd))
    run_dir = next(a for a in cmd if a.startswith("--gin.RUN_DIR=")).split("=", 1)[1].strip("'")
    if cmd[2] == "realm_jax.build_index":
      indexes[run_dir] = 0
    elif cmd[2] == "realm_jax.train" and "--dry_run" not in cmd:
      trained.add(run_dir)

  def run_local(trainer, builder, **kwargs):
    del builder, kwargs
    record(trainer)
    return 0

  monkeypatch.setattr(run, "prepare", prepare)
  monkeypatch.setattr(run, "own_summary", lambda *paths: paths)
  monkeypatch.setattr(checkpoints, "training_done", lambda run_dir: run_dir in trained)
  monkeypatch.setattr(checkpoints, "latest_checkpoint_step", lambda run_dir: (
      0 if run_dir == run.bert else 400 if run_dir in trained else None))
  monkeypatch.setattr(recipe, "run_child", lambda cmd, log: record(cmd))
  monkeypatch.setattr(recipe, "run_children", lambda children: [record(c) for c, _ in children])
  monkeypatch.setattr(recipe.launcher, "run_local", run_local)
  monkeypatch.setattr(store_lib, "latest_index_step", indexes.get)
  return commands, indexes, run.run()


def test_own_data_stages_point_every_child_at_the_data_and_add_bm25(tmp_path, monkeypatch):
  out = tmp_path / "out"
  run = recipe.OwnDataRecipe(str(out), documents="/d.jsonl", questions="regex:/qa",
                             finetune_bindings=["NUM_STEPS=7"], toy_bert=SHIPPED_BERT)
  ict = f"{out}/ict/checkpoints/400"
  commands, indexes, (recall, dev_recall, qa) = _recorded_run(run, monkeypatch)

  def by_run(run_dir):
    return [c for c in commands if f"--gin.RUN_DIR='{run_dir}'" in c]

  store = f"'{out}/store'"
  # Every training child, dry runs first: your corpus's tasks and your questions.
  dry_ict, dry_pretrain, dry_finetune = commands[:3]
  assert all(c[-1] == "--dry_run" for c in (dry_ict, dry_pretrain, dry_finetune))
  for command in by_run(run.ict):
    assert {"--gin.TASK='ict_own'", f"--gin.BLOCK_STORE={store}",
            "--gin.IctJob.ict_remove_probability=0.2"} <= set(command)
  assert {"--gin.TASK='realm_own_salient_span'", f"--gin.BLOCK_STORE={store}",
          "--gin.INIT_CHECKPOINT=None"} <= set(dry_pretrain)
  # The REALM fine-tuning's index and warm start: best.json's checkpoint 80, not the last.
  best = f"{run.pretrain}/checkpoints/80"
  index, recall_dev, recall_test, finetune, evaluate = by_run(run.finetune)
  assert f"--gin.build_index_main.checkpoint_dir='{best}'" in index
  assert f"--gin.INIT_CHECKPOINT='{best}'" in finetune
  assert {"--gin.TASK='regex:/qa'", "--gin.FinetuneJob.reader_len=192"} <= set(finetune)
  assert finetune[-1] == "--gin.NUM_STEPS=7"
  for split, command in (("dev", recall_dev), ("test", recall_test)):
    assert {"--gin.evaluate_main.mode='retrieval'", f"--gin.evaluate_main.split='{split}'",
            "--gin.evaluate_main.index_step=0", "--gin.TASK='regex:/qa'",
            f"--gin.evaluate_main.block_store={store}"} <= set(command)
  # BM25: its recall (no run), and a reader fine-tuned and evaluated on its blocks, no index.
  (bm25_recall,) = [c for c in commands if "--gin.evaluate_main.mode='bm25'" in c]
  assert "--gin.RUN_DIR=None" in bm25_recall
  dry_run, bm25_finetune, bm25_evaluate = by_run(run.bm25_reader)
  assert dry_run[:-1] == bm25_finetune[:2] + dry_run[2:-1] and dry_run[-1] == "--dry_run"
  assert {"--gin.FinetuneJob.candidates='bm25'", f"--gin.INIT_CHECKPOINT='{ict}'",
          f"--gin.ENCODER_CHECKPOINT='{out}/bert/checkpoints/0'"} <= set(bm25_finetune)
  assert "--gin.evaluate_main.candidates='bm25'" in bm25_evaluate
  assert run.bm25_reader not in indexes
  # What the table reads: recall of BM25, the warm start and the chosen checkpoint's index.
  assert recall == {name: f"{out}/eval/recall_{file}.metrics.json" for name, file in (
      ("bm25", "bm25_test"), ("warm_start", "before_test"), ("pretrained", "after_test"))}
  assert dev_recall["pretrained"] == f"{out}/eval/recall_after_dev.metrics.json"
  assert set(qa) == {"realm", "orqa", "bm25_reader"}


def test_a_mixed_fine_tuning_slot_has_its_reader_and_files_of_its_own(tmp_path, monkeypatch):
  """Table 2's "REALM retriever + baseline encoder" on your data: the chosen checkpoint's
  retriever and index, the BERT reader, in a slot beside REALM's whose files it leaves alone."""
  out = tmp_path / "out"
  run = recipe.OwnDataRecipe(str(out), documents="/d.jsonl", questions="/qa",
                             finetune_name="finetune_bert_reader", finetune_reader="bert",
                             finetune_bindings=["train_main.seed=3"],
                             slot_bindings=["train_main.seed=1003"], toy_bert=SHIPPED_BERT)
  commands, _, (recall, dev_recall, qa) = _recorded_run(run, monkeypatch)
  # The slot's own bindings come last in its fine-tuning alone, and are no run argument.
  (orqa_finetune,) = [c for c in commands if f"--gin.RUN_DIR='{run.orqa}'" in c
                      and c[2] == "realm_jax.train" and "--dry_run" not in c]
  assert orqa_finetune[-1] == "--gin.train_main.seed=3"
  assert "slot" not in json.dumps(run.arguments)
  best = f"{run.pretrain}/checkpoints/80"
  assert run.finetune == f"{out}/finetune_bert_reader"
  index, _, _, finetune, evaluate = [c for c in commands
                                     if f"--gin.RUN_DIR='{run.finetune}'" in c]
  assert f"--gin.build_index_main.checkpoint_dir='{best}'" in index
  assert {f"--gin.INIT_CHECKPOINT='{best}'",
          f"--gin.ENCODER_CHECKPOINT='{out}/bert/checkpoints/0'"} <= set(finetune)
  assert finetune[-2:] == ["--gin.train_main.seed=3", "--gin.train_main.seed=1003"]
  assert f"--gin.evaluate_main.output='{out}/eval/realm_finetune_bert_reader_test.jsonl'" in (
      evaluate)
  assert recall["pretrained"] == (
      f"{out}/eval/recall_after_finetune_bert_reader_test.metrics.json")
  assert dev_recall["warm_start"] == f"{out}/eval/recall_before_dev.metrics.json"
  assert qa["realm"] == f"{out}/eval/realm_finetune_bert_reader_test.metrics.json"
  assert run.qa_metrics_path() == qa["realm"] and run.qa_metrics_path("orqa") == qa["orqa"]
  assert set(qa) == {"realm", "orqa", "bm25_reader"}


# -- the table


def _recall(*values):
  return dict(zip(("recall@1", "recall@5", "recall@20", "recall@100"), values),
              num_questions=204, num_blocks=5801)


def _summary(before_dev, after_dev, regex=False):
  answer = "regex_match" if regex else "exact_match"
  return {
      "answer_metric": answer,
      "verdict": recipe.pretraining_verdict(_recall(*before_dev), _recall(*after_dev), 160),
      "recall": {"bm25": _recall(0.897, 0.98, 1.0, 1.0),
                 "warm_start": _recall(0.13, 0.43, 0.66, 0.82),
                 "pretrained": _recall(0.14, 0.38, 0.61, 0.81)},
      "dev_recall": {"warm_start": _recall(*before_dev), "pretrained": _recall(*after_dev)},
      "qa": {"orqa": {**_recall(0.13, 0.43, 0.66, 0.82), answer: 0.147},
             "realm": {**_recall(0.14, 0.38, 0.61, 0.81), answer: 0.162},
             "bm25_reader": {**_recall(0.897, 0.98, 1.0, 1.0), answer: 0.5}},
      "pretrain_checkpoint": {"step": 160, "choice": "best by eval/retrieval/utility=0.1 in "
                                                     "best.json", "last": 400},
      "mlm_accuracy_null_only": 0.061, "mlm_accuracy_realm": 0.068,
      "retrieval_utility": {"first": 0.13, "chosen": 0.2, "last": 0.04},
      "refreshes": 4.0, "mean_staleness_steps": 41.0,
      "bert": recipe.describe_bert(None, False),
      "span_redundancy": {"span_share": 0.2, "sentence_share": 0.3, "spans": 10,
                          "line": "WARNING: salient spans stated in another article: ..."},
      "settings": {"max_block_len": {"value": 160, "why": "chosen from the documents: ..."}}}


def test_table_has_bm25_beside_the_dense_retrievers_at_every_cut_off():
  table = recipe.format_own_table(_summary((0.1, 0.4, 0.6, 0.8), (0.1, 0.3, 0.6, 0.7)), 570)
  lines = table.splitlines()
  assert [c.strip() for c in lines[0].split("|")[2:-1]] == [
      "recall@1", "recall@5", "recall@20", "recall@100", "test EM"]
  cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
           for line in lines if line.startswith("| ")}
  assert cells["BM25 over the blocks' title and text"] == ["0.897", "0.980", "1.000", "1.000", ""]
  assert cells["warm start (ICT) retriever, before pretraining"][:2] == ["0.130", "0.430"]
  assert cells["REALM-pretrained retriever (checkpoint 160: best retrieval utility)"][4] == ""
  assert cells["REALM: pretrained retriever and encoder, fine-tuned"][4] == "0.162"
  assert cells["BM25's top blocks, BERT reader fine-tuned on them (DrQA-style)"] == [
      "0.897", "0.980", "1.000", "1.000", "0.500"]
  assert cells["retrieval utility, first -> chosen -> last checkpoint"] == [
      "0.130 -> 0.200 -> 0.040"]
  assert cells["wall time"] == ["9.5 min"]
  assert ("Pretraining did not improve retrieval over the warm start: dev recall@1 0.100 -> "
          "0.100, recall@5 0.400 -> 0.300") in table
  assert "max_block_len: 160 (chosen from the documents: ...)" in table
  assert "WARNING: salient spans stated in another article: ..." in lines
  assert "bert: none (every tower from random weights of the toy model's shape)" in table
  regex = recipe.format_own_table(_summary((0.1,) * 4, (0.2,) * 4, regex=True), 60)
  assert "test regex match" in regex.splitlines()[0]
  assert "Pretraining improved retrieval over the warm start: dev" in regex


def test_the_verdict_says_where_pretraining_helped_only_in_part():
  before = {"recall@1": 0.1, "recall@5": 0.4, "num_questions": 9}
  line = recipe.pretraining_verdict(before, {"recall@1": 0.2, "recall@5": 0.3}, 80)
  assert line.startswith("Pretraining improved retrieval over the warm start at recall@1 only")
  assert line.endswith("(the warm start's index -> that of pretraining checkpoint 80).")
