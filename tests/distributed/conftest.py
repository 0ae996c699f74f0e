"""One local Ray cluster (2 CPUs) for every test of this folder: starting one takes ~10-20 s."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    ray = pytest.importorskip("ray")
    import tests.grad_check

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # The rank processes cannot import the test modules: functions sent to them travel by value
    # (test_ray_group registers itself, under whichever name it was imported).
    ray.cloudpickle.register_pickle_by_value(tests.grad_check)
    yield
    ray.shutdown()
