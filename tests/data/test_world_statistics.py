"""realm_jax.data.world_statistics: whether masked spans are stated in another article, and
whether the retrieved candidates hold one; every expected figure is worked out by hand from the
four articles below."""

import json
import os
import sys

import numpy as np
import pytest

from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import salient_spans
from realm_jax.data import sources as sources_lib
from realm_jax.data import world_statistics as ws

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Four short articles, one block each (far below 288 wordpieces).
ADA = "Ada Lovelace was a mathematician. She worked with Charles Babbage in London."
BABBAGE = "Charles Babbage designed the Analytical Engine. He met ada lovelace in 1833."
ENGINE = "The Analytical Engine was a mechanical computer. Its Londoners admired it."
DIFFERENCE = "The Difference Engine is a calculator. It was built in 1991 from Babbage's plans."
ARTICLES = {"Ada Lovelace": ADA, "Charles Babbage": BABBAGE, "Analytical Engine": ENGINE,
            "Difference Engine": DIFFERENCE}


def record(title, text, sentences, spans):
  """A precomputed-schema record; `spans` are (start, limit, the text they must cover), so a
  wrong hand-written offset fails here rather than changing what is tested."""
  data = text.encode("utf-8")
  for start, limit, expected in spans:
    assert data[start:limit].decode("utf-8") == expected, (title, start, limit, expected)
  return {"title": title, "text": text,
          "sentence_byte_start": [s for s, _ in sentences],
          "sentence_byte_limit": [l for _, l in sentences],
          "span_byte_start": [s for s, _, _ in spans], "span_byte_limit": [l for _, l, _ in spans]}


# X = Z: each record is one article's block, its spans at byte offsets counted by hand.
RECORDS = [
    # Sentences 0..33 and 34..76.
    record("Ada Lovelace", ADA, [(0, 33), (34, 76)],
           [(0, 12, "Ada Lovelace"),  # "ada lovelace" in Babbage's article (case differs): 1
            (50, 65, "Charles Babbage"),  # Babbage's article: 1
            (69, 75, "London")]),  # only its own article; Engine's "Londoners" is no match: 0
    # Sentences 0..47 and 48..76.
    record("Charles Babbage", BABBAGE, [(0, 47), (48, 76)],
           [(29, 46, "Analytical Engine"),  # Engine's article: 1
            (71, 75, "1833")]),  # only its own article: 0
    # Sentences 0..38 and 39..81.
    record("Difference Engine", DIFFERENCE, [(0, 38), (39, 81)],
           [(4, 21, "Difference Engine"),  # only its own article: 0
            (55, 59, "1991"),  # only its own article: 0
            (65, 72, "Babbage")]),  # Ada's and Babbage's articles: 2
]
# Spans: 3 + 2 + 3 = 8, of which 4 are stated elsewhere; other articles 1+1+0+1+0+0+0+2 = 5.
# Sentences with a span: 6; stated: Ada's both, Babbage's first, Difference's second = 4.


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("world")
  path = tmp / "corpus.jsonl"
  with open(path, "w", encoding="utf-8") as f:
    for title, text in ARTICLES.items():
      f.write(json.dumps({"title": title, "text": text}) + "\n")
  corpus_build.build_block_store(sources_lib.JsonlSource(str(path)), str(tmp / "store"))
  opened = block_store_lib.BlockStore.open(str(tmp / "store"))
  assert opened.num_blocks == 4  # one block per article, as the hand counts assume
  return opened


@pytest.fixture(scope="module")
def block_of(store):
  """{title: block id}."""
  return {store.title(i): i for i in range(store.num_blocks)}


def test_span_words_normalise_case_punctuation_articles_and_possessives():
  assert ws.span_words("The  Analytical\nENGINE.") == ("analytical", "engine")
  assert ws.span_words("Babbage's plans") == ("babbage", "s", "plans")
  assert ws.span_words("Babbage\u2019s") == ("babbage", "\u2019s")
  assert ws.contains_words(("met", "ada", "lovelace", "in"), ("ada", "lovelace"))
  assert not ws.contains_words(("its", "londoners", "admired"), ("london",))
  assert not ws.contains_words(("ada",), ("ada", "lovelace"))
  assert not ws.contains_words(("ada",), ())


def test_span_redundancy_by_hand(store):
  result = ws.span_redundancy(store, RECORDS)
  assert (result.spans, result.stated_spans, result.long_spans) == (8, 4, 0)
  assert (result.sentences, result.stated_sentences) == (6, 4)
  assert result.other_articles == 5
  assert result.span_share == pytest.approx(0.5)
  assert result.sentence_share == pytest.approx(4 / 6)
  assert result.mean_other_articles == pytest.approx(5 / 8)


def test_span_redundancy_caps_articles_and_skips_long_spans(store):
  # One article counted at most: "Babbage" counts 1 instead of 2.
  capped = ws.span_redundancy(store, RECORDS, max_articles=1)
  assert (capped.stated_spans, capped.other_articles) == (4, 4)
  # One word at most: the two-word spans ("Ada Lovelace", "Charles Babbage", "Analytical
  # Engine", "Difference Engine") are not looked for; "Babbage" is the one stated span left.
  short = ws.span_redundancy(store, RECORDS, max_span_words=1)
  assert (short.spans, short.long_spans, short.stated_spans, short.other_articles) == (8, 4, 1, 2)
  # Sentences: only Difference's second ("Babbage") is stated.
  assert (short.sentences, short.stated_sentences) == (6, 1)


def test_span_redundancy_counts_only_spans_masking_draws(store):
  # A span repeated at the same offsets counts once; one crossing the sentence boundary (bytes
  # 29..40 of Ada's record: "mathematician. She") is dropped, as masking drops it.
  rec = record("Ada Lovelace", ADA, [(0, 33), (34, 76)],
               [(0, 12, "Ada Lovelace"), (0, 12, "Ada Lovelace"),
                (19, 37, "mathematician. She")])
  result = ws.span_redundancy(store, [rec])
  assert (result.spans, result.stated_spans, result.sentences) == (1, 1, 1)


def test_span_redundancy_names_a_bad_record(store):
  bad = dict(RECORDS[0], span_byte_limit=[12, 65, 999])
  with pytest.raises(salient_spans.RecordError, match=r"record 2: field 'span_byte_limit'"):
    ws.span_redundancy(store, [RECORDS[1], bad])


def test_warning_fires_below_the_threshold_only():
  def redundancy(stated):
    return ws.SpanRedundancy(spans=100, stated_spans=stated, long_spans=0, sentences=50,
                             stated_sentences=20, other_articles=stated, max_span_words=8,
                             max_articles=4)

  assert ws.MIN_SPAN_SHARE == 0.3
  below = ws.warning_line(redundancy(29))
  assert below.startswith("WARNING: ") and "29.0% of 100 masked spans" in below
  above = ws.warning_line(redundancy(31))
  assert "WARNING" not in above and "31.0% of 100 masked spans" in above
  assert "40.0% of 50 sentences" in above
  assert "WARNING" not in ws.warning_line(redundancy(29), threshold=0.2)
  empty = ws.SpanRedundancy(0, 0, 0, 0, 0, 0, 8, 4)
  assert ws.warning_line(empty).startswith("WARNING: ") and "no salient span" in ws.warning_line(
      empty)


def test_salient_share_by_hand():
  # "Zoe Tessavar was born in 1843." -> zoe tessa ##var was born in 1843 . (8 wordpieces);
  # spans "Tessavar" (2) and "1843" (1). "It rained." -> it rained . (3), no span.
  zoe = record("Zoe", "Zoe Tessavar was born in 1843.", [(0, 30)],
               [(4, 12, "Tessavar"), (25, 29, "1843")])
  rain = record("Rain", "It rained.", [(0, 10)], [])
  share = ws.salient_share([zoe, rain])
  assert (share.wordpieces, share.salient_wordpieces) == (11, 3)
  assert (share.sentences, share.salient_sentences) == (2, 1)


def test_count_retrieved_statements_excludes_the_own_block(store, block_of):
  a, b, c, d = (block_of[t] for t in ARTICLES)
  uid = {i: int(store.uids[i]) for i in (a, b, c, d)}
  rankings = [
      [a, c, d, b],  # own block a out: k=2 reads c, d (neither states "Charles Babbage")
      [a, b, c, d],  # own block a out: k=1 reads b, which states "ada lovelace"
      [b, a, c, d],  # nobody else states "1833"
      [a, c, b, d],  # no own block (X is not Z): a is the same article, c says "Londoners"
  ]
  titles = ["Ada Lovelace", "Ada Lovelace", "Charles Babbage", "Ada Lovelace"]
  spans = ["Charles Babbage", "Ada Lovelace", "1833", "London"]
  sources = [uid[a], uid[a], uid[b], 0]
  k1 = ws.count_retrieved_statements(store, rankings, titles, spans, sources, k=1)
  assert (k1.queries, k1.stated, k1.k) == (4, 1, 1)  # the second query only
  k2 = ws.count_retrieved_statements(store, rankings, titles, spans, sources, k=2)
  assert k2.stated == 1  # the first query's c, d state nothing
  k3 = ws.count_retrieved_statements(store, rankings, titles, spans, sources, k=3)
  assert k3.stated == 2 and k3.share == pytest.approx(0.5)  # the first query reaches b
  # Without the own block taken out, the second query's k=1 reads a: its own article.
  kept = ws.count_retrieved_statements(store, rankings, titles, spans, [0, 0, 0, 0], k=1)
  assert kept.stated == 0
  with pytest.raises(ValueError, match="rankings must be"):
    ws.count_retrieved_statements(store, rankings[:2], titles, spans, sources)


class FixedRetriever:
  """Ranks every block in one fixed order, whatever the query."""

  def __init__(self, order, block_store_id):
    self.order, self.block_store_id, self.ks = order, block_store_id, []

  def retrieve(self, query_ids, query_mask, *, k):
    self.ks.append(k)
    ids = np.tile(np.asarray(self.order[:k], np.int32), (len(query_ids), 1))  # [B, k]
    return np.zeros(ids.shape, np.float32), ids


def test_retrieved_statement_share_with_a_fixed_ranking(store, block_of):
  a, b, c, d = (block_of[t] for t in ARTICLES)
  # One span per record, so the masked span is known: Ada's "Ada Lovelace", Engine's
  # "Analytical Engine" (bytes 4..21), both records X = Z (their block is their own).
  ada = record("Ada Lovelace", ADA, [(0, 33), (34, 76)], [(0, 12, "Ada Lovelace")])
  engine = record("Analytical Engine", ENGINE, [(0, 48), (49, 74)],
                  [(4, 21, "Analytical Engine")])
  queries = ws.masked_span_queries([ada, engine], num_queries=10, store=store)
  assert [q.span for q in queries] == ["Ada Lovelace", "Analytical Engine"]
  assert [int(q.query.source_uid) for q in queries] == [int(store.uids[a]), int(store.uids[c])]
  retriever = FixedRetriever([a, b, c, d], store.store_id)
  # k=1: Ada's own block out, b states "ada lovelace"; Engine's a does not state its span.
  one = ws.retrieved_statement_share(store, [ada, engine], retriever, k=1)
  assert (one.queries, one.stated) == (2, 1) and retriever.ks == [2]
  # k=2: Engine's candidates a, b; b states "Analytical Engine".
  assert ws.retrieved_statement_share(store, [ada, engine], retriever, k=2).stated == 2
  with pytest.raises(ValueError, match="embeds BlockStore other"):
    ws.retrieved_statement_share(store, [ada], FixedRetriever([a], "other"), k=1)


def test_masked_span_queries_give_no_source_outside_the_store(store):
  x = record("Ada Lovelace", "Ada Lovelace wrote notes.", [(0, 25)], [(0, 12, "Ada Lovelace")])
  (query,) = ws.masked_span_queries([x], num_queries=5, store=store)
  assert int(query.query.source_uid) == 0 and query.record_index == 0


def test_annotate_blocks_gives_every_block_with_its_uid(store):
  records = list(salient_spans.annotate_blocks(store, "capitalized", batch_size=2))
  assert [r["title"] for r in records] == [store.title(i) for i in range(store.num_blocks)]
  assert [r["text"] for r in records] == [store.body(i) for i in range(store.num_blocks)]
  assert [r["source_uid"] for r in records] == [int(u) for u in store.uids]
  # The uid survives validation (read_precomputed): REALM excludes that block.
  assert salient_spans.validate_record(records[0])["source_uid"] == int(store.uids[0])


def test_bench_prints_the_hand_counted_figures(store, tmp_path, capsys):
  sys.path.insert(0, REPO_ROOT)
  from bench import world_statistics as bench  # pylint: disable=import-outside-toplevel
  path = str(tmp_path / "x.jsonl")
  salient_spans.write_precomputed(path, RECORDS)
  assert bench.main(["--store", store.path, "--records", path, "--json"]) == 0
  figures = json.loads(capsys.readouterr().out)
  assert figures["redundancy"]["spans"] == 8
  assert figures["redundancy"]["span_share"] == pytest.approx(0.5)
  assert figures["redundancy"]["sentence_share"] == pytest.approx(4 / 6)
  assert figures["redundancy"]["mean_other_articles"] == pytest.approx(5 / 8)
  assert bench.main(["--store", store.path, "--records", path]) == 0
  text = capsys.readouterr().out
  assert "| masked spans stated in another article's block | 50.0% of 8 |" in text
  assert "salient spans stated in another article: 50.0%" in text
