"""The accuracy-against-tokens figure: one colour per policy, one marker per method."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from compare.config import REFERENCE, CompareConfig, policy_label

MARKERS = {"self_consistency": "o", "best_of_n": "s", "stepco": "^", "beats": "*", "greedy": "x", REFERENCE: "v"}
STYLES = {"self_consistency": "-", "best_of_n": "--", "stepco": "-.", REFERENCE: ":", "beats": "", "greedy": ""}


def _policy_points(ax, color: str, c: dict[str, Any], cells: dict[str, Any]) -> None:
    """One policy's curves (self-consistency and Best-of-N by N, StepCo and the reference by round)
    and its single points (BEATS, greedy), in its colour."""
    for method in ("self_consistency", "best_of_n"):
        pts = c.get(method) or []
        if pts:
            ax.plot([p["tokens_per_problem"] for p in pts], [p["accuracy"] for p in pts], marker=MARKERS[method],
                    color=color, linestyle=STYLES[method], alpha=0.85)
            for p in pts:
                ax.annotate(f"{p['n']}", (p["tokens_per_problem"], p["accuracy"]), fontsize=6, color=color,
                            textcoords="offset points", xytext=(3, 3))
    for method in ("stepco", REFERENCE):
        pts = c.get(method) or []
        if pts:
            ax.plot([p["tokens_per_problem"] for p in pts], [p["accuracy"] for p in pts], marker=MARKERS[method],
                    color=color, linestyle=STYLES[method], alpha=0.85,
                    markerfacecolor="none" if method == REFERENCE else color)
            for p in pts:
                ax.annotate(f"T{p['t']}", (p["tokens_per_problem"], p["accuracy"]), fontsize=6, color=color,
                            textcoords="offset points", xytext=(3, -8))
    for method in ("beats", "greedy"):
        cell = cells.get(method)
        if cell:
            ax.scatter([cell["tokens_per_problem"]], [cell["accuracy"]], marker=MARKERS[method], color=color,
                       s=90 if method == "beats" else 40, zorder=3)


def plot(path: Path, cfg: CompareConfig, curves: dict[str, dict[str, Any]], table: dict[str, dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    for i, policy in enumerate(cfg.policies):
        _policy_points(ax, colors[i % len(colors)], curves.get(policy, {}), table.get(policy, {}))
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colors[i % len(colors)], lw=3, label=policy_label(p))
               for i, p in enumerate(cfg.policies)]
    names = {"self_consistency": "self-consistency (N)", "best_of_n": "Best-of-N (N)", "stepco": "StepCo (T rounds)",
             "beats": "BEATS", "greedy": "greedy", REFERENCE: "StepCo + exact checker (reference)"}
    shown = {m for pol in curves.values() for m, pts in pol.items() if pts} | {
        m for pol in table.values() for m in pol if m in ("beats", "greedy")}
    handles += [Line2D([], [], color="gray", marker=MARKERS[m], linestyle=STYLES[m],
                       markerfacecolor="none" if m == REFERENCE else "gray", label=names[m])
                for m in names if m in shown]
    ax.legend(handles=handles, fontsize=7, loc="best")
    ys = [p["accuracy"] for pol in curves.values() for pts in pol.values() for p in pts] + [
        c["accuracy"] for pol in table.values() for c in pol.values()]
    lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    pad = max(0.05, (hi - lo) * 0.1)
    ax.set_ylim(max(-0.02, lo - pad), min(1.02, hi + pad))
    ax.set_xscale("log")
    ax.set_xlabel("tokens per problem (generator prompt + completion + verifier)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"Accuracy vs tokens on {cfg.eval.dataset} ({cfg.eval.n_problems} problems)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=130)
    plt.close(fig)
    os.replace(tmp, path)
