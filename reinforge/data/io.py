"""Reading and writing row files (.parquet, .jsonl, .json) with errors that name the file."""

from __future__ import annotations

import json
import os
from typing import Any


class ItemsDataset:
    """A dataset whose validated items sit in `self.items` (a list of dicts). Items come out as
    shallow copies, so callers may add keys without touching the dataset."""

    items: list[dict]
    path: str

    def _read(self, path, tokenizer=None, *, need_eos: bool = False) -> list[dict[str, Any]]:
        """Set `self.path` and return the file's rows: DataError if it has none; ValueError
        if `need_eos` and the tokenizer has no eos token (checked before the file is read)."""
        if need_eos and tokenizer.eos_token_id is None:
            raise ValueError(f"{type(self).__name__} needs a tokenizer with an eos token")
        self.path = os.fspath(path)
        return load_rows(self.path, nonempty=True)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, idx: int) -> dict:
        return dict(self.items[idx])

    def __iter__(self):
        return (dict(it) for it in self.items)


class DataError(ValueError):
    """A dataset problem; the message names the file and, where known, the row and field."""


def file_label(path: str) -> str:
    """How messages name a data file: its base name, or a whole hf://datasets/... path."""
    return path if path.startswith("hf://") else os.path.basename(path)


def row_error(path: str, row: int, field: str, message: str) -> DataError:
    """DataError("train.parquet: row 12: field 'prompt': <message>"); rows count from 0."""
    return DataError(f"{file_label(path)}: row {row}: field '{field}': {message}")


def require_columns(rows: list[dict], path: str, needed: tuple[str, ...], fix: str) -> None:
    """DataError when no row of the file has one of the `needed` columns: one message naming
    the file, the missing column and the columns there are, instead of "row 0: missing"."""
    columns = sorted({k for row in rows for k in row})
    missing = [c for c in needed if c not in columns]
    if missing:
        named = ("column " if len(missing) == 1 else "columns ") + ", ".join(map(repr, missing))
        raise DataError(f"{file_label(path)}: no {named} (columns: {', '.join(columns)}); {fix}")


def load_rows(path: str, *, nonempty: bool = False) -> list[dict[str, Any]]:
    """All rows of a .parquet, .jsonl or .json file, a Hub dataset (hf://datasets/...) or a
    datasets.save_to_disk folder (reinforge.data.hf_datasets) as plain dicts (nested values as
    lists/dicts).

    A .json file may hold a list of objects or JSON lines. Missing or unreadable files and
    rows that are not objects raise DataError naming the file; so does a file with no rows
    when `nonempty`.
    """
    from reinforge.data.hf_datasets import is_dataset_source, load_dataset_rows

    path = os.fspath(path)
    dataset = is_dataset_source(path)
    if not dataset and not os.path.isfile(path):
        raise DataError(f"{path}: file not found")
    ext = os.path.splitext(path)[1].lower()
    try:
        if dataset:
            rows = load_dataset_rows(path)
        elif ext == ".parquet":
            import pyarrow.parquet as pq

            rows = pq.read_table(path).to_pylist()
        elif ext in (".jsonl", ".json"):
            rows = _read_json(path)
        else:
            raise DataError(f"{path}: unsupported file type '{ext}' (use .parquet, .jsonl or .json)")
    except DataError:
        raise
    except Exception as exc:  # pyarrow and the json module raise many types; name the file
        raise DataError(f"{path}: cannot read: {type(exc).__name__}: {exc}") from exc
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{file_label(path)}: row {i}: expected an object, got {type(row).__name__}")
    if nonempty and not rows:
        raise DataError(f"{file_label(path)}: no rows")
    return rows


def _decode_utf8(path: str, raw: bytes) -> str:
    """The file's text; DataError naming the line, column and bytes that are not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DataError(f"{os.path.basename(path)}: line {line}, column {column}: bytes "
                        f"{raw[exc.start:exc.end]!r} are not UTF-8; save the file as UTF-8") from None


def _read_json(path: str) -> list:
    with open(path, "rb") as f:
        text = _decode_utf8(path, f.read())
    if path.lower().endswith(".json") and text.lstrip().startswith("["):
        return json.loads(text)
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DataError(f"{os.path.basename(path)}: line {lineno}: invalid JSON: {exc}") from exc
    return rows


def write_rows(rows: list[dict[str, Any]], path: str) -> str:
    """Write rows to .parquet or .jsonl (by extension), creating parent folders; returns path."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ext = os.path.splitext(path)[1].lower()
    if ext == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif ext in (".jsonl", ".json"):
        with open(path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        raise DataError(f"{path}: unsupported file type '{ext}' (use .parquet or .jsonl)")
    return path
