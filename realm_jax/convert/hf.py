"""Import transformers REALM and BERT checkpoints into realm_jax parameter trees.

Reads a local directory with `config.json` and `model.safetensors` (or `pytorch_model.bin`);
nothing is downloaded. The `KINDS` (embedder, scorer, encoder, reader, open_qa, bert) come from
`config.json`'s `architectures`. Every tensor is converted or known unused (`_UNUSED`); any
other, or one missing, is a `CheckpointMismatchError`.

  python -m realm_jax.convert.hf --hf_dir DIR --run_dir RUN [--kind bert]

writes a BERT as step 0 of a run directory, the `{"encoder"}` warm start of ICT and pretraining.
`write_bert_mlm` goes the other way. Design notes: docs/design/training_and_commands.md.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable

import numpy as np

from realm_jax.models.config import BertConfig, RealmConfig

StateDict = dict[str, np.ndarray]
Params = dict[str, Any]

KINDS = ("embedder", "scorer", "encoder", "reader", "open_qa", "bert")

_ARCHITECTURE_KINDS = {
    "RealmEmbedder": "embedder",
    "RealmScorer": "scorer",
    "RealmKnowledgeAugEncoder": "encoder",
    "RealmReader": "reader",
    "RealmForOpenQA": "open_qa",
    "BertModel": "bert",
    "BertForMaskedLM": "bert",
    "BertForPreTraining": "bert",
}

# Tensors transformers' classes hold but never use: MLM heads inside the embedder and reader,
# unread poolers, BERT's next-sentence head, and non-persistent buffers some versions saved.
_UNUSED = {
    "embedder": [r"cls\.predictions\..*", r".*position_ids", r".*embeddings\.token_type_ids"],
    "encoder": [r"realm\.pooler\..*", r".*position_ids", r".*embeddings\.token_type_ids"],
    "reader": [r"realm\.pooler\..*", r"cls\.predictions\..*", r".*position_ids",
               r".*embeddings\.token_type_ids"],
    "scorer": [r"(query_)?embedder\.cls\.predictions\..*", r".*position_ids",
               r".*embeddings\.token_type_ids"],
    "open_qa": [r"reader\.realm\.pooler\..*", r"reader\.cls\.predictions\..*",
                r"embedder\.cls\.predictions\..*", r".*position_ids",
                r".*embeddings\.token_type_ids"],
    "bert": [r"(bert\.)?pooler\..*", r"cls\.seq_relationship\..*", r".*position_ids",
             r".*embeddings\.token_type_ids"],
}


class CheckpointMismatchError(ValueError):
  """The checkpoint's tensors do not match the model (lists missing and unexpected ones)."""


# ----------------------------------------------------------------------------- reading files


def read_config(directory: str) -> dict:
  """The checkpoint's `config.json` as a dict."""
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{directory}: no config.json (a transformers checkpoint "
                            "directory holds config.json and model.safetensors).")
  with open(path, encoding="utf-8") as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not valid JSON ({e}).") from e


def read_state_dict(directory: str) -> StateDict:
  """All tensors of `model.safetensors` (preferred) or `pytorch_model.bin` as NumPy arrays.

  bfloat16 tensors come back as float32.
  """
  safetensors_path = os.path.join(directory, "model.safetensors")
  torch_path = os.path.join(directory, "pytorch_model.bin")
  if os.path.isfile(safetensors_path):
    # The flax loader understands bfloat16, which plain NumPy cannot hold.
    from safetensors.flax import load_file
    tensors = load_file(safetensors_path)
    return {k: _to_numpy(np.asarray(v)) for k, v in tensors.items()}
  if os.path.isfile(torch_path):
    try:
      import torch
    except ImportError as e:
      raise ImportError(f"{torch_path}: reading pytorch_model.bin needs torch "
                        "(pip install 'realm_jax[test]'), or convert it to "
                        "model.safetensors.") from e
    tensors = torch.load(torch_path, map_location="cpu", weights_only=True)
    return {k: _to_numpy(v.float().numpy() if v.is_floating_point() else v.numpy())
            for k, v in tensors.items()}
  raise FileNotFoundError(f"{directory}: neither model.safetensors nor pytorch_model.bin.")


def _to_numpy(array: np.ndarray) -> np.ndarray:
  if array.dtype.kind == "f" or str(array.dtype) == "bfloat16":
    return np.asarray(array, np.float32)
  return np.asarray(array)


# ----------------------------------------------------------------------------- configs


def bert_config_from_hf(hf: dict, **overrides) -> BertConfig:
  """Our BertConfig from a transformers BERT/REALM `config.json` dict."""
  kind = hf.get("position_embedding_type", "absolute")
  if kind != "absolute":
    raise ValueError(f"position_embedding_type={kind!r} is not supported (only 'absolute').")
  values = dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
      intermediate_size=hf["intermediate_size"], hidden_act=hf["hidden_act"],
      max_position_embeddings=hf["max_position_embeddings"],
      type_vocab_size=hf["type_vocab_size"], layer_norm_eps=hf["layer_norm_eps"],
      initializer_range=hf.get("initializer_range", 0.02),
      hidden_dropout=hf.get("hidden_dropout_prob", 0.1),
      attention_dropout=hf.get("attention_probs_dropout_prob", 0.1))
  values.update(overrides)
  return BertConfig(**values)


def realm_config_from_hf(hf: dict, **overrides) -> RealmConfig:
  """Our RealmConfig from a transformers `RealmConfig` dict (BERT configs get defaults)."""
  bert_overrides = {k[len("bert."):]: v for k, v in overrides.items() if k.startswith("bert.")}
  own = {k: v for k, v in overrides.items() if not k.startswith("bert.")}
  values = dict(
      bert=bert_config_from_hf(hf, **bert_overrides),
      # The port's projection LayerNorm uses BERT's epsilon (REALM_SPEC 1).
      proj_layer_norm_eps=hf["layer_norm_eps"])
  if hf.get("model_type") == "realm":
    values.update(proj_size=hf["retriever_proj_size"], span_hidden_size=hf["span_hidden_size"],
                  max_span_width=hf["max_span_width"],
                  span_layer_norm_eps=hf["reader_layer_norm_eps"])
  values.update(own)
  return RealmConfig(**values)


# ----------------------------------------------------------------------------- tensor mapping


class _Reader:
  """Takes tensors out of a state dict by name, remembering what was used and missing."""

  def __init__(self, state: StateDict):
    self.state = state
    self.used: set[str] = set()
    self.missing: list[str] = []

  def take(self, name: str, transform: Callable[[np.ndarray], np.ndarray] = lambda x: x):
    # TF-era BERT checkpoints name LayerNorm parameters gamma/beta.
    for candidate in (name, name.replace(".weight", ".gamma").replace(".bias", ".beta")):
      if candidate in self.state:
        self.used.add(candidate)
        return transform(self.state[candidate])
    self.missing.append(name)
    return None

  def has_prefix(self, prefix: str) -> bool:
    return any(k.startswith(prefix) for k in self.state)

  def check(self, kind: str, directory: str = "") -> None:
    patterns = [re.compile(p) for p in _UNUSED.get(kind, [r".*position_ids"])]
    unexpected = sorted(k for k in self.state if k not in self.used
                        and not any(p.fullmatch(k) for p in patterns))
    if self.missing or unexpected:
      where = f"{directory}: " if directory else ""
      lines = [f"{where}checkpoint does not match a {kind!r} model."]
      if self.missing:
        lines.append(f"  missing tensors ({len(self.missing)}): " + ", ".join(self.missing))
      if unexpected:
        lines.append(f"  unexpected tensors ({len(unexpected)}): " + ", ".join(unexpected))
      raise CheckpointMismatchError("\n".join(lines))


def _linear(reader: _Reader, prefix: str) -> dict:
  """torch Linear [out, in] -> flax Dense {kernel [in, out], bias [out]}."""
  return {"kernel": reader.take(prefix + ".weight", lambda w: w.T),
          "bias": reader.take(prefix + ".bias")}


def _layer_norm(reader: _Reader, prefix: str) -> dict:
  return {"scale": reader.take(prefix + ".weight"), "bias": reader.take(prefix + ".bias")}


def _bert(reader: _Reader, prefix: str, config: BertConfig, use_pooler: bool) -> dict:
  """Our BertModel tree from `prefix`embeddings.*, `prefix`encoder.layer.N.*, pooler."""
  heads, head_dim, hidden = config.num_heads, config.head_dim, config.hidden_size

  def qkv(p: str) -> dict:
    # [hidden_out, hidden_in] -> [embed, heads, kv]
    return {"kernel": reader.take(p + ".weight", lambda w: w.T.reshape(hidden, heads, head_dim)),
            "bias": reader.take(p + ".bias", lambda b: b.reshape(heads, head_dim))}

  emb = prefix + "embeddings."
  tree = {"embeddings": {
      "word_embeddings": {"embedding": reader.take(emb + "word_embeddings.weight")},
      "position_embeddings": {"embedding": reader.take(emb + "position_embeddings.weight")},
      "token_type_embeddings": {"embedding": reader.take(emb + "token_type_embeddings.weight")},
      "layer_norm": _layer_norm(reader, emb + "LayerNorm"),
  }}
  for i in range(config.num_layers):
    p = f"{prefix}encoder.layer.{i}."
    tree[f"layer_{i}"] = {
        "attention": {
            "query": qkv(p + "attention.self.query"),
            "key": qkv(p + "attention.self.key"),
            "value": qkv(p + "attention.self.value"),
            "out": {
                # [hidden_out, hidden_in] -> [heads, kv, embed]
                "kernel": reader.take(p + "attention.output.dense.weight",
                                      lambda w: w.T.reshape(heads, head_dim, hidden)),
                "bias": reader.take(p + "attention.output.dense.bias")},
        },
        "attention_layer_norm": _layer_norm(reader, p + "attention.output.LayerNorm"),
        "intermediate": _linear(reader, p + "intermediate.dense"),
        "output": _linear(reader, p + "output.dense"),
        "output_layer_norm": _layer_norm(reader, p + "output.LayerNorm"),
    }
  if use_pooler:
    tree["pooler"] = _linear(reader, prefix + "pooler.dense")
  return tree


def _embedder(reader: _Reader, prefix: str, config: RealmConfig) -> dict:
  return {"bert": _bert(reader, prefix + "realm.", config.bert, use_pooler=True),
          "projection": _linear(reader, prefix + "cls.dense"),
          "projection_layer_norm": _layer_norm(reader, prefix + "cls.LayerNorm")}


def _mlm_head(reader: _Reader, prefix: str, word_embeddings_name: str) -> dict:
  """BERT's MLM head; its decoder must be the (tied) word embedding matrix."""
  decoder = prefix + "predictions.decoder.weight"
  if decoder in reader.state:
    reader.used.add(decoder)
    word = reader.state.get(word_embeddings_name)
    if word is not None and not np.array_equal(reader.state[decoder], word):
      raise CheckpointMismatchError(
          f"{decoder} differs from {word_embeddings_name}: untied MLM decoders are not "
          "supported (REALM and BERT tie them).")
  decoder_bias = prefix + "predictions.decoder.bias"
  if decoder_bias in reader.state:  # transformers ties it to predictions.bias
    reader.used.add(decoder_bias)
  return {"transform": _linear(reader, prefix + "predictions.transform.dense"),
          "transform_layer_norm": _layer_norm(reader, prefix + "predictions.transform.LayerNorm"),
          "bias": reader.take(prefix + "predictions.bias")}


def _reader(reader: _Reader, prefix: str, config: RealmConfig) -> dict:
  return {"bert": _bert(reader, prefix + "realm.", config.bert, use_pooler=False),
          "span_head": {
              "intermediate": _linear(reader, prefix + "qa_outputs.dense_intermediate"),
              "span_layer_norm": _layer_norm(reader, prefix + "qa_outputs.layer_normalization"),
              "output": _linear(reader, prefix + "qa_outputs.dense_output")}}


def _scorer(reader: _Reader, config: RealmConfig) -> tuple[dict, RealmConfig]:
  """RealmScorer: `embedder.*` and, when untied, a different `query_embedder.*`."""
  documents = _embedder(reader, "embedder.", config)
  if not reader.has_prefix("query_embedder."):
    return {"embedder": documents}, config.replace(share_embedders=True)
  probe = _Reader(reader.state)
  queries = _embedder(probe, "query_embedder.", config)
  reader.used |= probe.used
  reader.missing += probe.missing
  tied = not probe.missing and all(
      np.array_equal(reader.state[k], reader.state["embedder." + k[len("query_embedder."):]])
      for k in probe.used if "embedder." + k[len("query_embedder."):] in reader.state)
  if tied:
    return {"embedder": documents}, config.replace(share_embedders=True)
  return ({"query_embedder": queries, "document_embedder": documents},
          config.replace(share_embedders=False))


def convert_state_dict(state: StateDict, hf_config: dict, kind: str, directory: str = "",
                       **config_overrides) -> tuple[RealmConfig, Params, dict]:
  """Converts an in-memory state dict; see `load_checkpoint`."""
  if kind not in KINDS:
    raise ValueError(f"kind={kind!r}; expected one of {KINDS}.")
  config = realm_config_from_hf(hf_config, **config_overrides)
  reader = _Reader(state)
  extras: dict = {}
  if kind == "embedder":
    params = _embedder(reader, "", config)
  elif kind == "scorer":
    params, config = _scorer(reader, config)
  elif kind == "encoder":
    params = {"bert": _bert(reader, "realm.", config.bert, use_pooler=False),
              "mlm_head": _mlm_head(reader, "cls.", "realm.embeddings.word_embeddings.weight")}
  elif kind == "reader":
    params = _reader(reader, "", config)
  elif kind == "open_qa":
    params = {"query_embedder": _embedder(reader, "embedder.", config),
              "reader": _reader(reader, "reader.", config)}
    block_emb = reader.take("block_emb")
    if block_emb is not None:
      extras["block_emb"] = block_emb
  else:  # bert
    prefix = "bert." if reader.has_prefix("bert.") else ""
    params = {"bert": _bert(reader, prefix, config.bert,
                            use_pooler=reader.has_prefix(prefix + "pooler."))}
    if reader.has_prefix("cls.predictions."):
      params["mlm_head"] = _mlm_head(reader, "cls.",
                                     prefix + "embeddings.word_embeddings.weight")
  reader.check(kind, directory)
  return config, params, extras


def detect_kind(hf_config: dict, directory: str = "") -> str:
  """The checkpoint kind from `config.json`'s `architectures`."""
  for arch in hf_config.get("architectures") or []:
    if arch in _ARCHITECTURE_KINDS:
      return _ARCHITECTURE_KINDS[arch]
  raise ValueError(
      f"{directory}: config.json architectures={hf_config.get('architectures')} is not one of "
      f"{sorted(_ARCHITECTURE_KINDS)}; pass kind= one of {KINDS}.")


def load_checkpoint(directory: str, kind: str | None = None,
                    **config_overrides) -> tuple[RealmConfig, Params, dict]:
  """Loads a transformers REALM or BERT checkpoint directory.

  Args:
    directory: holds `config.json` and `model.safetensors` or `pytorch_model.bin`.
    kind: one of KINDS; detected from `config.json` when None.
    **config_overrides: RealmConfig fields to change (e.g. `bert.dtype="bfloat16"`).

  Returns:
    (config, params, extras): params is the plain float32 tree for the module of that kind;
    extras holds `block_emb` [blocks, proj] for an open-QA checkpoint.

  Raises:
    CheckpointMismatchError: listing missing and unexpected tensors.
  """
  hf_config = read_config(directory)
  kind = kind or detect_kind(hf_config, directory)
  state = read_state_dict(directory)
  return convert_state_dict(state, hf_config, kind, directory, **config_overrides)


# ----------------------------------------------------------------------------- export


def bert_config_to_hf(config: BertConfig) -> dict:
  """A transformers `BertForMaskedLM` `config.json` dict (inverse of `bert_config_from_hf`)."""
  return {
      "architectures": ["BertForMaskedLM"], "model_type": "bert",
      "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
      "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
      "intermediate_size": config.intermediate_size, "hidden_act": config.hidden_act,
      "max_position_embeddings": config.max_position_embeddings,
      "type_vocab_size": config.type_vocab_size, "layer_norm_eps": config.layer_norm_eps,
      "initializer_range": config.initializer_range,
      "hidden_dropout_prob": config.hidden_dropout,
      "attention_probs_dropout_prob": config.attention_dropout,
      "position_embedding_type": "absolute", "pad_token_id": 0,
  }


def bert_mlm_state_dict(params: Params, config: BertConfig) -> StateDict:
  """transformers `BertForMaskedLM` tensors of an encoder tree `{"bert", "mlm_head"}` (the
  knowledge-augmented encoder's, which is BERT with its MLM head; inverse of kind "bert").

  The tied decoder (`cls.predictions.decoder.weight`, the word embeddings) is not written, as
  transformers' safetensors files leave out tied tensors.
  """
  heads, head_dim, hidden = config.num_heads, config.head_dim, config.hidden_size
  array = lambda x: np.ascontiguousarray(np.asarray(x, np.float32))
  bert, head = params["bert"], params["mlm_head"]
  state = {}

  def linear(name: str, tree: dict) -> None:  # flax {kernel [in, out]} -> torch [out, in]
    state[name + ".weight"] = array(np.asarray(tree["kernel"]).T)
    state[name + ".bias"] = array(tree["bias"])

  def norm(name: str, tree: dict) -> None:
    state[name + ".weight"] = array(tree["scale"])
    state[name + ".bias"] = array(tree["bias"])

  emb = bert["embeddings"]
  for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
    state[f"bert.embeddings.{name}.weight"] = array(emb[name]["embedding"])
  norm("bert.embeddings.LayerNorm", emb["layer_norm"])
  for i in range(config.num_layers):
    layer, p = bert[f"layer_{i}"], f"bert.encoder.layer.{i}."
    for name in ("query", "key", "value"):
      qkv = layer["attention"][name]
      # [embed, heads, kv] -> [hidden_out, hidden_in]
      state[p + f"attention.self.{name}.weight"] = array(
          np.asarray(qkv["kernel"]).reshape(hidden, heads * head_dim).T)
      state[p + f"attention.self.{name}.bias"] = array(np.asarray(qkv["bias"]).reshape(-1))
    out = layer["attention"]["out"]
    # [heads, kv, embed] -> [hidden_out, hidden_in]
    state[p + "attention.output.dense.weight"] = array(
        np.asarray(out["kernel"]).reshape(heads * head_dim, hidden).T)
    state[p + "attention.output.dense.bias"] = array(out["bias"])
    norm(p + "attention.output.LayerNorm", layer["attention_layer_norm"])
    linear(p + "intermediate.dense", layer["intermediate"])
    linear(p + "output.dense", layer["output"])
    norm(p + "output.LayerNorm", layer["output_layer_norm"])
  linear("cls.predictions.transform.dense", head["transform"])
  norm("cls.predictions.transform.LayerNorm", head["transform_layer_norm"])
  state["cls.predictions.bias"] = array(head["bias"])
  return state


def write_bert_mlm(directory: str, params: Params, config: BertConfig) -> str:
  """Writes an encoder tree `{"bert", "mlm_head"}` as a transformers `BertForMaskedLM`
  directory (`config.json` + `model.safetensors`) that `load_checkpoint` and transformers'
  `BertForMaskedLM.from_pretrained` read. The bytes depend only on the parameters.

  Returns:
    The path of `model.safetensors`.
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, "model.safetensors")
  save_file(bert_mlm_state_dict(params, config), path, metadata={"format": "pt"})
  with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
    json.dump(bert_config_to_hf(config), f, indent=2, sort_keys=True)
    f.write("\n")
  return path


# The kinds `write_checkpoint` converts, all into the "encoder" item.
_WARM_START_KINDS = ("bert", "encoder")


def write_checkpoint(directory: str, run_dir: str, kind: str | None = None,
                     **config_overrides) -> str:
  """Converts a transformers checkpoint into step 0 of a realm_jax run directory.

  Args:
    directory: the transformers checkpoint (see `load_checkpoint`).
    run_dir: the run directory to write `checkpoints/0` into.
    kind: "bert" or "encoder", written as `{"encoder"}` (what ICT's `init_checkpoint` and
      pretraining's `encoder_checkpoint` read); detected from `config.json` when None.
    **config_overrides: RealmConfig fields to change.

  Returns:
    The checkpoint step directory.
  """
  from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
  kind = kind or detect_kind(read_config(directory), directory)
  if kind not in _WARM_START_KINDS:
    raise ValueError(f"{directory}: a {kind!r} checkpoint is no BERT warm start; convert a "
                     f"{' or '.join(_WARM_START_KINDS)} checkpoint")
  config, params, _ = load_checkpoint(directory, kind, **config_overrides)
  # The knowledge-augmented encoder has no pooler: a BertModel's (e.g. a sentence encoder's)
  # is left out, so that the item has the encoder's tree (its MLM head, if any, included).
  bert = {name: value for name, value in params["bert"].items() if name != "pooler"}
  return checkpoints.save_checkpoint(run_dir, 0, {"encoder": {**params, "bert": bert}},
                                     config=config)


def main(argv: list[str] | None = None) -> int:
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(prog="python -m realm_jax.convert.hf",
                                   description=write_checkpoint.__doc__.split("\n\n")[0])
  parser.add_argument("--hf_dir", required=True, help="config.json + model.safetensors/.bin")
  parser.add_argument("--run_dir", required=True, help="writes <run_dir>/checkpoints/0")
  parser.add_argument("--kind", default=None, choices=_WARM_START_KINDS,
                      help="default: from config.json's architectures")
  args = parser.parse_args(argv)
  from realm_jax import gin_utils  # pylint: disable=g-import-not-at-top

  def convert() -> int:
    step_dir = write_checkpoint(args.hf_dir, args.run_dir, args.kind)
    print(f"convert: wrote {step_dir}", flush=True)
    return 0

  return gin_utils.run_command(
      "convert", convert, interrupted="no checkpoint was written (one is renamed into place "
      "only when complete)", expected=(OSError, ValueError), describe=gin_utils.one_line)


if __name__ == "__main__":
  from realm_jax import gin_utils  # pylint: disable=g-import-not-at-top
  gin_utils.exit_process(main(), "convert.hf")
