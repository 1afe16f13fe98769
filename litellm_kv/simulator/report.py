"""Figures of one simulated run and their table, JSON and plots."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from litellm_kv.simulator.simulation import Outcome


@dataclass(slots=True)
class Summary:
    strategy: str
    requests: int
    hit_ratio: float  # token-weighted: hit prompt tokens / prompt tokens
    ttft_p50_s: float
    ttft_p99_s: float
    e2e_mean_s: float
    e2e_p99_s: float
    throughput_rps: float  # completed requests / makespan
    output_tps: float
    goodput_rps: float  # requests meeting both SLOs / makespan
    slo_attainment: float
    imbalance: float  # max / mean requests per replica
    prediction_exact: float  # share of requests whose predicted hit equals the actual (-1: n/a)
    wall_s: float = 0.0


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    k = min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))
    return s[k]


def summarise(strategy: str, outcomes: Sequence[Outcome], replicas: int, slo_ttft_s: float,
              slo_itl_s: float, wall_s: float = 0.0) -> Summary:
    done = [o for o in outcomes if not math.isnan(o.e2e_s)]
    prompt = sum(o.prompt_tokens for o in done) or 1
    ttft = [o.ttft_s for o in done]
    e2e = [o.e2e_s for o in done]
    start = min((o.arrival_s for o in done), default=0.0)
    end = max((o.arrival_s + o.e2e_s for o in done), default=1.0)
    span = max(1e-9, end - start)
    good = sum(1 for o in done if o.ttft_s <= slo_ttft_s and o.itl_s <= slo_itl_s)
    per = Counter(o.replica for o in done)
    counts = [per.get(i, 0) for i in range(replicas)]
    mean = sum(counts) / replicas if replicas else 0.0
    predicted = [o for o in done if o.predicted_hit_tokens >= 0]
    exact = (sum(1 for o in predicted if o.predicted_hit_tokens == o.hit_tokens) / len(predicted)
             if predicted else -1.0)
    return Summary(
        strategy=strategy,
        requests=len(done),
        hit_ratio=sum(o.hit_tokens for o in done) / prompt,
        ttft_p50_s=_pct(ttft, 0.50),
        ttft_p99_s=_pct(ttft, 0.99),
        e2e_mean_s=sum(e2e) / max(1, len(e2e)),
        e2e_p99_s=_pct(e2e, 0.99),
        throughput_rps=len(done) / span,
        output_tps=sum(o.output_tokens for o in done) / span,
        goodput_rps=good / span,
        slo_attainment=good / max(1, len(done)),
        imbalance=max(counts) / mean if mean else math.nan,
        prediction_exact=exact,
        wall_s=wall_s,
    )


def table(rows: Sequence[Summary]) -> str:
    head = (f"{'strategy':<30}{'hit%':>7}{'TTFT p50':>10}{'TTFT p99':>10}{'E2E mean':>10}"
            f"{'E2E p99':>10}{'req/s':>8}{'goodput':>9}{'SLO%':>7}{'imbal':>7}{'wall s':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.strategy:<30}{100 * r.hit_ratio:>7.1f}{r.ttft_p50_s:>10.3f}{r.ttft_p99_s:>10.3f}"
            f"{r.e2e_mean_s:>10.2f}{r.e2e_p99_s:>10.2f}{r.throughput_rps:>8.2f}{r.goodput_rps:>9.2f}"
            f"{100 * r.slo_attainment:>7.1f}{r.imbalance:>7.2f}{r.wall_s:>8.1f}"
        )
    return "\n".join(lines)


def write_json(path: str | Path, payload: object) -> None:
    def conv(o: object) -> object:
        if isinstance(o, Summary):
            return asdict(o)
        raise TypeError(type(o).__name__)

    Path(path).write_text(json.dumps(payload, indent=1, default=conv, allow_nan=True))


def plot_sweep(path: str | Path, x_label: str, xs: Sequence[float],
               series: Mapping[str, Sequence[Summary]], title: str) -> None:
    """Four panels: hit ratio, p99 TTFT, goodput and imbalance against the swept variable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.6))
    panels = [("hit_ratio", "token hit ratio", False), ("ttft_p99_s", "TTFT p99 (s)", True),
              ("goodput_rps", "goodput (req/s at SLO)", False), ("imbalance", "max/mean requests", False)]
    for ax, (attr, label, log) in zip(axes, panels, strict=True):
        for name, rows in series.items():
            style = "-" if name in ("litellm-kv", "dynamo", "least-loaded", "round-robin") else ":"
            width = 2.6 if name == "litellm-kv" else 1.3
            ax.plot(xs, [getattr(r, attr) for r in rows], style, marker="o", ms=3, lw=width, label=name)
        ax.set_xlabel(x_label)
        ax.set_title(label)
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bars(path: str | Path, rows: Sequence[Summary], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8))
    names = [r.strategy for r in rows]
    axes[0].barh(names, [100 * r.hit_ratio for r in rows], color="tab:blue")
    axes[0].set_xlabel("token hit ratio (%)")
    axes[1].barh(names, [r.ttft_p99_s for r in rows], color="tab:red")
    axes[1].set_xlabel("TTFT p99 (s)")
    axes[1].set_xscale("log")
    for ax in axes:
        ax.invert_yaxis()
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
