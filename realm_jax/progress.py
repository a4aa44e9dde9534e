"""Progress lines for long work: one format for training, the corpus build, embedding and
evaluation, and a throttle that keeps a console readable.

  step 20/400 (5.0%) | 2.04 steps/s | train/loss 6.99 | elapsed 0:00:18 | ETA 0:03:06

`line` writes it: what is counted, done out of the total (or the share done when the total is
not a count, e.g. the bytes of the corpus read), the rate, any extra fields, the elapsed time and
the ETA. The index builder's and the recipe's console filters match these lines, so their
start ("<what> <done>/<total> (") is the same everywhere.
"""

from __future__ import annotations

import datetime
import math
import sys
import time
from typing import Optional, Sequence, TextIO


def format_duration(seconds: Optional[float]) -> str:
  """"4.2s" under ten seconds, else H:MM:SS (days first past 24 hours); "?" when unknown
  (None, NaN or infinite)."""
  if seconds is None or not math.isfinite(seconds):
    return "?"
  seconds = max(seconds, 0.0)
  if seconds < 10:
    return f"{seconds:.1f}s"
  return str(datetime.timedelta(seconds=int(round(seconds))))


def eta_seconds(done: float, total: Optional[float], elapsed_s: float, *,
                rate: Optional[float] = None, fraction: Optional[float] = None
                ) -> Optional[float]:
  """Seconds left: from the share done (`fraction`, 0-1) and the time it took when given, else
  the `total - done` units left at `rate` (default done / elapsed_s); None when unknown."""
  if fraction is not None:
    if fraction >= 1.0:
      return 0.0
    return elapsed_s * (1.0 - fraction) / fraction if fraction > 0 and elapsed_s > 0 else None
  if total is None:
    return None
  if done >= total:
    return 0.0
  if rate is None:
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
  return (total - done) / rate if rate > 0 and math.isfinite(rate) else None


def format_rate(rate: float) -> str:
  """Three significant figures below 100 ("2.04", "12.5"), whole numbers with thousands
  separators above ("3,120"); "?" when unknown."""
  if not math.isfinite(rate):
    return "?"
  return f"{rate:.3g}" if abs(rate) < 100 else f"{rate:,.0f}"


def line(what: str, done: float, total: Optional[float], elapsed_s: float, *,
         unit: Optional[str] = None, rate: Optional[float] = None,
         fraction: Optional[float] = None, extras: Sequence[str] = ()) -> str:
  """One progress line (the format at the top of this module).

  Args:
    what: what is counted ("step", "blocks", "questions", "documents read").
    done: how many so far; total: of how many (None: not known).
    elapsed_s: seconds since the work began.
    unit: the rate's unit (default `what`), e.g. "steps" for what="step".
    rate: units per second, when the caller times it otherwise (the trainer leaves out the
      steps that compiled); default done / elapsed_s.
    fraction: the share done (0-1) when it is not done / total (the corpus build: bytes read);
      it gives the percentage and the ETA.
    extras: fields put between the rate and the elapsed time ("train/loss 6.99").
  """
  eta = eta_seconds(done, total, elapsed_s, rate=rate, fraction=fraction)
  if rate is None:
    rate = done / elapsed_s if elapsed_s > 0 else float("nan")
  if fraction is None and total:
    fraction = done / total
  count = f"{done:,}/{total:,}" if total is not None else f"{done:,}"
  head = f"{what} {count}" + (f" ({100.0 * fraction:.1f}%)" if fraction is not None else "")
  fields = [head, f"{format_rate(rate)} {unit or what}/s", *extras,
            f"elapsed {format_duration(elapsed_s)}", f"ETA {format_duration(eta)}"]
  return " | ".join(fields)


class Throttle:
  """Writes lines to `stream` (default stderr) at most every `interval_s` seconds; `finish`
  writes the last one held back, so the final count always shows."""

  def __init__(self, interval_s: float = 5.0, stream: Optional[TextIO] = None):
    self.interval_s = interval_s
    self._stream = stream
    self._last = time.monotonic()
    self._pending: Optional[str] = None

  def _write(self, text: str) -> None:
    print(text, file=self._stream or sys.stderr, flush=True)

  def __call__(self, text: str) -> None:
    now = time.monotonic()
    if now - self._last >= self.interval_s:
      self._write(text)
      self._last, self._pending = now, None
    else:
      self._pending = text

  def finish(self) -> None:
    if self._pending is not None:
      self._write(self._pending)
      self._pending = None
