"""`gin_utils.command` (a gin-configurable main function as the whole entry point) on a tiny
command of its own, and `gin_utils.run_command` (errors to exit statuses) as every argparse
entry point uses it. In-process, gin's config cleared around each test."""

import importlib
import sys

import gin
import pytest

from realm_jax import gin_utils

pytestmark = pytest.mark.usefixtures("clean_gin")

DOC = """The tiny command: greets someone.

  tiny --gin_file=tiny.gin [--loud] [--word=W ...]
"""


def _more_words(values) -> list[str]:
  return ["tiny_main.separator = '+'"] if values.word else []


@gin_utils.command(
    "tiny", doc=DOC, example_gin="tiny.gin", interrupted="nothing was greeted",
    booleans={"loud": "Shout (overrides the gin binding)."},
    multi_strings={"word": "A word to add (repeatable)."}, arguments={"word": "words"},
    extra_bindings=_more_words)
def tiny_main(name: str = gin.REQUIRED, count: int = 1, loud: bool = False,
              words=(), separator: str = " ", fail: str = "") -> int:
  """Greets `name`.

  Args:
    name: who to greet.
    count: how many times
      (at least once).
    loud: upper-case the greeting.
    words: words added after the name.
    separator: between the words.
    fail: "runtime", "interrupt" or "bug": raise that instead.
  """
  if fail == "runtime":
    raise RuntimeError("the body failed\n  on two lines")
  if fail == "interrupt":
    raise KeyboardInterrupt
  if fail == "bug":
    raise KeyError("no such thing")
  text = separator.join(["hello", name, *words] * count)
  print(text.upper() if loud else text)
  return 0


@pytest.fixture
def gin_file(tmp_path):
  path = tmp_path / "tiny.gin"
  path.write_text("NAME = 'ada'\ntiny_main.name = %NAME\ntiny_main.loud = False\n")
  return f"--gin_file={path}"


def _run(capsys, *args):
  code = tiny_main.main(["tiny", *args])
  out, err = capsys.readouterr()
  return code, out.strip().splitlines(), err.strip().splitlines()


def test_runs_the_function_through_gin(gin_file, capsys):
  assert _run(capsys, gin_file) == (0, ["hello ada"], [])
  assert _run(capsys, gin_file, "--gin.tiny_main.count=2", "--gin.NAME='bo'") == (
      0, ["hello bo hello bo"], [])
  assert sys.modules[tiny_main.main.__module__].__doc__ == __doc__


def test_a_boolean_flag_overrides_the_gin_binding(gin_file, capsys):
  assert _run(capsys, gin_file, "--loud") == (0, ["HELLO ADA"], [])
  assert _run(capsys, gin_file, "--gin.tiny_main.loud=True") == (0, ["HELLO ADA"], [])


def test_a_repeatable_flag_sets_its_argument_and_may_add_bindings(gin_file, capsys):
  assert _run(capsys, gin_file, "--word=x", "--word=y") == (0, ["hello+ada+x+y"], [])


def test_binding_an_unknown_parameter_is_a_one_line_config_error(gin_file, capsys):
  code, out, err = _run(capsys, gin_file, "--gin.tiny_main.colour=3")
  assert code == 2 and not out and len(err) == 1, err
  assert err[0].startswith("tiny: config error: ") and "colour" in err[0], err


def test_no_gin_file_names_the_example(capsys):
  code, _, err = _run(capsys, "--loud")
  assert code == 2 and err == ["tiny: config error: no --gin_file given (e.g. "
                               "--gin_file=tiny.gin)"], err


def test_an_error_in_the_body_is_one_line_and_status_1(gin_file, capsys):
  code, _, err = _run(capsys, gin_file, "--gin.tiny_main.fail='runtime'")
  assert code == 1 and err == ["tiny: error: RuntimeError: the body failed on two lines"], err


def test_an_unexpected_error_keeps_its_traceback_in_the_log(gin_file, capsys, caplog):
  code, _, err = _run(capsys, gin_file, "--gin.tiny_main.fail='bug'")
  assert code == 1 and err[-1] == "tiny: error: KeyError: 'no such thing'", err
  assert any(r.exc_info and issubclass(r.exc_info[0], KeyError) for r in caplog.records)


def test_interrupted_is_130_with_what_it_means(gin_file, capsys):
  code, _, err = _run(capsys, gin_file, "--gin.tiny_main.fail='interrupt'")
  assert code == 130 and err == ["tiny: interrupted; nothing was greeted"], err


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_the_flags_and_settings(flag, capsys):
  code, out, err = _run(capsys, "--gin.NAME='x'", flag)  # --help wins, even without --gin_file
  assert code == 0 and not err, err
  text = "\n".join(out)
  assert text.startswith("The tiny command: greets someone.")
  for line in ("  --loud", "      Shout (overrides the gin binding).", "  --word",
               "  --gin_file", "  --gin.KEY=VALUE", "Gin-configurable settings of tiny_main",
               "  name (required: a gin file or a macro sets it)", "  count = 1",
               "      how many times (at least once).", "  separator = ' '"):
    assert any(shown == line or shown.startswith(line + " ") for shown in out), (
        line, text)


def test_a_flag_without_an_argument_is_refused_when_decorating():
  with pytest.raises(TypeError, match="no argument 'verbose' for --verbose"):
    gin_utils.command("bad", doc="", example_gin="x.gin", interrupted="",
                      booleans={"verbose": "?"})(lambda name="x": 0)


# ------------------------------------------------------------------------------ run_command


def _raiser(error):
  def fail(*args, **kwargs):
    raise error
  return fail


def _build_corpus(tmp_path, monkeypatch, error):
  from realm_jax import build_corpus  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(build_corpus.sources_lib, "make_source", _raiser(error))
  return build_corpus.main, ["--source", "jsonl", "--input", "x", "--out", str(tmp_path / "z")]


def _generator(module_name, out):
  """A data generator command (`python -m realm_jax.data.<module_name> --out ...`) whose
  `generate` fails."""

  def setup(tmp_path, monkeypatch, error):
    module = importlib.import_module(f"realm_jax.data.{module_name}")
    monkeypatch.setattr(module, "generate", _raiser(error))
    return module.main, ["--out", str(tmp_path / out)]

  return setup


def _convert(tmp_path, monkeypatch, error):
  from realm_jax.convert import hf  # pylint: disable=import-outside-toplevel
  fail = _raiser(error)
  fail.__doc__ = hf.write_checkpoint.__doc__  # the command's description
  monkeypatch.setattr(hf, "write_checkpoint", fail)
  return hf.main, ["--hf_dir", str(tmp_path), "--run_dir", str(tmp_path / "run")]


def _parity(tmp_path, monkeypatch, error):
  from realm_jax.convert import parity  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(parity, "run", _raiser(error))
  return parity.main, ["--size", "tiny"]


def _toy_bert(tmp_path, monkeypatch, error):
  from realm_jax import toy_bert  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(toy_bert, "measure", _raiser(error))
  return toy_bert.main, ["--measure_only", "--out", str(tmp_path)]


def _recipe(tmp_path, monkeypatch, error):
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  from realm_jax import recipe  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(realm_jax_tasks, "toy_block_store_dir", lambda: str(tmp_path))
  monkeypatch.setattr(recipe, "Recipe", lambda *args, **kwargs: type(
      "FailingRecipe", (), {"run": _raiser(error)})())
  return recipe.main, ["--out", str(tmp_path / "recipe"), "--toy_bert", "none"]


RENAMED = "nothing was written to --out (it is renamed into place only when complete)"
# (entry point, its prog, an error of a kind it reports without a traceback, the line, what an
# interruption means)
ARGPARSE_COMMANDS = {
    "build_corpus": (_build_corpus, ValueError("line 2:\n  malformed JSON"),
                     "build_corpus: error: line 2: malformed JSON",
                     "build_corpus: interrupted; nothing was written to --out"),
    "python_docs": (_generator("python_docs", "docs"), OSError("disk full"),
                    "python_docs: error: disk full", f"python_docs: interrupted; {RENAMED}"),
    "toy_world": (_generator("toy_world", "world"),
                  FileExistsError("/x/world exists; pass --overwrite"),
                  "toy_world: error: /x/world exists; pass --overwrite",
                  f"toy_world: interrupted; {RENAMED}"),
    "convert": (_convert, ValueError("no config.json"), "convert: error: no config.json",
                "convert: interrupted; no checkpoint was written (one is renamed into place "
                "only when complete)"),
    "parity": (_parity, ImportError("no torch"), "parity: error: ImportError: no torch",
               "parity: interrupted; nothing was written"),
    "toy_bert": (_toy_bert, RuntimeError("no weights"), "toy_bert: error: no weights",
                 "toy_bert: interrupted; each phase resumes from its last checkpoint in "
                 "--work_dir: run the same command again"),
    "recipe": (_recipe, RuntimeError("stage ict exited with status 3; see ict.log"),
               "recipe: error: stage ict exited with status 3; see ict.log",
               "recipe: interrupted; run the same command to resume"),
}


@pytest.mark.parametrize("name", sorted(ARGPARSE_COMMANDS))
def test_argparse_entry_points_share_the_exit_statuses(name, tmp_path, monkeypatch, capsys):
  setup, error, error_line, interrupted_line = ARGPARSE_COMMANDS[name]
  monkeypatch.chdir(tmp_path)  # toy_bert and recipe change to the repository root
  main, argv = setup(tmp_path, monkeypatch, error)
  assert main(argv) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err and err[-1] == error_line, err
  main, argv = setup(tmp_path, monkeypatch, KeyboardInterrupt())
  assert main(argv) == 130
  assert capsys.readouterr().err.strip().splitlines() == [interrupted_line]
  # argparse: a usage error is status 2 (toy_bert passes unknown flags on to gin).
  with pytest.raises(SystemExit) as usage:
    main(argv + (["--examples=many"] if name == "toy_bert" else ["--no_such_flag"]))
  assert usage.value.code == 2


# ------------------------------------------------------ signals, a held run directory, exiting

# A stand-in entry point: its work, run through run_command, says "ready" and sleeps; it exits
# through exit_process, with a non-daemon thread that never ends when asked (as Orbax's
# signalling threads after a lost checkpoint save).
ENTRY_POINT = r'''
import sys, threading, time
from realm_jax import fileio, gin_utils

what = sys.argv[1]
if what == "stuck_thread":
  threading.Thread(target=threading.Event().wait, name="never-ends").start()

def work():
  if what == "in_use":
    raise fileio.RunDirInUse("/runs/x is in use by another trainer (pid 7 on h, started t)")
  if what == "stuck_thread":
    raise RuntimeError("the save was lost")
  print("ready", flush=True)
  time.sleep(60)
  return 0

gin_utils.exit_process(gin_utils.run_command("standin", work, interrupted="rerun it"),
                       "standin", grace_seconds=1)
'''


def _entry_point(what, *, sigint_ignored=False):
  """The stand-in, started (with `sigint_ignored`) with SIGINT ignored, as a shell starts a
  background job: bash ignores it and exec keeps that."""
  import subprocess  # pylint: disable=import-outside-toplevel
  argv = [sys.executable, "-c", ENTRY_POINT, what]
  if sigint_ignored:
    argv = ["bash", "-c", "trap '' INT; exec \"$0\" \"$@\"", *argv]
  return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("signame,status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_sigint_and_sigterm_stop_an_entry_point_even_with_sigint_inherited_ignored(signame,
                                                                                   status):
  import signal  # pylint: disable=import-outside-toplevel
  proc = _entry_point("sleep", sigint_ignored=True)
  try:
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(getattr(signal, signame))
    out, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  how = "" if signame == "SIGINT" else f" ({signame})"
  assert proc.returncode == status and err.strip().splitlines()[-1] == \
      f"standin: interrupted{how}; rerun it", err


def test_a_run_directory_in_use_is_one_line_and_status_2():
  proc = _entry_point("in_use")
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 2
  assert err.strip() == ("standin: error: /runs/x is in use by another trainer (pid 7 on h, "
                         "started t)"), err


def test_exit_process_does_not_wait_for_ever_on_a_thread_that_never_ends():
  proc = _entry_point("stuck_thread")
  _, err = proc.communicate(timeout=60)  # without exit_process, the interpreter waits for ever
  lines = err.strip().splitlines()
  assert proc.returncode == 1
  assert lines[-2] == "standin: error: RuntimeError: the save was lost", lines
  assert lines[-1] == ("standin: 1 background thread(s) still running after 1s (never-ends); "
                       "exiting with status 1 without them"), lines


@gin.configurable
def effective_probe_main(run_dir: str = gin.REQUIRED, steps: int = 10, rate: float = 0.5,
                         job=None, shape=(-1, 1)):
  del run_dir, steps, rate, job, shape


@gin.configurable
class EffectiveProbeJob:

  def __init__(self, width: int = 4, activation=abs):
    del width, activation


def _write(root, files: dict) -> None:
  for relative, text in files.items():
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_effective_bindings_are_what_a_gin_configures_however_it_is_written(tmp_path):
  registry = gin.config._REGISTRY  # pylint: disable=protected-access
  main = registry.get_match("effective_probe_main").selector
  job = registry.get_match("EffectiveProbeJob").selector
  _write(tmp_path, {
      "gin_configs/models/m.gin": "EffectiveProbeJob.width = 8\n",
      "gin_configs/experiments/a.gin": (
          "include 'gin_configs/models/m.gin'\n"
          "RUN = %gin.REQUIRED\n"
          "effective_probe_main.run_dir = %RUN\n"
          "effective_probe_main.job = @EffectiveProbeJob()\n")})
  effective = gin_utils.effective_bindings("gin_configs/experiments/a.gin", root=str(tmp_path))
  # Worked by hand: every parameter with a value, the file's or the default it leaves.
  assert effective == {
      "%RUN": {"value": "%gin.REQUIRED"},
      main: {"job": f"@{job}()", "rate": "0.5", "run_dir": "%RUN", "shape": "(-1, 1)",
             "steps": "10"},
      job: {"activation": "builtins.abs", "width": "8"}}
  assert not gin.config._CONFIG  # pylint: disable=protected-access  (cleared after)

  # Written otherwise: comments, the included gin moved, its binding moved into the file, a
  # default restated, the configurable named by its full selector.
  _write(tmp_path, {
      "gin_configs/other/model.gin": "# The model.\n\n",
      "gin_configs/experiments/b.gin": (
          "include 'gin_configs/other/model.gin'\n"
          "# Why each setting is so.\n"
          f"effective_probe_main.job = @{job}()\n"
          "effective_probe_main.steps = 10\n"
          "effective_probe_main.run_dir = %RUN\n"
          "RUN = %gin.REQUIRED\n"
          "EffectiveProbeJob.width = 8\n")})
  assert gin_utils.effective_bindings("gin_configs/experiments/b.gin",
                                      root=str(tmp_path)) == effective

  # A value that differs, and a scope, do change it.
  _write(tmp_path, {"gin_configs/models/m.gin": "EffectiveProbeJob.width = 9\n"})
  changed = gin_utils.effective_bindings("gin_configs/experiments/a.gin", root=str(tmp_path))
  assert changed[job]["width"] == "9"
  _write(tmp_path, {"gin_configs/experiments/c.gin": (
      "effective_probe_main.job = @eval/EffectiveProbeJob()\n"
      "eval/EffectiveProbeJob.width = 2\n")})
  scoped = gin_utils.effective_bindings("gin_configs/experiments/c.gin", root=str(tmp_path))
  assert scoped[main]["job"] == f"@eval/{job}()" and scoped[f"eval/{job}"]["width"] == "2"
