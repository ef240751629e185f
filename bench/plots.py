"""Figures of the process benchmarks (matplotlib, Agg backend: no display needed).

Shaped like the paper's: throughput bars per protocol and configuration (Figs. 9 and 11),
throughput against the share of commands on a hot key, one line per protocol (Fig. 10),
latency per site per protocol with the theoretical bounds (Figs. 8 and 12), read latency per
workload, and a per-site throughput timeline around a failure, one panel per protocol and
kill (Fig. 14).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "contention_figure",
    "failover_figure",
    "latency_figure",
    "reads_figure",
    "throughput_figure",
]

COLORS = {"sdpaxos": "#1f77b4", "multipaxos": "#d62728", "mencius": "#2ca02c",
          "epaxos": "#9467bd"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(
    ax: Any,
    groups: list[str],
    series: dict[str, list[float | None]],
    errors: dict[str, list[tuple[float, float]]] | None = None,
) -> list[float]:
    """Grouped bars; returns the x position of each bar group's centre."""
    width = 0.8 / max(1, len(series))
    centres = list(range(len(groups)))
    for k, (name, values) in enumerate(series.items()):
        xs = [c - 0.4 + width * (k + 0.5) for c in centres]
        heights = [v if v is not None else 0.0 for v in values]
        err = None
        if errors and name in errors:
            err = [
                [max(0.0, h - lo) for h, (lo, _) in zip(heights, errors[name], strict=True)],
                [max(0.0, hi - h) for h, (_, hi) in zip(heights, errors[name], strict=True)],
            ]
        ax.bar(xs, heights, width, label=name, color=COLORS.get(name), yerr=err, capsize=3)
    ax.set_xticks(centres)
    ax.set_xticklabels(groups)
    return [float(c) for c in centres]


def throughput_figure(report: dict[str, Any], path: str) -> None:
    if any(r.get("contention_pct") is not None for r in report["results"]):
        contention_figure(report, path)
        return
    plt = _pyplot()
    results = report["results"]
    groups: list[str] = []
    for r in results:
        label = _throughput_group(r)
        if label not in groups:
            groups.append(label)
    protocols = list(dict.fromkeys(r["protocol"] for r in results))
    series: dict[str, list[float | None]] = {p: [None] * len(groups) for p in protocols}
    errors: dict[str, list[tuple[float, float]]] = {p: [(0, 0)] * len(groups) for p in protocols}
    for r in results:
        g = groups.index(_throughput_group(r))
        series[r["protocol"]][g] = r["throughput_per_s"]
        errors[r["protocol"]][g] = (r["throughput_min"], r["throughput_max"])
    fig, ax = plt.subplots(figsize=(max(5, 2.2 * len(groups)), 4))
    _bars(ax, groups, series, errors)
    limit = report["cpu_limit"]["per_replica_cpus"]
    title = f"Throughput ({limit} CPU per replica)" if limit else "Throughput (no CPU limit)"
    ax.set_title(title)
    ax.set_ylabel("requests / s (median, min-max over rounds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def contention_figure(report: dict[str, Any], path: str) -> None:
    """Fig. 10's shape: throughput (median, min-max bars) against the percent of commands on
    the hot key, a line per protocol, a panel per replica count (and straggler setting)."""
    plt = _pyplot()
    results = [r for r in report["results"] if r.get("contention_pct") is not None]
    panels = list(dict.fromkeys(_contention_panel(r) for r in results))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        rows = [r for r in results if _contention_panel(r) == panel]
        for protocol in dict.fromkeys(r["protocol"] for r in rows):
            points = sorted((r["contention_pct"], r) for r in rows if r["protocol"] == protocol)
            xs = [x for x, _ in points]
            ys = [r["throughput_per_s"] for _, r in points]
            err = [[y - r["throughput_min"] for y, (_, r) in zip(ys, points, strict=True)],
                   [r["throughput_max"] - y for y, (_, r) in zip(ys, points, strict=True)]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=protocol,
                        color=COLORS.get(protocol))
        ax.set_title(panel)
        ax.set_xlabel("commands on the hot key (%)")
        ax.set_ylabel("requests / s (median, min-max over rounds)")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _contention_panel(r: dict[str, Any]) -> str:
    label = f"N={r['replicas']}, {r['size']} B"
    straggler = r["straggler"]
    if straggler:
        label += f", straggler {straggler['site']} @ {straggler['cpus']:.2f}"
    return label


def _throughput_group(r: dict[str, Any]) -> str:
    label = f"N={r['replicas']}\n{r['size']} B\n{r['reads_pct']:g}% reads"
    straggler = r["straggler"]
    if straggler:
        label += f"\nstraggler {straggler['site']} @ {straggler['cpus']:.2f}"
    return label


def latency_figure(report: dict[str, Any], path: str) -> None:
    plt = _pyplot()
    replica_counts = list(dict.fromkeys(r["replicas"] for r in report["rows"]))
    rates = list(dict.fromkeys(r["rate"] for r in report["rows"]))
    fig, axes = plt.subplots(
        len(replica_counts), len(rates), figsize=(6 * len(rates), 4.2 * len(replica_counts)),
        squeeze=False,
    )  # fmt: skip
    panels = [(axes[i][j], n, rate) for i, n in enumerate(replica_counts)
              for j, rate in enumerate(rates)]  # fmt: skip
    for ax, replicas, rate in panels:
        rows = [r for r in report["rows"] if r["replicas"] == replicas and r["rate"] == rate]
        sites = list(dict.fromkeys(r["site"] for r in rows))
        protocols = list(dict.fromkeys(r["protocol"] for r in rows))
        series: dict[str, list[float | None]] = {}
        for protocol in protocols:
            by_site = {r["site"]: r for r in rows if r["protocol"] == protocol}
            series[protocol] = [by_site[s]["ready"]["p50_ms"] for s in sites]
        _bars(ax, sites, series)
        width = 0.8 / max(1, len(protocols))
        for k, protocol in enumerate(protocols):
            by_site = {r["site"]: r for r in rows if r["protocol"] == protocol}
            for c, site in enumerate(sites):
                x = c - 0.4 + width * (k + 0.5)
                ax.hlines(
                    by_site[site]["bound_ms"],
                    x - width / 2,
                    x + width / 2,
                    colors="black",
                    linewidth=2,
                )
        ax.set_title(f"{replicas} replicas, {rate:g} req/s per site")
        ax.set_ylabel("p50 ready latency (ms); black: bound")
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def reads_figure(report: dict[str, Any], path: str) -> None:
    plt = _pyplot()
    rows = report["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    labels = list(dict.fromkeys(f"{r['protocol']}\n{r['workload']}" for r in rows))
    by_label = {f"{r['protocol']}\n{r['workload']}": r for r in rows if r.get("site") is None}
    if by_label:
        _bars(left, labels, {
            "reads": [by_label[x]["read_throughput_per_s"] for x in labels],
            "writes": [by_label[x]["write_throughput_per_s"] for x in labels],
        })  # fmt: skip
        left.set_ylabel("requests / s")
        left.set_title("Throughput by workload")
        left.legend()
        _bars(right, labels, {
            "read p50": [by_label[x]["read_latency_ms"]["p50_ms"] for x in labels],
            "read p99": [by_label[x]["read_latency_ms"]["p99_ms"] for x in labels],
        })  # fmt: skip
        right.set_ylabel("ms")
        right.set_title("Linearizable read latency")
        right.legend()
    else:  # per-site rows (--wan)
        sites = list(dict.fromkeys(r["site"] for r in rows))
        workloads = list(dict.fromkeys(f"{r['protocol']} {r['workload']}" for r in rows))
        series: dict[str, list[float | None]] = {}
        for w in workloads:
            per = {r["site"]: r for r in rows if f"{r['protocol']} {r['workload']}" == w}
            series[w] = [per[s]["read_latency_ms"]["mean_ms"] for s in sites]
        _bars(left, sites, series)
        left.set_ylabel("mean read latency (ms)")
        left.set_title("Read latency per site")
        left.legend(fontsize=7)
        right.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def failover_figure(report: dict[str, Any], path: str) -> None:
    plt = _pyplot()
    runs = report["runs"]
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 3.2 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        bin_s = run["bin_s"]
        for site in run["sites"]:
            xs = [(i * bin_s) - run["kill_at_s"] for i in range(len(site["timeline"]))]
            ys = [count / bin_s for count in site["timeline"]]
            ax.plot(xs, ys, label=site["site"], drawstyle="steps-post")
        ax.axvline(0, color="black", linestyle="--", linewidth=1)
        protocol = run.get("protocol", "sdpaxos")
        ax.set_title(protocol)
        ax.text(0, ax.get_ylim()[1] * 0.9, f" {run['killed_site']} killed", fontsize=8)
        ax.set_xlabel(f"seconds from the kill ({int(bin_s * 1000)} ms bins)")
        ax.set_ylabel("completed requests / s")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
