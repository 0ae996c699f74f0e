"""Render `report/` for a run directory: one PNG per panel and a self-contained `index.html`
(plots inlined as base64, the resolved config, and sample prompts/responses/rewards).

Reads only files the trainers write (metrics.jsonl, config.yaml, samples/*.jsonl), so it works
on a finished run, a crashed one, or one copied from another machine.
"""
from __future__ import annotations

import base64
import html
import json
import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Panel title -> (y label, metric names or regexes). Only metrics present are drawn.
PANELS: list[tuple[str, str, list[str]]] = [
    ("Reward", "mean score", ["critic/score/mean", "reward/acc"]),
    ("Validation accuracy", "accuracy", [r"re:^val/(acc_greedy|acc_sampled|pass@\d+)$"]),
    ("KL to reference", "KL", ["actor/ref_kl", "actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl"]),
    ("Policy entropy", "nats / token", ["actor/entropy"]),
    ("Clip fractions", "fraction of tokens", ["actor/pg_clipfrac", "actor/pg_clipfrac_lower", "critic/vf_clipfrac"]),
    ("Response length", "tokens", ["response_length/mean", "response_length/correct_mean",
                                   "response_length/incorrect_mean"]),
    ("Advantage-position correlation", "Pearson r", ["diag/adv_pos_corr"]),
    ("Losses", "loss", ["actor/pg_loss", "critic/vf_loss"]),
    ("Timing per stage", "seconds", [r"re:^timing_s/(?!step$).+"]),
]


def read_metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl rows, one per step. A step logged twice (a run resumed before run dirs were cut
    back on resume) gets the union of its rows' keys, merged key by key in file order: where both
    rows have a key, the later value wins. A null (a non-finite value) reads as NaN, a gap in a
    plot; a line that is not JSON (torn by a kill) is skipped."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    by_step: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        try:
            row = {k: math.nan if v is None else v for k, v in json.loads(line).items()}
        except ValueError:  # blank, or the last line torn by a kill
            continue
        by_step[row["step"]] = {**by_step.get(row["step"], {}), **row}
    return [by_step[s] for s in sorted(by_step)]


def _series(rows: list[dict], spec: str) -> dict[str, tuple[list, list]]:
    names = sorted({k for r in rows for k in r})
    if spec.startswith("re:"):
        pat = re.compile(spec[3:])
        keys = [k for k in names if pat.match(k)]
    else:
        keys = [spec] if spec in names else []
    out = {}
    for k in keys:
        pts = [(r["step"], r[k]) for r in rows if k in r]
        out[k] = ([p[0] for p in pts], [p[1] for p in pts])
    return out


def plot_panel(rows: list[dict], title: str, ylabel: str, specs: list[str], out: Path) -> Path | None:
    series = {}
    for s in specs:
        series.update(_series(rows, s))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
    for name, (x, y) in series.items():
        ax.plot(x, y, marker="o" if len(x) < 30 else None, markersize=3, linewidth=1.5,
                label=name.split("/", 1)[-1] if name.count("/") > 1 else name)
    ax.set_title(title)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_position_profile(rows: list[dict], out: Path) -> Path | None:
    """Mean advantage per relative-position bucket (x) at a few training steps (lines): the
    view VAPO uses to show value-initialisation bias towards early tokens."""
    keyed = [r for r in rows if any(k.startswith("diag/adv_pos_bucket_") for k in r)]
    if not keyed:
        return None
    picks = sorted({0, len(keyed) // 2, len(keyed) - 1})
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
    for i in picks:
        r = keyed[i]
        b = sorted((int(k.rsplit("_", 1)[1]), v) for k, v in r.items() if k.startswith("diag/adv_pos_bucket_"))
        n = max(k for k, _ in b) + 1
        ax.plot([(k + 0.5) / n for k, _ in b], [v for _, v in b], marker="o", label=f"step {r['step']}")
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_title("Advantage by position in the response")
    ax.set_xlabel("relative position (0 = first token, 1 = last)")
    ax.set_ylabel("mean advantage")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def _score(v) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else html.escape(str(v))


def _samples_table(run_dir: Path, limit: int = 20) -> str:
    files = sorted((run_dir / "samples").glob("step_*.jsonl"), key=lambda p: int(p.stem.split("_")[1]))
    if not files:
        return "<p>No validation samples.</p>"
    last = files[-1]
    rows = [json.loads(line) for line in last.read_text().splitlines() if line.strip()][:limit]
    cells = "".join(
        f"<tr><td><pre>{html.escape(str(r.get('prompt', '')))}</pre></td><td><pre>{html.escape(str(r.get('response', '')))}</pre>"
        f"</td><td>{html.escape(str(r.get('ground_truth', '')))}</td><td>{_score(r.get('score'))}</td></tr>" for r in rows)
    return (f"<p>From {html.escape(last.name)}</p><table><tr><th>prompt</th><th>response</th><th>ground truth</th>"
            f"<th>reward</th></tr>{cells}</table>")


def write_report(run_dir: str | Path) -> Path:
    """Write run_dir/report/*.png and run_dir/report/index.html; returns the HTML path."""
    run_dir = Path(run_dir)
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    rows = read_metrics(run_dir)
    pngs = []
    for title, ylabel, specs in PANELS:
        slug = re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")
        p = plot_panel(rows, title, ylabel, specs, out / f"{slug}.png")
        if p is not None:
            pngs.append((title, p))
    profile = plot_position_profile(rows, out / "advantage_by_position.png")
    if profile is not None:
        pngs.append(("Advantage by position", profile))
    imgs = "".join(f'<figure><img alt="{html.escape(t)}" src="data:image/png;base64,'
                   f'{base64.b64encode(p.read_bytes()).decode()}"/></figure>' for t, p in pngs)
    cfg_path = run_dir / "config.yaml"
    cfg = html.escape(cfg_path.read_text()) if cfg_path.exists() else "(no config.yaml)"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>reinforge run: {html.escape(run_dir.name)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}}figure{{display:inline-block;margin:4px}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px;vertical-align:top}}pre{{margin:0;white-space:pre-wrap}}</style>
</head><body><h1>reinforge run: {html.escape(run_dir.name)}</h1><p>{len(rows)} logged steps.</p>
<h2>Training curves</h2>{imgs or '<p>No metrics yet.</p>'}
<h2>Samples</h2>{_samples_table(run_dir)}
<h2>Resolved config</h2><pre>{cfg}</pre></body></html>"""
    (out / "index.html").write_text(page)
    return out / "index.html"
