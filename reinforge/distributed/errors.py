"""Errors of the distributed backend, importable without Ray (the CLI lists them as user errors)."""


class WorkerDiedError(RuntimeError):
    """A rank of the worker group is gone; the run cannot continue."""
