"""``fusetile report``: what a run did, as plots and a page.

* ``timeline-<workload>.png``: one plan run's kernel calls (from the trace FIFO) over
  cycles, a row per unit, each call's bar split into the cycles its DMA engine and compute units
  were busy;
* ``roofline.png``: every workload and policy against the tile's roofline (peak MACs
  per cycle = R x C; GMEM bandwidth = one word per cycle), at the operational intensity
  it achieved (MACs per GMEM byte), from the counters;
* ``report.html``: the results table, the fusion decision log and the two plots.
"""

import html
from pathlib import Path


__all__ = ["timeline_plot", "roofline_plot", "write_report"]


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")                       # files only, no display
    import matplotlib.pyplot as plt
    return plt


def timeline_plot(trace, path, *, title="One inference"):
    """``trace``: records ``{unit, start, cycles, dma_busy, mac_busy, vec_busy}`` of one
    plan run (``Profiler.last_trace``)."""
    plt = _pyplot()
    units = list(dict.fromkeys(r["unit"] or "?" for r in trace))
    t0 = min((r["start"] for r in trace), default=0)
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(units) + 1.5))
    for r in trace:
        y = units.index(r["unit"] or "?")
        x = r["start"] - t0
        ax.broken_barh([(x, r["cycles"])], (y - 0.4, 0.8), facecolor="#dddddd",
                       edgecolor="#888888")
        ax.broken_barh([(x, r["dma_busy"])], (y - 0.4, 0.25), facecolor="#4c72b0")
        ax.broken_barh([(x, max(r["mac_busy"], r["vec_busy"]))], (y + 0.15, 0.25),
                       facecolor="#dd8452")
    ax.set_yticks(range(len(units)), units)
    ax.invert_yaxis()
    ax.set_xlabel("cycles (tile's CYCLES counter)")
    ax.set_title(f"{title}: kernel calls (grey), DMA busy (blue), MAC/vector busy (orange)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def roofline_plot(results, config, path):
    """``results``: rows of ``fusetile bench`` (workloads suite)."""
    plt = _pyplot()
    peak = config.rows * config.cols                # MACs per cycle
    bandwidth = config.word_bytes                   # GMEM bytes per cycle (one word)
    rows = [r for r in results if r["gmem_bytes_per_inference"] and
            r.get("stream", "shuffled") == "shuffled"]
    lo = min([0.5] + [r["macs_per_inference"] / r["gmem_bytes_per_inference"] for r in rows])
    hi = max([4 * peak / bandwidth] + [r["macs_per_inference"] /
                                       r["gmem_bytes_per_inference"] for r in rows])
    fig, ax = plt.subplots(figsize=(8, 5.5))
    xs = [lo / 2 * (hi * 4 / lo) ** (i / 100) for i in range(101)]
    ax.plot(xs, [min(peak, bandwidth * x) for x in xs], color="black",
            label=f"roofline: {peak} MACs/cycle, {bandwidth} bytes/cycle")
    markers = {"none": "o", "static": "s", "adaptive": "^"}
    colours = {}
    for r in rows:
        colour = colours.setdefault(r["workload"], f"C{len(colours)}")
        intensity = r["macs_per_inference"] / r["gmem_bytes_per_inference"]
        ax.scatter(intensity, r["macs_per_inference"] / r["cycles_per_inference"],
                   marker=markers.get(r["policy"], "x"), color=colour,
                   label=f"{r['workload']} {r['policy']}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("operational intensity (MACs per GMEM byte)")
    ax.set_ylabel("performance (MACs per cycle)")
    ax.set_title("Roofline (from the tile's counters)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


_COLUMNS = ("workload", "policy", "stream", "cycles_per_inference", "roofline_cycles",
            "gmem_bytes_per_inference", "mac_utilization", "fusions", "defusions",
            "resident_constants", "swap_idle_cycles", "output_mismatches")


def _cell(value):
    if isinstance(value, float):
        return f"{value:.1%}" if value < 1 else f"{value:,.0f}"
    return html.escape(str(value))


def _paths(counts):
    return ", ".join(f"{p}: {n}" for p, n in counts.items())


def _speculation_html(r):
    """A data-dependent workload's speculation: totals and windows of 100 inferences."""
    s = r["speculation"]
    rows = []
    for w in s.get("windows", []):
        hit = "" if w["hit_rate"] is None else f"{w['hit_rate']:.0%}"
        rows.append(f"<tr><td>{w['first']}..{w['first'] + w['inferences'] - 1}</td>"
                    f"<td>{w['cycles_per_inference']:,.0f}</td><td>{w['speculated']}</td>"
                    f"<td>{hit}</td><td>{_paths(w['guesses'])}</td>"
                    f"<td>{_paths(w['paths'])}</td>"
                    f"<td>{' / '.join(f'{t:.2f}' for t in w['thresholds'])}</td>"
                    f"<td>{w['predictor_accuracy']:.0%}</td></tr>")
    return (f"<h3>{html.escape(r['workload'])}, {html.escape(r.get('stream', ''))} stream</h3>"
            f"<p>{s['hits']} hits, {s['misses']} misses (rolled back in "
            f"{s['rollback_cycles']:.1f} cycles each), predictor right "
            f"{s['predictor_accuracy']:.0%} of the time</p>"
            "<table><tr><th>inferences</th><th>cycles / inference</th><th>guesses</th>"
            "<th>hit rate</th><th>guessed paths</th><th>paths taken</th>"
            "<th>thresholds per path</th><th>predictor right</th></tr>"
            f"{''.join(rows)}</table>")


def write_report(out_dir, results, config, *, target="?"):
    """Write the plots and ``report.html`` into ``out_dir`` from ``results`` (rows of the
    workloads suite; an adaptive row's ``trace`` is its last run's); return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"roofline": out / "roofline.png", "html": out / "report.html"}
    timelines = []
    for r in results:
        if r.get("trace") and r.get("stream", "shuffled") == "shuffled":
            path = out / f"timeline-{r['workload']}.png"
            timeline_plot(r["trace"], path, title=f"{r['workload']}, one run of the "
                          f"{r['policy']} plan")
            paths[f"timeline-{r['workload']}"] = path
            timelines.append(path.name)
    roofline_plot(results, config, paths["roofline"])
    rows = "\n".join("<tr>" + "".join(f"<td>{_cell(r.get(c, ''))}</td>" for c in _COLUMNS)
                     + "</tr>" for r in results)
    log = "\n".join(
        f"<li>{html.escape(r['workload'])}, run {e['run']}: <b>{e['action']}</b> "
        f"{html.escape(e['units'])}" + (f" ({html.escape(e['reason'])})" if "reason" in e
                                        else f" (score {e.get('score', '')}, threshold "
                                             f"{e.get('threshold', '')})") + "</li>"
        for r in results for e in r.get("fusion_log", []))
    speculation = "\n".join(_speculation_html(r) for r in results
                             if r["policy"] == "adaptive" and r.get("speculation"))
    no_timeline = ("<p>none: this tile has no trace FIFO (<code>trace_depth</code> 0)</p>"
                   if not config.traced else "")
    paths["html"].write_text(f"""<!doctype html>
<meta charset="utf-8"><title>fusetile report</title>
<style>body {{ font-family: sans-serif; margin: 2em; }} td, th {{ padding: 2px 8px;
text-align: right; }} table {{ border-collapse: collapse; }} tr:nth-child(even) {{
background: #f4f4f4; }}</style>
<h1>fusetile report: {html.escape(target)}, {config.rows}x{config.cols} array
(profile {config.profile_hash})</h1>
<p>Every number is from the tile's own counters; adaptive rows are its steady state.</p>
<table><tr>{"".join(f"<th>{c}</th>" for c in _COLUMNS)}</tr>
{rows}
</table>
<h2>Fusion decisions</h2><ul>{log or "<li>none</li>"}</ul>
<h2>Speculation</h2>{speculation or "<p>no data-dependent workload</p>"}
<h2>Timelines (one plan run each)</h2>{"".join(f'<p><img src="{t}"></p>' for t in timelines)}{no_timeline}
<h2>Roofline</h2><img src="roofline.png">
""")
    return paths
