"""Host-side data: vocabulary, corpora, masking, the toy world; no JAX. `TOY_BERT_DIR` is the
shipped toy BERT (transformers' BertForMaskedLM files; `realm_jax.toy_bert` builds it)."""

import os

TOY_BERT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "toy_bert")
# The English BERT of the wiki world (realm_jax.toy_bert --world wiki, docs/wiki_world.md).
WIKI_BERT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "wiki_bert")
