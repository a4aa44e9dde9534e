"""The training jobs, one gin-configurable class each (see `realm_jax.jobs.base`).

Importing this package imports every module in it, which registers their jobs with gin
(`train_main.job = @PretrainJob()`): a new job is a new module here and a run gin.
"""

import importlib
import pkgutil

from realm_jax.jobs.base import Job, RunContext, SeqioJob


def _import_all() -> None:
  for module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{module.name}")


def _runnable(cls: type) -> list[type]:
  """`cls`'s subclasses that build a model (not shared bases such as IndexJob), recursively."""
  found = []
  for sub in cls.__subclasses__():
    if "build_model" in vars(sub):
      found.append(sub)
    found += _runnable(sub)
  return found


_import_all()
from realm_jax.jobs.finetune import FinetuneJob  # noqa: E402  (imported above; named here)
from realm_jax.jobs.ict import ContrieverJob, IctJob  # noqa: E402
from realm_jax.jobs.index_job import IndexJob  # noqa: E402
from realm_jax.jobs.mlm import MlmJob  # noqa: E402
from realm_jax.jobs.pretrain import PretrainJob  # noqa: E402
from realm_jax.jobs.retromae import RetroMaeJob  # noqa: E402


def all_jobs() -> tuple[type, ...]:
  """Every runnable job class defined so far (this package's in pipeline order, then any
  defined elsewhere)."""
  pipeline = ("mlm", "ict", "contriever", "retromae", "pretrain", "finetune")
  jobs = dict.fromkeys(_runnable(Job))
  return tuple(sorted(jobs, key=lambda j: pipeline.index(j.name) if j.name in pipeline else 99))


__all__ = ["ContrieverJob", "FinetuneJob", "IctJob", "IndexJob", "Job", "MlmJob", "PretrainJob",
           "RetroMaeJob", "RunContext", "SeqioJob", "all_jobs"]
