"""The embedded toy world: a small, closed, fictional world for running REALM end to end on a CPU.

REALM's claim is that a retriever trained through masked language modelling learns to fetch the
documents that hold the facts a prediction needs. To show that in minutes on a laptop, the facts
must exist *only* in the knowledge corpus: a real-world corpus would let a pretrained model answer
from its prior, and a random-text corpus would have nothing to retrieve. So this module invents a
world of people, places (regions and towns), organisations and events with syllable-built names
that are not English words or names (every name word is rejected if it is a whole word of BERT's
uncased vocabulary), links them with facts (birth dates and places, employers, founders,
headquarters, participants...), and writes the REALM inputs over it:

* ``corpus.jsonl`` -- the knowledge corpus Z, one ``{"title", "text"}`` document per entity
  (spec item 7). Documents are 2-6 sentences; organisations with long member lists and regions
  with many towns are longer, so a few of them span two or more 288-wordpiece blocks.
* ``pretrain.jsonl`` -- the pretraining text X in the schema of the REALM release (spec item 8):
  ``{"title", "text", "sentence_byte_start", "sentence_byte_limit", "span_byte_start",
  "span_byte_limit"}``, byte offsets into ``text.encode("utf-8")``. Each passage restates the facts
  of one Z document *in other words* (X templates never appear in Z), and ``title`` names that
  document. Salient spans are the entity names and dates in each sentence; every span lies inside
  one sentence (so spec item 9 drops none). Because the wording differs, retrieving the named Z
  document is the retrieval REALM should learn, not a "trivial retrieval" (spec item 12) of the
  passage's own text.

  X is prose, so that REALM's choice of masks matters as it does on real text: each fact
  sentence carries a descriptive clause, and each passage has six sentences that state no fact
  (pronouns, function words, common verbs and adjectives, never a name, date, number or
  occupation). Most wordpieces are then predictable from the sentence around them, and the
  knowledge a masked name or date needs stands only in Z. Measured by `bench/text_statistics.py`
  (BERT uncased wordpieces; docs/benchmarks.md):

  ======================================================  =====================  ==============
  text                                                    wordpieces in salient  sentences with
                                                          spans                  a salient span
  ======================================================  =====================  ==============
  toy world v2, X (this module)                           15.9%                  28.1%
  toy world v1, X (every sentence a bare fact)            62.5%                  100%
  Python documentation (`realm_jax.data.python_docs`),    3.6%                   28.1%
  dates and spaCy entities, as a user's corpus
  ======================================================  =====================  ==============

  The real-text figure is of technical prose; the toy text's sentences with a salient span are
  denser in names because each must name enough of its entities for the retriever to find the
  document that states the masked one. Invented name words are at most 3 wordpieces (2.7 on
  average; unbounded they were 3.4).
* ``qa/{train,dev,test}.jsonl`` -- open-QA questions in ORQA's form ``{"question", "answer"}``
  (spec item 30), 2,000/1,000/1,000 of them (dev picks checkpoints, test is reported). Every
  answer string occurs verbatim (case-sensitive, spec item 27) in the text of the subject's
  document. Splits are made by *subject entity*, so no fact asked about in test is
  asked about in train: without retrieval the answers cannot be known, which is what makes
  "EM with retrieval >> EM without" a meaningful check of the whole pipeline.
* ``manifest.json`` -- seed, scale, counts, sha256 of every file and the generator version.

Everything is a pure function of ``(seed, sizes)``: randomness comes from ``random.Random``
instances seeded with strings (hashed with SHA-512 by Python, so independent of
``PYTHONHASHSEED``), and nothing iterates over a set or depends on hash order. Output bytes are
identical across runs and processes; bump ``GENERATOR_VERSION`` whenever they change on purpose.

Public API:

* ``generate(seed, *, scale, num_people, ...) -> ToyWorld``
* ``ToyWorld.write(directory)`` (atomic), ``ToyWorld.files()``, ``ToyWorld.counts()``
* ``read_manifest(directory)``, ``verify(directory)``, ``read_jsonl(path)``
* ``toy_world_dir(cache_root=None)``: the default world, generated once into a cache.
* CLI: ``python -m realm_jax.data.toy_world --out DIR [--seed N] [--small]``.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import hashlib
import json
import logging
import math
import os
import pathlib
import random
import re
import string
import sys
import time
import unicodedata
from typing import Any, Callable, Iterable, Mapping, Sequence

from realm_jax import fileio

__all__ = [
    "CORPUS_FILE",
    "DEFAULT_SEED",
    "Date",
    "Document",
    "Event",
    "GENERATOR_VERSION",
    "MANIFEST_FILE",
    "Organization",
    "PRETRAIN_FILE",
    "Person",
    "QA_SPLITS",
    "QAExample",
    "Region",
    "SMALL_SCALE",
    "Town",
    "ToyWorld",
    "ToyWorldError",
    "default_cache_root",
    "generate",
    "main",
    "qa_file",
    "read_jsonl",
    "name_words",
    "read_manifest",
    "reading_world_dir",
    "toy_world_dir",
    "verify",
]

_LOG = logging.getLogger(__name__)

# Bump whenever the generated bytes change for a given seed; cached worlds are keyed on it.
GENERATOR_VERSION = 2
# Recorded in the manifest. Not `__name__`, which is "__main__" under `python -m`.
_GENERATOR_NAME = "realm_jax.data.toy_world"
DEFAULT_SEED = 0
# `--small`: about 100 documents, for unit tests of the downstream pipeline.
SMALL_SCALE = 0.04

CORPUS_FILE = "corpus.jsonl"
PRETRAIN_FILE = "pretrain.jsonl"
MANIFEST_FILE = "manifest.json"
QA_SPLITS = ("train", "dev", "test")

# Default sizes at scale 1.0: 2,500 documents (about 2,600 blocks of <= 288 wordpieces) and
# 2,000/1,000/1,000 questions. Small enough that ICT and REALM pretraining on 2 CPU cores take
# minutes; dev and test large enough that an EM difference of 0.03 is more than twice the
# binomial standard error of a 0.15 EM (0.011 on 1,000 questions).
_BASE_PEOPLE = 1500
_BASE_PLACES = 440
_BASE_ORGANIZATIONS = 250
_BASE_EVENTS = 310
_BASE_QA = {"train": 2000, "dev": 1000, "test": 1000}
# Fractions of subject entities whose questions go to dev and test. Each pool holds more questions
# than requested (about 1,300 at scale 1.0), so a split is a sample of its pool.
_DEV_SUBJECT_FRACTION = 0.15
_TEST_SUBJECT_FRACTION = 0.15
_TOWNS_PER_REGION = 22

# Documents list at most this many members / towns, so the longest span a handful of blocks.
_MAX_LISTED_MEMBERS = 80
_MAX_LISTED_TOWNS = 32
_LIST_CHUNK = 8


class ToyWorldError(RuntimeError):
  """A toy-world directory is missing, incomplete or corrupt."""


# ------------------------------------------------------------------------------------------------
# Dates.
# ------------------------------------------------------------------------------------------------

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")
# How the corpus states a date: "12 March 1843", "March 12, 1843", or only "1843".
_DATE_STYLES = ("dmy", "mdy", "year")


@dataclasses.dataclass(frozen=True)
class Date:
  """A calendar date together with the form in which the corpus states it.

  Attributes:
    year: the year.
    month: 1-12.
    day: 1-28 (days past 28 are never drawn, so every date is valid).
    style: "dmy" ("12 March 1843"), "mdy" ("March 12, 1843") or "year" ("1843").
  """

  year: int
  month: int
  day: int
  style: str

  @property
  def text(self) -> str:
    """The date as the corpus writes it."""
    if self.style == "dmy":
      return f"{self.day} {_MONTHS[self.month - 1]} {self.year}"
    if self.style == "mdy":
      return f"{_MONTHS[self.month - 1]} {self.day}, {self.year}"
    return str(self.year)

  @property
  def year_text(self) -> str:
    return str(self.year)

  @property
  def on_phrase(self) -> str:
    """The date with its preposition: 'on 12 March 1843', or 'in 1843' for a year only."""
    return f"in {self.text}" if self.style == "year" else f"on {self.text}"

  def answers(self) -> tuple[str, ...]:
    """Accepted answers: the corpus form and, when different, the bare year (a substring of it)."""
    return (self.text,) if self.style == "year" else (self.text, self.year_text)


def _random_date(rng: random.Random, year: int, style_weights: Sequence[float]) -> Date:
  style = rng.choices(_DATE_STYLES, weights=style_weights)[0]
  return Date(year=year, month=rng.randint(1, 12), day=rng.randint(1, 28), style=style)


# ------------------------------------------------------------------------------------------------
# Entities.
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Region:
  """A region: the country-level unit towns belong to.

  Attributes:
    name: the region's name (one invented word).
    capital: name of its most populous town.
    towns: names of its towns, most populous first.
  """

  name: str
  capital: str
  towns: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Town:
  """A town.

  Attributes:
    name: the town's name (one invented word).
    region: name of the region it lies in.
    founded_year: year of its foundation.
    population: number of inhabitants.
  """

  name: str
  region: str
  founded_year: int
  population: int

  @property
  def population_text(self) -> str:
    return f"{self.population:,}"


@dataclasses.dataclass(frozen=True)
class Person:
  """A person.

  Attributes:
    name: "First Last"; first names and surnames are shared, full names are unique.
    gender: "f" or "m" (only chooses pronouns).
    birth: date of birth.
    birthplace: name of the town of birth.
    occupation: a common noun ("cartographer").
    employer: name of the organisation the person worked for.
  """

  name: str
  gender: str
  birth: Date
  birthplace: str
  occupation: str
  employer: str = ""


@dataclasses.dataclass(frozen=True)
class Organization:
  """An organisation.

  Attributes:
    name: e.g. "Halvek Guild"; written with "the" in running text.
    kind: a description with its article ("a craft guild").
    founder: name of the founding person.
    headquarters: name of the town it is based in.
    founded: founding date.
    members: names of the people employed by it, oldest first.
  """

  name: str
  kind: str
  founder: str
  headquarters: str
  founded: Date
  members: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Event:
  """An event.

  Attributes:
    name: e.g. "Morvain Accord"; written with "the" in running text.
    kind: a description with its article ("a treaty").
    date: when it took place (always with day and month).
    place: name of the town it took place in.
    participants: names of the people who took part.
  """

  name: str
  kind: str
  date: Date
  place: str
  participants: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Document:
  """One knowledge-corpus document (one per entity).

  Attributes:
    title: the entity's name.
    text: sentences stating its facts, separated by single spaces.
    kind: "person", "region", "town", "organization" or "event".
  """

  title: str
  text: str
  kind: str

  def to_json(self) -> dict[str, str]:
    return {"title": self.title, "text": self.text}


@dataclasses.dataclass(frozen=True)
class QAExample:
  """One open-QA question, with the fact it asks about (kept out of the JSONL files).

  Attributes:
    question: the question text.
    answers: accepted answers; each occurs verbatim in the subject's document.
    subject: title of the document about the entity asked about.
    relation: which fact of the subject ("birthplace", "founder", ...).
  """

  question: str
  answers: tuple[str, ...]
  subject: str
  relation: str

  def to_json(self) -> dict[str, Any]:
    return {"question": self.question, "answer": list(self.answers)}


# ------------------------------------------------------------------------------------------------
# Names.
# ------------------------------------------------------------------------------------------------

_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s",
           "sk", "st", "t", "th", "tr", "v", "vr", "z", "j", "w")
_NUCLEI = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ae", "ei", "ou", "ai", "y")
# A few accented vowels so multi-byte UTF-8 names (and byte offsets != char offsets) always exist.
_ACCENTED_NUCLEI = ("é", "ö", "ä", "ü", "å", "ø")
# Mostly open syllables and single consonants, so names stay pronounceable ("Brannik Volso").
_CODAS = ("", "", "", "", "", "", "", "n", "r", "l", "s", "k", "m", "v", "x", "th", "nd", "rn",
          "sk", "lt")
# Share of name words with three syllables rather than two.
_THREE_SYLLABLE_FRACTION = 0.25
# Every this-many-th name word carries one accented vowel (a cadence rather than a probability,
# so even the smallest world has some).
_ACCENT_EVERY = 25
_MIN_NAME_KEY_LEN = 4
# At most this many BERT wordpieces per name word. Real names are mostly one or two wordpieces
# (common ones are whole vocabulary words); invented words are split further, and unbounded
# they averaged 3.4 wordpieces, which made names most of the text's wordpieces.
_MAX_NAME_PIECES = 3
_MAX_NAME_ATTEMPTS = 10000
# Real words and names that must never be produced; BERT's vocabulary catches most of them, this
# list documents the intent and guards against a changed vocabulary file.
_REAL_WORDS = ("the", "and", "london", "paris", "berlin", "rome", "john", "mary", "smith",
               "james", "anna", "maria", "peter", "david", "house", "water", "river", "city",
               "town", "king", "queen", "guild", "bank", "press", "march", "may", "june")
_VOCAB_PATH = pathlib.Path(__file__).resolve().parent / "assets" / "bert_uncased_vocab.txt"


def _name_key(word: str) -> str:
  """Lower-cased, accent-stripped form: what BERT uncased sees and what must be unique."""
  decomposed = unicodedata.normalize("NFD", word)
  return "".join(c for c in decomposed if unicodedata.category(c) != "Mn").lower()


def _vocabulary_words() -> frozenset[str]:
  """Whole words (not "##" continuations) of the bundled BERT uncased vocabulary."""
  try:
    lines = _VOCAB_PATH.read_text(encoding="utf-8").splitlines()
  except OSError as e:
    raise ToyWorldError(f"{_VOCAB_PATH}: cannot read the bundled BERT vocabulary ({e}); the toy "
                        "world rejects names that are vocabulary words.") from e
  return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("##"))


class _NameMaker:
  """Invents capitalised name words that are unique and never substrings of one another.

  The substring rule (on accent-stripped lower-case keys) means an answer such as "Tessa" can
  never be found inside the unrelated name "Tessavar", so "the answer occurs in the block" (spec
  item 27) is only true of blocks that really state it. Words that are whole BERT vocabulary
  entries are rejected: they are real words or names, and a one-wordpiece name would make
  salient-span masking trivially short.
  """

  def __init__(self, rng: random.Random, forbidden: frozenset[str],
               reserved: Iterable[str] = (), num_pieces: Callable[[str], int] | None = None):
    self._rng = rng
    self._forbidden = forbidden
    self._num_pieces = num_pieces
    self._keys: set[str] = set()
    self._key_substrings: set[str] = set()
    self._count = 0
    # Names of another world: held as if already invented, so no new name equals one, contains
    # one or is contained in one.
    for word in reserved:
      self._accept(_name_key(word))

  def word(self, allow_three_syllables: bool = True) -> str:
    """Returns a new name word (e.g. "Brannik"), distinct from all previous ones."""
    accented = self._count % _ACCENT_EVERY == _ACCENT_EVERY // 2
    self._count += 1
    for _ in range(_MAX_NAME_ATTEMPTS):
      three = allow_three_syllables and self._rng.random() < _THREE_SYLLABLE_FRACTION
      word = self._candidate(3 if three else 2, accented)
      key = _name_key(word)
      if self._acceptable(key):
        self._accept(key)
        return word
    raise ToyWorldError(f"could not invent a new name after {_MAX_NAME_ATTEMPTS} attempts; "
                        "the world is too large for the syllable inventory.")

  def _candidate(self, num_syllables: int, accented: bool) -> str:
    rng = self._rng
    accent_at = rng.randrange(num_syllables) if accented else -1
    parts = []
    for i in range(num_syllables):
      # Only the first syllable may start with a vowel; later ones need an onset so vowels never
      # pile up into unpronounceable clusters.
      onset = rng.choice(_ONSETS) if i or rng.random() < 0.8 else ""
      nucleus = rng.choice(_ACCENTED_NUCLEI if i == accent_at else _NUCLEI)
      coda = rng.choice(_CODAS) if i < num_syllables - 1 or rng.random() < 0.6 else ""
      parts.append(onset + nucleus + coda)
    return "".join(parts).capitalize()

  def _acceptable(self, key: str) -> bool:
    if len(key) < _MIN_NAME_KEY_LEN or key in self._forbidden:
      return False
    if self._num_pieces is not None and self._num_pieces(key) > _MAX_NAME_PIECES:
      return False
    if key in self._key_substrings:  # `key` is inside an existing name (or equal to one).
      return False
    return not any(sub in self._keys for sub in _substrings(key))  # An existing name inside it.

  def _accept(self, key: str) -> None:
    self._keys.add(key)
    self._key_substrings.update(_substrings(key))
    self._key_substrings.add(key)


def _substrings(key: str) -> list[str]:
  """All substrings of `key` at least `_MIN_NAME_KEY_LEN` long (shorter ones are never names)."""
  n = len(key)
  return [key[i:j] for i in range(n) for j in range(i + _MIN_NAME_KEY_LEN, n + 1)]


# ------------------------------------------------------------------------------------------------
# Building the world.
# ------------------------------------------------------------------------------------------------

_OCCUPATIONS = ("painter", "cartographer", "shipwright", "astronomer", "merchant", "physician",
                "composer", "engineer", "poet", "botanist", "clockmaker", "architect", "lawyer",
                "glassblower", "historian", "weaver", "brewer", "surveyor", "sculptor", "printer")
# (name pattern, description). Patterns put the invented word in different places so names do not
# all look alike.
_ORG_KINDS = (("{} Guild", "a craft guild"), ("{} Trading Company", "a trading company"),
              ("{} Academy", "an academy of sciences"), ("Society of {}", "a learned society"),
              ("{} Bank", "a private bank"), ("{} Press", "a printing house"),
              ("{} Observatory", "an astronomical observatory"),
              ("{} Shipyards", "a shipbuilding firm"), ("{} Conservatory", "a music conservatory"),
              ("Brotherhood of {}", "a mutual aid brotherhood"))
_EVENT_KINDS = (("{} Accord", "a treaty"), ("{} Festival", "a festival"),
                ("{} Expedition", "an expedition"), ("Council of {}", "a council"),
                ("{} Exhibition", "an exhibition"), ("{} Regatta", "a regatta"),
                ("Great Fair of {}", "a trade fair"), ("{} Congress", "a congress"))

_BIRTH_YEARS = (1720, 1880)
_TOWN_FOUNDED_YEARS = (1100, 1750)  # Four-digit years, as a date regex expects.
_EVENT_YEARS = (1760, 1910)
# A person can work for an organisation founded up to this many years after their birth.
_MAX_EMPLOYER_FOUNDED_AFTER_BIRTH = 50
# Participants of an event are between these ages on its date.
_PARTICIPANT_AGES = (20, 65)
# Weights over date styles (dmy, mdy, year) per kind of fact.
_BIRTH_DATE_STYLES = (0.45, 0.45, 0.10)
_FOUNDING_DATE_STYLES = (0.4, 0.4, 0.2)
_EVENT_DATE_STYLES = (0.5, 0.5, 0.0)


def _stage_rng(seed: int, stage: str) -> random.Random:
  """An independent RNG per generation stage (a string seed is hashed with SHA-512 by Python).

  Separate streams keep stages independent: changing how X is worded does not reshuffle Z.
  """
  return random.Random(f"realm_jax.toy_world/v{GENERATOR_VERSION}/{seed}/{stage}")


class _WeightedPicker:
  """Draws items with fixed weights in O(log n) per draw (plain `rng.choices` is O(n))."""

  def __init__(self, items: Sequence[Any], weights: Sequence[float]):
    self._items = list(items)
    self._cumulative = []
    total = 0.0
    for w in weights:
      total += w
      self._cumulative.append(total)

  def pick(self, rng: random.Random, limit: int | None = None) -> Any:
    """Draws one item among the first `limit` (all by default)."""
    limit = len(self._items) if limit is None else limit
    r = rng.random() * self._cumulative[limit - 1]
    return self._items[min(bisect.bisect_right(self._cumulative, r, 0, limit), limit - 1)]


def _round_population(value: float) -> int:
  """Rounds to 2-3 significant figures, as gazetteers do."""
  step = 10 if value < 10000 else 100
  return max(step, int(round(value / step)) * step)


def _make_places(rng: random.Random, names: _NameMaker,
                 num_places: int) -> tuple[list[Region], list[Town]]:
  num_regions = max(2, round(num_places / _TOWNS_PER_REGION))
  num_towns = max(num_regions, num_places - num_regions)
  region_names = [names.word() for _ in range(num_regions)]
  towns = []
  for i in range(num_towns):
    # Round-robin first so every region has at least one town (and hence a capital).
    region = region_names[i] if i < num_regions else rng.choice(region_names)
    towns.append(Town(name=names.word(), region=region,
                      founded_year=rng.randint(*_TOWN_FOUNDED_YEARS),
                      population=_round_population(10 ** rng.uniform(2.9, 5.4))))
  regions = []
  for region in region_names:
    members = sorted((t for t in towns if t.region == region),
                     key=lambda t: (-t.population, t.name))
    regions.append(Region(name=region, capital=members[0].name,
                          towns=tuple(t.name for t in members)))
  return regions, towns


def _make_people(rng: random.Random, names: _NameMaker, num_people: int,
                 towns: Sequence[Town]) -> list[Person]:
  # Shared first names and surnames (as in any real population): retrieval must match both words.
  first_names = [(names.word(allow_three_syllables=False), "f" if i % 2 else "m")
                 for i in range(max(8, num_people // 8))]
  surnames = [names.word() for _ in range(max(8, (num_people * 7) // 10))]
  # Bigger towns are the birthplace of more people.
  birthplaces = _WeightedPicker([t.name for t in towns], [math.sqrt(t.population) for t in towns])
  used: set[str] = set()
  people = []
  for _ in range(num_people):
    while True:
      first, gender = rng.choice(first_names)
      name = f"{first} {rng.choice(surnames)}"
      if name not in used:
        break
    used.add(name)
    people.append(Person(name=name, gender=gender,
                         birth=_random_date(rng, rng.randint(*_BIRTH_YEARS), _BIRTH_DATE_STYLES),
                         birthplace=birthplaces.pick(rng), occupation=rng.choice(_OCCUPATIONS)))
  return people


def _make_organizations(rng: random.Random, names: _NameMaker, num_organizations: int,
                        people: Sequence[Person], towns: Sequence[Town]) -> list[Organization]:
  if num_organizations > len(people):
    raise ValueError(f"num_organizations={num_organizations} exceeds the number of people "
                     f"({len(people)}); every organisation needs its own founder.")
  headquarters = _WeightedPicker([t.name for t in towns], [math.sqrt(t.population) for t in towns])
  organizations = []
  for founder in rng.sample(list(people), num_organizations):
    pattern, kind = rng.choice(_ORG_KINDS)
    year = founder.birth.year + rng.randint(24, 55)
    organizations.append(Organization(
        name=pattern.format(names.word()), kind=kind, founder=founder.name,
        headquarters=headquarters.pick(rng),
        founded=_random_date(rng, year, _FOUNDING_DATE_STYLES)))
  return organizations


def _assign_employers(rng: random.Random, people: Sequence[Person],
                      organizations: Sequence[Organization]
                      ) -> tuple[list[Person], list[Organization]]:
  """Gives every person an employer and every organisation its member list.

  Organisation sizes are heavy-tailed (weight ~ 1/rank), so a few have long member lists and
  their documents span several blocks, as long Wikipedia articles do.
  """
  by_founding = sorted(organizations, key=lambda o: (o.founded.year, o.name))
  ranks = list(range(len(by_founding)))
  rng.shuffle(ranks)
  picker = _WeightedPicker(by_founding, [1.0 / (rank + 3) for rank in ranks])
  founding_years = [o.founded.year for o in by_founding]
  employed = []
  for person in people:
    # Only organisations founded by the time the person could work there are eligible; they form
    # a prefix of `by_founding`. If none is, the oldest one is.
    limit = bisect.bisect_right(founding_years,
                                person.birth.year + _MAX_EMPLOYER_FOUNDED_AFTER_BIRTH)
    employed.append(dataclasses.replace(person, employer=picker.pick(rng, max(1, limit)).name))
  members: dict[str, list[Person]] = {o.name: [] for o in organizations}
  for person in employed:
    members[person.employer].append(person)
  with_members = [
      dataclasses.replace(o, members=tuple(p.name for p in sorted(
          members[o.name], key=lambda p: (p.birth.year, p.birth.month, p.birth.day, p.name))))
      for o in organizations]
  return employed, with_members


def _make_events(rng: random.Random, names: _NameMaker, num_events: int, people: Sequence[Person],
                 towns: Sequence[Town]) -> list[Event]:
  places = _WeightedPicker([t.name for t in towns], [math.sqrt(t.population) for t in towns])
  by_birth = sorted(people, key=lambda p: (p.birth.year, p.name))
  birth_years = [p.birth.year for p in by_birth]
  events = []
  for _ in range(num_events):
    pattern, kind = rng.choice(_EVENT_KINDS)
    date = _random_date(rng, rng.randint(*_EVENT_YEARS), _EVENT_DATE_STYLES)
    num_participants = min(len(people), rng.randint(2, 5))
    # People of working age on the date; if too few exist (tiny worlds), the nearest in age.
    lo = bisect.bisect_left(birth_years, date.year - _PARTICIPANT_AGES[1])
    hi = bisect.bisect_right(birth_years, date.year - _PARTICIPANT_AGES[0])
    pool = by_birth[lo:hi]
    if len(pool) < num_participants:
      pool = sorted(people, key=lambda p: (abs(p.birth.year + 40 - date.year), p.name))
      pool = pool[:num_participants * 3]
    participants = sorted(p.name for p in rng.sample(pool, num_participants))
    events.append(Event(name=pattern.format(names.word()), kind=kind, date=date,
                        place=places.pick(rng), participants=tuple(participants)))
  return events


# ------------------------------------------------------------------------------------------------
# Sentences with salient spans.
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Sentence:
  """A rendered sentence and the character spans of its salient slot values."""

  text: str
  spans: tuple[tuple[int, int], ...]


def _join_names(items: Sequence[str]) -> str:
  """English list: "A", "A and B", "A, B and C"."""
  if len(items) <= 1:
    return "".join(items)
  return ", ".join(items[:-1]) + " and " + items[-1]


def _render(template: str, slots: Mapping[str, Any], salient: Iterable[str] = ()) -> _Sentence:
  """Fills `template` ("{name} was born in {place}.") and records where salient values landed.

  Args:
    template: a `str.format` template with named fields only and no format specs.
    slots: field -> value; a value is a string, or a sequence of strings rendered as an English
      list ("A, B and C") whose items are separate spans.
    salient: fields whose values (each list item) are salient spans.

  Returns:
    The sentence and its salient spans as (start, end) character offsets.
  """
  salient = frozenset(salient)
  pieces: list[str] = []
  spans: list[tuple[int, int]] = []
  pos = 0
  for literal, field, _, _ in string.Formatter().parse(template):
    pieces.append(literal)
    pos += len(literal)
    if field is None:
      continue
    value = slots[field]
    items = [value] if isinstance(value, str) else list(value)
    for i, item in enumerate(items):
      if i:
        separator = " and " if i == len(items) - 1 else ", "
        pieces.append(separator)
        pos += len(separator)
      if field in salient:
        spans.append((pos, pos + len(item)))
      pieces.append(item)
      pos += len(item)
  return _Sentence("".join(pieces), tuple(spans))


def _text(sentences: Sequence[_Sentence]) -> str:
  return " ".join(s.text for s in sentences)


def _passage_record(title: str, sentences: Sequence[_Sentence]) -> dict[str, Any]:
  """A pretraining record in the REALM release's schema (byte offsets into UTF-8 `text`)."""
  sentence_start, sentence_limit, span_start, span_limit = [], [], [], []
  offset = 0
  for i, sentence in enumerate(sentences):
    if i:
      offset += 1  # The single space joining sentences.
    sentence_start.append(offset)
    for start, end in sentence.spans:
      span_start.append(offset + len(sentence.text[:start].encode("utf-8")))
      span_limit.append(offset + len(sentence.text[:end].encode("utf-8")))
    offset += len(sentence.text.encode("utf-8"))
    sentence_limit.append(offset)
  return {"title": title, "text": _text(sentences), "sentence_byte_start": sentence_start,
          "sentence_byte_limit": sentence_limit, "span_byte_start": span_start,
          "span_byte_limit": span_limit}


def _chunks(items: Sequence[str], size: int) -> list[Sequence[str]]:
  return [items[i:i + size] for i in range(0, len(items), size)]


def _pronouns(person: Person) -> dict[str, str]:
  if person.gender == "f":
    return {"He": "She", "he": "she", "his": "her", "His": "Her", "him": "her",
            "himself": "herself", "man": "woman"}
  return {"He": "He", "he": "he", "his": "his", "His": "His", "him": "him", "himself": "himself",
          "man": "man"}


def _with_article(noun: str) -> str:
  return ("an " if noun[0] in "aeiou" else "a ") + noun


# ------------------------------------------------------------------------------------------------
# Knowledge corpus Z: one document per entity. Z and X templates share no wording on purpose, so
# X really restates Z's facts "in other words".
# ------------------------------------------------------------------------------------------------

_Z_PERSON_BIRTH = ("{name} was {a_occupation} born {on_date} in {birthplace}.",
                   "{name} was born in {birthplace} {on_date} and worked as {a_occupation}.",
                   "{name}, born {on_date} in {birthplace}, was {a_occupation}.")
_Z_PERSON_EMPLOYER = ("{He} worked for the {employer}.",
                      "{He} was employed by the {employer} for most of {his} life.",
                      "{He} spent {his} career at the {employer}.")
_Z_PERSON_FOUNDED = ("{He} founded the {organization} in {year}.",
                     "In {year} {he} founded the {organization}.")
_Z_PERSON_EVENT = ("{He} took part in the {event} in {year}.",
                   "{He} was a participant in the {event}.")
_Z_TOWN_INTRO = ("{name} is a town in {region}.",
                 "{name} is a market town in the region of {region}.",
                 "{name} is a town located in {region}.")
_Z_TOWN_FACTS = ("It was founded in {year} and has a population of {population}.",
                 "The town was founded in {year}. Its population is {population}.",
                 "{name} was founded in {year}. It has a population of {population}.")
_Z_TOWN_CAPITAL = "{name} is the capital of {region}."
_Z_TOWN_BORN = "Notable people born in {name} include {people}."
_Z_TOWN_EVENT = "The {event} took place in {name}."
_Z_REGION_INTRO = ("{name} is a region whose capital is {capital}.",
                   "{name} is a region with its capital at {capital}.")
_Z_REGION_TOWNS = ("Towns in {name} include {towns}.", "Other towns in {name} are {towns}.")
_Z_ORG_INTRO = ("The {name} is {kind} founded {on_date} by {founder}.",
                "The {name} was founded by {founder} {on_date}. It is {kind}.",
                "Founded {on_date} by {founder}, the {name} is {kind}.")
_Z_ORG_HQ = ("Its headquarters are in {headquarters}.",
             "The {name} is headquartered in {headquarters}.",
             "It is based in {headquarters}.")
_Z_ORG_MEMBERS = ("Its members have included {members}.", "Other members were {members}.")
_Z_ORG_MORE_MEMBERS = "It has had many other members."
_Z_EVENT_INTRO = ("The {name} was {kind} held {on_date} in {place}.",
                  "The {name} took place in {place} {on_date}. It was {kind}.",
                  "The {name}, {kind}, was held in {place} {on_date}.")
_Z_EVENT_PARTICIPANTS = ("Its participants included {people}.", "{people} took part in it.",
                         "Those who took part included {people}.")
_MAX_EVENTS_PER_PERSON_DOC = 3
_MAX_BIRTHS_PER_TOWN_DOC = 6
_MAX_EVENTS_PER_TOWN_DOC = 2


def _z(rng: random.Random, templates: Sequence[str] | str,
       slots: Mapping[str, Any]) -> list[_Sentence]:
  """Renders one of `templates` (chosen by `rng`) into its sentences.

  A Z template may hold several sentences ("It was founded in {year}. Its population is ...");
  they are split after each ". " (no name or value contains a period). Z needs no spans.
  """
  template = templates if isinstance(templates, str) else rng.choice(templates)
  parts = _render(template, slots).text.split(". ")
  return [_Sentence(part if part.endswith(".") else part + ".", ()) for part in parts]


def _person_document(rng: random.Random, person: Person, founded: Sequence[Organization],
                     events: Sequence[Event]) -> Document:
  slots = {"name": person.name, "a_occupation": _with_article(person.occupation),
           "on_date": person.birth.on_phrase, "birthplace": person.birthplace,
           "employer": person.employer, **_pronouns(person)}
  sentences = _z(rng, _Z_PERSON_BIRTH, slots) + _z(rng, _Z_PERSON_EMPLOYER, slots)
  for organization in founded:
    sentences += _z(rng, _Z_PERSON_FOUNDED, {**slots, "organization": organization.name,
                                             "year": organization.founded.year_text})
  for event in events[:_MAX_EVENTS_PER_PERSON_DOC]:
    sentences += _z(rng, _Z_PERSON_EVENT, {**slots, "event": event.name,
                                           "year": event.date.year_text})
  return Document(person.name, _text(sentences), "person")


def _town_document(rng: random.Random, town: Town, is_capital: bool,
                   organizations: Sequence[Organization], births: Sequence[Person],
                   events: Sequence[Event]) -> Document:
  slots = {"name": town.name, "region": town.region, "year": str(town.founded_year),
           "population": town.population_text}
  sentences = _z(rng, _Z_TOWN_INTRO, slots) + _z(rng, _Z_TOWN_FACTS, slots)
  if is_capital:
    sentences += _z(rng, _Z_TOWN_CAPITAL, slots)
  if organizations:
    names = [f"the {o.name}" for o in organizations]
    verb = "has its headquarters" if len(names) == 1 else "have their headquarters"
    joined = _join_names(names)
    sentences.append(_Sentence(f"{joined[0].upper()}{joined[1:]} {verb} in {town.name}.", ()))
  if births:
    sentences += _z(rng, _Z_TOWN_BORN, {**slots, "people": [p.name for p in
                                                            births[:_MAX_BIRTHS_PER_TOWN_DOC]]})
  for event in events[:_MAX_EVENTS_PER_TOWN_DOC]:
    sentences += _z(rng, _Z_TOWN_EVENT, {**slots, "event": event.name})
  return Document(town.name, _text(sentences), "town")


def _region_document(rng: random.Random, region: Region) -> Document:
  slots = {"name": region.name, "capital": region.capital}
  sentences = _z(rng, _Z_REGION_INTRO, slots)
  others = [t for t in region.towns if t != region.capital][:_MAX_LISTED_TOWNS]
  for i, chunk in enumerate(_chunks(others, _LIST_CHUNK)):
    sentences += _z(rng, _Z_REGION_TOWNS[min(i, 1)], {**slots, "towns": chunk})
  return Document(region.name, _text(sentences), "region")


def _organization_document(rng: random.Random, organization: Organization) -> Document:
  slots = {"name": organization.name, "kind": organization.kind, "founder": organization.founder,
           "on_date": organization.founded.on_phrase,
           "headquarters": organization.headquarters}
  sentences = _z(rng, _Z_ORG_INTRO, slots) + _z(rng, _Z_ORG_HQ, slots)
  members = list(organization.members[:_MAX_LISTED_MEMBERS])
  for i, chunk in enumerate(_chunks(members, _LIST_CHUNK)):
    sentences += _z(rng, _Z_ORG_MEMBERS[min(i, 1)], {**slots, "members": chunk})
  if len(organization.members) > _MAX_LISTED_MEMBERS:
    sentences += _z(rng, _Z_ORG_MORE_MEMBERS, slots)
  return Document(organization.name, _text(sentences), "organization")


def _event_document(rng: random.Random, event: Event) -> Document:
  slots = {"name": event.name, "kind": event.kind, "on_date": event.date.on_phrase,
           "place": event.place, "people": list(event.participants)}
  sentences = _z(rng, _Z_EVENT_INTRO, slots) + _z(rng, _Z_EVENT_PARTICIPANTS, slots)
  return Document(event.name, _text(sentences), "event")


# ------------------------------------------------------------------------------------------------
# Pretraining text X: the same facts in other words, with salient spans, in prose. Each fact
# sentence carries a descriptive clause, and every passage has sentences that state no fact at
# all: most of X's wordpieces are function words, common verbs and adjectives that a language
# model predicts from the sentence around them, as in real text (module docstring: the share of
# name and date wordpieces). None of these words is knowledge: no clause or filler sentence holds
# a name, a date, a number or an occupation, so what a masked salient span needs stands only in Z.
# ------------------------------------------------------------------------------------------------

# (template, salient fields). "{date}" templates are used only for full dates, so that every date
# span is a string the corpus also contains ("12 March 1843" or the year). Pronoun fields
# ({He}, {his}, ...) follow the person's gender.
_X_PERSON_BIRTH = (
    ("{birthplace} is the birthplace of {name}, who was born there in {year} and spent most of "
     "{his} early years in the town.", ("birthplace", "name", "year")),
    ("Born in {year}, {name} grew up in {birthplace}, where {his} family had lived for a long "
     "time.", ("year", "name", "birthplace")),
    ("{name} was born in {year} in {birthplace}, a place that {he} would often write about in "
     "later years.", ("name", "year", "birthplace")))
_X_PERSON_BIRTH_FULL = (
    ("{name} came into the world in {birthplace} on {date} and was raised there by {his} "
     "parents.", ("name", "birthplace", "date")),
    ("On {date}, {name} was born in {birthplace}, and {he} stayed there until {he} was grown.",
     ("date", "name", "birthplace")))
_X_PERSON_EMPLOYER = (
    ("The {employer} employed {name} as {a_occupation}, and {he} stayed with it for many years.",
     ("employer", "name")),
    ("{name} earned a living as {a_occupation} with the {employer}, where {he} was known for "
     "careful work.", ("name", "employer")),
    ("For most of {his} working life, {name} was {a_occupation} at the {employer}.",
     ("name", "employer")))
_X_PERSON_FOUNDED = (
    ("The {organization} was set up by {name} in {year}, after {he} had spent some years "
     "planning it.", ("organization", "name", "year")),
    ("{name} established the {organization} in {year} with the help of a few friends.",
     ("name", "organization", "year")),
    ("In {year}, {name} decided to start something new, and so the {organization} was founded.",
     ("year", "name", "organization")))
_X_PERSON_EVENT = (
    ("{name} was present at the {event} in {year}, and {he} later wrote a short account of it.",
     ("name", "event", "year")),
    ("In {year}, {name} joined the {event} as one of the people who took part in it.",
     ("year", "name", "event")))
_X_TOWN = (
    ("{region} includes the town of {name}, which dates back to {year} and still has many of its "
     "old buildings.", ("region", "name", "year")),
    ("Settlers established {name} in {year}, in what is now {region}, on land that was good for "
     "farming.", ("name", "year", "region")),
    ("The town of {name} was founded in {year}, and it has been a part of {region} ever since.",
     ("name", "year", "region")))
_X_TOWN_POPULATION = (
    ("About {population} people live in {name}, a town of {region}, and most of them work "
     "nearby.", ("name", "region")),
    ("Today {name} has about {population} people, which makes it a town of some size for "
     "{region}.", ("name", "region")))
_X_TOWN_CAPITAL = (
    ("{name} is the seat of government of {region}, and the regional council meets there.",
     ("name", "region")),)
_X_REGION = (
    ("The regional capital of {name} is {capital}, which is also where most of its trade is "
     "done.", ("name", "capital")),
    ("{capital} serves as the chief town of {name}, and the roads of the region all lead to it.",
     ("capital", "name")))
_X_REGION_TOWNS = (
    ("{towns} lie within {name}, along with a number of smaller villages.", ("towns", "name")),)
_X_ORG = (
    ("{founder} set up the {name} in {headquarters} in {year}, and it soon came to be well "
     "known.", ("founder", "name", "headquarters", "year")),)
_X_ORG_FULL = (
    ("The {name}, based in {headquarters}, was started by {founder} on {date} with only a few "
     "members.", ("name", "headquarters", "founder", "date")),)
_X_ORG_MEMBERS = (
    ("{members} belonged to the {name}, along with many others over the years.",
     ("members", "name")),)
_X_EVENT = (
    ("{people} gathered in {place} for the {name} in {year}, and the meetings went on for "
     "several days.", ("people", "place", "name", "year")),
    ("On {date}, {place} hosted the {name}, which drew visitors from all over the region.",
     ("date", "place", "name")))
_X_EVENT_PEOPLE = (
    ("Among those at the {name} were {people}, who had all come a long way to be there.",
     ("name", "people")),)

# Sentences that state no fact: what a passage says around its facts. Each is a template over
# pronouns only, with a few interchangeable words ("{a|b}"), so its wording varies from passage
# to passage while staying predictable from its own words.
_X_FILLER = {
    "person": (
        "Little is known about {his} early life, but {he} seems to have been a {quiet|serious|"
        "curious} child.",
        "{He} was known to {his} friends as a {patient|careful|generous|cheerful} {man} who "
        "liked to work late into the night.",
        "In later life {he} became well known in the town, and many young people came to learn "
        "from {him}.",
        "{He} wrote a great many letters, and some of them are still kept today.",
        "Those who knew {him} said that {he} was {kind|honest|modest|stubborn} and rarely spoke "
        "about {himself}.",
        "{His} work was {admired|praised|respected} by many of the people who saw it.",
        "{He} travelled a good deal when {he} was young, but {he} always came back home.",
        "By the end of {his} life {he} had taught {his} trade to a number of students.",
        "{He} kept a small garden behind {his} house and spent {his} free time there.",
        "It is said that {he} read every book {he} could find, even as a child."),
    "town": (
        "It is a {quiet|busy|pleasant} place, with narrow streets and a small market square.",
        "Most of the people who live there work on the farms around the town or in its "
        "workshops.",
        "The town is known for its old {stone|wooden} bridge and for the market that is held "
        "there every week.",
        "Like many towns in the region, it grew slowly over the centuries.",
        "In the summer its streets are full of visitors who come to see the old houses.",
        "The land around it is {flat|green|hilly} and good for growing grain.",
        "There is a school, a church and a few shops near the centre of the town.",
        "Its people are proud of their town and of the long history it has.",
        "A narrow road leads out of the town and up into the {hills|woods|fields}.",
        "The old houses near the centre are built of {stone|brick|timber} and have steep roofs."),
    "region": (
        "The region is mostly flat, with wide fields and a few low hills in the north.",
        "Most of its people live in small towns and villages along the rivers.",
        "It is known for its {mild|cold|dry} climate and for the long road that runs across it.",
        "Farming has always been important there, and much of the land is still used for it.",
        "Travellers have often written about the beauty of its {hills|forests|valleys}.",
        "In the winter the roads are often closed, and the villages are cut off for weeks.",
        "Its people are known for their {songs|stories|festivals} and for the food they make.",
        "There are a few old castles on the hills, but most of them are now in ruins.",
        "Over the years many of its young people have left to find work elsewhere."),
    "organization": (
        "For many years it was one of the best known bodies of its kind.",
        "Its members met {often|regularly|every month} to talk about their work and to help one "
        "another.",
        "It kept careful records of its affairs, and many of them have survived.",
        "At first it was very small, but it grew {quickly|steadily|slowly} in the years that "
        "followed.",
        "It was run by a small group of members who were chosen every few years.",
        "Over time it became an important part of the life of the town.",
        "Anyone who wished to join had to be put forward by two of its members.",
        "Its rooms were open to the public on {one day|two days} of the week.",
        "Like most bodies of its kind, it had its share of quarrels and hard years."),
    "event": (
        "It drew large crowds, and many of those who were there wrote about it afterwards.",
        "The weather was {fine|poor|cold}, but the meetings went on as planned.",
        "It was remembered for a long time as one of the most important gatherings of its kind.",
        "Those who took part were given a warm welcome by the people of the town.",
        "There were long speeches, a great dinner and music late into the night.",
        "Some of those who came had never met before, and many became friends.",
        "It had taken {months|more than a year} to plan, and much of the work was done by "
        "volunteers.",
        "At the end there was a short ceremony, and the guests went back to their homes.",
        "Many years later people still spoke of it with {pride|pleasure|affection}."),
}
# Filler sentences per passage: the share of name and date wordpieces in X follows from it.
_X_FILLER_SENTENCES = {"person": 6, "town": 6, "region": 6, "organization": 6, "event": 6}
_CHOICE = re.compile(r"\{([^{}|]*\|[^{}]*)\}")


def _x(rng: random.Random, choices: Sequence[tuple[str, Sequence[str]]],
       slots: Mapping[str, Any]) -> _Sentence:
  template, salient = rng.choice(choices)
  return _render(template, slots, salient)


def _filler(rng: random.Random, kind: str, slots: Mapping[str, str]) -> list[_Sentence]:
  """`_X_FILLER_SENTENCES[kind]` different sentences of `_X_FILLER[kind]`, their "{a|b}" words
  chosen by `rng`; they have no salient span."""
  bank = _X_FILLER[kind]
  sentences = []
  for template in rng.sample(bank, min(_X_FILLER_SENTENCES[kind], len(bank))):
    template = _CHOICE.sub(lambda m: rng.choice(m.group(1).split("|")), template)
    sentences.append(_render(template, slots))
  return sentences


def _interleave(rng: random.Random, facts: Sequence[_Sentence],
                filler: Sequence[_Sentence]) -> list[_Sentence]:
  """The fact sentences in their order with the filler placed among them at random; the first
  sentence is always a fact, as a passage opens on its subject."""
  rest = len(facts) - 1 + len(filler)
  fact_positions = frozenset(rng.sample(range(rest), len(facts) - 1))
  later_facts, fillers = iter(facts[1:]), iter(filler)
  return [facts[0], *(next(later_facts) if i in fact_positions else next(fillers)
                      for i in range(rest))]


def _date_slots(date: Date) -> dict[str, str]:
  return {"date": date.text, "year": date.year_text}


def _person_passage(rng: random.Random, person: Person, founded: Sequence[Organization],
                    events: Sequence[Event]) -> dict[str, Any]:
  slots = {"name": person.name, "birthplace": person.birthplace, "employer": person.employer,
           "a_occupation": _with_article(person.occupation), **_date_slots(person.birth),
           **_pronouns(person)}
  birth = _X_PERSON_BIRTH + (_X_PERSON_BIRTH_FULL if person.birth.style != "year" else ())
  facts = [_x(rng, birth, slots), _x(rng, _X_PERSON_EMPLOYER, slots)]
  for organization in founded[:1]:
    facts.append(_x(rng, _X_PERSON_FOUNDED, {**slots, "organization": organization.name,
                                             "year": organization.founded.year_text}))
  if events and not founded:
    facts.append(_x(rng, _X_PERSON_EVENT, {**slots, "event": events[0].name,
                                           "year": events[0].date.year_text}))
  return _passage_record(person.name, _interleave(rng, facts, _filler(rng, "person", slots)))


def _town_passage(rng: random.Random, town: Town, is_capital: bool) -> dict[str, Any]:
  slots = {"name": town.name, "region": town.region, "year": str(town.founded_year),
           "population": town.population_text}
  facts = [_x(rng, _X_TOWN, slots), _x(rng, _X_TOWN_POPULATION, slots)]
  if is_capital:
    facts.append(_x(rng, _X_TOWN_CAPITAL, slots))
  return _passage_record(town.name, _interleave(rng, facts, _filler(rng, "town", slots)))


def _region_passage(rng: random.Random, region: Region) -> dict[str, Any]:
  slots = {"name": region.name, "capital": region.capital}
  facts = [_x(rng, _X_REGION, slots)]
  others = [t for t in region.towns if t != region.capital]
  if others:
    facts.append(_x(rng, _X_REGION_TOWNS, {**slots, "towns": others[:3]}))
  return _passage_record(region.name, _interleave(rng, facts, _filler(rng, "region", slots)))


def _organization_passage(rng: random.Random, organization: Organization) -> dict[str, Any]:
  slots = {"name": organization.name, "founder": organization.founder,
           "headquarters": organization.headquarters, **_date_slots(organization.founded)}
  founding = _X_ORG + (_X_ORG_FULL if organization.founded.style != "year" else ())
  facts = [_x(rng, founding, slots)]
  if organization.members:
    facts.append(_x(rng, _X_ORG_MEMBERS, {**slots, "members": organization.members[:3]}))
  return _passage_record(organization.name,
                         _interleave(rng, facts, _filler(rng, "organization", slots)))


def _event_passage(rng: random.Random, event: Event) -> dict[str, Any]:
  slots = {"name": event.name, "place": event.place, "people": list(event.participants),
           **_date_slots(event.date)}
  facts = [_x(rng, _X_EVENT, slots), _x(rng, _X_EVENT_PEOPLE, slots)]
  return _passage_record(event.name, _interleave(rng, facts, _filler(rng, "event", slots)))


# ------------------------------------------------------------------------------------------------
# Open-QA questions.
# ------------------------------------------------------------------------------------------------

# relation -> question templates ("{s}" is the subject's name).
_QUESTIONS = {
    "birthplace": ("Where was {s} born?", "In which town was {s} born?",
                   "What is the birthplace of {s}?"),
    "birth_date": ("When was {s} born?", "What is the birth date of {s}?",
                   "In what year was {s} born?"),
    "employer": ("Which organisation did {s} work for?", "Who employed {s}?",
                 "{s} worked for which organisation?"),
    "occupation": ("What was the occupation of {s}?", "What did {s} do for a living?",
                   "What was the profession of {s}?"),
    "region": ("In which region is {s}?", "{s} is located in which region?",
               "Which region is {s} part of?"),
    "founded_year": ("When was {s} founded?", "In what year was {s} founded?"),
    "population": ("What is the population of {s}?", "How many people live in {s}?"),
    "capital": ("What is the capital of {s}?", "Which town is the capital of {s}?"),
    "founder": ("Who founded the {s}?", "Who was the founder of the {s}?",
                "The {s} was founded by whom?"),
    "headquarters": ("Where is the {s} headquartered?", "In which town is the {s} based?",
                     "Where are the headquarters of the {s}?"),
    "founding_date": ("When was the {s} founded?", "In what year was the {s} established?"),
    "date": ("When did the {s} take place?", "In what year was the {s} held?"),
    "place": ("Where did the {s} take place?", "In which town was the {s} held?"),
    "participants": ("Who took part in the {s}?", "Name a participant in the {s}."),
}


@dataclasses.dataclass(frozen=True)
class _Fact:
  subject: str
  relation: str
  answers: tuple[str, ...]


def _facts(world_parts: Mapping[str, Sequence[Any]]) -> list[_Fact]:
  """Every askable (subject, relation) fact, in document order. Only one direction of each link
  is asked ("Who founded X?", never "What did Y found?") so a fact has exactly one key."""
  facts = []
  for p in world_parts["people"]:
    facts += [_Fact(p.name, "birthplace", (p.birthplace,)),
              _Fact(p.name, "birth_date", p.birth.answers()),
              _Fact(p.name, "employer", (p.employer,)),
              _Fact(p.name, "occupation", (p.occupation,))]
  for r in world_parts["regions"]:
    facts.append(_Fact(r.name, "capital", (r.capital,)))
  for t in world_parts["towns"]:
    facts += [_Fact(t.name, "region", (t.region,)),
              _Fact(t.name, "founded_year", (str(t.founded_year),)),
              _Fact(t.name, "population", (t.population_text,))]
  for o in world_parts["organizations"]:
    facts += [_Fact(o.name, "founder", (o.founder,)),
              _Fact(o.name, "headquarters", (o.headquarters,)),
              _Fact(o.name, "founding_date", o.founded.answers())]
  for e in world_parts["events"]:
    facts += [_Fact(e.name, "date", e.date.answers()), _Fact(e.name, "place", (e.place,)),
              _Fact(e.name, "participants", e.participants)]
  return facts


def _split_subjects(rng: random.Random, subjects: Sequence[str]) -> dict[str, str]:
  """Assigns each subject entity to one split, so all its facts are asked in that split only."""
  order = list(subjects)
  rng.shuffle(order)
  num_test = round(len(order) * _TEST_SUBJECT_FRACTION)
  num_dev = round(len(order) * _DEV_SUBJECT_FRACTION)
  split = {}
  for i, subject in enumerate(order):
    split[subject] = "test" if i < num_test else "dev" if i < num_test + num_dev else "train"
  return split


def _make_questions(rng: random.Random, facts: Sequence[_Fact], subjects: Sequence[str],
                    sizes: Mapping[str, int]) -> dict[str, list[QAExample]]:
  split_of = _split_subjects(rng, subjects)
  pools: dict[str, list[QAExample]] = {split: [] for split in QA_SPLITS}
  for fact in facts:
    question = rng.choice(_QUESTIONS[fact.relation]).format(s=fact.subject)
    pools[split_of[fact.subject]].append(QAExample(question, fact.answers, fact.subject,
                                                   fact.relation))
  # A random sample per split (not the first N) so every relation and entity kind is represented.
  return {split: rng.sample(pool, min(sizes[split], len(pool))) for split, pool in pools.items()}


# ------------------------------------------------------------------------------------------------
# The world.
# ------------------------------------------------------------------------------------------------


def qa_file(split: str) -> str:
  """Relative path of a QA split's file inside a toy-world directory."""
  if split not in QA_SPLITS:
    raise ValueError(f"unknown QA split {split!r}; expected one of {QA_SPLITS}.")
  return f"qa/{split}.jsonl"


def _jsonl(records: Iterable[Mapping[str, Any]]) -> bytes:
  # ensure_ascii=False keeps "é" as UTF-8 in the file, so the bytes a reader sees are the bytes the
  # span offsets were computed on (after json.loads the offsets index text.encode("utf-8")).
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


@dataclasses.dataclass(frozen=True)
class ToyWorld:
  """A generated toy world: its entities, corpus Z, pretraining text X and QA splits.

  Attributes:
    seed: the generation seed.
    scale: the size multiplier the defaults were derived from.
    regions, towns, people, organizations, events: the entities.
    documents: the knowledge corpus Z, one document per entity.
    passages: the pretraining text X as REALM-schema records.
    qa: split -> questions (with the fact each asks about).
    reserved_names_sha256: sha256 of the name words this world was kept disjoint from
      (`generate(reserved_names=...)`), recorded in the manifest; None when there were none.
  """

  seed: int
  scale: float
  regions: tuple[Region, ...]
  towns: tuple[Town, ...]
  people: tuple[Person, ...]
  organizations: tuple[Organization, ...]
  events: tuple[Event, ...]
  documents: tuple[Document, ...]
  passages: tuple[dict[str, Any], ...]
  qa: Mapping[str, tuple[QAExample, ...]]
  reserved_names_sha256: str | None = None

  def counts(self) -> dict[str, Any]:
    """Sizes of everything, as recorded in the manifest."""
    return {
        "documents": len(self.documents),
        "entities": {"people": len(self.people), "regions": len(self.regions),
                     "towns": len(self.towns), "organizations": len(self.organizations),
                     "events": len(self.events)},
        "pretrain_passages": len(self.passages),
        "pretrain_sentences": sum(len(p["sentence_byte_start"]) for p in self.passages),
        "salient_spans": sum(len(p["span_byte_start"]) for p in self.passages),
        "qa": {split: len(self.qa[split]) for split in QA_SPLITS},
    }

  def files(self) -> dict[str, bytes]:
    """The data files (relative path -> bytes), without the manifest."""
    files = {CORPUS_FILE: _jsonl(d.to_json() for d in self.documents),
             PRETRAIN_FILE: _jsonl(self.passages)}
    for split in QA_SPLITS:
      files[qa_file(split)] = _jsonl(q.to_json() for q in self.qa[split])
    return files

  def manifest(self, files: Mapping[str, bytes] | None = None) -> dict[str, Any]:
    """The manifest: generator, version, seed, counts and sha256 of every data file.

    It holds no timestamp or path, so it is as deterministic as the data.
    """
    files = self.files() if files is None else files
    manifest = {
        "generator": _GENERATOR_NAME,
        "version": GENERATOR_VERSION,
        "seed": self.seed,
        "scale": self.scale,
        "counts": self.counts(),
        "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                  for name, data in files.items()},
    }
    if self.reserved_names_sha256 is not None:
      manifest["reserved_names_sha256"] = self.reserved_names_sha256
    return manifest

  def write(self, directory: str | os.PathLike, *, overwrite: bool = False) -> dict[str, Any]:
    """Writes the world into `directory` atomically and returns the manifest.

    Everything is written into a hidden temporary directory next to `directory` (same filesystem),
    flushed to disk, and then renamed into place; the manifest is written last. A write that dies
    part-way leaves at most a hidden ".NAME.tmp-*" directory, never a `directory` that looks
    complete.

    Args:
      directory: destination; its parent is created if needed.
      overwrite: replace an existing `directory` (it is moved aside first and deleted only after
        the new one is in place). Without it an existing destination raises FileExistsError.

    Returns:
      The manifest written to `directory/manifest.json`.
    """
    destination = pathlib.Path(directory).absolute()
    if destination.exists() and not overwrite:
      raise FileExistsError(f"{destination}: already exists; pass overwrite=True to replace it.")
    destination.parent.mkdir(parents=True, exist_ok=True)
    files = self.files()
    manifest = self.manifest(files)
    with fileio.staged_directory(destination, f".{destination.name}.tmp-") as staging:
      for name, data in files.items():
        _write_file(pathlib.Path(staging, name), data)
      _write_file(pathlib.Path(staging, MANIFEST_FILE), _manifest_bytes(manifest))
      # An existing destination (overwrite, or one written meanwhile) is moved aside first, so
      # a crash in between leaves the old copy (hidden) rather than nothing at all.
      fileio.publish_staged(staging, destination, aside_prefix=f".{destination.name}.old-")
    return manifest


def _manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
  return (json.dumps(manifest, ensure_ascii=False, indent=2) + "\n").encode("utf-8")


def _write_file(path: pathlib.Path, data: bytes) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


# ------------------------------------------------------------------------------------------------
# Generation.
# ------------------------------------------------------------------------------------------------


def _scaled(base: int, scale: float, minimum: int) -> int:
  return max(minimum, int(round(base * scale)))


def generate(seed: int = DEFAULT_SEED, *, scale: float = 1.0, num_people: int | None = None,
             num_places: int | None = None, num_organizations: int | None = None,
             num_events: int | None = None, num_train: int | None = None,
             num_dev: int | None = None, num_test: int | None = None,
             reserved_names: Sequence[str] = ()) -> ToyWorld:
  """Generates a toy world; the same arguments always give byte-identical files.

  Args:
    seed: generation seed.
    scale: multiplies every default size (1.0: about 2,500 documents and 2,000/1,000/1,000
      questions; `SMALL_SCALE`: about 100 documents).
    num_people, num_places, num_organizations, num_events: entity counts (places include the
      regions, about one per 22 towns, and are at least 4: two regions with a town each);
      default to the base sizes times `scale`.
    num_train, num_dev, num_test: QA split sizes; default to 2,000/1,000/1,000 times `scale`. A
      split gets fewer questions only if its subjects have fewer facts than requested.
    reserved_names: name words of another world (`name_words`); no name of this world
      equals, contains or is contained in one of them (the toy BERT's reading worlds share no
      name with the toy world, see `reading_world_dir`).

  Returns:
    The ToyWorld.
  """
  if scale <= 0:
    raise ValueError(f"scale must be positive, got {scale}.")
  num_people = _scaled(_BASE_PEOPLE, scale, 8) if num_people is None else num_people
  num_places = _scaled(_BASE_PLACES, scale, 4) if num_places is None else num_places
  num_organizations = (_scaled(_BASE_ORGANIZATIONS, scale, 2) if num_organizations is None
                       else num_organizations)
  num_events = _scaled(_BASE_EVENTS, scale, 2) if num_events is None else num_events
  sizes = {split: _scaled(_BASE_QA[split], scale, 1) for split in QA_SPLITS}
  for split, value in (("train", num_train), ("dev", num_dev), ("test", num_test)):
    if value is not None:
      sizes[split] = value
  for name, value in (("num_people", num_people), ("num_places", num_places),
                      ("num_organizations", num_organizations), ("num_events", num_events)):
    if value < 1:
      raise ValueError(f"{name} must be at least 1, got {value}.")

  from realm_jax.data import vocab  # pylint: disable=import-outside-toplevel
  wordpieces = vocab.default_vocabulary()
  names = _NameMaker(_stage_rng(seed, "names"), _vocabulary_words() | frozenset(_REAL_WORDS),
                     reserved=reserved_names,
                     num_pieces=lambda word: len(wordpieces.tokenize_with_offsets(word)[0]))
  regions, towns = _make_places(_stage_rng(seed, "places"), names, num_places)
  people = _make_people(_stage_rng(seed, "people"), names, num_people, towns)
  organizations = _make_organizations(_stage_rng(seed, "organizations"), names, num_organizations,
                                      people, towns)
  people, organizations = _assign_employers(_stage_rng(seed, "employers"), people, organizations)
  events = _make_events(_stage_rng(seed, "events"), names, num_events, people, towns)
  parts = {"regions": regions, "towns": towns, "people": people,
           "organizations": organizations, "events": events}

  documents, passages = _write_texts(seed, parts)
  facts = _facts(parts)
  qa = _make_questions(_stage_rng(seed, "qa"), facts, [d.title for d in documents], sizes)
  return ToyWorld(seed=seed, scale=scale, regions=tuple(regions), towns=tuple(towns),
                  people=tuple(people), organizations=tuple(organizations), events=tuple(events),
                  documents=tuple(documents), passages=tuple(passages),
                  qa={split: tuple(qa[split]) for split in QA_SPLITS},
                  reserved_names_sha256=(_names_sha256(reserved_names) if reserved_names
                                         else None))


def name_words(titles: Iterable[str]) -> tuple[str, ...]:
  """The invented name words of a world's document titles (every entity has a document; the
  words of organisation and event kinds such as "Guild" or "Shipyards" are left out), sorted:
  what another world must avoid to share no name with it."""
  kind_words = {w for pattern, _ in _ORG_KINDS + _EVENT_KINDS for w in pattern.split()}
  return tuple(sorted({w for title in titles for w in title.split() if w not in kind_words}))


def _names_sha256(names: Sequence[str]) -> str:
  return hashlib.sha256("\n".join(sorted(names)).encode("utf-8")).hexdigest()


def _group(items: Iterable[Any],
           key: Callable[[Any], Iterable[str]]) -> dict[str, list[Any]]:
  """Groups `items` under every key `key(item)` returns, keeping item order."""
  groups: dict[str, list[Any]] = {}
  for item in items:
    for k in key(item):
      groups.setdefault(k, []).append(item)
  return groups


def _write_texts(seed: int, parts: Mapping[str, Sequence[Any]]
                 ) -> tuple[list[Document], list[dict[str, Any]]]:
  """Renders corpus Z and pretraining text X, one document and one passage per entity."""
  z_rng, x_rng = _stage_rng(seed, "corpus"), _stage_rng(seed, "pretrain")
  founded_by = _group(parts["organizations"], lambda o: [o.founder])
  events_of = _group(parts["events"], lambda e: e.participants)
  born_in = _group(parts["people"], lambda p: [p.birthplace])
  based_in = _group(parts["organizations"], lambda o: [o.headquarters])
  events_in = _group(parts["events"], lambda e: [e.place])
  capitals = frozenset(r.capital for r in parts["regions"])

  documents, passages = [], []
  for p in parts["people"]:
    founded, events = founded_by.get(p.name, []), events_of.get(p.name, [])
    documents.append(_person_document(z_rng, p, founded, events))
    passages.append(_person_passage(x_rng, p, founded, events))
  for r in parts["regions"]:
    documents.append(_region_document(z_rng, r))
    passages.append(_region_passage(x_rng, r))
  for t in parts["towns"]:
    is_capital = t.name in capitals
    documents.append(_town_document(z_rng, t, is_capital, based_in.get(t.name, []),
                                    born_in.get(t.name, []), events_in.get(t.name, [])))
    passages.append(_town_passage(x_rng, t, is_capital))
  for o in parts["organizations"]:
    documents.append(_organization_document(z_rng, o))
    passages.append(_organization_passage(x_rng, o))
  for e in parts["events"]:
    documents.append(_event_document(z_rng, e))
    passages.append(_event_passage(x_rng, e))
  return documents, passages


# ------------------------------------------------------------------------------------------------
# Reading, verifying and caching.
# ------------------------------------------------------------------------------------------------


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
  """Reads a JSONL file; a malformed line raises ToyWorldError naming the file and line."""
  records = []
  with open(path, encoding="utf-8") as f:
    for line_number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise ToyWorldError(f"{path}:{line_number}: invalid JSON ({e}).") from e
  return records


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
  """Reads `directory/manifest.json`.

  Raises:
    ToyWorldError: the manifest is missing (an incomplete or foreign directory), unreadable, or
      from another generator.
  """
  path = pathlib.Path(directory) / MANIFEST_FILE
  try:
    manifest = json.loads(path.read_text(encoding="utf-8"))
  except FileNotFoundError as e:
    raise ToyWorldError(f"{path}: missing; {directory} is not a complete toy world.") from e
  except (OSError, ValueError) as e:
    raise ToyWorldError(f"{path}: unreadable manifest ({e}).") from e
  if not isinstance(manifest, dict) or manifest.get("generator") != _GENERATOR_NAME:
    raise ToyWorldError(f"{path}: not a toy-world manifest (generator "
                        f"{manifest.get('generator') if isinstance(manifest, dict) else None!r}).")
  if not isinstance(manifest.get("files"), dict):
    raise ToyWorldError(f"{path}: manifest has no 'files' table.")
  return manifest


def verify(directory: str | os.PathLike) -> dict[str, Any]:
  """Re-hashes every file listed in the manifest and returns the manifest.

  Raises:
    ToyWorldError: naming the first file that is missing or whose sha256 differs.
  """
  manifest = read_manifest(directory)
  for name, entry in manifest["files"].items():
    path = pathlib.Path(directory) / name
    if not path.is_file():
      raise ToyWorldError(f"{path}: missing (listed in {MANIFEST_FILE}).")
    actual = fileio.sha256_file(path)
    if actual != entry.get("sha256"):
      raise ToyWorldError(f"{path}: sha256 {actual} does not match the manifest's "
                          f"{entry.get('sha256')}; the file is corrupt, regenerate the world.")
  return manifest


def default_cache_root() -> pathlib.Path:
  """The project's cache of generated data: `$REALM_JAX_CACHE`, else `~/.cache/realm_jax`."""
  override = os.environ.get("REALM_JAX_CACHE")
  return pathlib.Path(override) if override else pathlib.Path.home() / ".cache" / "realm_jax"


def toy_world_dir(cache_root: str | os.PathLike | None = None, *, seed: int = DEFAULT_SEED,
                  small: bool = False) -> str:
  """Returns the directory of the toy world, generating it on first use.

  The world lives in `CACHE/toy_world/v<GENERATOR_VERSION>-seed<seed>[-small]`, where CACHE is
  `cache_root`, else `$REALM_JAX_CACHE`, else `~/.cache/realm_jax`. An existing directory is
  verified (every hash) and regenerated if it fails. Two processes that both find no world both
  generate it; their outputs are identical and the later rename wins.

  Args:
    cache_root: the cache root (see above).
    seed: generation seed.
    small: the `SMALL_SCALE` world (about 100 documents) instead of the default one.

  Returns:
    The directory, as a string.
  """
  root = pathlib.Path(cache_root) if cache_root is not None else default_cache_root()
  scale = SMALL_SCALE if small else 1.0
  directory = root / "toy_world" / f"v{GENERATOR_VERSION}-seed{seed}{'-small' if small else ''}"
  return _cached_world(directory, lambda: generate(seed, scale=scale),
                       seed=seed, scale=scale, reserved_names_sha256=None)


def reading_world_dir(seed: int, cache_root: str | os.PathLike | None = None) -> str:
  """A world of the default size that shares no name with the default toy world, generated on
  first use into `CACHE/reading_world/v<GENERATOR_VERSION>-seed<seed>` (see `toy_world_dir`).

  The toy BERT learns to read from such worlds: their facts are about other entities, so it
  cannot learn the toy world's facts, and REALM's null-document baseline on the toy world stays
  at what a model knows without retrieval.
  """
  if seed == DEFAULT_SEED:
    raise ValueError(f"reading_world_dir: seed {seed} is the toy world's own seed.")
  root = pathlib.Path(cache_root) if cache_root is not None else default_cache_root()
  toy_corpus = pathlib.Path(toy_world_dir(root)) / CORPUS_FILE
  reserved = name_words(record["title"] for record in read_jsonl(toy_corpus))
  directory = root / "reading_world" / f"v{GENERATOR_VERSION}-seed{seed}"
  return _cached_world(directory, lambda: generate(seed, reserved_names=reserved),
                       seed=seed, scale=1.0, reserved_names_sha256=_names_sha256(reserved))


def _cached_world(directory: pathlib.Path, make: Callable[[], ToyWorld], **expected: Any) -> str:
  """`directory` if its hashes verify and its manifest has this generator version and the
  `expected` fields, else the world `make()` written there."""
  if directory.exists():
    try:
      manifest = verify(directory)
      if manifest.get("version") == GENERATOR_VERSION and all(
          manifest.get(k) == v for k, v in expected.items()):
        return str(directory)
      _LOG.warning("%s: manifest does not match (version, %s); regenerating.", directory,
                   ", ".join(expected))
    except ToyWorldError as e:
      _LOG.warning("%s; regenerating the toy world.", e)
  make().write(directory, overwrite=True)
  return str(directory)


# ------------------------------------------------------------------------------------------------
# Command line.
# ------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
  """`python -m realm_jax.data.toy_world --out DIR [--seed N] [--small | --scale S]`."""
  parser = argparse.ArgumentParser(
      prog="python -m realm_jax.data.toy_world",
      description="Generate the embedded toy world (corpus Z, pretraining text X, open-QA splits).")
  parser.add_argument("--out", required=True, help="destination directory (written atomically)")
  parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="generation seed")
  size = parser.add_mutually_exclusive_group()
  size.add_argument("--small", action="store_true",
                    help=f"a world of about 100 documents (scale {SMALL_SCALE})")
  size.add_argument("--scale", type=float, default=1.0, help="multiply every default size")
  parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
  args = parser.parse_args(argv)

  from realm_jax import gin_utils  # pylint: disable=g-import-not-at-top

  def write() -> int:
    start = time.perf_counter()
    world = generate(args.seed, scale=SMALL_SCALE if args.small else args.scale)
    manifest = world.write(args.out, overwrite=args.overwrite)
    elapsed = time.perf_counter() - start
    counts = manifest["counts"]
    print(f"wrote toy world v{GENERATOR_VERSION} (seed {args.seed}, scale {manifest['scale']}) "
          f"to {pathlib.Path(args.out).absolute()} in {elapsed:.1f}s")
    print(f"  entities: " + ", ".join(f"{v} {k}" for k, v in counts["entities"].items()))
    print(f"  {CORPUS_FILE}: {counts['documents']} documents")
    print(f"  {PRETRAIN_FILE}: {counts['pretrain_passages']} passages, "
          f"{counts['pretrain_sentences']} sentences, {counts['salient_spans']} salient spans")
    for split in QA_SPLITS:
      print(f"  {qa_file(split)}: {counts['qa'][split]} questions")
    print(f"  {MANIFEST_FILE}: sha256 of {len(manifest['files'])} files")
    return 0

  return gin_utils.run_command(
      "toy_world", write, interrupted="nothing was written to --out (it is renamed into place "
      "only when complete)", expected=(OSError, ValueError), describe=gin_utils.one_line)


if __name__ == "__main__":
  sys.exit(main())
