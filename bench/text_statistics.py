r"""How much of the pretraining text is names and dates: the toy world's X beside real English.

  python bench/text_statistics.py [--write] [--python_docs DIR]

REALM masks salient spans because in real text most wordpieces are function words and word
pieces that the sentence around them recovers, while names and dates need knowledge. Whether a
comparison of masking strategies on the toy world means anything depends on the toy text having
that property. This bench counts, with BERT's uncased wordpieces:

  * the toy world's pretraining text X (`realm_jax.data.toy_world`, default seed), its salient
    spans as the generator marks them;
  * real English that the project produces offline: the Python documentation corpus
    (`realm_jax.data.python_docs`: standard-library docstrings and the language reference's
    topics), its salient spans found as a user's corpus would be, with the "union" of the date
    patterns and spaCy's entities (`realm_jax.data.salient_spans`; the `entities` extra).

For each: the share of wordpieces inside a salient span (what random-token masking hits), and
the share of sentences holding at least one (what salient-span masking can draw from).

A second table says what each masking strategy of the pretraining tasks
(`realm_jax.data.masking`) masks on the toy world's X, one query per record as the tasks draw
them: masked wordpieces per query, the share of them inside a salient span, the share of queries
with at least one such mask (the queries where retrieving Z can tell the answer), and the share
of masked salient wordpieces whose span keeps another wordpiece unmasked (a name partly visible).
`--write` puts the tables into bench/docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import report  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.data import masking  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.data import python_docs  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.data import salient_spans  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.data import toy_world  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.data import vocab as vocab_lib  # noqa: E402  pylint: disable=wrong-import-position


def toy_share() -> salient_spans.SalientShare:
  """The default toy world's X, with the spans it was generated with."""
  vocab = vocab_lib.default_vocabulary()
  records = toy_world.read_jsonl(os.path.join(toy_world.toy_world_dir(), toy_world.PRETRAIN_FILE))
  share = salient_spans.SalientShare()
  for record in records:
    share.add(record, vocab.tokenize_with_offsets)
  return share


def python_docs_shares(directory: str) -> dict[str, salient_spans.SalientShare]:
  """The Python documentation corpus in `directory` (written by `python_docs.generate`),
  annotated with dates and spaCy entities: {"reference topics", "docstrings", "all"}."""
  vocab = vocab_lib.default_vocabulary()
  annotator = salient_spans.get_annotator("union", annotators=("dates", "entities"))
  with open(os.path.join(directory, "docs.jsonl"), encoding="utf-8") as f:
    documents = [json.loads(line) for line in f]
  shares = {"reference topics": salient_spans.SalientShare(),
            "docstrings": salient_spans.SalientShare(), "all": salient_spans.SalientShare()}
  for document in documents:
    record = salient_spans.annotate_record(document["title"], document["text"], annotator)
    part = "reference topics" if document["id"].startswith("topic:") else "docstrings"
    for key in (part, "all"):
      shares[key].add(record, vocab.tokenize_with_offsets)
  return shares


def table(rows: dict[str, salient_spans.SalientShare]) -> str:
  lines = ["| text | wordpieces | in salient spans | sentences | with a salient span |",
           "|---|---|---|---|---|"]
  for name, share in rows.items():
    lines.append(f"| {name} | {share.wordpieces:,} | {share.wordpiece_fraction:.1%} | "
                 f"{share.sentences:,} | {share.sentence_fraction:.1%} |")
  return "\n".join(lines)


# The strategies of the second table: the tasks' four, and the one-span random span of
# wordpieces the ablation rows used before random spans followed SpanBERT.
STRATEGIES = {
    "salient span (REALM)": "salient_span",
    "random span (SpanBERT: whole words, 15%)": "random_span",
    "random span (one run of 1-5 wordpieces)": masking.RandomSpanMasker(
        [0.2] * 5, unit="wordpiece", mask_budget=None),
    "random uniform (15% of wordpieces)": "random_token",
    "random uniform, every query masking a name or date": "random_token_knowledge",
}


@dataclasses.dataclass
class MaskHits:
  """What one masking strategy masks (counts over queries)."""
  queries: int = 0
  masks: int = 0
  salient_masks: int = 0
  queries_with_salient_mask: int = 0
  partly_visible: int = 0  # salient masks whose span keeps another wordpiece unmasked

  def add(self, record: dict, query: masking.MaskedQuery, wordpiece_offsets) -> None:
    """Counts one query of `record`; `wordpiece_offsets(text)` as in `SalientShare.add`."""
    data = record["text"].encode("utf-8")
    sentence_start = record["sentence_byte_start"][query.sentence_index]
    sentence_limit = record["sentence_byte_limit"][query.sentence_index]
    _, starts, limits = wordpiece_offsets(data[sentence_start:sentence_limit].decode("utf-8"))
    # [num_masks] sentence wordpiece indices of the masks with targets
    masked = (query.mlm_positions[query.mlm_weights > 0] - 1).tolist()
    spans = list(zip(record["span_byte_start"], record["span_byte_limit"]))

    def span_of(i: int):
      a, b = sentence_start + starts[i], sentence_start + limits[i]
      return next(((s, l) for s, l in spans if s <= a and b <= l), None)

    hit = False
    for i in masked:
      self.masks += 1
      span = span_of(i)
      if span is None:
        continue
      self.salient_masks += 1
      hit = True
      self.partly_visible += any(span_of(j) == span for j in range(len(starts))
                                 if j not in masked)
    self.queries += 1
    self.queries_with_salient_mask += hit


def mask_hits(records, strategies=None, vocab=None) -> dict[str, MaskHits]:
  """{strategy name: MaskHits} over `records`, one query per record (rng seeded by its index,
  as `np.random.default_rng([index])`); records a strategy skips are not counted."""
  vocab = vocab or vocab_lib.default_vocabulary()
  out = {}
  for name, strategy in (strategies or STRATEGIES).items():
    hits = out[name] = MaskHits()
    for index, record in enumerate(records):
      query = masking.make_masked_query(record, strategy=strategy,
                                        rng=np.random.default_rng([index]), vocab=vocab)
      if query is not None:
        hits.add(record, query, vocab.tokenize_with_offsets)
  return out


def hits_table(rows: dict[str, MaskHits]) -> str:
  lines = ["| masking | queries | masks per query | masks in salient spans | queries with a "
           "salient mask | salient masks with their span partly visible |",
           "|---|---|---|---|---|---|"]
  for name, h in rows.items():
    lines.append(f"| {name} | {h.queries:,} | {h.masks / max(h.queries, 1):.2f} | "
                 f"{h.salient_masks / max(h.masks, 1):.1%} | "
                 f"{h.queries_with_salient_mask / max(h.queries, 1):.1%} | "
                 f"{h.partly_visible / max(h.salient_masks, 1):.1%} |")
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--write", action="store_true", help="write bench/docs/benchmarks.md")
  parser.add_argument("--python_docs", default=None,
                      help="an existing `python -m realm_jax.data.python_docs` output (default: "
                           "generate one in a temporary directory)")
  args = parser.parse_args()
  rows = {f"toy world v{toy_world.GENERATOR_VERSION}, pretraining text X": toy_share()}
  with tempfile.TemporaryDirectory() as tmp:
    directory = args.python_docs or os.path.join(tmp, "python_docs")
    if args.python_docs is None:
      python_docs.generate(directory)
    for part, share in python_docs_shares(directory).items():
      rows[f"Python documentation, {part} (dates + spaCy entities)"] = share
  records = toy_world.read_jsonl(os.path.join(toy_world.toy_world_dir(),
                                              toy_world.PRETRAIN_FILE))
  text = table(rows)
  hits = hits_table(mask_hits(records))
  print(text + "\n\n" + hits)
  if args.write:
    report.write_section(
        "Names and dates in the pretraining text (toy world and real English)",
        f"`python bench/text_statistics.py --write` (Python {sys.version.split()[0]}'s "
        "documentation). Wordpieces are BERT uncased; a wordpiece is salient when it lies "
        "inside a salient span. Random-token masking hits a name or date wordpiece at the "
        "rate of the third column; salient-span masking draws its queries from the sentences "
        "of the last. The first toy world (generator v1, every sentence a bare fact about "
        "several entities) measured 62.5% and 100%: random-token masks hit names and dates as "
        "often as salient-span masks did.\n\n" + text + "\n\nWhat each masking strategy of "
        "the pretraining tasks masks on the toy world's X (one query per record, as the tasks "
        "draw them; masks with a target):\n\n" + hits)
  return 0


if __name__ == "__main__":
  sys.exit(main())
