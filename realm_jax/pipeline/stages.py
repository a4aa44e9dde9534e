"""Stages as objects: what one step of a recipe reads, what it writes, and the jobs it runs.

A `Job` is one `python -m realm_jax.*` child: its module, gin files, flags and gin bindings,
the bindings as (name, Python value) pairs that `gin_utils.binding_flags` alone turns into
`--gin.NAME=VALUE` text. A value known only once earlier stages have run (the newest ICT
checkpoint, best.json's pretraining checkpoint) is a deferred value (`LatestCheckpoint`,
`BestCheckpoint`, `LatestIndex`), written as a token (`{latest_checkpoint:/runs/ict}`) that
`resolve_tokens` replaces when the job starts: on this machine, or on a pod's worker
(`realm_jax_launch.tpu_pod worker-exec`). A `Stage` groups jobs that run side by side (or the
trainer with its index builder) and is done when every output it names exists and checks out,
so a runner skips it; `describe` prints a plan (`python -m realm_jax.recipe --dry_run`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
from typing import Any, Optional, Protocol, Sequence, Union

from realm_jax import gin_utils

# Where a pod runs a job (`realm_jax_launch.tpu_pod`): on every worker of the trainer slice, on
# every worker of the index builder's slice, or as one process (worker 0 of the builder slice).
TRAINER = "trainer"
BUILDER = "builder"
HOST = "host"
ROLES = (TRAINER, BUILDER, HOST)

Bindings = tuple[tuple[str, Any], ...]


# ------------------------------------------------------------------------------ outputs


def _shell_path(path: str, *rest: str) -> str:
  """A path for a POSIX shell test: `path` quoted, `rest` (glob patterns allowed) after it."""
  return "/".join([shlex.quote(path), *rest])


@dataclasses.dataclass(frozen=True)
class TrainedRun:
  """A training run that finished: `<run_dir>/TRAINING_DONE`, written by the trainer last."""
  run_dir: str

  def exists(self) -> bool:
    from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
    return checkpoints.training_done(self.run_dir)

  def shell_test(self) -> Optional[str]:
    return f"test -f {_shell_path(self.run_dir, 'TRAINING_DONE')}"

  def describe(self) -> str:
    return f"{self.run_dir} (trained: TRAINING_DONE)"


@dataclasses.dataclass(frozen=True)
class Index:
  """A run's published index (any step; `of_latest_checkpoint`: of its newest checkpoint)."""
  run_dir: str
  of_latest_checkpoint: bool = False

  def exists(self) -> bool:
    from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
    from realm_jax.index import store  # pylint: disable=g-import-not-at-top
    step = store.latest_index_step(self.run_dir)
    if not self.of_latest_checkpoint:
      return step is not None
    return step == checkpoints.latest_checkpoint_step(self.run_dir)

  def shell_test(self) -> Optional[str]:
    if self.of_latest_checkpoint:
      return None  # a comparison of two directory listings: left to the job
    return f"ls {_shell_path(self.run_dir, 'index', '[0-9]*', 'manifest.json')} >/dev/null 2>&1"

  def describe(self) -> str:
    which = "of its newest checkpoint" if self.of_latest_checkpoint else "published"
    return f"{self.run_dir}/index ({which})"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """A run whose newest finished checkpoint is `step` (None: any step), e.g. a converted BERT's
  step 0."""
  run_dir: str
  step: Optional[int] = None

  def exists(self) -> bool:
    from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
    latest = checkpoints.latest_checkpoint_step(self.run_dir)
    return latest is not None if self.step is None else latest == self.step

  def shell_test(self) -> Optional[str]:
    step = "[0-9]*" if self.step is None else str(self.step)
    return (f"ls {_shell_path(self.run_dir, 'checkpoints', step, '_CHECKPOINT_METADATA')} "
            f">/dev/null 2>&1")

  def describe(self) -> str:
    step = "a checkpoint" if self.step is None else f"checkpoint {self.step}"
    return f"{self.run_dir} ({step})"


@dataclasses.dataclass(frozen=True)
class File:
  """A file a job writes whole (metrics JSON, a BlockStore's manifest)."""
  path: str

  def exists(self) -> bool:
    return os.path.exists(self.path)

  def shell_test(self) -> Optional[str]:
    return f"test -e {shlex.quote(self.path)}"

  def describe(self) -> str:
    return self.path


Output = Union[TrainedRun, Index, Checkpoint, File]


# ------------------------------------------------------------------------------ deferred values


@dataclasses.dataclass(frozen=True)
class LatestCheckpoint:
  """The step directory of a run's newest finished checkpoint (a warm start's, an index's)."""
  run_dir: str
  kind = "latest_checkpoint"

  def resolve(self) -> str:
    from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
    step = checkpoints.latest_checkpoint_step(self.run_dir)
    if step is None:
      raise RuntimeError(f"{self.run_dir}: no finished checkpoint")
    return checkpoints.checkpoint_path(self.run_dir, step)


@dataclasses.dataclass(frozen=True)
class BestCheckpoint:
  """The step directory of the checkpoint REALM's authors would pick from a run: the best by
  its trainer's metric (best.json; `evaluation.runs.choose_checkpoint`), else the newest."""
  run_dir: str
  kind = "best_checkpoint"

  def choice(self) -> tuple[int, str]:
    """(step, why it was chosen); RuntimeError when the run has no finished checkpoint."""
    from realm_jax.evaluation import runs  # pylint: disable=g-import-not-at-top
    step, why = runs.choose_checkpoint(self.run_dir, None)
    if step is None:
      raise RuntimeError(f"{self.run_dir}: no finished pretraining checkpoint")
    return step, why

  def resolve(self) -> str:
    from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
    return checkpoints.checkpoint_path(self.run_dir, self.choice()[0])


@dataclasses.dataclass(frozen=True)
class LatestIndex:
  """The step of a run's newest published index (an int binding, unquoted)."""
  run_dir: str
  kind = "latest_index"

  def resolve(self) -> int:
    from realm_jax.index import store  # pylint: disable=g-import-not-at-top
    step = store.latest_index_step(self.run_dir)
    if step is None:
      raise RuntimeError(f"{self.run_dir}: no published index")
    return step


Deferred = Union[LatestCheckpoint, BestCheckpoint, LatestIndex]
_DEFERRED = {cls.kind: cls for cls in (LatestCheckpoint, BestCheckpoint, LatestIndex)}
_TOKEN = re.compile(r"\{(" + "|".join(_DEFERRED) + r"):([^{}]+)\}")


def token(value: Deferred) -> str:
  """A deferred value as text a command line carries until `resolve_tokens`."""
  return f"{{{value.kind}:{value.run_dir}}}"


def _placeholder(value: Any) -> Any:
  """A binding's value with a deferred value as its token (quoted as a path, bare as an int)."""
  if isinstance(value, LatestIndex):
    return gin_utils.GinText(token(value))
  if isinstance(value, (LatestCheckpoint, BestCheckpoint)):
    return token(value)
  return value


def resolve_tokens(argv: Sequence[str]) -> list[str]:
  """`argv` with every deferred value's token replaced by its value, read now."""
  return [_TOKEN.sub(lambda m: str(_DEFERRED[m.group(1)](m.group(2)).resolve()), arg)
          for arg in argv]


# ------------------------------------------------------------------------------ jobs and stages


@dataclasses.dataclass(frozen=True)
class Job:
  """One child: `python -m <module> --gin_file=... <flags> --gin.NAME=VALUE ... [--dry_run]`.

  Attributes: module; log: its log file's name; output: what it makes (None: nothing a later
  run can check); gin_files; flags: arguments before the bindings (`--once`, convert's
  `--hf_dir=...`); bindings: (name, value) pairs, values Python values, `gin_utils.GinText`
  or deferred values; dry_run: `--dry_run` last (the configuration checked, nothing run);
  inputs: what it reads, for the plan; role: where a pod runs it (TRAINER, BUILDER, HOST).
  """
  module: str
  log: str
  output: Optional[Output] = None
  gin_files: tuple[str, ...] = ()
  flags: tuple[str, ...] = ()
  bindings: Bindings = ()
  dry_run: bool = False
  inputs: tuple[str, ...] = ()
  role: str = HOST

  def __post_init__(self):
    if self.role not in ROLES:
      raise ValueError(f"role={self.role!r}: expected one of {ROLES}")

  def arguments(self, *, quote: str = "'") -> list[str]:
    """What follows `python -m <module>`, deferred values as tokens."""
    return [*(f"--gin_file={path}" for path in self.gin_files), *self.flags,
            *gin_utils.binding_flags(((name, _placeholder(value))
                                      for name, value in self.bindings), quote=quote),
            *(["--dry_run"] if self.dry_run else [])]

  def argv(self, python: str = sys.executable) -> list[str]:
    """The command line, deferred values as tokens (`resolve_tokens` before running it)."""
    return [python, "-m", self.module, *self.arguments()]

  def done(self) -> bool:
    return self.output is not None and self.output.exists()


@dataclasses.dataclass(frozen=True)
class Stage:
  """Jobs run together, one step of a recipe; done when its outputs exist and check out.

  Attributes: name, as printed; jobs; builder: with `pair`, the index builder that runs beside
  jobs[0], the trainer (`realm_jax_launch.local.run_local` on one machine, two slices on a
  pod), None for a trainer alone under the launcher; together: the jobs side by side (False:
  one after the other, e.g. trainings of a large BERT); done_when: the stage's own check,
  for jobs that leave nothing to check (dry runs), instead of its jobs' outputs.
  """
  name: str
  jobs: tuple[Job, ...]
  builder: Optional[Job] = None
  pair: bool = False
  together: bool = True
  done_when: Optional[Output] = None

  def __post_init__(self):
    if self.builder is not None and not self.pair:
      raise ValueError(f"{self.name}: a builder runs beside a trainer: pair=True")
    if self.pair and (len(self.jobs) != 1 or not isinstance(self.jobs[0].output, TrainedRun)):
      raise ValueError(f"{self.name}: a pair is one trainer (a TrainedRun) and its builder")

  def outputs(self) -> tuple[Output, ...]:
    if self.done_when is not None:
      return (self.done_when,)
    return tuple(job.output for job in self.jobs if job.output is not None)

  def done(self) -> bool:
    if self.done_when is not None:
      return self.done_when.exists()
    return all(job.done() for job in self.jobs)

  def pending(self) -> tuple[Job, ...]:
    """The jobs still to run (all of them when the stage's check is its own)."""
    if self.done_when is not None:
      return self.jobs
    return tuple(job for job in self.jobs if not job.done())


class Runner(Protocol):
  """How a recipe's stages run: processes on this machine (`realm_jax_launch.local`)."""

  def run_stage(self, stage: Stage, log_dir: str) -> None:
    """Runs the stage's pending jobs to completion; RuntimeError naming what failed."""


def shell_word(arg: str) -> str:
  """`arg` quoted for a shell, readably: `--gin.KEY="'value'"` rather than shlex's
  `'--gin.KEY='"'"'value'"'"''` where only double quotes are needed."""
  quoted = shlex.quote(arg)
  if quoted == arg or any(c in arg for c in '"$`\\!'):
    return quoted
  name, sep, value = arg.partition("=")
  if sep and arg.startswith("-") and shlex.quote(name) == name:
    return f'{name}="{value}"'
  return f'"{arg}"'


def _command_line(job: Job, python: str) -> str:
  return " ".join(shell_word(arg) for arg in job.argv(python))


def describe(stages: Sequence[Stage], *, log_dir: Optional[str] = None,
             python: str = "python") -> str:
  """A plan as text: each stage with what it reads, what it writes (what makes it done) and
  its commands, deferred values as their tokens."""
  lines = []
  for stage in stages:
    how = ("" if len(stage.jobs) + (stage.builder is not None) < 2 else
           " [trainer + index builder]" if stage.pair else
           " [side by side]" if stage.together else " [one after the other]")
    lines.append(f"{stage.name}{how}")
    inputs = list(dict.fromkeys(i for job in (*stage.jobs, stage.builder) if job
                                for i in job.inputs))
    if inputs:
      lines.append(f"  reads:  {', '.join(inputs)}")
    outputs = [output.describe() for output in stage.outputs()]
    if outputs:
      lines.append(f"  writes: {', '.join(outputs)}")
    for job in (*stage.jobs, stage.builder):
      if job is not None:
        log = f" > {os.path.join(log_dir, job.log)}" if log_dir else ""
        lines.append(f"  $ {_command_line(job, python)}{log}")
  return "\n".join(lines)
