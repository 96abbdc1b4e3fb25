"""Archetypes: a population guided by a model at one call per archetype a round, not one per member.

AgentTorch's design for millions of agents: members alike (their persona features, their state)
form an archetype; each round the model is asked once per archetype for a *distribution* over the
structured action, and each member draws its own action from it with its own random stream.

- :func:`distribution_model` turns an action's pydantic model into the model of a distribution over
  it: a choice field (``Literal``, an enum, a bool) becomes the probability of each choice, a number a
  mean and a spread within its bounds, a text a few sample answers (``samples``).
- :func:`examples_model`, the other form (``form="examples"``): a few whole actions, each one a member
  of the group would take — a model is often better at examples than at stating chances.
- :func:`draw` draws one action from a distribution (or among the examples) with a member's random
  stream (``random.Random``).
- :class:`Archetypes` asks the model: one call per archetype and round, shared by every member that
  asks in that round (the first asks, the others wait for its answer). The call's prompt must
  depend on the archetype and the round only (``describe``), never on which member asked first, and it
  is made under the archetype's own name (``archetype KEY``), so the ledger and a cassette record it
  the same in any process and order: a run replays byte for byte and resumes.
- :func:`clusters`: k archetypes of a population by its features (k-means, seeded; scipy).

A scenario says which members stay individual (``promoted``: they ask the model as before).
"""

from __future__ import annotations

import enum
import random
import typing
from collections.abc import Callable, Hashable, Sequence
from typing import Annotated, Any, Generic, Literal, TypeVar, get_args, get_origin

import anyio
from pydantic import BaseModel, Field, create_model

from metaroles.bus.action import complete_structured
from metaroles.core.exceptions import ConfigError
from metaroles.llm.protocol import LLMRequest

if typing.TYPE_CHECKING:
    from metaroles.bus.action import Action

ModelT = TypeVar("ModelT", bound=BaseModel)

SAMPLES = 3
"""Sample answers asked for each text field."""
EXAMPLES = 8
"""Whole actions asked for in the ``examples`` form."""
Form = Literal["chances", "examples"]
"""What an archetype's call answers: a distribution over the action, or examples of it."""

_SAY = {
    "chances": (
        "Answer for the whole group at once: not one member's action but how likely each choice is among "
        "them (probabilities that sum to 1), for a number its mean and spread, and for a text {samples} "
        "different short answers members of the group would give."
    ),
    "examples": (
        "Answer for the whole group at once: {examples} actions, each the one a different member of the group "
        "would take now (members differ, and so do their actions, as often as they would)."
    ),
}


def _choices(annotation: Any) -> list[Any] | None:
    """The choices of a ``Literal``, an enum or a bool field (``None``: not a choice)."""
    if annotation is bool:
        return [True, False]
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [member.value for member in annotation]
    return None


def _bounds(field: Any) -> tuple[float | None, float | None]:
    """A number field's bounds (``ge``/``gt``, ``le``/``lt``)."""
    low = high = None
    for rule in field.metadata:
        low = getattr(rule, "ge", None) if getattr(rule, "ge", None) is not None else low
        low = getattr(rule, "gt", None) if getattr(rule, "gt", None) is not None else low
        high = getattr(rule, "le", None) if getattr(rule, "le", None) is not None else high
        high = getattr(rule, "lt", None) if getattr(rule, "lt", None) is not None else high
    return low, high


def distribution_model(model: type[BaseModel], samples: int = SAMPLES) -> type[BaseModel]:
    """The model of a distribution over ``model``'s instances (see the module).

    Raises:
        ConfigError: If a field is neither a choice, a number nor a text (a list, a nested model).
    """
    fields: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        choices = _choices(annotation)
        if choices is not None:
            props = {str(choice): (float, Field(ge=0, le=1)) for choice in choices}
            fields[name] = (create_model(f"{model.__name__}_{name}_chances", **props), ...)  # type: ignore[call-overload]
        elif annotation in (int, float):
            low, high = _bounds(field)
            fields[f"{name}_mean"] = (float, Field(ge=low, le=high) if low is not None or high is not None else ...)
            fields[f"{name}_spread"] = (float, Field(ge=0))
        elif annotation is str:  # each sample held to the field's own rules (its length, its pattern)
            sample = Annotated[str, *field.metadata] if field.metadata else str
            fields[name] = (list[sample], Field(min_length=1, max_length=samples))  # type: ignore[valid-type]
        else:
            raise ConfigError(
                f"{model.__name__}.{name} is {annotation!r}: an archetype's distribution covers choices "
                "(Literal, enum, bool), numbers and texts; draw the rest from the member's own state"
            )
    return create_model(f"{model.__name__}Distribution", **fields)


def examples_model(model: type[BaseModel], examples: int = EXAMPLES) -> type[BaseModel]:
    """The model of a few of ``model``'s instances, each a member's (``members``)."""
    return create_model(f"{model.__name__}Examples", members=(list[model], Field(min_length=1, max_length=examples)))  # type: ignore[valid-type]


def draw(distribution: BaseModel, model: type[ModelT], rng: random.Random) -> ModelT:
    """One instance of ``model`` drawn from ``distribution`` (:func:`distribution_model`'s) with ``rng``.

    Choices by their probabilities (all zero: evenly), a number from a normal law at its mean and
    spread held within its bounds (rounded for an integer), a text among the samples. From examples
    (:func:`examples_model`'s), one of them.
    """
    members = getattr(distribution, "members", None)
    if isinstance(members, list) and "members" not in model.model_fields:
        return model.model_validate(rng.choice(members).model_dump())
    values: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        choices = _choices(annotation)
        if choices is not None:
            chances = getattr(distribution, name).model_dump()
            weights = [max(0.0, float(chances[str(choice)])) for choice in choices]
            values[name] = rng.choices(choices, weights=weights if sum(weights) > 0 else None)[0]
        elif annotation in (int, float):
            low, high = _bounds(field)
            value = rng.gauss(getattr(distribution, f"{name}_mean"), getattr(distribution, f"{name}_spread"))
            value = min(high, value) if high is not None else value
            value = max(low, value) if low is not None else value
            values[name] = round(value) if annotation is int else round(value, 4)
        else:
            values[name] = rng.choice(getattr(distribution, name))
    return model.model_validate(values)


class Archetypes(Generic[ModelT]):
    """One model call per archetype and round, shared by its members; each member draws its own action.

    Args:
        action: The members' structured action (a pydantic model: choices, numbers, texts).
        describe: The prompt of an archetype's call: what the group is and sees. It may depend on the
            archetype's key and the round, never on which member asks (a run must not depend on it).
        system: The system prompt of every archetype's call (the same bytes: a prefix cache serves it).
        samples: Sample answers asked for each text field (``chances``).
        form: ``chances`` (a distribution over the action) or ``examples`` (``examples`` whole actions).
        answer_tokens: The longest answer a call may give (``None``: the model's own bound); examples of an
            action with a text need room for each.
    """

    def __init__(
        self,
        action: type[ModelT],
        *,
        describe: Callable[[Hashable, int], str],
        system: str = "",
        samples: int = SAMPLES,
        form: Form = "chances",
        examples: int = EXAMPLES,
        answer_tokens: int | None = None,
    ) -> None:
        """Ask for distributions over ``action``; see the class docstring."""
        if form not in _SAY:
            raise ConfigError(f"form={form!r} is not an archetype's answer; use 'chances' or 'examples'")
        self.action = action
        self.model = distribution_model(action, samples) if form == "chances" else examples_model(action, examples)
        self.describe = describe
        self.system = system
        self.samples, self.form, self.examples, self.answer_tokens = samples, form, examples, answer_tokens
        self._asked: dict[tuple[int, Hashable], _Asked] = {}

    def __getstate__(self) -> dict[str, Any]:
        """What a copy in another process needs: not the distribution's model (made anew) nor the calls under way."""
        return {"action": self.action, "describe": self.describe, "system": self.system, "samples": self.samples,
                "form": self.form, "examples": self.examples, "answer_tokens": self.answer_tokens}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Make the copy: its distribution's model again, no call asked yet."""
        action = state.pop("action")
        self.__init__(action, **state)  # type: ignore[misc]

    async def ask(self, asker: Action, key: Hashable, round: int) -> BaseModel:
        """The distribution of archetype ``key`` in ``round``: asked once with ``asker``'s model and ledger.

        Raises:
            LLMOutputInvalid: If the archetype's answer never validates (each member that waited on it too).
        """
        for old in [k for k in self._asked if k[0] < round]:  # a round's answers serve that round only
            del self._asked[old]
        asked = self._asked.get((round, key))
        if asked is None:
            asked = self._asked[(round, key)] = _Asked()
            try:
                asked.answer = await self._call(asker, key, round)
            except Exception as exc:
                asked.error = exc
                raise
            finally:
                asked.done.set()
        else:
            await asked.done.wait()
        if asked.error is not None:
            raise asked.error
        assert asked.answer is not None
        return asked.answer

    async def choose(self, asker: Action, key: Hashable, round: int, rng: random.Random) -> ModelT:
        """A member's action: its archetype's distribution (:meth:`ask`), drawn with the member's ``rng``."""
        return draw(await self.ask(asker, key, round), self.action, rng)

    async def _call(self, asker: Action, key: Hashable, round: int) -> BaseModel:
        prompt = (
            f"{self.describe(key, round)}\n\n{_SAY[self.form].format(samples=self.samples, examples=self.examples)}"
        )
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": prompt})
        request = LLMRequest(
            messages=messages, role=f"archetype {key}", action=asker.name, max_tokens=self.answer_tokens
        )
        return await complete_structured(
            asker.llm, request, self.model, ledger=asker.ledger, retries=asker.max_output_retries
        )


class _Asked:
    """An archetype's call in a round: done when answered (or failed)."""

    __slots__ = ("answer", "done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.answer: BaseModel | None = None
        self.error: BaseException | None = None


def clusters(features: Sequence[Sequence[float]], k: int, *, seed: int = 0) -> list[int]:
    """Each row's archetype among ``k`` (k-means over the features, each scaled to unit spread; seeded).

    Raises:
        ConfigError: If ``k`` is not between 1 and the number of rows.
    """
    import numpy as np
    from scipy.cluster.vq import kmeans2

    rows = len(features)
    if not 1 <= k <= rows:
        raise ConfigError(f"{k} archetypes for {rows} members: choose between 1 and {rows}")
    data = np.asarray(features, dtype=float)
    spread = data.std(axis=0)
    data = (data - data.mean(axis=0)) / np.where(spread > 0, spread, 1.0)
    _, labels = kmeans2(data, k, seed=np.random.default_rng(seed), minit="++")
    return [int(label) for label in labels]
