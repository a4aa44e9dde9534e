"""TensorFlow sees no accelerator, and on a machine without an NVIDIA driver its false cuInit
alarm is not shown (while anything else it says is)."""

import os
import subprocess
import sys

from realm_jax.data import tensorflow_setup

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALARM = ("2026-11-25 02:11:27.682258: E external/local_xla/xla/stream_executor/cuda/"
         "cuda_platform.cc:51] failed call to cuInit: INTERNAL: CUDA error: Failed call to "
         "cuInit: UNKNOWN ERROR (303)\n")


def test_only_the_false_alarm_is_dropped():
  other = "2026-11-25 02:11:28.000000: E tensorflow/core/framework/op_kernel.cc:1] real trouble\n"
  assert tensorflow_setup.without_false_alarm(f"before\n{ALARM}{other}after") == (
      f"before\n{other}after")
  assert tensorflow_setup.without_false_alarm(other) == other


def _stderr_of(code: str) -> str:
  return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                        check=True, timeout=300).stderr


def test_tensorflow_runs_on_the_cpu_without_the_false_alarm(tmp_path):
  op = "print(tf.config.get_visible_devices('GPU'), (tf.constant(1) + 1).device)"
  plain = _stderr_of(f"import tensorflow as tf; {op}")
  quiet = subprocess.run(
      [sys.executable, "-c", "import tensorflow as tf\n"
       "from realm_jax.data import tensorflow_setup\n"
       f"tensorflow_setup.hide_accelerators_from_tensorflow({str(tmp_path / 'no_driver')!r})\n"
       f"{op}"], cwd=REPO, capture_output=True, text=True, check=True, timeout=300)
  assert quiet.stdout.startswith("[] ") and "CPU:0" in quiet.stdout
  assert "failed call to cuInit" not in quiet.stderr
  if os.path.exists(tensorflow_setup.NVIDIA_DRIVER):
    return  # a machine with a driver: there is no false alarm to compare with
  assert "failed call to cuInit" in plain  # what every job printed before


def test_numpy_iterator_turns_autotuning_off_and_keeps_other_options():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  options = tf.data.Options()
  options.deterministic = False
  dataset = tf.data.Dataset.range(5).with_options(options)
  assert dataset.options().autotune.enabled is not False  # tf.data's default: on
  quiet = tensorflow_setup.without_autotune(dataset)
  assert quiet.options().autotune.enabled is False
  assert quiet.options().deterministic is False
  assert list(tensorflow_setup.numpy_iterator(dataset)) == [0, 1, 2, 3, 4]


def test_every_tf_data_reader_goes_through_numpy_iterator():
  # The one way to iterate a pipeline (an autotuned iterator left idle takes up to a minute to
  # delete): no other call of as_numpy_iterator in the package or the tasks.
  offenders = []
  for root in ("realm_jax", "tasks"):
    for folder, _, names in os.walk(os.path.join(REPO, root)):
      for name in names:
        path = os.path.join(folder, name)
        if not name.endswith(".py") or path.endswith("tensorflow_setup.py"):
          continue
        with open(path, encoding="utf-8") as f:
          if ".as_numpy_iterator(" in f.read():
            offenders.append(os.path.relpath(path, REPO))
  assert not offenders, offenders
