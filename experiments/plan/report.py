"""What `ferry plan` shows: the ranked table of candidates, ``plan.json``, and the plot of GPUs needed against the
request rate for the best few."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from costmodel.prices import Price, price_of
from experiments.plan.search import CandidateResult
from experiments.plan.slo import SLO


def economics(result: CandidateResult, prices: dict[str, Price]) -> dict[str, float | None]:
    """Cost per hour (US$), goodput per GPU (requests/s meeting the SLO's per-request thresholds at the target rate,
    per GPU: DistServe's measure) and cost per million output tokens at the target rate, for a candidate that met
    the SLO."""
    if result.gpus is None:
        return {"usd_per_hour": None, "goodput_per_gpu": None, "usd_per_million_output_tokens": None}
    try:  # a profile's own price, else its device's (h100-sxm.datasheet is priced as h100-sxm)
        price: Price | None = price_of(prices, result.candidate.hardware)
    except ValueError:
        price = None
    per_hour = price.usd_per_gpu_hour * result.gpus if price is not None else None
    goodput = result.achieved["goodput_share"] * result.achieved["target_rate"]
    tokens_per_s = result.achieved["offered_output_tokens_per_s"]
    per_million = per_hour / (tokens_per_s * 3600) * 1e6 if per_hour is not None and tokens_per_s > 0 else None
    return {
        "usd_per_hour": per_hour,
        "goodput_per_gpu": goodput / result.gpus,
        "usd_per_million_output_tokens": per_million,
    }


def ranked(results: list[CandidateResult], prices: dict[str, Price]) -> list[CandidateResult]:
    """Candidates that met the SLO, cheapest per hour first (GPUs where a price is missing), then fewest GPUs,
    then most headroom."""
    ok = [r for r in results if r.gpus is not None]

    def key(r: CandidateResult) -> tuple[float, int, float]:
        cost = economics(r, prices)["usd_per_hour"]
        worst = max(r.headroom.values()) if r.headroom else 0.0
        return (cost if cost is not None else math.inf, r.gpus or 0, worst)

    return sorted(ok, key=key)


def best_per_kind(ranked_results: list[CandidateResult]) -> list[CandidateResult]:
    """The first (best) candidate of each GPU kind, in rank order: the curves a planner compares."""
    seen: set[str] = set()
    out = []
    for r in ranked_results:
        if r.candidate.hardware not in seen:
            seen.add(r.candidate.hardware)
            out.append(r)
    return out


def table(results: list[CandidateResult], prices: dict[str, Price], slo: SLO, model: str = "MODEL",
          stability: dict[str, Any] | None = None) -> str:  # fmt: skip
    """The ranked table, the best candidate as `vllm serve`'s flags and how stable that answer is, then the dropped
    candidates with their reasons (candidates dropped for the same reason on one line)."""
    best = ranked(results, prices)
    keys = list(slo.limits)
    layouts = any(r.candidate.layout() for r in results)  # a column of pipeline/data/expert parallelism when tried
    head = ["#", "GPUs", "GPU", "TP", *(["layout"] if layouts else []), "replicas", "settings",
            *[_short(k) for k in keys], "$/h", "goodput/GPU", "$/M out tok"]  # fmt: skip
    settings_column = head.index("settings")
    rows = [head]
    for i, r in enumerate(best, 1):
        money = economics(r, prices)
        c = r.candidate
        slo_cells = [f"{r.achieved.get(k, float('nan')):,.0f} ({r.headroom.get(k, math.nan):.0%})" for k in keys]
        rows.append(
            [
                str(i),
                str(r.gpus),
                c.hardware,
                str(c.tensor_parallel_size),
                *([c.layout() or "-"] if layouts else []),
                _replicas(r),
                c.settings(),
                *slo_cells,
                _money(money["usd_per_hour"]),
                _num(money["goodput_per_gpu"]),
                _money(money["usd_per_million_output_tokens"]),
            ]  # fmt: skip
        )
    widths = [max(len(row[j]) for row in rows) for j in range(len(head))]
    lines = ["  ".join(cell.rjust(w) if j != settings_column else cell.ljust(w) for j, (cell, w) in
             enumerate(zip(row, widths, strict=True))) for row in rows]  # fmt: skip
    lines.insert(1, "-" * len(lines[0]))
    if not best:
        lines.append("no candidate meets the SLO")
    else:
        top = best[0]
        lines += ["", f"best: {_replicas(top)} x `vllm serve {model} {top.candidate.vllm_flags()}` on "
                      f"{top.candidate.hardware} ({gpus(top.gpus)})"]  # fmt: skip
        lines += stability_lines(stability)
    lines += layout_verdict(best, prices)
    dropped = [r for r in results if r.gpus is None]
    if dropped:
        lines.append("")
        lines.append("dropped:")
        lines += [f"  {', '.join(labels)}: {reason}" for reason, labels in grouped(dropped).items()]
    near = [r for r in dropped if r.closest is not None]
    if not best and near:
        closest = min(near, key=lambda r: max(r.closest.ratios.values()) if r.closest else math.inf)
        e = closest.closest
        if e is not None:
            lines.append(
                f"closest: {closest.candidate.label()} with {e.replicas} replica(s) at {e.rate:.3g} req/s: "
                + ", ".join(f"{k} {v:.2f}x its limit" for k, v in e.ratios.items())
            )
    return "\n".join(lines)


def grouped(dropped: list[CandidateResult]) -> dict[str, list[str]]:
    """The dropped candidates' labels by their reason, in the order the reasons first come: reasons that differ only
    in their numbers (the activation reserve of each seat limit, say) are one, told with the first one's numbers."""
    texts: dict[str, str] = {}
    labels: dict[str, list[str]] = {}
    for r in dropped:
        reason = r.reason or "dropped"
        key = re.sub(r"\d[\d,.]*", "#", reason)
        texts.setdefault(key, reason)
        labels.setdefault(key, []).append(r.candidate.label())
    return {texts[key]: names for key, names in labels.items()}


def why_none_ran(results: list[CandidateResult]) -> str:
    """Why no candidate could run, per GPU kind (its first reason, and how many of its candidates it stopped)."""
    kinds: dict[str, list[str]] = {}
    for r in results:
        kinds.setdefault(r.candidate.hardware, []).append(r.reason or "")
    parts = [f"{kind}: {reasons[0]}" + (f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else "")
             for kind, reasons in kinds.items()]  # fmt: skip
    return "; ".join(parts) if parts else "no candidates"


def stability_lines(stability: dict[str, Any] | None) -> list[str]:
    """How stable the best count is across seeds of a synthetic workload (``search.stability``), in words."""
    if stability is None:
        return []
    checks, n = stability["seeds"], stability["replicas"]
    seeds = ", ".join(str(c["seed"]) for c in checks)
    if stability["holds"] == len(checks):
        return [f"stable: the same {n} on {len(checks)} seeds of the workload ({seeds}; {stability['requests']:,} "
                "requests each)"]  # fmt: skip
    off = [f"seed {c['seed']}: " + ("one fewer also meets it" if c["fewer_meets"] else f"{n} miss the SLO")
           for c in checks if not (c["meets"] and not c["fewer_meets"])]  # fmt: skip
    return [
        f"unstable: {n} holds on {stability['holds']} of {len(checks)} seeds ({'; '.join(off)}): the p99s of "
        f"{stability['requests']:,} requests rest on their slowest few; give more --num-prompts"
    ]


def layout_verdict(best: list[CandidateResult], prices: dict[str, Price]) -> list[str]:
    """When both aggregated and disaggregated candidates met the SLO: the best of each and which wins (the ranking's
    order: cheaper, then fewer GPUs, then more headroom), as a line under the table."""
    agg = next((r for r in best if r.candidate.pd_ratio is None), None)
    dis = next((r for r in best if r.candidate.pd_ratio is not None), None)
    if agg is None or dis is None:
        return []
    per_gpu = {id(r): economics(r, prices)["goodput_per_gpu"] or 0.0 for r in (agg, dis)}
    winner = "disaggregated" if best.index(dis) < best.index(agg) else "aggregated"
    return [
        "",
        f"{winner} wins: best aggregated {agg.candidate.label()} on {gpus(agg.gpus)} "
        f"({per_gpu[id(agg)]:.3g} goodput/GPU), best disaggregated {dis.candidate.label()} on {gpus(dis.gpus)} "
        f"({per_gpu[id(dis)]:.3g} goodput/GPU)",
    ]


def gpus(n: int | None) -> str:
    """``n`` GPUs in words: "1 GPU", "4 GPUs"."""
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _replicas(r: CandidateResult) -> str:
    """How many replicas: a count, or a disaggregated layout's prefill and decode replicas (``2P+4D``)."""
    split = r.candidate.pd_ratio
    if split is None or r.replicas is None:
        return str(r.replicas)
    return f"{r.replicas * split[0]}P+{r.replicas * split[1]}D"


def _short(key: str) -> str:
    return key.removesuffix("_ms") + " ms (use)"


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.3g}"


def plot(plans: list[dict[str, Any]], out: Path) -> Path:
    """GPUs needed against the load, one panel per model's plan (plan.json's ``gpus_against_rate``: a line per
    candidate), titled with the model, the workload and the SLO."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [p for p in plans if p["gpus_against_rate"]]
    fig, axes = plt.subplots(len(drawn), 1, figsize=(9, 5.5 * len(drawn)), layout="constrained", squeeze=False)
    styles = [("o", "-", 4.0), ("s", "--", 2.5), ("^", ":", 1.5), ("D", "-.", 1.0)]  # overlapping lines stay visible
    for ax, plan in zip(axes[:, 0], drawn, strict=True):
        for k, (label, points) in enumerate(plan["gpus_against_rate"].items()):
            pts = [(p["rate"], p["gpus"]) for p in points if p["gpus"] is not None]
            marker, dash, width = styles[k % len(styles)]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, linestyle=dash, linewidth=width,
                        markersize=6 + 2 * (len(styles) - k % len(styles)), alpha=0.85, label=label)  # fmt: skip
        unit = plan.get("load_unit", "req/s")
        target = plan["target_rate"]
        ax.axvline(target, color="#888888", linestyle="--", linewidth=1)
        ax.text(target, ax.get_ylim()[1], " target", va="top", color="#555555")
        ax.set_xlabel("clients (--max-concurrency)" if unit == "clients" else "request rate (requests/s)")
        ax.set_ylabel("GPUs needed to meet the SLO")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(frameon=False)
        ax.set_title(title(plan), loc="left", fontsize=10)
    fig.savefig(out, dpi=140)
    plt.close(fig)
    return out


def title(plan: dict[str, Any]) -> str:
    """A plan's figure title: the model, the workload and the SLO."""
    limits = ", ".join(f"{k} <= {v:g}" for k, v in plan["slo"]["limits"].items())
    return (f"{plan['model']}: GPUs needed against the load (each point a simulated cluster)\n"
            f"{_short_source(plan['workload'])}; SLO {limits or 'goodput'}")  # fmt: skip


def _short_source(source: str, width: int = 90) -> str:
    """A workload's description cut to a title's width."""
    return source if len(source) <= width else source[: width - 3] + "..."
