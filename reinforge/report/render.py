"""Render `report/` for a run directory: one PNG per panel and a self-contained `index.html`
(plots inlined as base64 in a responsive CSS grid, one line for each panel with nothing to draw,
the latest validation and training samples, and the resolved config).

Reads only files the trainers write (metrics.jsonl, config.yaml, samples/*.jsonl), so it works
on a finished run, a crashed one, or one copied from another machine, of any trainer (RL, SFT,
DPO, RM: see panels.py).
"""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on a training machine
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from reinforge.report.metrics import read_metrics, run_kind  # noqa: E402
from reinforge.report.panels import PANELS, PanelPlan, plan_panel  # noqa: E402
from reinforge.report.smooth import centred_mean, smoothing_window  # noqa: E402

__all__ = ["read_metrics", "write_report"]

KIND_NAMES = {"rl": "RL", "sft": "SFT", "dpo": "DPO", "rm": "reward model"}


def _axes(title: str, ylabel: str, xlabel: str = "training step"):
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    # sizes for a figure shown about 450 px wide in the report's grid
    ax.set_title(title, fontsize=12)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=10)
    ax.tick_params(labelsize=9)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig, ax, out: Path) -> Path:
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_plan(plan: PanelPlan, out: Path) -> Path:
    """Each line smoothed (centred moving average) over its raw values drawn faint, or drawn raw
    (with markers when it has too few points to smooth). Steps are integers on the x axis."""
    fig, ax = _axes(plan.panel.title, plan.panel.ylabel)
    windows = set()
    colors: dict[str, str] = {}  # training metric without its train/ prefix -> its colour
    n_colors = 0
    for line in plan.lines:
        name = line.names[0]
        # val/x is drawn dashed in the colour of x (or train/x), so the training and held-out
        # curves of one quantity pair up
        base = name.split("/", 1)[1] if name.startswith(("val/", "train/")) else name
        partner = colors.get(base) if name.startswith("val/") else None
        color = partner or f"C{n_colors % 10}"
        if partner is None:
            n_colors += 1
            colors.setdefault(base, color)
        style = "--" if partner else "-"
        w = smoothing_window(len(line.steps)) if plan.panel.smooth else 1
        if w > 1:
            windows.add(w)
            ax.plot(line.steps, line.values, color=color, linewidth=0.8, alpha=0.25)
            ax.plot(line.steps, centred_mean(line.values, w), color=color, linestyle=style, linewidth=1.8,
                    label=line.label)
        else:
            ax.plot(line.steps, line.values, color=color, linestyle=style, linewidth=1.5,
                    marker="o" if len(line.steps) < 30 else None, markersize=3, label=line.label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if windows:
        ws = "/".join(map(str, sorted(windows)))
        ax.set_xlabel(f"training step  (bold: centred moving average of {ws} points; faint: raw)", fontsize=9)
    return _save(fig, ax, out)


def plot_position_profile(rows: list[dict], out: Path) -> Path | None:
    """Mean advantage per relative-position bucket (x) at a few training steps (lines): the
    view VAPO uses to show value-initialisation bias towards early tokens."""
    keyed = [r for r in rows if any(k.startswith("diag/adv_pos_bucket_") for k in r)]
    if not keyed:
        return None
    picks = sorted({0, len(keyed) // 2, len(keyed) - 1})
    fig, ax = _axes("Advantage by position in the response (diag/adv_pos_bucket_*)", "mean advantage",
                    "relative position (0 = first token, 1 = last)")
    for i in picks:
        r = keyed[i]
        b = sorted((int(k.rsplit("_", 1)[1]), v) for k, v in r.items() if k.startswith("diag/adv_pos_bucket_"))
        n = max(k for k, _ in b) + 1
        ax.plot([(k + 0.5) / n for k, _ in b], [v for _, v in b], marker="o", label=f"step {r['step']}")
    ax.axhline(0, color="grey", linewidth=0.8)
    return _save(fig, ax, out)


IMAGE_URI = "data:image/png;base64,"


def _cell(v, column: str = "") -> str:
    if v is None:
        return ""
    if column == "images" and isinstance(v, list):  # a training sample's pictures (trainers/metrics.sample_rows)
        return "".join(f'<img class="sample" alt="prompt image" src="{html.escape(u)}"/>'
                       for u in v if isinstance(u, str) and u.startswith(IMAGE_URI))
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, int):
        return str(v)
    text = v if isinstance(v, str) else json.dumps(v)
    return f"<pre>{html.escape(text)}</pre>"


def _latest(run_dir: Path, prefix: str) -> Path | None:
    files = sorted((run_dir / "samples").glob(f"{prefix}*.jsonl"),
                   key=lambda p: int(p.stem.rsplit("_", 1)[1]) if p.stem.rsplit("_", 1)[1].isdigit() else -1)
    return files[-1] if files else None


def _flat(row: dict) -> dict:
    """A dict value becomes one column per key: {"rewards": {"fmt": 1.0}} -> "rewards/fmt"."""
    out = {}
    for k, v in row.items():
        out.update({f"{k}/{sub}": x for sub, x in v.items()} if isinstance(v, dict) else {k: v})
    return out


def _samples_table(path: Path | None, limit: int) -> str:
    """The first `limit` rows of a samples file as a table, columns in first-seen order
    (validation samples: prompt, response, ground truth, reward; training samples add each
    reward function's score, the advantage and the group)."""
    if path is None:
        return "<p>None logged.</p>"
    every = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [_flat(json.loads(line)) for line in every[:limit]]
    cols = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c), c)}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<p>From samples/{html.escape(path.name)} ({len(rows)} of {len(every)} rows)</p><table><tr>{head}</tr>{body}</table>"


def _train_samples(run_dir: Path) -> str:
    """RL runs log some training rollouts every few steps (trainer.log_samples_every): all the
    rows of the latest file (a few per group, a few groups)."""
    latest = _latest(run_dir, "train_step_")
    return f"<h2>Training samples</h2>{_samples_table(latest, limit=64)}" if latest else ""


CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(440px,1fr));gap:12px}
figure{margin:0;border:1px solid #ddd;border-radius:6px;padding:4px;background:#fff}
figure img{width:100%;height:auto;display:block}
figcaption{font-size:12px;color:#555;padding:2px 6px}
.notdrawn{font-size:14px;color:#555}p.notdrawn{margin-bottom:0}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:4px;vertical-align:top}
pre{margin:0;white-space:pre-wrap}
img.sample{width:112px;height:auto;image-rendering:pixelated;display:block}"""


def _figure(title: str, png: Path, caption: str) -> str:
    data = base64.b64encode(png.read_bytes()).decode()
    return (f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{data}"/>'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def write_report(run_dir: str | Path) -> Path:
    """Write run_dir/report/<panel>.png and run_dir/report/index.html; returns the HTML path."""
    run_dir = Path(run_dir)
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    rows = read_metrics(run_dir)
    kind = run_kind(rows)
    figures, notes = [], []
    for panel in PANELS[kind] if rows else []:
        plan = plan_panel(rows, panel)
        if plan.note:
            notes.append(plan.note)
            continue
        caption = "; ".join(ln.label for ln in plan.lines)
        if plan.zero:
            caption += f". 0 at every step, not drawn: {', '.join(plan.zero)}"
        figures.append(_figure(panel.title, plot_plan(plan, out / f"{panel.slug}.png"), caption))
    if kind == "rl":
        profile = plot_position_profile(rows, out / "advantage_by_position.png")
        if profile is not None:
            figures.append(_figure("Advantage by position", profile, "at the first, middle and last logged step"))
    not_drawn = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    cfg_path = run_dir / "config.yaml"
    cfg = html.escape(cfg_path.read_text()) if cfg_path.exists() else "(no config.yaml)"
    name = html.escape(run_dir.name)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>reinforge run: {name}</title>
<meta name="viewport" content="width=device-width,initial-scale=1"><style>{CSS}</style></head><body>
<h1>reinforge {KIND_NAMES[kind]} run: {name}</h1><p>{len(rows)} logged steps.</p>
<h2>Training curves</h2><div class="grid">{"".join(figures)}</div>{'' if figures else '<p>No metrics yet.</p>'}
{f'<p class="notdrawn">Not drawn:</p><ul class="notdrawn">{not_drawn}</ul>' if notes else ''}
<h2>Validation samples</h2>{_samples_table(_latest(run_dir, "step_"), limit=20)}
{_train_samples(run_dir)}
<h2>Resolved config</h2><pre>{cfg}</pre></body></html>"""
    (out / "index.html").write_text(page)
    return out / "index.html"
