"""Shared fixtures: tests run on asyncio through anyio's pytest plugin."""

from collections.abc import Iterator

import pytest


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
