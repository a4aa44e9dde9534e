"""What retrieval can add to REALM pretraining on a corpus: are the masked spans stated elsewhere?

REALM pretrains with X = Z, and the query's own block is no candidate (REALM_SPEC 12), so
retrieval can only help where a masked salient span is stated in another article; on a corpus
that states each fact once it has nothing to learn from. These statistics bound what retrieval
can add, for any corpus: `salient_share`, `span_redundancy` (the masked spans stated in another
article's block), `retrieved_statement_share` (how often a retriever's top k holds one) and
`warning_line`. A span is stated in a block when its words, normalised as ORQA normalises
answers, occur as consecutive whole words of the block's normalised body; another article is a
block with another title. The retrieval part takes any `realm_jax.index.retrieval.Retriever`
(the data layer cannot load an index itself). More: docs/design/data_index_batches.md.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol, Sequence

import numpy as np

from realm_jax import progress as progress_lib
from realm_jax.data import answer_match
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import masking
from realm_jax.data import salient_spans
from realm_jax.data import vocab as vocab_lib

# Spans of more words are not looked for (counted as not stated): names and dates are shorter,
# and each extra length costs the index one more lookup per word of the corpus.
MAX_SPAN_WORDS = 8
# Other articles counted per span at most: enough to tell "once" from "often", and the bound keeps
# the index of a common name ("London") small.
MAX_ARTICLES = 4
# Below this share of masked spans stated in another article, more than two REALM queries in three
# cannot be helped by any candidate (docs/design/data_index_batches.md has the measured shares).
MIN_SPAN_SHARE = 0.3
# REALM's candidates per masked query: the search's top 8 (REALM_SPEC 12-13).
NUM_CANDIDATES = 8
# Queries embedded and searched per retriever call.
QUERY_BATCH_SIZE = 256

# A possessive "'s" (or "\u2019s") after a word.
_POSSESSIVE = re.compile(r"(?<=\w)(['\u2019]s)(?!\w)")

Progress = Callable[[str], None]  # receives `progress.line` lines, e.g. a `progress.Throttle`


def span_words(text: str) -> tuple[str, ...]:
  """The words of `text` under the answer normalisation (`answer_match.normalize_answer`), a
  possessive "'s" split off first.

  Spans and block bodies both go through it, so a span matches a body's words whatever their
  case, punctuation or spacing. The normalisation deletes punctuation inside words, which would
  make "Babbage's" the one word "babbages": the split keeps the name a word of its own.
  """
  return tuple(answer_match.normalize_answer(_POSSESSIVE.sub(r" \1", text)).split())


def contains_words(words: Sequence[str], phrase: Sequence[str]) -> bool:
  """Whether `phrase` occurs as consecutive whole words of `words` (False for an empty phrase)."""
  n = len(phrase)
  if n == 0:
    return False
  phrase = tuple(phrase)
  first = phrase[0]
  for i in range(len(words) - n + 1):
    if words[i] == first and tuple(words[i:i + n]) == phrase:
      return True
  return False


def record_spans(record: Mapping[str, Any]) -> list[tuple[str, int]]:
  """The (span text, sentence index) pairs salient-span masking draws from a record.

  As `masking.spans_by_sentence`: each distinct span once, in its first sentence; spans crossing
  a sentence boundary are left out, as masking leaves them out.
  """
  data = record["text"].encode("utf-8")
  return [(data[start:limit].decode("utf-8"), index)
          for (start, limit), index in masking.spans_by_sentence(record)]


def _report(progress: Optional[Progress], what: str, done: int, total: Optional[int],
            start: float) -> None:
  if progress is not None:
    progress(progress_lib.line(what, done, total, time.monotonic() - start))


# ----------------------------------------------------------------------------- wordpieces


def salient_share(records: Iterable[Mapping[str, Any]],
                  vocab: Optional[vocab_lib.WordPieceVocabulary] = None, *,
                  progress: Optional[Progress] = None) -> salient_spans.SalientShare:
  """How much of the records' text (precomputed-span schema) is salient spans: wordpieces and
  sentences, a `salient_spans.SalientShare`. Random-token masking hits a name or date at the
  wordpiece share; salient-span masking draws its queries from the sentences holding a span.
  """
  vocab = vocab or vocab_lib.default_vocabulary()
  total = len(records) if isinstance(records, Sequence) else None
  share = salient_spans.SalientShare()
  start = time.monotonic()
  for count, record in enumerate(records, start=1):
    share.add(record, vocab.tokenize_with_offsets)
    if count % 256 == 0:
      _report(progress, "records", count, total, start)
  return share


# ----------------------------------------------------------------------------- span redundancy


@dataclasses.dataclass(frozen=True)
class SpanRedundancy:
  """How often the salient spans of a corpus's records are stated in another article's block.

  Attributes:
    spans: (span, sentence) pairs counted: what salient-span masking draws from.
    stated_spans: those whose text another article's block states.
    long_spans: spans of more than `max_span_words` words (not looked for: not stated).
    sentences: sentences holding at least one counted span.
    stated_sentences: those with some span stated in another article.
    other_articles: other articles stating a span, each span's count capped at `max_articles`,
      summed over the spans.
    max_span_words: the longest span looked for, in normalised words.
    max_articles: the cap of `other_articles`.
  """

  spans: int
  stated_spans: int
  long_spans: int
  sentences: int
  stated_sentences: int
  other_articles: int
  max_span_words: int
  max_articles: int

  @property
  def span_share(self) -> float:
    """Share of the masked spans stated in another article (0 without spans)."""
    return self.stated_spans / max(self.spans, 1)

  @property
  def sentence_share(self) -> float:
    """Share of the sentences with a span (the queries' sentences) where some span is stated in
    another article."""
    return self.stated_sentences / max(self.sentences, 1)

  @property
  def mean_other_articles(self) -> float:
    """Other articles stating a span, capped at `max_articles`, averaged over all spans."""
    return self.other_articles / max(self.spans, 1)


class _PhraseArticles:
  """Which articles state each phrase of a fixed set: phrase -> up to `max_titles` titles.

  Only the phrases asked about are kept, so a corpus of a million words costs one dict lookup
  per word (its first word against the phrases' first words) plus one per phrase length there.
  """

  def __init__(self, phrases: Iterable[tuple[str, ...]], max_titles: int):
    self.max_titles = max_titles
    self.titles: dict[tuple[str, ...], list[str]] = {p: [] for p in phrases if p}
    lengths = collections.defaultdict(set)
    for phrase in self.titles:
      lengths[phrase[0]].add(len(phrase))
    self._lengths = {word: sorted(n) for word, n in lengths.items()}  # first word -> lengths

  def add_block(self, title: str, body: str) -> None:
    """Records `title` for every phrase the body states."""
    words = span_words(body)
    for i, word in enumerate(words):
      for n in self._lengths.get(word, ()):
        if i + n > len(words):
          break
        titles = self.titles.get(words[i:i + n])
        if titles is not None and len(titles) < self.max_titles and title not in titles:
          titles.append(title)

  def others(self, phrase: tuple[str, ...], title: str) -> int:
    """Articles other than `title` stating `phrase`; past `max_titles` - 1 the count may be cut
    short (only `max_titles` titles are kept), which the caller's cap hides."""
    return sum(t != title for t in self.titles.get(phrase, ()))


def span_redundancy(store: block_store_lib.BlockStore, records: Iterable[Mapping[str, Any]], *,
                    max_span_words: int = MAX_SPAN_WORDS, max_articles: int = MAX_ARTICLES,
                    progress: Optional[Progress] = None) -> SpanRedundancy:
  """Whether each salient span of the records is stated in a block of another article.

  Spans are the (span, sentence) pairs salient-span masking draws (`record_spans`), so the span
  share is the share of REALM's masked queries that some candidate could help. Spans of more than
  `max_span_words` words are not looked for and count as not stated (`long_spans`), as does a span
  with no word left after normalisation (a lone "The"). `records` are of the precomputed-span
  schema (X; with X = Z, the blocks annotated), each validated (salient_spans.RecordError names
  an invalid one); at most `max_articles` other articles are counted per span.
  """
  if max_span_words < 1 or max_articles < 1:
    raise ValueError(f"max_span_words and max_articles must be positive, got {max_span_words} "
                     f"and {max_articles}")
  # [(title, [(words, sentence index)])]: the records' spans, normalised once.
  parsed = []
  for number, record in enumerate(records, start=1):
    record = salient_spans.validate_record(record, record_number=number)
    parsed.append((record["title"], [(span_words(text), index)
                                     for text, index in record_spans(record)]))
  phrases = {words for _, spans in parsed for words, _ in spans
             if 0 < len(words) <= max_span_words}
  # One title more than the cap: the record's own may be among them.
  articles = _PhraseArticles(phrases, max_articles + 1)
  start = time.monotonic()
  for block_id in range(store.num_blocks):
    articles.add_block(store.title(block_id), store.body(block_id))
    if (block_id + 1) % 256 == 0 or block_id + 1 == store.num_blocks:
      _report(progress, "blocks", block_id + 1, store.num_blocks, start)

  spans = stated_spans = long_spans = sentences = stated_sentences = other_articles = 0
  for title, record_pairs in parsed:
    stated_in = {}  # sentence index -> some span of it stated elsewhere
    for words, index in record_pairs:
      others = min(articles.others(words, title), max_articles)
      spans += 1
      long_spans += len(words) > max_span_words
      stated_spans += others > 0
      other_articles += others
      stated_in[index] = stated_in.get(index, False) or others > 0
    sentences += len(stated_in)
    stated_sentences += sum(stated_in.values())
  return SpanRedundancy(spans=spans, stated_spans=stated_spans, long_spans=long_spans,
                        sentences=sentences, stated_sentences=stated_sentences,
                        other_articles=other_articles, max_span_words=max_span_words,
                        max_articles=max_articles)


def warning_line(redundancy: SpanRedundancy, threshold: float = MIN_SPAN_SHARE) -> str:
  """One line saying how often masked spans are stated in another article; "WARNING: ..." when
  that share is below `threshold` (`MIN_SPAN_SHARE`: why 0.3 is said there)."""
  if redundancy.spans == 0:
    return ("WARNING: the records hold no salient span that masking can draw: REALM's "
            "salient-span pretraining has no query on this corpus")
  line = (f"salient spans stated in another article: {redundancy.span_share:.1%} of "
          f"{redundancy.spans:,} masked spans, {redundancy.sentence_share:.1%} of "
          f"{redundancy.sentences:,} sentences with a span; "
          f"{redundancy.mean_other_articles:.2f} other articles per span "
          f"(at most {redundancy.max_articles} counted)")
  if redundancy.span_share < threshold:
    line = (f"WARNING: {line}. Below {threshold:.0%}, most masked spans are stated in no other "
            f"article, so no retrieved block can help predict them and REALM's X = Z "
            f"pretraining has little to learn from on this corpus")
  return line


# ----------------------------------------------------------------------------- retrieval


class Retriever(Protocol):
  """What `retrieved_statement_share` searches with (`realm_jax.index.retrieval.Retriever`)."""

  def retrieve(self, query_ids: np.ndarray, query_mask: np.ndarray, *,
               k: int) -> tuple[np.ndarray, np.ndarray]:
    ...


@dataclasses.dataclass(frozen=True)
class SpanQuery:
  """One masked pretraining query and what it masks.

  Attributes:
    query: the masked query (`masking.make_masked_query`); its `source_uid` is the uid of the
      record's own block in the store (X = Z), 0 when the record is no block of it.
    title: the record's title.
    span: the masked span's text.
    record_index: the record's position among the records (0-based).
  """

  query: masking.MaskedQuery
  title: str
  span: str
  record_index: int


def masked_span_queries(records: Iterable[Mapping[str, Any]], *, num_queries: int,
                        store: Optional[block_store_lib.BlockStore] = None,
                        vocab: Optional[vocab_lib.WordPieceVocabulary] = None
                        ) -> list[SpanQuery]:
  """The first `num_queries` salient-span queries of the records, as REALM pretraining masks:
  record i masked with `np.random.default_rng([i])` at REALM's query length (records that give
  none are passed over). A record that is a block of `store` (equal `content_uid`, as with
  X = Z) gets that block's uid as `source_uid`, the block REALM excludes.
  """
  vocab = vocab or vocab_lib.default_vocabulary()
  block_uids = set(np.asarray(store.uids).tolist()) if store is not None else set()
  queries: list[SpanQuery] = []
  for index, record in enumerate(records):
    if len(queries) == num_queries:
      break
    uid = block_store_lib.content_uid(record["title"], record["text"])
    query = masking.make_masked_query(record, strategy="salient_span",
                                      rng=np.random.default_rng([index]), vocab=vocab,
                                      source_uid=uid if uid in block_uids else 0)
    if query is None:
      continue
    span = record["text"].encode("utf-8")[query.span_byte_start:query.span_byte_limit]
    queries.append(SpanQuery(query=query, title=record["title"], span=span.decode("utf-8"),
                             record_index=index))
  return queries


def rank_blocks(retriever: Retriever, queries: Sequence[SpanQuery], *, num_retrieved: int,
                batch_size: int = QUERY_BATCH_SIZE,
                progress: Optional[Progress] = None) -> np.ndarray:
  """The retriever's top `num_retrieved` blocks for each query.

  Returns:
    int64 [len(queries), num_retrieved] block ids, best first.
  """
  rows = []
  start = time.monotonic()
  for first in range(0, len(queries), batch_size):
    batch = queries[first:first + batch_size]
    query_ids = np.stack([q.query.query_ids for q in batch])  # [B, query_len]
    query_mask = np.stack([q.query.query_mask for q in batch])  # [B, query_len]
    _, block_ids = retriever.retrieve(query_ids, query_mask, k=num_retrieved)  # [B, k]
    rows.append(np.asarray(block_ids, np.int64))
    _report(progress, "queries", first + len(batch), len(queries), start)
  return np.concatenate(rows) if rows else np.zeros([0, num_retrieved], np.int64)


@dataclasses.dataclass(frozen=True)
class RetrievedStatements:
  """How often the retrieved candidates hold another article's block stating the masked span.

  Attributes:
    queries: masked queries counted.
    stated: those whose first `k` blocks other than their own hold a block of another article
      stating the masked span.
    k: candidates looked at per query.
  """

  queries: int
  stated: int
  k: int

  @property
  def share(self) -> float:
    return self.stated / max(self.queries, 1)


def count_retrieved_statements(store: block_store_lib.BlockStore, rankings: np.ndarray,
                               titles: Sequence[str], spans: Sequence[str],
                               source_uids: Sequence[int], *,
                               k: int = NUM_CANDIDATES) -> RetrievedStatements:
  """Counts the queries whose candidates hold a block of another article stating their span.

  The candidates are the first `k` blocks of a query's ranking once its own block (uid equal to
  its source uid; none when that is 0) is taken out, as REALM does: the search's view, one block
  more than the reader's `k - 1` beside the null document. `rankings`: int [num_queries,
  num_retrieved] block ids, best first (k + 1 leave k candidates); `titles`, `spans`,
  `source_uids`: [num_queries] each query's record title, masked span text and own block's uid.
  """
  rankings = np.asarray(rankings, np.int64)  # [num_queries, num_retrieved]
  num_queries = len(titles)
  if rankings.ndim != 2 or rankings.shape[0] != num_queries:
    raise ValueError(f"rankings must be [num_queries, num_retrieved] = [{num_queries}, ...], "
                     f"got {rankings.shape}")
  if len(spans) != num_queries or len(source_uids) != num_queries:
    raise ValueError(f"titles, spans and source_uids must have one entry per query; got "
                     f"{num_queries}, {len(spans)} and {len(source_uids)}")
  block_words: dict[int, tuple[str, ...]] = {}  # block id -> normalised body words
  stated = 0
  for row, title, span, source_uid in zip(rankings.tolist(), titles, spans, source_uids):
    phrase, source_uid = span_words(span), int(source_uid)
    candidates = [b for b in row if source_uid == 0 or int(store.uids[b]) != source_uid][:k]
    for block_id in candidates:
      if store.title(block_id) == title:
        continue
      if block_id not in block_words:
        block_words[block_id] = span_words(store.body(block_id))
      if contains_words(block_words[block_id], phrase):
        stated += 1
        break
  return RetrievedStatements(queries=num_queries, stated=stated, k=k)


def retrieved_statement_share(store: block_store_lib.BlockStore,
                              records: Iterable[Mapping[str, Any]], retriever: Retriever, *,
                              num_queries: int = 1000, k: int = NUM_CANDIDATES,
                              vocab: Optional[vocab_lib.WordPieceVocabulary] = None,
                              progress: Optional[Progress] = None) -> RetrievedStatements:
  """How often a retriever's top k, own block excluded, hold another article stating the span.

  The first `num_queries` `masked_span_queries` are each searched for their top k + 1 blocks
  (k remain once the own block is out) and counted by `count_retrieved_statements`;
  `span_redundancy`'s span share bounds this share from above. `retriever`: anything with
  `retrieve(query_ids, query_mask, *, k) -> (scores, block ids)` over `store` (another BlockStore
  is a ValueError).
  """
  index_store = getattr(retriever, "block_store_id", None)
  if index_store is not None and index_store != store.store_id:
    raise ValueError(f"{store.path}: the retriever's index embeds BlockStore {index_store}, "
                     f"not this one ({store.store_id})")
  queries = masked_span_queries(records, num_queries=num_queries, store=store, vocab=vocab)
  rankings = rank_blocks(retriever, queries, num_retrieved=min(k + 1, store.num_blocks),
                         progress=progress)  # [len(queries), k + 1]
  return count_retrieved_statements(store, rankings, [q.title for q in queries],
                                    [q.span for q in queries],
                                    [int(q.query.source_uid) for q in queries], k=k)
