"""The model gateway: an OpenAI-compatible HTTP endpoint over the run's rollout engine, exact token
capture per rollout, and the rollout that runs a user's agent against it (docs/agents.md, "Bring your
own agent"). capture.py and render.py are pure; server.py serves; rollout.py is the Rollout."""
