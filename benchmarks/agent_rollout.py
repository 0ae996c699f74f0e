"""The agent loop's rollout against a single-turn rollout of the same prompts, one thread.

    python benchmarks/agent_rollout.py

A random tiny Qwen2 (hidden 256 x 4 layers, character tokenizer), 16 prompts x 4 samples, a
128-token budget. The agent rollout uses a parser whose stop strings are common characters, so
an untrained model ends a turn every few tokens and each turn calls a tool: the worst case for
the loop's per-turn costs (a generate call per turn, each turn's context prefilled again).
Prints, best of 3: seconds, generated tokens, all response tokens and turns per episode.
"""
from __future__ import annotations

import tempfile
import time

import torch

from reinforge.agents.base import Tool, ToolCall
from reinforge.agents.loop import AgentRollout
from reinforge.models.loading import load_causal_lm
from reinforge.models.tiny import make_tiny_model
from reinforge.tasks import build_char_tokenizer
from reinforge.trainers.validation import prompts_batch
from reinforge.workers.rollout.lean import LeanRollout

STOPS = list("aeiou0123")


class LetterParser:
    """A turn ends at any character of STOPS, which calls `echo` on it; results shown as [text]."""

    def stop_strings(self, tools):
        return STOPS

    def parse(self, text, tools):
        return [ToolCall("echo", {"x": text[-1]})] if text and text[-1] in STOPS else []

    def observation_ids(self, tok, messages, turn_text):
        return tok("".join(f"[{m['content']}]" for m in messages), add_special_tokens=False)["input_ids"]


def main() -> None:
    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    folder = tempfile.mkdtemp(prefix="agent_bench_")
    make_tiny_model(tok, folder, seed=0, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                    intermediate_size=512)
    model = load_causal_lm(folder, dtype="float32", device="cpu")
    echo = Tool("echo", "doubles its text", {"type": "object", "properties": {"x": {"type": "string"}}},
                fn=lambda x: x * 2)
    items = [{"prompt_ids": tok(f"{i}+{i}=")["input_ids"], "prompt_text": f"{i}+{i}=", "ground_truth": "0"}
             for i in range(16)]
    inner = LeanRollout(model, tok, max_prompt_length=8, max_response_length=128)
    agent = AgentRollout(inner, tok, max_turns=8, parser=LetterParser(), tools={"echo": echo})
    for name, rollout in (("single-turn", inner), ("agent loop", agent)):
        times = []
        for _ in range(4):  # the first is a warm-up
            torch.manual_seed(0)
            t0 = time.perf_counter()
            batch = rollout.generate(prompts_batch(items, 0), n=4)
            times.append(time.perf_counter() - t0)
        turns = [t["turns"] for t in batch["trajectory"]] if "trajectory" in batch else [1] * len(batch)
        print(f"{name}: {min(times[1:]):.2f} s, generated tokens {int(batch['response_mask'].sum())}, "
              f"response tokens {int(batch['attention_mask'][:, 8:].sum())}, turns/episode {sum(turns) / len(turns):.2f}")


if __name__ == "__main__":
    main()
