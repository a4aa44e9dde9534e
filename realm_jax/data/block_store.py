"""The BlockStore: the knowledge corpus Z on disk, its format and its read-only reader.

A block is `[CLS] title [SEP] body [SEP]` of at most `max_block_len` wordpieces (REALM_SPEC 7);
`realm_jax.data.corpus_build` writes stores. A store is one directory, published atomically:
tokens.npy ([num_blocks, max_block_len] embedder rows), title and body lengths, content uids,
document ids, the blocks' original text, and manifest.json with every file's sha256. `store_id`
is a content fingerprint (the content-determining options and the uids): same input and options
give the same block ids and store_id, whichever source the documents came from. The file
layout: docs/design/data_index_batches.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Optional, Union

import numpy as np

from realm_jax import fileio

FORMAT_NAME = "realm_jax.BlockStore"
FORMAT_VERSION = 1
DEFAULT_MAX_BLOCK_LEN = 288
NUM_SPECIAL_TOKENS = 3  # [CLS] title [SEP] body [SEP]

MANIFEST = "manifest.json"
TOKENS = "tokens.npy"
TITLE_LENGTHS = "title_lengths.npy"
BODY_LENGTHS = "body_lengths.npy"
UIDS = "uids.npy"
DOC_IDS = "doc_ids.npy"
TEXT = "text.bin"
TEXT_OFFSETS = "text_offsets.npy"
DATA_FILES = (TOKENS, TITLE_LENGTHS, BODY_LENGTHS, UIDS, DOC_IDS, TEXT, TEXT_OFFSETS)
DOC_KEYS = "doc_keys.jsonl"  # optional: the input's own document ids


class BlockStoreError(Exception):
  """A BlockStore directory is missing, incomplete, corrupt or does not match expectations."""


def content_uid(title: str, body_text: str) -> int:
  """The content hash of a block: excludes an example's own source block (REALM_SPEC 12).

  Args:
    title: block title.
    body_text: block body text (as stored in the BlockStore).

  Returns:
    The first 8 bytes, big-endian, of sha256(title + "\\x00" + body_text) in UTF-8, as an int in
    [0, 2**64). (The authors used sha1 of "title <sep> body"; only equality matters.)
  """
  return _uid_from_bytes(title.encode("utf-8"), body_text.encode("utf-8"))


# Package-private: the build (corpus_build) hashes the UTF-8 bytes it already holds.
def _uid_from_bytes(title: bytes, body: bytes) -> int:
  return int.from_bytes(hashlib.sha256(title + b"\x00" + body).digest()[:8], "big")


def token_dtype_for(vocab_size: int) -> np.dtype:
  """uint16 when every id fits (BERT: 30522), else int32."""
  return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.int32)


# ------------------------------------------------------------------------------ reading


@dataclasses.dataclass(frozen=True, eq=False)
class Block:
  """One block of the knowledge corpus.

  Attributes:
    block_id: row in the BlockStore.
    doc_id: index of the source document (among the documents kept).
    uid: `content_uid(title, body)`.
    title: title text.
    body: original body text.
    title_token_ids: [title_len] int32 wordpieces (no specials).
    body_token_ids: [body_len] int32 wordpieces (no specials).
  """

  block_id: int
  doc_id: int
  uid: int
  title: str
  body: str
  title_token_ids: np.ndarray
  body_token_ids: np.ndarray


class BlockStore:
  """A read-only, memory-mapped knowledge corpus of blocks (see the module docstring)."""

  def __init__(self, path: str, manifest: dict, arrays: dict[str, np.ndarray],
               text: Union[np.ndarray, bytes]):
    self.path = path
    self.manifest = manifest
    self.tokens = arrays[TOKENS]  # [num_blocks, max_block_len]
    self.title_lengths = arrays[TITLE_LENGTHS]  # [num_blocks] int32
    self.body_lengths = arrays[BODY_LENGTHS]  # [num_blocks] int32
    self.uids = arrays[UIDS]  # [num_blocks] uint64
    self.doc_ids = arrays[DOC_IDS]  # [num_blocks] int64
    self.text_offsets = arrays[TEXT_OFFSETS]  # [2 * num_blocks + 1] int64
    self._text = text  # [text_bytes] uint8 memmap

  @classmethod
  def open(cls, path: str, *, verify: Union[bool, str] = True,
           vocab_fingerprint: Optional[str] = None) -> "BlockStore":
    """Opens a BlockStore directory (arrays memory-mapped read-only), refusing anything incomplete
    or inconsistent with a BlockStoreError naming the path and the problem.

    `verify`: True checks every file's size and sha256 against the manifest (reads everything
    once), "fast" sizes only (for huge stores), False neither (shapes, dtypes and offsets are still
    checked). `vocab_fingerprint`, if given, must be the vocabulary the store was built with.
    """
    path = os.fspath(path)
    fileio.check_verify_mode(verify)

    def fail(problem: str):
      raise BlockStoreError(f"{path}: {problem}")

    manifest = fileio.read_format_manifest(path, MANIFEST, FORMAT_NAME, FORMAT_VERSION,
                                           "BlockStore", fail)
    try:
      num_blocks = int(manifest["num_blocks"])
      max_block_len = int(manifest["max_block_len"])
      token_dtype = np.dtype(manifest["token_dtype"])
      files = manifest["files"]
      fingerprint = manifest["vocab"]["fingerprint"]
      manifest["store_id"]
    except (KeyError, TypeError, ValueError) as e:
      fail(f"{MANIFEST} lacks or has a bad entry: {e!r}")
    if vocab_fingerprint is not None and fingerprint != vocab_fingerprint:
      fail(f"built with vocabulary {fingerprint[:12]}..., expected {vocab_fingerprint[:12]}...")

    optional = (DOC_KEYS,) if isinstance(files, dict) and DOC_KEYS in files else ()
    fileio.verify_listed_files(path, files, DATA_FILES + optional, MANIFEST, verify, fail)

    expected = {TOKENS: ((num_blocks, max_block_len), token_dtype),
                TITLE_LENGTHS: ((num_blocks,), np.dtype(np.int32)),
                BODY_LENGTHS: ((num_blocks,), np.dtype(np.int32)),
                UIDS: ((num_blocks,), np.dtype(np.uint64)),
                DOC_IDS: ((num_blocks,), np.dtype(np.int64)),
                TEXT_OFFSETS: ((2 * num_blocks + 1,), np.dtype(np.int64))}
    arrays = fileio.load_checked_arrays(path, expected, fail)
    text_path = os.path.join(path, TEXT)
    text_size = os.path.getsize(text_path)
    offsets = arrays[TEXT_OFFSETS]
    if offsets[0] != 0 or offsets[-1] != text_size:
      fail(f"{TEXT_OFFSETS} does not span {TEXT} ({text_size} bytes)")
    text = np.memmap(text_path, np.uint8, mode="r") if text_size else b""
    return cls(path, manifest, arrays, text)

  # -- properties

  @property
  def num_blocks(self) -> int:
    return int(self.manifest["num_blocks"])

  def __len__(self) -> int:
    return self.num_blocks

  @property
  def max_block_len(self) -> int:
    return int(self.manifest["max_block_len"])

  @property
  def store_id(self) -> str:
    return self.manifest["store_id"]

  def doc_key(self, doc_id: int) -> Optional[str]:
    """The input's own id of document `doc_id` (a `Block.doc_id`): JSONL's "id" field, kept
    in doc_keys.jsonl; None when the input gave that document none, or gave none at all."""
    if DOC_KEYS not in self.manifest["files"]:
      return None
    if getattr(self, "_doc_keys", None) is None:
      with open(os.path.join(self.path, DOC_KEYS), encoding="utf-8") as f:
        self._doc_keys = [json.loads(line) for line in f]
    return self._doc_keys[int(doc_id)]

  @property
  def vocab_fingerprint(self) -> str:
    return self.manifest["vocab"]["fingerprint"]

  # -- random access

  def _check(self, block_id) -> int:
    block_id = int(block_id)
    if not 0 <= block_id < self.num_blocks:
      raise IndexError(f"{self.path}: block id {block_id} out of range [0, {self.num_blocks})")
    return block_id

  def _text_slice(self, start: int, limit: int) -> str:
    return bytes(self._text[start:limit]).decode("utf-8")

  def title(self, block_id: int) -> str:
    """Title text of a block."""
    i = self._check(block_id)
    return self._text_slice(int(self.text_offsets[2 * i]), int(self.text_offsets[2 * i + 1]))

  def body(self, block_id: int) -> str:
    """Original body text of a block."""
    i = self._check(block_id)
    return self._text_slice(int(self.text_offsets[2 * i + 1]),
                            int(self.text_offsets[2 * i + 2]))

  def title_tokens(self, block_id: int) -> np.ndarray:
    """[title_len] int32 title wordpieces (no specials)."""
    i = self._check(block_id)
    return np.asarray(self.tokens[i, 1:1 + int(self.title_lengths[i])], np.int32)

  def body_tokens(self, block_id: int) -> np.ndarray:
    """[body_len] int32 body wordpieces (no specials): the block part of the reader input."""
    i = self._check(block_id)
    start = int(self.title_lengths[i]) + 2
    return np.asarray(self.tokens[i, start:start + int(self.body_lengths[i])], np.int32)

  def block(self, block_id: int) -> Block:
    """Everything about one block."""
    i = self._check(block_id)
    return Block(block_id=i, doc_id=int(self.doc_ids[i]), uid=int(self.uids[i]),
                 title=self.title(i), body=self.body(i), title_token_ids=self.title_tokens(i),
                 body_token_ids=self.body_tokens(i))

  def embedder_inputs(self, block_ids) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Document-embedder inputs `[CLS] title [SEP] body [SEP]` (REALM_SPEC 11).

    Args:
      block_ids: [n] block ids (any order, repeats allowed).

    Returns:
      (ids, type_ids, mask), each int32 [n, max_block_len]: type 0 for [CLS] title [SEP], 1 for
      body [SEP], 0 on padding; mask 1 on real tokens.
    """
    block_ids = np.asarray(block_ids, np.int64).reshape(-1)  # [n]
    if block_ids.size and (block_ids.min() < 0 or block_ids.max() >= self.num_blocks):
      raise IndexError(f"{self.path}: block ids out of range [0, {self.num_blocks})")
    ids = np.asarray(self.tokens[block_ids], np.int32)  # [n, max_block_len]
    title_lengths = np.asarray(self.title_lengths[block_ids], np.int32)[:, None]  # [n, 1]
    body_lengths = np.asarray(self.body_lengths[block_ids], np.int32)[:, None]  # [n, 1]
    positions = np.arange(self.max_block_len, dtype=np.int32)[None, :]  # [1, max_block_len]
    total = title_lengths + body_lengths + NUM_SPECIAL_TOKENS  # [n, 1]
    mask = (positions < total).astype(np.int32)  # [n, max_block_len]
    type_ids = ((positions >= title_lengths + 2) & (positions < total)).astype(np.int32)
    return ids, type_ids, mask

  def close(self) -> None:
    """Drops the memory maps (the object is unusable afterwards)."""
    for name in ("tokens", "title_lengths", "body_lengths", "uids", "doc_ids", "text_offsets"):
      setattr(self, name, None)
    self._text = b""

  def __enter__(self) -> "BlockStore":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __repr__(self) -> str:
    return (f"BlockStore({self.path!r}, num_blocks={self.num_blocks}, "
            f"max_block_len={self.max_block_len}, store_id={self.store_id[:12]}...)")
