"""Document sources of the corpus build, and writers of REALM/ORQA records.

Every source streams `Document`s; bad input becomes a `BadRecord` naming the file, line/record
and field, which the build raises (`on_error="raise"`) or counts ("skip"). `JsonlSource`: one
`{"title", "text"}` object per line (optional "id"); `TfdsSource`: a TFDS builder with `title`
and `text` features (e.g. `wikipedia/20230601.en`); `RealmSource`: the REALM release's retrieval
corpus (GZIP TFRecords of `tf.train.Example`s, `language/realm/generate_retrieval_corpus.py`) or
ORQA's block files (`blocks.tfr`, `titles.tfr`, optional `examples.tfr`; the released
`gs://orqa-data/enwiki-20181220`). Those records are already blocks: each becomes exactly one
block, in record order, re-tokenised with our vocabulary (the body text needs byte offsets).
"""

from __future__ import annotations

import dataclasses
import glob as glob_lib
import json
import os
import zlib
from typing import Iterable, Iterator, Optional, Sequence, Union

from realm_jax.data import sentences as sentences_lib
from realm_jax.data import tensorflow_setup
from realm_jax.data import vocab as vocab_lib

# Malformed input: raised or skipped per the build's `on_error` (the build's own skips, of
# data that is well formed, are `corpus_build.DATA_SKIP_REASONS`).
BAD_INPUT_REASONS = ("invalid_utf8", "malformed_json", "missing_field", "wrong_type",
                     "malformed_record", "token_mismatch")


class CorpusInputError(ValueError):
  """Bad input documents (raised in `on_error="raise"` mode); the message names where.

  Attributes:
    record: the BadRecord when the error is one skippable record (else None).
  """

  def __init__(self, message: str, record: Optional["BadRecord"] = None):
    super().__init__(message)
    self.record = record


@dataclasses.dataclass(frozen=True, eq=False)
class Document:
  """One input document (an article), or one already-made block for REALM records.

  Attributes:
    title: article title.
    text: article text (for a block record: the block body).
    source: where it came from, for messages: "file:line", "tfds:split:index",
      "tfrecord:file:record".
    is_block: True for records that are already blocks (REALM/ORQA): one record -> one block.
    title_token_ids: token ids the record carried for the title, if any.
    body_token_ids: token ids the record carried for the body, if any.
    key: the document's own id in the input (JSONL's "id"), kept in the BlockStore.
  """

  title: str
  text: str
  source: str
  is_block: bool = False
  title_token_ids: Optional[Sequence[int]] = None
  body_token_ids: Optional[Sequence[int]] = None
  key: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class BadRecord:
  """An input record that could not become a Document.

  Attributes:
    source: "file:line" / "tfds:split:index" / "tfrecord:file:record".
    reason: one of BAD_INPUT_REASONS.
    field: the offending field, if one.
    message: a complete one-line message naming source and field.
  """

  source: str
  reason: str
  field: Optional[str]
  message: str


SourceItem = Union[Document, BadRecord]


def _check_str_field(obj: dict, field_name: str, where: str) -> Union[str, BadRecord]:
  """A JSON object's string field, or the BadRecord saying what is wrong with it."""
  if field_name not in obj:
    return BadRecord(where, "missing_field", field_name,
                     f"{where}: missing field {field_name!r} (expected an object with string "
                     f"fields 'title' and 'text'; got keys {sorted(obj)[:8]})")
  value = obj[field_name]
  if not isinstance(value, str):
    return BadRecord(where, "wrong_type", field_name,
                     f"{where}: field {field_name!r} must be a string, got "
                     f"{type(value).__name__}")
  try:
    value.encode("utf-8")
  except UnicodeEncodeError as e:  # JSON "\ud800" escapes decode to lone surrogates
    return BadRecord(where, "invalid_utf8", field_name,
                     f"{where}: field {field_name!r} is not valid Unicode ({e.reason} at "
                     f"character {e.start})")
  return value


class JsonlSource:
  """Documents from a JSONL file of `{"title": str, "text": str}` objects, one per line.

  Lines are read as bytes and decoded one by one, so invalid UTF-8 is reported with its line.
  Blank lines are ignored. Extra fields are ignored.
  """

  kind = "jsonl"

  def __init__(self, path: str):
    self.path = os.fspath(path)
    if not os.path.isfile(self.path):
      raise CorpusInputError(f"{self.path}: no such JSONL file")
    self.total_bytes = os.path.getsize(self.path)
    self.bytes_read = 0

  @property
  def description(self) -> dict:
    return {"kind": self.kind, "path": os.path.abspath(self.path), "bytes": self.total_bytes}

  def fraction_done(self) -> Optional[float]:
    return self.bytes_read / self.total_bytes if self.total_bytes else None

  def __iter__(self) -> Iterator[SourceItem]:
    self.bytes_read = 0
    with open(self.path, "rb") as f:
      for line_number, raw in enumerate(f, start=1):
        self.bytes_read += len(raw)
        where = f"{self.path}:{line_number}"
        try:
          line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
          yield BadRecord(where, "invalid_utf8", None,
                          f"{where}: line is not valid UTF-8 ({e.reason} at byte {e.start} of "
                          f"the line: {raw[max(0, e.start - 10):e.start + 10]!r})")
          continue
        if not line.strip():
          continue
        try:
          obj = json.loads(line)
        except json.JSONDecodeError as e:
          yield BadRecord(where, "malformed_json", None,
                          f"{where}: malformed JSON ({e.msg} at column {e.colno})")
          continue
        if not isinstance(obj, dict):
          yield BadRecord(where, "malformed_json", None,
                          f"{where}: expected a JSON object with 'title' and 'text', got "
                          f"{type(obj).__name__}")
          continue
        title = _check_str_field(obj, "title", where)
        if isinstance(title, BadRecord):
          yield title
          continue
        text = _check_str_field(obj, "text", where)
        if isinstance(text, BadRecord):
          yield text
          continue
        key = obj.get("id")
        if key is not None and (not isinstance(key, (str, int)) or isinstance(key, bool)):
          yield BadRecord(where, "wrong_type", "id",
                          f"{where}: field 'id' must be a string or an integer, got "
                          f"{type(key).__name__}")
          continue
        yield Document(title=title, text=text, source=where,
                       key=None if key is None else str(key))


class TfdsSource:
  """Documents from a TFDS dataset with string features `title` and `text`.

  The dataset must already be prepared under `data_dir` (e.g. `wikipedia/20230601.en`); nothing
  is downloaded. Records are read in the split's file order (`shuffle_files=False`), so block
  ids are deterministic.
  """

  kind = "tfds"

  def __init__(self, name: str, split: str = "train", data_dir: Optional[str] = None):
    self.name = name
    self.split = split
    self.data_dir = data_dir
    self.index = 0
    self.num_examples: Optional[int] = None

  @property
  def description(self) -> dict:
    return {"kind": self.kind, "name": self.name, "split": self.split, "data_dir": self.data_dir,
            "num_examples": self.num_examples}

  def fraction_done(self) -> Optional[float]:
    return self.index / self.num_examples if self.num_examples else None

  def __iter__(self) -> Iterator[SourceItem]:
    import tensorflow_datasets as tfds  # lazily: TF is heavy and only this source needs it

    try:
      builder = tfds.builder(self.name, data_dir=self.data_dir)
    except Exception as e:  # unknown name or config: say so in one line
      raise CorpusInputError(f"tfds:{self.name}: {str(e).strip().splitlines()[0]}") from e
    missing = [k for k in ("title", "text") if k not in builder.info.features]
    if missing:
      raise CorpusInputError(
          f"tfds:{self.name}: the dataset has no feature(s) {missing} (features: "
          f"{sorted(builder.info.features)}); a knowledge corpus needs 'title' and 'text'")
    try:
      self.num_examples = int(builder.info.splits[self.split].num_examples) or None
    except Exception:  # splits unknown (not prepared, or mocked): no ETA, not an error
      self.num_examples = None
    try:
      dataset = builder.as_dataset(split=self.split, shuffle_files=False)
    except Exception as e:  # not prepared under data_dir, or an unknown split
      raise CorpusInputError(
          f"tfds:{self.name}:{self.split}: {str(e).strip().splitlines()[0]} (prepare the "
          f"dataset under --tfds_data_dir first; this build downloads nothing)") from e
    self.index = 0
    for example in tensorflow_setup.numpy_iterator(dataset):
      where = f"tfds:{self.split}:{self.index}"
      self.index += 1
      fields = {}
      for key in ("title", "text"):
        try:
          fields[key] = example[key].decode("utf-8")
        except UnicodeDecodeError as e:
          fields = None
          yield BadRecord(where, "invalid_utf8", key,
                          f"{where}: field {key!r} is not valid UTF-8 ({e.reason} at byte "
                          f"{e.start})")
          break
      if fields is not None:
        yield Document(title=fields["title"], text=fields["text"], source=where)


def _tfrecord_compression(path: str) -> str:
  """"GZIP" when the file starts with the gzip magic bytes (REALM's shards have no .gz)."""
  with open(path, "rb") as f:
    return "GZIP" if f.read(2) == b"\x1f\x8b" else ""


def _gzip_complete(path: str, chunk_bytes: int = 1 << 20) -> bool:
  """Whether the last GZIP member of `path` reaches its end marker (decompressed chunk by chunk
  and discarded; members may be concatenated)."""
  stream, ended = zlib.decompressobj(16 + zlib.MAX_WBITS), False
  with open(path, "rb") as f:
    while chunk := f.read(chunk_bytes):
      while chunk:
        if ended:  # another member starts
          stream, ended = zlib.decompressobj(16 + zlib.MAX_WBITS), False
        stream.decompress(chunk)  # consumes all of `chunk`, or up to its member's end
        ended = stream.eof
        chunk = stream.unused_data if ended else b""
  return ended


def _iter_tfrecords(path: str) -> Iterator[tuple[int, bytes]]:
  """(0-based record index, serialized record) of one TFRecord file, via tf.data."""
  import tensorflow as tf  # lazily

  compression = _tfrecord_compression(path)
  dataset = tf.data.TFRecordDataset(path, compression_type=compression, buffer_size=8 << 20)
  iterator = tensorflow_setup.numpy_iterator(dataset)
  index = 0
  while True:
    try:
      raw = next(iterator)
    except StopIteration:
      if compression == "GZIP" and not _gzip_complete(path):
        # tf.data ends a cut GZIP stream as if it were the file's end: never a shorter shard.
        raise CorpusInputError(f"tfrecord:{path}:{index}: corrupt TFRecord data (the GZIP "
                               f"stream ends before its end marker: a truncated file)") from None
      return
    except tf.errors.DataLossError as e:
      # A corrupt stream cannot be resynchronised: never skippable.
      raise CorpusInputError(f"tfrecord:{path}:{index}: corrupt TFRecord data "
                             f"({str(e).splitlines()[0]})") from None
    yield index, raw
    index += 1


class RealmSource:
  """Already-blocked records from the REALM/ORQA releases: each record is one block.

  `path` is one of:
    * a TFRecord file or a glob of shards (sorted), each record a `tf.train.Example` with bytes
      features `title`, `body` and optional int64 `title_token_ids`, `body_token_ids` (the schema
      of `language/realm/generate_retrieval_corpus.py`; GZIP auto-detected);
    * a directory with ORQA's `blocks.tfr` and `titles.tfr` (raw UTF-8 strings, record i of each
      is block i) and optionally `examples.tfr` (Examples with `title_ids`, `token_ids`).
  """

  kind = "realm"

  def __init__(self, path: str):
    self.path = os.fspath(path)
    self.orqa = os.path.isdir(self.path)
    if self.orqa:
      for name in ("blocks.tfr", "titles.tfr"):
        if not os.path.isfile(os.path.join(self.path, name)):
          raise CorpusInputError(f"{self.path}: a REALM/ORQA block directory needs {name}")
      self.files = [os.path.join(self.path, "blocks.tfr")]
    else:
      self.files = sorted(glob_lib.glob(self.path))
      if not self.files:
        raise CorpusInputError(f"{self.path}: no TFRecord files match")
    self.total_bytes = sum(os.path.getsize(f) for f in self.files)
    self.bytes_done = 0

  @property
  def description(self) -> dict:
    return {"kind": self.kind, "path": os.path.abspath(self.path),
            "layout": "orqa" if self.orqa else "realm_examples", "files": len(self.files),
            "bytes": self.total_bytes}

  def fraction_done(self) -> Optional[float]:
    # Compressed streams give no position; count whole files done (coarse but monotone).
    return self.bytes_done / self.total_bytes if self.total_bytes else None

  def __iter__(self) -> Iterator[SourceItem]:
    self.bytes_done = 0
    if self.orqa:
      yield from self._iter_orqa()
      return
    for path in self.files:
      for index, raw in _iter_tfrecords(path):
        yield _parse_realm_example(raw, f"tfrecord:{path}:{index}")
      self.bytes_done += os.path.getsize(path)

  def _iter_orqa(self) -> Iterator[SourceItem]:
    blocks_path = os.path.join(self.path, "blocks.tfr")
    titles_path = os.path.join(self.path, "titles.tfr")
    examples_path = os.path.join(self.path, "examples.tfr")
    has_examples = os.path.isfile(examples_path)
    blocks = _iter_tfrecords(blocks_path)
    titles = _iter_tfrecords(titles_path)
    examples = _iter_tfrecords(examples_path) if has_examples else None
    while True:
      block = next(blocks, None)
      title = next(titles, None)
      example = next(examples, None) if examples is not None else None
      if block is None or title is None or (examples is not None and example is None):
        if not (block is None and title is None and example is None):
          raise CorpusInputError(
              f"{self.path}: blocks.tfr, titles.tfr{' and examples.tfr' if has_examples else ''}"
              f" have different numbers of records")
        break
      index = block[0]
      where = f"tfrecord:{blocks_path}:{index}"
      try:
        title_text = title[1].decode("utf-8")
        body_text = block[1].decode("utf-8")
      except UnicodeDecodeError as e:
        yield BadRecord(where, "invalid_utf8", "title/block",
                        f"{where}: record is not valid UTF-8 ({e.reason} at byte {e.start})")
        continue
      title_ids = body_ids = None
      if example is not None:
        parsed = _parse_example_ints(example[1], ("title_ids", "token_ids"),
                                     f"tfrecord:{examples_path}:{index}")
        if isinstance(parsed, BadRecord):
          yield parsed
          continue
        title_ids, body_ids = parsed["title_ids"], parsed["token_ids"]
      yield Document(title=title_text, text=body_text, source=where, is_block=True,
                     title_token_ids=title_ids, body_token_ids=body_ids)
    self.bytes_done = self.total_bytes


def _parse_example(raw: bytes, where: str):
  from tensorflow.core.example import example_pb2  # lazily
  from google.protobuf import message as protobuf_message

  try:
    return example_pb2.Example.FromString(raw)
  except protobuf_message.DecodeError as e:
    return BadRecord(where, "malformed_record", None,
                     f"{where}: not a serialized tf.train.Example ({e})")


def _parse_example_ints(raw: bytes, names: Sequence[str], where: str):
  """Optional int64 features of an Example as lists (None when absent), or a BadRecord."""
  example = _parse_example(raw, where)
  if isinstance(example, BadRecord):
    return example
  out = {}
  for name in names:
    feature = example.features.feature.get(name)
    if feature is None:
      out[name] = None
    elif feature.WhichOneof("kind") != "int64_list":
      return BadRecord(where, "wrong_type", name,
                       f"{where}: feature {name!r} must be an int64_list, got "
                       f"{feature.WhichOneof('kind')}")
    else:
      out[name] = list(feature.int64_list.value)
  return out


def _parse_realm_example(raw: bytes, where: str) -> SourceItem:
  """One REALM retrieval-corpus Example -> a block Document, or a BadRecord."""
  example = _parse_example(raw, where)
  if isinstance(example, BadRecord):
    return example
  features = example.features.feature
  texts = {}
  for name in ("title", "body"):
    feature = features.get(name)
    if feature is None:
      return BadRecord(where, "missing_field", name,
                       f"{where}: missing feature {name!r} (a REALM corpus record has bytes "
                       f"features 'title' and 'body'; got {sorted(features)[:8]})")
    if feature.WhichOneof("kind") != "bytes_list" or len(feature.bytes_list.value) != 1:
      return BadRecord(where, "wrong_type", name,
                       f"{where}: feature {name!r} must be a bytes_list with one value")
    try:
      texts[name] = feature.bytes_list.value[0].decode("utf-8")
    except UnicodeDecodeError as e:
      return BadRecord(where, "invalid_utf8", name,
                       f"{where}: feature {name!r} is not valid UTF-8 ({e.reason} at byte "
                       f"{e.start})")
  ids = {}
  for name in ("title_token_ids", "body_token_ids"):
    feature = features.get(name)
    if feature is None:
      ids[name] = None
    elif feature.WhichOneof("kind") != "int64_list":
      return BadRecord(where, "wrong_type", name, f"{where}: feature {name!r} must be an "
                       f"int64_list, got {feature.WhichOneof('kind')}")
    else:
      ids[name] = list(feature.int64_list.value)
  return Document(title=texts["title"], text=texts["body"], source=where, is_block=True,
                  title_token_ids=ids["title_token_ids"], body_token_ids=ids["body_token_ids"])


def _bytes_feature(values):
  import tensorflow as tf
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))


def _int_feature(values):
  import tensorflow as tf
  return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def write_realm_records(path: str, blocks: Iterable[tuple[str, str]],
                        vocab: Optional[vocab_lib.WordPieceVocabulary] = None, *,
                        compress: bool = True, with_token_ids: bool = True) -> int:
  """Writes (title, body) blocks as a REALM retrieval-corpus TFRecord file (GZIP with `compress`,
  as the release) and returns the number of records: the schema of
  `language/realm/generate_retrieval_corpus.py`, bytes features `title`, `body` and, with
  `with_token_ids`, for each of them `*_token_texts`, `*_token_starts`, `*_token_stops` (-1: the
  release did not compute boundaries) and `*_token_ids`. For tests and for exporting a corpus to
  the authors' code.
  """
  import tensorflow as tf  # lazily

  vocab = vocab or vocab_lib.default_vocabulary()
  count = 0
  with tf.io.TFRecordWriter(path, options="GZIP" if compress else None) as writer:
    for title, body in blocks:
      feature = {"title": _bytes_feature([title.encode("utf-8")]),
                 "body": _bytes_feature([body.encode("utf-8")])}
      if with_token_ids:
        for prefix, text in (("title", title), ("body", body)):
          ids = vocab.encode(text)
          feature[f"{prefix}_token_texts"] = _bytes_feature(
              [vocab.id_to_token(i).encode("utf-8") for i in ids])
          feature[f"{prefix}_token_starts"] = _int_feature([-1] * len(ids))
          feature[f"{prefix}_token_stops"] = _int_feature([-1] * len(ids))
          feature[f"{prefix}_token_ids"] = _int_feature(ids)
      example = tf.train.Example(features=tf.train.Features(feature=feature))
      writer.write(example.SerializeToString())
      count += 1
  return count


def write_orqa_blocks(directory: str, blocks: Iterable[tuple[str, str]],
                      vocab: Optional[vocab_lib.WordPieceVocabulary] = None) -> int:
  """Writes (title, body) blocks in ORQA's layout: blocks.tfr, titles.tfr, examples.tfr.

  As `language/orqa/preprocessing/preprocess_wiki_extractor.py` does: raw UTF-8 strings in
  blocks.tfr/titles.tfr, Examples with `title_ids`, `token_ids`, `sentence_starts` in
  examples.tfr. For tests.

  Returns:
    Number of blocks written.
  """
  import tensorflow as tf  # lazily

  vocab = vocab or vocab_lib.default_vocabulary()
  os.makedirs(directory, exist_ok=True)
  count = 0
  with tf.io.TFRecordWriter(os.path.join(directory, "blocks.tfr")) as blocks_writer, \
       tf.io.TFRecordWriter(os.path.join(directory, "titles.tfr")) as titles_writer, \
       tf.io.TFRecordWriter(os.path.join(directory, "examples.tfr")) as examples_writer:
    for title, body in blocks:
      body_bytes = body.encode("utf-8")
      token_ids, sentence_starts = [], []
      for start, limit in sentences_lib.split_sentences(body):
        sentence_starts.append(len(token_ids))
        token_ids.extend(vocab.encode(body_bytes[start:limit].decode("utf-8")))
      example = tf.train.Example(features=tf.train.Features(feature={
          "title_ids": _int_feature(vocab.encode(title)),
          "token_ids": _int_feature(token_ids),
          "sentence_starts": _int_feature(sentence_starts)}))
      blocks_writer.write(body_bytes)
      titles_writer.write(title.encode("utf-8"))
      examples_writer.write(example.SerializeToString())
      count += 1
  return count


def make_source(kind: str, input_path: str, *, split: str = "train",
                data_dir: Optional[str] = None):
  """The document source for `kind` ("jsonl", "tfds" or "realm")."""
  if kind == "jsonl":
    return JsonlSource(input_path)
  if kind == "tfds":
    return TfdsSource(input_path, split=split, data_dir=data_dir)
  if kind == "realm":
    return RealmSource(input_path)
  raise ValueError(f"unknown source kind {kind!r}; expected one of jsonl, tfds, realm")
