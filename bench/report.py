"""Writing benchmark figures into bench/docs/benchmarks.md, one section per benchmark."""

from __future__ import annotations

import datetime
import os
import platform
import re


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS_MD = os.path.join(REPO_ROOT, "bench", "docs", "benchmarks.md")
HEADER = ("# Benchmarks\n\nWritten by the scripts in `bench/`; each section says how to "
          "reproduce it. Every figure is compared with a peer measured in the same run.\n")


def machine() -> str:
  """One line naming the machine: CPU model, cores, memory."""
  model = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      names = re.findall(r"model name\s*:\s*(.+)", f.read())
    if names:
      model = names[0].strip()
  except OSError:
    pass
  memory = ""
  try:
    pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    memory = f", {pages * page_size / 2**30:.0f} GiB"
  except (ValueError, OSError):
    pass
  return f"{model}, {os.cpu_count()} cores{memory}"


def write_section(title: str, body: str, path: str = BENCHMARKS_MD, *,
                  accelerator: str | None = None, host: str | None = None) -> None:
  """Replaces (or appends) the `## title` section of bench/docs/benchmarks.md.

  `accelerator` (a device kind, e.g. "NVIDIA H100 80GB HBM3") names the device the figures were
  measured on when it is not the host CPU: the section is then `## title (accelerator)`, beside
  the CPU's, and its stamp names both the accelerator and its host. `host`: the `machine()` line
  of the machine that measured, when the section is written elsewhere (from kept figures);
  default this machine's.

  A section whose body is unchanged keeps its stamp: written again from the same kept cells, the
  document stays byte for byte the same.
  """
  text = open(path, encoding="utf-8").read() if os.path.exists(path) else HEADER
  host = host or machine()
  where = f"{accelerator}; host {host}" if accelerator else host
  if accelerator:
    title = f"{title} ({accelerator})"
  stamp = f"_{datetime.date.today().isoformat()}, {where}._\n\n"
  pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
  found = pattern.search(text)
  if found:
    old = re.match(r"## [^\n]*\n\n(_[^\n]*_\n\n)?(.*)", found.group(0), re.S)
    if old and old.group(1) and old.group(2).strip() == body.strip():
      stamp = old.group(1)
  section = f"## {title}\n\n{stamp}{body.strip()}\n"
  if found:
    text = pattern.sub(lambda _: section + "\n", text).rstrip() + "\n"
  else:
    text = text.rstrip() + "\n\n" + section
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
