"""seqio task registrations for realm_jax (installed as the package `realm_jax_tasks`).

`import realm_jax_tasks` registers the toy world's tasks, the wiki world's English BERT phases,
Atlas's pretext over the toy world and the QA benchmarks (the table: docs/architecture.md,
"seqio tasks"). Other corpora: `register_pretraining_tasks`, or `register_corpus_for_task` from
a task name; other QA data: `register_qa_task`; your own question files: `register_qa_files`
(`train` and `evaluate` call it for a task that is a path, `regex:<path>` for regex answers).
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
