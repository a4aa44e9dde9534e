"""Model structure and numerics that the transformers parity tests do not cover."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax.models import config as model_config
from realm_jax.models import bert
from realm_jax.models.bert import BertModel
from realm_jax.models.reader import (RealmKnowledgeAugEncoder, RealmReader, enumerate_spans,
                                     gather_positions, predict_span, span_correctness)
from realm_jax.models.retriever import RealmEmbedder, RealmRetriever, relevance_scores

TINY = model_config.RealmConfig(bert=model_config.tiny_bert(vocab_size=50))
LOGICAL_AXES = {"embed", "mlp", "heads", "kv", "vocab", "proj", None}


def _relative_error(approx, exact):
  approx = np.asarray(approx, np.float64)
  exact = np.asarray(exact, np.float64)
  return np.linalg.norm(approx - exact) / np.linalg.norm(exact)


def test_bfloat16_forward_stays_within_one_percent_of_float32():
  """BERT-base shapes, random weights: ||bf16 - f32|| / ||f32|| <= 1e-2 for the hidden states
  and the pooled output (relative in norm: elementwise ratios blow up near zero)."""
  config = model_config.base_bert()
  rng = np.random.default_rng(0)
  ids = rng.integers(1, config.vocab_size, (2, 64))
  mask = np.ones_like(ids)
  mask[1, 40:] = 0
  params = nn.unbox(BertModel(config, use_pooler=True).init(jax.random.PRNGKey(0), ids))
  hidden32, pooled32 = BertModel(config, use_pooler=True).apply(params, ids, None, mask)
  bf16 = dataclasses.replace(config, dtype="bfloat16")
  hidden16, pooled16 = BertModel(bf16, use_pooler=True).apply(params, ids, None, mask)
  assert _relative_error(hidden16, hidden32) <= 1e-2
  assert _relative_error(pooled16, pooled32) <= 1e-2
  # The comparison is not vacuous: bfloat16 really changed the numbers.
  assert _relative_error(hidden16, hidden32) > 1e-5


def test_enumerate_spans_is_width_major_with_10L_minus_45_spans():
  starts, ends = enumerate_spans(4, 3)
  # Hand-listed: widths 1 (4 spans), 2 (3 spans), 3 (2 spans).
  assert list(zip(starts, ends)) == [(0, 0), (1, 1), (2, 2), (3, 3),
                                     (0, 1), (1, 2), (2, 3),
                                     (0, 2), (1, 3)]
  assert len(enumerate_spans(320, 10)[0]) == 10 * 320 - 45 == 3155
  assert len(enumerate_spans(96, 10)[0]) == 10 * 96 - 45


def test_gather_positions():
  hidden = jnp.arange(2 * 4 * 3).reshape(2, 4, 3)
  got = gather_positions(hidden, jnp.array([[3, 0], [1, 1]]))
  np.testing.assert_array_equal(got, [[[9, 10, 11], [0, 1, 2]], [[15, 16, 17], [15, 16, 17]]])


def test_span_correctness_and_prediction_by_hand():
  starts, ends = enumerate_spans(5, 2)  # 5 width-1 spans, then (0,1) (1,2) (2,3) (3,4)
  gold_starts = np.array([[2, 3], [-1, -1]])
  gold_ends = np.array([[3, 3], [-1, -1]])
  correct = np.asarray(span_correctness(starts, ends, gold_starts, gold_ends))
  expected = np.zeros((2, 9), bool)
  expected[0, 3] = True  # span (3, 3)
  expected[0, 7] = True  # span (2, 3)
  np.testing.assert_array_equal(correct, expected)

  logits = np.full((2, 9), -5.0)
  logits[1, 6] = 2.0   # block 1, span (1, 2)
  logits[0, 2] = 1.5
  block, start, end = predict_span(jnp.asarray(logits), starts, ends)
  assert (int(block), int(start), int(end)) == (1, 1, 2)


def test_reader_invalid_spans_and_retrieval_score_is_added():
  ids = np.arange(1, 13).reshape(1, 12) % 50
  types = np.array([[0] * 4 + [1] * 8])
  mask = np.ones_like(ids)
  block_mask = types.astype(bool)
  block_mask[0, -1] = False  # final [SEP]
  reader = RealmReader(TINY)
  params = nn.unbox(reader.init(jax.random.PRNGKey(0), ids, types, mask, block_mask,
                                np.zeros(1)))
  base, starts, ends = reader.apply(params, ids, types, mask, block_mask, np.zeros(1))
  shifted, _, _ = reader.apply(params, ids, types, mask, block_mask, np.array([3.5]))
  np.testing.assert_allclose(shifted - base, 3.5, atol=1e-5)
  starts, ends = np.asarray(starts), np.asarray(ends)
  valid = block_mask[0, starts] & block_mask[0, ends]
  assert valid.sum() == sum(max(0, 7 - w + 1) for w in range(1, 11))
  assert np.all(np.asarray(base)[0, ~valid] < -9000)
  assert np.all(np.asarray(base)[0, valid] > -100)


def test_reader_accepts_a_batch_of_questions():
  ids = np.ones((2, 3, 12), np.int32)
  block_mask = np.ones_like(ids)
  reader = RealmReader(TINY)
  params = nn.unbox(reader.init(jax.random.PRNGKey(0), ids, ids * 0, ids, block_mask,
                                np.zeros((2, 3))))
  logits, _, _ = reader.apply(params, ids, ids * 0, ids, block_mask, np.zeros((2, 3)))
  flat, _, _ = reader.apply(params, ids[1], ids[1] * 0, ids[1], block_mask[1], np.zeros(3))
  assert logits.shape == (2, 3, 10 * 12 - 45)
  np.testing.assert_allclose(logits[1], flat, atol=1e-5)


def test_encoder_logits_only_at_mask_positions_match_full_sequence_head():
  ids = np.random.default_rng(0).integers(1, 50, (2, 3, 9))
  types, mask = np.zeros_like(ids), np.ones_like(ids)
  positions = np.array([[1, 2, 0], [5, 3, 0]])
  encoder = RealmKnowledgeAugEncoder(TINY)
  params = nn.unbox(encoder.init(jax.random.PRNGKey(0), ids, types, mask, positions))
  logits = encoder.apply(params, ids, types, mask, positions)
  assert logits.shape == (2, 3, 3, 50)
  # Evaluating at every position and then gathering gives the same numbers.
  every = encoder.apply(params, ids, types, mask,
                        np.broadcast_to(np.arange(9), (2, 9)))
  np.testing.assert_allclose(
      logits, np.take_along_axis(np.asarray(every), positions[:, None, :, None], axis=2),
      atol=1e-5)


def _retriever_inputs():
  rng = np.random.default_rng(1)
  q = rng.integers(1, 50, (2, 6))
  c = rng.integers(1, 50, (2, 4, 8))
  return q, q * 0, np.ones_like(q), c, c * 0, np.ones_like(c)


def test_tied_towers_share_parameters_and_untied_do_not():
  inputs = _retriever_inputs()
  tied = nn.unbox(RealmRetriever(TINY).init(jax.random.PRNGKey(0), *inputs))
  assert set(tied["params"]) == {"embedder"}
  untied_model = RealmRetriever(TINY.replace(share_embedders=False))
  untied = nn.unbox(untied_model.init(jax.random.PRNGKey(0), *inputs))
  assert set(untied["params"]) == {"query_embedder", "document_embedder"}

  scores, query_emb, cand_emb = RealmRetriever(TINY).apply(tied, *inputs)
  # Tied: embedding a candidate as a query gives the same vector.
  as_query = RealmRetriever(TINY).apply(tied, inputs[3][:, 0], inputs[4][:, 0], inputs[5][:, 0],
                                        method=RealmRetriever.embed_queries)
  np.testing.assert_allclose(as_query, cand_emb[:, 0], atol=1e-6)
  # Scores are plain dot products (no temperature).
  np.testing.assert_allclose(scores, np.einsum("bp,bkp->bk", query_emb, cand_emb), atol=1e-5)
  np.testing.assert_allclose(relevance_scores(query_emb, cand_emb), scores, atol=1e-6)

  # Untied: the two towers give different embeddings of the same text.
  as_query = untied_model.apply(untied, inputs[3][:, 0], method=RealmRetriever.embed_queries)
  as_doc = untied_model.apply(untied, inputs[3][:, 0], method=RealmRetriever.embed_documents)
  assert np.max(np.abs(np.asarray(as_query) - np.asarray(as_doc))) > 1e-3


def test_every_parameter_has_logical_axis_names():
  inputs = _retriever_inputs()
  boxed = [RealmRetriever(TINY).init(jax.random.PRNGKey(0), *inputs)["params"],
           RealmReader(TINY).init(jax.random.PRNGKey(0), np.ones((1, 12), np.int32),
                                  np.zeros((1, 12), np.int32), np.ones((1, 12), np.int32),
                                  np.ones((1, 12), np.int32), np.zeros(1))["params"],
           RealmKnowledgeAugEncoder(TINY).init(jax.random.PRNGKey(0), inputs[3], inputs[4],
                                               inputs[5], np.zeros((2, 2), np.int32))["params"]]
  for tree in boxed:
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert leaves and all(isinstance(leaf, nn.LogicallyPartitioned) for leaf in leaves)
    for leaf in leaves:
      assert len(leaf.names) == leaf.value.ndim
      assert set(leaf.names) <= LOGICAL_AXES
      # Every matrix is sharded along at least one named axis.
      if leaf.value.ndim >= 2:
        assert any(name is not None for name in leaf.names)
  spec = nn.get_partition_spec(boxed[0])
  query = spec["embedder"]["bert"]["layer_0"]["attention"]["query"]["kernel"]
  assert tuple(query) == ("embed", "heads", "kv")


def test_dropout_is_active_only_when_not_deterministic():
  config = TINY.replace(proj_dropout=0.5)
  ids = np.ones((2, 6), np.int32)
  params = nn.unbox(RealmEmbedder(config).init(jax.random.PRNGKey(0), ids))
  a = RealmEmbedder(config).apply(params, ids)
  b = RealmEmbedder(config).apply(params, ids)
  np.testing.assert_array_equal(a, b)
  c = RealmEmbedder(config).apply(params, ids, deterministic=False,
                                  rngs={"dropout": jax.random.PRNGKey(1)})
  assert np.max(np.abs(np.asarray(c) - np.asarray(a))) > 1e-3


def test_config_validation_and_round_trip():
  with pytest.raises(ValueError, match="not divisible"):
    model_config.BertConfig(hidden_size=30, num_heads=4)
  with pytest.raises(ValueError, match="hidden_act='tanh'"):
    model_config.BertConfig(hidden_act="tanh")
  with pytest.raises(ValueError, match="dtype='float64'"):
    model_config.BertConfig(dtype="float64")
  with pytest.raises(ValueError, match="max_position_embeddings=512"):
    RealmEmbedder(TINY).init(jax.random.PRNGKey(0), np.ones((1, 513), np.int32))
  config = TINY.replace(**{"bert.dtype": "bfloat16", "proj_size": 64})
  assert config.bert.dtype == "bfloat16" and config.proj_size == 64
  assert model_config.realm_config_from_dict(model_config.config_to_dict(config)) == config


def _layer_norm(x, scale, bias, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + bias


def test_mean_pooling_embeds_the_mean_of_real_tokens_and_ignores_padding():
  config = TINY.replace(retriever_pooling="mean")
  rng = np.random.default_rng(3)
  # [2, 8]: the second row has 3 padding slots.
  ids = rng.integers(1, 50, (2, 8)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 5:] = 0
  types = np.zeros_like(ids)
  params = nn.unbox(RealmEmbedder(config).init(jax.random.PRNGKey(0), ids, types, mask))
  emb = np.asarray(RealmEmbedder(config).apply(params, ids, types, mask))

  # NumPy reference from the encoder's hidden states and the head's parameters.
  p = jax.tree_util.tree_map(np.asarray, params["params"])
  bert_params = {k: v for k, v in p["bert"].items() if k != "pooler"}
  hidden = np.asarray(BertModel(config.bert).apply({"params": bert_params}, ids, types, mask)[0])
  summary = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)  # [2, embed]
  pooled = np.tanh(summary @ p["bert"]["pooler"]["kernel"] + p["bert"]["pooler"]["bias"])
  projected = pooled @ p["projection"]["kernel"] + p["projection"]["bias"]
  norm = p["projection_layer_norm"]
  expected = _layer_norm(projected, norm["scale"], norm["bias"], config.proj_layer_norm_eps)
  np.testing.assert_allclose(emb, expected, atol=1e-5)

  # Padding tokens (any ids) do not move a row's embedding; [CLS] pooling of the same
  # parameters gives another vector.
  repadded = ids.copy()
  repadded[1, 5:] = 7
  again = np.asarray(RealmEmbedder(config).apply(params, repadded, types, mask))
  np.testing.assert_allclose(again, emb, atol=1e-6)
  cls = np.asarray(RealmEmbedder(TINY).apply(params, ids, types, mask))
  assert np.max(np.abs(cls - emb)) > 1e-3
  with pytest.raises(ValueError, match="retriever_pooling='max'"):
    TINY.replace(retriever_pooling="max")


def test_query_tower_ignoring_masks_leaves_them_out_like_padding():
  """retriever_query_masks='ignore': a masked query embeds as the same query read with its
  [MASK] positions' attention mask at 0; documents are embedded as before; the [MASK]
  embedding row cannot move a query."""
  mask_id = 3
  config = TINY.replace(retriever_pooling="mean", retriever_query_masks="ignore",
                        mask_token_id=mask_id)
  reading = config.replace(retriever_query_masks="read")
  rng = np.random.default_rng(5)
  # [2, 9]: row 0 has two [MASK]s, row 1 one [MASK] and two padding slots.
  ids = rng.integers(4, 50, (2, 9)).astype(np.int32)
  ids[0, 2:4] = mask_id
  ids[1, 5] = mask_id
  mask = np.ones_like(ids)
  mask[1, 7:] = 0
  types = np.zeros_like(ids)
  module = RealmRetriever(config)
  params = nn.unbox(module.init(jax.random.PRNGKey(0), ids, types, mask, ids[:, None], types[:, None],
                                mask[:, None]))

  def embed(cfg, method, query_ids, query_mask, p=params):
    return np.asarray(RealmRetriever(cfg).apply(p, query_ids, types, query_mask, method=method))

  ignored = embed(config, RealmRetriever.embed_queries, ids, mask)
  # Reference: the tower that reads every token, told by hand that the [MASK]s are padding.
  by_hand = embed(reading, RealmRetriever.embed_queries, ids, mask * (ids != mask_id))
  np.testing.assert_allclose(ignored, by_hand, atol=1e-6)
  assert np.max(np.abs(ignored - embed(reading, RealmRetriever.embed_queries, ids, mask))) > 1e-3
  np.testing.assert_allclose(embed(config, RealmRetriever.embed_documents, ids, mask),
                             embed(reading, RealmRetriever.embed_documents, ids, mask))
  # Another [MASK] embedding row: the ignoring tower does not move.
  moved = jax.tree_util.tree_map(np.array, params)
  table = moved["params"]["embedder"]["bert"]["embeddings"]["word_embeddings"]["embedding"]
  table[mask_id] += 1.0
  np.testing.assert_allclose(embed(config, RealmRetriever.embed_queries, ids, mask, moved),
                             ignored, atol=1e-6)
  with pytest.raises(ValueError, match="retriever_query_masks='drop'"):
    TINY.replace(retriever_query_masks="drop")


def test_sinusoidal_position_init_is_the_transformer_table_at_bert_scale():
  """`position_init='sinusoidal'` (the toy BERT): position p, feature 2i-th frequency is
  sin(p / 10000^(2i/d)) on the first half and cos on the second, scaled to std
  initializer_range; 'normal' stays BERT's truncated normal; the parameters are the same."""
  cfg = model_config.tiny_bert(hidden_size=16, num_heads=2, intermediate_size=32,
                               max_position_embeddings=20, position_init="sinusoidal")
  ids = jnp.zeros((1, 4), jnp.int32)
  params = nn.unbox(BertModel(cfg).init(jax.random.PRNGKey(0), ids)["params"])
  table = np.asarray(params["embeddings"]["position_embeddings"]["embedding"])
  expected = np.zeros((20, 16))
  for p in range(20):
    for i in range(8):
      angle = p / 10000 ** (2 * i / 16)
      expected[p, i], expected[p, 8 + i] = math.sin(angle), math.cos(angle)
  expected *= cfg.initializer_range / expected.std()
  np.testing.assert_allclose(table, expected, rtol=1e-5, atol=1e-7)
  normal = dataclasses.replace(cfg, position_init="normal")
  other = nn.unbox(BertModel(normal).init(jax.random.PRNGKey(0), ids)["params"])
  assert jax.tree_util.tree_structure(other) == jax.tree_util.tree_structure(params)
  assert np.abs(other["embeddings"]["position_embeddings"]["embedding"]).max() <= (
      2 * normal.initializer_range)  # truncated at two standard deviations
  with pytest.raises(ValueError, match="position_init"):
    model_config.tiny_bert(position_init="rotary")


def _layer0_attention_numpy(params, ids, eps):
  """Layer 0's attention probabilities [heads, length, length] of one row, in NumPy."""
  emb = params["embeddings"]
  x = (np.asarray(emb["word_embeddings"]["embedding"])[ids]
       + np.asarray(emb["position_embeddings"]["embedding"])[:len(ids)]
       + np.asarray(emb["token_type_embeddings"]["embedding"])[0])
  x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
  x = x * np.asarray(emb["layer_norm"]["scale"]) + np.asarray(emb["layer_norm"]["bias"])
  att = params["layer_0"]["attention"]
  # [length, heads, kv]
  q = np.einsum("le,ehk->lhk", x, att["query"]["kernel"]) + np.asarray(att["query"]["bias"])
  k = np.einsum("le,ehk->lhk", x, att["key"]["kernel"]) + np.asarray(att["key"]["bias"])
  scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(q.shape[-1])
  scores -= scores.max(-1, keepdims=True)
  return np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)


def test_neighbour_position_init_starts_layer_0_as_previous_and_next_position_heads():
  """`position_init='neighbours'` (the toy BERT): half the table's frequencies reach pi per
  position, and on random words layer 0's head 0 attends to the previous position and head 1
  to the next (NumPy forward of the initialised weights), at any position of the row, while
  the normal init spreads attention about uniformly; layer 1 and the other tables keep BERT's
  init."""
  cfg = model_config.tiny_bert(hidden_size=128, num_heads=2, intermediate_size=512,
                               position_init="neighbours")
  length = 128
  ids = np.asarray(jax.random.randint(jax.random.PRNGKey(1), (1, length), 1000, 30000))
  params = nn.unbox(BertModel(cfg).init(jax.random.PRNGKey(0), jnp.asarray(ids))["params"])
  table = np.asarray(params["embeddings"]["position_embeddings"]["embedding"])
  assert abs(table.std() - cfg.initializer_range) < 1e-6
  # Frequencies (radians per position) from position 1's sin and cos halves: the geometric
  # 1 .. 1/10000 over 32 steps, then pi * frac(k * golden ratio), k = 1..32.
  frequencies = np.arctan2(table[1, :64], table[1, 64:])
  np.testing.assert_allclose(frequencies[:32], 10000.0 ** (-np.arange(32) / 32), rtol=1e-4)
  golden = (1 + 5 ** 0.5) / 2
  np.testing.assert_allclose(frequencies[32:], np.pi * ((np.arange(1, 33) * golden) % 1),
                             rtol=1e-4)
  probs = _layer0_attention_numpy(params, ids[0], cfg.layer_norm_eps)
  inner = np.arange(1, length - 1)
  for head, offset in enumerate(bert.NEIGHBOUR_OFFSETS):
    # The words' own embeddings add noise to the position read-out: most, not all, positions
    # put most of their mass on the neighbour (0.75-0.85 mean over seeds).
    mass = probs[head, inner, inner + offset]
    assert mass.mean() > 0.7, (head, mass.mean())
    assert (probs[head, inner].argmax(-1) == inner + offset).mean() > 0.8
  normal = nn.unbox(BertModel(dataclasses.replace(cfg, position_init="normal")).init(
      jax.random.PRNGKey(0), jnp.asarray(ids))["params"])
  base = _layer0_attention_numpy(normal, ids[0], cfg.layer_norm_eps)
  assert base[0, inner, inner - 1].mean() < 0.05
  np.testing.assert_array_equal(params["layer_1"]["attention"]["query"]["kernel"],
                                normal["layer_1"]["attention"]["query"]["kernel"])
  with pytest.raises(ValueError, match="neighbours"):
    model_config.tiny_bert(hidden_size=128, num_heads=1, intermediate_size=512,
                           position_init="neighbours")
