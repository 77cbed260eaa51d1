"""Fault injection (fp8jax/train/faults.py): the n-th visit of the point named by
FP8JAX_FAULT, and no other, says to die."""

import os
import signal

import pytest

from fp8jax.train import faults


@pytest.fixture(autouse=True)
def _fresh_counts(monkeypatch):
  monkeypatch.setattr(faults, "_seen", {})


def test_unset_never_fires(monkeypatch):
  monkeypatch.delenv(faults.ENV, raising=False)
  assert not any(faults.reached("checkpoint_save/8") for _ in range(5))


def test_the_nth_visit_of_the_named_point_fires_once(monkeypatch):
  monkeypatch.setenv(faults.ENV, "append/rows@v2.jsonl@3")  # the count follows the last @
  visits = [faults.reached("append/rows@v2.jsonl") for _ in range(5)]
  assert visits == [False, False, True, False, False]
  assert not any(faults.reached("checkpoint_save/8") for _ in range(5))


def test_kill_sends_sigkill_to_this_process(monkeypatch):
  sent = []
  monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
  faults.kill()
  assert sent == [(os.getpid(), signal.SIGKILL)]
