"""realm_jax_launch.tpu_pod: every subcommand's dry run prints the expected gcloud commands and runs
nothing; real runs go through subprocess.run in order (gcloud faked); the remote shell snippets
(pid files, exec, nohup, stop) run for real in a local bash; worker-exec initializes JAX's
distributed runtime before the entry point (JAX faked)."""

import os
import shlex
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from launch import local
from launch import tpu_pod

REPO = Path(__file__).resolve().parents[2]
ZONE = "us-central2-b"


def _dry(capsys, *argv):
  """Runs `tpu_pod <argv> --dry-run`; returns the printed commands as argv lists (comments
  dropped) and the comment lines."""
  status = tpu_pod.main([*argv, "--dry-run"])
  out = capsys.readouterr().out
  assert status == 0, out
  lines = out.splitlines()
  return ([shlex.split(line) for line in lines if not line.startswith("#")],
          [line for line in lines if line.startswith("#")])


def _remote(cmd):
  """The remote shell line of an ssh command, split like the worker's shell would."""
  (command,) = [arg for arg in cmd if arg.startswith("--command=")]
  return shlex.split(command[len("--command="):])


def _check_gcloud(cmd, verb, tpu):
  assert cmd[:5] == ["gcloud", "compute", "tpus", "tpu-vm", verb]
  assert tpu in cmd or f"{tpu}:{tpu_pod.DEFAULT_REMOTE_DIR}" in cmd
  assert f"--zone={ZONE}" in cmd


def test_create_dry_run(no_subprocess, capsys):
  commands, _ = _dry(capsys, "create", f"--zone={ZONE}", "--name=exp", "--trainer_type=v4-64",
                     "--builder_type=v4-16", "--spot", "--project=my-project")
  assert len(commands) == 2
  for cmd, tpu, accelerator in ((commands[0], "exp-trainer", "v4-64"),
                                (commands[1], "exp-builder", "v4-16")):
    _check_gcloud(cmd, "create", tpu)
    assert cmd[5] == tpu
    assert f"--accelerator-type={accelerator}" in cmd
    assert f"--version={tpu_pod.DEFAULT_VERSION}" in cmd
    assert "--spot" in cmd and "--project=my-project" in cmd
    assert "--internal-ips" not in cmd


def test_create_defaults_and_internal_ips(no_subprocess, capsys):
  commands, _ = _dry(capsys, "create", f"--zone={ZONE}", "--internal_ip",
                     "--builder_version=v2-alpha-tpuv5-lite")
  assert "--accelerator-type=v3-64" in commands[0] and "realm-trainer" in commands[0]
  assert "--accelerator-type=v3-16" in commands[1] and "realm-builder" in commands[1]
  assert "--version=v2-alpha-tpuv5-lite" in commands[1]
  assert all("--internal-ips" in cmd for cmd in commands)


def test_copy_dry_run(no_subprocess, capsys):
  commands, _ = _dry(capsys, "copy", f"--zone={ZONE}", "--internal_ip")
  assert len(commands) == 6
  for i, tpu in ((0, "realm-trainer"), (3, "realm-builder")):
    clean, scp, install = commands[i:i + 3]
    _check_gcloud(clean, "ssh", tpu)
    assert _remote(clean) == ["rm", "-rf", "$HOME/realm_jax"]
    _check_gcloud(scp, "scp", tpu)
    assert "--recurse" in scp and str(REPO) in scp and f"{tpu}:realm_jax" in scp
    _check_gcloud(install, "ssh", tpu)
    script = " ".join(_remote(install))
    assert "-m venv $HOME/realm_venv" in script
    assert "cd $HOME/realm_jax;" in script
    assert f"pip install -q -e . jax[tpu]=={tpu_pod.pinned_jax_version()}" in script
    for cmd in (clean, scp, install):
      assert "--worker=all" in cmd and "--internal-ip" in cmd


def test_copy_refuses_unsafe_remote_dir(no_subprocess, capsys):
  for bad in ("..", ".", "/home/me", "a/../..", ""):
    assert tpu_pod.main(["copy", f"--zone={ZONE}", f"--remote_dir={bad}", "--dry-run"]) == 2
  assert "expected a plain path" in capsys.readouterr().err


RUN = ["run", f"--zone={ZONE}", "--run_dir=/mnt/realm/pretrain",
       "--block_store=/mnt/realm/wiki_blocks",
       "--trainer_gin=gin_configs/experiments/wiki_pretrain.gin",
       # (argv as the shell hands it over from --trainer_binding=INIT_CHECKPOINT="'...'")
       "--trainer_binding=INIT_CHECKPOINT='/mnt/realm/ict/checkpoints/100000'",
       "--trainer_binding=BATCH_SIZE=64"]


def test_run_dry_run_foreground(no_subprocess, capsys):
  commands, comments = _dry(capsys, *RUN)
  trainer, builder, stop_trainer, stop_builder = commands
  _check_gcloud(trainer, "ssh", "realm-trainer")
  _check_gcloud(builder, "ssh", "realm-builder")
  for cmd in commands:
    assert "--worker=all" in cmd
  t = _remote(trainer)
  assert t[t.index("exec") + 1:t.index("exec") + 6] == [
      "$HOME/realm_venv/bin/python", "-m", "realm_jax_launch.tpu_pod", "worker-exec", "realm_jax.train"]
  assert "--gin_file=gin_configs/experiments/wiki_pretrain.gin" in t
  assert '--gin.RUN_DIR="/mnt/realm/pretrain"' in t
  assert '--gin.BLOCK_STORE="/mnt/realm/wiki_blocks"' in t
  assert "--gin.INIT_CHECKPOINT='/mnt/realm/ict/checkpoints/100000'" in t
  assert "--gin.BATCH_SIZE=64" in t
  b = _remote(builder)
  assert "realm_jax.build_index" in b and "realm_jax.train" not in b
  assert "--gin_file=gin_configs/runs/build_index.gin" in b
  assert '--gin.RUN_DIR="/mnt/realm/pretrain"' in b  # the same run directory
  assert '--gin.BLOCK_STORE="/mnt/realm/wiki_blocks"' in b
  assert "--once" not in b
  assert comments and "Ctrl-C" in comments[0]
  assert "realm-trainer" in stop_trainer and "kill" in _remote(stop_trainer)
  assert "realm-builder" in stop_builder and "$HOME/.realm_jax_builder.pid" in " ".join(
      _remote(stop_builder))


def test_run_dry_run_first_index_detached_no_distributed(no_subprocess, capsys):
  commands, comments = _dry(capsys, *RUN, "--first_index_from=/mnt/realm/ict/checkpoints/100000",
                            "--detach", "--no-jax_distributed",
                            "--builder_binding=build_index_main.dtype='bfloat16'")
  first, trainer, builder = commands
  assert not comments  # detached: nothing runs after the pair is started
  _check_gcloud(first, "ssh", "realm-builder")
  f = _remote(first)
  assert "--once" in f
  assert '--gin.build_index_main.checkpoint_dir="/mnt/realm/ict/checkpoints/100000"' in f
  for cmd, module in ((trainer, "realm_jax.train"), (builder, "realm_jax.build_index")):
    r = _remote(cmd)
    assert "nohup" in r and "worker-exec" not in r
    assert r[r.index("nohup") + 1:r.index("nohup") + 4] == [
        "$HOME/realm_venv/bin/python", "-m", module]
  assert "--gin.build_index_main.dtype='bfloat16'" in _remote(builder)


@pytest.mark.parametrize("flag,value,message", [
    ("--run_dir", "gs://bucket/realm/pretrain", "URLs do not work"),
    ("--block_store", "relative/blocks", "absolute path"),
    ("--trainer_gin", "gin_configs/experiments/nope.gin", "not found"),
    ("--trainer_binding", "NO_EQUALS", "expected KEY=VALUE"),
])
def test_run_usage_errors(no_subprocess, capsys, flag, value, message):
  argv = [arg for arg in RUN if not arg.startswith(flag + "=")] + [f"{flag}={value}"]
  assert tpu_pod.main([*argv, "--dry-run"]) == 2
  captured = capsys.readouterr()
  assert message in captured.err and not captured.out


def test_stop_and_teardown_dry_run(no_subprocess, capsys):
  stops, _ = _dry(capsys, "stop", f"--zone={ZONE}", "--trainer_tpu=a", "--builder_tpu=b",
                  "--kill")
  assert [cmd[5] for cmd in stops] == ["a", "b"]
  assert all("--worker=all" in cmd and "kill -KILL $pid" in " ".join(_remote(cmd))
             for cmd in stops)
  deletes, _ = _dry(capsys, "teardown", f"--zone={ZONE}", "--name=exp")
  assert deletes == [
      ["gcloud", "compute", "tpus", "tpu-vm", "delete", "exp-trainer", "--quiet",
       f"--zone={ZONE}"],
      ["gcloud", "compute", "tpus", "tpu-vm", "delete", "exp-builder", "--quiet",
       f"--zone={ZONE}"]]


def test_same_slice_for_both_is_refused(no_subprocess, capsys):
  assert tpu_pod.main(["teardown", f"--zone={ZONE}", "--trainer_tpu=x", "--builder_tpu=x",
                       "--dry-run"]) == 2
  assert "two slices" in capsys.readouterr().err


@pytest.fixture
def fake_gcloud(monkeypatch):
  """subprocess.run records the commands; statuses come from `fail` (argv[4:6] -> status)."""
  calls, fail = [], {}

  def run(cmd, check=False):
    calls.append(cmd)
    return subprocess.CompletedProcess(cmd, fail.get(tuple(cmd[4:6]), 0))

  monkeypatch.setattr(subprocess, "run", run)
  return calls, fail


def test_commands_run_in_order_and_stop_at_a_failure(fake_gcloud, capsys):
  calls, fail = fake_gcloud
  assert tpu_pod.main(["create", f"--zone={ZONE}"]) == 0
  assert [cmd[4:6] for cmd in calls] == [["create", "realm-trainer"], ["create", "realm-builder"]]
  printed = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
  assert printed == calls  # each command is printed as it runs
  calls.clear()
  fail[("create", "realm-trainer")] = 1
  assert tpu_pod.main(["create", f"--zone={ZONE}"]) == 1
  assert len(calls) == 1  # no builder slice without a trainer slice
  calls.clear()
  fail[("delete", "realm-trainer")] = 1
  assert tpu_pod.main(["teardown", f"--zone={ZONE}"]) == 1
  assert [cmd[4:6] for cmd in calls] == [["delete", "realm-trainer"], ["delete", "realm-builder"]]
  assert "failed with status 1" in capsys.readouterr().err


def test_gcloud_missing(monkeypatch, capsys):
  def run(cmd, check=False):
    raise FileNotFoundError(2, "No such file or directory", cmd[0])

  monkeypatch.setattr(subprocess, "run", run)
  assert tpu_pod.main(["teardown", f"--zone={ZONE}"]) == tpu_pod.EXIT_NO_GCLOUD
  assert "install the Google Cloud CLI" in capsys.readouterr().err


def test_foreground_run_stops_the_workers_when_the_pair_fails(fake_gcloud, monkeypatch, tmp_path,
                                                              capsys):
  calls, _ = fake_gcloud
  pairs = []

  def run_local(trainer_cmd, builder_cmd, **kwargs):
    pairs.append((trainer_cmd, builder_cmd, kwargs))
    return 130

  monkeypatch.setattr(local, "run_local", run_local)
  status = tpu_pod.main([*RUN, f"--log_dir={tmp_path}", "--builder_timeout=-1"])
  assert status == 130
  (trainer, builder, kwargs), = pairs
  assert trainer[4:6] == ["ssh", "realm-trainer"] and builder[4:6] == ["ssh", "realm-builder"]
  assert kwargs["log_dir"] == str(tmp_path) and kwargs["builder_timeout"] is None
  assert [cmd[4:6] for cmd in calls] == [["ssh", "realm-trainer"], ["ssh", "realm-builder"]]
  assert all("kill -INT $pid" in " ".join(_remote(cmd)) for cmd in calls)
  capsys.readouterr()


# A worker's command: like every `python -m realm_jax.*`, its work runs through
# `gin_utils.run_command`, which turns SIGINT into a clean exit 130 whatever it inherited.
REMOTE_CHILD = r'''
import os, sys, time
from realm_jax import gin_utils
out = sys.argv[1]
print("started", os.getpid(), flush=True)

def work():
  try:
    time.sleep(60)
  except KeyboardInterrupt:
    open(os.path.join(out, "sigint"), "w").write(str(os.getpid()))
    raise
  return 0

sys.exit(gin_utils.run_command("standin", work, interrupted="stopped"))
'''


def _sigint_ignored():
  """In the child before exec: SIGINT ignored, the hardest thing a worker's command can
  inherit (a shell without job control starts background commands so; a suite started from a
  background shell runs so). The stop script must reach it all the same."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def _bash(script, home, **kwargs):
  env = dict(os.environ, HOME=str(home))
  return subprocess.Popen(["bash", "-c", script], env=env, preexec_fn=_sigint_ignored,
                          **kwargs)


def _wait_for(path, timeout=60.0):
  deadline = time.monotonic() + timeout
  while not (path.exists() and path.read_text().strip()):
    assert time.monotonic() < deadline, f"{path} never appeared"
    time.sleep(0.02)
  return path.read_text().strip()


@pytest.fixture
def worker_home(tmp_path):
  """A fake worker home: ~/realm_jax and a stand-in whose command line contains realm_jax."""
  home = tmp_path / "home"
  (home / "realm_jax").mkdir(parents=True)
  script = home / "realm_jax" / "realm_jax_standin.py"
  script.write_text(REMOTE_CHILD)
  command = shlex.join([sys.executable, str(script), str(tmp_path)])
  return home, command


def test_foreground_script_pid_file_and_stop(worker_home, tmp_path):
  home, command = worker_home
  proc = _bash(tpu_pod.foreground_script("trainer", command, remote_dir="realm_jax"), home,
               stdout=subprocess.PIPE, text=True)
  try:
    assert proc.stdout.readline().split()[0] == "started"
    pid = int(_wait_for(home / ".realm_jax_trainer.pid"))
    assert pid == proc.pid  # exec: the recorded pid is the process itself
    stop = subprocess.run(["bash", "-c", tpu_pod.stop_script("trainer")],
                          env=dict(os.environ, HOME=str(home)), capture_output=True, text=True)
    assert stop.returncode == 0 and f"sent SIGINT to the trainer (pid {pid})" in stop.stdout
    assert proc.wait(60) == 130
    assert _wait_for(tmp_path / "sigint") == str(pid)
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.stdout.close()


def test_detached_script_returns_and_stop_reaches_it(worker_home, tmp_path):
  home, command = worker_home
  started = subprocess.run(["bash", "-c", tpu_pod.detached_script("builder", command,
                                                                  remote_dir="realm_jax")],
                           env=dict(os.environ, HOME=str(home)), capture_output=True, text=True,
                           timeout=60, preexec_fn=_sigint_ignored)
  assert started.returncode == 0 and "builder started on" in started.stdout
  pid = int(_wait_for(home / ".realm_jax_builder.pid"))
  try:
    _wait_for(home / "realm_jax_builder.log")  # its output goes to the log
    assert f"started {pid}" in (home / "realm_jax_builder.log").read_text()
    subprocess.run(["bash", "-c", tpu_pod.stop_script("builder")],
                   env=dict(os.environ, HOME=str(home)), check=True, capture_output=True)
    assert _wait_for(tmp_path / "sigint") == str(pid)
  finally:
    try:
      os.kill(pid, 9)
    except ProcessLookupError:
      pass


def test_stop_leaves_an_unrelated_process_alone(tmp_path):
  home = tmp_path / "home"
  home.mkdir()
  other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    (home / ".realm_jax_trainer.pid").write_text(str(other.pid))  # a stale, reused pid
    stop = subprocess.run(["bash", "-c", tpu_pod.stop_script("trainer")],
                          env=dict(os.environ, HOME=str(home)), capture_output=True, text=True)
    assert stop.returncode == 0 and "sent" not in stop.stdout
    assert other.poll() is None
  finally:
    other.kill()
    other.wait()


def test_worker_exec_initializes_jax_first(monkeypatch, tmp_path, capsys):
  events = []
  fake_jax = types.ModuleType("jax")
  fake_jax.distributed = types.SimpleNamespace(initialize=lambda: events.append("initialize"))
  monkeypatch.setitem(sys.modules, "jax", fake_jax)
  (tmp_path / "fake_entry.py").write_text(
      "import sys\n"
      "import jax\n"
      "jax.distributed.initialize  # the wrapper's call came first\n"
      "print('entry', sys.argv[1:])\n"
      "sys.exit(7)\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(sys, "argv", list(sys.argv))
  real_run_module = tpu_pod.runpy.run_module

  def run_module(name, **kwargs):
    events.append(f"run {name}")
    return real_run_module(name, **kwargs)

  monkeypatch.setattr(tpu_pod.runpy, "run_module", run_module)
  with pytest.raises(SystemExit) as e:
    tpu_pod.main(["worker-exec", "fake_entry", "--gin_file=x.gin", "--once"])
  assert e.value.code == 7
  assert events == ["initialize", "run fake_entry"]
  assert "entry ['--gin_file=x.gin', '--once']" in capsys.readouterr().out
