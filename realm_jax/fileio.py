"""Small file helpers shared by everything that publishes atomically (stores, indexes, worlds),
and the run directory's writer lock.

The pattern: write and fsync the files in a staging directory next to the destination, write
the manifest (sha256 of every file) last, rename into place and fsync the parent:

  with staged_directory(dest, f"{name}.staging-") as staging:
    ...write and fsync the files, then write_manifest(staging, manifest)...
    publish_staged(staging, dest)  # leaving the block without this removes staging

Private directories are named `<prefix><host>-<pid>-<random>`, so a later writer can remove
those of dead processes. `run_dir_lock` keeps a second trainer (or builder) out of a run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import sys
import threading
import time
from typing import Any, Iterator, Optional

MANIFEST = "manifest.json"

# The end of a private directory's name: the writer's `<host>-<pid>-<random>`.
_WRITER_SUFFIX = r"(?P<host>.+)-(?P<pid>\d+)-[^-]*"

_IN_USE: set[str] = set()  # private directories this process is still writing or deleting
_IN_USE_LOCK = threading.Lock()

log = logging.getLogger(__name__)


def fsync_file(path: str | os.PathLike) -> None:
  """Makes a written file's contents durable (before it is hashed into a manifest)."""
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


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


def numbered_dirs(root: str) -> list[tuple[int, str]]:
  """(number, path) of the directories in `root` named by a decimal number (ASCII digits: a
  checkpoint's or an index's step), ascending; [] when `root` does not exist. Staging and
  temporary names are never numbers."""
  try:
    names = os.listdir(root)
  except FileNotFoundError:
    return []
  found = [(int(name), os.path.join(root, name)) for name in names
           if name.isascii() and name.isdigit()]
  return sorted((n, path) for n, path in found if os.path.isdir(path))


def write_json_atomically(path: str, value: Any, *, indent: int = 1) -> None:
  """Writes `value` as JSON to `path` through a temporary file, fsynced and renamed into place
  (creating the directory), so a reader never sees a half-written file; the temporary file is
  removed if writing fails."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(value, f, indent=indent, sort_keys=True)
      f.write("\n")
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:  # cleanup only: the error propagates
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_manifest(directory: str, manifest: dict) -> None:
  """Writes `directory/manifest.json` (sorted keys, indent 2) through a temporary file; written
  last, its presence marks the directory complete."""
  write_json_atomically(os.path.join(directory, MANIFEST), manifest, indent=2)
  fsync_dir(directory)


@contextlib.contextmanager
def private_path(parent: str, prefix: str) -> Iterator[str]:
  """Yields a fresh path `<parent>/<prefix><host>-<pid>-<random>` (nothing is created there),
  which `remove_stale` leaves alone while the block runs."""
  path = os.path.join(os.path.abspath(parent),
                      f"{prefix}{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}")
  with _IN_USE_LOCK:
    _IN_USE.add(path)
  try:
    yield path
  finally:
    with _IN_USE_LOCK:
      _IN_USE.discard(path)


@contextlib.contextmanager
def staged_directory(dest: str | os.PathLike, prefix: str) -> Iterator[str]:
  """Creates an empty private staging directory next to `dest` (whose parent must exist) and
  yields its path. Leaving the block removes it, unless `publish_staged` has renamed it to
  `dest`; so an exception inside the block publishes nothing and leaves nothing."""
  with private_path(os.path.dirname(os.path.abspath(dest)), prefix) as staging:
    os.mkdir(staging)
    try:
      yield staging
    finally:
      shutil.rmtree(staging, ignore_errors=True)  # already gone once published


def publish_staged(staging: str, dest: str | os.PathLike, *,
                   aside_prefix: Optional[str] = None) -> None:
  """Renames the complete directory `staging` to `dest`, durably (fsyncs staging, then the
  parent, so neither its entries nor the rename can be lost in a crash).

  A rename cannot replace a non-empty directory. Without `aside_prefix` an existing `dest`
  therefore makes this raise OSError (two publishers never overwrite each other). With it, an
  existing `dest` is first renamed to a private `<aside_prefix>...` path next to it and deleted
  afterwards: a crash in between leaves the old copy there, never a half-written `dest`.
  """
  fsync_dir(staging)
  parent = os.path.dirname(os.path.abspath(dest))
  if aside_prefix is None or not os.path.lexists(dest):
    os.replace(staging, dest)
    fsync_dir(parent)
    return
  with private_path(parent, aside_prefix) as aside:
    os.replace(dest, aside)
    os.replace(staging, dest)
    fsync_dir(parent)
    shutil.rmtree(aside, ignore_errors=True)


def private_owner(name: str, pattern: str) -> Optional[tuple[str, int]]:
  """(host, pid) of the writer if `name` is `<pattern><host>-<pid>-<random>` (`pattern` a
  regular expression for the prefix), else None."""
  match = re.fullmatch(pattern + _WRITER_SUFFIX, name)
  return (match["host"], int(match["pid"])) if match else None


def remove_stale(parent: str, pattern: str) -> list[str]:
  """Removes the private directories in `parent` named `<pattern><host>-<pid>-<random>` that
  writers of this host left behind when they died, and returns their paths.

  Kept: those of live processes, those this process is still using, and those of other hosts
  (a shared filesystem: their pids mean nothing here).
  """
  parent = os.path.abspath(parent)  # as private_path names them
  if not os.path.isdir(parent):
    return []
  host, removed = socket.gethostname(), []
  for name in sorted(os.listdir(parent)):
    owner, path = private_owner(name, pattern), os.path.join(parent, name)
    with _IN_USE_LOCK:
      in_use = path in _IN_USE
    if owner is None or owner[0] != host or in_use:
      continue
    if owner[1] == os.getpid() or not pid_alive(owner[1]):
      log.warning("Removing %s, left by an interrupted write.", path)
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)
  return removed


class RunDirInUse(RuntimeError):
  """Another live process holds the run directory's lock (`run_dir_lock`); entry points print
  it as one line and exit with status 2."""


def _lock_holder(fd: int) -> Optional[dict]:
  """The holder record in an open lock file, or None (empty: released cleanly)."""
  os.lseek(fd, 0, os.SEEK_SET)
  text = os.read(fd, 4096).decode("utf-8", errors="replace").strip()
  if not text:
    return None
  try:
    holder = json.loads(text)
  except ValueError:
    return {"pid": "?", "host": "?", "started": "?", "command": text[:80]}
  return holder if isinstance(holder, dict) else None


def _describe_holder(holder: dict) -> str:
  return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started "
          f"{holder.get('started', '?')}")


@contextlib.contextmanager
def run_dir_lock(run_dir: str, role: str) -> Iterator[str]:
  """Holds `<run_dir>/<role>.lock` exclusively while in the block: one trainer (and one index
  builder) per run directory.

  The lock is the kernel's (`flock`), so it ends with its process; the file records the holder
  for the message a second process gets. A filesystem without locks gets a warning and no lock.
  Yields the lock file's path; raises RunDirInUse (naming the holder) or NotADirectoryError.
  """
  if os.path.exists(run_dir) and not os.path.isdir(run_dir):
    raise NotADirectoryError(f"{run_dir} is a file, not a run directory")
  os.makedirs(run_dir, exist_ok=True)
  path = os.path.join(run_dir, f"{role}.lock")
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      locked = True
    except BlockingIOError:
      holder = _lock_holder(fd) or {}
      raise RunDirInUse(
          f"{run_dir} is in use by another {role} ({_describe_holder(holder)}; lock {path}): "
          f"stop it, or give this run another directory") from None
    except OSError as e:
      log.warning("%s: cannot lock (%s): this filesystem has no locks, so nothing stops a "
                  "second %s from writing the same run directory", path, e, role)
      locked = False
    if not locked:
      yield path
      return
    previous = _lock_holder(fd)
    if previous is not None:
      log.warning("%s: taking over the lock of a %s that ended without releasing it (%s)",
                  path, role, _describe_holder(previous))
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "command": " ".join(sys.argv)[:400]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    os.fsync(fd)
    try:
      yield path
    finally:
      os.ftruncate(fd, 0)  # released cleanly: no record for the next holder to warn about
  finally:
    os.close(fd)  # closing the only descriptor releases the flock


def check_verify_mode(verify: Any) -> None:
  """`verify` of a published directory's loader: True (sizes and sha256s), "fast" (sizes) or
  False (neither); anything else is a ValueError."""
  if verify not in (True, False, "fast"):
    raise ValueError(f"verify must be True, False or 'fast', got {verify!r}")


def read_format_manifest(path: str, manifest_name: str, format_name: str, format_version: int,
                         what: str, fail: Any) -> dict:
  """The manifest of a published directory of `format_name` (a BlockStore, a chunk database),
  checked to be one this code reads; every problem goes to `fail(problem)`, which raises."""
  if not os.path.isdir(path):
    fail(f"not a directory (no {what} here)")
  manifest_path = os.path.join(path, manifest_name)
  if not os.path.isfile(manifest_path):
    fail(f"no {manifest_name}: not a {what}, or an unfinished build")
  try:
    with open(manifest_path, encoding="utf-8") as f:
      manifest = json.load(f)
  except (OSError, ValueError) as e:
    fail(f"unreadable {manifest_name} ({e})")
  if not isinstance(manifest, dict) or manifest.get("format") != format_name:
    fail(f"{manifest_name} is not a {format_name} manifest")
  if manifest.get("format_version") != format_version:
    fail(f"format_version {manifest.get('format_version')!r} is not supported (this code reads "
         f"{format_version})")
  return manifest


def verify_listed_files(path: str, files: Any, names: Any, manifest_name: str,
                        verify: Any, fail: Any) -> None:
  """Each of `names` is listed in the manifest's `files` ({name: {"bytes", "sha256"}}) and
  present; with `verify`, of its recorded size; with `verify is True`, of its sha256."""
  for name in names:
    file_path = os.path.join(path, name)
    entry = files.get(name) if isinstance(files, dict) else None
    if not isinstance(entry, dict):
      fail(f"{manifest_name} does not list {name}")
    if not os.path.isfile(file_path):
      fail(f"missing file {name}")
    check_listed_file(file_path, name, entry, verify, fail)


def check_listed_file(file_path: str, name: str, entry: dict, verify: Any, fail: Any, *,
                      sha256: Any = None) -> None:
  """With `verify`, the file at `file_path` (called `name`) has its manifest `entry`'s
  "bytes"; with `verify is True`, its "sha256" too (`sha256`: the hash function, default
  `sha256_file`). `fail(message)` raises."""
  if verify:
    size = os.path.getsize(file_path)
    if size != entry.get("bytes"):
      fail(f"{name} has {size} bytes, the manifest says {entry.get('bytes')} (truncated or "
           f"modified)")
  if verify is True and (sha256 or sha256_file)(file_path) != entry.get("sha256"):
    fail(f"{name} does not match its sha256 in the manifest (corrupt or modified)")


def load_checked_arrays(path: str, expected: dict, fail: Any, *, mmap: bool = True) -> dict:
  """{name: the .npy array of `path`/name}, each of the (shape, dtype) `expected` gives it."""
  import numpy as np  # pylint: disable=import-outside-toplevel  (fileio stays import-light)
  arrays = {}
  for name, (shape, dtype) in expected.items():
    try:
      array = np.load(os.path.join(path, name), mmap_mode="r" if mmap else None,
                      allow_pickle=False)
    except (OSError, ValueError) as e:
      fail(f"cannot read {name} ({e})")
    if array.shape != shape or array.dtype != dtype:
      fail(f"{name} is {array.dtype}{list(array.shape)}, expected {dtype}{list(shape)}")
    arrays[name] = array
  return arrays
