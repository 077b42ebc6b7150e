"""The one thread policy (osprey_data.cpu_threads): busy machine -> 1 thread and a note, an idle one
-> torch's default, an explicit value always wins, and the caller's setting comes back."""

from __future__ import annotations

import os

import pytest
import torch

from osprey_data.cpu_threads import busy_machine_threads, check_threads, chosen_threads, torch_threads
from osprey_data.errors import ConfigError


@pytest.fixture
def busy(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (8.0, 8.0, 8.0))


@pytest.fixture
def idle(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 1.0, 1.0))


def test_busy_machine_gets_one_thread_and_says_so(busy):
    notes = []
    assert busy_machine_threads(notes.append) == 1
    assert chosen_threads(None, notes.append) == 1
    assert len(notes) == 2 and "busy" in notes[0] and "--threads" in notes[0]


def test_idle_machine_keeps_torch_default_silently(idle):
    notes = []
    assert chosen_threads(None, notes.append) is None and notes == []


def test_at_the_threshold_the_machine_is_not_busy(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 3.0, 3.0))   # exactly 1.5 x cores
    assert busy_machine_threads() is None


def test_explicit_threads_win_on_a_busy_machine(busy):
    notes = []
    assert chosen_threads(3, notes.append) == 3 and notes == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_thread_counts_are_config_errors(bad):
    with pytest.raises(ConfigError, match="--threads must be an integer >= 1"):
        check_threads(bad, "build")
    with pytest.raises(ConfigError):
        chosen_threads(bad)


def test_torch_threads_sets_and_restores(busy):
    before = torch.get_num_threads()
    with torch_threads(None):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before


def test_torch_threads_leaves_an_idle_machine_alone(idle):
    torch.set_num_threads(2)
    try:
        with torch_threads(None):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
