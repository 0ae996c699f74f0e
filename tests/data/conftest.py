"""Shared by the data tests: the character tokenizer and a JSONL file writer."""
import json

import pytest

from reinforge.tasks import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def write_jsonl(path, rows) -> str:
    """Write `rows` (dicts) to `path`, one JSON object per line; returns the path as a string."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
