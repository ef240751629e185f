"""``sdpaxos bench soak``'s report: its tables on the terminal (rich) and its figure
(matplotlib, PNG) of the samples over time, the operator's actions marked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bench.harness import print_table
from bench.soak_samples import stalls_between_samples

__all__ = ["print_report", "soak_figure"]

#: colour of each kind of operator action's mark in the figure
ACTION_COLORS = {"kill": "#d62728", "replace": "#9467bd", "backup": "#2ca02c",
                 "config": "#ff7f0e"}
MB = 1 << 20


def print_report(report: dict[str, Any]) -> None:
    load = report["schedulers"]
    one_shot = report["one_shot"]
    kv = report["kv"]["operations"]
    print_table(
        f"soak: {report['load_s']:g} s of load, {len(report['actions'])} operator actions, "
        f"{len(report['samples'])} samples (cpus {report['machine']['cpus']}, load average "
        f"at start {report['machine']['loadavg_at_start']})",
        ["check", "ok", "detail"],
        [[c["name"], "yes" if c["ok"] else "NO", c["detail"]] for c in report["checks"]])
    print_table(
        "targets (issue 38, scaled to the run: window = a sixth of it)",
        ["target", "warm -> end", "value", "bound", "met"],
        [[t["name"], _ends(t), _value(t), "-" if t["bound"] is None else _bound(t),
          "-" if t["met"] is None else "yes" if t["met"] else "NO"] for t in report["targets"]])
    sessions = report["sessions_at_end"]
    print_table(
        "the load",
        ["what", "count"],
        [["gangs submitted / placed / waiting", f"{load['submitted']} / {load['placed']} / "
          f"{load['waiting']}"],
         ["releases (acknowledged)", load["released"]],
         ["submits indefinite / refused", f"{load['indefinite']} / {load['refused']}"],
         ["scheduler sessions renewed", load["sessions_renewed"]],
         ["scheduler p99 (whole run, ms)", load["p99_ms"]],
         [f"one-shot writes ({one_shot['mode']}): put / ctl submit / ctl release",
          f"{one_shot['put']} / {one_shot['ctl_submit']} / {one_shot['ctl_release']}"],
         ["one-shot ok / fail / info", f"{one_shot['ok']} / {one_shot['fail']} / "
          f"{one_shot['info']}"],
         ["one-shot p50 (ms)", one_shot["p50_ms"]],
         *[[f"kv {f}: ok / fail / info", f"{row['ok']} / {row['fail']} / {row['info']}"]
           for f, row in sorted(kv.items())],
         *[[f"session table at the end: {name}",
            "-" if s["sessions"] is None else f"{s['sessions']} ({s['by_state']})"]
           for name, s in sessions.items()]])
    print_table(
        "operator actions",
        ["at (s)", "action", "cluster", "took (s)", "outcome"],
        [[a["start_s"], a["kind"], a["cluster"], round(a["end_s"] - a["start_s"], 1),
          "ok" if a["ok"] else "FAILED: " + a["error"][:120]] for a in report["actions"]])


def _ends(target: dict[str, Any]) -> str:
    """A growth's values at the end of the warm-up and at the end (bytes in MiB)."""
    ends = target.get("from_to")
    if not ends:
        return "-"
    if "bytes" in target["name"]:
        digits = 1 if max(ends) >= 10 * MB else 2
        return f"{ends[0] / MB:.{digits}f} -> {ends[1] / MB:.{digits}f} MiB"
    return f"{ends[0]:g} -> {ends[1]:g}"


def _value(target: dict[str, Any]) -> str:
    value = target["value"]
    if value is None:
        return "-"
    if target["unit"] == "fraction":
        return f"{100 * value:+.1f} %"
    if target["unit"] == "seconds":
        return f"{1000 * value:.0f} ms"
    return f"{value:.2f}x"


def _bound(target: dict[str, Any]) -> str:
    bound = target["bound"]
    return f"<= {100 * bound:+.0f} %" if target["unit"] == "fraction" else f"<= {bound:g}x"


def _series(report: dict[str, Any], field: str, scale: float = 1.0
            ) -> dict[str, tuple[list[float], list[float]]]:
    """Per replica process (cluster, replica, pid): its samples of ``field`` over time
    (``disk``: WAL and snapshot bytes; ``interval_stall``: the longest loop stall since the
    process's previous sample, at most, from its stall histogram)."""
    lines: dict[str, tuple[list[float], list[float]]] = {}

    def values() -> Iterator[tuple[dict[str, Any], dict[str, Any], float | None]]:
        if field == "interval_stall":
            for sample, s, stall in stalls_between_samples(report["samples"]):
                if stall == float("inf"):  # past the last bucket: drawn at its bound
                    stall = max(float(le) for le in s["loop_stall_buckets"] if le != "+Inf")
                yield sample, s, stall
            return
        for sample in report["samples"]:
            for s in sample["replicas"]:
                yield sample, s, (s["wal_bytes"] + s["snapshot_bytes"] if field == "disk"
                                  else s[field])

    for sample, s, value in values():
        if value is None:
            continue
        label = f"{s['cluster']} r{s['replica']}"
        xs, ys = lines.setdefault(label, ([], []))
        xs.append(sample["t"] / 60)
        ys.append(value / scale)
    return lines


def soak_figure(report: dict[str, Any], path: str) -> None:
    from bench.plots import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(3, 2, figsize=(13, 11), sharex=True)
    panels = [
        (axes[0][0], "rss_bytes", MB, "resident memory (MiB)"),
        (axes[0][1], "open_files", 1.0, "open files"),
        (axes[1][0], "disk", MB, "WAL + snapshots (MiB)"),
        (axes[1][1], "interval_stall", 1e-3,
         "longest loop stall since the previous sample, at most (ms)")
        if _series(report, "interval_stall") else  # (a build without the stall histogram)
        (axes[1][1], "loop_stall_s", 1e-3, "longest loop stall since start (ms)"),
    ]
    for ax, field, scale, title in panels:
        for label, (xs, ys) in sorted(_series(report, field, scale).items()):
            style = "-" if label.startswith("gpu") else "--"
            ax.plot(xs, ys, style, linewidth=1, label=label)
        ax.set_title(title)
        ax.set_ylim(bottom=0)
    axes[0][0].legend(fontsize=7, ncol=2)
    ax = axes[2][0]
    timeline = report["latency_timeline"]
    for key, style in (("p50_ms", "-"), ("p99_ms", "-")):
        points = [(row["t"] / 60, row[key]) for row in timeline if row[key] is not None]
        ax.plot([x for x, _ in points], [y for _, y in points], style, label=key[:3])
    ax.set_title("scheduler operations (submit, release): latency per sample interval (ms)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax = axes[2][1]
    drawn = False
    for label, (xs, ys) in sorted(_series(report, "sessions").items()):
        ax.plot(xs, ys, "-" if label.startswith("gpu") else "--", linewidth=1, label=label)
        drawn = True
    ax.set_title("session table entries (sdpaxos_sessions)")
    if drawn:
        ax.legend(fontsize=7, ncol=2)
    else:
        ax.text(0.5, 0.5, "not exposed by this build", ha="center", va="center",
                transform=ax.transAxes)
    for row in axes:
        for ax in row:
            for action in report["actions"]:
                ax.axvline(action["start_s"] / 60, color=ACTION_COLORS[action["kind"]],
                           alpha=0.35, linewidth=0.8)
    for ax in axes[2]:
        ax.set_xlabel("minutes (vertical lines: kill red, replace purple, backup green, "
                      "config orange)", fontsize=8)
    failed = sum(1 for c in report["checks"] if not c["ok"])
    fig.suptitle(f"sdpaxos bench soak: {report['load_s'] / 60:.1f} min, "
                 f"{'all checks passed' if not failed else f'{failed} checks FAILED'}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
