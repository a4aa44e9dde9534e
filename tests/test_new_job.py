"""Adding a job is one new class and one gin file (the example of docs/architecture.md, "Adding
a job"): a job defined outside the package, registered by the gin file's `import`, runs through
the generic `train_main` (dry run, two real steps, a refused binding)."""

import os
import textwrap

import pytest

from realm_jax import train
from realm_jax.checkpoints import list_checkpoint_steps

# The docs' example, verbatim: masked language modelling of the encoder on the blocks of an
# ICT task, 15% of each block's wordpieces masked on the host.
JOB_MODULE = textwrap.dedent('''\
    """A job outside realm_jax: masked language modelling of the encoder on ICT blocks."""
    import dataclasses

    import gin
    import numpy as np

    from realm_jax.data import vocab
    from realm_jax.jobs.base import Job, global_spec


    class MaskedBlocks:
      """ICT batches -> BertMlmModel batches: `num_masks` random block wordpieces masked."""

      def __init__(self, ict, num_masks, seed):
        self.ict, self.num_masks, self.seed = ict, num_masks, seed

      def element_spec(self):
        import jax
        spec = self.ict.element_spec()
        length, m = spec["block_ids"].shape[0], self.num_masks
        return {"input_ids": spec["block_ids"], "type_ids": spec["block_type_ids"],
                "input_mask": spec["block_mask"],
                "mlm_positions": jax.ShapeDtypeStruct((m,), np.int32),
                "mlm_targets": jax.ShapeDtypeStruct((m,), np.int32),
                "mlm_weights": jax.ShapeDtypeStruct((m,), np.float32)}

      def __next__(self):
        batch = next(self.ict)
        ids = batch["block_ids"].copy()  # [B, L]
        rng = np.random.default_rng([self.seed, self.ict.batches_consumed])
        # [B, M]: positions among the real wordpieces past [CLS]
        lengths = batch["block_mask"].sum(axis=1)
        positions = np.stack([np.sort(rng.choice(np.arange(1, n - 1), self.num_masks,
                                                 replace=False)) for n in lengths])
        targets = np.take_along_axis(ids, positions, axis=1)
        np.put_along_axis(ids, positions, vocab.MASK_ID, axis=1)
        return {"input_ids": ids, "type_ids": batch["block_type_ids"],
                "input_mask": batch["block_mask"], "mlm_positions": positions.astype(np.int32),
                "mlm_targets": targets.astype(np.int32),
                "mlm_weights": np.ones(positions.shape, np.float32)}

      def state(self):
        return self.ict.state()

      def restore(self, state):
        self.ict.restore(state)


    @gin.configurable
    @dataclasses.dataclass
    class BlockMlmJob(Job):
      """BertMlmModel on the blocks of an `ict_<corpus>` task."""
      num_masks: int = 8

      name = "block_mlm"

      def configure(self, ctx):
        self.check_task_prefix("ict_")

      def build_model(self, ctx):
        from realm_jax.models import realm
        return realm.BertMlmModel(ctx.model_config)

      def _batches(self, ctx):
        from realm_jax.batches import seqio_batches
        ict = seqio_batches.SeqioBatches(self.task, batch_size=ctx.batch_size, seed=ctx.seed,
                                         feature_keys=seqio_batches.ICT_BATCH_KEYS)
        return MaskedBlocks(ict, self.num_masks, ctx.seed)

      def abstract_batch(self, ctx, model):
        return global_spec(self._batches(ctx).element_spec(), ctx.global_batch)

      def build_batches(self, ctx, model):
        return self._batches(ctx)

      def warm_start(self, checkpoint, params, source):
        return {**params, "encoder": checkpoint["encoder"]}, "encoder"
    ''')

JOB_GIN = textwrap.dedent("""\
    import block_mlm_job
    include 'gin_configs/models/toy.gin'

    train_main.run_dir = %RUN_DIR
    train_main.model_config = %MODEL_CONFIG
    train_main.job = @BlockMlmJob()
    BlockMlmJob.task = 'ict_toy'
    BlockMlmJob.num_masks = 8
    train_main.batch_size = 8
    train_main.num_steps = 2
    train_main.learning_rate = 1e-4
    train_main.checkpoint_every = 2
    train_main.log_every = 1
    """)


@pytest.fixture
def new_job(tmp_path, monkeypatch):
  (tmp_path / "block_mlm_job.py").write_text(JOB_MODULE)
  (tmp_path / "block_mlm.gin").write_text(JOB_GIN)
  monkeypatch.syspath_prepend(str(tmp_path))
  return str(tmp_path / "block_mlm.gin")


def test_a_new_job_is_one_class_and_one_gin_file(new_job, tmp_path, capsys):
  run_dir = tmp_path / "run"
  args = ["train", f"--gin_file={new_job}", f"--gin.RUN_DIR='{run_dir}'"]
  assert train.main(args + ["--dry_run"]) == 0, capsys.readouterr().err
  out = capsys.readouterr().out
  assert "dry run ok (job block_mlm, task ict_toy" in out, out
  assert train.main(args) == 0, capsys.readouterr().err
  assert "train: done (job block_mlm" in capsys.readouterr().out
  assert list_checkpoint_steps(str(run_dir)) == [2]
  assert os.path.exists(run_dir / "TRAINING_DONE")
  # Its settings are its own: gin refuses another job's on it.
  assert train.main(args + ["--gin.BlockMlmJob.null_document=False", "--dry_run"]) == 2
  err = capsys.readouterr().err
  assert "Configurable 'BlockMlmJob' doesn't have a parameter named 'null_document'" in err
