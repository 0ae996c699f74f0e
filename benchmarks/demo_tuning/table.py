"""Print results.jsonl (one line per tune.py experiment) as a markdown table."""
import json
from pathlib import Path

rows = [json.loads(x) for x in (Path(__file__).parent / "results.jsonl").read_text().splitlines() if x.strip()]
print("| name | SFT steps | RL prompt pool | RL overrides | greedy (step: acc) | sampled start -> end | pass@8 start -> end | s/RL step |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    c = r["curve"]
    curve = ", ".join(f"{p['step']}: {p['greedy']:.3f}" for p in c)
    ov = " ".join(o for o in r["overrides"] if not o.startswith(("trainer.val_every", "actor.micro_batch_size")))
    print(f"| {r['name']} | {r['sft_steps']} | {r.get('pool') or 'all'} | {ov} | {curve} | "
          f"{c[0]['sampled']:.3f} -> {c[-1]['sampled']:.3f} | {c[0].get('pass@8', 0):.3f} -> {c[-1].get('pass@8', 0):.3f} | {r['rl_step_s']} |")
