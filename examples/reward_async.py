"""An async reward function: reinforge awaits all of a batch's calls at once on one event loop,
each cancelled after reward.timeout_s (it then scores reward.default_score), so a remote judge
(an LLM API, a code sandbox) is not called one sample at a time. Any style may be async; this
one is in reinforge's own style.

    reinforge train ... 'reward.functions=[{name: examples/reward_async.py:judge}]'
"""
import asyncio


async def judge(prompt, response, ground_truth, **extra):
    await asyncio.sleep(0.05)  # stands for the request to a judge service
    return float(response.strip() == str(ground_truth).strip())
