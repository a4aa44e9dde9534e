r"""A real-text corpus and questions for trying realm_jax on your own data: Python's documentation.

  python -m realm_jax.data.python_docs --out /tmp/pydocs [--seed 0] [--subset 240,40,40]

Runs anywhere with no download (docs/own_corpus.md): the docstrings of the standard library's
public modules, classes and functions and the language reference topics of `pydoc_data` become
``docs.jsonl`` (one short ``{"id", "title", "text"}`` document each, a function's text opening
with its qualified name and signature); ``qa/{train,dev,test}.jsonl`` holds ORQA-form questions,
one per function whose docstring opens with an imperative verb ("Which function of the heapq
module pushes item onto heap, maintaining the heap invariant?" -> ``["heappush"]``), split
80/10/10 by module; ``manifest.json`` the Python version, seed, counts and sha256s. The output
is a pure function of the Python version and the seed; modules that open windows, print on
import or need a display are skipped by name.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import io
import json
import os
import re
import sys
import contextlib
import warnings
from typing import Iterator, Optional, Sequence

from realm_jax import fileio

PROG = "python_docs"
# Modules whose import has effects (a browser, the Zen on stdout, windows) or that are tools
# rather than libraries.
_SKIPPED_MODULES = frozenset({
    "this", "antigravity", "idlelib", "turtle", "turtledemo", "tkinter", "lib2to3", "pydoc_data",
    "ensurepip", "venv", "test", "__future__", "__main__", "msilib", "winreg", "winsound",
    "_winapi", "msvcrt", "nt"})
# Imperative opening verbs of docstring summaries and their third-person forms.
_VERB = re.compile(r"^([A-Z][a-z]+)\b(.*)$")
_IRREGULAR = {"Do": "does", "Go": "goes"}
# Capitalised openings of function summaries that are not imperative verbs.
_NOT_VERBS = frozenset({"Is", "Be", "Has", "Was", "Are", "Deep", "Shallow", "Internal", "Helper",
                        "Private", "Simple", "Abstract", "Base", "New", "Same", "Like", "Alias",
                        "Deprecated", "Obsolete", "Undocumented", "This", "The", "An", "If",
                        "When", "For", "Used", "See", "Note", "Only", "Also", "Not"})
_MAX_WORDS = 30  # a longer "sentence" is a summary without its full stop
_MIN_WORDS = 5  # a summary shorter than this names too little to be a question
_SPLITS = (("train", 0.8), ("dev", 0.1), ("test", 0.1))


def third_person(verb: str) -> Optional[str]:
  """'Return' -> 'returns', 'Match' -> 'matches', 'Copy' -> 'copies'; None for a word that is
  not an imperative verb opening (ends in -s, -ed, -ing, -ly, or is a known non-verb)."""
  if verb in _NOT_VERBS:
    return None
  if verb in _IRREGULAR:
    return _IRREGULAR[verb]
  lower = verb.lower()
  if lower.endswith(("s", "ed", "ing", "ly")) or len(lower) < 3:
    return None
  if lower.endswith(("sh", "ch", "x", "z", "o")):
    return lower + "es"
  if lower.endswith("y") and lower[-2] not in "aeiou":
    return lower[:-1] + "ies"
  return lower + "s"


def summary_sentence(doc: str) -> str:
  """The first sentence of a docstring's first paragraph, on one line."""
  paragraph = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0]
  text = " ".join(paragraph.split())
  match = re.match(r"(.+?[.!?])(\s|$)", text)
  return (match.group(1) if match else text).strip()


def question_for(module: str, owner: Optional[str], summary: str) -> Optional[str]:
  """"Which function of the heapq module pushes item onto heap ...?" from the summary "Push item
  onto heap ..."; None when the summary does not open with an imperative verb or is short."""
  match = _VERB.match(summary)
  if not match or not _MIN_WORDS <= len(summary.split()) <= _MAX_WORDS:
    return None
  verb = third_person(match.group(1))
  if verb is None:
    return None
  rest = match.group(2).rstrip(" .!?:;")
  where = f"method of {owner} in the {module} module" if owner else f"function of the {module} module"
  return f"Which {where} {verb}{rest}?"


def _clean_doc(obj) -> Optional[str]:
  doc = inspect.getdoc(obj)
  if not doc or len(doc.split()) < _MIN_WORDS:
    return None
  return " ".join(doc.split())


def _signature(obj) -> str:
  """"(heap, item)", "(x, base=10)": parameter names, and defaults that are short literals only
  (a default computed at import, such as `os.environ`, would put this machine into the text)."""
  try:
    parameters = inspect.signature(obj).parameters.values()
  except (TypeError, ValueError):
    return "(...)"
  parts = []
  for parameter in parameters:
    text = parameter.name
    if parameter.kind is parameter.VAR_POSITIONAL:
      text = "*" + text
    elif parameter.kind is parameter.VAR_KEYWORD:
      text = "**" + text
    default = parameter.default
    if default is not parameter.empty:
      shown = repr(default)
      literal = default is None or isinstance(default, (bool, int, float, str, bytes))
      text += "=" + (shown if literal and len(shown) <= 20 else "...")
    parts.append(text)
  return "(" + ", ".join(parts) + ")"


def _import_quietly(name: str):
  """The module, or None when it fails to import (or tries to print: a tool, not a library)."""
  with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()) as out, \
       contextlib.redirect_stderr(io.StringIO()):
    warnings.simplefilter("ignore")
    try:
      module = importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - ImportError, SystemExit, OSError of platform modules
      return None
  return None if out.getvalue() else module


def public_modules() -> list[str]:
  """The standard library's public top-level modules, sorted."""
  return sorted(name for name in sys.stdlib_module_names
                if not name.startswith("_") and name not in _SKIPPED_MODULES)


def module_records(name: str) -> Iterator[tuple[dict, Optional[dict]]]:
  """(document, question or None) for a module's own docstring and each public function,
  class and method defined in it (not re-exported ones), in source order of `dir()`."""
  module = _import_quietly(name)
  if module is None:
    return
  doc = _clean_doc(module)
  if doc:
    yield {"id": f"module:{name}", "title": name, "text": f"{name}: {doc}"}, None
  public = getattr(module, "__all__", None)
  for attr in sorted(public if isinstance(public, (list, tuple)) else dir(module)):
    if attr.startswith("_"):
      continue
    obj = getattr(module, attr, None)
    if getattr(obj, "__module__", None) != name:
      continue  # imported from elsewhere: documented there
    if inspect.isclass(obj):
      doc = _clean_doc(obj)
      if doc:
        yield {"id": f"class:{name}.{attr}", "title": f"{name}.{attr}",
               "text": f"{name}.{attr}: {doc}"}, None
      for method_name, method in sorted(vars(obj).items()):
        if method_name.startswith("_") or not callable(method):
          continue
        yield from _callable_records(name, f"{attr}.{method_name}", method, owner=attr)
    elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
      yield from _callable_records(name, attr, obj, owner=None)


def _callable_records(module: str, qualname: str, obj, owner: Optional[str]):
  doc = _clean_doc(obj)
  if not doc:
    return
  # A builtin's docstring often starts with its own signature line: keep only the prose.
  short = qualname.rsplit(".", 1)[-1]
  doc = re.sub(rf"^{re.escape(short)}\(.*?\)\s*(->\s*\S+\s*)?", "", doc).strip()
  if len(doc.split()) < _MIN_WORDS:
    return
  document = {"id": f"function:{module}.{qualname}", "title": f"{module}.{qualname}",
              "text": f"{module}.{qualname}{_signature(obj)}: {doc}"}
  question = question_for(module, owner, summary_sentence(doc))
  yield document, ({"question": question, "answer": [short], "module": module}
                   if question else None)


def topic_records() -> Iterator[dict]:
  """The language reference topics of `pydoc_data` (the text of `help('for')` etc.)."""
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top
  for name in sorted(topics.topics):
    text = " ".join(topics.topics[name].split())
    if text:
      yield {"id": f"topic:{name}", "title": name, "text": text}


def split_modules(modules: Sequence[str], seed: int) -> dict[str, str]:
  """{module: split}: a seeded shuffle cut 80/10/10 (by module, so test modules are unseen)."""
  from realm_jax.data import qa_datasets  # pylint: disable=g-import-not-at-top
  return qa_datasets.seeded_split(modules, _SPLITS, f"python_docs:{seed}")


def _write_jsonl(path: str, records: Sequence[dict]) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps(record, ensure_ascii=False) + "\n")


def _of_modules(title: str, modules: set[str]) -> bool:
  """Whether a document's title names one of `modules` or something inside it."""
  return any(title == m or title.startswith(m + ".") for m in modules)


def generate(out: str, seed: int = 0, subset: Optional[Sequence[int]] = None) -> dict:
  """Writes the corpus, the questions and the manifest into `out` (a new directory, renamed
  into place when complete); returns the manifest. `subset`: (train, dev, test) counts: only the
  first that many questions of each split, and only the documents of the modules they ask about
  (a corpus for trying a larger BERT in minutes)."""
  documents, questions = [], []
  seen_ids: set[str] = set()
  for name in public_modules():
    for document, question in module_records(name):
      if document["id"] in seen_ids:
        continue
      seen_ids.add(document["id"])
      documents.append(document)
      if question is not None:
        questions.append(question)
  documents.extend(topic_records())
  # A question whose answer is asked twice in a module (overloads, aliases) stays once.
  unique = {(q["question"], q["answer"][0]): q for q in questions}
  questions = [unique[key] for key in sorted(unique)]
  splits = split_modules(sorted({q["module"] for q in questions}), seed)
  if os.path.exists(out):
    raise FileExistsError(f"{out} exists; choose another --out or remove it")
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with fileio.staged_directory(out, f".{os.path.basename(out)}.staging-") as staging:
    os.makedirs(os.path.join(staging, "qa"))
    by_split = {split: [q for q in questions if splits[q["module"]] == split]
                for split, _ in _SPLITS}
    if subset is not None:
      by_split = {split: rows[:n] for (split, rows), n in zip(by_split.items(), subset)}
      modules = {q["module"] for rows in by_split.values() for q in rows}
      documents = [d for d in documents if _of_modules(d["title"], modules)]
    _write_jsonl(os.path.join(staging, "docs.jsonl"), documents)
    counts = {"documents": len(documents)}
    for split, rows in by_split.items():
      _write_jsonl(os.path.join(staging, "qa", f"{split}.jsonl"),
                   [{"question": q["question"], "answer": q["answer"]} for q in rows])
      counts[f"questions_{split}"] = len(rows)
    files = ["docs.jsonl"] + [f"qa/{split}.jsonl" for split, _ in _SPLITS]
    manifest = {"python": sys.version.split()[0], "seed": seed,
                "subset": None if subset is None else list(subset), "counts": counts,
                "sha256": {f: fileio.sha256_file(os.path.join(staging, f)) for f in files}}
    fileio.write_json_atomically(os.path.join(staging, "manifest.json"), manifest)
    fileio.publish_staged(staging, out)
  return manifest


def _counts(text: str) -> tuple[int, int, int]:
  """`--subset`: three positive counts, train,dev,test."""
  parts = text.split(",")
  if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
    raise argparse.ArgumentTypeError(f"{text!r}: expected three positive counts TRAIN,DEV,TEST")
  return tuple(int(p) for p in parts)


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(prog=f"python -m realm_jax.data.{PROG}", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=True, help="output directory (must not exist)")
  parser.add_argument("--seed", type=int, default=0, help="split seed (default %(default)s)")
  parser.add_argument("--subset", type=_counts, metavar="TRAIN,DEV,TEST",
                      help="keep the first that many questions of each split and only the "
                           "documents of the modules they ask about (e.g. 240,40,40: 1,421 "
                           "documents on Python 3.11, for a larger BERT on a CPU)")
  args = parser.parse_args(argv)
  from realm_jax import gin_utils  # pylint: disable=g-import-not-at-top

  def write() -> int:
    manifest = generate(os.path.abspath(args.out), args.seed, args.subset)
    counts = manifest["counts"]
    print(f"{PROG}: {counts['documents']:,} documents, questions "
          + " / ".join(f"{counts[f'questions_{s}']:,} {s}" for s, _ in _SPLITS)
          + f" (Python {manifest['python']}) in {args.out}")
    return 0

  return gin_utils.run_command(
      PROG, write, interrupted="nothing was written to --out (it is renamed into place only "
      "when complete)", expected=(OSError,), describe=gin_utils.one_line)


if __name__ == "__main__":
  sys.exit(main())
