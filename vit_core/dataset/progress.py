"""Progress for a log: one line every few percent (and at least every minute), when the output is not a terminal.

A batch job's log gets "images: 640 of 12,800 files (5%), 41.2 images/s, about 4 min 55 s left"; a terminal gets
tqdm's bar instead (the CLI chooses). The lines go to the stream given, not through `logging`: they are the
command's output, like tqdm's bar.
"""

from __future__ import annotations

import time
from typing import Callable, TextIO


def duration(seconds: float) -> str:
    """A duration for people: '45 s', '4 min 55 s', '2 h 05 min'."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class ProgressLines:
    """`update(done, total)` writes a line each time `done` crosses another `percent` of `total`, or `every_s`
    seconds after the last line, and at the end; rate and time left from this run's files so far."""

    def __init__(self, stream: TextIO, label: str = "images", percent: int = 5, every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, items: str = "files", per: str = "images") -> None:
        """`items`: what `done` counts ("files"); `per`: the rate's unit ("images": images/s)."""
        self.stream, self.label, self.percent, self.every_s, self.clock = stream, label, percent, every_s, clock
        self.items, self.per = items, per
        self.started = clock()
        self.last_line = self.started
        self.next_percent = percent
        self.finished = False

    def update(self, done: int, total: int) -> None:
        if self.finished or total <= 0:
            return
        now = self.clock()
        share = 100 * done / total
        if done < total and share < self.next_percent and now - self.last_line < self.every_s:
            return
        self.next_percent = (int(share) // self.percent + 1) * self.percent
        self.last_line = now
        self.finished = done >= total
        elapsed = max(now - self.started, 1e-9)
        rate = done / elapsed
        left = (total - done) / rate if rate > 0 else float("nan")
        tail = f"done in {duration(elapsed)}" if self.finished else (
            f"about {duration(left)} left" if rate > 0 else "time left not known yet")
        self.stream.write(f"{self.label}: {done:,} of {total:,} {self.items} ({share:.0f}%), {rate:.1f} {self.per}/s, "
                          f"{tail}\n")
        self.stream.flush()
