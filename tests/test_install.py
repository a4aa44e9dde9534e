"""The installed stack: the pinned TensorFlow/ScaNN/seqio trio imports in one process, and the
bundled vocabulary is BERT's uncased WordPiece vocabulary."""

import hashlib
import importlib.resources
import subprocess
import sys

VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"


def test_scann_and_seqio_import_in_one_process():
  # A fresh interpreter: an ABI mismatch between scann and TensorFlow shows up as an import
  # error ("undefined symbol") only when both load into the same process.
  code = ("import seqio, scann, tensorflow as tf, tensorflow_text, tensorflow_datasets, "
          "jax, flax, optax, orbax.checkpoint, gin, clu.metric_writers; "
          "print(tf.__version__, scann.__name__, seqio.__name__)")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split()[0].startswith("2.20.")


def test_bundled_vocabulary_is_bert_uncased():
  path = importlib.resources.files("realm_jax.data") / "assets" / "bert_uncased_vocab.txt"
  data = path.read_bytes()
  assert hashlib.sha256(data).hexdigest() == VOCAB_SHA256
  lines = data.decode("utf-8").splitlines()
  assert len(lines) == 30522
  assert lines[0] == "[PAD]" and lines[100] == "[UNK]" and lines[101] == "[CLS]"
  assert lines[102] == "[SEP]" and lines[103] == "[MASK]"
