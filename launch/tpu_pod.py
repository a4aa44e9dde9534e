"""REALM on two Cloud TPU VM slices sharing one file system, driven through gcloud: the trainer
slice and the index builder's slice (`<name>-trainer`, `<name>-builder`).

  python -m realm_jax_launch.tpu_pod create|copy|run|stop|teardown --zone=ZONE [--dry-run]

`run` runs every stage of the paper-scale recipe (`realm_jax.pipeline`), or with --trainer_gin
pretraining alone, the trainer on one slice and the builder on the other; `worker-exec` is what
each job runs on a worker. Every subcommand prints each gcloud command it runs, shell-quoted;
`--dry-run` only prints them. Paths are absolute and the same on every worker (no `gs://`
URLs). Subcommands, flags, an example: launch/README.md. Exit status: 0 done; otherwise the
status of the first command that failed (teardown: the worst); 2 a usage error; 127 no gcloud.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import runpy
import shlex
import subprocess
import sys
from typing import Optional, Sequence

from realm_jax import gin_utils

PROG = "tpu_pod"
GCLOUD_TPU_VM = ("gcloud", "compute", "tpus", "tpu-vm")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_NAME = "realm"
# The paper: 64 TPU cores train, 16 re-embed the corpus (v3-64: 8 hosts, v3-16: 2 hosts).
DEFAULT_TRAINER_TYPE = "v3-64"
DEFAULT_BUILDER_TYPE = "v3-16"
DEFAULT_VERSION = "tpu-ubuntu2204-base"  # the runtime for v2, v3 and v4 TPU VMs
DEFAULT_REMOTE_DIR = "realm_jax"
DEFAULT_VENV = "realm_venv"
DEFAULT_PYTHON = "python3.11"
DEFAULT_BUILDER_GIN = "gin_configs/runs/build_index.gin"
DEFAULT_TRAINER_HOSTS = 8  # a v3-64's workers
ROLES = ("trainer", "builder")
MODULES = {"trainer": "realm_jax.train", "builder": "realm_jax.build_index"}
EXIT_USAGE = 2
EXIT_NO_GCLOUD = 127
# A path on the workers that may be removed and rebuilt: no "..", nothing outside the home.
_SAFE_RELATIVE = re.compile(r"^(?!.*(^|/)\.\.?(/|$))[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


class UsageError(ValueError):
  """A bad flag value; printed as one line, exit status 2."""


@dataclasses.dataclass(frozen=True)
class Pod:
  """The two slices and how gcloud reaches them."""
  trainer: str
  builder: str
  zone: str
  project: Optional[str] = None
  internal_ip: bool = False

  def tpu(self, role: str) -> str:
    return self.trainer if role == "trainer" else self.builder

  def gcloud(self, verb: str, *args: str) -> list[str]:
    """`gcloud compute tpus tpu-vm VERB ARGS --zone=... [--project=...]`."""
    cmd = [*GCLOUD_TPU_VM, verb, *args, f"--zone={self.zone}"]
    if self.project:
      cmd.append(f"--project={self.project}")
    return cmd

  def ssh(self, tpu: str, command: str, worker: str = "all") -> list[str]:
    """`command` (a remote shell line) on every worker of `tpu` (or on `worker`, e.g. 0)."""
    cmd = self.gcloud("ssh", tpu, f"--worker={worker}", f"--command={command}")
    return cmd + ["--internal-ip"] if self.internal_ip else cmd

  def scp(self, tpu: str, local: str, remote: str) -> list[str]:
    """Recursive copy of `local` to `remote` (relative to the home) on every worker of `tpu`."""
    cmd = self.gcloud("scp", "--recurse", local, f"{tpu}:{remote}", "--worker=all")
    return cmd + ["--internal-ip"] if self.internal_ip else cmd


def _safe_relative(path: str, flag: str) -> str:
  """`path` if it is a plain relative path under the home (it gets `rm -rf`ed and re-made)."""
  if not _SAFE_RELATIVE.match(path):
    raise UsageError(f"{flag}={path!r}: expected a plain path relative to the home directory "
                     f"(letters, digits, '._-/', no '..')")
  return path


# Gin strings on the workers' command lines are double-quoted: they survive the two levels of
# shell quoting (local, then the worker's) far more readably than single ones.
GIN_QUOTE = '"'


def _gin_path(value: str, flag: str) -> str:
  """`value`, a path a gin binding carries to the workers: no quotes, backslashes, '$' or '`'
  (each level of shell quoting would have to escape them)."""
  if any(c in value for c in "\"'\\$`"):
    raise UsageError(f"{flag}={value!r}: quotes, backslashes, '$' and '`' are not supported")
  return value


def _shared_path(path: str, flag: str) -> str:
  """An absolute path on the workers; refuses URLs (realm_jax uses os.path on run dirs)."""
  if re.match(r"^[a-z][a-z0-9+.-]*://", path):
    raise UsageError(f"{flag}={path}: realm_jax reads and writes this directory through the local "
                     f"file system (os.path, rename), so URLs do not work; mount it on every "
                     f"worker (gcsfuse with a hierarchical-namespace bucket, or NFS/Filestore) "
                     f"and pass the mount path")
  if not path.startswith("/"):
    raise UsageError(f"{flag}={path}: give an absolute path (the same on every worker)")
  return path


def _bindings(items: Sequence[str], flag: str) -> list[str]:
  """`KEY=VALUE` items as `--gin.KEY=VALUE` arguments, each as written."""
  try:
    return gin_utils.binding_flags([gin_utils.parse_binding(item) for item in items])
  except ValueError as e:
    raise UsageError(f"{flag} {e}") from e


def _gin_files(files: Sequence[str], flag: str) -> list[str]:
  """`--gin_file=` arguments; relative paths must exist in this repository (copied as is)."""
  for path in files:
    if not os.path.isabs(path) and not os.path.exists(os.path.join(REPO_ROOT, path)):
      raise UsageError(f"{flag}={path}: not found under {REPO_ROOT} (relative gin files are "
                       f"read from the copy of this repository on the workers)")
  return [f"--gin_file={path}" for path in files]


def pinned_jax_version(setup_py: str = os.path.join(REPO_ROOT, "setup.py")) -> Optional[str]:
  """The `jax==X` pin of setup.py (libtpu must match the jax that pip installs), or None."""
  try:
    with open(setup_py, encoding="utf-8") as f:
      match = re.search(r"""["']jax==([^"']+)["']""", f.read())
  except OSError:
    return None
  return match.group(1) if match else None


def _default_tpu_jax() -> str:
  version = pinned_jax_version()
  return f"jax[tpu]=={version}" if version else "jax[tpu]"


# ---------------------------------------------------------------------------------------------
# Command builders (pure: they return argv lists and run nothing).


def create_commands(pod: Pod, *, trainer_type: str, builder_type: str, version: str,
                    builder_version: Optional[str] = None, spot: bool = False,
                    preemptible: bool = False) -> list[list[str]]:
  """`tpu-vm create` for the trainer slice, then the builder slice."""
  commands = []
  for tpu, accelerator, runtime in ((pod.trainer, trainer_type, version),
                                    (pod.builder, builder_type, builder_version or version)):
    cmd = pod.gcloud("create", tpu, f"--accelerator-type={accelerator}", f"--version={runtime}")
    if spot:
      cmd.append("--spot")
    if preemptible:
      cmd.append("--preemptible")
    if pod.internal_ip:
      cmd.append("--internal-ips")
    commands.append(cmd)
  return commands


def setup_script(*, remote_dir: str, venv: str, python: str, tpu_jax: str) -> str:
  """The remote shell line that installs the copied repository into a fresh virtualenv."""
  py = shlex.quote(python)
  install = f"$HOME/{venv}/bin/python -m pip install -q -e ."
  if tpu_jax:
    install += " " + shlex.quote(tpu_jax)
  steps = [
      "set -e",
      # apt's python3.X lacks ensurepip (so venv) without python3.X-venv.
      f"{py} -c 'import ensurepip' 2>/dev/null || {{ sudo apt-get update -q && "
      f"sudo apt-get install -y -q {py} {py}-venv; }}",
      f"rm -rf $HOME/{venv}",
      f"{py} -m venv $HOME/{venv}",
      f"$HOME/{venv}/bin/python -m pip install -q --upgrade pip",
      f"cd $HOME/{remote_dir}",
      install,
  ]
  return "; ".join(steps)


def copy_commands(pod: Pod, *, repo: str, remote_dir: str, venv: str, python: str,
                  tpu_jax: str) -> list[list[str]]:
  """Per slice: remove the old copy, scp the repository to every worker, install it."""
  repo = os.path.normpath(os.path.abspath(repo))
  script = setup_script(remote_dir=remote_dir, venv=venv, python=python, tpu_jax=tpu_jax)
  commands = []
  for tpu in (pod.trainer, pod.builder):
    # scp into an existing directory would nest the copy one level down: start clean.
    commands.append(pod.ssh(tpu, f"rm -rf $HOME/{remote_dir}"))
    commands.append(pod.scp(tpu, repo, remote_dir))
    commands.append(pod.ssh(tpu, script))
  return commands


def pid_file(role: str) -> str:
  return f"$HOME/.realm_jax_{role}.pid"


def remote_log(role: str) -> str:
  return f"$HOME/realm_jax_{role}.log"


def worker_python_command(module: str, args: Sequence[str], *, venv: str,
                          jax_distributed: bool, resolve: bool = False) -> str:
  """`python -m MODULE ARGS` for a worker's shell, through `worker-exec` when
  `jax_distributed` or `resolve` (the arguments carry a recipe's deferred values: tokens that
  `worker-exec` reads on the worker)."""
  if jax_distributed or resolve:
    wrapper = ["worker-exec", *([] if jax_distributed else ["--no-jax_distributed"])]
    argv = ["-m", "realm_jax_launch.tpu_pod", *wrapper, module]
  else:
    argv = ["-m", module]
  return f'"$HOME/{venv}/bin/python" ' + shlex.join([*argv, *args])


def foreground_script(role: str, python_command: str, *, remote_dir: str) -> str:
  """Runs in the ssh session; the pid file lets `stop` reach it (exec keeps the shell's pid)."""
  return f"cd $HOME/{remote_dir} && echo $$ > {pid_file(role)} && exec {python_command}"


def detached_script(role: str, python_command: str, *, remote_dir: str) -> str:
  """Starts in the background, surviving the ssh session; output in ~/realm_jax_<role>.log.

  `set -m`: the job gets its own process group, away from the ssh session's, and (when the
  shell itself did not inherit SIGINT ignored) SIGINT at its default. `stop`'s SIGINT reaches it
  either way: every `python -m realm_jax.*` turns SIGINT into a clean exit whatever disposition
  it inherited (`gin_utils.run_command`)."""
  return (f"set -m; cd $HOME/{remote_dir} || exit 1; nohup {python_command} > "
          f"{remote_log(role)} 2>&1 < /dev/null & echo $! > {pid_file(role)}; echo \"{role} "
          f"started on $(hostname): pid $!, log {remote_log(role)}\"")


def stop_script(role: str, *, kill: bool = False) -> str:
  """Signals the recorded process, only if that pid still runs realm_jax (pids get reused)."""
  sig = "KILL" if kill else "INT"
  return (f"pid=$(cat {pid_file(role)} 2>/dev/null) && grep -qa realm_jax /proc/$pid/cmdline "
          f"2>/dev/null && kill -{sig} $pid && echo \"sent SIG{sig} to the {role} (pid $pid) on "
          f"$(hostname)\"; true")


@dataclasses.dataclass(frozen=True)
class RunCommands:
  """What `run` executes: an optional first index, then the trainer and builder together."""
  first_index: Optional[list[str]]
  trainer: list[str]
  builder: list[str]
  stop: list[list[str]]  # run when the pair fails or is interrupted (foreground)


def run_commands(pod: Pod, *, run_dir: str, block_store: str, trainer_gin: Sequence[str],
                 trainer_bindings: Sequence[str] = (),
                 builder_gin: Sequence[str] = (DEFAULT_BUILDER_GIN,),
                 builder_bindings: Sequence[str] = (), first_index_from: Optional[str] = None,
                 remote_dir: str = DEFAULT_REMOTE_DIR, venv: str = DEFAULT_VENV,
                 jax_distributed: bool = True, detach: bool = False) -> RunCommands:
  """The ssh commands of `run` (see the module docstring)."""
  if not trainer_gin:
    raise UsageError("--trainer_gin is required (e.g. gin_configs/experiments/wiki_pretrain.gin)")
  run_dir = _shared_path(run_dir, "--run_dir")
  block_store = _shared_path(block_store, "--block_store")
  # Every run gin binds its job's block_store to %BLOCK_STORE.
  shared = gin_utils.binding_flags([("RUN_DIR", _gin_path(run_dir, "--run_dir")),
                                    ("BLOCK_STORE", _gin_path(block_store, "--block_store"))],
                                   quote=GIN_QUOTE)
  trainer_args = [*_gin_files(trainer_gin, "--trainer_gin"), *shared,
                  *_bindings(trainer_bindings, "--trainer_binding")]
  builder_args = [*_gin_files(builder_gin, "--builder_gin"), *shared,
                  *_bindings(builder_bindings, "--builder_binding")]

  def python(role: str, args: Sequence[str]) -> str:
    return worker_python_command(MODULES[role], args, venv=venv, jax_distributed=jax_distributed)

  first_index = None
  if first_index_from is not None:
    checkpoint = _gin_path(_shared_path(first_index_from, "--first_index_from"),
                           "--first_index_from")
    once = python("builder", [*builder_args, "--once", *gin_utils.binding_flags(
        [("build_index_main.checkpoint_dir", checkpoint)], quote=GIN_QUOTE)])
    first_index = pod.ssh(pod.builder, f"cd $HOME/{remote_dir} && {once}")
  script = detached_script if detach else foreground_script
  return RunCommands(
      first_index=first_index,
      trainer=pod.ssh(pod.trainer, script("trainer", python("trainer", trainer_args),
                                          remote_dir=remote_dir)),
      builder=pod.ssh(pod.builder, script("builder", python("builder", builder_args),
                                          remote_dir=remote_dir)),
      stop=stop_commands(pod))


def stop_commands(pod: Pod, *, kill: bool = False) -> list[list[str]]:
  """SIGINT (or SIGKILL) to the trainer on its slice and the builder on its slice."""
  return [pod.ssh(pod.tpu(role), stop_script(role, kill=kill)) for role in ROLES]


def teardown_commands(pod: Pod) -> list[list[str]]:
  """`tpu-vm delete --quiet` for both slices."""
  return [pod.gcloud("delete", tpu, "--quiet") for tpu in (pod.trainer, pod.builder)]


@dataclasses.dataclass(frozen=True)
class PodStage:
  """One stage of a recipe on the pod: its jobs' ssh commands, run one after the other, or
  (`pair`) the trainer's and the builder's, run together as `run` runs them."""
  name: str
  commands: list[list[str]]
  pair: bool = False


def _job_script(job, done, *, remote_dir: str, venv: str,
                jax_distributed: bool) -> tuple[str, str]:
  """(the slice role whose pid file it records, the remote shell line) of one recipe job: on
  the trainer or builder slice through `worker-exec` (its deferred values read there); a
  one-process job (HOST) on the CPU; skipped with a line when the shell test of its output
  `done` (a `realm_jax.pipeline.stages` output, or None) finds it there."""
  from realm_jax.pipeline import stages  # pylint: disable=g-import-not-at-top
  one_process = job.role == stages.HOST
  python = worker_python_command(job.module, job.arguments(quote=GIN_QUOTE), venv=venv,
                                 jax_distributed=jax_distributed and not one_process,
                                 resolve=True)
  role = "trainer" if job.role == stages.TRAINER else "builder"
  # `env`: exec's command keeps the pid the pid file records, and JAX stays off the TPU.
  script = foreground_script(role, ("env JAX_PLATFORMS=cpu " if one_process else "") + python,
                             remote_dir=remote_dir)
  test = done and done.shell_test()
  if test:
    said = shlex.quote(f"already done, skipped: {done.describe()}")
    script = f"if {test}; then echo {said}; exit 0; fi; {script}"
  return role, script


def recipe_commands(pod: Pod, plan: Sequence, *, remote_dir: str = DEFAULT_REMOTE_DIR,
                    venv: str = DEFAULT_VENV, jax_distributed: bool = True) -> list[PodStage]:
  """The ssh commands of a recipe's plan (`realm_jax.pipeline` stages), in order: a training
  job on every worker of the trainer slice, an index job on every worker of the builder slice,
  a one-process job (BERT conversion, evaluation) on worker 0 of the builder slice; each
  skipped on the workers when its output is there (where a shell test can tell)."""
  pod_stages = []
  for stage in plan:
    commands = []
    for job in (*stage.jobs, *([stage.builder] if stage.builder is not None else [])):
      # A pair's builder is skipped with its trainer: nothing is left to index.
      done = stage.jobs[0].output if job is stage.builder else (stage.done_when or job.output)
      role, script = _job_script(job, done, remote_dir=remote_dir, venv=venv,
                                 jax_distributed=jax_distributed)
      one_process = job.role == "host"
      commands.append(pod.ssh(pod.tpu(role), script, worker="0" if one_process else "all"))
    if stage.pair and stage.builder is None:
      raise UsageError(f"{stage.name.strip()}: a trainer without its index builder")
    pod_stages.append(PodStage(stage.name.strip(), commands, pair=stage.pair))
  return pod_stages


# ---------------------------------------------------------------------------------------------
# Execution.


def _say(message: str) -> None:
  print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def execute(commands: Sequence[Sequence[str]], *, dry_run: bool, keep_going: bool = False) -> int:
  """Prints each command (shell-quoted, one per line) and, unless `dry_run`, runs it; stops at
  the first failure unless `keep_going`. Returns 0 or the (worst) failing status."""
  worst = 0
  for cmd in commands:
    print(shlex.join(cmd), flush=True)
    if dry_run:
      continue
    try:
      returncode = subprocess.run(list(cmd), check=False).returncode
    except FileNotFoundError as e:
      _say(f"cannot run {cmd[0]!r} ({e}); install the Google Cloud CLI")
      return EXIT_NO_GCLOUD
    if returncode:
      _say(f"failed with status {returncode}: {shlex.join(cmd)}")
      worst = max(worst, returncode)
      if not keep_going:
        return returncode
  return worst


def execute_run(commands: RunCommands, *, dry_run: bool, detach: bool, log_dir: str,
                grace_seconds: float, builder_timeout: Optional[float]) -> int:
  """`run`: the first index (if asked), then the pair: detached, or in the foreground under
  `launch.local.run_local`, with `stop` on both slices when it does not end cleanly."""
  if commands.first_index is not None:
    status = execute([commands.first_index], dry_run=dry_run)
    if status:
      return status
  if detach:
    return execute([commands.trainer, commands.builder], dry_run=dry_run)
  if dry_run:
    print(shlex.join(commands.trainer))
    print(shlex.join(commands.builder))
    print("# when the trainer fails, the builder fails or times out, or on Ctrl-C:")
    for cmd in commands.stop:
      print(shlex.join(cmd))
    return 0
  from launch import local  # pylint: disable=g-import-not-at-top
  status = local.run_local(commands.trainer, commands.builder, log_dir=log_dir,
                           grace_seconds=grace_seconds, builder_timeout=builder_timeout)
  if status:
    # Ending the local ssh session leaves the remote process running: stop it there.
    _say(f"status {status}: stopping the trainer and the builder on the workers")
    execute(commands.stop, dry_run=False, keep_going=True)
  return status


def execute_recipe(pod_stages: Sequence[PodStage], stop: Sequence[Sequence[str]], *,
                   dry_run: bool, log_dir: str, grace_seconds: float,
                   builder_timeout: Optional[float]) -> int:
  """`run` of a recipe: each stage in order, its commands one after the other (a pair under
  `launch.local.run_local`, as `run` runs one); when a stage fails or on Ctrl-C, `stop` on both
  slices (ending a local ssh session does not end the remote process)."""
  if dry_run:
    for stage in pod_stages:
      print(f"# {stage.name}")
      for cmd in stage.commands:
        print(shlex.join(cmd))
    print("# when a stage fails, or on Ctrl-C:")
    for cmd in stop:
      print(shlex.join(cmd))
    return 0
  status = 0
  try:
    for stage in pod_stages:
      _say(f"stage {stage.name}")
      if stage.pair:
        trainer, builder = stage.commands
        status = execute_run(RunCommands(None, trainer, builder, list(stop)), dry_run=False,
                             detach=False, log_dir=log_dir, grace_seconds=grace_seconds,
                             builder_timeout=builder_timeout)
        if status:
          return status  # execute_run has stopped both slices
      else:
        status = execute(stage.commands, dry_run=False)
      if status:
        break
  except KeyboardInterrupt:
    status = 130
  if status:
    _say(f"status {status}: stopping the recipe's processes on the workers")
    execute(stop, dry_run=False, keep_going=True)
  return status


def worker_exec(module: str, args: Sequence[str], jax_distributed: bool = True) -> int:
  """On a TPU VM worker: reads the recipe's deferred values in `args` (the newest or the best
  checkpoint of a run on the shared file system), joins the slice's JAX processes unless
  `jax_distributed` is off, then runs `python -m module args` in this process."""
  from realm_jax.pipeline import stages  # pylint: disable=g-import-not-at-top
  args = stages.resolve_tokens(args)
  if jax_distributed:
    import jax  # pylint: disable=g-import-not-at-top  (only on the workers)
    # Cluster auto-detection on TPU VMs: coordinator = worker 0, one process per worker.
    jax.distributed.initialize()
  sys.argv = [module, *args]
  runpy.run_module(module, run_name="__main__", alter_sys=True)  # its sys.exit() propagates
  return 0


# ---------------------------------------------------------------------------------------------
# Command line.


def _common_parser() -> argparse.ArgumentParser:
  common = argparse.ArgumentParser(add_help=False)
  common.add_argument("--zone", required=True, help="the zone of both slices")
  common.add_argument("--project", default=None, help="the Google Cloud project (default: "
                      "gcloud's configured one)")
  common.add_argument("--name", default=DEFAULT_NAME,
                      help="slices are <name>-trainer and <name>-builder (default %(default)s)")
  common.add_argument("--trainer_tpu", default=None, help="the trainer slice's name")
  common.add_argument("--builder_tpu", default=None, help="the index builder slice's name")
  common.add_argument("--internal_ip", action="store_true",
                      help="reach the workers by internal IP (ssh/scp --internal-ip; create "
                           "--internal-ips: no external IPs)")
  common.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                      help="print every command, one per line, and run nothing")
  return common


def _add_remote_paths(sub: argparse.ArgumentParser) -> None:
  sub.add_argument("--remote_dir", default=DEFAULT_REMOTE_DIR,
                   help="the repository copy on each worker, relative to the home (default "
                        "%(default)s)")
  sub.add_argument("--venv", default=DEFAULT_VENV,
                   help="the virtualenv on each worker, relative to the home (default "
                        "%(default)s)")


def build_parser() -> argparse.ArgumentParser:
  """The command-line interface."""
  parser = argparse.ArgumentParser(
      prog="python -m realm_jax_launch.tpu_pod",
      description="REALM pretraining on two TPU VM slices (trainer + index builder).")
  subparsers = parser.add_subparsers(dest="subcommand", required=True)
  common = _common_parser()

  create = subparsers.add_parser("create", parents=[common], help="create both slices")
  create.add_argument("--trainer_type", default=DEFAULT_TRAINER_TYPE,
                      help="the trainer's accelerator type (default %(default)s)")
  create.add_argument("--builder_type", default=DEFAULT_BUILDER_TYPE,
                      help="the index builder's accelerator type (default %(default)s)")
  create.add_argument("--version", default=DEFAULT_VERSION,
                      help="the TPU VM runtime (default %(default)s; v5e: v2-alpha-tpuv5-lite)")
  create.add_argument("--builder_version", default=None,
                      help="the builder slice's runtime, when it differs (default: --version)")
  capacity = create.add_mutually_exclusive_group()
  capacity.add_argument("--spot", action="store_true", help="Spot VMs")
  capacity.add_argument("--preemptible", action="store_true", help="preemptible VMs")

  copy = subparsers.add_parser("copy", parents=[common],
                               help="copy this repository to every worker and install it")
  copy.add_argument("--repo", default=REPO_ROOT,
                    help="the repository to copy (default: this one)")
  _add_remote_paths(copy)
  copy.add_argument("--python", default=DEFAULT_PYTHON,
                    help="the interpreter of the virtualenv (apt-installed when missing; "
                         "default %(default)s)")
  copy.add_argument("--tpu_jax", default=_default_tpu_jax(),
                    help="the extra pip requirement for TPUs (default %(default)s, the setup.py "
                         "pin); '' for none")

  run = subparsers.add_parser(
      "run", parents=[common], help="run REALM's recipe at paper scale, every stage (or with "
      "--trainer_gin the trainer and the index builder alone)")
  run.add_argument("--block_store", required=True,
                   help="the BlockStore directory: an absolute path every worker sees")
  recipe = run.add_argument_group(
      "the recipe (without --trainer_gin): realm_jax.pipeline.recipes.PaperRecipe's stages")
  recipe.add_argument("--out", help="the runs' directory (bert, ict, pretrain, finetune, orqa, "
                      "eval): an absolute path every worker sees")
  recipe.add_argument("--bert", help="bert-base-uncased as a transformers directory every "
                      "worker sees (converted by the first stage)")
  recipe.add_argument("--task", choices=("nq", "wq", "ct"), default="nq",
                      help="the fine-tuning benchmark (default %(default)s)")
  recipe.add_argument("--trainer_hosts", type=int, default=DEFAULT_TRAINER_HOSTS,
                      help="the trainer slice's workers: each training's BATCH_SIZE is its gin's "
                           "global batch over them (default %(default)s, a v3-64)")
  pair = run.add_argument_group("the trainer and the index builder alone (--trainer_gin)")
  pair.add_argument("--run_dir",
                    help="the run directory: an absolute path every worker of both slices sees")
  pair.add_argument("--trainer_gin", action="append", default=[],
                    help="the trainer's gin file (repeatable), e.g. "
                         "gin_configs/experiments/wiki_pretrain.gin")
  pair.add_argument("--trainer_binding", action="append", default=[], metavar="KEY=VALUE",
                    help="a trainer gin binding (repeatable), passed as --gin.KEY=VALUE")
  pair.add_argument("--builder_gin", action="append", default=None,
                    help=f"the builder's gin file (repeatable; default {DEFAULT_BUILDER_GIN})")
  pair.add_argument("--builder_binding", action="append", default=[], metavar="KEY=VALUE",
                    help="a builder gin binding (repeatable), passed as --gin.KEY=VALUE")
  pair.add_argument("--first_index_from", default=None, metavar="CHECKPOINT_DIR",
                    help="first build index 0 from this checkpoint (the ICT run's), on the "
                         "builder slice, before starting the pair")
  run.add_argument("--jax_distributed", action=argparse.BooleanOptionalAction, default=True,
                   help="call jax.distributed.initialize() on every worker before the entry "
                        "point (default: on)")
  pair.add_argument("--detach", action="store_true",
                    help="start both in the background on the workers and return")
  run.add_argument("--log_dir", default=None,
                   help="foreground: where trainer.log and builder.log go locally (default "
                        "~/realm_jax_logs/<trainer slice>)")
  run.add_argument("--grace_seconds", type=float, default=60.0,
                   help="foreground: seconds between SIGINT and SIGKILL of the local ssh "
                        "sessions (default %(default)s)")
  run.add_argument("--builder_timeout", type=float, default=3 * 3600.0,
                   help="foreground: seconds the builder may run on after the trainer is done "
                        "(default %(default)s); negative: no limit")
  _add_remote_paths(run)

  stop = subparsers.add_parser("stop", parents=[common],
                               help="SIGINT to the trainer and the builder on the workers")
  stop.add_argument("--kill", action="store_true", help="SIGKILL instead of SIGINT")

  subparsers.add_parser("teardown", parents=[common], help="delete both slices")

  worker = subparsers.add_parser(
      "worker-exec", help="(on a worker) jax.distributed.initialize(), then python -m MODULE")
  worker.add_argument("--jax_distributed", action=argparse.BooleanOptionalAction, default=True,
                      help="call jax.distributed.initialize() first (default: on)")
  worker.add_argument("module", help="e.g. realm_jax.train")
  worker.add_argument("args", nargs=argparse.REMAINDER, help="the module's arguments")
  return parser


def _pod(args: argparse.Namespace) -> Pod:
  pod = Pod(trainer=args.trainer_tpu or f"{args.name}-trainer",
            builder=args.builder_tpu or f"{args.name}-builder", zone=args.zone,
            project=args.project, internal_ip=args.internal_ip)
  if pod.trainer == pod.builder:
    raise UsageError(f"the trainer and the builder need two slices (both are {pod.trainer!r})")
  return pod


def _log_dir(args: argparse.Namespace, pod: Pod) -> str:
  return args.log_dir or os.path.expanduser(os.path.join("~", "realm_jax_logs", pod.trainer))


def _run_recipe(pod: Pod, args: argparse.Namespace) -> int:
  """`run` without --trainer_gin: REALM's recipe at paper scale, every stage."""
  from realm_jax.pipeline import recipes  # pylint: disable=g-import-not-at-top
  pair_only = [flag for flag, value in (("--run_dir", args.run_dir), ("--detach", args.detach),
                                        ("--trainer_binding", args.trainer_binding),
                                        ("--builder_gin", args.builder_gin),
                                        ("--builder_binding", args.builder_binding),
                                        ("--first_index_from", args.first_index_from)) if value]
  if pair_only:
    raise UsageError(f"{', '.join(pair_only)}: flags of the trainer and builder alone "
                     f"(--trainer_gin); the recipe runs every stage in the foreground")
  if not (args.out and args.bert):
    raise UsageError("the recipe needs --out and --bert (or --trainer_gin for the trainer and "
                     "the index builder alone)")
  paths = {flag: _gin_path(_shared_path(value, flag), flag) for flag, value in (
      ("--out", args.out), ("--block_store", args.block_store), ("--bert", args.bert))}
  try:
    recipe = recipes.PaperRecipe(paths["--out"], block_store=paths["--block_store"],
                                 bert=paths["--bert"], task=args.task,
                                 hosts=args.trainer_hosts, make_dirs=False)
  except ValueError as e:
    raise UsageError(str(e)) from e
  pod_stages = recipe_commands(pod, recipe.plan(),
                               remote_dir=_safe_relative(args.remote_dir, "--remote_dir"),
                               venv=_safe_relative(args.venv, "--venv"),
                               jax_distributed=args.jax_distributed)
  timeout = None if args.builder_timeout < 0 else args.builder_timeout
  return execute_recipe(pod_stages, stop_commands(pod), dry_run=args.dry_run,
                        log_dir=_log_dir(args, pod), grace_seconds=args.grace_seconds,
                        builder_timeout=timeout)


def _dispatch(args: argparse.Namespace) -> int:
  if args.subcommand == "worker-exec":
    return worker_exec(args.module, args.args, args.jax_distributed)
  pod = _pod(args)
  if args.subcommand == "create":
    return execute(create_commands(pod, trainer_type=args.trainer_type,
                                   builder_type=args.builder_type, version=args.version,
                                   builder_version=args.builder_version, spot=args.spot,
                                   preemptible=args.preemptible), dry_run=args.dry_run)
  if args.subcommand == "copy":
    return execute(copy_commands(pod, repo=args.repo,
                                 remote_dir=_safe_relative(args.remote_dir, "--remote_dir"),
                                 venv=_safe_relative(args.venv, "--venv"), python=args.python,
                                 tpu_jax=args.tpu_jax), dry_run=args.dry_run)
  if args.subcommand == "run" and not args.trainer_gin:
    return _run_recipe(pod, args)
  if args.subcommand == "run":
    if not args.run_dir:
      raise UsageError("--run_dir is required with --trainer_gin")
    commands = run_commands(
        pod, run_dir=args.run_dir, block_store=args.block_store, trainer_gin=args.trainer_gin,
        trainer_bindings=args.trainer_binding,
        builder_gin=args.builder_gin or (DEFAULT_BUILDER_GIN,),
        builder_bindings=args.builder_binding, first_index_from=args.first_index_from,
        remote_dir=_safe_relative(args.remote_dir, "--remote_dir"),
        venv=_safe_relative(args.venv, "--venv"), jax_distributed=args.jax_distributed,
        detach=args.detach)
    timeout = None if args.builder_timeout < 0 else args.builder_timeout
    return execute_run(commands, dry_run=args.dry_run, detach=args.detach,
                       log_dir=_log_dir(args, pod),
                       grace_seconds=args.grace_seconds, builder_timeout=timeout)
  if args.subcommand == "stop":
    return execute(stop_commands(pod, kill=args.kill), dry_run=args.dry_run, keep_going=True)
  if args.subcommand == "teardown":
    return execute(teardown_commands(pod), dry_run=args.dry_run, keep_going=True)
  raise AssertionError(args.subcommand)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Entry point; returns the exit status."""
  args = build_parser().parse_args(argv)
  try:
    return _dispatch(args)
  except UsageError as e:
    print(f"{PROG}: {e}", file=sys.stderr, flush=True)
    return EXIT_USAGE


if __name__ == "__main__":
  sys.exit(main())
