"""One wording for "did you mean" across every name check (config keys, presets, reward
functions, tasks). Standard library only: reward worker processes import it through the tasks."""
from __future__ import annotations

import difflib


def did_you_mean(word: str, valid, prefix: str = "") -> str:
    """"did you mean '<prefix><closest of valid>'? " for a mistyped name, or "" when nothing in
    `valid` is close."""
    close = difflib.get_close_matches(str(word), list(valid), n=1)
    return f"did you mean '{prefix}{close[0]}'? " if close else ""
