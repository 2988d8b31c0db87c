"""The capacity-planning report: tables, figures, Markdown and HTML (the only matplotlib user).

    build_report(base_scenario, out_dir) → out_dir/ report.md, report.html, fig_*.png, *.csv, alerts.yaml

Sections (each a table and a figure, computed by the studies of `kvsim.report.capacity_study`, `paging_study`,
`fleet_study`, `offload_study` and `speculation_study`, each run through `kvsim.report.studies.Study`):
context ↔ concurrency, KV quantization, prefix sharing, the capacity formula, the paging
multiplier, load, alerts, the fleet (replicas and routing on a shipped trace), KV offload and
speculative decoding. A section whose setting this engine refuses says why and has no figure; a
comparison with variants this engine refuses (slab allocators, prefix caching off) leaves their rows
out and quotes the refusal (`kvsim.report.applicable`).
The directory is written to a temporary sibling and renamed when complete; the HTML
references the PNGs beside it, so the folder opens offline.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from functools import partial
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from kvsim.model.capacity_plan import plan_capacity  # noqa: E402
from kvsim.model.errors import KvsimError, expect_function  # noqa: E402
from kvsim.report import (  # noqa: E402
    capacity_study,
    fleet_study,
    offload_study,
    paging_study,
    speculation_study,
    studies,
)
from kvsim.report import text as report_text
from kvsim.report.alerts import prometheus_rules  # noqa: E402
from kvsim.report.figures import FIGURES, fig_series, save_figure  # noqa: E402
from kvsim.report.section import Section  # noqa: E402
from kvsim.report.summary import summary_markdown  # noqa: E402
from kvsim.results.output_checks import check_output_dir  # noqa: E402
from kvsim.results.output_dir import output_directory  # noqa: E402
from kvsim.results.render import rows_to_markdown  # noqa: E402
from kvsim.workload.scenario import Scenario  # noqa: E402


def save_overlay_figure(panels: list[dict], path: Path, title: str) -> None:
    """Panels of overlaid series, in a row: each panel is `{"title", "xlabel", "ylabel", "series":
    [(label, x, y), ...]}` plus `"step": True` for gauges (drawn as steps) and `"cdf": True` to
    plot the empirical CDF of each series' `y` (its `x` ignored). Used by `kvsim validate`."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        for label, x, y in panel["series"]:
            if panel.get("cdf"):
                values = sorted(v for v in y if v == v)
                ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=label)
            elif panel.get("step"):
                ax.step(x, y, where="post", label=label)
            else:
                ax.plot(x, y, label=label)
        if not ax.has_data():
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(panel["title"], fontsize=9)
        ax.set_xlabel(panel["xlabel"])
        ax.set_ylabel(panel["ylabel"])
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

StudyProgress = Callable[[int, int, str, int, int], None]  # (study, of studies, its name, runs done, submitted)


def studied_variants(base: Scenario) -> list[Scenario]:
    """`base` and its variants that read more of its engine's settings than it does: a slab allocator (which reads
    `slab_placement`) and prefix caching on (`prefix_cache`), as the studies run them; one the engine refuses is
    left out, as its study leaves it out (`kvsim.report.applicable`). A setting none of them reads, no run of the
    report reads."""
    out = [base]
    for setting in ("engine.allocator=slab-max", "engine.enable_prefix_caching=true"):
        try:
            out.append(studies.variant(base, setting))
        except KvsimError:
            continue
    return out


def build_report(base: Scenario, out_dir: str | Path, cfg: studies.StudyConfig | None = None,
                 progress: StudyProgress | None = None) -> Path:
    """Run every study and write the report directory atomically. `progress` hears, as each study
    starts and each of its runs is submitted or done, the study's number and its run counts; anything else but
    None is a `KvsimError` naming it before any study runs (`progress=1` was a TypeError traceback)."""
    from kvsim.workload.generate import short_trace_said_once

    expect_function(progress, "progress", 5, "a function (study, num_studies, name, runs_done, runs_submitted) or "
                    "None")

    with short_trace_said_once():  # a short trace: said by the first read, not by every run's
        return _build_report(base, out_dir, cfg, progress)


def _build_report(base: Scenario, out_dir: str | Path, cfg: studies.StudyConfig | None,
                  progress: StudyProgress | None) -> Path:
    check_output_dir(out_dir, "report")  # refuse before the long part, not after it
    cfg = cfg or studies.StudyConfig()
    st = studies.Study(base, cfg)
    steps: tuple[Callable[[studies.Study], Section | tuple[Section, ...]], ...] = (
        capacity_study.context_concurrency, capacity_study.kv_quantization, capacity_study.prefix_sharing,
        capacity_study.capacity_formula, paging_study.paging_and_load, fleet_study.fleet_routing,
        offload_study.offload_sizing, speculation_study.speculation)
    sections: list[Section] = []
    for index, step in enumerate(steps, 1):
        st.runs_submitted = st.runs_done = 0
        if progress is not None:
            def tell(index: int = index, name: str = step.__name__) -> None:
                progress(index, len(steps), name, st.runs_done, st.runs_submitted)

            st.on_runs = tell
            tell()
        made = step(st)
        sections.extend(made if isinstance(made, tuple) else [made])
    st.on_runs = None
    capacity = plan_capacity(st.model, st.gpu, base.engine, [round(st.mean_kv_len), st.max_model_len])
    with output_directory(out_dir, "report") as tmp:
        _write(tmp, st, cfg, sections, capacity)
    return Path(out_dir)


def _write(tmp: Path, st: studies.Study, cfg: studies.StudyConfig, sections: list[Section], capacity) -> None:
    head = {k: v for k, v in capacity.to_dict().items() if k != "rows"}
    pd.DataFrame([head]).to_csv(tmp / "capacity.csv", index=False)
    (tmp / "alerts.yaml").write_text(prometheus_rules(cfg), encoding="utf-8")
    md = [f"# KV capacity report: {st.model.name} on {st.gpu.name}", "",
          *summary_markdown(sections, st, cfg), report_text.introduction(st), "",
          f"Latency model for every section: **{st.latency_name}**. Each simulated point is an ordinary "
          "`kvsim run` of a variant of this scenario (seed " f"{st.base.seed}). In the tables, \"–\" marks a "
          "figure a run could not give (a sustained figure of a run that never saturated, a replica count "
          "beyond the search's limit), never a zero.", "", "## Capacity at a glance", "",
          rows_to_markdown([{"bytes_per_token": head["bytes_per_token"], "bytes_per_block": head["bytes_per_block"],
                             "num_gpu_blocks": head["num_gpu_blocks"],
                             "kv_pool_GiB": round(head["kv_pool_bytes"] / 2**30, 2),
                             "vllm_max_concurrency": round(head["max_concurrency"], 2),
                             "num_gpu_blocks_fp8": head["num_gpu_blocks_fp8"]}])]
    for sec in sections:
        md += ["", f"## {sec.title}", "", report_text.section_text(sec, st, cfg)]
        if sec.skipped is not None:  # the engine refused the section's setting: no runs, no figure, no table
            continue
        md += ["", f"_Latency model: {st.latency_name}._", ""]
        figure = f"fig_{sec.key}.png"
        if sec.key in FIGURES:
            save_figure(partial(FIGURES[sec.key], sec, cfg), tmp / figure, sec.title)
        else:  # alerts: the usage series with the threshold
            load = next(s for s in sections if s.key == "load")
            save_figure(partial(fig_series, load, cfg, alert=True), tmp / figure, sec.title)
        if sec.key == "load":
            save_figure(partial(fig_series, sec, cfg), tmp / "fig_time_series.png",
                        "Running, waiting and KV usage over time")
        md.append(f"![{sec.title}]({figure})")
        if sec.key == "load":
            md += ["", "![time series](fig_time_series.png)"]
        for name, df in sec.tables.items():
            df.to_csv(tmp / f"{name}.csv", index=False)
            if name == "time_series":
                md += ["", f"Data: [`{name}.csv`]({name}.csv) ({len(df):,} steps)."]
                continue
            md += ["", f"Table `{name}` ([CSV]({name}.csv)):", "", rows_to_markdown(_rounded(df))]
        if sec.key == "alerts":
            md += ["", "```yaml", prometheus_rules(cfg).rstrip(), "```"]
    (tmp / "report.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    body = _markdown_to_html(md)  # the same text, as HTML
    (tmp / "report.html").write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>kvsim capacity report</title>"
        "<style>" + STYLE + "</style></head><body>\n" + body + "\n</body></html>\n", encoding="utf-8")


# Tables fit the page: the layout shares the width among columns, a header breaks after any
# underscore (`<wbr>`, the name itself unchanged) and a long text cell wraps.
STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.45}"
         "table{border-collapse:collapse;font-size:12px;width:100%}"
         "td,th{border:1px solid #ccc;padding:3px 5px;text-align:right;overflow-wrap:anywhere}"
         "th{background:#f4f4f4;vertical-align:bottom;font-weight:600}"
         ".summary{border:2px solid #1971c2;background:#eef5fc;border-radius:6px;padding:.4em 1.2em;margin:1em 0}"
         ".summary li{margin:.3em 0}img{max-width:100%}pre{background:#f4f4f4;padding:8px;overflow-x:auto}")


def _rounded(df: pd.DataFrame) -> list[dict]:
    """Rows for a Markdown table: floats to 4 places, a missing value (None, NaN) as "–", never as 0."""
    def cell(v):
        if v is None or (isinstance(v, float) and v != v):
            return "–"
        return round(v, 4) if isinstance(v, float) else v
    return [{k: cell(v) for k, v in row.items()} for row in df.to_dict("records")]


def _markdown_to_html(lines: list[str]) -> str:
    """Enough Markdown for this report: headings, paragraphs, tables, images, links, code blocks and
    the summary quote."""
    import re

    def inline(text: str) -> str:
        text = html.escape(text)
        text = re.sub(r"!\[([^\]]*)\]\(([^)]+)\)", r"<img alt='\1' src='\2'>", text)
        text = re.sub(r"\[([^\]]*)\]\(([^)]+)\)", r"<a href='\2'>\1</a>", text)
        text = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)
        text = re.sub(r"(?<![\w/])_([^_]+)_(?![\w/])", r"<i>\1</i>", text)
        return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)

    out: list[str] = []
    rows: list[list[str]] = []
    quote: list[str] = []
    code: list[str] | None = None
    for line in "\n".join(lines).splitlines() + [""]:
        if code is not None:
            if line.startswith("```"):
                out.append("<pre>" + html.escape("\n".join(code)) + "</pre>")
                code = None
            else:
                code.append(line)
            continue
        if line.startswith("```"):
            code = []
            continue
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not all(set(c) <= set("-:") for c in cells):
                rows.append(cells)
            continue
        if rows:
            header, *rest = rows
            out.append("<table><tr>" + "".join(f"<th>{inline(c).replace('_', '_<wbr>')}</th>" for c in header)
                       + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in rest)
                       + "</table>")
            rows = []
        if line.startswith(">"):  # the summary box: a quote of a bold heading and a list
            quote.append(line[1:].strip())
            continue
        if quote:
            items = [inline(q[2:]) for q in quote if q.startswith("- ")]
            heads = [inline(q) for q in quote if q and not q.startswith("- ")]
            out.append("<div class='summary'>" + "".join(f"<p>{h}</p>" for h in heads)
                       + "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul></div>")
            quote = []
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{inline(line[level:].strip())}</h{level}>")
        elif line.strip():
            out.append(f"<p>{inline(line)}</p>")
    return "\n".join(out)


def held_rate_per_s(row: dict) -> float | None:
    """The request rate a feasible plan row's fleet was seen to serve within the SLOs (None: no window): the
    arrivals a second over the measurement window of the run behind its answer (`num_in_window / window_s`, the
    requests its SLO percentiles are over), scaled from that run's replicas to the row's (`evidence_replicas`: a
    rate search without long runs rests on one replica on a fraction of the traffic, so its fleet's is the linear
    bound, `replicas` times that).

    `replicas × rate_per_replica` read before was the search's, not the answer's: a rate search's one-replica rate
    times the count, which its long runs step down where the fleet pools (single-slot replicas at 300 req/s: 4 × 62
    = 247 req/s for a fleet whose long run held 330, `tests/test_plan_verify.py`), and a replica search's probe's
    share of the traffic (the Azure hour's first 3,000 arrivals, 4.77 req/s, for a fleet verified on the whole
    trace, 5.96 req/s over its window)."""
    window_s, num_in_window = row.get("window_s"), row.get("num_in_window")
    if not row["feasible"] or not window_s or not num_in_window:
        return None
    return num_in_window / window_s * row["replicas"] / (row.get("evidence_replicas") or row["replicas"])


def pareto_figure(rows: list[dict], path: str | Path, title: str) -> None:
    """Plan candidates: the fleet's cost per hour against the request rate it was seen to serve within the SLOs
    (`held_rate_per_s`), one labelled point per feasible candidate.

    The frontier joins the candidates no other beats on both (cheaper and serving more); candidates
    at the same point share one marker and one label. Labels alternate above and below their points.
    """
    labels: dict[tuple[float, float], list[str]] = {}
    for r in rows:
        rate = held_rate_per_s(r)
        if r["cost_per_hour"] is not None and rate:
            point = (r["cost_per_hour"], rate)
            labels.setdefault(point, []).append(f"{r['candidate']} ×{r['replicas']}")
    frontier, best = [], -1.0
    for cost, rate in sorted(labels):
        if rate > best:
            frontier.append((cost, rate))
            best = rate
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for k, ((cost, rate), names) in enumerate(sorted(labels.items())):
        ax.scatter(cost, rate, color="#2b8a3e" if (cost, rate) in frontier else "#1971c2", zorder=3)
        ax.annotate("\n".join(names), (cost, rate), fontsize=8, xytext=(6, 8 if k % 2 == 0 else -14),
                    textcoords="offset points", va="center")
    if len(frontier) > 1:
        ax.plot(*zip(*frontier, strict=True), "--", color="#2b8a3e", label="Pareto frontier")
        ax.legend(fontsize=8)
    if not labels:
        ax.text(0.5, 0.5, "no candidate meets the SLOs within the replica limit", ha="center", va="center",
                transform=ax.transAxes)
    ax.margins(x=0.3, y=0.2)
    ax.set_xlabel("fleet cost (USD per hour)")
    ax.set_ylabel("request rate served within the SLOs (req/s)")
    ax.set_title(title, fontsize=11)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
