r"""Shared t5x-style command-line handling of the gin-configured entry points.

`command` turns a gin-configurable main function into `python -m realm_jax.<prog>` (train,
build_index, evaluate): `--gin_file` (also looked up from the repository root), `--gin_bindings`
and `--gin.KEY=VALUE`, gin parsing, `--help`. Configuration mistakes are one-line
`ConfigError`s (exit 2). `run_command` ends every `python -m realm_jax.*`, the argparse ones
too: one line and an exit status for what it raises (1 a runtime error, 2 a configuration
error, 130 or 143 on SIGINT or SIGTERM). `exit_process` exits even when background threads
would hang. Design notes: docs/design/training_and_commands.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import glob
import inspect
import logging
import os
import re
import signal
import sys
import textwrap
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import gin
from absl import flags

from realm_jax import fileio

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ["ConfigError", "EXPECTED_ERRORS", "GinText", "HelpRequested", "Interrupted",
           "REPO_ROOT", "binding", "binding_flags", "command", "exit_process", "gin_value",
           "help_text", "one_line", "parse_binding", "parse_flags", "parse_gin", "report_error",
           "resolve_gin_file", "run_command", "run_job", "setup_logging", "split_gin_args"]

HELP_FLAGS = ("--help", "-h", "--helpshort", "--helpfull")


class ConfigError(ValueError):
  """A configuration mistake; entry points print it as one line and exit with status 2."""


class Interrupted(KeyboardInterrupt):
  """SIGINT or SIGTERM reached an entry point (`run_command`); a KeyboardInterrupt, so every
  `except KeyboardInterrupt` and `finally` on the way out runs as for Ctrl-C."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = int(signum)


# Signals an entry point turns into `Interrupted`: Ctrl-C, and how schedulers, `timeout`,
# `kill` and the launchers stop a job.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How long `exit_process` lets background threads finish before it stops waiting for them.
EXIT_THREAD_GRACE_SECONDS = 60.0


class HelpRequested(Exception):
  """`--help` on the command line: `run_job` prints the entry point's help and exits 0."""

  def __init__(self, values: flags.FlagValues):
    super().__init__("--help")
    self.values = values


def split_gin_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """Separates `--gin.KEY=VALUE` arguments (-> "KEY = VALUE" bindings) from the others."""
  bindings, rest = [], []
  for arg in argv:
    if arg.startswith("--gin."):
      key, sep, value = arg[len("--gin."):].partition("=")
      if not sep or not key:
        raise ConfigError(f"{arg!r}: expected --gin.KEY=VALUE, e.g. --gin.RUN_DIR=\"'/runs/x'\"")
      bindings.append(f"{key} = {value}")
    else:
      rest.append(arg)
  return bindings, rest


@dataclasses.dataclass(frozen=True)
class GinText:
  """A binding's value as gin text, taken as is: a `KEY=VALUE` given on a command line, a
  reference (`@fn()`, `%MACRO`) or a placeholder; `gin_value` renders every other value."""
  text: str


def gin_value(value: Any, *, quote: str = "'") -> str:
  """`value` as gin reads it: a string quoted with `quote` (Python's repr when it holds that
  quote, a backslash or an unprintable character), GinText as is, anything else (None, bools,
  numbers, tuples) as its repr."""
  if isinstance(value, GinText):
    return value.text
  if isinstance(value, str) and quote not in value and "\\" not in value and value.isprintable():
    return f"{quote}{value}{quote}"
  return repr(value)


def binding(name: str, value: Any, *, quote: str = "'") -> str:
  """One gin binding as `NAME=VALUE` text (`gin_value`): what `--gin.NAME=VALUE` carries."""
  return f"{name}={gin_value(value, quote=quote)}"


def binding_flags(bindings: Iterable[tuple[str, Any]], *, quote: str = "'") -> list[str]:
  """(name, value) pairs as `--gin.NAME=VALUE` arguments, in order (gin: the last one wins).
  The one place where a command line's gin bindings are written (`split_gin_args` reads
  them)."""
  return [f"--gin.{binding(name, value, quote=quote)}" for name, value in bindings]


def parse_binding(text: str) -> tuple[str, GinText]:
  """A `KEY=VALUE` binding given as text (a flag, a bench's row) as a (KEY, GinText(VALUE))
  pair, both kept exactly as written; ValueError without a key or an "="."""
  key, sep, value = text.partition("=")
  if not sep or not key:
    raise ValueError(f"{text!r}: expected KEY=VALUE, e.g. NUM_STEPS=1000 or "
                     "INIT_CHECKPOINT=\"'/mnt/ict/checkpoints/1000'\"")
  return key, GinText(value)


def one_line(error: BaseException) -> str:
  """`error` as one line, without gin's "In call to configurable ..." noise."""
  lines = [line.strip() for line in str(error).splitlines()
           if line.strip() and not line.strip().startswith("In call to configurable")]
  text = " ".join(lines)
  match = re.search(r"(\w+)/macro\.value set to `%gin\.REQUIRED`", text)
  if match:
    return (f"required macro {match.group(1)} is not set; pass "
            f"--gin.{match.group(1)}=\"'...'\" (see the header of the run gin)")
  return text or type(error).__name__


def resolve_gin_file(path: str) -> str:
  """`path` if it exists, else the same relative path under the repository root."""
  if os.path.exists(path) or os.path.isabs(path):
    return path
  candidate = os.path.join(REPO_ROOT, path)
  if os.path.exists(candidate):
    return candidate
  raise ConfigError(f"gin file {path!r} not found (looked in {os.getcwd()} and {REPO_ROOT})")


def parse_flags(argv: Sequence[str], booleans: Optional[Mapping[str, str]] = None, *,
                multi_strings: Optional[Mapping[str, str]] = None) -> flags.FlagValues:
  """Parses --gin_file, --gin_bindings, the given boolean flags ({name: help}) and the given
  repeatable string flags ({name: help}, e.g. evaluate's --question).

  Uses a private FlagValues, so an entry point's main() can run many times in one process.
  `argv[0]` is the program name. Raises ConfigError (one line) on an unknown or bad flag, and
  HelpRequested on `--help` (or -h).
  """
  values = flags.FlagValues()
  flags.DEFINE_multi_string("gin_file", [], "Gin files (repeatable); relative paths are also "
                            "looked up from the repository root.", flag_values=values)
  flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings, e.g. 'RUN_DIR = \"/x\"' "
                            "(repeatable).", flag_values=values)
  for name, text in (booleans or {}).items():
    flags.DEFINE_boolean(name, False, text, flag_values=values)
  for name, text in (multi_strings or {}).items():
    flags.DEFINE_multi_string(name, [], text, flag_values=values)
  if any(arg in HELP_FLAGS for arg in argv[1:]):
    raise HelpRequested(values)
  try:
    values(list(argv))
  except flags.Error as e:
    raise ConfigError(one_line(e)) from e
  return values


def _unparsable_binding(bindings: Sequence[str]) -> Optional[ConfigError]:
  """After gin refused a value ("Unable to parse value. (line 1)", naming nothing): the
  command-line binding whose value does not parse, with the likely fix; None if none."""
  for binding in bindings:
    key, sep, value = binding.partition("=")
    if not sep:
      continue
    try:
      gin.config.parse_value(value.strip())
    except SyntaxError as e:
      return ConfigError(
          f"cannot parse the value of {key.strip()} ({value.strip()!r}: {e}); a string needs "
          f"quotes that reach gin, inside the shell's: --gin.{key.strip()}=\"'{value.strip()}'\"")
    except Exception:  # noqa: BLE001 - e.g. a reference to a configurable: gin's to judge
      continue
  return None


def _references(value) -> list[gin.config.ConfigurableReference]:
  """The `@configurable` and `%MACRO` references in a bound value, nested ones too."""
  if isinstance(value, gin.config.ConfigurableReference):
    return [value]
  if isinstance(value, dict):
    value = list(value.values())
  if isinstance(value, (list, tuple, set)):
    return [reference for item in value for reference in _references(item)]
  return []


def _referenced_macros() -> set[str]:
  """Names of the macros some binding of the parsed config refers to (`%NAME`)."""
  macro = "/gin.macro"  # the scoped selector of %NAME is "NAME/gin.macro"
  return {reference.scoped_selector[:-len(macro)]
          for bound in gin.config._CONFIG.values()  # pylint: disable=protected-access
          for reference in _references(bound) if reference.scoped_selector.endswith(macro)}


def effective_bindings(gin_file: str, *, root: str = REPO_ROOT) -> dict[str, dict[str, str]]:
  """What `gin_file` configures, whatever way it is written: {configurable: {parameter: repr of
  its value}}, for every configurable the file (with its includes, looked up from `root`) binds
  or refers to, each with all its parameters that have a value, the file's or the Python default
  it leaves in place; macros as "%NAME": {"value": ...}. Comments, line order, the file of the
  include tree a binding stands in and a binding that restates its default leave it unchanged; a
  value that changes, in the file or as a Python default, changes it. The configurables must be
  registered (their modules imported). Clears gin's config before and after."""
  config = gin.config
  prefixes = list(config._LOCATION_PREFIXES)  # pylint: disable=protected-access
  config._LOCATION_PREFIXES[:] = [root]  # pylint: disable=protected-access
  gin.clear_config()
  try:
    with gin.unlock_config():
      gin.parse_config_files_and_bindings([os.path.join(root, gin_file)], [],
                                          finalize_config=False)
    # pylint: disable-next=protected-access
    bound = {key: dict(values) for key, values in config._CONFIG.items()}
  finally:
    gin.clear_config()
    config._LOCATION_PREFIXES[:] = prefixes  # pylint: disable=protected-access
  referenced = {(_scope_of(reference), reference.configurable.selector)
                for values in bound.values() for reference in _references(values)}
  effective: dict[str, dict[str, str]] = {}
  for scope, selector in sorted(set(bound) | referenced):
    values = bound.get((scope, selector), {})
    if selector == "gin.macro":
      effective[f"%{scope}"] = {name: _canonical(value) for name, value in values.items()}
      continue
    if selector == "gin.constant":
      continue  # %gin.REQUIRED and the like: named by the macro that holds them
    wrapped = config._REGISTRY.get_match(selector).wrapped  # pylint: disable=protected-access
    defaults = {name: parameter.default
                for name, parameter in inspect.signature(wrapped).parameters.items()
                if parameter.default is not inspect.Parameter.empty}
    effective["/".join(filter(None, (scope, selector)))] = {
        name: _canonical(value) for name, value in sorted({**defaults, **values}.items())}
  return effective


def _scope_of(reference: gin.config.ConfigurableReference) -> str:
  """The scope a reference calls its configurable in ("" for none): `@eval/Job()` -> "eval"."""
  return "/".join(reference.scopes)


def _canonical(value) -> str:
  """A bound value as text that does not depend on how the file names a configurable: a
  reference by its full selector (`@realm_jax.jobs.pretrain.PretrainJob()`, not
  `@PretrainJob()`), a macro as `%NAME`, anything else as its repr."""
  if isinstance(value, gin.config.ConfigurableReference):
    selector = value.configurable.selector
    if selector in ("gin.macro", "gin.constant"):
      return f"%{_scope_of(value)}"
    call = "()" if value.evaluate else ""
    return f"@{'/'.join(filter(None, (_scope_of(value), selector)))}{call}"
  if isinstance(value, (list, tuple)):
    items = ", ".join(_canonical(item) for item in value)
    return f"[{items}]" if isinstance(value, list) else f"({items}{',' if len(value) == 1 else ''})"
  if isinstance(value, dict):
    return "{" + ", ".join(f"{key!r}: {_canonical(item)}" for key, item in value.items()) + "}"
  if value is gin.REQUIRED:
    return "%gin.REQUIRED"
  if callable(value) and hasattr(value, "__qualname__"):
    return f"{value.__module__}.{value.__qualname__}"
  text = repr(value)
  if " at 0x" in text:  # an address differs from process to process
    raise ValueError(f"no stable text for the value {text}")
  return text


def _check_macros_used(bindings: Sequence[str]) -> None:
  """A macro set on the command line that no binding uses is a typo (`--gin.BATCHSIZE=16`
  for BATCH_SIZE): refused, with the macros that are used."""
  used = _referenced_macros()
  for binding in bindings:
    key = binding.partition("=")[0].strip()
    if not key or "." in key or "/" in key or key in used:
      continue  # a function's parameter (gin checks those), or a macro in use
    close = difflib.get_close_matches(key, sorted(used), n=3)
    raise ConfigError(f"macro {key} is set on the command line but no binding uses it"
                      + (f" (did you mean {' or '.join(close)}?)" if close else
                         f" (the macros in use: {', '.join(sorted(used)) or 'none'})"))


def parse_gin(gin_files: Sequence[str], bindings: Sequence[str]) -> None:
  """Clears gin's config, then parses the files (resolved) and bindings; ConfigError on error,
  also for a binding whose value does not parse and for a macro that nothing uses."""
  if not gin_files:
    raise ConfigError("no --gin_file given")
  gin.clear_config()
  # `include 'gin_configs/...'` inside a gin file also resolves from the repository root.
  if REPO_ROOT not in gin.config._LOCATION_PREFIXES:  # pylint: disable=protected-access
    gin.add_config_file_search_path(REPO_ROOT)
  try:
    gin.parse_config_files_and_bindings([resolve_gin_file(f) for f in gin_files], list(bindings))
  except ConfigError:
    raise
  except SyntaxError as e:
    raise (_unparsable_binding(bindings) or ConfigError(one_line(e))) from e
  except Exception as e:  # noqa: BLE001 - gin raises ValueError, IOError, SyntaxError, ...
    raise ConfigError(one_line(e)) from e
  _check_macros_used(bindings)


EXPECTED_ERRORS = (ValueError, OSError, RuntimeError)


def report_error(prog: str, error: BaseException, expected: tuple[type, ...],
                 describe: Optional[Callable[[BaseException], str]] = None) -> int:
  """Prints a job's runtime error as one line `<prog>: error: ...` and returns exit status 1.

  Errors of the `expected` types explain themselves (bad data, a refused checkpoint); anything
  else is probably a bug, so its traceback is logged too. `describe(error)` words the line
  (default: the error's type and `one_line(error)`); what it returns is folded to one line.
  """
  if not isinstance(error, expected):
    logging.getLogger(prog).error("unexpected error", exc_info=error)
  text = (describe(error) if describe is not None
          else f"{type(error).__name__}: {one_line(error)}")
  text = " ".join(line.strip() for line in text.splitlines() if line.strip())
  print(f"{prog}: error: {text}", file=sys.stderr, flush=True)
  return 1


def run_command(prog: str, fn: Callable[[], int], *, interrupted: str,
                expected: tuple[type, ...] = EXPECTED_ERRORS,
                describe: Optional[Callable[[BaseException], str]] = None) -> int:
  """Runs a command-line entry point's work, `fn()`, and turns what it raises into one line on
  stderr and the exit status; every `python -m realm_jax.*` goes through here.

  Exit statuses: fn's own; 2 a ConfigError or `fileio.RunDirInUse`; 130 (SIGINT) or 143
  (SIGTERM) with `<prog>: interrupted ...; <interrupted>`; 1 any other error (`report_error`,
  worded by `describe`). SIGINT and SIGTERM raise `Interrupted` while `fn` runs, even when the
  process inherited SIGINT ignored.
  """
  with _stop_signals_interrupt():
    try:
      return fn()
    except ConfigError as e:
      # gin appends "In call to configurable ..." to errors raised inside the configurable.
      print(f"{prog}: config error: {one_line(e)}", file=sys.stderr, flush=True)
      return 2
    except fileio.RunDirInUse as e:
      print(f"{prog}: error: {one_line(e)}", file=sys.stderr, flush=True)
      return 2
    except KeyboardInterrupt as e:
      signum = e.signum if isinstance(e, Interrupted) else int(signal.SIGINT)
      how = "" if signum == signal.SIGINT else f" ({signal.Signals(signum).name})"
      print(f"{prog}: interrupted{how}; {interrupted}", file=sys.stderr, flush=True)
      return 128 + signum
    except Exception as e:  # noqa: BLE001
      return report_error(prog, e, expected, describe)


def _raise_interrupted(signum, frame) -> None:
  del frame
  raise Interrupted(signum)


class _stop_signals_interrupt:  # pylint: disable=invalid-name
  """Installs `_raise_interrupted` for STOP_SIGNALS while in the block (main thread only: the
  only thread Python delivers signals to), and puts the previous handlers back after."""

  def __enter__(self):
    self._previous = {}
    if threading.current_thread() is threading.main_thread():
      for sig in STOP_SIGNALS:
        self._previous[sig] = signal.signal(sig, _raise_interrupted)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def exit_process(status: int, prog: str, *, grace_seconds: float = EXIT_THREAD_GRACE_SECONDS):
  """Ends a `python -m` entry point with `status`: `sys.exit(status)`, which waits for every
  non-daemon thread. When such threads are still running after `grace_seconds` (Orbax's
  signalling threads after a checkpoint save that failed wait for ever), says so on stderr and
  exits with `status` regardless (`os._exit`, after flushing the streams and the logs)."""
  deadline = time.monotonic() + grace_seconds
  for thread in threading.enumerate():
    if thread is not threading.main_thread() and not thread.daemon:
      thread.join(max(0.0, deadline - time.monotonic()))
  left = [t.name for t in threading.enumerate()
          if t is not threading.main_thread() and not t.daemon and t.is_alive()]
  if left:
    print(f"{prog}: {len(left)} background thread(s) still running after {grace_seconds:g}s "
          f"({', '.join(left[:5])}); exiting with status {status} without them",
          file=sys.stderr, flush=True)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
  sys.exit(status)


def setup_logging() -> None:
  """INFO logs on stderr with time and logger name; absl (Orbax's INFO chatter) at WARNING.

  Call it before importing Orbax: a warning logged while importing it installs a root handler
  at WARNING, after which `basicConfig` does nothing; the level is set regardless, so progress
  lines show either way."""
  logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                      format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  logging.getLogger().setLevel(logging.INFO)
  logging.getLogger("absl").setLevel(logging.WARNING)


def _argument_docs(fn: Callable) -> dict[str, str]:
  """{argument: its description} from the "Args:" section of `fn`'s (Google-style) docstring,
  or for a class from the "Attributes:" sections of it and its bases (a job's settings)."""
  docs: dict[str, str] = {}
  sources = inspect.getmro(fn) if inspect.isclass(fn) else (fn,)
  for source in reversed(sources):  # a subclass's description wins
    name, in_args = None, False
    for line in (inspect.getdoc(source) or "").splitlines():
      if line.strip() in ("Args:", "Attributes:"):
        in_args = True
      elif in_args and line and not line.startswith(" "):
        in_args = False  # the next section (Returns:, Raises:)
      elif in_args:
        match = re.match(r"^  (\w+)(?: \([^)]*\))?: ?(.*)$", line)
        if match:
          name = match.group(1)
          docs[name] = match.group(2).strip()
        elif name and line.strip():
          docs[name] += " " + line.strip()
  return docs


def help_text(doc: str, values: flags.FlagValues, configurables: Sequence[Callable]) -> str:
  """An entry point's `--help`: its module docstring, its flags, every setting of its
  gin-configurable functions (default and description) and the gin files that bind them."""
  wrap = lambda text, indent: textwrap.fill(text, 100, initial_indent=indent,
                                            subsequent_indent=indent)
  parts = [textwrap.dedent(doc).strip(), "", "Flags:"]
  for name in sorted(values):
    flag = values[name]
    if flag.name != name:  # absl lists a flag under its short name too
      continue
    # absl appends "; repeat this option ..." to a repeatable flag's help: said by ours.
    text = re.sub(r";\s*repeat this option to specify a list of values$", "", flag.help)
    parts += [f"  --{name}" + (f" (default {flag.default!r})" if flag.default not in (None, [])
                               else ""), wrap(text, "      ")]
  parts.append("  --gin.KEY=VALUE  the same as --gin_bindings='KEY = VALUE'")
  for fn in configurables:
    parts += ["", wrap(f"Gin-configurable settings of {fn.__name__} (bind them in a gin file or "
                       f"with --gin.{fn.__name__}.NAME=VALUE; strings need inner quotes, "
                       f"--gin.{fn.__name__}.NAME=\"'text'\"):", "")]
    docs = _argument_docs(fn)
    for name, parameter in inspect.signature(fn).parameters.items():
      default = parameter.default
      if default is gin.REQUIRED:
        shown = " (required: a gin file or a macro sets it)"
      elif default is inspect.Parameter.empty:
        shown = ""
      else:
        shown = f" = {default!r}"
      parts.append(f"  {name}{shown}")
      if docs.get(name):
        parts.append(wrap(docs[name], "      "))
  gin_dirs = [os.path.join("gin_configs", sub) for sub in ("runs", "experiments", "models")]
  parts += ["", wrap("Gin files (a relative path is also looked up from the repository root; "
                     "each one's header says what it needs):", "")]
  for directory in gin_dirs:
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO_ROOT, directory,
                                                                       "*.gin")))
    if names:
      parts.append(wrap(f"{directory}/: " + ", ".join(names), "  "))
  return "\n".join(parts) + "\n"


def run_job(prog: str, job: Callable[[], int], *, started: Callable[[], bool],
            interrupted: str, expected: tuple[type, ...] = EXPECTED_ERRORS,
            doc: str = "", configurables: Sequence[Callable] = ()) -> int:
  """Runs a gin-configured entry point's `job()` (flag and gin parsing, then its gin-configured
  main) through `run_command`.

  Exit statuses: those of `run_command`, and 0 after printing the help (`doc`, the flags and
  the settings of `configurables`) on `--help`; any error before `started()` is true is a
  configuration error, 2 (gin refused the call: an unknown or missing binding, a bad macro
  value).
  """

  def guarded() -> int:
    try:
      return job()
    except HelpRequested as e:
      sys.stdout.write(help_text(doc, e.values, configurables))
      sys.stdout.flush()
      return 0
    except ConfigError:
      raise
    except Exception as e:  # noqa: BLE001
      if not started():
        raise ConfigError(one_line(e)) from e
      raise

  return run_command(prog, guarded, interrupted=interrupted, expected=expected)


@dataclasses.dataclass(frozen=True)
class _Command:
  """What `command` needs besides the function (see there)."""
  prog: str
  doc: str
  example_gin: str
  interrupted: str
  booleans: Mapping[str, str]
  multi_strings: Mapping[str, str]
  arguments: Mapping[str, str]
  extra_bindings: Optional[Callable[[flags.FlagValues], list[str]]]
  expected: tuple[type, ...]
  configurables: Sequence[Callable]


def command(prog: str, *, doc: str, example_gin: str, interrupted: str,
            booleans: Optional[Mapping[str, str]] = None,
            multi_strings: Optional[Mapping[str, str]] = None,
            arguments: Optional[Mapping[str, str]] = None,
            extra_bindings: Optional[Callable[[flags.FlagValues], list[str]]] = None,
            expected: tuple[type, ...] = EXPECTED_ERRORS,
            configurables: Sequence[Callable] = ()) -> Callable[[Callable[..., int]], Any]:
  """Decorates an entry point's main function: gin-configurable under its own name, with a
  `.main(argv) -> exit status` attribute that is the whole `python -m realm_jax.<prog>`.

  `.main` parses the gin flags, the `booleans` flags ({name: help}, passed as True) and the
  `multi_strings` flags ({name: help}, passed as lists; `arguments` maps a flag to another
  argument name), adds `extra_bindings(flag values)`, calls the function through gin and maps
  what it raises with `run_job` (an error before the body starts is a config error, exit 2).
  `--help` shows `doc`, the flags and the settings of the function and of `configurables`.
  """
  spec = _Command(prog, doc, example_gin, interrupted, dict(booleans or {}),
                  dict(multi_strings or {}), dict(arguments or {}), extra_bindings,
                  tuple(expected), tuple(configurables))

  def decorate(fn: Callable[..., int]):
    parameters = inspect.signature(fn).parameters
    for flag in [*spec.booleans, *spec.multi_strings]:
      if spec.arguments.get(flag, flag) not in parameters:
        raise TypeError(f"{fn.__name__} has no argument {spec.arguments.get(flag, flag)!r} for "
                        f"--{flag}")
    started = [False]  # per entry point: whether gin got as far as calling the body

    @functools.wraps(fn)
    def body(*args, **kwargs) -> int:
      started[0] = True
      return fn(*args, **kwargs)

    configurable = gin.configurable(fn.__name__)(body)

    def main(argv: Optional[Sequence[str]] = None) -> int:
      """Entry point; returns the exit status."""
      argv = list(sys.argv if argv is None else argv)
      setup_logging()
      started[0] = False

      def job() -> int:
        bindings, rest = split_gin_args(argv[1:])
        values = parse_flags([argv[0] if argv else spec.prog] + rest, spec.booleans,
                             multi_strings=spec.multi_strings)
        if not values.gin_file:
          raise ConfigError(f"no --gin_file given (e.g. --gin_file={spec.example_gin})")
        bindings = list(values.gin_bindings) + bindings
        if spec.extra_bindings is not None:
          bindings += spec.extra_bindings(values)
        parse_gin(values.gin_file, bindings)
        overrides = {spec.arguments.get(name, name): True for name in spec.booleans
                     if values[name].value}
        overrides.update({spec.arguments.get(name, name): list(values[name].value)
                          for name in spec.multi_strings if values[name].value})
        return configurable(**overrides)

      return run_job(spec.prog, job, started=lambda: started[0], interrupted=spec.interrupted,
                     expected=spec.expected, doc=spec.doc,
                     configurables=(fn, *spec.configurables))

    # `main` belongs to the entry point's module (e.g. `sys.modules[main.__module__].__doc__`).
    main.__module__ = fn.__module__
    main.__qualname__ = f"{fn.__qualname__}.main"
    configurable.main = main
    return configurable

  return decorate
