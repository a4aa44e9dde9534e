"""Fixtures shared by the launchers' tests."""

import os
import subprocess

import pytest


@pytest.fixture
def no_subprocess(monkeypatch):
  """Fails the test when anything starts a process: a dry run must only print."""
  def refuse(*args, **kwargs):
    raise AssertionError(f"a dry run started a process: {args}")

  for name in ("Popen", "run", "call", "check_call", "check_output"):
    monkeypatch.setattr(subprocess, name, refuse)
  monkeypatch.setattr(os, "system", refuse)
