"""What ``sdpaxos bench soak`` samples, and how it judges the samples against the targets.

Sampling (``sample_replica``): a replica process's resident memory and open files from
``/proc/PID``, its data directory's write-ahead log and snapshot bytes, and from its metrics
endpoint the longest loop stall since it started (``sdpaxos_loop_stall_longest_seconds``) and
the buckets of every stall measured (``sdpaxos_loop_stall_seconds``: between two samples of one
process, how long its loop stalled at most in that interval, ``interval_stall``), its
executed slot and, where the build exposes it, the size of the replicated session table
(``sdpaxos_sessions``, summed over its states).

Judging (``Windows``, ``growth``, ``latency_ratio``): a run of ``D`` seconds is compared as
issue 38 states its targets for an hour, scaled: the *window* is ``D / 6`` (10 minutes of 60).

* **Growth** of a series (resident memory, open files, disk) from the end of the warm-up to
  the end: the median of its values over the second half of the first window (minutes 5-10 of
  an hour) against the median over the last half window (minutes 55-60). Medians, so that one
  sample taken while a replica was restarting or a learner catching up does not decide it.
  A cluster's value at a sample is that of its largest replica (the one that runs out first).
  Target: at most +10 %.
* **Latency**: the p99 of the scheduler operations that completed in the last window against
  the p99 of those in the first. Target: at most 1.5x.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "GROWTH_TARGET",
    "LATENCY_TARGET",
    "ReplicaSample",
    "Samples",
    "Windows",
    "cluster_series",
    "directory_bytes",
    "growth",
    "interval_stall",
    "interval_stalls",
    "latency_ratio",
    "percentile",
    "process_fds",
    "process_rss",
    "sample_replica",
    "scrape",
    "stalls",
    "targets",
    "warm_and_end",
]

#: RSS and open files may grow at most this much from the end of the warm-up to the end
GROWTH_TARGET = 0.10
#: the last window's p99 may be at most this many times the first window's
LATENCY_TARGET = 1.5
#: the window is this part of the run (10 minutes of an hour)
WINDOW_PART = 6
#: seconds to wait for a metrics endpoint
SCRAPE_TIMEOUT_S = 3.0
#: the metric families a sample keeps
_METRICS = frozenset({"sdpaxos_loop_stall_longest_seconds", "sdpaxos_executed_slots",
                      "sdpaxos_sessions", "sdpaxos_loop_stall_seconds"})
#: the histogram among them (its buckets are kept, by ``le``)
_STALL_HISTOGRAM = "sdpaxos_loop_stall_seconds"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaSample:
    """One replica process at one moment (None: could not be read, e.g. it just died)."""

    cluster: str
    replica: int
    pid: int
    rss_bytes: int | None
    open_files: int | None
    wal_bytes: int
    snapshot_bytes: int
    loop_stall_s: float | None
    executed: int | None
    #: the replicated session table's size (None: this build does not expose it), and by
    #: state (open, closed, pinned, tombstones: ``sdpaxos_sessions{state}``)
    sessions: int | None
    sessions_by_state: dict[str, int] | None = None
    #: the loop-stall histogram's cumulative bucket counts by ``le`` (None: not exposed)
    loop_stall_buckets: dict[str, float] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def process_rss(pid: int) -> int | None:
    """Resident memory in bytes (``VmRSS``), None if the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_fds(pid: int) -> int | None:
    """Open file descriptors (sockets included), None if the process is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def directory_bytes(directory: Path, pattern: str) -> int:
    """The bytes of the files matching ``pattern`` in ``directory`` and below (0 if there
    are none; a file removed while counted counts nothing)."""
    total = 0
    for path in directory.rglob(pattern) if directory.is_dir() else ():
        try:
            total += path.stat().st_size
        except OSError:
            continue
    return total


def scrape(address: tuple[str, int]) -> dict[str, dict[str, float]]:
    """The sampled metrics of the replica whose metrics endpoint is ``address``: per family,
    its value per label values (``""`` for an unlabelled one); empty if the endpoint does
    not answer."""
    url = f"http://{address[0]}:{address[1]}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as answer:
            text = answer.read().decode()
    except (OSError, urllib.error.URLError, ValueError):
        return {}
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name == _STALL_HISTOGRAM:
            found[family.name] = {sample.labels["le"]: sample.value for sample in family.samples
                                  if sample.name.endswith("_bucket")}
        elif family.name in _METRICS:
            found[family.name] = {",".join(sample.labels.values()): sample.value
                                  for sample in family.samples}
    return found


def sample_replica(cluster: str, replica: int, pid: int, data_dir: Path,
                   metrics_address: tuple[str, int] | None) -> ReplicaSample:
    """Everything sampled of one replica process (blocking: /proc, the disk, one scrape)."""
    metrics = scrape(metrics_address) if metrics_address is not None else {}

    def metric(name: str) -> float | None:
        values = metrics.get(name)
        return None if values is None else sum(values.values())

    executed, sessions = metric("sdpaxos_executed_slots"), metric("sdpaxos_sessions")
    by_state, buckets = metrics.get("sdpaxos_sessions"), metrics.get(_STALL_HISTOGRAM)
    return ReplicaSample(
        cluster=cluster, replica=replica, pid=pid, rss_bytes=process_rss(pid),
        open_files=process_fds(pid), wal_bytes=directory_bytes(data_dir, "wal-*.log"),
        snapshot_bytes=directory_bytes(data_dir, "snapshot-*.bin"),
        loop_stall_s=metric("sdpaxos_loop_stall_longest_seconds"),
        executed=None if executed is None else int(executed),
        sessions=None if sessions is None else int(sessions),
        sessions_by_state=None if by_state is None else {k: int(v) for k, v in by_state.items()},
        loop_stall_buckets=buckets,
    )


def interval_stall(before: dict[str, float], after: dict[str, float]) -> float | None:
    """How long a loop stalled at most between two scrapes of one process's stall histogram
    (cumulative counts by ``le``): the lowest bound under which every stall measured in
    between fell (``inf``: one beyond the last bound); None if none was measured."""
    added = after.get("+Inf", 0.0) - before.get("+Inf", 0.0)
    if added <= 0:
        return None
    for le in sorted((le for le in after if le != "+Inf"), key=float):
        if after[le] - before.get(le, 0.0) >= added:
            return float(le)
    return float("inf")


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The ``fraction`` quantile (nearest rank below), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[int(fraction * (len(ordered) - 1))]


@dataclasses.dataclass(frozen=True, slots=True)
class Windows:
    """The first and last windows of a run of ``duration_s`` seconds (times from its start)."""

    duration_s: float

    @property
    def window_s(self) -> float:
        return self.duration_s / WINDOW_PART

    def first(self, t: float) -> bool:
        return 0.0 <= t <= self.window_s

    def last(self, t: float) -> bool:
        return self.duration_s - self.window_s <= t <= self.duration_s

    def warm(self, t: float) -> bool:
        """The end of the warm-up: the first window's second half."""
        return self.window_s / 2 <= t <= self.window_s

    def end(self, t: float) -> bool:
        """The end of the run: its last half window."""
        return self.duration_s - self.window_s / 2 <= t <= self.duration_s


def warm_and_end(series: Iterable[tuple[float, float]], windows: Windows
                 ) -> tuple[float, float] | None:
    """A series of (time, value) at the end of the warm-up and at the end (medians: see the
    module); None if either part has no sample."""
    points = list(series)
    warm = [v for t, v in points if windows.warm(t)]
    end = [v for t, v in points if windows.end(t)]
    return (statistics.median(warm), statistics.median(end)) if warm and end else None


def growth(series: Iterable[tuple[float, float]], windows: Windows) -> float | None:
    """How much a series of (time, value) grew from the end of the warm-up to the end, as a
    fraction (0.1: +10 %); None if either part has no sample or the warm value is 0."""
    ends = warm_and_end(series, windows)
    if ends is None or ends[0] <= 0:
        return None
    return ends[1] / ends[0] - 1


def latency_ratio(latencies: Iterable[tuple[float, float]], windows: Windows) -> float | None:
    """The p99 of the (completion time, latency) pairs in the last window over the p99 of
    those in the first; None if either window has none."""
    pairs = list(latencies)
    first = percentile([v for t, v in pairs if windows.first(t)], 0.99)
    last = percentile([v for t, v in pairs if windows.last(t)], 0.99)
    if first is None or last is None or first <= 0:
        return None
    return last / first


#: a run's samples: {"t": seconds, "replicas": [ReplicaSample.to_json(), ...]} each
Samples = Sequence[dict[str, Any]]


def cluster_series(samples: Samples, cluster: str, field: str) -> list[tuple[float, float]]:
    """(time, the largest member's value) per sample; ``disk``: WAL + snapshot bytes."""
    series = []
    for sample in samples:
        values = [
            (s["wal_bytes"] + s["snapshot_bytes"]) if field == "disk" else s[field]
            for s in sample["replicas"] if s["cluster"] == cluster
        ]
        present = [v for v in values if v is not None]
        if present:
            series.append((sample["t"], float(max(present))))
    return series


def stalls(samples: Samples, cluster: str) -> tuple[float | None, float | None]:
    """The longest loop stall a member of ``cluster`` reported (the metric is the longest
    since the process started, so its start-up's and a restart's replay count), and the
    longest that began after a process's first sample: a value above that first sample's.
    (A later stall shorter than the start-up's cannot be told from the running maximum.)"""
    longest: float | None = None
    after: float | None = None
    first: dict[int, float] = {}
    for sample in samples:
        for s in sample["replicas"]:
            value = s["loop_stall_s"]
            if s["cluster"] != cluster or value is None:
                continue
            longest = value if longest is None else max(longest, value)
            start = first.setdefault(s["pid"], value)
            if value > start:
                after = value if after is None else max(after, value)
            elif after is None:
                after = 0.0
    return longest, after


def stalls_between_samples(
    samples: Samples,
) -> Iterator[tuple[dict[str, Any], dict[str, Any], float | None]]:
    """``(sample, replica's sample, interval_stall)`` for every replica process's sample that
    has a stall histogram: the longest stall since that process's previous sample (None for
    its first, whose stalls are a start-up's)."""
    previous: dict[int, dict[str, float]] = {}
    for sample in samples:
        for s in sample["replicas"]:
            buckets = s.get("loop_stall_buckets")
            if buckets is None:
                continue
            before = previous.get(s["pid"])
            previous[s["pid"]] = buckets
            yield sample, s, None if before is None else interval_stall(before, buckets)


def interval_stalls(samples: Samples, cluster: str) -> float | None:
    """The longest loop stall of a member of ``cluster`` between two consecutive samples of
    one process (``interval_stall``): a start-up's stalls, before a process's first sample,
    never count, and a later stall shorter than them does. None: no histogram exposed."""
    stalls = [stall for _, s, stall in stalls_between_samples(samples)
              if s["cluster"] == cluster and stall is not None]
    return max(stalls, default=None)


def _target(name: str, value: float | None, bound: float | None, unit: str,
            ends: tuple[float, float] | None = None) -> dict[str, Any]:
    """A target's row; ``ends``: a growth's values at the end of the warm-up and the end."""
    met = None if value is None or bound is None else value <= bound
    return {"name": name, "value": None if value is None else round(value, 4),
            "bound": bound, "unit": unit, "met": met,
            "from_to": None if ends is None else [round(v, 1) for v in ends]}


def _growth_target(samples: Samples, windows: Windows, cluster: str, field: str,
                   label: str, bound: float | None) -> dict[str, Any]:
    series = cluster_series(samples, cluster, field)
    return _target(f"{cluster}: {label} growth", growth(series, windows), bound, "fraction",
                   warm_and_end(series, windows))


def targets(samples: Samples, latencies: Iterable[tuple[float, float]],
            windows: Windows, clusters: Sequence[str]) -> list[dict[str, Any]]:
    """The targets' rows (``met`` None: reported, no bound) for ``clusters`` and the
    scheduler operations' (completion time, latency) pairs."""
    rows = []
    for cluster in clusters:
        rows.append(_growth_target(samples, windows, cluster, "rss_bytes",
                                   "resident memory (bytes)", GROWTH_TARGET))
        rows.append(_growth_target(samples, windows, cluster, "open_files", "open files",
                                   GROWTH_TARGET))
        rows.append(_growth_target(samples, windows, cluster, "disk",
                                   "disk (WAL segments + snapshots, bytes)", None))
        longest, after = stalls(samples, cluster)
        rows.append(_target(f"{cluster}: longest loop stall (start-ups included)", longest,
                            None, "seconds"))
        rows.append(_target(f"{cluster}: longest loop stall after start-up", after, None,
                            "seconds"))
        rows.append(_target(f"{cluster}: longest loop stall between two samples after "
                            "start-up (at most)", interval_stalls(samples, cluster), None,
                            "seconds"))
    rows.append(_target("scheduler p99, last window / first",
                        latency_ratio(latencies, windows), LATENCY_TARGET, "ratio"))
    return rows
