"""The recipes' result tables (Markdown), printed at the end of `python -m realm_jax.recipe`
and written to `<out>/summary.md`: the toy world's figures, your data's (and the wiki world's)
recall at every cut-off with BM25 beside the dense retrievers, and paper scale's metrics."""

from __future__ import annotations

from typing import Sequence


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
  """A Markdown table, its columns padded to their widest cell."""
  widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

  def line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

  return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
          *(line(row) for row in rows)]


def format_table(summary: dict, wall_seconds: float) -> str:
  """The toy recipe's result table (Markdown)."""
  s = summary
  rows = [
      ("masked salient-span accuracy, null document only (no retrieval)",
       f"{s['mlm_accuracy_null_only']:.3f}"),
      ("masked salient-span accuracy, REALM (marginal over retrieved blocks)",
       f"{s['mlm_accuracy_realm']:.3f}"),
      ("retrieval utility, first -> last checkpoint",
       f"{s['retrieval_utility_first']:.3f} -> {s['retrieval_utility_last']:.3f}"),
      ("toy QA test EM, null document only (extractive reader: 0 by construction)",
       f"{s['qa_em_null_only']:.3f}"),
      ("toy QA test EM, ORQA-style baseline (ICT retriever, no REALM pretraining)",
       f"{s['qa_em_orqa']:.3f}"),
      ("toy QA test EM, REALM", f"{s['qa_em_realm']:.3f}"),
      ("retrieval recall@5 (toy QA test), before pretraining (ICT index)",
       f"{s['recall@5_before']:.3f}"),
      ("retrieval recall@5 (toy QA test), after pretraining", f"{s['recall@5_after']:.3f}"),
      ("index refreshes picked up during pretraining", f"{s['refreshes']:.0f}"),
      ("mean index staleness (steps)", f"{s['mean_staleness_steps']:.1f}"),
      ("wall time", f"{wall_seconds / 60:.1f} min")]
  width = max(len(r[0]) for r in rows)
  lines = [f"| {'':<{width}} | value |", f"|{'-' * (width + 2)}|-------|"]
  return "\n".join(lines + [f"| {name:<{width}} | {value} |" for name, value in rows])


def format_own_table(summary: dict, wall_seconds: float) -> str:
  """The own-data recipe's result (Markdown): recall at every cut-off of every retriever, BM25
  beside the dense ones, and test EM of the three fine-tuned readers; pretraining's figures;
  the verdict on pretraining and the settings chosen from the data, one line each."""
  ks = sorted((k for k in summary["recall"]["bm25"] if k.startswith("recall@")),
              key=lambda k: int(k[7:]))
  answer, qa, recall = summary["answer_metric"], summary["qa"], summary["recall"]
  step = summary["pretrain_checkpoint"]["step"]
  chosen = ("best retrieval utility" if summary["pretrain_checkpoint"]["choice"].startswith("best")
            else summary["pretrain_checkpoint"]["choice"])
  rows = [("BM25 over the blocks' title and text", recall["bm25"], None),
          ("warm start (ICT) retriever, before pretraining", recall["warm_start"], None),
          (f"REALM-pretrained retriever (checkpoint {step}: {chosen})", recall["pretrained"],
           None),
          ("ORQA-style: warm-start retriever, BERT reader, fine-tuned", qa["orqa"],
           qa["orqa"][answer]),
          ("REALM: pretrained retriever and encoder, fine-tuned", qa["realm"], qa["realm"][answer]),
          ("BM25's top blocks, BERT reader fine-tuned on them (DrQA-style)", qa["bm25_reader"],
           qa["bm25_reader"][answer])]
  header = ["", *ks, "test EM" if answer == "exact_match" else "test regex match"]
  lines = _markdown(header, [[name, *(f"{metrics[k]:.3f}" for k in ks),
                              "" if em is None else f"{em:.3f}"] for name, metrics, em in rows])
  utility = summary["retrieval_utility"]
  lines += [""] + _markdown(["pretraining", "value"], [
      ("masked salient-span accuracy, null document only -> REALM (checkpoint "
       f"{step})", f"{summary['mlm_accuracy_null_only']:.3f} -> "
                   f"{summary['mlm_accuracy_realm']:.3f}"),
      ("retrieval utility, first -> chosen -> last checkpoint",
       f"{utility['first']:.3f} -> {utility['chosen']:.3f} -> {utility['last']:.3f}"),
      ("index refreshes picked up during pretraining", f"{summary['refreshes']:.0f}"),
      ("mean index staleness (steps)", f"{summary['mean_staleness_steps']:.1f}"),
      ("wall time", f"{wall_seconds / 60:.1f} min")])
  lines += ["", summary["verdict"], summary["span_redundancy"]["line"]]
  lines += [f"bert: {summary['bert']}"]
  lines += [f"{name}: {setting['value']:g} ({setting['why']})"
            for name, setting in summary["settings"].items()]
  return "\n".join(lines)


def format_paper_table(summary: dict, wall_seconds: float) -> str:
  """The paper-scale recipe's result (Markdown): every metric of the two fine-tuned systems."""
  keys = sorted(summary["realm"], key=lambda k: (k.startswith("recall@"), k))
  rows = [[name, *(f"{summary[row].get(k, float('nan')):.3f}" for k in keys)]
          for row, name in (("orqa", "ORQA-style baseline"), ("realm", "REALM"))]
  return "\n".join(_markdown(["", *keys], rows) + [f"wall time {wall_seconds / 60:.1f} min"])
