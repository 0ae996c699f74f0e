"""Exceptions that mean "bad input": the CLI prints them as one line and exits with code 2."""
from __future__ import annotations


def _collect() -> tuple[type[BaseException], ...]:
    from reinforge.config.load import ConfigError
    from reinforge.data import DataError
    from reinforge.models.loading import ModelLoadError

    errors: list[type[BaseException]] = [ConfigError, DataError, ModelLoadError, FloatingPointError, FileNotFoundError]
    from reinforge.rewards import RewardError

    errors.append(RewardError)
    from reinforge.distributed.errors import WorkerDiedError

    errors.append(WorkerDiedError)
    return tuple(errors)


USER_ERRORS = _collect()
