"""The real-text example corpus (Python's documentation): questions, splits, no machine leaks."""

import json
import os
import re

import pytest

from realm_jax import fileio
from realm_jax.data import python_docs


@pytest.mark.parametrize("verb,expected", [
    ("Return", "returns"), ("Match", "matches"), ("Copy", "copies"), ("Play", "plays"),
    ("Do", "does"), ("Go", "goes"), ("Fix", "fixes"), ("Deep", None), ("Returns", None),
    ("Initialized", None), ("Helper", None), ("Is", None)])
def test_third_person_of_an_imperative_opening(verb, expected):
  assert python_docs.third_person(verb) == expected


def test_questions_from_docstring_summaries():
  assert python_docs.summary_sentence(
      "Push item onto heap, maintaining the heap invariant.\n\nMore text.") == (
          "Push item onto heap, maintaining the heap invariant.")
  assert python_docs.question_for(
      "heapq", None, "Push item onto heap, maintaining the heap invariant.") == (
          "Which function of the heapq module pushes item onto heap, maintaining the heap "
          "invariant?")
  assert python_docs.question_for("pathlib", "PurePath", "Return the string representation "
                                  "of the path.") == (
      "Which method of PurePath in the pathlib module returns the string representation of "
      "the path?")
  assert python_docs.question_for("m", None, "Return x.") is None  # too short to ask about
  assert python_docs.question_for("m", None, "Helper class for the many things here.") is None


def test_signatures_show_short_literal_defaults_only():
  def f(a, b=2, *args, env=os.environ, name="x", **kwargs):  # pylint: disable=unused-argument
    pass
  assert python_docs._signature(f) == "(a, b=2, *args, env=..., name='x', **kwargs)"  # pylint: disable=protected-access


def test_splits_are_by_module_and_cover_every_module():
  modules = [f"mod{i}" for i in range(50)]
  splits = python_docs.split_modules(modules, seed=0)
  assert set(splits) == set(modules)
  counts = {s: sum(1 for v in splits.values() if v == s) for s in ("train", "dev", "test")}
  assert counts == {"train": 40, "dev": 5, "test": 5}
  assert splits != python_docs.split_modules(modules, seed=1)


def test_generate_writes_answerable_questions_and_nothing_of_this_machine(tmp_path, monkeypatch):
  probe = "probe-7f3a9c1e"
  monkeypatch.setenv("REALM_JAX_DOCS_PROBE", probe)  # os.environ is a default of some functions
  manifest = python_docs.generate(str(tmp_path / "a"))
  text = {f: (tmp_path / "a" / f).read_text(encoding="utf-8") for f in manifest["sha256"]}
  assert all(probe not in t for t in text.values())
  for name, digest in manifest["sha256"].items():
    assert fileio.sha256_file(str(tmp_path / "a" / name)) == digest
  documents = [json.loads(line) for line in text["docs.jsonl"].splitlines()]
  assert len(documents) == manifest["counts"]["documents"] > 1000
  assert len({d["id"] for d in documents}) == len(documents)
  bodies = {d["title"]: d["text"] for d in documents}
  modules_of = {}
  for split in ("train", "dev", "test"):
    questions = [json.loads(line) for line in text[f"qa/{split}.jsonl"].splitlines()]
    assert len(questions) == manifest["counts"][f"questions_{split}"] > 50
    for q in questions:
      module = re.search(r"(?:function of the|in the) (\S+) module", q["question"]).group(1)
      modules_of.setdefault(module, set()).add(split)
      answer = q["answer"][0]
      # The answer is the name in the body of a document of that module.
      assert any(title.startswith(module + ".") and title.endswith("." + answer)
                 and re.search(rf"\b{re.escape(answer)}\b", body)
                 for title, body in bodies.items()), q
  assert all(len(splits) == 1 for splits in modules_of.values())  # no module in two splits
  python_docs.generate(str(tmp_path / "b"))
  for name in manifest["sha256"]:
    assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes()
  with pytest.raises(FileExistsError, match="exists"):
    python_docs.generate(str(tmp_path / "a"))


def test_a_subset_is_the_first_questions_and_their_modules_documents(tmp_path, capsys):
  """`--subset 5,3,2`: the full output's first questions of each split, and of its documents
  those whose title is a module asked about or lies inside one (read from the questions)."""
  full = tmp_path / "full"
  python_docs.generate(str(full))
  assert python_docs.main(["--out", str(tmp_path / "sub"), "--subset", "5,3,2"]) == 0
  modules = set()
  for split, n in (("train", 5), ("dev", 3), ("test", 2)):
    lines = (full / "qa" / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    assert (tmp_path / "sub" / "qa" / f"{split}.jsonl").read_text(
        encoding="utf-8").splitlines() == lines
    modules |= {re.search(r"(?:function of the|in the) (\S+) module",
                          json.loads(line)["question"]).group(1) for line in lines}
  kept = [line for line in (full / "docs.jsonl").read_text(encoding="utf-8").splitlines()
          if any(json.loads(line)["title"] == m or json.loads(line)["title"].startswith(m + ".")
                 for m in modules)]
  assert (tmp_path / "sub" / "docs.jsonl").read_text(encoding="utf-8").splitlines() == kept
  assert 0 < len(kept) < 1000
  with pytest.raises(SystemExit):
    python_docs.main(["--out", str(tmp_path / "bad"), "--subset", "5,3"])
  assert "expected three positive counts" in capsys.readouterr().err
