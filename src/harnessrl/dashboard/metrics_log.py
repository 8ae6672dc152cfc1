"""A run's ``metrics.jsonl`` as the runs page draws it, read incrementally in bounded memory.

The runs page refreshes every 5 s while a run goes on, and parsed the whole file each time into a
list of dicts: a 10,000-step run's 33 MB file cost ~100 MB of memory and all of its parsing per
load. A ``MetricsLog`` (one per metrics file, owned by the dashboard) remembers how far it read and
what the file was (device, inode, size, mtime): a load with nothing new does no work, a load after
the trainer appended a line parses that line only, and a file replaced or shortened is read again
from its start. What it keeps of every metric is an ``Envelope``: the lowest and highest point of
each of at most ``MAX_POINTS_DRAWN`` equal runs of its points (every point up to twice
``MAX_POINTS_DRAWN``), which ``charts.thinned`` thins once more to draw, so its memory does not grow
with the run and a line's extremes are kept.

Where this departs from drawing every record: smoothing (``SMOOTHING``'s weights) is computed as the
points arrive, in the order they were logged, and kept as an envelope of its own; ``charts.smoothed``
sorts by x first, which differs only where a resumed run logged a step again; and it averages a
metric's every finite value, where a record without a ``time`` was left out of the minutes axis'
average. A last line without its newline (a run writing it now) is read once its newline is there.
"""

from __future__ import annotations

import json
import math
import os
import threading
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

Series = list[tuple[float, float]]

#: The most points drawn of one line (``charts.thinned``): two per bucket, several per pixel.
MAX_POINTS_DRAWN = 400
#: The smoothing weights the runs page offers (0: off); each is kept for every metric.
SMOOTHING = (0.0, 0.6, 0.8, 0.9, 0.95)
#: Bytes read from the file at a time.
_CHUNK = 1 << 20


def finite(value: object) -> float | None:
    """``value`` as a finite float, or ``None``: a metric may be anything JSON holds, including NaN,
    infinities and integers too large for a float."""
    if not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


class Envelope:
    """A growing series kept as the lowest and highest point of each of at most ``buckets`` equal
    runs of its points (every point while they fit). When the runs fill up, neighbours merge and
    the run length doubles, so memory is bounded and the series' extremes are never dropped.

    A point is ``(step, minutes, value)`` (an x it lacks is NaN): the runs are the same on both
    axes, so one envelope serves both. Closed runs are 8 floats each in one ``array``: the low
    point, then the high, each as (index, step, minutes, value).
    """

    __slots__ = ("_buckets", "_runs", "_open", "_width", "_count")

    def __init__(self, buckets: int = MAX_POINTS_DRAWN) -> None:
        self._buckets = buckets + buckets % 2  # even: pairs merge, and the runs stay aligned
        self._runs = array("d")
        self._open: list[float] | None = None
        self._width = 1  # points per run
        self._count = 0  # points added; the index orders a run's low and high

    def add(self, step: float, minutes: float, value: float) -> None:
        index = self._count
        self._count += 1
        run = self._open
        if run is None:
            if len(self._runs) == _RUN * self._buckets:  # full: merge only now, so all fit till then
                self._runs = _halved(self._runs)
                self._width *= 2
            run = self._open = [index, step, minutes, value, index, step, minutes, value]
        elif value < run[3]:
            run[0:4] = (index, step, minutes, value)
        elif value > run[7]:
            run[4:8] = (index, step, minutes, value)
        if self._count % self._width == 0:  # the run is full
            self._runs.extend(run)
            self._open = None

    def points(self, axis: str) -> Series:
        """The kept ``(x, value)`` points on ``axis`` (``"step"`` or ``"minutes"``), in the order added."""
        column = 1 if axis == "step" else 2
        numbers = self._runs.tolist() + (self._open or [])
        out: Series = []
        for r in range(0, len(numbers), _RUN):
            low, high = numbers[r : r + 4], numbers[r + 4 : r + 8]
            for point in [low] if low[0] == high[0] else sorted([low, high]):
                if not math.isnan(point[column]):
                    out.append((point[column], point[3]))
        return out

    def __len__(self) -> int:
        """At most the points kept: two a run."""
        return (len(self._runs) + (0 if self._open is None else _RUN)) // 4


#: Floats a closed run takes in ``Envelope._runs``.
_RUN = 8


def _halved(runs: array[float]) -> array[float]:
    """Each two neighbouring runs as one: the lower low and the higher high (the earlier on a tie)."""
    out = array("d")
    for r in range(0, len(runs), 2 * _RUN):
        first, second = runs[r : r + _RUN], runs[r + _RUN : r + 2 * _RUN]
        low = second[0:4] if second[3] < first[3] else first[0:4]
        high = second[4:8] if second[7] > first[7] else first[4:8]
        out.extend(low)
        out.extend(high)
    return out


class _Metric:
    """One metric: its points' envelope, and its moving averages' (``SMOOTHING``)."""

    __slots__ = ("raw", "_ema")

    def __init__(self) -> None:
        self.raw = Envelope()
        # weight -> [average so far, its bias correction, its envelope]
        self._ema: dict[float, list[Any]] = {w: [0.0, 0.0, Envelope()] for w in SMOOTHING if w > 0}

    def add(self, step: float, minutes: float, value: float) -> None:
        self.raw.add(step, minutes, value)
        for weight, state in self._ema.items():
            state[0] = state[0] * weight + (1 - weight) * value
            state[1] = state[1] * weight + (1 - weight)
            state[2].add(step, minutes, state[0] / state[1])

    def smoothed(self, axis: str, weight: float) -> Series | None:
        state = self._ema.get(weight)
        return None if state is None else state[2].points(axis)

    def stored_points(self) -> int:
        return len(self.raw) + sum(len(state[2]) for state in self._ema.values())


class MetricsLog:
    """What the runs page draws of one ``metrics.jsonl``, brought up to date by ``refresh``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines_parsed = 0  # work done over this log's life (tests read it)
        #: Held while refreshing and drawing: the page is built in a worker thread per request.
        self.lock = threading.Lock()
        self._reset(None)

    def _reset(self, identity: tuple[int, int] | None) -> None:
        self._identity = identity
        self._offset = 0
        self._seen: tuple[int, int] | None = None  # (size, mtime_ns) at the last refresh
        self.last: dict[str, Any] = {}  # the last record
        self.latest: dict[str, Any] = {}  # each key's value in the last record that had it
        self.numeric_keys: set[str] = set()
        self._t0: float | None = None
        self._metrics: dict[str, _Metric] = {}

    @classmethod
    def of(cls, records: Iterable[dict[str, Any]]) -> MetricsLog:
        """A log of records already in memory (no file)."""
        log = cls(Path("/nonexistent/metrics.jsonl"))
        for record in records:
            log._add(record)
        return log

    def refresh(self) -> MetricsLog:
        """Read what was appended since the last call; start over if the file was replaced or cut."""
        try:
            stat = os.stat(self.path)
        except OSError:  # no file (yet, or any more)
            self._reset(None)
            return self
        identity = (stat.st_dev, stat.st_ino)
        if identity != self._identity or stat.st_size < self._offset:
            self._reset(identity)
        if self._seen == (stat.st_size, stat.st_mtime_ns):
            return self
        self._seen = (stat.st_size, stat.st_mtime_ns)
        try:
            with open(self.path, "rb") as file:
                if self._offset and not _line_ends_at(file, self._offset):
                    self._reset(identity)  # rewritten in place (same file, other lines): read it again
                file.seek(self._offset)
                for line in _complete_lines(file):
                    self._offset += len(line)
                    self._add_line(line)
        except OSError:
            self._seen = None  # try again next time
        return self

    def _add_line(self, line: bytes) -> None:
        self.lines_parsed += 1
        try:
            record = json.loads(line.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):  # a line Python's json refuses
            return
        if isinstance(record, dict):
            self._add(record)

    def _add(self, record: dict[str, Any]) -> None:
        self.last = record
        self.latest.update(record)
        step, time = finite(record.get("step")), finite(record.get("time"))
        if self._t0 is None and time is not None:
            self._t0 = time
        minutes = None
        if self._t0 is not None and time is not None:
            minutes = finite((time - self._t0) / 60)  # two finite times can still be an infinite span apart
        for key, value in record.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.numeric_keys.add(key)
            y = finite(value)
            if y is None or (step is None and minutes is None):
                continue
            metric = self._metrics.get(key)
            if metric is None:
                metric = self._metrics[key] = _Metric()
            metric.add(math.nan if step is None else step, math.nan if minutes is None else minutes, y)

    def points(self, key: str, x: str = "step") -> Series:
        """``(x, value)`` points of one metric (thinned past ``MAX_POINTS_DRAWN``), finite numbers
        only. ``x``: ``"step"``, or ``"minutes"`` (wall clock since the first record's ``time``)."""
        metric = self._metrics.get(key)
        return [] if metric is None else metric.raw.points(x)

    def smoothed(self, key: str, x: str, weight: float) -> Series | None:
        """The metric's moving average with ``weight`` (``None``: not one of ``SMOOTHING``)."""
        metric = self._metrics.get(key)
        return [] if metric is None else metric.smoothed(x, weight)

    def stored_points(self) -> int:
        """Points held over every metric, axis and average: what bounds this log's memory."""
        return sum(metric.stored_points() for metric in self._metrics.values())


def _line_ends_at(file: Any, offset: int) -> bool:
    """Whether the byte before ``offset`` is still the newline this log read there."""
    file.seek(offset - 1)
    return file.read(1) == b"\n"


def _complete_lines(file: Any) -> Iterator[bytes]:
    """The newline-ended lines from the file's position on; an unended last line is left unread."""
    pending = b""
    while chunk := file.read(_CHUNK):
        pending += chunk
        lines = pending.split(b"\n")
        pending = lines.pop()
        for line in lines:
            yield line + b"\n"
