"""`retro`: RETRO (Borgeaud et al. 2022), a decoder language model that reads retrieved chunks.

The model is `realm_jax.models.retro.RetroModel` (`RetroJob.model = @RetroConfig()` in gin); its
sequences and each chunk's precomputed neighbours come from a chunk database
(`realm_jax.index.chunks`, `realm_jax.batches.retro`). The loss is the mean next-token cross
entropy over the real target tokens. One job runs RETRO, the no-retrieval baseline and
RETRO-fitting; every checkpoint is evaluated on held-out documents (loss and bits per byte,
with and without retrieval), and `start` writes `<run_dir>/retro_config.json` for
`realm_jax.evaluation.retro.evaluate_retro`. Details: docs/design/models_and_jobs.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Mapping, Optional

import gin

from realm_jax.gin_utils import ConfigError
from realm_jax.jobs.base import Job, RunContext, global_spec

RETRO_CONFIG_FILE = "retro_config.json"


def toy_chunk_database(chunk_len: int) -> str:
  """The toy world's chunk database with `chunk_len`-token chunks, keyed by the shipped toy
  BERT: built once next to the toy BlockStore (as `realm_jax_tasks.toy.block_store_dir`
  caches stores) and reused."""
  import realm_jax_tasks  # pylint: disable=g-import-not-at-top
  return cached_chunk_database(realm_jax_tasks.toy_block_store_dir(), chunk_len)


def cached_chunk_database(store_path: str, chunk_len: int, key_bert: Optional[str] = None) -> str:
  """`<store_path>-retro<chunk_len>`, the BlockStore's chunk database keyed by the shipped toy
  BERT (or by `key_bert`, a transformers BERT directory: `...-retro<chunk_len>-<its name>`):
  opened if it is there, else built once and published."""
  from realm_jax import data  # pylint: disable=g-import-not-at-top
  from realm_jax.convert import hf  # pylint: disable=g-import-not-at-top
  from realm_jax.data import block_store as block_store_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.index import chunks  # pylint: disable=g-import-not-at-top
  key_bert = key_bert or data.TOY_BERT_DIR
  dest = f"{store_path}-retro{chunk_len}" + (
      "" if key_bert == data.TOY_BERT_DIR else f"-{os.path.basename(os.path.normpath(key_bert))}")
  try:
    chunks.ChunkDatabase.open(dest, verify="fast")
    return dest
  except chunks.ChunkDatabaseError:
    pass
  config, params, _ = hf.load_checkpoint(key_bert)
  store = block_store_lib.BlockStore.open(store_path, verify="fast")
  try:
    chunks.build_chunk_database(store, dest, params, config.bert, chunk_len=chunk_len,
                                model=key_bert, overwrite=os.path.exists(dest))
  except chunks.ChunkDatabaseError:
    # Another process published the same database first (same input, same keys): use it.
    chunks.ChunkDatabase.open(dest, verify="fast")
  finally:
    store.close()
  return dest


@gin.configurable("RetroConfig")
def retro_config(**fields: Any) -> Any:
  """A `realm_jax.models.retro.RetroConfig` from gin (`RetroConfig.hidden_size = 128`);
  unset fields keep RetroConfig's defaults (the paper's 172M model)."""
  from realm_jax.models import retro  # pylint: disable=g-import-not-at-top
  try:
    return retro.RetroConfig(**fields)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"RetroConfig: {e}") from e


@dataclasses.dataclass(frozen=True)
class RetroLanguageModel:
  """The trainer's model interface (`init`, `logical_axes`, `loss_fn`, `eval_fn`,
  `summarize`) around RetroModel.

  Attributes:
    retro: the RetroConfig (not `config`: the trainer would write it as the checkpoints'
      RealmConfig, see the module docstring).
    retrieval: feed the batches' neighbours; False: the plain decoder (no neighbour key read).
  """

  retro: Any
  retrieval: bool = True

  def _boxed_init(self, rng: Any) -> Any:
    from realm_jax.models import retro  # pylint: disable=g-import-not-at-top
    # The whole tree, encoder and CCA included, also for the baseline: its checkpoints have
    # the shape RETRO-fitting warm-starts. Under "retro": the checkpoints name a model by its
    # top-level keys.
    return {"retro": retro.init_params(self.retro, rng)}

  def init(self, rng: Any) -> Any:
    """Plain (unboxed) parameters."""
    import flax.linen as nn  # pylint: disable=g-import-not-at-top
    return nn.unbox(self._boxed_init(rng))

  def logical_axes(self) -> Any:
    """Logical axis names per parameter, traced without allocating."""
    import flax.linen as nn  # pylint: disable=g-import-not-at-top
    import jax  # pylint: disable=g-import-not-at-top
    return nn.get_partition_spec(jax.eval_shape(self._boxed_init, jax.random.PRNGKey(0)))

  def _sums(self, params: Any, batch: Mapping[str, Any], rng: Any, retrieval: bool,
            prefix: str = "") -> dict:
    """{prefix + "loss_sum": nats over real targets, prefix + "weight_sum": their count}."""
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    from realm_jax.models import realm  # pylint: disable=g-import-not-at-top
    from realm_jax.models import retro  # pylint: disable=g-import-not-at-top
    neighbours = (batch["neighbour_ids"], batch["neighbour_mask"]) if retrieval else (None,) * 2
    logits = retro.RetroModel(self.retro).apply(
        {"params": params["retro"]}, batch["input_ids"], *neighbours, deterministic=rng is None,
        rngs=realm.dropout_rngs(rng))  # [B, n, V]
    losses = retro.next_token_losses(logits, batch["input_ids"])  # [B, n - 1]
    # Target t + 1 is real (a partial last chunk's padding and filler rows are not).
    weights = batch["input_mask"][:, 1:].astype(jnp.float32)  # [B, n - 1]
    return {f"{prefix}loss_sum": jnp.sum(losses * weights),
            f"{prefix}weight_sum": jnp.sum(weights)}

  def loss_fn(self, params: Any, batch: Mapping[str, Any], rng: Any) -> tuple[Any, dict]:
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    aux = self._sums(params, batch, rng, self.retrieval)
    return aux["loss_sum"] / jnp.maximum(aux["weight_sum"], 1.0), aux

  def eval_fn(self, params: Any, batch: Mapping[str, Any]) -> dict:
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    aux = self._sums(params, batch, None, self.retrieval)
    aux["byte_sum"] = jnp.sum(batch["target_bytes"])
    if self.retrieval:
      aux.update(self._sums(params, batch, None, False, "no_retrieval_"))
    return aux

  @staticmethod
  def summarize(aux: dict) -> dict:
    """Means from the summed aux: loss (nats per target token); with `byte_sum`,
    bits_per_byte = total nats / ln 2 / total UTF-8 bytes of the targets' text; the same
    under no_retrieval/ when the retrieval-off sums are there."""
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

    def ratio(numerator: Any, denominator: Any) -> Any:
      return jnp.where(denominator > 0, numerator / jnp.maximum(denominator, 1e-12), 0.0)

    out = {"loss": ratio(aux["loss_sum"], aux["weight_sum"])}
    if "byte_sum" in aux:
      out["bits_per_byte"] = ratio(aux["loss_sum"] / math.log(2), aux["byte_sum"])
    if "no_retrieval_loss_sum" in aux:
      out["no_retrieval/loss"] = ratio(aux["no_retrieval_loss_sum"],
                                       aux["no_retrieval_weight_sum"])
      out["no_retrieval/bits_per_byte"] = ratio(aux["no_retrieval_loss_sum"] / math.log(2),
                                                aux["byte_sum"])
    return out


@gin.configurable
@dataclasses.dataclass
class RetroJob(Job):
  """RETRO, its no-retrieval baseline, or RETRO-fitting (module docstring) on a chunk database.

  Attributes:
    task: a label for the run's description, `retro_<corpus>` (no seqio task is read).
    model: the RetroConfig (`@RetroConfig()`); chunk_size the database's, neighbour_len twice it.
    chunk_database: a chunk database directory (`chunks.build_chunk_database`); None: the toy
      world's, built once with the shipped toy BERT and cached next to the toy BlockStore.
    chunks_per_sequence: l, chunks per training sequence (n = l m tokens; RETRO: 32).
    num_neighbours: k, neighbours per chunk (RETRO trains with 2).
    retrieval: True: RETRO; False: the same decoder without retrieval (the baseline).
    retrofit: True: only the neighbour encoder and the CCA train, the rest from a baseline's
      `init_checkpoint` (required).
    eval_sequences: held-out sequences evaluated at every checkpoint (0: no evaluation).
    exclude_own_document: RETRO's rule against trivial copies (True); False: a positive control.
    adam_epsilon: the optimizer's epsilon; None: BERT's (1e-6).
  """
  task: str = "retro_toy"
  model: Any = gin.REQUIRED
  chunk_database: Optional[str] = None
  chunks_per_sequence: int = 2
  num_neighbours: int = 2
  retrieval: bool = True
  retrofit: bool = False
  eval_sequences: int = 64
  exclude_own_document: bool = True
  adam_epsilon: Optional[float] = None

  name = "retro"

  def __post_init__(self):
    self._database = None

  def configure(self, ctx: RunContext) -> None:
    from realm_jax.models import retro  # pylint: disable=g-import-not-at-top
    if not isinstance(self.model, retro.RetroConfig):
      raise ConfigError(f"RetroJob.model is a {type(self.model).__name__}, not a RetroConfig: "
                        f"bind RetroJob.model = @RetroConfig()")
    for knob, low in (("chunks_per_sequence", 1), ("num_neighbours", 1),
                      ("eval_sequences", 0)):
      value = getattr(self, knob)
      if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"RetroJob.{knob}={value!r}: expected an integer >= {low}")
    if self.adam_epsilon is not None and not (isinstance(self.adam_epsilon, (int, float))
                                              and self.adam_epsilon > 0):
      raise ConfigError(f"RetroJob.adam_epsilon={self.adam_epsilon!r}: expected a number > 0 "
                        f"or None (BERT's)")
    if self.model.neighbour_len != 2 * self.model.chunk_size:
      raise ConfigError(f"RetroJob.model: neighbour_len={self.model.neighbour_len} must be "
                        f"2 x chunk_size={self.model.chunk_size} (a chunk and its "
                        f"continuation)")
    if self.retrofit and not self.retrieval:
      raise ConfigError("RetroJob.retrofit=True trains the retrieval parameters only: it "
                        "needs retrieval=True")
    if self.retrofit and ctx.init_checkpoint is None:
      raise ConfigError("RetroJob.retrofit=True needs train_main.init_checkpoint (a baseline "
                        "run's checkpoint, retrieval=False): its decoder stays frozen")
    if self.block_store is not None:
      raise ConfigError("RetroJob.block_store is not read: set RetroJob.chunk_database (a "
                        "chunk database built over your BlockStore)")
    if not self.task.startswith("retro_"):
      raise ConfigError(f"RetroJob.task={self.task!r} does not fit job 'retro' (expected a "
                        f"retro_* label)")

  def optimizer_options(self) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if self.adam_epsilon is not None:
      options["eps"] = float(self.adam_epsilon)
    if self.retrofit:
      from realm_jax.models import retro  # pylint: disable=g-import-not-at-top
      options["trainable"] = retro.retrieval_parameter_mask
    return options

  def describe(self) -> str:
    cfg = self.model
    mode = ("RETRO-fitting" if self.retrofit else
            f"retrieval k={self.num_neighbours}" if self.retrieval else "no retrieval")
    if self.retrieval and not self.exclude_own_document:
      mode += ", own document retrievable (positive control)"
    return (f"RETRO hidden {cfg.hidden_size}, {cfg.num_layers} layers, CCA in "
            f"{list(cfg.cca_layers)}, vocab {cfg.vocab_size}, m {cfg.chunk_size}, "
            f"l {self.chunks_per_sequence}, {mode}")

  def build_model(self, ctx: RunContext) -> Any:
    return RetroLanguageModel(self.model, retrieval=bool(self.retrieval))

  def abstract_batch(self, ctx: RunContext, model: Any) -> dict[str, Any]:
    from realm_jax.batches import retro  # pylint: disable=g-import-not-at-top
    k = self.num_neighbours if self.retrieval else 0
    return global_spec(retro.spec(self.chunks_per_sequence, self.model.chunk_size, k),
                       ctx.global_batch)

  def database(self) -> Any:
    """The opened chunk database (the toy world's built first when `chunk_database` is None);
    ConfigError when its chunk length is not the model's."""
    if self._database is None:
      from realm_jax.index import chunks  # pylint: disable=g-import-not-at-top
      path = self.chunk_database or toy_chunk_database(self.model.chunk_size)
      try:
        database = chunks.ChunkDatabase.open(path, verify="fast")
      except chunks.ChunkDatabaseError as e:
        raise ConfigError(f"RetroJob.chunk_database: {e}") from e
      if database.chunk_len != self.model.chunk_size:
        raise ConfigError(f"RetroJob.chunk_database {path} has chunks of {database.chunk_len} "
                          f"tokens, the model's chunk_size is {self.model.chunk_size}")
      self._database = database
    return self._database

  def _batches(self, ctx: RunContext, split: str, **options: Any) -> Any:
    from realm_jax.batches import retro  # pylint: disable=g-import-not-at-top
    return retro.RetroBatches(self.database(), batch_size=ctx.batch_size,
                              chunks_per_sequence=self.chunks_per_sequence,
                              num_neighbours=self.num_neighbours, retrieval=self.retrieval,
                              split=split, seed=ctx.seed,
                              exclude_own_document=self.exclude_own_document, **options)

  def build_batches(self, ctx: RunContext, model: Any) -> Any:
    return self._batches(ctx, "train")

  def warm_start(self, checkpoint: Mapping[str, Any], params: dict, source: str
                 ) -> tuple[dict, str]:
    """A RETRO or baseline checkpoint's parameters, every leaf (or, RETRO-fitting, the
    decoder's only: the encoder and the CCA start fresh, as the paper's)."""
    import jax  # pylint: disable=g-import-not-at-top
    from realm_jax.models import retro  # pylint: disable=g-import-not-at-top
    shapes = lambda tree: jax.tree.map(lambda x: tuple(x.shape), tree)
    try:
      same = jax.tree.structure(checkpoint) == jax.tree.structure(params) and (
          shapes(checkpoint) == shapes(params))
    except (TypeError, ValueError, AttributeError):
      same = False
    if not same:
      raise ConfigError(f"init_checkpoint {source}: not a RETRO checkpoint of this model "
                        f"({self.describe()})")
    if not self.retrofit:
      return dict(checkpoint), "every parameter"
    mask = retro.retrieval_parameter_mask(params)
    merged = jax.tree.map(lambda on, fresh, saved: fresh if on else saved, mask, params,
                          checkpoint)
    return merged, "the decoder (encoder and CCA fresh)"

  def _data_paths(self) -> dict[str, Optional[str]]:
    """What `realm_jax.evaluation.retro` needs to rebuild the run's data: the resolved chunk
    database, and the BlockStore it was built over where the job knows it (the toy world's
    for the toy database; None: the evaluation takes it as an argument)."""
    path = os.path.abspath(self.database().path)
    store = None
    if self.chunk_database is None:
      import realm_jax_tasks  # pylint: disable=g-import-not-at-top
      store = os.path.abspath(realm_jax_tasks.toy_block_store_dir())
    return {"chunk_database": path, "block_store": store}

  def start(self, ctx: RunContext, model: Any, batches: Any):
    import jax  # pylint: disable=g-import-not-at-top
    if jax.process_index() == 0:
      os.makedirs(ctx.run_dir, exist_ok=True)
      with open(os.path.join(ctx.run_dir, RETRO_CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump({**dataclasses.asdict(self.model), "retrieval": bool(self.retrieval),
                   "retrofit": bool(self.retrofit), "num_neighbours": self.num_neighbours,
                   "exclude_own_document": bool(self.exclude_own_document),
                   "chunks_per_sequence": self.chunks_per_sequence,
                   **self._data_paths()}, f, indent=2)
    if not self.eval_sequences:
      return [], None, None
    from realm_jax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
    from realm_jax.training import trainer  # pylint: disable=g-import-not-at-top
    heldout = self._batches(ctx, "heldout", shuffle=False, max_sequences=self.eval_sequences,
                            vocab=vocab_lib.default_vocabulary())
    eval_fn = trainer.make_eval_fn(model, heldout.fixed_batches(), mesh=ctx.mesh,
                                   rules=ctx.rules)
    return [], eval_fn, None
