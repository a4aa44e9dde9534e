"""BERT's uncased WordPiece vocabulary as a seqio Vocabulary, with byte offsets.

REALM tokenises everything with BERT's uncased WordPiece vocabulary (30522 entries, bundled in
`realm_jax/data/assets/`). Two encoders give the same ids as transformers'
`BertTokenizerFast(do_lower_case=True)`: the Python reference (`encode`,
`tokenize_with_offsets`: BERT's normaliser, pre-tokeniser and greedy longest-match WordPiece,
also reporting each wordpiece's byte span, which salient-span masking needs, REALM_SPEC 8-10),
and `encode_tf` (TF string ops and tensorflow_text) for seqio pipelines. Two faster backends
give exactly the reference's ids and offsets (`WordPieceVocabulary(backend=...)`): "rust"
(`tokenizers`, falling back to the reference on characters the two treat differently) and
"cached" (the default: each distinct space-separated part tokenised once). Details and timings:
docs/design/data_index_batches.md.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.resources
import itertools
import re
import threading
import unicodedata
from typing import Callable, Iterable, Optional, Sequence

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


# --------------------------------------------------------------------------- compiled backends

BACKENDS = ("python", "rust", "cached")
# A word key of the "cached" backend: the ASCII whitespace before a word, then the word. A word
# is a letter/digit run or one punctuation character of an all-ASCII chunk, or a whole chunk
# (between ASCII whitespace) that holds a non-ASCII or control character (_ASCII_KEYS: for
# texts without either). Every character but trailing whitespace lands in exactly one key, and
# ASCII whitespace and punctuation end words in both encoders, so no wordpiece spans two keys.
_ASCII_KEYS = re.compile(r"[\t\n\r ]*(?:[A-Za-z0-9]+|[!-/:-@\[-`{-~])")
_MIXED_KEYS = re.compile(r"[\t\n\r ]*(?:(?<![^\t\n\r ])[^\t\n\r ]*[^\t\n\r -~][^\t\n\r ]*"
                         r"|[A-Za-z0-9]+|[!-/:-@\[-`{-~])")
# Distinct keys the "cached" backend keeps at each level (parts, words) before that level starts
# afresh: about 200 bytes a key, so some 80 MB at most.
MAX_CACHED_KEYS = 200_000


@functools.lru_cache(maxsize=None)
def _rust_available() -> bool:
  try:
    import tokenizers  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
  except ImportError:
    return False
  return True


def default_backend() -> str:
  """"cached" when the Rust `tokenizers` package imports, else "python"."""
  return "cached" if _rust_available() else "python"


@functools.lru_cache(maxsize=None)
def _rust_bert_steps():
  """The Rust normaliser and pre-tokeniser, configured as the Python reference."""
  from tokenizers import normalizers, pre_tokenizers  # pylint: disable=import-outside-toplevel
  return (normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                     strip_accents=True, lowercase=True),
          pre_tokenizers.BertPreTokenizer())


def _effect(items: Iterable[tuple[str, str]]) -> list[tuple[str, ...]]:
  """What a character's normalised output does to the words around it.

  Args:
    items: (normalised char, class) with class "S" (whitespace), "P" (a word of its own) or
      "W" (part of a word).

  Returns:
    Word text runs ("W", text) and the boundaries ("B",) between them, in a form where equal
    means "splits and spells every text the same way": a stand-alone character is a boundary,
    a one-character run and a boundary, whether it came as "x" (P) or " x " (S W S).
  """
  out: list[tuple[str, ...]] = []
  for char, kind in items:
    if kind != "W" and (not out or out[-1] != ("B",)):
      out.append(("B",))
    if kind == "S":
      continue
    if kind == "W" and out and out[-1][0] == "W":
      out[-1] = ("W", out[-1][1] + char)
    else:
      out.append(("W", char))
    if kind == "P":
      out.append(("B",))
  return out


@functools.lru_cache(maxsize=None)
def _rust_class(char: str) -> str:
  """How the Rust pre-tokeniser treats one normalised character: "S", "P" or "W"."""
  pieces = [p for p, _ in _rust_bert_steps()[1].pre_tokenize_str(f"a{char}a")]
  if pieces == ["a", "a"]:
    return "S"
  if pieces == ["a", char, "a"]:
    return "P"
  if pieces == [f"a{char}a"]:
    return "W"
  raise AssertionError(f"unexpected pre-tokenisation of {char!r}: {pieces}")


def _char_is_safe(char: str) -> bool:
  """Whether the Rust pipeline treats `char` exactly as the Python reference does, in any text.

  Both pipelines work character by character (clean, CJK spacing, NFD, drop Mn, lower-case,
  split on whitespace/punctuation), except that NFD reorders runs of combining marks; that is
  harmless only when every combining mark with a nonzero class is dropped. So a character is
  safe when its normalised output and the classes of that output agree, and its decomposition
  keeps no combining mark.
  """
  if 0xD800 <= ord(char) <= 0xDFFF:  # lone surrogates: the reference raises, Rust cannot take them
    return False
  decomposed = unicodedata.normalize("NFD", char)
  if any(unicodedata.combining(c) and unicodedata.category(c) != "Mn" for c in decomposed):
    return False
  python = _normalize_char.__wrapped__(char)  # uncached: keep the reference's cache as it was
  rust = _rust_bert_steps()[0].normalize_str(char)
  python_effect = _effect(
      (c, "S" if c == " " else "P" if _stands_alone(c) else "W") for c in python)
  return python_effect == _effect((c, _rust_class(c)) for c in rust)


_SAFE_CHARS: set[str] = set()
_UNSAFE_CHARS: set[str] = set()


def _all_chars_safe(text: str) -> bool:
  """Whether the Rust pipeline gives the reference's output for `text` (checked per character,
  each character once per process)."""
  chars = set(text)
  if chars <= _SAFE_CHARS:
    return True
  for char in chars - _SAFE_CHARS - _UNSAFE_CHARS:
    (_SAFE_CHARS if _char_is_safe(char) else _UNSAFE_CHARS).add(char)
  return chars <= _SAFE_CHARS


def _char_to_byte(text: str) -> np.ndarray:
  """[len(text) + 1] UTF-8 byte offset of every character boundary of `text`."""
  points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)
  widths = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
  out = np.zeros(len(points) + 1, np.int64)
  np.cumsum(widths, out=out[1:])
  return out


@dataclasses.dataclass
class TokenizedBatch:
  """Wordpieces of many texts, flat.

  Attributes:
    ids: [num_tokens] int32 wordpiece ids of all texts, text after text.
    starts: [num_tokens] int64 byte offsets into each token's own text (its UTF-8 encoding).
    limits: [num_tokens] int64 byte limits, likewise.
    bounds: [num_texts + 1] int64: the tokens of text i are `bounds[i]:bounds[i + 1]`.
  """

  ids: np.ndarray
  starts: np.ndarray
  limits: np.ndarray
  bounds: np.ndarray

  def __len__(self) -> int:
    return len(self.bounds) - 1

  def item(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, starts, limits) arrays of text i."""
    begin, end = self.bounds[i], self.bounds[i + 1]
    return self.ids[begin:end], self.starts[begin:end], self.limits[begin:end]

  @classmethod
  def from_texts(cls, tokenized: Sequence[tuple[Sequence[int], Sequence[int], Sequence[int]]]
                 ) -> "TokenizedBatch":
    """From one (ids, starts, limits) per text."""
    bounds = np.zeros(len(tokenized) + 1, np.int64)
    np.cumsum([len(ids) for ids, _, _ in tokenized], out=bounds[1:])
    flat = lambda column, dtype: np.concatenate(  # noqa: E731
        [np.zeros(0, dtype)] + [np.asarray(t[column], dtype) for t in tokenized])
    return cls(flat(0, np.int32), flat(1, np.int64), flat(2, np.int64), bounds)


class _KeyRows(dict):
  """key -> row of the key tables; a new key gets the next row and waits in `pending`."""

  def __init__(self):
    super().__init__()
    self.pending: list[str] = []

  def __missing__(self, key: str) -> int:
    row = self[key] = len(self)
    self.pending.append(key)
    return row


class _Grown:
  """A NumPy array that grows by doubling (appends are amortised O(1))."""

  def __init__(self, dtype, capacity: int = 1024):
    self.data = np.zeros(capacity, dtype)
    self.size = 0

  def extend(self, values: np.ndarray) -> None:
    end = self.size + len(values)
    if end > len(self.data):
      grown = np.zeros(max(end, 2 * len(self.data)), self.data.dtype)
      grown[:self.size] = self.data[:self.size]
      self.data = grown
    self.data[self.size:end] = values
    self.size = end


def _word_keys(text: str) -> list[str]:
  """The words of `text`, each with the ASCII whitespace before it (see `_ASCII_KEYS`)."""
  ascii_only = text.isascii() and not _ASCII_CONTROL.search(text)
  return (_ASCII_KEYS if ascii_only else _MIXED_KEYS).findall(text)


def _space_keys(text: str) -> list[str]:
  """The space-separated parts of `text` (C speed; a space separates words in both
  encoders)."""
  return text.split(" ")


class _KeyCache:
  """Tokenisation of each distinct key of texts, in flat tables.

  Args:
    split: text -> keys, which are the text when joined with `separator`, and no wordpiece of
      the text spans two keys.
    separator: "" or one ASCII whitespace character.
    tokenize_keys: list of keys -> TokenizedBatch (for keys not seen yet).
    max_keys: distinct keys kept; beyond, the tables start afresh (bounded memory).
  """

  def __init__(self, split: Callable[[str], list[str]], separator: str, tokenize_keys,
               max_keys: int = MAX_CACHED_KEYS):
    self._split, self.separator = split, separator
    self._tokenize_keys = tokenize_keys
    self.max_keys = max_keys
    self.clear()

  def clear(self) -> None:
    self.rows = _KeyRows()
    # Per row: first piece, number of pieces, UTF-8 bytes of the key.
    self.first, self.count, self.nbytes = (_Grown(np.int64) for _ in range(3))
    # Per piece: id and byte offsets within its key.
    self.ids, self.starts, self.limits = _Grown(np.int32), _Grown(np.int64), _Grown(np.int64)

  def tokenize(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, byte starts, byte limits) of `text`."""
    if len(self.rows) > self.max_keys:  # between texts only: rows of this text stay valid
      self.clear()
    keys = self._split(text)
    # [num_keys] row of each key.
    rows = np.fromiter(map(self.rows.__getitem__, keys), np.int64, len(keys))
    if self.rows.pending:
      pending, self.rows.pending = self.rows.pending, []
      try:
        self._add(pending)
      except BaseException:  # rows without table entries: start afresh
        self.clear()
        raise
    count = self.count.data[rows]
    # [num_keys] bytes from one key's start to the next one's.
    step = self.nbytes.data[rows] + len(self.separator)
    key_end = np.cumsum(count)
    # [num_tokens] piece row of every token, and the byte offset of its key in `text`.
    pieces = np.arange(key_end[-1] if len(keys) else 0) + np.repeat(
        self.first.data[rows] - (key_end - count), count)
    base = np.repeat(np.cumsum(step) - step, count)
    return (self.ids.data[pieces], self.starts.data[pieces] + base,
            self.limits.data[pieces] + base)

  def tokenize_batch(self, texts: list[str]) -> TokenizedBatch:
    """`tokenize` of each text, in one call."""
    # One text: a space is whitespace to both encoders, so no wordpiece crosses it.
    joined = " ".join(texts)
    ids, starts, limits = self.tokenize(joined)
    encoded = texts if joined.isascii() else map(str.encode, texts)
    nbytes = np.fromiter(map(len, encoded), np.int64, len(texts))
    # [num_texts] byte offset of each text in the joined one.
    text_start = np.cumsum(nbytes + 1) - (nbytes + 1)
    bounds = np.append(np.searchsorted(starts, text_start), len(ids))
    shift = np.repeat(text_start, np.diff(bounds))
    return TokenizedBatch(ids, starts - shift, limits - shift, bounds)

  def _add(self, keys: list[str]) -> None:
    batch = self._tokenize_keys(keys)
    counts = np.diff(batch.bounds)
    self.first.extend(self.ids.size + batch.bounds[:-1])
    self.count.extend(counts)
    self.nbytes.extend(np.fromiter(map(len, map(str.encode, keys)), np.int64, len(keys)))
    self.ids.extend(batch.ids)
    self.starts.extend(batch.starts)
    self.limits.extend(batch.limits)


class WordPieceVocabulary:
  """BERT uncased WordPiece: Python and tf.data encoders with identical ids.

  The Python API needs neither TensorFlow nor seqio; `as_seqio()` (or `seqio_vocabulary()`)
  gives the seqio.Vocabulary for tasks.

  Args:
    vocab_path: one wordpiece per line (the bundled BERT uncased vocabulary by default).
    backend: "python" (the reference), "rust" or "cached" (see the module docstring; the same
      ids and offsets); default `default_backend()`.
  """

  def __init__(self, vocab_path: str | None = None, backend: Optional[str] = None):
    backend = backend or default_backend()
    if backend not in BACKENDS:
      raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "python" and not _rust_available():
      raise ImportError(f"backend {backend!r} needs the Rust tokenizers package (pip install "
                        f"tokenizers==0.20.3); backend='python' needs nothing")
    self.backend = backend
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
    if backend == "cached":
      # Space-separated parts; a new part is cut into words, a new word tokenised by
      # `_tokenize_new_words`. The tables change on every miss: one thread at a time.
      self._word_keys = _KeyCache(_word_keys, "", self._tokenize_new_words)
      self._keys = _KeyCache(_space_keys, " ", self._word_keys.tokenize_batch)
      self._keys_lock = threading.Lock()

  def __getstate__(self) -> dict:
    # Caches and compiled tokenizers are rebuilt on the other side (e.g. a worker process).
    return {"vocab_path": self.vocab_path, "backend": self.backend}

  def __setstate__(self, state: dict) -> None:
    self.__init__(state["vocab_path"], state["backend"])

  @property
  def vocab_size(self) -> int:
    return len(self.tokens)

  @functools.cached_property
  def word_start_table(self) -> np.ndarray:
    """bool [vocab_size]: True for the wordpieces that start a word (not `##` continuations);
    `word_start_table[ids]` marks the word starts of a tokenised text."""
    return np.array([not token.startswith("##") for token in self.tokens], bool)

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

  def _tokenize_python(self, text: str) -> tuple[list[int], list[int], list[int]]:
    """The reference `tokenize_with_offsets`."""
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

  def _encode_python(self, text: str) -> list[int]:
    """The reference `encode`."""
    return [piece for word, _ in self._words(text) for piece, _, _ in self._word_cache(word)]

  # --------------------------------------------------------------------------- public API

  def tokenize_with_offsets(self, text: str) -> tuple[list[int], list[int], list[int]]:
    """WordPiece ids and the byte span of the original text behind each.

    Args:
      text: raw text (no special tokens are added).

    Returns:
      (ids, byte_starts, byte_limits): for wordpiece i, `text.encode("utf-8")[start:limit]` is
      the original text it came from (a whole word for `[UNK]`).
    """
    if self.backend == "python":
      return self._tokenize_python(text)
    try:
      ids, starts, limits = self._tokenize_compiled(text)
    except UnicodeEncodeError:  # lone surrogates: whatever the reference does (it raises)
      return self._tokenize_python(text)
    return ids.tolist(), starts.tolist(), limits.tolist()

  def tokenize_batch(self, texts: Sequence[str]) -> TokenizedBatch:
    """`tokenize_with_offsets` of many texts at once, as flat arrays (one call, so the
    per-call costs of the compiled backends are paid once)."""
    texts = list(texts)
    if self.backend != "python":
      try:
        if self.backend == "rust":
          return self._tokenize_rust(texts)
        with self._keys_lock:
          return self._keys.tokenize_batch(texts)
      except UnicodeEncodeError:
        pass  # lone surrogates: whatever the reference does (it raises)
    return TokenizedBatch.from_texts([self._tokenize_python(t) for t in texts])

  def num_pieces(self, word: str) -> int:
    """How many wordpieces `word` becomes: `tokenize_with_offsets`' count, an ASCII letter or
    digit run by the reference's cached WordPiece (no call into a compiled backend, whose
    per-call cost dominates for one word)."""
    if word.isascii() and word.isalnum():
      return len(self._word_cache(word.lower()))
    return len(self.tokenize_with_offsets(word)[0])

  def encode(self, text: str) -> list[int]:
    """WordPiece ids of `text` (no [CLS]/[SEP])."""
    if self.backend == "python":
      return self._encode_python(text)
    try:
      return self._tokenize_compiled(text)[0].tolist()
    except UnicodeEncodeError:  # lone surrogates, which the reference drops
      return self._encode_python(text)

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

  # --------------------------------------------------------------------------- compiled paths

  def _tokenize_compiled(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if self.backend == "cached":
      with self._keys_lock:
        return self._keys.tokenize(text)
    return self._tokenize_rust([text]).item(0)

  @functools.cached_property
  def _rust_tokenizer(self):
    # pylint: disable-next=import-outside-toplevel
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    tokenizer = Tokenizer(models.WordPiece(
        vocab=self.token_ids, unk_token="[UNK]", continuing_subword_prefix="##",
        max_input_chars_per_word=MAX_CHARS_PER_WORD))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tokenizer

  def _tokenize_new_words(self, keys: list[str]) -> TokenizedBatch:
    """Word keys not seen yet (see `_ASCII_KEYS`): an ASCII word by the reference's own
    WordPiece (one dict probe or a few: cheaper than a call into Rust, whose per-text costs
    dominate for one word), a chunk with other characters by Rust (or the reference)."""
    words = [key.lstrip("\t\n\r ") for key in keys]
    # An ASCII letter/digit run, or one ASCII punctuation character.
    simple = [word.isascii() and (word.isalnum() or (len(word) == 1 and "!" <= word <= "~"))
              for word in words]
    others = self._tokenize_rust([key for key, ok in zip(keys, simple) if not ok])
    other = iter(range(len(others)))
    ids, starts, limits = [], [], []
    bounds = [0]
    for key, word, ok in zip(keys, words, simple):
      if ok:  # as `_tokenize_python` on an ASCII chunk: one lower-cased word
        pad = len(key) - len(word)
        for piece_id, begin, end in self._word_cache(word.lower()):
          ids.append(piece_id)
          starts.append(pad + begin)
          limits.append(pad + end)
      else:
        piece_ids, piece_starts, piece_limits = others.item(next(other))
        ids += piece_ids.tolist()
        starts += piece_starts.tolist()
        limits += piece_limits.tolist()
      bounds.append(len(ids))
    return TokenizedBatch(np.array(ids, np.int32), np.array(starts, np.int64),
                          np.array(limits, np.int64), np.array(bounds, np.int64))

  def _tokenize_rust(self, texts: list[str]) -> TokenizedBatch:
    """Rust for texts whose every character it treats as the reference does, else Python."""
    safe = [_all_chars_safe(text) for text in texts]
    rust_texts = [text for text, ok in zip(texts, safe) if ok]
    encodings = self._rust_tokenizer.encode_batch(rust_texts, add_special_tokens=False)
    ids = [encoding.ids for encoding in encodings]
    bounds = np.zeros(len(ids) + 1, np.int64)
    np.cumsum([len(x) for x in ids], out=bounds[1:])
    # [num_tokens, 2] Rust's character offsets into the original texts; ours are UTF-8 bytes.
    offsets = np.array(list(itertools.chain.from_iterable(e.offsets for e in encodings)),
                       np.int64).reshape(-1, 2)
    for k, text in enumerate(rust_texts):
      if not text.isascii():
        part = offsets[bounds[k]:bounds[k + 1]]
        part[:] = _char_to_byte(text)[part]
    if all(safe):
      return TokenizedBatch(np.fromiter(itertools.chain.from_iterable(ids), np.int32, bounds[-1]),
                            offsets[:, 0].copy(), offsets[:, 1].copy(), bounds)
    rust = iter(range(len(rust_texts)))
    results = []
    for text, ok in zip(texts, safe):
      if ok:
        k = next(rust)
        part = offsets[bounds[k]:bounds[k + 1]]
        results.append((ids[k], part[:, 0], part[:, 1]))
      else:
        results.append(self._tokenize_python(text))
    return TokenizedBatch.from_texts(results)

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
