"""dashboard.server.byte_budget: a cache bounded by the bytes it keeps, least recently used out, held entries last."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pytest

from dashboard.server import byte_budget
from dashboard.server.byte_budget import ByteBudgetCache, default_capture_budget, nbytes_of
from vit_core import settings

MB = 2**20


def block(mb: int) -> np.ndarray:
    return np.zeros(mb * MB, dtype=np.uint8)


def test_nbytes_counts_the_arrays_of_a_dataclass_and_its_tuples():
    @dataclass(frozen=True)
    class Result:
        name: str
        a: np.ndarray
        pair: tuple[np.ndarray, np.ndarray]

    value = Result("x", np.zeros((3, 4), np.float32), (np.zeros(5, np.uint8), np.zeros(2, np.float64)))
    assert nbytes_of(value) == 48 + 5 + 16


def test_the_sum_of_sizes_stays_under_the_budget_and_the_least_recently_used_go_first():
    cache = ByteBudgetCache(max_bytes=10 * MB)
    for key in "abcd":
        cache.put(key, block(3))  # 12 MB > 10: "a" goes
    assert cache.keys() == ["b", "c", "d"] and cache.total_bytes == 9 * MB
    assert cache.get("b") is not None  # used: now the most recent
    cache.put("e", block(3))
    assert cache.keys() == ["d", "b", "e"]  # "c" was the least recently used
    cache.put("f", block(8))
    assert cache.keys() == ["f"] and cache.total_bytes <= cache.max_bytes


def test_held_entries_go_after_every_unheld_one_and_then_by_recency():
    cache = ByteBudgetCache(max_bytes=10 * MB)
    cache.put("mine", block(3))
    cache.hold("session 1", "mine")
    cache.put("theirs", block(3))
    cache.hold("session 2", "theirs")
    cache.put("nobody's", block(3))
    cache.put("new", block(3))  # 12 MB: the unheld "nobody's" goes, though "mine" is older
    assert cache.keys() == ["mine", "theirs", "new"]
    cache.hold("session 3", "new")
    assert cache.get("mine") is not None  # used: "mine" is now the most recent
    cache.put("newer", block(3))  # nothing unheld but the new one: the least recently used hold goes
    assert cache.keys() == ["new", "mine", "newer"]
    assert cache._holds == {"session 1": "mine", "session 3": "new"}  # the evicted "theirs" is no longer held


def test_a_holder_holds_one_entry():
    cache = ByteBudgetCache(max_bytes=6 * MB)
    cache.put("first", block(2))
    cache.hold("s", "first")
    cache.put("second", block(2))
    cache.hold("s", "second")  # lets go of "first"
    cache.put("third", block(3))
    assert cache.keys() == ["second", "third"]


def test_a_value_larger_than_the_budget_is_returned_but_not_kept():
    cache = ByteBudgetCache(max_bytes=4 * MB)
    cache.put("small", block(1))
    assert cache.get_or_compute("huge", lambda: block(5)).nbytes == 5 * MB
    assert cache.keys() == ["small"]


def test_concurrent_callers_compute_a_key_once():
    cache = ByteBudgetCache(max_bytes=10 * MB)
    calls, start = [], threading.Barrier(8)
    gate = threading.Event()

    def compute():
        calls.append(1)
        gate.wait(5)  # the others arrive while this one computes
        return block(1)

    def caller(results: list) -> None:
        start.wait(5)
        results.append(cache.get_or_compute("k", compute))

    results: list = []
    threads = [threading.Thread(target=caller, args=(results,)) for _ in range(8)]
    for t in threads:
        t.start()
    threading.Timer(0.3, gate.set).start()
    for t in threads:
        t.join(10)
    assert len(calls) == 1 and len(results) == 8 and all(r is results[0] for r in results)


def test_a_failed_computation_is_not_kept_and_is_tried_again():
    cache = ByteBudgetCache(max_bytes=10 * MB)

    def failing():
        raise ValueError("no")

    with pytest.raises(ValueError):
        cache.get_or_compute("k", failing)
    assert "k" not in cache
    assert cache.get_or_compute("k", lambda: block(1)).nbytes == MB


def test_the_default_budget_is_a_quarter_of_the_memory_clamped_or_the_setting(monkeypatch):
    monkeypatch.delenv(settings.CAPTURE_MB.name, raising=False)
    monkeypatch.setattr(byte_budget, "_memory_limit_bytes", lambda: 24 * 2**30)
    assert default_capture_budget() == 6 * 2**30
    monkeypatch.setattr(byte_budget, "_memory_limit_bytes", lambda: 1 * 2**30)
    assert default_capture_budget() == 512 * MB
    monkeypatch.setattr(byte_budget, "_memory_limit_bytes", lambda: 256 * 2**30)
    assert default_capture_budget() == 8 * 2**30
    monkeypatch.setenv(settings.CAPTURE_MB.name, "300")
    assert default_capture_budget() == 300 * MB
    monkeypatch.setenv(settings.CAPTURE_MB.name, "lots")
    assert default_capture_budget() == 8 * 2**30  # a warning, and the default


def test_one_each_bounds_a_cache_by_its_number_of_entries():
    """The stores of results computed on request (the deletion / insertion curves) keep a number of entries, the
    least recently used out first, whatever their size."""
    cache = ByteBudgetCache(3, size_of=byte_budget.one_each)
    for key in "abcd":
        cache.put(key, np.zeros(10**6, dtype=np.uint8))  # 1 MB each: counted as 1
    assert cache.keys() == ["b", "c", "d"] and cache.total_bytes == 3
    assert cache.get("b") is not None  # used: now the most recent
    cache.put("e", np.zeros(1))
    assert cache.keys() == ["d", "b", "e"]
