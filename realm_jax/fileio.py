"""Small file helpers shared by everything that publishes atomically (stores, indexes, worlds).

The pattern: write into a staging directory next to the destination, fsync the files, write
the manifest (with sha256 of every file) last, fsync the directory, rename into place, fsync the
parent so the rename itself is durable.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any


def fsync_dir(path: str | os.PathLike) -> None:
  """Makes a directory's entries (a rename into it) durable.

  Best effort: some filesystems refuse to open or fsync a directory; what that could lose, the
  readers' checksum verification catches.
  """
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


def sha256_file(path: str | os.PathLike, chunk_bytes: int = 8 << 20) -> str:
  """Hex sha256 of a file, read in chunks (memory stays bounded for multi-GB files)."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(chunk_bytes):
      digest.update(chunk)
  return digest.hexdigest()


def pid_alive(pid: int) -> bool:
  """Whether a process of this host is running (a staging directory's writer, say)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by another user
    return True
  return True


def write_json_atomically(path: str, value: Any) -> None:
  """Writes `value` as JSON to `path` through a temporary file, fsynced and renamed into place
  (creating the directory), so a reader never sees a half-written file; the temporary file is
  removed if writing fails."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(value, f, indent=1, sort_keys=True)
      f.write("\n")
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:  # cleanup only: the error propagates
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
