"""A small thread-safe cache bounded by the bytes of what it keeps, not by a count. No Streamlit here.

Streamlit's `st.cache_resource` bounds a cache by `max_entries` (and `ttl`, which only evicts on access).
A capture's size depends on the model: about 31 MiB for ViT-B/16 at 224, 205 MiB at 384, so a
count that is safe for one model lets the other fill the machine. `ByteBudgetCache` keeps values
until their sizes together reach a byte budget, then forgets the least recently used.

Sessions *hold* the entry they are looking at (`hold(holder, key)`, one per holder): held entries are
evicted only after every entry nobody holds, least recently used first; a holder whose entry was
evicted finds it missing and computes it again. What the cache accounts for is what it keeps alive
itself: a value it evicted is freed once nobody else references it.

The budget: `$VIT_LENS_CAPTURE_MB` if set (`vit_core.settings.CAPTURE_MB`; 0 or unset: the default), else a
quarter of the machine's memory (the container's limit where there is one), between 512 MiB and 8 GiB
(`default_capture_budget`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable, Generic, Hashable, TypeVar

import numpy as np

from vit_core import settings
from vit_core.runtime import memory_limit_bytes

_logger = logging.getLogger(__name__)

V = TypeVar("V")

BUDGET_SHARE = 4  # a quarter of the memory: the model, the decoded pictures and Streamlit need the rest
MIN_BUDGET_MB, MAX_BUDGET_MB = 512, 8192


def nbytes_of(value: Any) -> int:
    """Bytes of the numpy arrays a value holds: itself, the fields of a dataclass, the items of a tuple / list.
    (Everything else in a capture is a few hundred bytes of metadata.)"""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if is_dataclass(value) and not isinstance(value, type):
        return sum(nbytes_of(getattr(value, f.name)) for f in fields(value))
    if isinstance(value, (tuple, list)):
        return sum(nbytes_of(v) for v in value)
    return 0


def _memory_limit_bytes() -> int | None:
    """The container's memory limit (cgroup v2 or v1) or the machine's memory, whichever is smaller."""
    return memory_limit_bytes()


def default_capture_budget() -> int:
    """Bytes the shared captures may take: $VIT_LENS_CAPTURE_MB, else a quarter of the memory, clamped."""
    try:
        configured = settings.CAPTURE_MB.number()
    except settings.SettingError as e:
        _logger.warning("%s; using the default", e)
        configured = 0
    if configured:
        return configured * 2**20
    memory = _memory_limit_bytes() or 4 * 2**30
    return int(min(max(memory // BUDGET_SHARE, MIN_BUDGET_MB * 2**20), MAX_BUDGET_MB * 2**20))


@dataclass
class _Entry(Generic[V]):
    value: V
    nbytes: int


class ByteBudgetCache(Generic[V]):
    """Values by key, least recently used first out once their sizes (`size_of`) pass `max_bytes`.

    `get_or_compute` computes a missing key once, however many threads ask at the same moment (a
    class opening the page at once runs the example's forward pass once). A value larger than the
    whole budget is returned but not kept.
    """

    def __init__(self, max_bytes: int, size_of: Callable[[V], int] = nbytes_of) -> None:
        self.max_bytes = int(max_bytes)
        self._size_of = size_of
        self._entries: OrderedDict[Hashable, _Entry[V]] = OrderedDict()  # least recently used first
        self._holds: dict[Hashable, Hashable] = {}  # holder -> key
        self._lock = threading.Lock()
        self._computing: dict[Hashable, threading.Lock] = {}  # key -> the lock of the thread computing it

    # -- reading

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry.value

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def keys(self) -> list[Hashable]:
        """The keys kept, least recently used first."""
        with self._lock:
            return list(self._entries)

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    # -- writing

    def put(self, key: Hashable, value: V) -> V:
        size = self._size_of(value)
        with self._lock:
            self._entries.pop(key, None)
            if size > self.max_bytes:
                _logger.info("not caching %r: %d MiB is over the whole budget (%d MiB)", key, size >> 20,
                             self.max_bytes >> 20)
                return value
            self._entries[key] = _Entry(value, size)
            self._evict()
        return value

    def get_or_compute(self, key: Hashable, compute: Callable[[], V]) -> V:
        """The value of `key`, computed by `compute()` and kept if missing (once for concurrent callers)."""
        value = self.get(key)
        if value is not None:
            return value
        with self._lock:
            key_lock = self._computing.setdefault(key, threading.Lock())
        with key_lock:  # a second caller waits here for the first one's result
            try:
                value = self.get(key)
                if value is None:
                    value = self.put(key, compute())
            finally:
                with self._lock:
                    if self._computing.get(key) is key_lock:
                        del self._computing[key]
        return value

    # -- holds

    def hold(self, holder: Hashable, key: Hashable) -> None:
        """`holder` (a session) now holds `key` (and lets go of what it held before)."""
        with self._lock:
            self._holds[holder] = key

    def _evict(self) -> None:
        """Under the lock: drop unheld entries, then held ones, least recently used first, until under budget."""
        total = sum(e.nbytes for e in self._entries.values())
        if total <= self.max_bytes:
            return
        held_keys = set(self._holds.values())
        order = [k for k in self._entries if k not in held_keys] + [k for k in self._entries if k in held_keys]
        newest = next(reversed(self._entries))  # just put: the caller is about to use it
        for key in order:
            if total <= self.max_bytes:
                break
            if key == newest:
                continue
            total -= self._entries.pop(key).nbytes
            _logger.debug("evicted %r (%s)", key, "held" if key in held_keys else "not held")
        self._holds = {h: k for h, k in self._holds.items() if k in self._entries}  # evicted: no longer held


def one_each(value: Any) -> int:
    """`size_of` for a cache bounded by its number of entries, not by bytes: every value counts 1, and
    `max_bytes` is the number of entries kept (results too small to weigh, computed on request)."""
    return 1
