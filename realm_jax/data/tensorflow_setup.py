"""TensorFlow only feeds data here (seqio, tf.data): keep it off the accelerators, and read
every tf.data pipeline through `numpy_iterator`.

`hide_accelerators_from_tensorflow()` makes TensorFlow see no GPU, as big_vision and t5x do, so
it never takes GPU memory JAX needs; on a machine without an NVIDIA driver it also drops the one
false `failed call to cuInit` line TensorFlow logs. `numpy_iterator(dataset)` iterates with
tf.data's autotuning off: deleting an idle autotuned iterator waits for its model thread, which
made processes slow to exit. Measurements: docs/design/data_index_batches.md.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from typing import Any, Iterator

# What TensorFlow logs when no NVIDIA driver is installed.
_FALSE_CUINIT = re.compile(r"cuda_platform\.cc:\d+\] failed call to cuInit")
# Present on every Linux machine with an NVIDIA driver loaded.
NVIDIA_DRIVER = "/proc/driver/nvidia"

_done = False


def hide_accelerators_from_tensorflow(driver_path: str = NVIDIA_DRIVER) -> None:
  """Makes TensorFlow's runtime use the CPU only (once per process; imports TensorFlow)."""
  global _done
  if _done:
    return
  _done = True
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def hide():
    try:
      tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # the runtime is initialized already: too late, and nothing to hide
      pass

  if os.path.exists(driver_path):
    hide()
    return
  # No driver: TensorFlow's C++ runtime writes straight to file descriptor 2, so capture that
  # for the one call that initializes it, then pass on all but the false cuInit line.
  sys.stderr.flush()
  with tempfile.TemporaryFile() as captured:
    saved = os.dup(2)
    try:
      os.dup2(captured.fileno(), 2)
      try:
        hide()
      finally:
        os.dup2(saved, 2)
    finally:
      os.close(saved)
    captured.seek(0)
    said = captured.read().decode("utf-8", errors="replace")
  sys.stderr.write(without_false_alarm(said))
  sys.stderr.flush()


def without_false_alarm(text: str) -> str:
  """`text` without TensorFlow's failed-cuInit lines (for a machine with no NVIDIA driver)."""
  return "".join(line for line in text.splitlines(keepends=True)
                 if not _FALSE_CUINIT.search(line))


def without_autotune(dataset: Any) -> Any:
  """`dataset` with tf.data's autotuning off (its other options kept); see the module docstring."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)


def numpy_iterator(dataset: Any) -> Iterator[Any]:
  """`dataset.as_numpy_iterator()` without autotuning: deleting it never waits on a model thread."""
  return without_autotune(dataset).as_numpy_iterator()
