"""Test-wide setup: 8 fake CPU devices, so sharding code runs on a real (if simulated) mesh; XLA's
cheap CPU build; and one fresh persistent compilation cache per test session.

Set before anything imports jax (conftest loads first), and inherited by the tests' child
processes. Single-device code is unaffected by the fake devices: it runs on device 0.
"""

import os

# The cheap build skips LLVM's expensive optimisations: programs compile about twice as fast and
# run somewhat slower, which pays for the tests' tiny programs that run a few steps. Results
# differ from the default build's by float rounding only (a few 1e-6 on a tiny REALM step).
CHEAP_BUILD_FLAGS = ("--xla_backend_optimization_level=0",
                     "--xla_llvm_disable_expensive_passes=true")
# The flags as the user set them, for a child that runs as on a user's machine (the notebook's
# kernel). setdefault: pytest-xdist's workers inherit the controller's, already extended.
os.environ.setdefault("REALM_JAX_TEST_USER_XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
for _flag in ("--xla_force_host_platform_device_count=8", *CHEAP_BUILD_FLAGS):
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()


# One persistent compilation cache for the session, fresh each time (nothing carries over from
# an earlier run or another version): many tests run the same program in several `train.main`
# calls of one process (a straight run, then an interrupted and a resumed one), each of which
# builds new jitted functions that would otherwise compile again. Subprocesses share it.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import atexit  # noqa: E402
  import shutil  # noqa: E402
  import tempfile  # noqa: E402
  _CACHE = tempfile.mkdtemp(prefix="realm_jax_test_compilation_cache_")
  atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.1"

import pytest  # noqa: E402  (after XLA_FLAGS is set)


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory):
  """A private REALM_JAX_CACHE: the toy world and its BlockStore are generated there on first
  use, so tests never write to the user's cache."""
  root = tmp_path_factory.mktemp("cache")
  old = os.environ.get("REALM_JAX_CACHE")
  os.environ["REALM_JAX_CACHE"] = str(root)
  yield root
  if old is None:
    del os.environ["REALM_JAX_CACHE"]
  else:
    os.environ["REALM_JAX_CACHE"] = old


@pytest.fixture(scope="module")
def one_device():
  """The module's runs see one CPU device, as on a user's laptop, instead of the 8 fake ones
  (children too, through XLA_FLAGS). For end-to-end runs of a job: 8 data-parallel devices cost
  them a quarter to a third more CPU time on 2 cores. Every job's step on the 8-device mesh is
  lowered by tests/test_entry_points.py's dry runs; pretraining's and ICT's run on meshes of 8
  in tests/training/test_partitioning.py."""
  import jax  # pylint: disable=import-outside-toplevel
  flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
           if not flag.startswith("--xla_force_host_platform_device_count")]
  with pytest.MonkeyPatch.context() as patch:
    for name in ("devices", "local_devices"):
      patch.setattr(jax, name, lambda *args, _all=getattr(jax, name), **kwargs:
                    _all(*args, **kwargs)[:1])
    for name in ("device_count", "local_device_count"):
      patch.setattr(jax, name, lambda *args, **kwargs: 1)
    patch.setenv("XLA_FLAGS", " ".join(flags + ["--xla_force_host_platform_device_count=1"]))
    yield


@pytest.fixture
def clean_gin(monkeypatch):
  """For tests of the gin entry points: run from the repository root (gin finds includes
  without logging failed look-ups) with gin's config cleared before and after."""
  import gin  # pylint: disable=import-outside-toplevel
  from realm_jax import gin_utils  # pylint: disable=import-outside-toplevel
  monkeypatch.chdir(gin_utils.REPO_ROOT)
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.fixture
def forget_qa_files():
  """Unregisters the QA tasks a test registered over its own question files (task names that
  other tests list must not change with the order tests run in)."""
  yield
  import seqio  # noqa: PLC0415
  for name in list(seqio.TaskRegistry.names()):
    if name.startswith(("qa_files_", "qa_regex_files_")):
      seqio.TaskRegistry.remove(name)
