r"""Runs the REALM trainer and its index builder side by side on one machine.

  python -m realm_jax_launch.local --run_dir=RUN_DIR --trainer "python -m realm_jax.train ..." \
      --builder "python -m realm_jax.build_index ..." [--trainer_env K=V] [--dry-run]

or from Python `run_local(trainer_cmd, builder_cmd, log_dir=...)`. Each child runs in its own
process group, its output teed to the console (`[trainer] ...`) and `<log_dir>/trainer.log`; a
failed trainer, Ctrl-C, SIGTERM or SIGHUP stops both (SIGINT, then SIGKILL after
`grace_seconds`), and no child outlives the launcher (`tied_to_parent`). `LocalRunner` runs a
recipe's stages (`realm_jax.pipeline`) here. Lifecycle and exit statuses: launch/README.md;
design notes: docs/design/tasks_and_launch.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Mapping, Optional, Sequence

from realm_jax.progress import format_duration

PROG = "launch"
EXIT_USAGE = 2
EXIT_BUILDER_FAILED = 3
EXIT_CANNOT_START = 127
EXIT_INTERRUPTED = 130
DEFAULT_GRACE_SECONDS = 30.0
# A paper-scale re-embedding of the final checkpoint takes hours; the toy world's, seconds.
DEFAULT_BUILDER_TIMEOUT = 1800.0
_POLL_SECONDS = 0.05
# The trainer's training-done marker in its run directory (realm_jax.checkpoints;
# named here so that the launcher does not import JAX).
TRAINING_DONE = "TRAINING_DONE"
_PUMP_JOIN_SECONDS = 5.0  # how long to wait for a child's last output once it has exited
# glibc malloc settings for a JAX job on a CPU: one arena, no mmap, no trimming, so that the
# memory XLA frees after a step is reused by the next instead of being faulted in afresh
# (figures: docs/design/tasks_and_launch.md). They must be set before the process starts its
# threads, so the launcher sets them (`env_trainer`, `--trainer_env`); the peak heap stays.
ALLOCATOR_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0",
                 "MALLOC_TRIM_THRESHOLD_": "4294967296"}


# The exec wrapper each child starts through (`tied_to_parent`; -S: the standard library only).
# Not a `preexec_fn`, which would run Python between fork and exec in a parent that may run
# threads (JAX's, in the recipe).
_TIE_TO_PARENT = r"""
import ctypes, os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
if sys.platform.startswith("linux"):
  ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
  sys.exit(128 + signal.SIGTERM)
try:
  os.execvp(sys.argv[2], sys.argv[2:])
except OSError as e:
  print(f"cannot start {sys.argv[2]}: {e}", file=sys.stderr, flush=True)
  sys.exit(127)
"""


def tied_to_parent(cmd: Sequence[str]) -> list[str]:
  """`cmd` started so that it can be stopped and does not outlive this process (the launcher's
  children and the recipe's stages start so), through a small exec wrapper: SIGINT back at its
  default disposition, and on Linux SIGTERM from the kernel when this process's starting thread
  ends, however it ends (PR_SET_PDEATHSIG). Elsewhere a killed parent's children run on. The
  pid is the command's own (exec).

  Raises:
    FileNotFoundError: the program is not found (on the PATH), so nothing is started.
  """
  cmd = list(cmd)
  if not cmd or shutil.which(cmd[0]) is None:
    raise FileNotFoundError(f"no such program: {cmd[0] if cmd else '(empty command)'}")
  return [sys.executable, "-S", "-c", _TIE_TO_PARENT, str(os.getpid()), *cmd]


def stop_processes(procs: Sequence[subprocess.Popen], *,
                   grace_seconds: float = DEFAULT_GRACE_SECONDS) -> list[tuple[int, str]]:
  """Stops the processes still running among `procs` as the launcher stops its children: SIGINT
  to each (the entry points exit cleanly on it), SIGKILL to any still running after
  `grace_seconds`; returns once all have ended.

  Returns:
    (pid, what ended it: "exit 130", "killed by SIGKILL after SIGINT", ...) of each process
    that was still running.
  """
  live = [p for p in procs if p.poll() is None]
  for proc in live:
    try:
      proc.send_signal(signal.SIGINT)
    except ProcessLookupError:
      pass
  deadline = time.monotonic() + grace_seconds
  while any(p.poll() is None for p in live) and time.monotonic() < deadline:
    time.sleep(_POLL_SECONDS)
  outcome = []
  for proc in live:
    killed = proc.poll() is None
    if killed:
      proc.kill()
    returncode = proc.wait()
    what = (f"killed by {signal.Signals(-returncode).name}" if returncode < 0
            else f"exit {returncode}")
    outcome.append((proc.pid, f"{what} after SIGINT" if killed else what))
  return outcome


def exit_status(returncode: int) -> int:
  """A Popen return code as a shell exit status (killed by signal N -> 128 + N)."""
  return 128 - returncode if returncode < 0 else returncode


def shell_line(cmd: Sequence[str], env: Optional[Mapping[str, str]] = None) -> str:
  """`cmd` (with `env` assignments in front) as one shell-quoted line."""
  assignments = [f"{key}={shlex.quote(str(value))}" for key, value in (env or {}).items()]
  return " ".join(assignments + [shlex.join(cmd)])


class _Child:
  """One child process: started in its own process group, output teed to console and log."""

  def __init__(self, name: str, cmd: Sequence[str], env: Optional[Mapping[str, str]],
               log_path: str, console: IO[str], lock: threading.Lock):
    self.name = name
    self.cmd = list(cmd)
    self.env_overrides = dict(env or {})
    self.log_path = log_path
    self.console = console
    self.lock = lock
    self.proc: Optional[subprocess.Popen] = None
    self.started = self.ended = 0.0
    self.stopped = False  # the launcher stopped it (SIGINT, then maybe SIGKILL)
    self.console_ok = True
    self._log: Optional[IO[bytes]] = None
    self._pump: Optional[threading.Thread] = None

  def start(self) -> None:
    """Starts the process and the thread that copies its output."""
    env = dict(os.environ)
    # Children write to a pipe: without this, Python block-buffers their stdout and lines
    # would reach the console minutes late.
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update({key: str(value) for key, value in self.env_overrides.items()})
    self._log = open(self.log_path, "ab")  # appended: a resumed run keeps its history
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    self._log.write(f"=== {PROG} {stamp}: {shell_line(self.cmd, self.env_overrides)}\n"
                    .encode())
    self._log.flush()
    # process_group=0: the child leads a new group, so the launcher can signal the child and
    # everything it spawns at once, and a terminal's Ctrl-C reaches only the launcher (which
    # forwards exactly one SIGINT) instead of every process twice.
    self.proc = subprocess.Popen(tied_to_parent(self.cmd), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                 process_group=0)
    self.started = time.monotonic()
    self._pump = threading.Thread(target=self._copy_output, name=f"{self.name}-output",
                                  daemon=True)
    self._pump.start()

  def _copy_output(self) -> None:
    prefix = f"[{self.name}] "
    for raw in iter(self.proc.stdout.readline, b""):
      line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
      if self.console_ok:
        with self.lock:
          try:
            self.console.write(prefix + line + "\n")
            self.console.flush()
          except (OSError, ValueError):
            # The terminal went away: keep draining the pipe (a full pipe would block the
            # child) and keep logging.
            self.console_ok = False
      self._log.write(raw if raw.endswith(b"\n") else raw + b"\n")
      self._log.flush()

  @property
  def pid(self) -> int:
    return self.proc.pid

  def poll(self) -> Optional[int]:
    """The return code once the process has exited (its group's leftovers then killed)."""
    returncode = self.proc.poll()
    if returncode is not None and not self.ended:
      self.ended = time.monotonic()
      # Leftover grandchildren would outlive the launcher holding devices: kill them now, while
      # the group id cannot have been reused (it is still in use if any member is alive).
      self.signal_group(signal.SIGKILL)
    return returncode

  def running(self) -> bool:
    return self.poll() is None

  def signal_group(self, sig: int) -> None:
    """Sends `sig` to the child's whole process group (nothing if it is gone)."""
    try:
      os.killpg(self.proc.pid, sig)
    except (ProcessLookupError, PermissionError):
      pass

  def close(self) -> None:
    """Waits briefly for the last output lines, then closes the pipe and the log."""
    if self._pump is not None:
      self._pump.join(_PUMP_JOIN_SECONDS)
      if self._pump.is_alive():
        return  # something still holds the pipe open; the daemon thread ends with it
    if self.proc is not None and self.proc.stdout is not None:
      self.proc.stdout.close()
    if self._log is not None:
      self._log.close()

  def describe(self) -> str:
    """`trainer exit 0 in 12.3s`, `builder stopped: killed by SIGKILL in 40.1s`, ..."""
    returncode = self.proc.returncode
    if returncode is None:
      what = "still running"
    elif returncode < 0:
      what = f"killed by {signal.Signals(-returncode).name}"
    else:
      what = f"exit {returncode}"
    if self.stopped:
      what = f"stopped: {what}"
    wall = (self.ended or time.monotonic()) - self.started
    return f"{self.name} {what} in {format_duration(wall)}"


class _SignalFlag:
  """Records SIGINT/SIGTERM/SIGHUP to the launcher (SIGHUP: a closed terminal must not orphan
  the children either). The handler only counts; the supervisor loop runs the stop sequence, so
  it never runs inside a signal handler. Installed only in the main thread (Python's rule);
  elsewhere Ctrl-C arrives as KeyboardInterrupt and the `finally` of `run_local` still stops
  the children."""

  SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

  def __init__(self):
    self.count = 0
    self.last: Optional[int] = None
    self._previous: dict = {}

  def _handle(self, signum, frame) -> None:
    del frame
    self.count += 1
    self.last = signum

  def __enter__(self) -> "_SignalFlag":
    if threading.current_thread() is threading.main_thread():
      for sig in self.SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


class _Launcher:
  """The supervisor loop of `run_local` (the rules: launch/README.md)."""

  def __init__(self, trainer: _Child, builder: Optional[_Child], *, grace_seconds: float,
               builder_timeout: Optional[float], stop_on_builder_failure: bool,
               flag: _SignalFlag, lock: threading.Lock, err: IO[str],
               run_dir: Optional[str] = None):
    self.run_dir = run_dir
    self.trainer = trainer
    self.builder = builder
    self.children = [c for c in (trainer, builder) if c is not None]
    self.grace_seconds = grace_seconds
    self.builder_timeout = builder_timeout
    self.stop_on_builder_failure = stop_on_builder_failure
    self.flag = flag
    self.lock = lock
    self.err = err
    self.builder_failed = False
    self._builder_seen = False

  def say(self, *lines: str) -> None:
    """The launcher's own message, each line prefixed `launch: `."""
    with self.lock:
      try:
        for line in lines:
          self.err.write(f"{PROG}: {line}\n")
        self.err.flush()
      except (OSError, ValueError):
        pass  # no terminal any more; stopping the children matters more than saying so

  def stop(self, children: Sequence[_Child]) -> None:
    """SIGINT to each running child's group; SIGKILL after the grace period, or at once when
    another SIGINT/SIGTERM reaches the launcher meanwhile."""
    live = [c for c in children if c.running()]
    for child in live:
      child.stopped = True
      child.signal_group(signal.SIGINT)
    deadline = time.monotonic() + self.grace_seconds
    signals_before = self.flag.count
    while (any(c.running() for c in live) and time.monotonic() < deadline
           and self.flag.count == signals_before):
      time.sleep(_POLL_SECONDS)
    for child in live:
      if child.running():
        self.say(f"{child.name} still running after SIGINT; sending SIGKILL")
        child.signal_group(signal.SIGKILL)
        child.proc.wait()
        child.poll()

  def _check_builder(self) -> Optional[int]:
    """Reacts once to the builder's exit; returns a status to end the run with, or None."""
    if self.builder is None or self._builder_seen or self.builder.running():
      return None
    self._builder_seen = True
    returncode = self.builder.proc.returncode
    if returncode == 0:
      if self.trainer.running():  # after the trainer, exiting is the builder's job
        if self.run_dir and os.path.exists(os.path.join(self.run_dir, TRAINING_DONE)):
          self.say("the builder indexed the last checkpoint and exited (status 0); the trainer "
                   "is finishing")
        else:
          self.say("the builder exited (status 0) while the trainer runs (a builder run with "
                   "--once?); the index will not be refreshed any more")
      return None
    self.builder_failed = True
    banner = "!" * 72
    failed = f"INDEX BUILDER FAILED (status {exit_status(returncode)}); see {self.builder.log_path}"
    if not self.trainer.running():
      self.say(banner, failed, "the trainer had finished; its last checkpoint may not be indexed",
               banner)
      return None
    if self.stop_on_builder_failure:
      self.say(banner, failed, "stopping the trainer (--stop_on_builder_failure)", banner)
      self.stop([self.trainer])
      return EXIT_BUILDER_FAILED
    self.say(banner, failed, "the trainer goes on with its current index, which will only grow "
             "stale; restart the builder by hand to refresh it", banner)
    return None

  def supervise(self) -> int:
    """Runs until the outcome is decided; returns the launcher's exit status."""
    builder_deadline = None
    while True:
      if self.flag.count:
        name = signal.Signals(self.flag.last).name
        self.say(f"got {name}; stopping (SIGINT to both, SIGKILL after "
                 f"{format_duration(self.grace_seconds)}; Ctrl-C again to kill at once)")
        self.stop(self.children)
        return 128 + self.flag.last
      status = self._check_builder()
      if status is not None:
        return status
      trainer_code = self.trainer.poll()
      if trainer_code is not None and trainer_code != 0:
        self.say(f"the trainer failed (status {exit_status(trainer_code)}); stopping the builder")
        if self.builder is not None:
          self.stop([self.builder])
        return exit_status(trainer_code)
      if trainer_code == 0:
        if self.builder is None or not self.builder.running():
          return EXIT_BUILDER_FAILED if self.builder_failed else 0
        if builder_deadline is None:
          timeout = self.builder_timeout
          builder_deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
          limit = "no time limit" if timeout is None else f"up to {format_duration(timeout)}"
          self.say(f"the trainer is done; waiting ({limit}) for the builder to index the last "
                   f"checkpoint and exit")
        elif time.monotonic() >= builder_deadline:
          self.say(f"the builder did not finish within {format_duration(self.builder_timeout)} "
                   f"of the trainer; stopping it (the last checkpoint may not be indexed)")
          self.stop([self.builder])
          self._builder_seen = True
          return EXIT_BUILDER_FAILED
      time.sleep(_POLL_SECONDS)


def run_local(trainer_cmd: Sequence[str], builder_cmd: Optional[Sequence[str]] = None, *,
              log_dir: str, env_trainer: Optional[Mapping[str, str]] = None,
              env_builder: Optional[Mapping[str, str]] = None,
              grace_seconds: float = DEFAULT_GRACE_SECONDS,
              builder_timeout: Optional[float] = DEFAULT_BUILDER_TIMEOUT,
              stop_on_builder_failure: bool = False, console: Optional[IO[str]] = None,
              err: Optional[IO[str]] = None, run_dir: Optional[str] = None) -> int:
  """Runs the trainer and (optionally) the index builder side by side until both are done;
  returns the exit status (launch/README.md).

  Args:
    trainer_cmd, builder_cmd: the two argvs (builder None: the trainer alone, still teed and
      stopped cleanly on Ctrl-C).
    log_dir: where `trainer.log` and `builder.log` are appended (created if needed).
    env_trainer, env_builder: that child's own environment on top of the launcher's, e.g. the
      device split (`CUDA_VISIBLE_DEVICES`, `JAX_PLATFORMS=cpu` for a builder on the CPU).
    builder_timeout: seconds the builder may run on after the trainer exits 0 (None: no limit).
    stop_on_builder_failure: a builder failure stops the trainer too (default: it goes on).
    console, err: the prefixed child output's stream and the launcher's own (default stdout,
      stderr).
    run_dir: the run directory, when known: a builder that exits because training is done is
      then told from one that stopped early.
  """
  console = console or sys.stdout
  err = err or sys.stderr
  os.makedirs(log_dir, exist_ok=True)
  lock = threading.Lock()
  trainer = _Child("trainer", trainer_cmd, env_trainer, os.path.join(log_dir, "trainer.log"),
                   console, lock)
  builder = None
  if builder_cmd is not None:
    builder = _Child("builder", builder_cmd, env_builder, os.path.join(log_dir, "builder.log"),
                     console, lock)
  started = [c for c in (trainer, builder) if c is not None]
  status = EXIT_INTERRUPTED
  with _SignalFlag() as flag:
    launcher = _Launcher(trainer, builder, grace_seconds=grace_seconds,
                         builder_timeout=builder_timeout,
                         stop_on_builder_failure=stop_on_builder_failure, flag=flag, lock=lock,
                         err=err, run_dir=run_dir)
    running = []
    try:
      for child in started:
        try:
          child.start()
        except OSError as e:  # e.g. the program does not exist
          launcher.say(f"cannot start the {child.name} ({shlex.join(child.cmd)}): {e}")
          child.close()
          status = EXIT_CANNOT_START
          return status  # the finally below stops what already started
        running.append(child)
      launcher.say(f"started {', '.join(f'{c.name} (pid {c.pid})' for c in running)}; logs in "
                   f"{log_dir}")
      status = launcher.supervise()
    finally:
      # Reached on every path, including an exception or a KeyboardInterrupt outside the main
      # thread: nothing is left running.
      launcher.stop(running)
      for child in running:
        child.close()
      if running:
        summary = "; ".join(c.describe() for c in running)
        launcher.say(f"{summary} -> status {status}")
  return status


# ---------------------------------------------------------------------------------------------
# A recipe's stages on this machine (`realm_jax.pipeline`: `python -m realm_jax.recipe`).

# REALM_JAX_ALLOCATOR=system: the children keep glibc's malloc defaults. ALLOCATOR_ENV keeps each
# process's peak heap, which suits the toy model; a larger model's heap then grows past memory
# (docs/own_corpus.md, "With a real English BERT"), so the recipe chooses it for a BERT larger
# than the toy model's.
ALLOCATOR_CHOICE = "REALM_JAX_ALLOCATOR"
# What the console shows of a stage's output (the rest is in its log).
_PROGRESS = re.compile(r"step \d+/\d+|published index|: done|error|Error|dry run|evaluate: "
                       r"(toy_qa|ict_toy|((retrieval|bm25) )?qa_(regex_)?files_)|"
                       r"embedding: blocks [\d,]+/[\d,]+ \(100")


class Progress:
  """A file-like console for `run_local` and `run_children` that passes progress lines only,
  each without its log prefix (`short_line`)."""

  def __init__(self, stream: IO[str]):
    self._stream = stream
    self._partial = ""

  def write(self, text: str) -> int:
    self._partial += text
    *lines, self._partial = self._partial.split("\n")
    for line in lines:
      if _PROGRESS.search(line):
        self._stream.write(short_line(line) + "\n")
    return len(text)

  def flush(self) -> None:
    self._stream.flush()


def short_line(line: str) -> str:
  """A log line without its timestamp/level/logger prefix."""
  match = re.match(r"^(\[\w+\] )?\S+ \S+ (INFO|WARNING|ERROR) \S+: (.*)$", line)
  return f"{match.group(1) or ''}{match.group(3)}" if match else line


def compilation_cache_dir() -> str:
  """Where the children keep JAX's persistent compilation cache: jax_compilation_cache in the
  toy world's cache root (`toy_world.default_cache_root`)."""
  from realm_jax.data import toy_world  # pylint: disable=g-import-not-at-top
  return str(toy_world.default_cache_root() / "jax_compilation_cache")


def child_env() -> dict[str, str]:
  """A stage's settings on top of this environment, each unless set already: ALLOCATOR_ENV
  (none with REALM_JAX_ALLOCATOR=system) and JAX's persistent compilation cache
  (`compilation_cache_dir`), since every stage and every cell of a bench compiles the same
  steps again (figures: docs/design/tasks_and_launch.md)."""
  allocator = {} if os.environ.get(ALLOCATOR_CHOICE) == "system" else ALLOCATOR_ENV
  settings = {**allocator, "JAX_COMPILATION_CACHE_DIR": compilation_cache_dir()}
  return {key: value for key, value in settings.items() if key not in os.environ}


def run_children(children: Sequence[tuple[Sequence[str], str]], *, prog: str = PROG) -> None:
  """Runs independent children side by side, each to completion: each one's full output to its
  log, progress lines to the console (prefixed with the log's name when there are several).
  Raises RuntimeError naming every child that failed, after all have ended. Interrupted
  (`gin_utils.Interrupted`), it stops the children (`stop_processes`) before the interruption
  goes on; each child also dies with this process if it is killed outright (`tied_to_parent`).
  """
  lock = threading.Lock()
  console = Progress(sys.stdout)

  def copy(child: subprocess.Popen, log_path: str, prefix: str) -> None:
    with open(log_path, "a", encoding="utf-8") as log:
      for line in child.stdout:
        log.write(line)
        with lock:
          console.write(prefix + line)

  running = []
  try:
    for cmd, log_path in children:
      child = subprocess.Popen(tied_to_parent(cmd), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **child_env()})
      prefix = (f"[{os.path.splitext(os.path.basename(log_path))[0]}] "
                if len(children) > 1 else "")
      thread = threading.Thread(target=copy, args=(child, log_path, prefix), daemon=True)
      thread.start()
      running.append((cmd, log_path, child, thread))
    failed = []
    for cmd, log_path, child, thread in running:
      code = child.wait()
      thread.join()
      if code:
        failed.append(f"{' '.join(cmd[2:4])} ... exited with status {code}; see {log_path}")
  finally:
    # Interrupted, or one could not start: stop the others too, and wait for them (bounded).
    stopped = stop_processes([child for _, _, child, _ in running])
    for pid, how in stopped:
      print(f"{prog}: stopped child {pid}: {how}", file=sys.stderr, flush=True)
  if failed:
    raise RuntimeError("; ".join(failed))


class LocalRunner:
  """Runs a recipe's stages as processes on this machine (`realm_jax.pipeline.stages.Runner`):
  a stage's pending jobs side by side (`run_children`; one after the other when the stage asks),
  a trainer and its index builder under `run_local`, each job's deferred values read as it
  starts. `run_child`, `run_children` and `run_pair` are the three ways a job runs."""

  def __init__(self, prog: str = "recipe"):
    self.prog = prog

  def run_stage(self, stage, log_dir: str) -> None:
    """Runs `stage`'s pending jobs (a `realm_jax.pipeline.stages.Stage`); RuntimeError names
    a job that failed, `gin_utils.Interrupted` a stop by signal."""
    from realm_jax.pipeline import stages  # pylint: disable=g-import-not-at-top

    def child(job) -> tuple[list[str], str]:
      return stages.resolve_tokens(job.argv()), os.path.join(log_dir, job.log)

    pending = stage.pending()
    if stage.pair:
      builder = None if stage.builder is None else child(stage.builder)[0]
      self.run_pair(child(stage.jobs[0])[0], builder, log_dir=log_dir,
                    run_dir=stage.jobs[0].output.run_dir, name=stage.name.strip())
    elif len(stage.jobs) == 1:
      self.run_child(*child(pending[0]))
    elif stage.together:
      self.run_children([child(job) for job in pending])
    else:
      for job in pending:
        self.run_children([child(job)])

  def run_child(self, cmd: Sequence[str], log_path: str) -> None:
    self.run_children([(cmd, log_path)])

  def run_children(self, children: Sequence[tuple[Sequence[str], str]]) -> None:
    run_children(children, prog=self.prog)

  def run_pair(self, trainer: Sequence[str], builder: Optional[Sequence[str]], *, log_dir: str,
               run_dir: str, name: str) -> None:
    """The trainer and its builder under `run_local` (progress lines to the console); a stop
    by signal is re-raised as `gin_utils.Interrupted`, a failure as RuntimeError."""
    from realm_jax import gin_utils  # pylint: disable=g-import-not-at-top
    code = run_local(trainer, builder, log_dir=log_dir, console=Progress(sys.stdout),
                     env_trainer=child_env(), env_builder=child_env(), run_dir=run_dir)
    if code - 128 in gin_utils.STOP_SIGNALS + (signal.SIGHUP,):
      # run_local caught the signal meant for this process and stopped both children.
      raise gin_utils.Interrupted(code - 128)
    if code:
      raise RuntimeError(f"{name}: exited with status {code}; see {log_dir}")


def _parse_env(assignments: Sequence[str], parser: argparse.ArgumentParser,
               flag: str) -> dict:
  env = {}
  for item in assignments:
    key, sep, value = item.partition("=")
    if not sep or not key:
      parser.error(f"{flag} {item!r}: expected KEY=VALUE")
    env[key] = value
  return env


def build_parser() -> argparse.ArgumentParser:
  """The command-line interface."""
  parser = argparse.ArgumentParser(
      prog="python -m realm_jax_launch.local",
      description="Run the REALM trainer and its index builder side by side, output prefixed "
                  "and logged; Ctrl-C stops both.",
      epilog="Exit status: 0 done; the trainer's status if it failed; 128 + N stopped by signal N "
             "(130 Ctrl-C, 143 SIGTERM); 3 the builder failed or timed out; 2 usage error.")
  parser.add_argument("--trainer", required=True,
                      help="the trainer command line, one shell-quoted string")
  parser.add_argument("--builder", default=None,
                      help="the index builder command line, one shell-quoted string")
  parser.add_argument("--run_dir", default=None,
                      help="the run directory: logs go to <run_dir>/logs unless --log_dir")
  parser.add_argument("--log_dir", default=None, help="where trainer.log and builder.log go")
  parser.add_argument("--trainer_env", action="append", default=[], metavar="KEY=VALUE",
                      help="environment for the trainer only (repeatable), e.g. "
                           "CUDA_VISIBLE_DEVICES=0,1,2")
  parser.add_argument("--builder_env", action="append", default=[], metavar="KEY=VALUE",
                      help="environment for the builder only (repeatable), e.g. "
                           "CUDA_VISIBLE_DEVICES=3 or JAX_PLATFORMS=cpu")
  parser.add_argument("--grace_seconds", type=float, default=DEFAULT_GRACE_SECONDS,
                      help="seconds between SIGINT and SIGKILL when stopping a child "
                           "(default %(default)s)")
  parser.add_argument("--builder_timeout", type=float, default=DEFAULT_BUILDER_TIMEOUT,
                      help="seconds the builder may run on after the trainer finished; "
                           "negative: no limit (default %(default)s)")
  parser.add_argument("--stop_on_builder_failure", action="store_true",
                      help="stop the trainer too when the builder fails (default: report it "
                           "and let training go on with a stale index)")
  parser.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                      help="print the commands, shell-quoted, and exit")
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Entry point; returns the exit status."""
  parser = build_parser()
  args = parser.parse_args(argv)
  trainer_cmd = shlex.split(args.trainer)
  builder_cmd = shlex.split(args.builder) if args.builder is not None else None
  if not trainer_cmd:
    parser.error("--trainer is empty")
  if builder_cmd is not None and not builder_cmd:
    parser.error("--builder is empty")
  env_trainer = _parse_env(args.trainer_env, parser, "--trainer_env")
  env_builder = _parse_env(args.builder_env, parser, "--builder_env")
  if args.dry_run:
    print(shell_line(trainer_cmd, env_trainer))
    if builder_cmd is not None:
      print(shell_line(builder_cmd, env_builder))
    return 0
  log_dir = args.log_dir or (os.path.join(args.run_dir, "logs") if args.run_dir else None)
  if log_dir is None:
    parser.error("give --run_dir (logs in <run_dir>/logs) or --log_dir")
  timeout = None if args.builder_timeout < 0 else args.builder_timeout
  return run_local(trainer_cmd, builder_cmd, log_dir=log_dir, env_trainer=env_trainer,
                   env_builder=env_builder, grace_seconds=args.grace_seconds,
                   builder_timeout=timeout, stop_on_builder_failure=args.stop_on_builder_failure,
                   run_dir=args.run_dir)


if __name__ == "__main__":
  sys.exit(main())
