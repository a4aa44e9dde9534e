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
`--write` puts the table into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import report  # noqa: E402  pylint: disable=wrong-import-position
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


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
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
  text = table(rows)
  print(text)
  if args.write:
    report.write_section(
        "Names and dates in the pretraining text (toy world and real English)",
        f"`python bench/text_statistics.py --write` (Python {sys.version.split()[0]}'s "
        "documentation). Wordpieces are BERT uncased; a wordpiece is salient when it lies "
        "inside a salient span. Random-token masking hits a name or date wordpiece at the "
        "rate of the third column; salient-span masking draws its queries from the sentences "
        "of the last. The first toy world (generator v1, every sentence a bare fact about "
        "several entities) measured 62.5% and 100%: random-token masks hit names and dates as "
        "often as salient-span masks did.\n\n" + text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
