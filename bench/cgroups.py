"""Per-process CPU limits through Linux cgroups, for benchmarks that emulate equal machines.

``CpuLimiter.detect()`` looks for a writable cpu controller: cgroup v2 (``cpu.max`` in a
unified hierarchy whose ``cgroup.subtree_control`` has, or can be given, ``cpu``), else cgroup
v1 (``cpu.cfs_quota_us``). It creates one group per limited process under the bench's own
cgroup, named ``sdpaxos-bench-<bench pid>-<name>``, with a short CFS period (10 ms: a process
over its quota stalls for at most ~10 ms, well under the protocols' timeouts; longer only for
shares under 0.1 CPU, as a quota cannot be under 1 ms), and removes them
on ``close()``. When nothing usable is found (no controller, read-only, not root) it says why in
``reason`` and ``limit`` does nothing: the bench continues unlimited.

``SDPAXOS_BENCH_CGROUP=off`` in the environment turns limiting off (tests of that path).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = ["CpuLimiter"]

Kind = Literal["cgroup-v2", "cgroup-v1", "none"]

#: CFS period of the groups created (µs), unless the share needs a longer one
PERIOD_US = 10_000
#: the kernel's smallest CFS quota (µs)
MIN_QUOTA_US = 1_000


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _mounts(text: str) -> list[tuple[str, str, list[str]]]:
    """(mount point, fs type, options) of the cgroup file systems in a ``/proc/mounts`` text."""
    found = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            found.append((parts[1].replace("\\040", " "), parts[2], parts[3].split(",")))
    return found


def _own_paths(text: str) -> dict[str, str]:
    """controller -> our cgroup path, from a ``/proc/self/cgroup`` text ("" is the v2 one)."""
    paths = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            paths[""] = path
        for controller in controllers.split(","):
            paths[controller] = path
    return paths


@dataclass(slots=True)
class CpuLimiter:
    kind: Kind
    #: the directory new groups are created in (None when unavailable)
    base: Path | None
    #: why limiting is unavailable, or which mechanism is used
    reason: str
    prefix: str = field(default_factory=lambda: f"sdpaxos-bench-{os.getpid()}")
    created: list[Path] = field(default_factory=list)
    limits: dict[str, float] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        return self.kind != "none"

    # ------------------------------------------------------------------ detection
    @classmethod
    def detect(
        cls,
        *,
        mounts_text: str | None = None,
        cgroup_text: str | None = None,
        environ: dict[str, str] | None = None,
    ) -> CpuLimiter:
        env = os.environ if environ is None else environ
        if env.get("SDPAXOS_BENCH_CGROUP", "").lower() in ("off", "0", "no"):
            return cls("none", None, "disabled by SDPAXOS_BENCH_CGROUP=off")
        mounts = _mounts(_read(Path("/proc/self/mounts")) if mounts_text is None else mounts_text)
        own = _own_paths(_read(Path("/proc/self/cgroup")) if cgroup_text is None else cgroup_text)
        problems: list[str] = []
        for mount, fstype, _options in mounts:
            if fstype != "cgroup2":
                continue
            base = Path(mount) / own.get("", "/").lstrip("/")
            problem = cls._usable_v2(base)
            if problem is None:
                return cls("cgroup-v2", base, f"cgroup v2 cpu.max under {base}")
            problems.append(f"v2 at {base}: {problem}")
        for mount, fstype, options in mounts:
            if fstype != "cgroup" or "cpu" not in options:
                continue
            base = Path(mount) / own.get("cpu", "/").lstrip("/")
            problem = cls._usable_v1(base)
            if problem is None:
                return cls("cgroup-v1", base, f"cgroup v1 cpu.cfs_quota_us under {base}")
            problems.append(f"v1 at {base}: {problem}")
        if not problems:
            problems.append("no cgroup file system with a cpu controller is mounted")
        return cls("none", None, "; ".join(problems))

    @staticmethod
    def _probe(base: Path, control: str) -> str | None:
        """Create and remove a test group; None if that works and it has ``control``."""
        probe = base / f"sdpaxos-bench-probe-{os.getpid()}"
        try:
            probe.mkdir()
        except OSError as exc:
            return f"cannot create a group ({exc.strerror or exc})"
        try:
            if not (probe / control).exists():
                return f"a new group has no {control}"
            return None
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()

    @classmethod
    def _usable_v2(cls, base: Path) -> str | None:
        if "cpu" not in _read(base / "cgroup.controllers").split():
            return "the cpu controller is not available here"
        if "cpu" not in _read(base / "cgroup.subtree_control").split():
            try:
                (base / "cgroup.subtree_control").write_text("+cpu")
            except OSError as exc:
                return f"cannot enable cpu for child groups ({exc.strerror or exc})"
        return cls._probe(base, "cpu.max")

    @classmethod
    def _usable_v1(cls, base: Path) -> str | None:
        if not (base / "cpu.cfs_quota_us").exists():
            return "no cpu.cfs_quota_us (CFS bandwidth control not in this kernel?)"
        return cls._probe(base, "cpu.cfs_quota_us")

    # ------------------------------------------------------------------ use
    @staticmethod
    def quota_for(cpus: float) -> tuple[int, int]:
        """(quota, period) in µs for a share of ``cpus`` CPUs: a 10 ms period, or longer when
        the share is under 0.1 CPU (the kernel's smallest quota is 1 ms)."""
        period = max(PERIOD_US, math.ceil(MIN_QUOTA_US / cpus))
        return max(MIN_QUOTA_US, round(cpus * period)), period

    def limit(self, pid: int, cpus: float, name: str) -> bool:
        """Run process ``pid`` (all its threads) with at most ``cpus`` CPUs. False (and
        nothing done) when limiting is unavailable or ``cpus <= 0`` (unlimited)."""
        if self.base is None or cpus <= 0:
            return False
        group = self.base / f"{self.prefix}-{name}"
        quota, period = self.quota_for(cpus)
        try:
            group.mkdir(exist_ok=True)
            if group not in self.created:
                self.created.append(group)
            if self.kind == "cgroup-v2":
                (group / "cpu.max").write_text(f"{quota} {period}")
            else:
                (group / "cpu.cfs_quota_us").write_text("-1")  # a period below the quota fails
                (group / "cpu.cfs_period_us").write_text(str(period))
                (group / "cpu.cfs_quota_us").write_text(str(quota))
            (group / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            self.reason += f"; limiting {name} failed: {exc.strerror or exc}"
            return False
        self.limits[name] = round(quota / period, 4)
        return True

    def close(self) -> None:
        """Remove every group created (their processes must have exited; a survivor is moved
        back to the bench's own group first)."""
        assert self.base is not None or not self.created
        for group in self.created:
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    self._evict(group)
                    time.sleep(0.02)
        self.created.clear()

    def _evict(self, group: Path) -> None:
        assert self.base is not None
        for pid in _read(group / "cgroup.procs").split():
            with contextlib.suppress(OSError):
                (self.base / "cgroup.procs").write_text(pid)
