"""Tests for realm_jax.data.toy_world: determinism, answerability, split hygiene, X's byte offsets,
fictional names, corpus size in 288-wordpiece blocks, and the atomic/verified file layout.

The block-size check uses a small WordPiece counter written here (BERT's basic tokenisation plus
greedy longest-match over the bundled vocabulary) so it shares no code with the module under test.
"""

import collections
import hashlib
import os
import pathlib
import re
import subprocess
import sys
import unicodedata

import pytest

from realm_jax.data import toy_world as tw

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
VOCAB_PATH = REPO_ROOT / "realm_jax" / "data" / "assets" / "bert_uncased_vocab.txt"
BLOCK_LEN = 288  # REALM_SPEC item 7: [CLS] title [SEP] body [SEP] <= 288 wordpieces.

# Words and real names that must never be entity names (an independent list from the module's).
COMMON_WORDS = {
    "the", "of", "and", "a", "in", "to", "is", "was", "he", "she", "it", "for", "on", "by",
    "john", "william", "mary", "elizabeth", "george", "charles", "smith", "jones", "brown",
    "london", "paris", "berlin", "vienna", "new", "york", "england", "france", "germany",
    "water", "house", "river", "north", "south", "city", "town", "church", "castle", "market",
    "march", "may", "august", "victoria", "albert", "anna", "maria", "peter", "henry",
}
# Words that are part of organisation/event names by design, not invented.
KIND_WORDS = {"Guild", "Trading", "Company", "Academy", "Society", "of", "Bank", "Press",
              "Observatory", "Shipyards", "Conservatory", "Brotherhood", "Accord", "Festival",
              "Expedition", "Council", "Exhibition", "Regatta", "Great", "Fair", "Congress"}
MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|"
          "December")
DATE_RE = re.compile(rf"\d{{1,2}} (?:{MONTHS}) \d{{4}}|(?:{MONTHS}) \d{{1,2}}, \d{{4}}|\d{{4}}")


@pytest.fixture(scope="module")
def world():
  return tw.generate()


@pytest.fixture(scope="module")
def small():
  return tw.generate(scale=tw.SMALL_SCALE)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory, small):
  directory = tmp_path_factory.mktemp("toy_world") / "small"
  small.write(directory)
  return directory


def _tree_bytes(directory):
  """relative path -> bytes of every file under `directory`."""
  root = pathlib.Path(directory)
  return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _docs_by_title(w):
  return {d.title: d for d in w.documents}


# ------------------------------------------------------------------------------------------------
# Determinism.
# ------------------------------------------------------------------------------------------------


def test_same_seed_writes_identical_bytes(tmp_path):
  tw.generate(7, scale=tw.SMALL_SCALE).write(tmp_path / "a")
  tw.generate(7, scale=tw.SMALL_SCALE).write(tmp_path / "b")
  a, b = _tree_bytes(tmp_path / "a"), _tree_bytes(tmp_path / "b")
  assert sorted(a) == ["corpus.jsonl", "manifest.json", "pretrain.jsonl", "qa/dev.jsonl",
                       "qa/test.jsonl", "qa/train.jsonl"]
  assert a == b


def test_default_world_is_deterministic(world):
  assert tw.generate().files() == world.files()


def test_different_seed_differs(small):
  other = tw.generate(1, scale=tw.SMALL_SCALE)
  for name, data in small.files().items():
    assert other.files()[name] != data, name


def test_cli_output_does_not_depend_on_hash_seed(tmp_path, small_dir):
  # A different PYTHONHASHSEED in a fresh process catches any dependence on set/dict hash order.
  out = tmp_path / "cli"
  env = {**os.environ, "PYTHONHASHSEED": "12345"}
  result = subprocess.run([sys.executable, "-m", "realm_jax.data.toy_world", "--out", str(out),
                           "--small"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          check=True)
  assert "100 documents" in result.stdout
  assert _tree_bytes(out) == _tree_bytes(small_dir)


# ------------------------------------------------------------------------------------------------
# Open-QA splits.
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["world", "small"])
def test_every_answer_occurs_in_its_subject_document(which, request):
  w = request.getfixturevalue(which)
  documents = _docs_by_title(w)
  for split in tw.QA_SPLITS:
    assert w.qa[split], split
    for q in w.qa[split]:
      assert q.subject in documents, (split, q)
      assert q.subject in q.question, (split, q)
      assert q.answers and all(isinstance(a, str) and a for a in q.answers), q
      for answer in q.answers:
        # Case-sensitive raw substring, as ORQA labels retriever_correct (REALM_SPEC item 27).
        assert answer in documents[q.subject].text, (split, q)


def test_no_fact_is_asked_in_two_splits(world):
  facts = {s: {(q.subject, q.relation) for q in world.qa[s]} for s in tw.QA_SPLITS}
  subjects = {s: {q.subject for q in world.qa[s]} for s in tw.QA_SPLITS}
  assert not facts["train"] & facts["test"]
  assert not facts["train"] & facts["dev"]
  assert not facts["dev"] & facts["test"]
  # Stronger: splits are by subject entity, so nothing about a test entity is trained on.
  assert not subjects["train"] & subjects["test"]
  questions = [q.question for s in tw.QA_SPLITS for q in world.qa[s]]
  assert len(questions) == len(set(questions))


def test_qa_files_are_orqa_jsonl(small, small_dir):
  for split in tw.QA_SPLITS:
    records = tw.read_jsonl(small_dir / tw.qa_file(split))
    assert len(records) == len(small.qa[split])
    for record, example in zip(records, small.qa[split]):
      assert set(record) == {"question", "answer"}
      assert record == {"question": example.question, "answer": list(example.answers)}


def test_every_relation_is_asked(world):
  relations = collections.Counter(q.relation for q in world.qa["train"])
  assert set(relations) == {"birthplace", "birth_date", "employer", "occupation", "region",
                            "founded_year", "population", "capital", "founder",
                            "headquarters", "founding_date", "date", "place", "participants"}
  assert any(len(q.answers) > 1 for q in world.qa["train"])  # Dates and participant lists.


# ------------------------------------------------------------------------------------------------
# Pretraining text X.
# ------------------------------------------------------------------------------------------------


def _corpus_dates(w):
  """Every date string of the corpus, and the year inside each full date."""
  dates = {m.group(0) for d in w.documents for m in DATE_RE.finditer(d.text)}
  return dates | {date[-4:] for date in dates}


@pytest.mark.parametrize("which", ["world", "small"])
def test_pretrain_sentences_cover_each_sentence_exactly(which, request):
  w = request.getfixturevalue(which)
  for record in w.passages:
    assert list(record) == ["title", "text", "sentence_byte_start", "sentence_byte_limit",
                            "span_byte_start", "span_byte_limit"]
    data = record["text"].encode("utf-8")
    starts, limits = record["sentence_byte_start"], record["sentence_byte_limit"]
    assert len(starts) == len(limits) >= 1
    assert starts[0] == 0 and limits[-1] == len(data)
    for i, (start, limit) in enumerate(zip(starts, limits)):
      sentence = data[start:limit].decode("utf-8")
      assert sentence.endswith(".") and not sentence[0].isspace(), sentence
      assert "." not in sentence[:-1], sentence  # One sentence, not two.
      if i:
        assert data[limits[i - 1]:start] == b" "


@pytest.mark.parametrize("which", ["world", "small"])
def test_pretrain_spans_are_names_or_dates_inside_one_sentence(which, request):
  w = request.getfixturevalue(which)
  documents = _docs_by_title(w)
  dates = _corpus_dates(w)
  multibyte = 0
  for record in w.passages:
    assert record["title"] in documents  # The Z document this passage paraphrases.
    data = record["text"].encode("utf-8")
    sentences = list(zip(record["sentence_byte_start"], record["sentence_byte_limit"]))
    spans = list(zip(record["span_byte_start"], record["span_byte_limit"]))
    per_sentence = collections.Counter()
    for start, limit in spans:
      inside = [i for i, (s, l) in enumerate(sentences) if s <= start < limit <= l]
      assert len(inside) == 1, (record, start, limit)
      per_sentence[inside[0]] += 1
      text = data[start:limit].decode("utf-8")  # Raises if a span cuts a multi-byte character.
      if text in documents:
        assert text in documents[text].text
      else:
        assert DATE_RE.fullmatch(text) and text in dates, text
      multibyte += len(text.encode("utf-8")) != len(text)
    # Fact sentences name several entities or dates; the others state no fact at all.
    assert all(n >= 2 for n in per_sentence.values()), record
    assert 1 <= len(per_sentence) < len(sentences), record
    for i, (start, limit) in enumerate(sentences):
      if i not in per_sentence:
        _assert_states_no_fact(data[start:limit].decode("utf-8"), documents)
  assert multibyte > 0


def _assert_states_no_fact(sentence, documents):
  """No name (a capitalised word past the first), no date or number, no occupation."""
  words = re.findall(r"[\w']+", sentence)
  assert not any(w[0].isupper() for w in words[1:]), sentence
  assert not re.search(r"\d", sentence), sentence
  assert words[0] not in documents, sentence
  assert not set(w.lower() for w in words) & set(tw._OCCUPATIONS), sentence


def test_most_pretraining_wordpieces_are_not_names_or_dates(world):
  """The share of X's wordpieces inside salient spans (BERT wordpieces, counted by this file's own
  counter) is about one in six (0.625 in the first toy world; docs/design/data_index_batches.md
  compares it with real text)."""
  count = _WordPieceCounter()
  total = salient = 0
  for record in world.passages:
    data = record["text"].encode("utf-8")
    total += count(record["text"])
    salient += sum(count(data[s:l].decode("utf-8"))
                   for s, l in zip(record["span_byte_start"], record["span_byte_limit"]))
  assert 0.12 <= salient / total <= 0.20, salient / total


def test_pretrain_text_restates_facts_in_other_words(world):
  documents = _docs_by_title(world)
  for record in world.passages:
    z_text = documents[record["title"]].text
    data = record["text"].encode("utf-8")
    for start, limit in zip(record["sentence_byte_start"], record["sentence_byte_limit"]):
      assert data[start:limit].decode("utf-8") not in z_text


# ------------------------------------------------------------------------------------------------
# Entities and names.
# ------------------------------------------------------------------------------------------------


def _key(word):
  return "".join(c for c in unicodedata.normalize("NFD", word)
                 if unicodedata.category(c) != "Mn").lower()


def test_names_are_unique_and_fictional(world):
  titles = [d.title for d in world.documents]
  assert len(titles) == len(set(titles))
  vocab = set(VOCAB_PATH.read_text(encoding="utf-8").split("\n"))
  invented = {w for t in titles for w in t.split() if w not in KIND_WORDS}
  for word in invented:
    assert _key(word) not in COMMON_WORDS, word
    assert _key(word) not in vocab, word  # Not a real English word or name.
  # No invented word hides inside another, so a name answer only matches where it is stated.
  keys = {_key(w) for w in invented}
  for key in keys:
    inner = {key[i:j] for i in range(len(key)) for j in range(i + 1, len(key) + 1)} - {key}
    assert not inner & keys, key
  accented = [t for t in titles if not t.isascii()]
  assert 0 < len(accented) < len(titles) // 5  # A few, not most.


def test_entity_facts_are_consistent(world):
  towns = {t.name: t for t in world.towns}
  people = {p.name: p for p in world.people}
  for person in world.people:
    assert person.birthplace in towns
    assert person.employer in {o.name for o in world.organizations}
  for organization in world.organizations:
    assert organization.founder in people and organization.headquarters in towns
    assert organization.founded.year > people[organization.founder].birth.year
    for member in organization.members:
      assert people[member].employer == organization.name
  for region in world.regions:
    assert towns[region.capital].region == region.name
  for event in world.events:
    assert event.place in towns and 2 <= len(event.participants) <= 5
    assert all(p in people for p in event.participants)


def test_date_forms():
  assert tw.Date(1843, 3, 12, "dmy").text == "12 March 1843"
  assert tw.Date(1843, 3, 12, "mdy").text == "March 12, 1843"
  assert tw.Date(1843, 3, 12, "year").text == "1843"
  assert tw.Date(1843, 3, 12, "mdy").answers() == ("March 12, 1843", "1843")
  assert tw.Date(1843, 3, 12, "year").answers() == ("1843",)


# ------------------------------------------------------------------------------------------------
# Sizes, in documents and in 288-wordpiece blocks.
# ------------------------------------------------------------------------------------------------


class _WordPieceCounter:
  """Counts BERT-uncased wordpieces: strip accents, lower-case, split punctuation, greedy match."""

  def __init__(self):
    self._vocab = set(VOCAB_PATH.read_text(encoding="utf-8").split("\n"))
    self._cache = {}

  def __call__(self, text):
    return sum(self._word(w) for w in re.findall(r"\w+|[^\w\s]", _key(text)))

  def _word(self, word):
    if word not in self._cache:
      count, start = 0, 0
      while start < len(word):
        end = len(word)
        while end > start and (word[start:end] if start == 0 else "##" + word[start:end]) \
            not in self._vocab:
          end -= 1
        if end == start:  # [UNK]: the whole word is one token.
          count, start = 1, len(word)
          break
        count, start = count + 1, end
      self._cache[word] = count
    return self._cache[word]


def _num_blocks(document, count):
  """Greedy sentence packing into blocks, never crossing documents (REALM_SPEC item 7)."""
  budget = BLOCK_LEN - 3 - count(document.title)
  blocks, used = 1, 0
  for sentence in re.split(r"(?<=\.) ", document.text):
    n = count(sentence)
    if used and used + n > budget:
      blocks, used = blocks + 1, 0
    used += n
  return blocks


def test_default_world_sizes(world):
  counts = world.counts()
  assert 2000 <= counts["documents"] <= 4000
  assert counts["pretrain_passages"] == counts["documents"]
  assert counts["salient_spans"] >= 5 * counts["pretrain_passages"]
  assert 1800 <= counts["qa"]["train"] <= 2200
  assert counts["qa"]["dev"] == counts["qa"]["test"] == 1000
  sentences = [len(re.split(r"(?<=\.) ", d.text)) for d in world.documents]
  assert sum(2 <= n <= 6 for n in sentences) >= 0.95 * len(sentences)


def test_default_corpus_is_a_few_thousand_blocks(world):
  count = _WordPieceCounter()
  blocks = collections.Counter(_num_blocks(d, count) for d in world.documents)
  total = sum(k * v for k, v in blocks.items())
  assert 2000 <= total <= 5000
  assert blocks[1] >= 0.95 * len(world.documents)  # Most documents fit in one block...
  assert sum(v for k, v in blocks.items() if k >= 2) >= 3  # ...a few long ones do not.


def test_small_world_is_small(small):
  counts = small.counts()
  assert 50 <= counts["documents"] <= 150
  assert all(1 <= counts["qa"][s] <= 100 for s in tw.QA_SPLITS)
  assert counts["entities"]["regions"] >= 2


# ------------------------------------------------------------------------------------------------
# Files: manifest, verification, atomic writes, cache, CLI.
# ------------------------------------------------------------------------------------------------


def test_manifest_verifies(small, small_dir):
  manifest = tw.verify(small_dir)
  assert manifest == tw.read_manifest(small_dir) == small.manifest()
  assert manifest["version"] == tw.GENERATOR_VERSION and manifest["seed"] == 0
  assert manifest["counts"] == small.counts()
  for name, entry in manifest["files"].items():
    assert hashlib.sha256((small_dir / name).read_bytes()).hexdigest() == entry["sha256"]
  assert len(tw.read_jsonl(small_dir / tw.CORPUS_FILE)) == manifest["counts"]["documents"]


def test_corrupt_or_missing_file_is_named(small, tmp_path):
  directory = tmp_path / "world"
  small.write(directory)
  path = directory / "qa" / "dev.jsonl"
  path.write_bytes(path.read_bytes().replace(b"?", b"!", 1))
  with pytest.raises(tw.ToyWorldError, match=r"qa/dev\.jsonl.*sha256"):
    tw.verify(directory)
  path.unlink()
  with pytest.raises(tw.ToyWorldError, match=r"qa/dev\.jsonl.*missing"):
    tw.verify(directory)
  (directory / tw.MANIFEST_FILE).unlink()
  with pytest.raises(tw.ToyWorldError, match="manifest.json"):
    tw.verify(directory)


def test_read_jsonl_names_bad_line(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"question": "q", "answer": ["a"]}\n{"question": \n', encoding="utf-8")
  with pytest.raises(tw.ToyWorldError, match=r"bad\.jsonl:2"):
    tw.read_jsonl(path)


def test_crash_during_write_leaves_no_destination(small, tmp_path, monkeypatch):
  def crash(*args, **kwargs):
    raise OSError("simulated crash at the final rename")

  monkeypatch.setattr(os, "replace", crash)
  with pytest.raises(OSError, match="simulated crash"):
    small.write(tmp_path / "world")
  assert not (tmp_path / "world").exists()
  assert list(tmp_path.iterdir()) == []  # The staging directory was cleaned up too.


def test_write_refuses_existing_destination_unless_overwrite(small, tmp_path):
  directory = tmp_path / "world"
  tw.generate(3, scale=tw.SMALL_SCALE).write(directory)
  with pytest.raises(FileExistsError):
    small.write(directory)
  small.write(directory, overwrite=True)
  assert tw.verify(directory)["seed"] == 0
  assert sorted(p.name for p in tmp_path.iterdir()) == ["world"]  # No leftovers.


def test_toy_world_dir_generates_once_and_repairs(tmp_path):
  directory = pathlib.Path(tw.toy_world_dir(tmp_path, small=True))
  assert directory == tmp_path / "toy_world" / f"v{tw.GENERATOR_VERSION}-seed0-small"
  manifest_stat = (directory / tw.MANIFEST_FILE).stat()
  assert pathlib.Path(tw.toy_world_dir(tmp_path, small=True)) == directory
  assert (directory / tw.MANIFEST_FILE).stat().st_mtime_ns == manifest_stat.st_mtime_ns  # Cached.
  corpus = directory / tw.CORPUS_FILE
  good = corpus.read_bytes()
  corpus.write_bytes(good[:-10])
  assert pathlib.Path(tw.toy_world_dir(tmp_path, small=True)) == directory
  assert corpus.read_bytes() == good  # Regenerated after failing verification.


def test_toy_world_dir_default_world_and_env_override(tmp_path, monkeypatch, world):
  monkeypatch.setenv("REALM_JAX_CACHE", str(tmp_path))
  directory = pathlib.Path(tw.toy_world_dir())
  assert directory == tmp_path / "toy_world" / f"v{tw.GENERATOR_VERSION}-seed0"
  assert tw.verify(directory)["counts"] == world.counts()


def test_cli_prints_counts(tmp_path, capsys):
  assert tw.main(["--out", str(tmp_path / "w"), "--small", "--seed", "2"]) == 0
  printed = capsys.readouterr().out
  for expected in ("corpus.jsonl", "pretrain.jsonl", "salient spans", "qa/train.jsonl",
                   "qa/test.jsonl"):
    assert expected in printed
  assert tw.verify(tmp_path / "w")["seed"] == 2
  assert tw.main(["--out", str(tmp_path / "w"), "--small"]) == 1  # Exists, no --overwrite.


def test_reserved_names_keep_two_worlds_apart(small):
  """A world generated with another world's names reserved (the toy BERT's reading worlds)
  shares no invented name with it, neither equal nor inside one another."""
  reserved = tw.name_words(d.title for d in small.documents)
  assert reserved and not set(reserved) & KIND_WORDS
  other = tw.generate(small.seed, scale=tw.SMALL_SCALE, reserved_names=reserved)
  theirs = {_key(w) for w in reserved}
  ours = {_key(w) for d in other.documents for w in d.title.split() if w not in KIND_WORDS}
  for key in ours:
    assert not any(key in t or t in key for t in theirs), key
  # The same seed without reserving gives the first world again: reserving is what differs.
  assert tw.generate(small.seed, scale=tw.SMALL_SCALE).files() == small.files()
  assert "reserved_names_sha256" not in small.manifest()
  assert other.manifest()["reserved_names_sha256"] == hashlib.sha256(
      "\n".join(sorted(reserved)).encode()).hexdigest()


def test_reading_world_dir_is_cached_and_apart_from_the_toy_world(tmp_path):
  with pytest.raises(ValueError, match="toy world's own seed"):
    tw.reading_world_dir(tw.DEFAULT_SEED, tmp_path)
  directory = pathlib.Path(tw.reading_world_dir(3, tmp_path))
  assert directory == tmp_path / "reading_world" / f"v{tw.GENERATOR_VERSION}-seed3"
  stamp = (directory / tw.MANIFEST_FILE).stat().st_mtime_ns
  assert pathlib.Path(tw.reading_world_dir(3, tmp_path)) == directory
  assert (directory / tw.MANIFEST_FILE).stat().st_mtime_ns == stamp  # Cached.
  toy = tw.read_jsonl(pathlib.Path(tw.toy_world_dir(tmp_path)) / tw.CORPUS_FILE)
  reading = tw.read_jsonl(directory / tw.CORPUS_FILE)
  toy_words = {w for r in toy for w in r["title"].split()} - KIND_WORDS
  reading_words = {w for r in reading for w in r["title"].split()} - KIND_WORDS
  assert len(reading) == len(toy) and not toy_words & reading_words
