"""The gin-configured entry points: every run/experiment gin builds its job (dry runs, no
training), and config mistakes are one line on stderr with exit status 2. In-process (not
subprocesses), gin's config cleared around each test."""

import inspect
import json
import os
import socket
import sys

import gin
import numpy as np
import pytest

import realm_jax_tasks
from realm_jax import build_index
from realm_jax import gin_utils
from realm_jax import jobs
from realm_jax import train
from realm_jax.models import config as config_lib
from realm_jax import checkpoints

REPO = gin_utils.REPO_ROOT


pytestmark = pytest.mark.usefixtures("clean_gin")


def _train(*args):
  return train.main(["train", *args])


def _stderr_lines(capsys):
  captured = capsys.readouterr()
  return captured.out, [line for line in captured.err.splitlines() if line.strip()]


DRY_RUNS = {
    "toy_bert": ["--gin_file=gin_configs/experiments/toy_bert.gin"],
    "toy_bert_copy": ["--gin_file=gin_configs/experiments/toy_bert_copy.gin"],
    "toy_bert_distract": ["--gin_file=gin_configs/experiments/toy_bert_distract.gin"],
    # The wiki world's English BERT (the toy model's shape).
    "english_bert": ["--gin_file=gin_configs/experiments/wiki_bert.gin"],
    "english_bert_copy": ["--gin_file=gin_configs/experiments/wiki_bert_copy.gin"],
    "runs_mlm": ["--gin_file=gin_configs/models/tiny.gin", "--gin_file=gin_configs/runs/mlm.gin",
                 "--gin.TASK='mlm_toy'", "--gin.BATCH_SIZE=8", "--gin.NUM_STEPS=10",
                 "--gin.train_main.mesh_shape=(4, 2)"],
    "toy_ict": ["--gin_file=gin_configs/experiments/toy_ict.gin"],
    "toy_pretrain": ["--gin_file=gin_configs/experiments/toy_pretrain.gin",
                     "--gin.INIT_CHECKPOINT=None"],
    "runs_ict": ["--gin_file=gin_configs/models/tiny.gin", "--gin_file=gin_configs/runs/ict.gin",
                 "--gin.TASK='ict_toy'", "--gin.BATCH_SIZE=8", "--gin.NUM_STEPS=10"],
    "toy_retromae": ["--gin_file=gin_configs/experiments/toy_retromae.gin"],
    "runs_retromae": ["--gin_file=gin_configs/models/tiny.gin",
                      "--gin_file=gin_configs/runs/retromae.gin", "--gin.TASK='ict_toy'",
                      "--gin.BATCH_SIZE=8", "--gin.NUM_STEPS=10",
                      "--gin.model_config.RealmConfig.share_embedders=False"],
    "toy_retro": ["--gin_file=gin_configs/experiments/toy_retro.gin"],
    "runs_retro": ["--gin_file=gin_configs/models/tiny.gin",
                   "--gin_file=gin_configs/runs/retro.gin", "--gin.CHUNK_DATABASE=None",
                   "--gin.TASK='retro_toy'", "--gin.BATCH_SIZE=8", "--gin.NUM_STEPS=10"],
    "runs_pretrain": ["--gin_file=gin_configs/models/tiny.gin",
                      "--gin_file=gin_configs/runs/pretrain.gin",
                      "--gin.TASK='realm_toy_salient_span'", "--gin.BATCH_SIZE=8",
                      "--gin.NUM_STEPS=10", "--gin.INIT_CHECKPOINT=None",
                      "--gin.train_main.mesh_shape=(4, 2)"],
    "toy_finetune": ["--gin_file=gin_configs/experiments/toy_finetune.gin",
                     "--gin.INIT_CHECKPOINT=None"],
    "toy_finetune_fid": ["--gin_file=gin_configs/experiments/toy_finetune_fid.gin",
                         "--gin.INIT_CHECKPOINT=None"],
    "atlas_toy_finetune": ["--gin_file=gin_configs/experiments/atlas_toy_finetune.gin",
                           "--gin.INIT_CHECKPOINT=None"],
    "atlas_toy_pretext": ["--gin_file=gin_configs/experiments/atlas_toy_pretext.gin",
                          "--gin.INIT_CHECKPOINT=None"],
    "atlas_toy_closed_book": ["--gin_file=gin_configs/experiments/atlas_toy_closed_book.gin",
                              "--gin.INIT_CHECKPOINT=None"],
    "contriever_toy": ["--gin_file=gin_configs/experiments/contriever_toy.gin"],
    "toy_model": ["--gin_file=gin_configs/models/toy.gin",
                  "--gin_file=gin_configs/runs/ict.gin", "--gin.TASK='ict_toy'",
                  "--gin.BATCH_SIZE=8", "--gin.NUM_STEPS=10"],
    "runs_finetune": ["--gin_file=gin_configs/models/tiny.gin",
                      "--gin_file=gin_configs/runs/finetune.gin", "--gin.TASK='toy_qa'",
                      "--gin.BATCH_SIZE=8", "--gin.NUM_STEPS=10", "--gin.INIT_CHECKPOINT=None",
                      "--gin.FinetuneJob.train_document_tower=True",
                      "--gin.train_main.mesh_shape=(4, 2)"],
    # Paper scale (BERT-base, traced only): the toy BlockStore stands in for Wikipedia.
    "wiki_ict": ["--gin_file=gin_configs/experiments/wiki_ict.gin", "--gin.BLOCK_STORE=@toy()",
                 "--gin.INIT_CHECKPOINT=None"],
    "wiki_pretrain": ["--gin_file=gin_configs/experiments/wiki_pretrain.gin",
                      "--gin.BLOCK_STORE=@toy()", "--gin.INIT_CHECKPOINT=None",
                      "--gin.ENCODER_CHECKPOINT=None"],
    "ccnews_pretrain": ["--gin_file=gin_configs/experiments/ccnews_pretrain.gin",
                        "--gin.BLOCK_STORE=@toy()", "--gin.INIT_CHECKPOINT=None",
                        "--gin.ENCODER_CHECKPOINT=None", "--gin.CCNEWS_RECORDS=@toy_records()"],
    "nq_finetune": ["--gin_file=gin_configs/experiments/nq_finetune.gin",
                    "--gin.BLOCK_STORE=@toy()", "--gin.INIT_CHECKPOINT=None"],
    "wq_finetune": ["--gin_file=gin_configs/experiments/wq_finetune.gin",
                    "--gin.BLOCK_STORE=@toy()", "--gin.INIT_CHECKPOINT=None"],
    "ct_finetune": ["--gin_file=gin_configs/experiments/ct_finetune.gin",
                    "--gin.BLOCK_STORE=@toy()", "--gin.INIT_CHECKPOINT=None"],
}
JOBS = {"toy_ict": "ict", "toy_model": "ict", "runs_ict": "ict", "wiki_ict": "ict",
        "toy_bert": "mlm", "toy_bert_copy": "mlm", "toy_bert_distract": "mlm",
        "english_bert": "mlm", "english_bert_copy": "mlm",
        "runs_mlm": "mlm", "toy_retromae": "retromae", "runs_retromae": "retromae",
        "toy_retro": "retro", "runs_retro": "retro", "contriever_toy": "contriever"}


def _resolved(args):
  """`@toy()`/`@toy_records()` -> the toy BlockStore / pretraining records paths."""
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  from realm_jax.data import toy_world  # pylint: disable=import-outside-toplevel
  records = os.path.join(toy_world.toy_world_dir(), toy_world.PRETRAIN_FILE)
  return [a.replace("@toy()", repr(realm_jax_tasks.toy_block_store_dir()))
          .replace("@toy_records()", repr(records)) for a in args]


@pytest.mark.parametrize("name", sorted(DRY_RUNS))
def test_run_gin_dry_run_builds_the_job(name, tmp_path, capsys):
  run_dir = tmp_path / "run"
  code = _train(*_resolved(DRY_RUNS[name]), f"--gin.RUN_DIR='{run_dir}'", "--dry_run")
  out, err = _stderr_lines(capsys)
  assert code == 0, err
  lines = out.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("train: dry run ok (job "), out
  job = JOBS.get(name, "pretrain" if "pretrain" in name else "finetune")
  assert f"job {job}," in lines[0] and "params" in lines[0]
  if name.startswith(("wiki", "ccnews", "nq", "wq", "ct")):
    assert "hidden 768, 12 layers" in lines[0], lines[0]
  assert not run_dir.exists()  # a dry run writes nothing


def test_every_run_and_experiment_gin_is_covered():
  names = {f"runs/{f}" for f in os.listdir(os.path.join(REPO, "gin_configs", "runs"))}
  names |= {f"experiments/{f}"
            for f in os.listdir(os.path.join(REPO, "gin_configs", "experiments"))}
  covered = {arg.split("gin_configs/")[1] for args in DRY_RUNS.values() for arg in args
             if arg.startswith("--gin_file=")} | {"runs/build_index.gin"}
  # The evaluate entry point's gins: dry runs in tests/test_evaluate_main.py.
  covered |= {"runs/eval.gin", "experiments/toy_eval.gin"}
  assert names <= covered, names - covered


def test_build_index_gin_parses_and_binds(tmp_path):
  gin_utils.parse_gin(["gin_configs/runs/build_index.gin"],
                      [f"RUN_DIR = '{tmp_path}'", "BLOCK_STORE = '/data/blocks'"])
  assert gin.query_parameter("%RUN_DIR") == str(tmp_path)
  assert gin.query_parameter("%BLOCK_STORE") == "/data/blocks"
  assert str(gin.query_parameter("build_index_main.block_store")) == "%BLOCK_STORE"


def _one_config_error(capsys, code):
  out, err = _stderr_lines(capsys)
  assert code == 2, (out, err)
  assert len(err) == 1, err
  assert err[0].startswith("train: config error: "), err
  return err[0]


def test_unknown_gin_binding(tmp_path, capsys):
  line = _one_config_error(capsys, _train(*DRY_RUNS["toy_ict"], f"--gin.RUN_DIR='{tmp_path}'",
                                          "--gin.train_main.bogus_knob=3", "--dry_run"))
  assert "bogus_knob" in line


def test_an_unknown_metrics_format_is_one_config_error(tmp_path, capsys):
  line = _one_config_error(capsys, _train(*DRY_RUNS["toy_ict"], f"--gin.RUN_DIR='{tmp_path}'",
                                          "--gin.train_main.metrics_format='csv'", "--dry_run"))
  assert "metrics_format='csv'" in line and "tensorboard, jsonl" in line


def test_missing_required_macro(capsys):
  line = _one_config_error(capsys, _train(*DRY_RUNS["toy_ict"], "--dry_run"))
  assert "required macro RUN_DIR is not set" in line


def test_unregistered_task(tmp_path, capsys):
  line = _one_config_error(capsys, _train(*DRY_RUNS["toy_ict"], f"--gin.RUN_DIR='{tmp_path}'",
                                          "--gin.TASK='ict_toyy'", "--dry_run"))
  assert "unknown seqio task or mixture 'ict_toyy'" in line and "ict_toy" in line


def test_a_macro_nothing_uses_is_named_with_the_likely_one(tmp_path, capsys):
  line = _one_config_error(capsys, _train(*DRY_RUNS["toy_ict"], f"--gin.RUN_DIR='{tmp_path}'",
                                          "--gin.BATCHSIZE=16", "--dry_run"))
  assert "macro BATCHSIZE is set on the command line but no binding uses it" in line
  assert "did you mean BATCH_SIZE" in line


def test_an_unquoted_string_value_says_how_to_quote_it(capsys):
  line = _one_config_error(capsys, _train(*DRY_RUNS["toy_ict"], "--gin.RUN_DIR=/tmp/x",
                                          "--dry_run"))
  assert "cannot parse the value of RUN_DIR ('/tmp/x'" in line
  assert "--gin.RUN_DIR=\"'/tmp/x'\"" in line


def test_fine_tuning_on_your_own_question_files(tmp_path, capsys, forget_qa_files):
  mine = tmp_path / "mine"
  mine.mkdir()
  for split in ("train", "dev"):
    (mine / f"{split}.jsonl").write_text('{"question": "Who wrote it?", "answer": ["Ada"]}\n')
  code = _train(*DRY_RUNS["toy_finetune"], f"--gin.RUN_DIR='{tmp_path / 'run'}'",
                f"--gin.TASK='{mine}'",
                f"--gin.BLOCK_STORE='{realm_jax_tasks.toy_block_store_dir()}'",
                "--dry_run")
  out, err = _stderr_lines(capsys)
  assert code == 0, err
  assert "task qa_files_" in out and "mine" in out, out
  # Your own files need the BlockStore their answers are looked for in.
  line = _one_config_error(capsys, _train(*DRY_RUNS["toy_finetune"],
                                          f"--gin.RUN_DIR='{tmp_path / 'run'}'",
                                          f"--gin.TASK='{mine}'", "--dry_run"))
  assert "FinetuneJob.block_store is required for task 'qa_files_" in line, line
  # No dev split to evaluate at the checkpoints: said before anything runs.
  (mine / "dev.jsonl").unlink()
  line = _one_config_error(capsys, _train(
      *DRY_RUNS["toy_finetune"], f"--gin.RUN_DIR='{tmp_path / 'run'}'", f"--gin.TASK='{mine}'",
      f"--gin.BLOCK_STORE='{realm_jax_tasks.toy_block_store_dir()}'", "--dry_run"))
  assert "'dev'" in line, line
  line = _one_config_error(capsys, _train(*DRY_RUNS["toy_finetune"],
                                          f"--gin.RUN_DIR='{tmp_path / 'run'}'",
                                          f"--gin.TASK='{tmp_path / 'nowhere'}'", "--dry_run"))
  assert f"{tmp_path / 'nowhere'}: no such QA file or directory" in line


def test_unknown_flag(capsys):
  line = _one_config_error(capsys, _train(*DRY_RUNS["toy_ict"], "--no_such_flag"))
  assert "no_such_flag" in line


@pytest.mark.parametrize("name,item,macro", [
    ("toy_pretrain", "retriever", "INIT_CHECKPOINT"),   # an ICT checkpoint
    ("toy_finetune", "retriever", "INIT_CHECKPOINT"),   # a pretraining checkpoint
    ("toy_pretrain", "encoder", "ENCODER_CHECKPOINT"),  # a BERT (mlm or converted) checkpoint
])
def test_warm_start_checkpoint_of_another_model_size(name, item, macro, tmp_path, capsys):
  small = config_lib.RealmConfig(bert=config_lib.small_bert())
  step_dir = checkpoints.save_checkpoint(
      str(tmp_path / "source"), 5, {item: {"w": np.zeros([2], np.float32)}}, config=small)
  line = _one_config_error(capsys, _train(
      *DRY_RUNS[name], f"--gin.RUN_DIR='{tmp_path / 'run'}'", f"--gin.{macro}='{step_dir}'",
      "--dry_run"))
  assert line.startswith(f"train: config error: {macro.lower()}: "), line
  assert "another model size" in line, line


@pytest.mark.parametrize("name,macro", [("toy_ict", "INIT_CHECKPOINT"),
                                        ("toy_pretrain", "ENCODER_CHECKPOINT"),
                                        ("toy_finetune", "ENCODER_CHECKPOINT")])
def test_bert_warm_start_needs_only_the_bert_shape(name, macro, tmp_path, capsys):
  """A converted BERT records transformers' defaults for REALM's heads ([CLS] pooling, span
  width 256); only its BERT shape has to match the run's, since the heads start fresh."""
  # The toy model's BERT shape (models/toy.gin).
  bert = config_lib.RealmConfig(
      bert=config_lib.tiny_bert(hidden_size=128, num_heads=2, intermediate_size=512))
  assert bert.retriever_pooling == "cls" and bert.span_hidden_size == 256
  step_dir = checkpoints.save_checkpoint(
      str(tmp_path / "bert"), 0, {"encoder": {"w": np.zeros([2], np.float32)}}, config=bert)
  assert _train(*DRY_RUNS[name], f"--gin.RUN_DIR='{tmp_path / 'run'}'",
                f"--gin.{macro}='{step_dir}'", "--dry_run") == 0, capsys.readouterr()
  other = config_lib.RealmConfig(bert=config_lib.tiny_bert(hidden_size=64, num_heads=2))
  step_dir = checkpoints.save_checkpoint(
      str(tmp_path / "other"), 0, {"encoder": {"w": np.zeros([2], np.float32)}}, config=other)
  line = _one_config_error(capsys, _train(
      *DRY_RUNS[name], f"--gin.RUN_DIR='{tmp_path / 'run2'}'", f"--gin.{macro}='{step_dir}'",
      "--dry_run"))
  assert "another model size" in line and "hidden_size 64 vs 128" in line, line


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_usage_flags_settings_and_gins(flag, capsys):
  from realm_jax import evaluate  # pylint: disable=import-outside-toplevel
  for main, configurable, extra_flag in ((train.main, train.train_main, "--dry_run"),
                                         (build_index.main, build_index.build_index_main,
                                          "--once"),
                                         (evaluate.main, evaluate.evaluate_main, "--question")):
    # --help wins over anything else on the line, even a missing --gin_file.
    assert main(["prog", "--gin.RUN_DIR='/x'", flag]) == 0
    out, err = capsys.readouterr()
    assert not err.strip(), err
    assert out.startswith(sys.modules[main.__module__].__doc__.strip().splitlines()[0]), out[:200]
    assert f"  {extra_flag}" in out and "  --gin_file" in out
    # Every parameter of the configurable, with its default or "required".
    settings = out.split(f"Gin-configurable settings of {configurable.__name__}")[1]
    for name, parameter in inspect.signature(configurable).parameters.items():
      line = f"  {name} (required" if parameter.default is gin.REQUIRED else (
          f"  {name} = {parameter.default!r}")
      assert line in settings, (configurable.__name__, line)
    assert "gin_configs/runs/: build_index.gin, eval.gin, finetune.gin, ict.gin" in out
  # A description from the docstring's Args section follows its setting.
  train.main(["train", flag])
  out = capsys.readouterr().out
  assert "  checkpoint_every = 1000\n      checkpoint (and evaluate) every this many steps" in out


def test_build_index_config_error_is_one_line(capsys):
  code = build_index.main(["build_index", "--gin_file=gin_configs/runs/build_index.gin"])
  out, err = _stderr_lines(capsys)
  assert code == 2 and len(err) == 1, err
  assert "required macro" in err[0]


@pytest.mark.parametrize("binding,expected", [
    ("build_index_main.length_bucket=-1", "build_index_main.length_bucket must be >= 0"),
    ("build_index_main.length_bucket=1.5", "build_index_main.length_bucket must be an int"),
    ("build_index_main.dtype='float16'", "build_index_main.dtype='float16': expected"),
    ("build_index_main.batch_size=0", "build_index_main.batch_size=0: expected an int >= 1"),
])
def test_build_index_settings_are_refused_before_any_wait(tmp_path, capsys, binding, expected):
  # The run has no checkpoint: without the check the builder would wait for one, then fail.
  code = build_index.main(["build_index", "--gin_file=gin_configs/runs/build_index.gin",
                           f"--gin.RUN_DIR='{tmp_path}'", "--gin.BLOCK_STORE='/nonexistent'",
                           f"--gin.{binding}"])
  out, err = _stderr_lines(capsys)
  assert code == 2 and len(err) == 1, err
  assert err[0].startswith("build_index: config error: " + expected), err[0]


@pytest.mark.parametrize("name,binding,expected", [
    ("toy_pretrain", "TASK='toy_qa'", "does not fit job 'pretrain'"),
    ("toy_bert", "TASK='ict_toy'", "does not fit job 'mlm'"),
    ("toy_ict", "TASK='mlm_toy'", "does not fit job 'ict'"),
    ("toy_finetune", "TASK='ict_toy'", "is not a QA task"),
    ("toy_finetune", "TASK='toy_qaa'", "unknown seqio task or mixture 'toy_qaa'"),
    ("toy_bert", "train_main.init_checkpoint='/x'", "init_checkpoint: /x"),
    # Another job's setting: gin refuses it when the files are parsed.
    ("toy_ict", "IctJob.encoder_checkpoint='/x'",
     "Configurable 'IctJob' doesn't have a parameter named 'encoder_checkpoint'"),
    ("toy_ict", "IctJob.freeze_retriever_steps=100",
     "Configurable 'IctJob' doesn't have a parameter named 'freeze_retriever_steps'"),
    ("toy_bert", "MlmJob.retriever_lr_scale=0.1",
     "Configurable 'MlmJob' doesn't have a parameter named 'retriever_lr_scale'"),
    ("toy_pretrain", "PretrainJob.ict_remove_probability=0.5",
     "Configurable 'PretrainJob' doesn't have a parameter named 'ict_remove_probability'"),
    ("toy_pretrain", "PretrainJob.retriever_lr_scale=-1.0",
     "retriever_lr_scale must be finite and >= 0"),
    ("toy_pretrain", "PretrainJob.length_bucket=-32",
     "PretrainJob.length_bucket: length_bucket must be an int >= 0"),
    ("toy_pretrain", "PretrainJob.oracle_blocks=8",
     "PretrainJob.oracle_blocks=8: expected 0 to the 7 retrieved candidates of num_candidates=8"),
    ("toy_finetune", "FinetuneJob.length_bucket=1.5",
     "FinetuneJob.length_bucket: length_bucket must be an int >= 0"),
    ("toy_finetune", "FinetuneJob.candidates='dense'",
     "FinetuneJob.candidates='dense'; expected one of index, bm25"),
    ("toy_ict", "IctJob.ict_remove_probability=1.5", "expected a probability in [0, 1]"),
    ("toy_ict", "IctJob.shuffle_buffer=0",
     "IctJob.shuffle_buffer=0: expected a whole number of examples >= 1"),
    ("toy_bert", "MlmJob.shuffle_buffer=2.5",
     "MlmJob.shuffle_buffer=2.5: expected a whole number of examples >= 1"),
    # The toy world's ict_toy is registered (keeping the sentence) before any run.
    ("toy_ict", "IctJob.ict_remove_probability=0.5",
     "task 'ict_toy' is registered already"),
    ("toy_ict", "BLOCK_STORE='/nonexistent/store'",
     "IctJob.block_store: /nonexistent/store: not a directory"),
    ("toy_ict", "train_main.job='ict'", "train_main.job is a str, not a job"),
])
def test_binding_that_does_not_fit_the_job(name, binding, expected, tmp_path, capsys):
  line = _one_config_error(capsys, _train(*DRY_RUNS[name], f"--gin.RUN_DIR='{tmp_path}'",
                                          f"--gin.{binding}", "--dry_run"))
  assert expected in line, line


def test_bm25_candidates_train_no_retriever(tmp_path, capsys):
  line = _one_config_error(capsys, _train(
      *DRY_RUNS["toy_finetune"], f"--gin.RUN_DIR='{tmp_path}'",
      "--gin.FinetuneJob.candidates='bm25'", "--gin.FinetuneJob.train_document_tower=True",
      "--dry_run"))
  assert ("FinetuneJob.train_document_tower=True trains the retriever, and candidates='bm25' "
          "has none to train" in line), line


JOB_CLASSES = {"toy_pretrain": "PretrainJob", "toy_finetune": "FinetuneJob"}


@pytest.mark.parametrize("name", ["toy_pretrain", "toy_finetune"])
def test_retriever_protection_builds_for_both_towered_jobs(name, tmp_path, capsys):
  # The optimizer finds each job's retriever ("retriever": fine-tuning's question tower too)
  # when the state is traced; a wrong key would be an error here, not a dry run.
  code = _train(*DRY_RUNS[name], f"--gin.RUN_DIR='{tmp_path / 'run'}'",
                f"--gin.{JOB_CLASSES[name]}.freeze_retriever_steps=5",
                f"--gin.{JOB_CLASSES[name]}.retriever_lr_scale=0.1", "--dry_run")
  out, err = _stderr_lines(capsys)
  assert code == 0, err
  assert "retriever lr x0.1, retriever frozen for 5 steps" in out, out


def _tiny_params(model_cls, seed):
  import jax  # pylint: disable=import-outside-toplevel
  from realm_jax.models import open_qa_model, realm  # pylint: disable=import-outside-toplevel
  config = config_lib.RealmConfig(bert=config_lib.tiny_bert(vocab_size=50), proj_size=8)
  module = open_qa_model if model_cls == "OpenQAModel" else realm
  return jax.device_get(getattr(module, model_cls)(config).init(jax.random.PRNGKey(seed)))


def _leaves_equal(a, b):
  import jax  # pylint: disable=import-outside-toplevel
  return jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, a, b))


def test_ict_towers_start_from_an_mlm_encoders_bert():
  mlm, fresh = _tiny_params("BertMlmModel", 1), _tiny_params("IctModel", 2)
  params, taken = jobs.IctJob(task="ict_toy").warm_start(mlm, fresh, "mlm/5")
  tower, fresh_tower = params["retriever"]["embedder"], fresh["retriever"]["embedder"]
  assert taken == "retriever towers' BERT (from the encoder)"
  # Embeddings and layers from the encoder; the pooler (the MLM encoder has none) and the
  # projection stay fresh.
  for name, value in mlm["encoder"]["bert"].items():
    assert _leaves_equal(tower["bert"][name], value), name
  assert _leaves_equal(tower["bert"]["pooler"], fresh_tower["bert"]["pooler"])
  assert _leaves_equal(tower["projection"], fresh_tower["projection"])
  with pytest.raises(gin_utils.ConfigError, match="no encoder params"):
    jobs.IctJob(task="ict_toy").warm_start({"retriever": fresh["retriever"]}, fresh, "ict/5")


def test_mlm_continues_from_a_checkpoints_encoder():
  """The toy BERT's second phase: BERT and MLM head from the first phase's checkpoint."""
  first, fresh = _tiny_params("BertMlmModel", 1), _tiny_params("BertMlmModel", 2)
  params, taken = jobs.MlmJob(task="mlm_toy").warm_start(first, fresh, "copy/2000")
  assert taken == "encoder (BERT and MLM head)"
  assert _leaves_equal(params["encoder"], first["encoder"])
  assert not _leaves_equal(fresh["encoder"], first["encoder"])
  with pytest.raises(gin_utils.ConfigError, match="init_checkpoint ict/5: no encoder params"):
    jobs.MlmJob(task="mlm_toy").warm_start(_tiny_params("IctModel", 3), fresh, "ict/5")


def test_pretraining_takes_the_encoder_from_an_mlm_checkpoint():
  ict, mlm = _tiny_params("IctModel", 1), _tiny_params("BertMlmModel", 2)
  fresh = _tiny_params("RealmPretrainModel", 3)
  job = jobs.PretrainJob(task="realm_toy_salient_span")
  params, taken = job.warm_start(ict, fresh, "ict/5")
  assert taken == "retriever" and _leaves_equal(params["encoder"], fresh["encoder"])
  params, taken = job.warm_start_extra("encoder_checkpoint", mlm, params, "mlm/5")
  assert taken == "encoder"
  assert _leaves_equal(params["retriever"], ict["retriever"])
  assert _leaves_equal(params["encoder"], mlm["encoder"])
  with pytest.raises(gin_utils.ConfigError, match="encoder_checkpoint ict/5: no encoder"):
    job.warm_start_extra("encoder_checkpoint", ict, params, "ict/5")


def test_pretraining_from_a_bert_without_an_mlm_head_keeps_the_fresh_head():
  """A BertModel checkpoint (a sentence encoder such as all-MiniLM-L6-v2) has no MLM head: the
  encoder takes its BERT and keeps the fresh head."""
  mlm, fresh = _tiny_params("BertMlmModel", 2), _tiny_params("RealmPretrainModel", 3)
  bert_only = {"encoder": {"bert": mlm["encoder"]["bert"]}}
  params, taken = jobs.PretrainJob(task="realm_toy_salient_span").warm_start_extra(
      "encoder_checkpoint", bert_only, fresh, "minilm/0")
  assert taken == "encoder's BERT (the checkpoint has no MLM head: a fresh one)"
  assert _leaves_equal(params["encoder"]["bert"], mlm["encoder"]["bert"])
  assert _leaves_equal(params["encoder"]["mlm_head"], fresh["encoder"]["mlm_head"])
  assert not _leaves_equal(params["encoder"]["bert"], fresh["encoder"]["bert"])


def test_orqa_fine_tuning_takes_the_reader_bert_from_a_bert_and_the_retriever_from_ict():
  """The ORQA-style baseline: an ICT init_checkpoint (retriever) and a BERT encoder_checkpoint
  (the reader's BERT; the span head stays fresh)."""
  ict, mlm = _tiny_params("IctModel", 1), _tiny_params("BertMlmModel", 2)
  fresh = _tiny_params("OpenQAModel", 3)
  job = jobs.FinetuneJob(task="toy_qa")
  params, taken = job.warm_start(ict, fresh, "ict/5")
  assert taken == "retriever" and _leaves_equal(params["retriever"], ict["retriever"])
  params, taken = job.warm_start_extra("encoder_checkpoint", mlm, params, "mlm/5")
  assert taken == "reader BERT"
  assert _leaves_equal(params["reader"]["bert"], mlm["encoder"]["bert"])
  assert _leaves_equal(params["reader"]["span_head"], fresh["reader"]["span_head"])
  assert _leaves_equal(params["retriever"], ict["retriever"])


@pytest.mark.parametrize("job_class, task, rows", [
    ("PretrainJob", "realm_toy_salient_span", "pretraining_batches"),
    ("FinetuneJob", "toy_qa", "qa_batches")])
def test_a_length_bucket_cuts_the_training_batches_reader_rows(job_class, task, rows, tmp_path):
  """`length_bucket` wraps the job's training batches in `seqio_batches.LengthBucketed` over its
  reader rows; the schema (what a dry run lowers) stays the full width; 0 wraps nothing."""
  # pylint: disable=import-outside-toplevel
  import importlib
  from realm_jax.batches import seqio_batches
  from realm_jax.jobs.base import RunContext
  from realm_jax.training import partitioning
  config = config_lib.RealmConfig(bert=config_lib.tiny_bert(), proj_size=8)
  ctx = RunContext(run_dir=str(tmp_path), model_config=config, batch_size=2, global_batch=2,
                   seed=0, mesh=partitioning.make_mesh(-1, 1), rules=partitioning.DEFAULT_RULES,
                   init_checkpoint=None)
  built = {}
  for length_bucket in (0, 32):
    job = getattr(jobs, job_class)(task=task, length_bucket=length_bucket)
    job.configure(ctx)
    model = job.build_model(ctx)
    built[length_bucket] = (job.build_batches(ctx, model), job.abstract_batch(ctx, model))
  (plain, plain_spec), (cut, cut_spec) = built[0], built[32]
  assert not isinstance(plain, seqio_batches.LengthBucketed)
  assert isinstance(cut, seqio_batches.LengthBucketed) and cut.length_bucket == 32
  assert cut.keys == importlib.import_module(f"realm_jax.batches.{rows}").READER_ROW_KEYS
  assert type(cut.batches) is type(plain) and cut.mask_key == "reader_mask"
  assert cut_spec == plain_spec


@pytest.mark.parametrize("job_class,task", [("MlmJob", "mlm_toy_reading"), ("IctJob", "ict_toy")])
def test_a_seqio_jobs_shuffle_buffer_reaches_its_batches(job_class, task, tmp_path):
  """`shuffle_buffer` sizes the job's `SeqioBatches` shuffle buffer; unset, the iterator's own
  default of 10,000 examples."""
  # pylint: disable=import-outside-toplevel
  from realm_jax.jobs.base import RunContext
  from realm_jax.training import partitioning
  config = config_lib.RealmConfig(bert=config_lib.tiny_bert(), proj_size=8)
  ctx = RunContext(run_dir=str(tmp_path), model_config=config, batch_size=2, global_batch=2,
                   seed=0, mesh=partitioning.make_mesh(-1, 1), rules=partitioning.DEFAULT_RULES,
                   init_checkpoint=None)
  sizes = []
  for shuffle_buffer in (None, 7):
    job = getattr(jobs, job_class)(task=task, shuffle_buffer=shuffle_buffer)
    job.configure(ctx)
    sizes.append(job.build_batches(ctx, job.build_model(ctx)).shuffle_buffer_size)
  assert sizes == [10_000, 7]


@pytest.mark.parametrize("peft,expected", [
    ("lora", "LoRA r 8 alpha 16 on query/value"), ("adapters", "adapters of 64")])
def test_parameter_efficient_fine_tuning_dry_run(peft, expected, tmp_path, capsys):
  code = _train(*DRY_RUNS["toy_finetune"], f"--gin.RUN_DIR='{tmp_path / 'run'}'",
                f"--gin.FinetuneJob.peft='{peft}'", "--dry_run")
  out, err = _stderr_lines(capsys)
  assert code == 0, err
  assert expected in out and " trained), " in out, out
  line = _one_config_error(capsys, _train(
      *DRY_RUNS["toy_finetune"], f"--gin.RUN_DIR='{tmp_path / 'run'}'",
      f"--gin.FinetuneJob.peft='{peft}'", "--gin.FinetuneJob.train_document_tower=True",
      "--dry_run"))
  assert "cannot train the document tower" in line


@pytest.mark.parametrize("objective", ["emdr2", "pdist", "loop", "adist"])
@pytest.mark.parametrize("name", ["toy_pretrain", "toy_finetune"])
def test_atlas_retriever_objectives_dry_run(name, objective, tmp_path, capsys):
  """Atlas's retriever objectives (retriever_objectives) build and lower through the entry
  point; unknown names and a temperature on REALM's marginal are one-line config errors."""
  job = JOB_CLASSES[name]
  code = _train(*DRY_RUNS[name], f"--gin.RUN_DIR='{tmp_path / 'run'}'",
                f"--gin.{job}.retriever_objective='{objective}'",
                f"--gin.{job}.objective_temperature=0.5", "--dry_run")
  out, err = _stderr_lines(capsys)
  assert code == 0, err
  assert f"retriever objective {objective} (T 0.5)" in out, out
  if objective != "adist":
    return
  line = _one_config_error(capsys, _train(*DRY_RUNS[name], f"--gin.RUN_DIR='{tmp_path}'",
                                          f"--gin.{job}.retriever_objective='atlas'",
                                          "--dry_run"))
  assert f"{job}.retriever_objective='atlas': not one of marginal, emdr2" in line, line
  line = _one_config_error(capsys, _train(*DRY_RUNS[name], f"--gin.RUN_DIR='{tmp_path}'",
                                          f"--gin.{job}.objective_temperature=0.5",
                                          "--dry_run"))
  assert "REALM's marginal has no temperature" in line, line


@pytest.mark.parametrize("entry_point", ["train", "build_index"])
def test_a_run_directory_another_process_writes_is_refused_in_one_line(entry_point, tmp_path,
                                                                        capsys):
  from realm_jax import fileio  # pylint: disable=import-outside-toplevel
  run_dir = str(tmp_path / "run")
  role = "trainer" if entry_point == "train" else "builder"
  with fileio.run_dir_lock(run_dir, role) as lock:
    if entry_point == "train":
      code = _train(*DRY_RUNS["toy_ict"], f"--gin.RUN_DIR='{run_dir}'",
                    "--gin.NUM_STEPS=1")
    else:
      code = build_index.main(["build_index", "--gin_file=gin_configs/runs/build_index.gin",
                               f"--gin.RUN_DIR='{run_dir}'", "--once",
                               f"--gin.BLOCK_STORE='{realm_jax_tasks.toy_block_store_dir()}'"])
    holder = open(lock).read()
  _, err = _stderr_lines(capsys)
  assert code == 2, err
  started = json.loads(holder)["started"]
  assert err[-1] == (f"{entry_point}: error: {run_dir} is in use by another {role} (pid "
                     f"{os.getpid()} on {socket.gethostname()}, started {started}; "
                     f"lock {lock}): stop it, or give this run another directory"), err
  assert not os.path.exists(os.path.join(run_dir, "checkpoints"))  # nothing of the run touched
