"""Tests of realm_jax.fileio's staged-directory publish and its stale-directory cleanup."""

import json
import os
import socket
import subprocess
import sys

import pytest

from realm_jax import fileio


def names(directory):
  return sorted(os.listdir(directory))


def published(dest):
  """An existing destination holding old.txt."""
  dest.mkdir()
  (dest / "old.txt").write_text("old")
  return dest


def dead_pid():
  process = subprocess.Popen(["true"])
  process.wait()  # its pid is now free
  return process.pid


def test_publish_makes_dest_appear_only_at_the_end(tmp_path):
  dest = tmp_path / "out"
  with fileio.staged_directory(dest, "out.staging-") as staging:
    host, pid, rand = os.path.basename(staging)[len("out.staging-"):].rsplit("-", 2)
    assert (host, int(pid), len(rand)) == (socket.gethostname(), os.getpid(), 8)
    assert os.path.dirname(staging) == str(tmp_path) and names(staging) == []
    with open(os.path.join(staging, "a.txt"), "w") as f:
      f.write("hello")
    os.mkdir(os.path.join(staging, "sub"))
    assert not dest.exists()
    fileio.publish_staged(staging, dest)
    assert not os.path.exists(staging)
  assert names(tmp_path) == ["out"]
  assert (dest / "a.txt").read_text() == "hello" and names(dest) == ["a.txt", "sub"]


def test_publish_fsyncs_staging_before_the_rename_and_the_parent_after(tmp_path, monkeypatch):
  events = []
  monkeypatch.setattr(fileio, "fsync_dir", lambda path: events.append(("fsync", str(path))))
  rename = os.replace
  monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("rename", str(a), str(b))),
                                                   rename(a, b)))
  dest = str(tmp_path / "out")
  with fileio.staged_directory(dest, ".tmp-") as staging:
    fileio.publish_staged(staging, dest)
  assert events == [("fsync", staging), ("rename", staging, dest), ("fsync", str(tmp_path))]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_an_exception_in_the_block_publishes_nothing_and_removes_staging(tmp_path, error):
  with pytest.raises(error):
    with fileio.staged_directory(tmp_path / "out", "out.staging-") as staging:
      with open(os.path.join(staging, "a.txt"), "w") as f:
        f.write("partial")
      raise error("writer died")
  assert names(tmp_path) == []


def test_leaving_the_block_without_publishing_removes_staging(tmp_path):
  with fileio.staged_directory(tmp_path / "out", "out.staging-") as staging:
    open(os.path.join(staging, "a.txt"), "w").close()
  assert names(tmp_path) == []


def test_existing_dest_is_never_overwritten_without_aside_prefix(tmp_path):
  dest = published(tmp_path / "out")
  with pytest.raises(OSError):
    with fileio.staged_directory(dest, "out.staging-") as staging:
      open(os.path.join(staging, "new.txt"), "w").close()
      fileio.publish_staged(staging, dest)
  assert names(tmp_path) == ["out"] and names(dest) == ["old.txt"]


def test_aside_prefix_replaces_an_existing_dest(tmp_path):
  dest = published(tmp_path / "out")
  with fileio.staged_directory(dest, "out.staging-") as staging:
    open(os.path.join(staging, "new.txt"), "w").close()
    fileio.publish_staged(staging, dest, aside_prefix="out.old-")
  assert names(tmp_path) == ["out"] and names(dest) == ["new.txt"]


def test_a_failed_swap_keeps_the_old_copy_aside(tmp_path, monkeypatch):
  dest = published(tmp_path / "out")
  rename, calls = os.replace, []

  def fail_second_rename(a, b):
    calls.append(b)
    if len(calls) == 2:  # dest was moved aside; staging -> dest fails
      raise OSError("injected")
    rename(a, b)

  monkeypatch.setattr(os, "replace", fail_second_rename)
  with pytest.raises(OSError, match="injected"):
    with fileio.staged_directory(dest, "out.staging-") as staging:
      fileio.publish_staged(staging, dest, aside_prefix="out.old-")
  [aside] = names(tmp_path)  # staging removed, dest absent, the old copy kept
  assert aside.startswith(f"out.old-{socket.gethostname()}-{os.getpid()}-")
  assert names(tmp_path / aside) == ["old.txt"]


def test_private_owner():
  pattern = r"\.staging-\d+-"
  # The host may contain dashes: pid and random are split off the end.
  assert fileio.private_owner(".staging-3-some-other-host-12-dddd", pattern) == (
      "some-other-host", 12)
  assert fileio.private_owner(".staging-3-host-12-", pattern) == ("host", 12)
  for name in (".staging-x-host-12-dddd",  # prefix does not match
               "a.staging-3-host-12-dddd",  # neither does this: the whole name must
               ".staging-3-host-x-dddd",  # pid not a number
               ".staging-3-host-12-dd-dd",  # "dd" as the pid
               ".staging-3-12-dddd"):  # no host
    assert fileio.private_owner(name, pattern) is None, name


def test_remove_stale_removes_only_dead_writers_of_this_host(tmp_path):
  host, dead = socket.gethostname(), dead_pid()
  paths = {k: tmp_path / name for k, name in {
      "dead": f"out.staging-{host}-{dead}-0a1b2c3d",
      "dead_old": f"out.old-{host}-{dead}-0a1b2c3d",
      "live": f"out.staging-{host}-{os.getppid()}-0a1b2c3d",
      "other_host": f"out.staging-elsewhere-{dead}-0a1b2c3d",
      "other_dest": f"outer.staging-{host}-{dead}-0a1b2c3d",
      "mine": f"out.staging-{host}-{os.getpid()}-0a1b2c3d",  # this process, not in use
  }.items()}
  for path in paths.values():
    path.mkdir()
  (tmp_path / "out.staging-file").write_text("not ours")
  with fileio.staged_directory(tmp_path / "out", "out.staging-") as in_use:
    removed = fileio.remove_stale(str(tmp_path), r"out\.(?:staging|old)-")
    assert os.path.isdir(in_use)
  assert sorted(removed) == sorted(str(paths[k]) for k in ("dead", "dead_old", "mine"))
  assert names(tmp_path) == sorted(["out.staging-file"] + [
      paths[k].name for k in ("live", "other_host", "other_dest")])
  assert fileio.remove_stale(str(tmp_path / "missing"), "x") == []


def test_write_manifest_is_sorted_indented_and_leaves_no_temporary(tmp_path):
  fileio.write_manifest(str(tmp_path), {"b": 1, "a": {"z": "é", "y": [1]}})
  assert names(tmp_path) == ["manifest.json"]
  assert (tmp_path / "manifest.json").read_text(encoding="utf-8") == (
      '{\n  "a": {\n    "y": [\n      1\n    ],\n    "z": "\\u00e9"\n  },\n  "b": 1\n}\n')
  fileio.write_json_atomically(str(tmp_path / "x.json"), {"b": 1, "a": 2})
  assert (tmp_path / "x.json").read_text() == '{\n "a": 2,\n "b": 1\n}\n'
  assert json.loads((tmp_path / "manifest.json").read_text())["a"]["z"] == "é"


# ------------------------------------------------------------------ run_dir_lock


def test_a_held_run_directory_refuses_a_second_holder_and_names_the_first(tmp_path):
  run_dir = str(tmp_path / "run")
  with fileio.run_dir_lock(run_dir, "trainer") as path:
    record = json.loads(open(path).read())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    # flock locks belong to an open file: a second open in this very process is refused too.
    with pytest.raises(fileio.RunDirInUse) as refused:
      with fileio.run_dir_lock(run_dir, "trainer"):
        pass
    message = str(refused.value)
    assert f"in use by another trainer (pid {os.getpid()} on {socket.gethostname()}, " \
           f"started {record['started']}" in message
    # Another role holds its own lock beside it (the builder writes the trainer's run).
    with fileio.run_dir_lock(run_dir, "builder"):
      pass
  # Released cleanly: empty, and the next holder takes it without a word.
  assert open(path).read() == ""
  with fileio.run_dir_lock(run_dir, "trainer"):
    pass


def test_a_second_process_is_refused_while_the_first_lives_and_not_after(tmp_path):
  run_dir = tmp_path / "run"
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time; from realm_jax import fileio\n"
       "with fileio.run_dir_lock(sys.argv[1], 'trainer'):\n"
       "  print('held', flush=True); time.sleep(60)", str(run_dir)],
      stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(fileio.RunDirInUse, match=f"pid {holder.pid} "):
      with fileio.run_dir_lock(str(run_dir), "trainer"):
        pass
  finally:
    holder.kill()  # no cleanup runs: its record stays, its flock goes with it
    holder.wait()
    holder.stdout.close()
  assert json.loads((run_dir / "trainer.lock").read_text())["pid"] == holder.pid


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path, caplog):
  run_dir = tmp_path / "run"
  run_dir.mkdir()
  stale = {"pid": dead_pid(), "host": socket.gethostname(), "started": "2026-01-02 03:04:05 UTC",
           "command": "python -m realm_jax.train"}
  (run_dir / "trainer.lock").write_text(json.dumps(stale) + "\n")
  with caplog.at_level("WARNING"):
    with fileio.run_dir_lock(str(run_dir), "trainer") as path:
      assert json.loads(open(path).read())["pid"] == os.getpid()
  taken = [r.getMessage() for r in caplog.records if "taking over" in r.getMessage()]
  assert len(taken) == 1 and f"pid {stale['pid']} on {stale['host']}, started " \
                             f"2026-01-02 03:04:05 UTC" in taken[0], taken


def test_a_run_directory_that_is_a_file_is_refused(tmp_path):
  (tmp_path / "run").write_text("not a directory")
  with pytest.raises(NotADirectoryError, match="is a file, not a run directory"):
    with fileio.run_dir_lock(str(tmp_path / "run"), "trainer"):
      pass


@pytest.mark.parametrize("verify", [True, False, "fast"])
def test_the_three_verify_modes_are_accepted(verify):
  fileio.check_verify_mode(verify)


def test_another_verify_mode_is_refused_by_every_loader(tmp_path):
  from realm_jax.data import block_store  # pylint: disable=import-outside-toplevel
  from realm_jax.index import store  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="verify must be True, False or 'fast', got 'full'"):
    fileio.check_verify_mode("full")
  with pytest.raises(ValueError, match="got 'full'"):
    block_store.BlockStore.open(str(tmp_path), verify="full")
  with pytest.raises(ValueError, match="got 'full'"):
    store.load_index(str(tmp_path), verify="full")
