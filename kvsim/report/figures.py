"""The report's section figures: one or two panels each, drawn from a section's tables.

Rules a planner reading at a glance relies on: every axis carries real values with units (a log
axis is ticked at the data's own values, 1,024 not 2^10); every legend speaks English, never a
column name; a line that coincides with another stays visible (closed forms hollow and larger,
simulations filled on top); an SLO or alert threshold is drawn where the section has one; a
one-panel figure uses the whole canvas. A column a table lacks (renamed, or a study that gave
nothing) leaves its line out rather than failing the report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator  # noqa: E402

from kvsim.model.units import counted  # noqa: E402
from kvsim.report import studies  # noqa: E402
from kvsim.report.section import Section  # noqa: E402

WASTE = {"token_state": ("token state (stored tokens)", "#2b8a3e"),
         "reserved": ("reserved for tokens not generated yet", "#f08c00"),
         "internal_frag": ("internal fragmentation", "#c92a2a"),
         "external_frag_and_others": ("external fragmentation and other", "#862e9c")}
PAGED, SLAB, VLLM = "#1971c2", "#c92a2a", "#495057"

Draw = Callable[[Section, studies.StudyConfig, np.ndarray], None]  # (section, config, two axes)


def _number(value: float, unit: str = "") -> str:
    """1024 → "1,024", 0.25 → "0.25", with the unit after a space."""
    text = f"{value:,.0f}" if value >= 100 else f"{value:,.3g}"
    return f"{text} {unit}".rstrip()


def _ticks_at(ax, values: Iterable[float], unit: str = "", min_ratio: float = 1.3) -> None:
    """A log x axis ticked at the data's own values (those closer than `min_ratio` to a kept one
    dropped, so labels never collide), labelled as plain numbers."""
    kept: list[float] = []
    for v in sorted({float(v) for v in values if v == v and v > 0}):
        if not kept or v / kept[-1] >= min_ratio:
            kept.append(v)
    ax.set_xticks(kept, [_number(v, unit) for v in kept])
    ax.xaxis.set_minor_locator(NullLocator())


def _plain_log_y(ax, unit: str = "") -> None:
    """A log y axis ticked 1, 2, 5, 10, 20, … (with its unit), not 10^0, 10^1."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _number(v, unit)))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _line(ax, df: pd.DataFrame, x: str, y: str, label: str, closed_form: bool = False, **style) -> None:
    """One series if the table has it: closed forms dashed with large hollow markers under the
    simulated series (filled, smaller, drawn on top), so coinciding lines both stay visible."""
    if y not in df or not df[y].notna().any():
        return
    if closed_form:
        style = {"linestyle": "--", "markersize": 9, "markerfacecolor": "none", "markeredgewidth": 1.5,
                 "zorder": 2, **style}
    else:
        style = {"linestyle": "-", "markersize": 5, "zorder": 3, **style}
    ax.plot(df[x], df[y], label=label, **style)


def fig_context(sec: Section, cfg: studies.StudyConfig, axes: np.ndarray) -> None:
    df = sec.tables["context_concurrency"]
    ax = axes[0]
    _line(ax, df, "max_model_len", "closed_form_paged_at_mean_len", "paged, closed form (blocks ÷ mean length)",
          closed_form=True, marker="o", color=PAGED)
    _line(ax, df, "max_model_len", "simulated_paged_sustained", "paged, simulated (sustained)", marker="o",
          color=PAGED)
    _line(ax, df, "max_model_len", "closed_form_slab_max", "slab max, closed form (pool ÷ max_model_len)",
          closed_form=True, marker="s", color=SLAB)
    _line(ax, df, "max_model_len", "simulated_slab_sustained", "slab max, simulated (sustained)", marker="s",
          color=SLAB)
    _line(ax, df, "max_model_len", "vllm_max_concurrency", "vLLM's 'maximum concurrency' (all at max_model_len)",
          closed_form=True, marker="^", color=VLLM, linestyle=":")
    ax.set_xscale("log")
    _ticks_at(ax, df.max_model_len)
    _plain_log_y(ax)
    ax.set_xlabel("max_model_len (tokens)")
    ax.set_ylabel("concurrent sequences per replica")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))


def fig_fp8(sec: Section, cfg: studies.StudyConfig, axes: np.ndarray) -> None:
    df = sec.tables["kv_quantization"]
    names = [f"{d} KV" for d in df.kv_cache_dtype]
    numeric = df[["simulated_sustained_running", "tpot_mean_s_at_base_rate"]].astype(float)  # None → NaN: no bar
    axes[0].bar(names, numeric.simulated_sustained_running, color=[VLLM, PAGED])
    axes[0].set_ylabel("sustained concurrent sequences")
    axes[1].bar(names, numeric.tpot_mean_s_at_base_rate * 1e3, color=[VLLM, PAGED])
    axes[1].set_ylabel("mean TPOT at the base rate (ms)")


def fig_prefix(sec: Section, cfg: studies.StudyConfig, axes: np.ndarray) -> None:
    df = sec.tables["prefix_sharing"]
    for caching, style in ((False, "--"), (True, "-")):
        part = df[df.prefix_caching == caching]
        if part.empty:  # an engine that cannot turn prefix caching off has no "off" rows
            continue
        label = "prefix caching " + ("on" if caching else "off")
        axes[0].plot(part.num_requests, part.kv_usage_max * 100, style, marker="o", label=label)
        axes[1].plot(part.num_requests, part.ttft_mean_s, style, marker="o", label=label)
    axes[0].set_ylabel("peak KV cache usage (%)")
    axes[1].set_ylabel("mean TTFT (s)")
    for ax in axes:
        ax.set_xlabel("requests sharing the system prompt")
        ax.legend(fontsize=8)


def fig_formula(sec: Section, cfg: studies.StudyConfig, axes: np.ndarray) -> None:
    df = sec.tables["capacity_formula"].sort_values("context_len")
    ax = axes[0]
    _line(ax, df, "context_len", "closed_form_seqs", "closed form: usable blocks ÷ blocks per sequence",
          closed_form=True, marker="o", color=VLLM)
    _line(ax, df, "context_len", "sustained_running", "sustained (time-averaged while saturated)", marker="s",
          color=PAGED)
    _line(ax, df, "context_len", "max_seqs_without_preemption", "largest max_num_seqs without preemption",
          marker="^", color="#2b8a3e")
    _line(ax, df, "context_len", "peak_running_transient", "peak (admission transient)", marker="x",
          color=SLAB, linestyle=":")
    k = sec.facts.get("fitted_constant")
    if k is not None and k == k:  # no KV-bound row: nothing was fitted, no line
        _line(ax, df, "context_len", "fitted_seqs", f"fitted: {k:.2f} × closed form", closed_form=True,
              marker="", color="#862e9c", linestyle=":")
    ax.set_xscale("log")
    _ticks_at(ax, df.context_len)
    _plain_log_y(ax)
    ax.set_xlabel("tokens per sequence (prompt + output)")
    ax.set_ylabel("concurrent sequences")
    ax.legend(fontsize=7)
    rates = df.dropna(subset=["preemptions_per_s"]) if "preemptions_per_s" in df else df.iloc[:0]
    axes[1].barh(rates.lengths, rates.preemptions_per_s, color=SLAB)
    axes[1].invert_yaxis()  # same order as the left panel's x axis: shortest first
    axes[1].set_xlabel("preemptions per second while saturated")
    axes[1].tick_params(axis="y", labelsize=8)


def fig_paging(sec: Section, cfg: studies.StudyConfig, axes: np.ndarray) -> None:
    df = sec.tables["waste_breakdown"]
    bottom = pd.Series(0.0, index=df.index)
    for key, (label, color) in WASTE.items():
        if key in df:
            axes[0].bar(df.allocator, df[key] * 100, bottom=bottom * 100, color=color, label=label)
            bottom += df[key]
    axes[0].set_ylabel("% of the KV pool (time-averaged, saturated)")
    axes[0].set_ylim(0, 118)  # room for the legend above the bars
    axes[0].legend(fontsize=7, loc="upper center", ncols=2)
    rates = sec.tables["sustained_rate"]
    axes[1].bar(rates.allocator, rates.max_rate_meeting_slo.astype(float).fillna(0.0), color=PAGED)
    for x, value in enumerate(rates.max_rate_meeting_slo):  # "–" where no rate was found, never a zero
        axes[1].annotate("–" if pd.isna(value) else f"{value:.3g}", (x, 0 if pd.isna(value) else value),
                         ha="center", va="bottom", fontsize=8)
    axes[1].set_ylabel(f"sustainable rate with TTFT p90 ≤ {_number(cfg.ttft_slo_s, 's')} (req/s)")


def fig_load(sec: Section, cfg: studies.StudyConfig, axes: np.ndarray) -> None:
    df = sec.tables["load_curves"]
    for p, color in (("p50", VLLM), ("p90", PAGED), ("p99", SLAB)):
        _line(axes[0], df, "rate", f"ttft_{p}_s", f"TTFT {p}", marker="o", color=color)
        axes[1].plot(df.rate, df[f"tpot_{p}_s"] * 1e3, marker="o", color=color, label=f"TPOT {p}")
    axes[0].axhline(cfg.ttft_slo_s, color=PAGED, linestyle="--", linewidth=1,
                    label=f"SLO: TTFT p90 ≤ {_number(cfg.ttft_slo_s, 's')}")
    if sec.facts.get("sustainable_rate"):
        for ax in axes:
            ax.axvline(sec.facts["sustainable_rate"], color=VLLM, linestyle=":", linewidth=1,
                       label="sustainable rate (steady state)")
    _plain_log_y(axes[0], "s")
    axes[0].set_ylabel("time to first token")
    axes[1].set_ylabel("time per output token (ms)")
    for ax in axes:
        ax.set_xscale("log")
        _ticks_at(ax, df.rate, min_ratio=1.0)
        ax.set_xlabel("request rate (requests/s, Poisson)")
        ax.legend(fontsize=8)


def fig_fleet(sec: Section, cfg: studies.StudyConfig, axes: np.ndarray) -> None:
    df, f = sec.tables["fleet_routing"], sec.facts
    if f.get("unservable"):
        tried = ", ".join(f"{p['num_too_long']} of {f['num_requests']} {p['name']}" for p in f["passed_over"])
        axes[0].text(0.5, 0.5, f"{tried} prompts of max_model_len ({f['max_model_len']:,} tokens) or more:\n"
                     "not servable, no fleet sized", ha="center", va="center", transform=axes[0].transAxes)
        axes[0].set_axis_off()
        axes[1].set_axis_off()
        return
    names = [r.replace("_", " ") for r in df.router]
    if f["trace"].has_prefixes:
        axes[0].bar(names, df.prefix_cache_hit_rate * 100, color=PAGED)
        axes[0].axhline(f["unbounded_hit_rate"] * 100, color="#2b8a3e", linestyle="--", linewidth=1,
                        label="unbounded fleet-wide cache")
        axes[0].set_ylabel(f"prefix-cache hit rate (%), {counted(int(df.replicas.iloc[0]), 'replica')}")
        axes[0].legend(fontsize=8)
    else:
        axes[0].text(0.5, 0.5, f"{f['trace'].name} trace: lengths, no prompt content:\nno shared prefix to hit "
                     "or to route by", ha="center", va="center", transform=axes[0].transAxes)
        axes[0].set_axis_off()
    x = np.arange(len(df))
    axes[1].bar(x - 0.2, df.ttft_p50_s, 0.4, label="TTFT p50", color=VLLM)
    axes[1].bar(x + 0.2, df.ttft_p90_s, 0.4, label="TTFT p90", color=SLAB)
    axes[1].axhline(f["ttft_target_s"], color=SLAB, linestyle="--", linewidth=1,
                    label=f"target: TTFT p90 ≤ {_number(f['ttft_target_s'], 's')}")
    axes[1].set_xticks(x, names)
    axes[1].set_ylabel("time to first token (s)")
    axes[1].margins(y=0.2)  # room above the bars for the legend
    axes[1].legend(fontsize=8, loc="upper center", ncols=3)


def fig_offload(sec: Section, cfg: studies.StudyConfig, axes: np.ndarray) -> None:
    """Prefix hit rate over all tiers and TTFT p90 against the CPU tier's size, one line per load."""
    df, f = sec.tables["offload_points"], sec.facts
    counted_hits = f["target_hit_rate"] is not None  # prefix caching off: no query counted, no hit rate
    for load, at in df.groupby("load"):
        if counted_hits:
            axes[0].plot(at.cpu_GiB, at.hit_rate_all_tiers * 100, marker="o", label=f"load ×{load:g}")
        axes[1].plot(at.cpu_GiB, at.ttft_p90_s, marker="o", label=f"load ×{load:g}")
    if counted_hits:
        axes[0].axhline(f["unbounded_hit_rate"] * 100, color="#2b8a3e", linestyle="--", linewidth=1,
                        label="unbounded cache")
        axes[0].set_ylabel("prefix hit rate, GPU + CPU tier (%)")
    else:
        axes[0].text(0.5, 0.5, "prefix caching off:\nno prefix-cache query counted, no hit rate", ha="center",
                     va="center", transform=axes[0].transAxes)
        axes[0].set_axis_off()
    if f["ttft_slo_s"] is not None:
        axes[1].axhline(f["ttft_slo_s"], color=SLAB, linestyle="--", linewidth=1,
                        label=f"SLO: TTFT p90 ≤ {_number(f['ttft_slo_s'], 's')}")
    axes[1].set_ylabel("TTFT p90 (s)")
    for ax in axes:
        ax.set_xlabel("CPU offload tier (GiB; 0: none)")


def fig_speculation(sec: Section, cfg: studies.StudyConfig, axes: np.ndarray) -> None:
    """TPOT and output throughput against the batch-size limit, without and with speculation; the crossover."""
    df, f = sec.tables["speculation"], sec.facts
    for speculative, label, color in ((False, "without speculation", VLLM),
                                      (True, f"{f['config']['method']}, K = {f['config']['num_speculative_tokens']}",
                                       PAGED)):
        rows = df[df.speculative == speculative]
        axes[0].plot(rows.max_num_seqs, rows.tpot_mean_s * 1e3, marker="o", color=color, label=label)
        axes[1].plot(rows.max_num_seqs, rows.output_tokens_per_s, marker="o", color=color, label=label)
    if f.get("crossover_batch_size") is not None:
        for ax in axes:
            ax.axvline(f["crossover_batch_size"], color=SLAB, linestyle="--", linewidth=1,
                       label=f"speculation stops paying ({f['crossover_batch_size']} seqs)")
    axes[0].set_ylabel("time per output token, mean (ms)")
    axes[1].set_ylabel("output tokens/s")
    for ax in axes:
        ax.set_xscale("log")
        _ticks_at(ax, df.max_num_seqs, min_ratio=1.0)
        ax.set_xlabel("batch-size limit max_num_seqs (saturated)")
        ax.legend(fontsize=8)


def fig_series(sec: Section, cfg: studies.StudyConfig, axes: np.ndarray, alert: bool = False) -> None:
    """Running and waiting requests, and KV usage with its preemptions (and the alert threshold)."""
    ts = sec.tables["time_series"]
    axes[0].plot(ts.time_s, ts["vllm:num_requests_running"], label="running", color=PAGED)
    axes[0].plot(ts.time_s, ts["vllm:num_requests_waiting"], label="waiting", color="#f08c00")
    axes[0].set_ylabel("requests")
    axes[0].legend(fontsize=8, loc="upper left")
    usage = ts["vllm:kv_cache_usage_perc"] * 100
    axes[1].plot(ts.time_s, usage, color="#2b8a3e", label="KV cache usage")
    jumps = ts["vllm:num_preemptions_total"].diff().fillna(0) > 0
    axes[1].scatter(ts.time_s[jumps], usage[jumps], color=SLAB, s=10, label="preemption", zorder=3)
    if alert:
        axes[1].axhline(cfg.usage_alert * 100, color=SLAB, linestyle="--", linewidth=1,
                        label=f"alert: usage > {cfg.usage_alert:.0%}")
    axes[1].set_ylim(0, 105)
    axes[1].set_ylabel("KV cache usage (%)")
    axes[1].legend(fontsize=8, loc="lower center")
    rate = sec.facts.get("time_series_rate")
    for ax in axes:
        ax.set_xlabel("simulated time (s)" + (f", a run at {_number(rate, 'req/s')}" if rate is not None else ""))


FIGURES: dict[str, Draw] = {"context": fig_context, "fp8": fig_fp8, "prefix": fig_prefix, "formula": fig_formula,
                            "paging": fig_paging, "load": fig_load, "fleet": fig_fleet, "offload": fig_offload,
                            "speculation": fig_speculation}


def save_figure(draw: Callable[[np.ndarray], None], path: Path, title: str) -> None:
    """Two panels in a row, or one over the whole canvas when `draw` leaves the second empty;
    constrained layout keeps labels, legends and the title clear of each other."""
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.2), layout="constrained")
    draw(axes)
    if not axes[1].has_data():
        axes[1].remove()
        axes[0].set_subplotspec(axes[0].get_gridspec()[0, :])
    fig.suptitle(title, fontsize=12)
    fig.savefig(path, dpi=110)
    plt.close(fig)
