"""WordPiece vocabulary: Python and tf.data ids agree with each other and with transformers'
BertTokenizerFast; byte offsets point at the original text; sentence splitting."""

import numpy as np
import pytest
import seqio
import tensorflow as tf
import transformers

from realm_jax.data import vocab as vocab_lib
from realm_jax.data.sentences import split_sentences

TEXTS = [
    "REALM retrieves documents, then predicts masked tokens.",
    "Héllo, wörld! Ça va? Ærøskøbing naïve façade Ångström",        # accents
    "東京タワー is 333 m tall; 北京 and 서울 too.",                      # CJK, kana, hangul
    "don't stop-believing... (1999) $100.00 50% a&b #tag @user «quoted» — dash",  # punctuation
    "co\u0007ntrol\x00 chars\u200b zero-width\ufeff bom\x1fjoin x\x85y tab\there\r\nnew",  # control
    "emoji 😀👍🏽 and ✓ symbols ™ © ½",                                   # emoji, symbols
    "ǅemal İstanbul ﬁnance Ⅻ Ｆｕｌｌｗｉｄｔｈ Σίσυφος ΣΑΣ",          # case/compatibility
    "नमस्ते दुनिया مرحبا بالعالم",                                       # other scripts
    "a\u2028b\u2029c\u00a0d\u3000e",                                      # unicode spaces
    "ab" * 60 + " " + "é" * 101 + " " + "x" * 100,                        # >100-char words
    "",
    "   ",
    "UNAFFABLE unaffable Unaffable",
]


@pytest.fixture(scope="module")
def vocab():
  return vocab_lib.default_vocabulary()


@pytest.fixture(scope="module")
def reference(vocab):
  return transformers.BertTokenizerFast(vocab_file=vocab.vocab_path, do_lower_case=True)


def test_python_ids_equal_transformers(vocab, reference):
  for text in TEXTS:
    assert vocab.encode(text) == reference(text, add_special_tokens=False)["input_ids"], text


def test_tf_ids_equal_python_ids(vocab):
  batch = vocab.encode_tf(tf.constant(TEXTS)).to_list()
  for text, ids in zip(TEXTS, batch):
    assert ids == vocab.encode(text), text
  scalar = vocab.encode_tf(tf.constant(TEXTS[1]))
  assert scalar.dtype == tf.int32 and scalar.numpy().tolist() == vocab.encode(TEXTS[1])


def test_tf_encoding_inside_a_tf_data_pipeline():
  # A fresh vocabulary whose TF tables are first created inside a trace, used by two pipelines.
  vocab = vocab_lib.WordPieceVocabulary()
  for _ in range(2):
    dataset = tf.data.Dataset.from_tensor_slices(TEXTS[:4]).map(vocab.encode_tf)
    for text, ids in zip(TEXTS[:4], dataset.as_numpy_iterator()):
      assert ids.tolist() == vocab.encode(text)


def test_offsets_are_byte_spans_of_the_original_text(vocab, reference):
  for text in TEXTS:
    ids, starts, limits = vocab.tokenize_with_offsets(text)
    assert ids == vocab.encode(text)
    encoded = reference(text, add_special_tokens=False, return_offsets_mapping=True)
    # transformers reports character offsets; convert them to bytes independently.
    expected = [(len(text[:a].encode("utf-8")), len(text[:b].encode("utf-8")))
                for a, b in encoded["offset_mapping"]]
    assert list(zip(starts, limits)) == expected, text


def test_offsets_by_hand(vocab):
  text = "Zoë's unaffable"
  ids, starts, limits = vocab.tokenize_with_offsets(text)
  pieces = [vocab.id_to_token(i) for i in ids]
  raw = text.encode("utf-8")
  assert pieces == ["zoe", "'", "s", "una", "##ffa", "##ble"]
  assert [raw[s:e].decode() for s, e in zip(starts, limits)] == \
      ["Zoë", "'", "s", "una", "ffa", "ble"]
  # "ë" is two bytes: "'" starts at byte 4, not 3.
  assert starts[1] == 4


def test_special_token_strings_in_text_are_plain_text(vocab):
  assert vocab.encode("a [MASK] b [SEP]") == vocab.encode("a [ mask ] b [ sep ]")
  assert vocab_lib.MASK_ID not in vocab.encode("[MASK]")
  assert vocab_lib.MASK_ID not in vocab.encode_tf(tf.constant("[MASK]")).numpy().tolist()


def test_special_ids_and_decode(vocab):
  assert (vocab_lib.PAD_ID, vocab_lib.UNK_ID, vocab_lib.CLS_ID, vocab_lib.SEP_ID,
          vocab_lib.MASK_ID) == (0, 100, 101, 102, 103)
  assert [vocab.id_to_token(i) for i in (0, 100, 101, 102, 103)] == \
      ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert vocab.vocab_size == 30522
  ids = vocab.encode("Héllo, unaffable world")
  assert vocab.decode(ids + [0, 0]) == "hello , unaffable world"
  decoded = vocab.decode_tf(tf.constant([ids + [0, 0]])).numpy()[0].decode()
  assert decoded == "hello , unaffable world"


def test_seqio_vocabulary(vocab):
  seqio_vocab = vocab.as_seqio()
  assert isinstance(seqio_vocab, seqio.Vocabulary)
  assert seqio_vocab.vocab_size == 30522 and seqio_vocab.eos_id is None
  assert seqio_vocab.encode(TEXTS[1]) == vocab.encode(TEXTS[1])
  assert seqio_vocab.encode_tf(tf.constant(TEXTS[1])).numpy().tolist() == vocab.encode(TEXTS[1])
  assert seqio_vocab == vocab_lib.seqio_vocabulary()


def test_bad_vocabulary_file_is_refused(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("[UNK]\n[PAD]\nhello\n")
  with pytest.raises(ValueError, match=r"vocab.txt: \[PAD\] must have id 0"):
    vocab_lib.WordPieceVocabulary(str(path))


def _sentences(text):
  raw = text.encode("utf-8")
  return [raw[s:e].decode("utf-8") for s, e in split_sentences(text)]


def test_sentence_splitting_by_hand():
  text = ('Dr. Smith went to Washington. He arrived on 3 Jan. 1999! Did he? "Yes." '
          "J. R. R. Tolkien lived in the U.S. for a while.")
  assert _sentences(text) == [
      "Dr. Smith went to Washington.", "He arrived on 3 Jan. 1999!", "Did he?", '"Yes."',
      "J. R. R. Tolkien lived in the U.S. for a while."]


def test_sentence_offsets_are_utf8_bytes_and_lines_split():
  text = "  Zoë Müller wrote.  Ébène came.\nA new line without a period\n\n"
  spans = split_sentences(text)
  assert _sentences(text) == ["Zoë Müller wrote.", "Ébène came.", "A new line without a period"]
  # "Zoë Müller wrote." starts after two spaces and holds two 2-byte characters.
  assert spans[0] == (2, 2 + len("Zoë Müller wrote.".encode("utf-8")))
  assert split_sentences("   \n ") == []
  assert np.all(np.diff(np.array(spans).ravel()) >= 0)
