"""Shared fixtures: tests run on asyncio through anyio's pytest plugin."""

from collections.abc import Iterator

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep a module's tests on one xdist worker (its module fixtures are made once), and every Ray test on one.

    ``make test`` runs the suite on both cores (``-n 2 --dist loadgroup``); one local Ray cluster
    serves every test that needs one, so those share a worker.
    """
    for item in items:
        group = "ray" if "ray_address" in getattr(item, "fixturenames", ()) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """One local Ray cluster for every test that needs one (it takes seconds to start); its GCS address."""
    from metaroles.sharding.ray import ensure_ray

    ray = ensure_ray(num_cpus=4, object_store_memory=200 * 1024 * 1024)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
