"""The training jobs, one gin-configurable class each (see `realm_jax.jobs.base`).

Importing this package registers them with gin: `train_main.job = @PretrainJob()`.
"""

from realm_jax.jobs.base import Job, RunContext
from realm_jax.jobs.finetune import FinetuneJob
from realm_jax.jobs.ict import IctJob
from realm_jax.jobs.index_job import IndexJob
from realm_jax.jobs.mlm import MlmJob
from realm_jax.jobs.pretrain import PretrainJob

ALL_JOBS = (MlmJob, IctJob, PretrainJob, FinetuneJob)

__all__ = ["ALL_JOBS", "FinetuneJob", "IctJob", "IndexJob", "Job", "MlmJob", "PretrainJob",
           "RunContext"]
