"""Reading a run's metrics.jsonl into per-step rows and picking series out of them (pure Python,
no plotting), and telling which trainer wrote them."""
from __future__ import annotations

import json
import math
import re
from fnmatch import fnmatchcase
from pathlib import Path

Series = tuple[list[int], list[float]]  # (steps, values), one point per row that has the key


def read_metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl rows, one per step. A step logged twice (a run resumed before run dirs were cut
    back on resume) gets the union of its rows' keys, merged key by key in file order: where both
    rows have a key, the later value wins. A null (a non-finite value) reads as NaN, a gap in a
    plot; a line that is not JSON (torn by a kill) is skipped."""
    path = Path(run_dir) / "metrics.jsonl"
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


def _natural(name: str) -> list:
    """Sort key that puts pass@2 before pass@16."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def match_keys(names: set[str], pattern: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """Metric names matching `pattern` (a name, or a glob such as `val/pass@*`) and none of
    `exclude`, in natural order."""
    if not any(c in pattern for c in "*?["):
        return [pattern] if pattern in names and pattern not in exclude else []
    hits = [n for n in names if fnmatchcase(n, pattern) and not any(fnmatchcase(n, e) for e in exclude)]
    return sorted(hits, key=_natural)


def series(rows: list[dict], key: str) -> Series:
    pts = [(int(r["step"]), float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def run_kind(rows: list[dict]) -> str:
    """'rl', 'dpo', 'rm' or 'sft', from the metric names each trainer logs (so a report needs no
    config file): DPO logs policy log-probs of chosen/rejected, RM only the rewards, SFT
    `train/loss`; anything else is an RL run."""
    names = {k for r in rows for k in r}
    if any(k.startswith(("actor/", "critic/", "response_length/")) for k in names):
        return "rl"
    if names & {"logps/chosen", "val/logps/chosen"}:
        return "dpo"
    if names & {"rewards/accuracies", "val/rewards/accuracies"}:
        return "rm"
    if names & {"train/loss", "val/ppl"}:
        return "sft"
    return "rl"
