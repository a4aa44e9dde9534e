"""launch.local: the two-process launcher, with small stand-in children (Python scripts written
into tmp_path) that print, sleep, exit with a given status, and on SIGINT write a marker file
and exit 130 (like the real entry points). The Ctrl-C tests run the launcher itself as a
subprocess and signal it."""

import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launch import local

REPO = Path(__file__).resolve().parents[2]

CHILD = r'''
import os, signal, sys, time

name, out_dir, seconds, code = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
flags = sys.argv[5:]


def mark(what):  # atomically: a marker that exists holds the pid
  path = os.path.join(out_dir, f"{name}.{what}")
  with open(path + ".part", "w") as f:
    f.write(str(os.getpid()))
  os.replace(path + ".part", path)


def exited(other):
  """True once the child `other` has exited (a zombie its launcher has not reaped yet counts)."""
  with open(os.path.join(out_dir, other + ".pid")) as f:
    pid = int(f.read())
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] == "Z"
  except OSError:
    return True


if "--ignore-sigint" in flags:
  signal.signal(signal.SIGINT, signal.SIG_IGN)
if "--grandchild" in flags:  # something the child leaves behind in its process group
  sleeper = __import__("subprocess").Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  with open(os.path.join(out_dir, f"{name}.grandchild"), "w") as f:
    f.write(str(sleeper.pid))
# From the pid file on, a SIGINT is always caught here: a test may stop this child as soon as the
# file exists, and a child descheduled before its countdown must not die of KeyboardInterrupt.
try:
  mark("pid")
  for flag in flags:
    # --after=NAME: start the countdown once NAME is up (its SIGINT handling too);
    # --after_exit=NAME: once NAME has exited.
    other = flag.partition("=")[2]
    if flag.startswith("--after"):
      while not os.path.exists(os.path.join(out_dir, other + ".pid")):
        time.sleep(0.01)
    if flag.startswith("--after_exit="):
      while not exited(other):
        time.sleep(0.01)
  print(f"{name} ready", flush=True)
  print(f"{name} says hello on stderr", file=sys.stderr, flush=True)
  time.sleep(seconds)
except KeyboardInterrupt:
  mark("sigint")
  print(f"{name} interrupted", flush=True)
  sys.exit(130)
mark("done")
print(f"{name} done", flush=True)
sys.exit(code)
'''


@pytest.fixture
def child(tmp_path):
  """Returns cmd(name, seconds, code, *flags): the argv of a stand-in child."""
  script = tmp_path / "child.py"
  script.write_text(CHILD)

  def cmd(name, seconds, code=0, *flags):
    return [sys.executable, str(script), name, str(tmp_path), str(seconds), str(code), *flags]

  return cmd


def _marker(tmp_path, name, what):
  return (tmp_path / f"{name}.{what}").exists()


def _pid(tmp_path, name, what="pid"):
  return int((tmp_path / f"{name}.{what}").read_text())


def _alive(pid):
  """True while `pid` runs (a zombie waiting for a reaper counts as gone)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def _gone(pid, timeout=60.0):
  deadline = time.monotonic() + timeout
  while _alive(pid) and time.monotonic() < deadline:
    time.sleep(0.02)
  return not _alive(pid)


def _run(tmp_path, trainer, builder, **kwargs):
  kwargs.setdefault("grace_seconds", 5.0)
  return local.run_local(trainer, builder, log_dir=str(tmp_path / "logs"), **kwargs)


def test_output_teed_with_prefix_and_logged(child, tmp_path, capfd):
  status = _run(tmp_path, child("trainer", 0.2), child("builder", 0.4))
  assert status == 0
  out, err = capfd.readouterr()
  for name in ("trainer", "builder"):
    assert f"[{name}] {name} ready\n" in out
    assert f"[{name}] {name} says hello on stderr\n" in out  # stderr merged, prefixed
    assert f"[{name}] {name} done\n" in out
    log = (tmp_path / "logs" / f"{name}.log").read_text()
    assert log.startswith("=== launch ")  # header with the command
    assert shlex.join(child(name, 0.2 if name == "trainer" else 0.4)) in log.splitlines()[0]
    assert f"\n{name} ready\n{name} says hello on stderr\n{name} done\n" in log  # no prefix
  summary = err.strip().splitlines()[-1]
  assert summary.startswith("launch: trainer exit 0 in ")
  assert "builder exit 0 in " in summary and summary.endswith("-> status 0")


def test_logs_are_appended(child, tmp_path, capfd):
  for _ in range(2):
    assert _run(tmp_path, child("trainer", 0), None) == 0
  log = (tmp_path / "logs" / "trainer.log").read_text()
  assert log.count("=== launch ") == 2 and log.count("trainer done") == 2
  assert not (tmp_path / "logs" / "builder.log").exists()
  capfd.readouterr()


def test_trainer_success_lets_builder_finish(child, tmp_path, capfd):
  status = _run(tmp_path, child("trainer", 0.1), child("builder", 1.5))
  assert status == 0
  assert _marker(tmp_path, "builder", "done") and not _marker(tmp_path, "builder", "sigint")
  assert "waiting (up to 0:30:00) for the builder" in capfd.readouterr().err


def test_trainer_failure_stops_builder(child, tmp_path, capfd):
  start = time.monotonic()
  status = _run(tmp_path, child("trainer", 0.1, 3, "--after=builder"), child("builder", 300))
  assert status == 3  # the trainer's own status
  assert time.monotonic() - start < 120  # not the builder's 300 s
  assert _marker(tmp_path, "builder", "sigint") and not _marker(tmp_path, "builder", "done")
  assert _gone(_pid(tmp_path, "builder"))
  err = capfd.readouterr().err
  assert "the trainer failed (status 3); stopping the builder" in err
  assert "builder stopped: exit 130" in err


def test_trainer_killed_by_signal_gives_128_plus_n(tmp_path, capfd):
  trainer = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"]
  assert _run(tmp_path, trainer, None) == 128 + signal.SIGTERM
  assert "trainer killed by SIGTERM" in capfd.readouterr().err


def test_builder_failure_is_loud_and_training_goes_on(child, tmp_path, capfd):
  status = _run(tmp_path, child("trainer", 1.0, 0, "--after=builder"), child("builder", 0, 1))
  assert status == local.EXIT_BUILDER_FAILED
  assert _marker(tmp_path, "trainer", "done") and not _marker(tmp_path, "trainer", "sigint")
  err = capfd.readouterr().err
  assert "INDEX BUILDER FAILED (status 1)" in err and "!" * 72 in err
  assert "trainer exit 0" in err and "builder exit 1" in err


def test_builder_failure_after_training_counts(child, tmp_path, capfd):
  # The builder fails only once the trainer has exited, whatever the machine's load.
  status = _run(tmp_path, child("trainer", 0, 0, "--after=builder"),
                child("builder", 0, 1, "--after_exit=trainer"))
  assert status == local.EXIT_BUILDER_FAILED
  err = capfd.readouterr().err
  assert "INDEX BUILDER FAILED (status 1)" in err
  assert "its last checkpoint may not be indexed" in err


def test_builder_failure_can_stop_the_trainer(child, tmp_path, capfd):
  status = _run(tmp_path, child("trainer", 60), child("builder", 0, 1, "--after=trainer"),
                stop_on_builder_failure=True)
  assert status == local.EXIT_BUILDER_FAILED
  assert _marker(tmp_path, "trainer", "sigint")
  assert "stopping the trainer" in capfd.readouterr().err


def test_builder_timeout_after_training(child, tmp_path, capfd):
  status = _run(tmp_path, child("trainer", 0, 0, "--after=builder"), child("builder", 60),
                builder_timeout=0.5)
  assert status == local.EXIT_BUILDER_FAILED
  assert _marker(tmp_path, "builder", "sigint")
  assert "did not finish within 0.5s" in capfd.readouterr().err


def test_group_leftovers_are_killed(child, tmp_path, capfd):
  status = _run(tmp_path, child("trainer", 0, 0, "--grandchild"), None)
  assert status == 0
  assert _gone(_pid(tmp_path, "trainer", "grandchild"))
  capfd.readouterr()


def test_unknown_program(child, tmp_path, capfd):
  status = _run(tmp_path, child("trainer", 60), ["/nonexistent/builder"])
  assert status == local.EXIT_CANNOT_START
  err = capfd.readouterr().err
  assert "cannot start the builder" in err
  assert "trainer stopped:" in err  # the one that did start is stopped (maybe before its pid file)


class _Launcher:
  """`python -m realm_jax_launch.local ...` as a subprocess, its output collected line by
  line."""

  def __init__(self, args):
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    self.proc = subprocess.Popen([sys.executable, "-m", "realm_jax_launch.local", *args], cwd=REPO,
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
    self.lines = queue.Queue()
    self.seen = []
    self.reader = threading.Thread(target=self._read, daemon=True)
    self.reader.start()

  def _read(self):
    for line in self.proc.stdout:
      self.lines.put(line.rstrip("\n"))

  def wait_for(self, *texts, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not all(any(t in line for line in self.seen) for t in texts):
      remaining = deadline - time.monotonic()
      assert remaining > 0, f"never saw {texts}; output so far: {self.seen}"
      try:
        self.seen.append(self.lines.get(timeout=remaining))
      except queue.Empty:
        pass

  def finish(self, timeout=120.0):
    """The launcher's exit status, once it has exited and all its output is in `seen`."""
    status = self.proc.wait(timeout)
    self.reader.join(5)
    while not self.lines.empty():
      self.seen.append(self.lines.get())
    return status


def _launcher_args(tmp_path, trainer, builder, grace):
  return ["--log_dir", str(tmp_path / "logs"), "--trainer", shlex.join(trainer),
          "--builder", shlex.join(builder), "--grace_seconds", str(grace)]


def test_sigint_to_launcher_stops_both(child, tmp_path):
  launcher = _Launcher(_launcher_args(tmp_path, child("trainer", 60), child("builder", 60), 10))
  try:
    launcher.wait_for("[trainer] trainer ready", "[builder] builder ready")
    launcher.proc.send_signal(signal.SIGINT)
    status = launcher.finish()
  finally:
    if launcher.proc.poll() is None:
      launcher.proc.kill()
  assert status == 130
  for name in ("trainer", "builder"):
    assert _marker(tmp_path, name, "sigint"), name  # each got SIGINT and shut down cleanly
    assert not _alive(_pid(tmp_path, name)), name
  assert any("got SIGINT; stopping" in line for line in launcher.seen)
  assert launcher.seen[-1].endswith("-> status 130")


def test_sigterm_to_launcher_also_forwards_sigint(child, tmp_path):
  launcher = _Launcher(_launcher_args(tmp_path, child("trainer", 60), child("builder", 60), 10))
  try:
    launcher.wait_for("[trainer] trainer ready", "[builder] builder ready")
    launcher.proc.send_signal(signal.SIGTERM)
    status = launcher.finish()
  finally:
    if launcher.proc.poll() is None:
      launcher.proc.kill()
  assert status == 143  # 128 + SIGTERM: the status says what stopped it
  assert _marker(tmp_path, "trainer", "sigint") and _marker(tmp_path, "builder", "sigint")


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="PR_SET_PDEATHSIG is Linux's; elsewhere the docstring says so")
def test_children_die_with_a_launcher_killed_outright(child, tmp_path):
  launcher = _Launcher(_launcher_args(tmp_path, child("trainer", 60), child("builder", 60), 10))
  try:
    launcher.wait_for("[trainer] trainer ready", "[builder] builder ready")
    launcher.proc.send_signal(signal.SIGKILL)  # no finally, no stop sequence: only the kernel
    assert launcher.finish() == -signal.SIGKILL
    for name in ("trainer", "builder"):
      assert _gone(_pid(tmp_path, name), timeout=30), f"the {name} outlived its launcher"
  finally:
    for name in ("trainer", "builder"):
      if (tmp_path / f"{name}.pid").exists() and _alive(_pid(tmp_path, name)):
        os.kill(_pid(tmp_path, name), signal.SIGKILL)


def _sigint_ignored():
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_stop_reaches_a_child_whatever_sigint_its_parent_inherited(child, tmp_path):
  # The parent ignores SIGINT, as a job started from a background shell does; without
  # tied_to_parent the child would inherit that, ignore the stop's SIGINT and be SIGKILLed.
  script = (f"import signal, subprocess, sys\n"
            f"sys.path.insert(0, {str(REPO)!r})\n"
            f"from launch import local\n"
            f"assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN\n"
            f"proc = subprocess.Popen(local.tied_to_parent(sys.argv[1:]))\n"
            f"import time, os\n"
            f"while not os.path.exists({str(tmp_path / 'trainer.pid')!r}): time.sleep(0.01)\n"
            f"time.sleep(0.5)\n"
            f"print(local.stop_processes([proc], grace_seconds=20))\n")
  parent = subprocess.run([sys.executable, "-c", script, *child("trainer", 60)],
                          preexec_fn=_sigint_ignored, capture_output=True, text=True, timeout=120)
  assert parent.returncode == 0, parent.stderr
  pid = _pid(tmp_path, "trainer")
  assert parent.stdout.strip().splitlines()[-1] == f"[({pid}, 'exit 130')]"
  assert _marker(tmp_path, "trainer", "sigint")


def test_child_ignoring_sigint_is_killed_after_grace(child, tmp_path):
  launcher = _Launcher(_launcher_args(tmp_path, child("trainer", 60),
                                      child("builder", 60, 0, "--ignore-sigint"), 1))
  try:
    launcher.wait_for("[trainer] trainer ready", "[builder] builder ready")
    start = time.monotonic()
    launcher.proc.send_signal(signal.SIGINT)
    status = launcher.finish()
    elapsed = time.monotonic() - start
  finally:
    if launcher.proc.poll() is None:
      launcher.proc.kill()
  assert status == 130
  assert elapsed >= 1.0  # the grace period was given
  assert _marker(tmp_path, "trainer", "sigint")
  assert not _marker(tmp_path, "builder", "sigint")
  assert not _alive(_pid(tmp_path, "trainer")) and not _alive(_pid(tmp_path, "builder"))
  assert any("builder still running after SIGINT; sending SIGKILL" in line
             for line in launcher.seen)
  assert "builder stopped: killed by SIGKILL" in launcher.seen[-1]


def test_dry_run_prints_both_commands(no_subprocess, capsys):
  trainer = ("python -m realm_jax.train --gin_file=gin_configs/experiments/toy_pretrain.gin "
             "--gin.RUN_DIR=\"'/tmp/realm toy/pretrain'\"")
  builder = ("python -m realm_jax.build_index --gin_file=gin_configs/runs/build_index.gin "
             "--gin.RUN_DIR=\"'/tmp/realm toy/pretrain'\"")
  status = local.main(["--dry-run", "--trainer", trainer, "--builder", builder,
                       "--builder_env", "JAX_PLATFORMS=cpu", "--trainer_env",
                       "CUDA_VISIBLE_DEVICES=0,1"])
  assert status == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 2
  assert shlex.split(lines[0]) == ["CUDA_VISIBLE_DEVICES=0,1", *shlex.split(trainer)]
  assert shlex.split(lines[1]) == ["JAX_PLATFORMS=cpu", *shlex.split(builder)]
  assert "--gin.RUN_DIR='/tmp/realm toy/pretrain'" in shlex.split(lines[0])


def test_cli_usage_errors(capsys):
  with pytest.raises(SystemExit) as e:
    local.main(["--trainer", "python -c pass"])  # no --run_dir / --log_dir
  assert e.value.code == 2
  with pytest.raises(SystemExit) as e:
    local.main(["--dry-run", "--trainer", "python", "--builder_env", "NOEQUALS"])
  assert e.value.code == 2
  assert "expected KEY=VALUE" in capsys.readouterr().err


def test_cli_run_dir_puts_logs_under_it(child, tmp_path, capfd):
  status = local.main(["--run_dir", str(tmp_path / "run"), "--trainer",
                       shlex.join(child("trainer", 0))])
  assert status == 0
  assert "trainer done" in (tmp_path / "run" / "logs" / "trainer.log").read_text()
  capfd.readouterr()


def test_durations_are_the_progress_helpers():
  assert local.format_duration(187) == "0:03:07"


@pytest.mark.parametrize("training_done", [True, False])
def test_a_builder_done_before_the_trainer_is_reported_for_what_it_is(child, tmp_path, capfd,
                                                                      training_done):
  run_dir = tmp_path / "run"
  run_dir.mkdir()
  if training_done:  # the trainer marked training done and is still finishing (final eval)
    (run_dir / local.TRAINING_DONE).write_text("")
  assert _run(tmp_path, child("trainer", 1.0), child("builder", 0), run_dir=str(run_dir)) == 0
  err = capfd.readouterr().err
  if training_done:
    assert ("launch: the builder indexed the last checkpoint and exited (status 0); the trainer "
            "is finishing") in err
  else:
    assert "exited (status 0) while the trainer runs (a builder run with --once?)" in err


def test_the_launchers_marker_name_is_the_trainers():
  from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  assert local.TRAINING_DONE == checkpoints.TRAINING_DONE
