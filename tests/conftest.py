"""Shared fixtures: tests run on asyncio through anyio's pytest plugin."""

import os
from collections.abc import Iterator

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Spread the tests over xdist's workers, keeping together those that share what is costly to make.

    ``make test`` runs the suite on every core (``-n auto --dist loadgroup``). A test that uses a
    module-scoped fixture (a model loaded, a run made once) stays on one worker with the rest of its
    module, so the fixture is made once; every test that needs the one local Ray cluster shares a
    worker; any other test goes wherever a worker is free.
    """
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs if info is not None else {}
        scopes = {d.scope for chain in defs.values() for d in chain if d.baseid}  # ours, not the plugins'

        if "ray_address" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif scopes & {"module", "class", "package", "session"}:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def load_factor() -> float:
    """How many times slower than on a quiet machine a test runs now: the run queue per core, at least 1.

    The larger of the 1- and 5-minute load averages, so a load that has just started or just eased
    still counts.
    """
    one, five, _ = os.getloadavg()
    return max(1.0, max(one, five) / (os.cpu_count() or 1))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """The per-test timeout is a hang detector, not a speed check: it grows with the machine's load.

    ``timeout`` in pyproject (or a test's own ``timeout`` mark) is the budget on a quiet machine;
    on a laptop that runs other things at load 8 on 2 cores each test takes about four times as
    long, and so may its budget. This wrapper runs before pytest-timeout's, which reads the mark.
    """
    marker = item.get_closest_marker("timeout")
    quiet = float(marker.args[0] if marker is not None and marker.args else item.config.getini("timeout") or 0)
    if quiet > 0:
        item.add_marker(pytest.mark.timeout(round(quiet * load_factor())))
    yield


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
