"""bench/vs_transformers.py compares like with like: at a tiny size its two train steps (ours
and the transformers port's) compute the same step-0 loss from the same weights, and its FLOP
count matches a count worked by hand."""

import os
import sys

import jax
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

pytest.importorskip("torch")
pytest.importorskip("transformers")

from bench import vs_transformers as bench  # noqa: E402

# hidden 32, 2 layers (the parity check's tiny size).
# A cheaper XLA build (tests/training/train_child.py's FAST_COMPILE): same arithmetic.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            retriever_proj_size=16, vocab_size=2000)


def test_both_train_steps_compute_the_same_step0_loss():
  # Dropout off, as the benchmark runs by default: with it on, the two sides' masks differ.
  dropout, candidates = 0.0, 3
  # Biases and LayerNorms randomised too, so every imported tensor matters.
  scorer, encoder = bench.build_port(TINY, candidates, dropout, seed=0, randomize=True)
  config, params = bench.import_port_weights(scorer, encoder)
  assert config.bert.hidden_size == 32 and config.bert.num_layers == 2
  assert config.bert.hidden_dropout == dropout and config.share_embedders
  batch = bench.make_batch(batch=2, candidates=candidates, query_len=8, block_len=12, masks=4,
                           vocab=config.bert.vocab_size, seed=0)
  step, state = bench.build_ours(config, params, jax.devices()[0],
                                 compiler_options=FAST_COMPILE)
  _, ours = bench.our_train_step(step, state, jax.device_put(batch, step.batch_sharding))
  optimizer = bench.port_optimizer(scorer, encoder)
  theirs = bench.port_train_step(scorer, encoder, optimizer, bench.port_inputs(batch))
  print(f"step-0 loss: ours {ours:.7f}, port {theirs:.7f}")
  assert ours == pytest.approx(theirs, abs=1e-4), (ours, theirs)
  assert ours > 1.0  # a real loss over the 2000-word vocabulary, not a degenerate 0


def test_flop_count_matches_a_hand_count_for_a_one_layer_toy():
  # H=4, I=8, one layer, V=10, P=2; B=1 example, K=2 candidates; query 3, block 5, reader 8
  # tokens; MLM head at m positions. Forward matmul FLOPs (2 per multiply-add):
  #   encoder over L tokens: Q,K,V,O 4 * 2*L*4*4 = 128 L; feed-forward 2 * 2*L*4*8 = 128 L;
  #     scores Q K^T 2*L*L*4 and context P V 2*L*L*4 = 16 L^2
  #   embedder = encoder + pooler 2*4*4 (32) + projection 2*4*2 (16)
  #   query   (L=3): 384 + 384 + 144 + 48                   =   960
  #   blocks  (L=5): 2 x (640 + 640 + 400 + 48)              =  3456
  #   readers (L=8): 2 x (1024 + 1024 + 1024)                =  6144
  #   MLM head per position: transform 2*4*4 + decoder 2*4*10 = 112, on 2 rows x m positions
  #   scores: 2 candidates x 2*P                             =     8
  shapes = dict(batch=1, candidates=2, query_len=3, block_len=5, reader_len=8, hidden=4,
                intermediate=8, layers=1, vocab=10, proj=2)
  assert bench.encoder_flops(8, 4, 8, 1) == 3072
  assert bench.embedder_flops(3, 4, 8, 1, 2) == 960
  # Ours: MLM head at the m = 2 mask slots; the port: at all 8 reader positions.
  assert bench.forward_flops(**shapes, mlm_positions=2) == 960 + 3456 + 6144 + 2 * 2 * 112 + 8
  assert bench.forward_flops(**shapes, mlm_positions=8) == 960 + 3456 + 6144 + 2 * 8 * 112 + 8
  assert bench.train_step_flops(**shapes, mlm_positions=2) == 3 * 11016


def test_block_count_agrees_with_the_embedding_benchmark():
  # The document tower's share of the count is bench/embedding_throughput.py's flops_per_block.
  from bench.embedding_throughput import flops_per_block
  from realm_jax.models import config as config_lib
  for bert in (config_lib.tiny_bert(), config_lib.base_bert()):
    config = config_lib.RealmConfig(bert=bert)
    assert bench.embedder_flops(288, bert.hidden_size, bert.intermediate_size, bert.num_layers,
                                config.proj_size) == flops_per_block(config, 288)


def _verdict_inputs(device: str, jax_mm: float, torch_mm: float) -> dict:
  """The run record `_verdict` reads: ours 1.1 TFLOP per step, the port 1.2 (hand-made)."""
  import types  # pylint: disable=g-import-not-at-top
  from realm_jax.models import config as config_lib  # pylint: disable=g-import-not-at-top
  return {"args": types.SimpleNamespace(device=device),
          "config": config_lib.RealmConfig(bert=config_lib.tiny_bert()),
          "ours_flops": 1.1e12, "theirs_flops": 1.2e12, "theirs_times": [0.3, 0.28, 0.32],
          "layer_mm": {"jax": jax_mm, "torch": torch_mm}}


def test_verdict_splits_the_gap_between_the_matmul_library_and_the_rest():
  phases = {"optimizer": 0.01}
  # Ours 1.2x the port's FLOP/s; the matmul library gives 1.1x of it, 1.2 / 1.1 = 1.09x is
  # outside the matmuls.
  text = bench._verdict(_verdict_inputs("cpu", 330.0, 300.0), 1.3, 1.5, 120.0, 100.0, 0.0,
                        phases)
  assert "Part of the throughput gap is the matmul library" in text
  assert "the rest, 1.09x, is outside the matmuls" in text
  assert "XLA's CPU dot reaches 330 GFLOP/s and torch's (MKL) 300, 1.10x" in text
  # On the GPU the library favours the port (0.8x): all of ours' 1.2x, 1.2 / 0.8 = 1.50x,
  # is gained outside the matmuls, for the step and for the embedding (1.2 / 0.8 = 1.50x).
  text = bench._verdict(_verdict_inputs("gpu", 32000.0, 40000.0), 1.3, 1.2, 120.0, 100.0, 0.0,
                        phases)
  assert "The matmul library favours the port" in text and "Part of" not in text
  assert "XLA's GPU dot reaches 32000 GFLOP/s and torch's (cuBLAS) 40000, 0.80x" in text
  assert "ours gains 1.50x outside the matmuls" in text
  assert "the matmul library favours the port (0.80x), so all of it, 1.50x" in text
  assert "takes 0.01s of its 0.30s step" in text
