"""Roles built when first touched: a cast's places held as one range until a message or a reader reaches one.

A cast of a million users whose names follow a pattern (``names="u{}"``) needs no million objects
before they act: the bus holds the cast's places as one :class:`Population` (its entry at each of
them in the member list is the population itself) and builds the role at a place the first time
something reaches it — a message routed to its name, a reader asking for it by name or place. The
role built is the one an eager hire would have made (``build(i)``, attached at its place with its
ids), so a run is the same whichever roles were built when; a role no message reached has no
state but its cast's, and a checkpoint names it no more than it names any role that did not change.

:class:`Roster` (``Bus.roles``) and :class:`Placed` (``Bus.members`` while some are unbuilt) are the
user's views: looking a role up builds it, iterating builds as it goes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from metaroles.core.exceptions import InvalidValueError
from metaroles.core.schema import checked_name

if TYPE_CHECKING:
    from metaroles.bus.role import Role


class Population:
    """``count`` roles at places ``start`` … ``start + count - 1``, the ``i``-th named ``names.format(i)``.

    Raises:
        InvalidValueError: If ``names`` is not a pattern with one ``{}`` that makes valid role names.
    """

    __slots__ = ("build", "count", "prefix", "start", "suffix", "unbuilt")

    def __init__(self, start: int, count: int, build: Callable[[int], Role], names: str) -> None:
        """Hold the places; see the class docstring."""
        if not isinstance(names, str) or names.count("{}") != 1 or "{" in names.replace("{}", "", 1):
            raise InvalidValueError(
                f"Cast names={names!r} must be a pattern with one '{{}}' where the number goes, e.g. names='u{{}}'"
            )
        checked_name(names.format(0), what="Cast names")
        self.start, self.count, self.build = start, count, build
        self.prefix, _, self.suffix = names.partition("{}")
        self.unbuilt = count

    def name(self, index: int) -> str:
        """The name of the ``index``-th role."""
        return f"{self.prefix}{index}{self.suffix}"

    def index(self, name: str) -> int | None:
        """Which of its roles ``name`` names (``None``: none)."""
        prefix, suffix = self.prefix, self.suffix
        if not name.startswith(prefix) or not name.endswith(suffix):
            return None
        digits = name[len(prefix) : len(name) - len(suffix)]
        if not digits.isdigit() or not digits.isascii() or (digits[0] == "0" and len(digits) > 1):
            return None
        index = int(digits)
        return index if index < self.count else None


def unbuilt(member: object) -> bool:
    """Whether a place's entry is a population's role not built yet (the population itself)."""
    return type(member) is Population


class Placed(Sequence["Role"]):
    """The roles in place order, building each as it is reached (``Bus.members`` while some are unbuilt)."""

    __slots__ = ("_build", "_members")

    def __init__(self, members: list[Any], build: Callable[[int], Role]) -> None:
        """View ``members`` (the address book's list), building a population's place with ``build``."""
        self._members, self._build = members, build

    def __len__(self) -> int:
        """Every place."""
        return len(self._members)

    @overload
    def __getitem__(self, at: int) -> Role: ...
    @overload
    def __getitem__(self, at: slice) -> list[Role]: ...
    def __getitem__(self, at: int | slice) -> Role | list[Role]:
        """The role at a place (built now if it was not), or those of a slice."""
        if isinstance(at, slice):
            return [self[place] for place in range(len(self._members))[at]]
        member = self._members[at]
        return self._build(at % len(self._members)) if type(member) is Population else member

    def __iter__(self) -> Iterator[Role]:
        """Each role in place order, built as it comes."""
        members, build = self._members, self._build
        for place in range(len(members)):
            member = members[place]
            yield build(place) if type(member) is Population else member


class Roster(MutableMapping[str, "Role"]):
    """Name → role in place order, a population's built when looked up (``Bus.roles`` while some are not).

    ``name in roster`` and iterating the names build nothing; ``roster[name]``, ``get`` and the values do.
    Once every role is built the bus holds a plain dict again: lookups cost what a dict's do.
    """

    __slots__ = ("_build", "_members", "built", "populations")

    def __init__(self, members: list[Any], build: Callable[[int], Role], built: dict[str, Role]) -> None:
        """A roster over ``members`` (the address book's list) holding the ``built`` roles; ``build`` builds a place."""
        self._members, self._build = members, build
        self.built = built
        """The roles that exist, by name."""
        self.populations: list[Population] = []

    def place_of(self, name: str) -> int | None:
        """The place of a population's role named ``name``, built or not (``None``: no population names it)."""
        for population in self.populations:
            index = population.index(name)
            if index is not None:
                return population.start + index
        return None

    def __getitem__(self, name: str) -> Role:
        """The role named ``name`` (built now if it was not).

        Raises:
            KeyError: If no role has that name.
        """
        role = self.built.get(name)
        if role is not None:
            return role
        place = self.place_of(name) if self.populations else None
        if place is None:
            raise KeyError(name)
        return self._build(place)

    def get(self, name: str, default: Any = None) -> Any:
        """The role named ``name``, else ``default``."""
        role: Role | None = self.built.get(name)
        if role is None and self.populations and (place := self.place_of(name)) is not None:
            role = self._build(place)
        return default if role is None else role

    def __contains__(self, name: object) -> bool:
        """Whether a role has that name (building none)."""
        if name in self.built:
            return True
        return bool(self.populations) and isinstance(name, str) and self.place_of(name) is not None

    def __len__(self) -> int:
        """How many roles, built or not."""
        return len(self.built) + sum(population.unbuilt for population in self.populations)

    def __iter__(self) -> Iterator[str]:
        """Every name, in place order (building none)."""
        for place, member in enumerate(self._members):
            yield member.name(place - member.start) if type(member) is Population else member.name

    def values(self) -> Iterator[Role]:  # type: ignore[override]
        """Every role in place order, each built as it comes."""
        return iter(Placed(self._members, self._build))

    def __setitem__(self, name: str, role: Role) -> None:
        """Register ``role`` under ``name`` (the bus does, as a role joins or is built)."""
        self.built[name] = role

    def __delitem__(self, name: str) -> None:
        """Forget the built role ``name`` (a population's place stays its own)."""
        del self.built[name]
