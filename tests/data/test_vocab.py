"""WordPiece vocabulary: Python and tf.data ids agree with each other and with transformers'
BertTokenizerFast; byte offsets point at the original text; the compiled backends ("rust",
"cached") give exactly the Python reference's ids and offsets; sentence splitting."""

import concurrent.futures
import json
import pickle
import random
import unicodedata

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


# ------------------------------------------------------------------------------ compiled backends
#
# The "rust" and "cached" backends must give exactly the Python reference's ids and byte
# offsets. Every comparison is against the reference run in the same test.

COMPILED = ("rust", "cached")


@pytest.fixture(scope="module")
def backends(vocab):
  """The reference and a fresh vocabulary of each compiled backend."""
  reference = vocab_lib.WordPieceVocabulary(backend="python")
  return reference, {name: vocab_lib.WordPieceVocabulary(backend=name) for name in COMPILED}


def _assert_same_as_reference(reference, compiled, texts, single=True):
  """tokenize_batch (and tokenize_with_offsets/encode one by one) equal the reference."""
  expected = [reference.tokenize_with_offsets(text) for text in texts]
  batch = compiled.tokenize_batch(texts)
  assert len(batch) == len(texts)
  for i, (text, want) in enumerate(zip(texts, expected)):
    got = tuple(array.tolist() for array in batch.item(i))
    assert got == want, (compiled.backend, "batch", ascii(text))
  if single:
    for text, want in zip(texts, expected):
      assert compiled.tokenize_with_offsets(text) == want, (compiled.backend, ascii(text))
      assert compiled.encode(text) == want[0], (compiled.backend, ascii(text))
  return sum(len(ids) for ids, _, _ in expected)


def test_default_backend_is_compiled():
  assert vocab_lib.default_backend() == "cached"
  assert vocab_lib.WordPieceVocabulary().backend == "cached"
  assert vocab_lib.default_vocabulary().backend == "cached"
  with pytest.raises(ValueError, match="backend must be one of"):
    vocab_lib.WordPieceVocabulary(backend="fast")


def test_compiled_backends_equal_python_on_real_text(tmp_path, backends):
  from realm_jax.data import python_docs  # pylint: disable=import-outside-toplevel
  python_docs.generate(str(tmp_path / "pydocs"))
  with open(tmp_path / "pydocs" / "docs.jsonl", encoding="utf-8") as f:
    docs = [json.loads(line) for line in f]
  texts = [doc["text"] for doc in docs] + [doc["title"] for doc in docs]
  assert len(docs) >= 2000 and sum(not t.isascii() for t in texts) >= 20
  reference, compiled = backends
  for backend in compiled.values():
    tokens = _assert_same_as_reference(reference, backend, texts, single=False)
    assert tokens > 200_000
  # One by one too (the "cached" tables now warm), on a slice.
  _assert_same_as_reference(reference, compiled["cached"], texts[::7])


def _category_samples(per_category: int = 24, seed: int = 0) -> dict[str, list[str]]:
  """Characters of every Unicode general category (Cs left out: they cannot be UTF-8)."""
  by_category: dict[str, list[str]] = {}
  for cp in range(0x110000):
    char = chr(cp)
    by_category.setdefault(unicodedata.category(char), []).append(char)
  rng = random.Random(seed)
  samples = {}
  for category, chars in by_category.items():
    if category != "Cs":
      samples[category] = chars[:4] + chars[-4:] + rng.sample(chars, min(per_category,
                                                                           len(chars)))
  return samples


HARD = [
    "café CAFÉ cafe\u0301 Ångström ÅNGSTRÖM naïve résumé Zoë Łódź Dvořák ǅemal İstanbul ıi",
    "e\u0301\u0323 a\u0308\u0304 o\u0327\u0301 q\u0307\u0323 \u0301leading x\u20dd\u20e3",
    "ka\u0903\u093f \U0001d15e\U0001d165\U0001d16e\u0301 \u0f39\u0f71 \u302a\u3099",
    "東京タワー北京 서울 日本語の文章です。中文，标点！ 豈更車 \U00020000\U0002b820\U0002b920",
    "ctrl\x00x\x01y\x07\x1b\x7f\x80\x9fz \u00ad\u200b\u200c\u200d\u200e\u2060\ufeff\ufffd\ufffe",
    "sep\x0b\x0c\x1c\x1d\x1e\x1f\x85 tab\tnl\nret\r\n end",
    "a\u00a0b\u1680c\u2000d\u2007e\u200af\u2028g\u2029h\u202fi\u205fj\u3000k\u180el",
    "x" * 100 + " " + "y" * 101 + " " + "é" * 100 + " " + "é" * 101 + " " + "東" * 150,
    "unaffable" * 12 + " " + "a" * 99 + "\u0301" * 5,
    "😀😃👍👍🏽👨\u200d👩\u200d👧🏳️\u200d🌈🥰🫠 ✓™©®½¼∞≈≠±×÷° ☃\ufe0f",
    "«quote» ‹q› „low“ ‘single’ —dash– ‐‑‒― …‰′″ ¡¿¶§•·†‡※⁂ ⸮؟،۔ ।॥ ။ ៕ ።",
    "(parens) [brackets] {braces} <angles> ⟨math⟩ 「括弧」 『二重』 【隅付】 〔亀甲〕",
    "$100 €50 ¥30 £20 ₹10 ₿1 ^caret^ `tick` ~tilde~ |pipe| _under_ a+b=c 50% #tag @user",
    "ﬁnance ﬂow Ⅻ ⅻ Ｆｕｌｌ ｗｉｄｔｈ １２３ 𝐀𝐁𝐂 𝑎𝑏𝑐 ㎏ ℃ ℡ ＡＢＣ",
    "Σίσυφος ΣΑΣ σας ς ΐΰ Ωμέγα ΆΈΉΊΌΎΏ",
    "нет Да Ёлка ёж Їжак ЎЎ Ӂ",
    "नमस्ते दुनिया مرحبا بالعالم שָׁלוֹם עולם สวัสดีชาวโลก ສະບາຍດີ မင်္ဂလာပါ",
    "\u0378\u0380\u08ca\u0c04\u1abf\u2e52\U000e0001\U000e0100\ue000\U000f0000\U0010fffd",
    "\u200b\u200b", "\x00\x01\x02", "\u0301\u0302", "\ufeff", " \t\n ", "", "\ue000",
    "[CLS] [SEP] [MASK] [UNK] ##ing ## # ###",
]


def test_compiled_backends_equal_python_on_hard_strings(backends):
  texts = list(HARD) + list(TEXTS)
  for category, chars in _category_samples().items():
    # Each character alone, inside a word, between spaces, after a combining mark, doubled.
    texts += [f"ab{c}cd {c} x{c}{c}y {c}\u0301z Q{c}." for c in chars]
    texts.append(" ".join(chars))
    texts.append("".join(chars))
  reference, compiled = backends
  for backend in compiled.values():
    _assert_same_as_reference(reference, backend, texts)


def test_compiled_backends_equal_python_on_the_whole_bmp(backends):
  # Every BMP code point, 40 to a text in varied neighbourhoods.
  chars = [chr(cp) for cp in range(0x10000) if not 0xD800 <= cp <= 0xDFFF]
  texts = []
  for i in range(0, len(chars), 40):
    part = chars[i:i + 40]
    texts.append("w" + "".join(part[:20]) + " " + "a".join(part[20:]) + " end")
  reference, compiled = backends
  for backend in compiled.values():
    _assert_same_as_reference(reference, backend, texts, single=False)


SCRIPT_POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    " \t\n\r\x0b\x0c\x1c\x1f\x85\xa0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000\u180e",
    "\x00\x07\x1b\x7f\x9f\u00ad\u200b\u200c\u200d\u2060\ufeff\ufffd\ue000\U000f0000",
    "".join(map(chr, range(0x300, 0x370))) + "\u0483\u0903\u20dd\U0001d165\u0f39\u302a\u3099",
    "àáâãäåæçèéêëìíîïðñòóôõöøùúûüýþÿĀāĲĳŉſǅǆİıßẞﬁﬂ",
    "ΑΒΓΔΣσςαβγδεζηθικλμνξοπρτυφχψωάέήίόύώΐΰ",
    "абвгдежзийклмнопрстуфхцчшщъыьэюяАБВГДЁё",
    "אבגדהוזחטיךכלםמןנסעףפץצקרשת\u05b0\u05b4\u05bc",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي\u064b\u064e\u0650\u0651",
    "अआइईउऊएऐओऔकखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह\u093f\u0940\u094d",
    "กขคงจฉชซญดตถทธนบปผพฟภมยรลวศษสหอฮ\u0e31\u0e34\u0e47",
    "的一是不了人我在有他这为之大来以个中上们東京北海道日本語中文漢字",
    "あいうえおかきくけこアイウエオカキクケコーッ가각간갈감갑강개객거",
    "😀😃👍🏽👨\u200d👩\u200d👧🥰🫠✓™©½∞≈≠±×÷°豈更車賈",
    "\U00020000\U0002a6d6\U0002b820\U0002b8ff\U0002b920\U0002ceaf\U0002f800\U00030000",
    "𝐀𝐁𝐂𝑎𝑏𝑐𝟎ＡＢＣａｂｃ０１\u0378\u08ca\u0c04\u1abf\u2e52\U000e0100",
    "«»‹›„“”‘’—–‐…‰′″¡¿¶§•·†‡※⁂。、！？",
]


def _random_text(rng: random.Random) -> str:
  pools = rng.sample(SCRIPT_POOLS, rng.randint(1, 4))
  out = []
  for _ in range(rng.randint(0, 30)):
    roll = rng.random()
    if roll < 0.2:
      out.append(rng.choice(" \n\t"))
    elif roll < 0.25:  # any code point at all
      cp = rng.randrange(0x110000)
      out.append(chr(cp) if not 0xD800 <= cp <= 0xDFFF else "?")
    else:
      pool = rng.choice(pools)
      out.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
  if rng.random() < 0.05:  # a word around the 100-character limit
    out.append(rng.choice(SCRIPT_POOLS[0]) * rng.randint(95, 105))
  return "".join(out)


def test_compiled_backends_equal_python_on_random_unicode(backends):
  rng = random.Random(1234)
  texts = [_random_text(rng) for _ in range(5000)]
  reference, compiled = backends
  for backend in compiled.values():
    _assert_same_as_reference(reference, backend, texts, single=backend.backend == "cached")


def test_characters_rust_treats_otherwise_go_to_python(backends):
  # Where the Rust tables differ from Python's, the text takes the reference path.
  differing = {
      "\uf900": "CJK compatibility ideograph: Rust NFD-decomposes it, the reference keeps it",
      "\U0002b820": "in the reference's CJK range, not in Rust's",
      "\u0378": "unassigned: the reference drops it, Rust keeps it",
      "\U0001d165": "a spacing combining mark with a nonzero class: NFD reorders it",
  }
  for char in differing:
    assert not vocab_lib._char_is_safe(char), char  # pylint: disable=protected-access
  for char in "aZ09 .,!\t\n\u00e9\u00df\u6771\u00a0\u200b\x00\u0301😀":
    assert vocab_lib._char_is_safe(char), ascii(char)  # pylint: disable=protected-access
  reference, compiled = backends
  texts = [f"Ab{c}cd x {c}" for c in differing]
  for backend in compiled.values():
    _assert_same_as_reference(reference, backend, texts)


def test_lone_surrogates_behave_as_in_the_reference(backends):
  reference, compiled = backends
  text = "ab \ud800 cd"
  with pytest.raises(UnicodeEncodeError):
    reference.tokenize_with_offsets(text)
  for backend in compiled.values():
    assert backend.encode(text) == reference.encode(text)
    with pytest.raises(UnicodeEncodeError):
      backend.tokenize_with_offsets(text)
    with pytest.raises(UnicodeEncodeError):
      backend.tokenize_batch(["fine", text])
    # And the backend still works afterwards.
    assert backend.encode("fine words") == reference.encode("fine words")


def test_cached_backend_with_tiny_tables_still_exact(backends):
  reference, _ = backends
  cached = vocab_lib.WordPieceVocabulary(backend="cached")
  cached._keys.max_keys = cached._word_keys.max_keys = 5  # pylint: disable=protected-access
  rng = random.Random(7)
  texts = [_random_text(rng) for _ in range(300)] + TEXTS
  _assert_same_as_reference(reference, cached, texts)
  assert len(cached._keys.rows) < 200  # pylint: disable=protected-access


def test_vocabulary_pickles_with_its_backend(backends):
  _, compiled = backends
  for backend in compiled.values():
    backend.encode("warm the caches")
    copy = pickle.loads(pickle.dumps(backend))
    assert copy.backend == backend.backend and copy == backend
    assert copy.tokenize_with_offsets(TEXTS[1]) == backend.tokenize_with_offsets(TEXTS[1])


def test_batch_of_nothing(backends):
  _, compiled = backends
  for backend in compiled.values():
    batch = backend.tokenize_batch([])
    assert len(batch) == 0 and batch.ids.size == 0
    batch = backend.tokenize_batch(["", " ", "x"])
    assert batch.bounds.tolist() == [0, 0, 0, 1]


def test_cached_backend_is_safe_across_threads(backends):
  reference, _ = backends
  cached = vocab_lib.WordPieceVocabulary(backend="cached")
  rng = random.Random(11)
  texts = [_random_text(rng) for _ in range(400)]
  expected = [reference.tokenize_with_offsets(text) for text in texts]
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    got = list(pool.map(cached.tokenize_with_offsets, texts))
  assert got == expected


def test_num_pieces_counts_the_references_wordpieces(backends):
  """`num_pieces` (a shortcut for ASCII words) against the length of the reference's
  tokenization: toy-world-like names, mixed case and digits, accents, a letter NFD keeps
  (ø), punctuation, spaces, the empty word and one over the unknown-word length."""
  reference, compiled = backends
  rng = np.random.default_rng(0)
  letters = list("abcdefghijklmnopqrstuvwxyz")
  words = ["".join(rng.choice(letters, size=rng.integers(3, 12))).capitalize()
           for _ in range(300)]
  words += ["Brannik", "JAERNRAE", "abc123", "1999", "Vésø", "Øster", "naïve", "don't", "a b",
            "", "x" * (vocab_lib.MAX_CHARS_PER_WORD + 1), *HARD]
  for backend in (reference, *compiled.values()):
    for word in words:
      assert backend.num_pieces(word) == len(reference.tokenize_with_offsets(word)[0]), (
          backend.backend, ascii(word))
