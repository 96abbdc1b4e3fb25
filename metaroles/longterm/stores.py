"""Key-value stores for BrainMemory: a file store (default) and a Redis store that falls back to it.

Values are saved in an envelope with the time they were written (and an expiry), so that when
Redis comes back after an outage the newer of the two copies wins and nothing is lost.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote
from warnings import warn


class KeyValueStore(Protocol):
    """Where BrainMemory is loaded from and dumped to."""

    async def get(self, key: str) -> str | None:
        """The value saved under ``key``, or ``None`` (missing or expired)."""
        ...

    async def set(self, key: str, value: str, *, ttl: float | None = None) -> None:
        """Save ``value`` under ``key``, expiring after ``ttl`` seconds if given."""
        ...


def _envelope(value: str, ttl: float | None, now: float) -> str:
    return json.dumps({"saved_at": now, "expires_at": None if ttl is None else now + ttl, "value": value})


def _open(raw: str | bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        envelope: dict[str, Any] = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return _live(envelope)


def _live(envelope: dict[str, Any]) -> dict[str, Any] | None:
    """``envelope`` unless it has expired."""
    expires = envelope.get("expires_at")
    if expires is not None and expires <= time.time():
        return None
    return envelope


class FileStore:
    """One JSON file per key under ``root``, written atomically (temp file, then rename).

    Args:
        root: The folder; created on first write.
    """

    def __init__(self, root: str | Path) -> None:
        """Use ``root`` for the files."""
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / (quote(key, safe="") + ".json")

    def read(self, key: str) -> dict[str, Any] | None:
        """The live envelope under ``key``, if any.

        A damaged file (cut short, not JSON) is moved aside to ``<file>.damaged`` with a warning
        naming both, so the next write cannot overwrite what may still be recovered from it.
        """
        path = self._path(key)
        if not path.exists():
            return None
        raw = path.read_bytes()
        try:
            envelope = json.loads(raw)
            if not isinstance(envelope, dict) or "value" not in envelope:
                raise ValueError("not a stored entry")
        except ValueError as exc:
            aside = path.with_name(path.name + ".damaged")
            os.replace(path, aside)
            warn(
                f"{path}: damaged entry for key {key!r} ({type(exc).__name__}); moved it to {aside} and "
                "treating the key as empty. Repair that file and move it back to restore it.",
                stacklevel=3,
            )
            return None
        return _live(envelope)

    def write(self, key: str, envelope: str) -> None:
        """Write an envelope atomically."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(envelope)
        os.replace(tmp, self._path(key))

    async def get(self, key: str) -> str | None:
        """The value under ``key``, or ``None``."""
        envelope = self.read(key)
        return None if envelope is None else str(envelope["value"])

    async def set(self, key: str, value: str, *, ttl: float | None = None) -> None:
        """Save ``value`` under ``key``."""
        self.write(key, _envelope(value, ttl, time.time()))


class RedisStore:
    """Redis (redis-py's asyncio client), falling back to a :class:`FileStore` while it is down.

    Reads compare both copies and return the newer; a newer file copy is written back to Redis
    once it answers again.

    Args:
        url: ``redis://host:port/db``.
        fallback: Where to keep values while Redis is unreachable.
        timeout: Seconds before a Redis call counts as failed.
    """

    def __init__(self, url: str, *, fallback: FileStore, timeout: float = 1.0) -> None:
        """Create the client (``redis`` is imported here)."""
        import redis.asyncio

        self.url = url
        self.fallback = fallback
        self._errors = (OSError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
        self._client = redis.asyncio.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)

    async def _redis_get(self, key: str) -> dict[str, Any] | Exception | None:
        try:
            return _open(await self._client.get(key))
        except self._errors as exc:
            return exc

    async def get(self, key: str) -> str | None:
        """The newer of the Redis and the file copies of ``key``."""
        remote = await self._redis_get(key)
        local = self.fallback.read(key)
        if isinstance(remote, Exception):
            warn(f"Redis at {self.url} is unreachable ({remote}); read {key!r} from the file store", stacklevel=2)
            return None if local is None else str(local["value"])
        newest = max((e for e in (remote, local) if e is not None), key=lambda e: e["saved_at"], default=None)
        if newest is not None and newest is local:
            await self._push(key, newest)
        return None if newest is None else str(newest["value"])

    async def _push(self, key: str, envelope: dict[str, Any]) -> None:
        ttl = None if envelope["expires_at"] is None else max(1, int(envelope["expires_at"] - time.time()))
        try:
            await self._client.set(key, json.dumps(envelope), ex=ttl)
        except self._errors:
            return

    async def set(self, key: str, value: str, *, ttl: float | None = None) -> None:
        """Save ``value`` in Redis (with ``ttl``); in the file store if Redis is down."""
        envelope = _envelope(value, ttl, time.time())
        try:
            await self._client.set(key, envelope, ex=None if ttl is None else max(1, int(ttl)))
        except self._errors as exc:
            warn(f"Redis at {self.url} is unreachable ({exc}); kept {key!r} in the file store", stacklevel=2)
            self.fallback.write(key, envelope)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()
