"""seqio task registrations for realm_jax (installed as the package `realm_jax_tasks`).

`import realm_jax_tasks` registers:

  toy world (generated and cached on first use, see realm_jax.data.toy_world):
    realm_toy_salient_span, realm_toy_random_span, realm_toy_random_token   REALM pretraining
    realm_toy_random_token_knowledge     random tokens, every query masking a name or date
    ict_toy                                                                ICT warm start
    mlm_toy                                   MLM over the toy world's own blocks
    mlm_toy_copy                the toy BERT's first phase (experiments/toy_bert_copy.gin)
    mlm_toy_reading                    the toy BERT's reading examples (experiments/toy_bert.gin)
    toy_qa                                                                 open-QA
    atlas_pretext_toy        Atlas's MLM pretext for the FiD reader (tasks/atlas.py)
  wiki world (the `wiki` extra; generated and cached on first use, see realm_jax.data.wiki):
    mlm_wiki_copy, mlm_wiki_reading    the English BERT's phases (experiments/wiki_bert*.gin)
  benchmarks (files under $REALM_JAX_QA_DATA/<name>/, see realm_jax.data.qa_datasets):
    nq_open, web_questions, curated_trec

Other corpora are registered with `register_pretraining_tasks` (e.g. Wikipedia blocks built with
`python -m realm_jax.build_corpus`; `register_corpus_for_task` does it from a task name, as
`train` and `evaluate` do with a `block_store`), other QA data with `register_qa_task`, your own
question files with `register_qa_files` (which `train` and `evaluate` call for a task that is a
path: `TASK='/data/my_questions'`, `TASK='regex:/data/my_questions'`; `read_qa_files` reads them
at once, as the recipe checks them).
"""

from realm_jax.data.tensorflow_setup import hide_accelerators_from_tensorflow

# Before any dataset exists: TensorFlow feeds data and keeps off the accelerators.
hide_accelerators_from_tensorflow()

from realm_jax_tasks.open_qa import (BENCHMARK_TASKS, QA_DATA_ENV, is_qa_path,  # noqa: E402
                                     read_qa_files, register_benchmark_tasks, register_qa_files,
                                     register_qa_task)
from realm_jax_tasks.pretraining import (MASKING_STRATEGIES,  # noqa: E402
                                         register_corpus_for_task, register_pretraining_tasks)
from realm_jax_tasks.toy import (TOY_BLOCK_LEN, TOY_TASKS, register_toy_tasks,  # noqa: E402
                                 toy_block_store_dir)
from realm_jax_tasks.wiki import WIKI_TASKS, register_wiki_tasks  # noqa: E402
from realm_jax_tasks.atlas import (register_atlas_pretext_task,  # noqa: E402
                                   register_toy_pretext_task)

register_toy_tasks()
register_wiki_tasks()
TOY_PRETEXT_TASK = register_toy_pretext_task()  # atlas_pretext_toy (tasks/atlas.py)
register_benchmark_tasks()

ALL_TASKS = TOY_TASKS + (TOY_PRETEXT_TASK,) + WIKI_TASKS + BENCHMARK_TASKS
