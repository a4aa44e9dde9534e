"""BERT's uncased WordPiece vocabulary as a seqio Vocabulary, with byte offsets.

REALM tokenises everything (queries, blocks, answers) with BERT's uncased WordPiece vocabulary
(30522 entries, bundled in `realm_jax/data/assets/`). Two encoders give the same ids as
transformers' `BertTokenizerFast(do_lower_case=True)`:

* Python (`encode`, `tokenize_with_offsets`): a direct implementation of BERT's normaliser,
  pre-tokeniser and greedy longest-match WordPiece that also reports, for every wordpiece, the
  byte span of the original text it came from. Salient-span masking needs those offsets: spans
  are given as byte offsets into the raw text (REALM_SPEC 8-10).
* TensorFlow (`encode_tf`, used inside seqio/tf.data pipelines): the same normalisation written
  as TF string ops, then tensorflow_text's WordPiece.

Normalisation, in the order of the `tokenizers` BertNormalizer that BertTokenizerFast runs:
drop NUL, U+FFFD and control/format characters (Unicode category C*, except tab/newline/CR),
map whitespace to a space, put spaces around CJK ideographs, NFD-decompose and drop
non-spacing marks (accents), lower-case. Then split on whitespace and on every punctuation
character (ASCII punctuation and Unicode category P*), and run WordPiece on each word (a word
over 100 characters is `[UNK]`).

"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import re
import unicodedata
from typing import Iterable, Sequence

import numpy as np

PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 100, 101, 102, 103
SPECIAL_TOKENS = {"[PAD]": PAD_ID, "[UNK]": UNK_ID, "[CLS]": CLS_ID, "[SEP]": SEP_ID,
                  "[MASK]": MASK_ID}
MAX_CHARS_PER_WORD = 100

# Code point ranges BERT treats as CJK ideographs (each becomes its own word).
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
# An ASCII chunk with no control characters needs only lower-casing: the fast path.
_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_ASCII_WORDS = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9]")
# Runs of characters that are not whitespace after normalisation (Python's \s would also split
# on control characters such as \x1f, which BERT deletes, joining their neighbours).
_CHUNKS = re.compile("[^\t\n\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")


def bundled_vocab_path() -> str:
  return str(importlib.resources.files("realm_jax.data") / "assets" / "bert_uncased_vocab.txt")


def _is_cjk(cp: int) -> bool:
  return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _is_punctuation(char: str) -> bool:
  cp = ord(char)
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(char).startswith("P")


@functools.lru_cache(maxsize=65536)
def _normalize_char(char: str) -> str:
  """BertNormalizer on one character: "" (dropped), " " (whitespace) or its normalised text."""
  if char in "\t\n\r":
    return " "
  cp = ord(char)
  if cp == 0 or cp == 0xFFFD or unicodedata.category(char).startswith("C"):
    return ""
  if char.isspace():  # for non-control characters: Unicode White_Space (Zs, U+2028, U+2029)
    return " "
  if _is_cjk(cp):
    return f" {char} "
  return "".join(c for c in unicodedata.normalize("NFD", char)
                 if unicodedata.category(c) != "Mn").lower()


@functools.lru_cache(maxsize=65536)
def _stands_alone(char: str) -> bool:
  """Punctuation and CJK ideographs are words of their own."""
  return _is_punctuation(char) or _is_cjk(ord(char))


class WordPieceVocabulary:
  """BERT uncased WordPiece: Python and tf.data encoders with identical ids.

  The Python API needs neither TensorFlow nor seqio; `as_seqio()` (or `seqio_vocabulary()`)
  gives the seqio.Vocabulary for tasks.
  """

  def __init__(self, vocab_path: str | None = None):
    self.vocab_path = vocab_path or bundled_vocab_path()
    with open(self.vocab_path, "rb") as f:
      data = f.read()
    self.fingerprint = hashlib.sha256(data).hexdigest()
    self.tokens: list[str] = data.decode("utf-8").splitlines()
    self.token_ids: dict[str, int] = {t: i for i, t in enumerate(self.tokens)}
    for token, expected in SPECIAL_TOKENS.items():
      if self.token_ids.get(token) != expected:
        raise ValueError(f"{self.vocab_path}: {token} must have id {expected} (BERT layout); "
                         f"found {self.token_ids.get(token)}.")
    self._word_cache = functools.lru_cache(maxsize=200_000)(self._wordpiece_uncached)

  @property
  def vocab_size(self) -> int:
    return len(self.tokens)

  # --------------------------------------------------------------------------- Python path

  def _wordpiece_uncached(self, word: str) -> tuple[tuple[int, int, int], ...]:
    """Greedy longest-match WordPiece of one normalised word.

    Returns:
      ((id, start_char, end_char), ...) with character offsets into `word`.
    """
    if len(word) > MAX_CHARS_PER_WORD:
      return ((UNK_ID, 0, len(word)),)
    pieces = []
    start = 0
    while start < len(word):
      end = len(word)
      piece_id = None
      while start < end:
        candidate = word[start:end] if start == 0 else "##" + word[start:end]
        piece_id = self.token_ids.get(candidate)
        if piece_id is not None:
          break
        end -= 1
      if piece_id is None:  # no piece matches: the whole word is unknown
        return ((UNK_ID, 0, len(word)),)
      pieces.append((piece_id, start, end))
      start = end
    return tuple(pieces)

  def _words(self, text: str) -> Iterable[tuple[str, list[int]]]:
    """Normalised words with, for each normalised character, its original char index."""
    for chunk in _CHUNKS.finditer(text):
      piece = chunk.group()
      base = chunk.start()
      if piece.isascii() and not _ASCII_CONTROL.search(piece):
        for word in _ASCII_WORDS.finditer(piece):
          w = word.group().lower()
          yield w, list(range(base + word.start(), base + word.end()))
        continue
      chars: list[str] = []
      origin: list[int] = []
      for offset, char in enumerate(piece):
        for normalized in _normalize_char(char):
          if normalized == " " or _stands_alone(normalized):
            if chars:
              yield "".join(chars), origin
            chars, origin = [], []
            if normalized != " ":
              yield normalized, [base + offset]
          else:
            chars.append(normalized)
            origin.append(base + offset)
      if chars:
        yield "".join(chars), origin

  def tokenize_with_offsets(self, text: str) -> tuple[list[int], list[int], list[int]]:
    """WordPiece ids and the byte span of the original text behind each.

    Args:
      text: raw text (no special tokens are added).

    Returns:
      (ids, byte_starts, byte_limits): for wordpiece i, `text.encode("utf-8")[start:limit]` is
      the original text it came from (a whole word for `[UNK]`).
    """
    # [num_chars + 1] byte offset of every character boundary.
    if text.isascii():
      char_to_byte = None
    else:
      char_to_byte = np.concatenate(
          [[0], np.cumsum([len(c.encode("utf-8")) for c in text])]).tolist()
    ids, starts, limits = [], [], []
    for word, origin in self._words(text):
      for piece_id, begin, end in self._word_cache(word):
        first, last = origin[begin], origin[end - 1]
        ids.append(piece_id)
        if char_to_byte is None:
          starts.append(first)
          limits.append(last + 1)
        else:
          starts.append(char_to_byte[first])
          limits.append(char_to_byte[last + 1])
    return ids, starts, limits

  def encode(self, text: str) -> list[int]:
    """WordPiece ids of `text` (no [CLS]/[SEP])."""
    return [piece for word, _ in self._words(text) for piece, _, _ in self._word_cache(word)]

  def decode(self, ids: Sequence[int]) -> str:
    """Ids back to text: wordpieces joined, `##` continuations glued; [PAD] dropped."""
    tokens = [self.tokens[i] for i in ids if i != PAD_ID]
    return " ".join(tokens).replace(" ##", "").strip()

  def id_to_token(self, token_id: int) -> str:
    return self.tokens[token_id]

  def token_to_id(self, token: str) -> int:
    return self.token_ids.get(token, UNK_ID)

  def __eq__(self, other) -> bool:
    return isinstance(other, WordPieceVocabulary) and other.fingerprint == self.fingerprint

  def __hash__(self) -> int:
    return hash(self.fingerprint)

  # --------------------------------------------------------------------------- TF path

  @functools.cached_property
  def _tf_tokenizers(self):
    import tensorflow as tf
    import tensorflow_text as tf_text
    from tensorflow_text.python.ops.bert_tokenizer import BasicTokenizer
    table = tf.lookup.StaticVocabularyTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(self.tokens), tf.range(len(self.tokens), dtype=tf.int64)),
        num_oov_buckets=1)
    # Normalisation happens in `_normalize_tf`: the basic tokenizer only splits on whitespace
    # and punctuation. The word-length rule is applied by characters in `encode_tf`, so the
    # byte bound here only has to admit every 100-character word.
    return (BasicTokenizer(lower_case=False),
            tf_text.WordpieceTokenizer(table, token_out_type=tf.int64, unknown_token="[UNK]",
                                       max_bytes_per_word=4 * MAX_CHARS_PER_WORD))

  @staticmethod
  def _normalize_tf(text):
    """The Python normaliser as TF string ops (same steps, same order)."""
    import tensorflow as tf
    import tensorflow_text as tf_text
    text = tf.strings.regex_replace(text, r"[\t\n\r]", " ")
    # Control and format characters (category C*), NUL and U+FFFD are dropped.
    text = tf.strings.regex_replace(text, r"[\p{C}\x{FFFD}]", "")
    # Remaining whitespace (Unicode White_Space outside category C) -> " ".
    text = tf.strings.regex_replace(text, r"[\p{Zs}\x{2028}\x{2029}]", " ")
    cjk = "".join(f"\\x{{{lo:X}}}-\\x{{{hi:X}}}" for lo, hi in _CJK_RANGES)
    text = tf.strings.regex_replace(text, f"([{cjk}])", r" \1 ")
    text = tf_text.normalize_utf8(text, "NFD")
    text = tf.strings.regex_replace(text, r"\p{Mn}", "")
    # BERT lower-cases character by character; ICU's string lower-casing would turn a
    # word-final capital sigma into final sigma, so map it first.
    text = tf.strings.regex_replace(text, "\u03a3", "\u03c3")
    return tf.strings.lower(text, encoding="utf-8")

  def encode_tf(self, text):
    """tf.string (scalar or [batch]) -> int32 ids ([n] or ragged [batch, None])."""
    import tensorflow as tf
    # Create the lookup table eagerly even when first called inside a tf.data/tf.function
    # trace; a table born in one trace's graph cannot be used by the next trace.
    with tf.init_scope():
      basic, wordpiece = self._tf_tokenizers
    text = tf.convert_to_tensor(text, tf.string)
    scalar = text.shape.rank == 0
    if scalar:
      text = text[None]
    # [batch, words]
    words = basic.tokenize(self._normalize_tf(text))
    too_long = tf.strings.length(words, unit="UTF8_CHAR") > MAX_CHARS_PER_WORD
    words = tf.ragged.map_flat_values(
        lambda w, long: tf.where(long, "[UNK]", w), words, too_long)
    # [batch, words, pieces] -> [batch, pieces]
    ids = tf.cast(wordpiece.tokenize(words).merge_dims(-2, -1), tf.int32)
    # Characters outside the vocabulary land in the OOV bucket (id vocab_size): [UNK].
    ids = tf.ragged.map_flat_values(lambda x: tf.where(x >= len(self.tokens), UNK_ID, x), ids)
    return ids[0] if scalar else ids

  def decode_tf(self, ids):
    """int ids [..., n] -> tf.string [...] (same rule as `decode`)."""
    import tensorflow as tf
    vocab = tf.constant(self.tokens)
    ids = tf.convert_to_tensor(ids)
    tokens = tf.gather(vocab, tf.cast(ids, tf.int32))
    tokens = tf.where(tf.equal(ids, PAD_ID), tf.constant(""), tokens)
    joined = tf.strings.reduce_join(tokens, axis=-1, separator=" ")
    joined = tf.strings.regex_replace(joined, " +##", "")
    joined = tf.strings.regex_replace(joined, " +", " ")
    return tf.strings.strip(joined)

  def as_seqio(self):
    """This vocabulary as a seqio.Vocabulary."""
    return seqio_vocabulary(self)


@functools.lru_cache(maxsize=None)
def _seqio_adapter_class():
  """Defined on first use: importing seqio pulls in TensorFlow, which the Python path and
  the corpus tools do not need."""
  import seqio

  class SeqioWordPieceVocabulary(seqio.Vocabulary):
    """seqio.Vocabulary over `WordPieceVocabulary`. No EOS: BERT inputs end in [SEP], which
    the feature builders add where the format needs it."""

    def __init__(self, vocab: WordPieceVocabulary):
      self.wordpiece = vocab
      super().__init__(extra_ids=0)

    @property
    def eos_id(self):
      return None

    @property
    def unk_id(self):
      return UNK_ID

    @property
    def _base_vocab_size(self):
      return self.wordpiece.vocab_size

    def _encode(self, s):
      return self.wordpiece.encode(s)

    def _decode(self, ids):
      return self.wordpiece.decode(ids)

    def _encode_tf(self, s):
      return self.wordpiece.encode_tf(s)

    def _decode_tf(self, ids):
      return self.wordpiece.decode_tf(ids)

    def __eq__(self, other):
      return isinstance(other, SeqioWordPieceVocabulary) and other.wordpiece == self.wordpiece

    def __hash__(self):
      return hash(self.wordpiece)

  return SeqioWordPieceVocabulary


def seqio_vocabulary(vocab: WordPieceVocabulary | None = None):
  """A seqio.Vocabulary for seqio tasks (the bundled vocabulary by default)."""
  return _seqio_adapter_class()(vocab or default_vocabulary())


@functools.lru_cache(maxsize=None)
def default_vocabulary() -> WordPieceVocabulary:
  """The bundled BERT uncased vocabulary (loaded once per process)."""
  return WordPieceVocabulary()
