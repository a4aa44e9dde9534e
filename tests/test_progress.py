"""realm_jax.progress: the one progress line and duration format, on hand-worked numbers."""

import io

import pytest

from realm_jax import progress


@pytest.mark.parametrize("seconds,text", [
    (4.24, "4.2s"), (9.94, "9.9s"), (18.2, "0:00:18"), (187, "0:03:07"), (3723, "1:02:03"),
    (90061, "1 day, 1:01:01"), (None, "?"), (float("nan"), "?"), (float("inf"), "?")])
def test_format_duration(seconds, text):
  assert progress.format_duration(seconds) == text


def test_the_trainer_line_keeps_its_format():
  # 20 of 400 steps at 2.04 steps/s (compiling steps left out): 380 / 2.04 = 186.3 s left.
  assert progress.line("step", 20, 400, 18.2, unit="steps", rate=2.04,
                       extras=["train/loss 6.99"]) == (
      "step 20/400 (5.0%) | 2.04 steps/s | train/loss 6.99 | elapsed 0:00:18 | ETA 0:03:06")


def test_the_rate_and_eta_from_the_time_so_far():
  # 1,000 of 5,000 blocks in 8 s: 125 blocks/s, 4,000 left, 32 s.
  assert progress.line("blocks", 1000, 5000, 8.0) == (
      "blocks 1,000/5,000 (20.0%) | 125 blocks/s | elapsed 8.0s | ETA 0:00:32")
  # Nothing done yet: no rate, no ETA; all done: ETA zero.
  assert progress.line("questions", 0, 100, 0.0).endswith("? questions/s | elapsed 0.0s | ETA ?")
  assert progress.line("questions", 100, 100, 3.0).endswith("| ETA 0.0s")


def test_a_share_done_that_is_not_a_count():
  # 40% of the input's bytes in 4 s: 6 s left (4 * 0.6 / 0.4), whatever the documents count.
  text = progress.line("documents read", 12000, None, 4.0, unit="documents", fraction=0.4,
                       extras=["50,000 blocks written"])
  assert text == ("documents read 12,000 (40.0%) | 3,000 documents/s | 50,000 blocks written | "
                  "elapsed 4.0s | ETA 6.0s")
  assert progress.eta_seconds(5, None, 4.0) is None  # no total, no share: unknown


def test_the_throttle_holds_lines_back_and_finish_writes_the_last():
  stream = io.StringIO()
  throttle = progress.Throttle(interval_s=3600.0, stream=stream)
  throttle("1/3")
  throttle("2/3")
  assert stream.getvalue() == ""  # within the interval: held back
  throttle.finish()
  assert stream.getvalue() == "2/3\n"
  throttle.finish()
  assert stream.getvalue() == "2/3\n"  # nothing pending: nothing more
  eager = progress.Throttle(interval_s=0.0, stream=stream)
  eager("3/3")
  assert stream.getvalue().endswith("3/3\n")
