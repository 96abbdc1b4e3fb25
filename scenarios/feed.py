"""A social feed at OASIS's scale: users post, reply, repost, like, dislike, follow; a recommender picks what they see.

The platform is a role on the bus (``Platform``) that keeps the rules as data
(``metaroles.environments.feed.Feed``). Each round it takes the actions the users sent, activates a
share of the users (each with chance ``activation`` × its persona's activity, as OASIS does) and
sends each of them a timeline the recommender picked; the users it activated act in the next round,
one structured action each. A user follows a scripted policy (its stance against the post's, and
the crowd's likes: a herd term) or, for ``llm_share`` of them, asks its model for the action with a
tight schema. Per round, ``metrics.jsonl`` has the actions by kind, polarization (the stances'
variance), the cascades (size, depth, breadth, reach of the seeded posts) and the follower graph's
edges.

The platform's state is rebuilt from what it remembers: its memory holds every action it was
sent, in order, and replaying those turns (the same recommender, the same draws) gives the same
platform, so checkpoints carry messages only, on one process or on shards.

``metaroles run feed --set agents=10000 --rounds 30``; ``--set recommender=similar``; a persona
file: ``--set personas=people.csv`` (columns ``bio, stance, activity, herd``; rows are cycled when
there are more agents). A recommender of one's own: a scenario file whose ``build`` calls this
one's with ``recommender=`` (see ``docs/feed.md``).
"""

from __future__ import annotations

import csv
import itertools
import json
import random
import warnings
from array import array
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from metaroles.environments.feed import KINDS, RECOMMENDERS, Feed, Recommender, generated_follows
from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from metaroles import LLM, Action, ActionResult, Cast, Message, Role, ScenarioPlan, Team, UserRequirement
from metaroles.agents.archetypes import Archetypes, clusters
from metaroles.bus.context_budget import ContextBudget, ContextItem, ContextWindow
from metaroles.core.exceptions import ConfigError, RunError
from metaroles.core.files import NAMES_A_FILE

RUN_DEFAULTS = {"checkpoint_every": 10, "log_turns": False}
"""Large feeds log publishes and deliveries only, and checkpoint every 10 rounds."""

PLATFORM = "Platform"
TO_PLATFORM = frozenset({PLATFORM})
"""Where every user sends its actions: one set for a million users."""
TIMELINE_MAX = 20
"""The longest timeline a user may be shown (a model's answer names a post by its place in it)."""


class SeedPost(BaseModel):
    """A post on the platform before the first round, whose spread ``metrics.jsonl`` follows (``tracked``)."""

    text: str = "BREAKING: the plan passes tonight, cars out of the centre from Monday."
    author: int = Field(default=0, ge=0)
    """Who posts it (user 0 is the most followed)."""
    stance: float = Field(default=0.8, ge=-1, le=1)
    likes: int = Field(default=0, ge=0)
    """Likes it starts with (OASIS's herd-effect setup seeds up- and down-votes)."""
    dislikes: int = Field(default=0, ge=0)


class Config(BaseModel):
    """Options of the feed."""

    agents: int = Field(default=100, ge=2, le=10_000_000)
    """How many users."""
    rounds: int = Field(default=20, ge=1)
    """Rounds: in each, the platform sends timelines and the users it activated the round before act."""
    activation: float = Field(default=0.1, gt=0, le=1)
    """The chance a user of activity 1 is activated in a round."""
    follows: int = Field(default=5, ge=0)
    """Whom each user follows at the start (a heavy-tailed graph: low-numbered users are followed most)."""
    timeline: int = Field(default=5, ge=1, le=TIMELINE_MAX)
    """Posts per timeline."""
    recommender: Literal["mixed", "chronological", "popular", "similar"] = "mixed"
    """What picks the timelines: half followed + half popular, followed only, popular, or persona-similar (Faiss)."""
    llm_share: float = Field(default=0.0, ge=0, le=1)
    """The share of users whose model chooses their actions (the others follow the scripted policy)."""
    personas: Annotated[str | None, NAMES_A_FILE] = None
    """A CSV (header ``bio,stance,activity,herd``), JSON-lines or Parquet file of personas; cycled over the users."""
    topic: str = "the city's plan to ban cars from the centre"
    seed_posts: list[SeedPost] = Field(default_factory=lambda: [SeedPost()])
    """Posts made before the first round; their cascades are tracked."""
    post_rate: float = Field(default=0.2, ge=0, le=1)
    """The chance a scripted user writes a post of its own instead of reacting to one."""
    assimilation: float = Field(default=0.1, ge=0, le=1)
    """How far a post a scripted user approves of moves its stance toward the post's (and away, half as far, if not)."""
    graph_seed: int = 0
    """Seed of the follower graph and of generated personas."""
    archetypes: int = Field(default=0, ge=0)
    """Archetype mode: every activated user is guided by the model through this many archetypes (k-means of the
    personas' stance, activity and herd), the model asked once a round per archetype for a distribution each
    user draws its own action from; 0: off (``llm_share`` says who asks individually)."""
    promoted: int = Field(default=0, ge=0)
    """In archetype mode, the most followed users (the lowest numbers) that ask their model individually."""
    archetype_form: Literal["chances", "examples"] = "chances"
    """What an archetype's call answers: the chances of each action (``chances``), or eight actions members
    would take (``examples``), a user drawing one (``metaroles.agents.archetypes``)."""
    calls_per_round: int = Field(default=0, ge=0)
    """Archetype mode by a budget: the model asked at most this many times a round, the promoted users' calls
    and one per archetype (``archetypes`` = this − ``promoted``); 0: ``archetypes`` says."""
    context_tokens: int = Field(default=600, ge=0)
    """What a model-backed user's prompt carries of its past, in tokens (recent verbatim, older summarised,
    memories recalled: ``metaroles.bus.context_budget``); 0: all of it, growing with the run."""

    @field_validator("personas")
    @classmethod
    def _readable(cls, path: str | None, info: ValidationInfo) -> str | None:
        if path is not None:
            read_personas(Path(path), limit=info.data.get("agents"))  # every row used checked before anything runs
        return path

    @model_serializer(mode="wrap")
    def _archetypes_when_on(self, dump: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Archetype mode's options only when it is on: a feed without it is recorded as before it existed."""
        data: dict[str, Any] = dump(self)
        if not self.archetypes:
            data.pop("archetypes", None)
            data.pop("promoted", None)
        if not self.calls_per_round:
            data.pop("calls_per_round", None)
        if data.get("archetype_form") == "chances":  # the first form: runs made before the choice are as they were
            data.pop("archetype_form")
        return data

    @field_validator("archetypes", "promoted")
    @classmethod
    def _at_most_the_users(cls, count: int, info: ValidationInfo) -> int:
        agents = info.data.get("agents", count)
        if count > agents:
            raise ValueError(f"{info.field_name}={count} for {agents} users: give at most {agents}")
        return count

    @field_validator("calls_per_round")
    @classmethod
    def _a_budget_of_archetypes(cls, budget: int, info: ValidationInfo) -> int:
        agents, promoted, k = info.data.get("agents", 0), info.data.get("promoted", 0), info.data.get("archetypes", 0)
        if budget and not 1 <= budget - promoted <= agents:
            raise ValueError(f"{budget} calls with promoted={promoted} leave {budget - promoted} archetypes for "
                             f"{agents} users: give between {promoted + 1} and {promoted + agents}")  # fmt: skip
        if budget and k not in (0, budget - promoted):
            raise ValueError(f"{budget} calls with promoted={promoted} make {budget - promoted} archetypes, not "
                             f"archetypes={k}: give one of the two")  # fmt: skip
        return budget

    @model_validator(mode="after")
    def _archetypes_by_budget(self) -> Config:
        """``calls_per_round``: as many archetypes as the budget leaves beside the promoted users."""
        if self.calls_per_round:
            self.archetypes = self.calls_per_round - self.promoted
        return self

    @field_validator("context_tokens")
    @classmethod
    def _a_budget_that_holds_something(cls, tokens: int) -> int:
        if 0 < tokens < 64:
            raise ValueError(f"a context budget of {tokens} tokens holds nothing; give 64 or more, or 0 for none")
        return tokens

    @field_validator("seed_posts")
    @classmethod
    def _authors_exist(cls, posts: list[SeedPost], info: ValidationInfo) -> list[SeedPost]:
        agents = info.data.get("agents", 2)
        for post in posts:
            if post.author >= agents:
                raise ValueError(
                    f"a seed post's author {post.author} is not one of the {agents} users (0 to {agents - 1})"
                )
        return posts


# -- personas -----------------------------------------------------------------------------------------


class Persona(BaseModel):
    """Who a user is: what its model is told, where it stands, how often and how much it follows the crowd."""

    bio: str = Field(min_length=1, max_length=2000)
    stance: float = Field(ge=-1, le=1)
    """On the topic: -1 fully against, 1 fully for."""
    activity: float = Field(default=1.0, gt=0, le=1)
    """Its share of the activation chance."""
    herd: float = Field(default=0.5, ge=0, le=1)
    """How much the crowd's likes and dislikes sway it."""


_ROW = "each row needs bio, stance in [-1, 1], and optionally activity in (0, 1] and herd in [0, 1]"


LINE_BYTES = 64 * 1024
"""The longest line a personas file may have (a bio is at most 2,000 characters)."""


def read_personas(path: Path, *, limit: int | None = None) -> list[Persona]:
    """The personas of a CSV, JSON-lines or Parquet file, every row read checked.

    The file is streamed: only its first ``limit`` rows are read (the users a run has; the rows are
    cycled over them, so later ones would never be used), a line at a time, each at most
    :data:`LINE_BYTES` long (a Parquet file: a batch of rows at a time, only the persona's columns),
    so a file of any size is read in memory bounded by the rows used. A UTF-8 byte-order mark
    (Excel's "CSV UTF-8") is skipped.

    Raises:
        ConfigError: Naming the file, the line and what is wrong with it (nothing is run); for a
            path that is not a regular file (a FIFO, a device), for a line too long, or text that is not UTF-8.
    """
    personas: list[Persona] = []
    try:
        if not path.is_file():
            raise ConfigError(
                f"personas file {str(path)!r} is not a regular file; give a CSV, JSON-lines or Parquet file"
            )
        with path.open("rb") as file:
            if path.suffix == ".parquet":
                rows = _parquet_rows(path, file)
            else:
                lines = _lines(path, file)
                rows = _json_rows(lines) if path.suffix in (".jsonl", ".json") else _csv_rows(path, lines)
            for line, row in rows:
                if limit is not None and len(personas) >= limit:
                    break
                personas.append(_persona(path, line, row))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"personas file {str(path)!r} cannot be read ({exc}); give a CSV or JSON-lines file in UTF-8"
        ) from None
    if not personas:
        raise ConfigError(f"personas file {str(path)!r} has no rows; give one persona per line after the header")
    return personas


def _persona(path: Path, line: int, row: Any) -> Persona:
    if isinstance(row, str):
        raise ConfigError(f"{path}:{line}: {row}; {_ROW}")
    try:
        return Persona.model_validate(row)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"]) or "row"
        raise ConfigError(f"{path}:{line}: {where}={error.get('input')!r}: {error['msg']}; {_ROW}") from None


def _lines(path: Path, file: Any) -> Iterator[str]:
    """The file's lines as text (a leading byte-order mark dropped), each checked against :data:`LINE_BYTES`."""
    for number in itertools.count(1):
        raw = file.readline(LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > LINE_BYTES:
            raise ConfigError(
                f"{path}:{number}: a line longer than {LINE_BYTES // 1024} KiB; a persona's bio is at most "
                "2,000 characters: is this a personas file?"
            )
        text = raw.decode("utf-8")
        yield text.removeprefix("\ufeff") if number == 1 else text


def _csv_rows(path: Path, lines: Iterator[str]) -> Iterator[tuple[int, Any]]:
    reader = csv.DictReader(lines)
    try:
        for row in reader:
            extra = row.pop(None, None)
            if extra:
                yield reader.line_num, f"{len(extra)} more value(s) than the header has columns"
            else:
                yield reader.line_num, {k: v for k, v in row.items() if v not in ("", None)}
    except csv.Error as exc:
        raise ConfigError(f"{path}:{reader.line_num}: not CSV ({exc}); {_ROW}") from None


PARQUET_BATCH = 4096
"""Rows of a Parquet personas file read at a time."""


def _parquet_rows(path: Path, file: Any) -> Iterator[tuple[int, Any]]:
    """A Parquet file's rows (the persona's columns only), a batch at a time; the row's number as its line."""
    import pyarrow as pa  # the analysis extra: only a Parquet file needs it
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(file)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ConfigError(f"personas file {str(path)!r} is not Parquet ({exc}); {_ROW}") from None
    columns = [name for name in Persona.model_fields if name in parquet.schema_arrow.names]
    line = 0
    for batch in parquet.iter_batches(batch_size=PARQUET_BATCH, columns=columns):
        for row in batch.to_pylist():
            line += 1
            yield line, {k: v for k, v in row.items() if v is not None}


def _json_rows(lines: Iterator[str]) -> Iterator[tuple[int, Any]]:
    for line, raw in enumerate(lines, start=1):
        if raw.strip():
            try:
                yield line, json.loads(raw)
            except json.JSONDecodeError as exc:
                yield line, f"not JSON ({exc.msg})"
            except RecursionError:
                yield line, "JSON nested too deeply for a persona"


_MASK = (1 << 64) - 1


def unit(seed: int, i: int, salt: int) -> float:
    """A number in [0, 1) that is a function of its arguments alone (splitmix64): a million a second, no state."""
    z = (seed * 0x9E3779B97F4A7C15 + i * 0xBF58476D1CE4E5B9 + salt * 0x94D049BB133111EB) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return ((z ^ (z >> 31)) >> 11) / (1 << 53)


_JOBS = ("teacher", "nurse", "cyclist", "shop owner", "student", "taxi driver", "engineer", "retiree", "parent")
_PLACES = ("the old town", "the suburbs", "the harbour", "the university quarter", "a village nearby")


class Personas:
    """Each user's persona: a file's rows, cycled, or one generated from the user's number and the seed.

    Picklable and small: a shard makes the personas of its users itself.
    """

    def __init__(self, config: Config) -> None:
        """The personas ``config`` names (its file's rows) or generates."""
        self.seed = config.graph_seed
        self.rows = read_personas(Path(config.personas), limit=config.agents) if config.personas else None

    def __getitem__(self, i: int) -> Persona:
        """The ``i``-th user's persona."""
        if self.rows is not None:
            return self.rows[i % len(self.rows)]
        return Persona(bio=self.bio(i), stance=self.stance(i), activity=self.activity(i), herd=self.herd(i))

    def stance(self, i: int) -> float:
        """Where user ``i`` stands at the start: two camps around ±0.5 and a neutral middle."""
        if self.rows is not None:
            return self.rows[i % len(self.rows)].stance
        return round(2 * unit(self.seed, i, 1) - 1, 3)

    def activity(self, i: int) -> float:
        """How active user ``i`` is: most users rarely, a few often (a heavy tail)."""
        if self.rows is not None:
            return self.rows[i % len(self.rows)].activity
        return round(0.1 + 0.9 * unit(self.seed, i, 2) ** 2, 3)

    def herd(self, i: int) -> float:
        """How much the crowd sways user ``i``."""
        if self.rows is not None:
            return self.rows[i % len(self.rows)].herd
        return round(unit(self.seed, i, 3), 3)

    def bio(self, i: int) -> str:
        """User ``i``'s bio (what its model is told it is)."""
        if self.rows is not None:
            return self.rows[i % len(self.rows)].bio
        job = _JOBS[int(unit(self.seed, i, 4) * len(_JOBS))]
        place = _PLACES[int(unit(self.seed, i, 5) * len(_PLACES))]
        return f"A {20 + int(unit(self.seed, i, 6) * 60)}-year-old {job} from {place}."


# -- what travels ---------------------------------------------------------------------------------------


class Shown(BaseModel):
    """A post on a timeline, as the user sees it."""

    id: int
    author: int
    text: str
    stance: float
    """The stance it expresses (the scripted policy reads it; a model reads the text)."""
    likes: int = 0
    dislikes: int = 0
    reposts: int = 0
    replies: int = 0


class Timeline(BaseModel):
    """What the platform shows a user in a round."""

    round: int
    posts: list[Shown]


class FeedAct(BaseModel):
    """A user's action, as the platform receives it."""

    action: str
    post: int | None = None
    """The post it acts on (for ``follow``: whose author to follow); ``None`` for a post of its own or nothing."""
    text: str = ""
    stance: float = Field(default=0.0, ge=-1, le=1)
    """The user's stance after acting."""


class FeedChoice(BaseModel):
    """A model's answer: one action on the timeline it was shown."""

    action: Literal["post", "reply", "repost", "like", "dislike", "follow", "nothing"]
    post: int = Field(default=0, ge=0, le=TIMELINE_MAX)
    """The number of the post on the timeline (1 is the first); 0 when the action needs none."""
    text: str = Field(default="", max_length=280)
    """A new post's or a reply's text."""
    stance: float = Field(default=0.0, ge=-1, le=1)
    """Your stance on the topic now, from -1 (against) to 1 (for)."""


# -- the users ----------------------------------------------------------------------------------------


class Recommend(Action):
    """The platform's timelines (its ``cause_by``; the platform sends them, no model)."""


class Refresh(Action):
    """The platform's own note of a round it ran, sent to itself: the next round starts from it."""


_WORDS = {
    -2: ("This plan is a disaster", "Stop the ban now", "Nobody asked for this"),
    -1: ("I have doubts about", "Not convinced by", "Too fast:"),
    0: ("Still making up my mind on", "Any facts on", "Both sides have a point on"),
    1: ("Good step:", "Quietly hopeful about", "Worth trying:"),
    2: ("Finally! Full support for", "Best news this year:", "Cleaner air at last:"),
}


def post_text(topic: str, stance: float, pick: float) -> str:
    """A post's text for ``stance`` on ``topic`` (``pick`` in [0, 1) chooses the wording)."""
    bucket = max(-2, min(2, round(stance * 2.4)))
    words = _WORDS[bucket]
    return f"{words[int(pick * len(words))]} {topic}."


def scripted(agent: Agent, timeline: Timeline, draw: Any) -> FeedAct:
    """The scripted policy: post now and then; else weigh a post by agreement and the crowd, and react.

    Approval = agreement (1 − |own − post| / 2) + herd × the crowd's verdict (likes − dislikes and
    reposts, squashed into [-0.5, 0.5]). High approval: repost, like or follow its author, and move
    toward it; low: dislike or reply against it, and move away, half as far; between: nothing.
    """
    stance, config = agent.stance, agent.config
    if not timeline.posts or draw() < config.post_rate:
        mine = max(-1.0, min(1.0, stance + (draw() - 0.5) * 0.2))
        return FeedAct(action="post", text=post_text(config.topic, mine, draw()), stance=round(mine, 4))
    post = timeline.posts[int(draw() * len(timeline.posts))]
    net = post.likes - post.dislikes + 2 * post.reposts
    crowd = 0.5 * net / (abs(net) + 5)
    approval = 1 - abs(stance - post.stance) / 2 + agent.herd_weight * crowd
    r = draw()
    if approval > 0.8:
        kind = "repost" if r < 0.25 else "like" if r < 0.8 else "follow"
        moved = stance + config.assimilation * (post.stance - stance)
    elif approval < 0.45:
        kind = "dislike" if r < 0.6 else "reply"
        moved = stance - config.assimilation / 2 * (post.stance - stance)
    else:
        kind, moved = ("like" if r < 0.2 else "nothing"), stance
    moved = round(max(-1.0, min(1.0, moved)), 4)
    text = f"@u{post.author} {post_text(config.topic, moved, draw())}" if kind == "reply" else ""
    return FeedAct(action=kind, post=post.id if kind != "nothing" else None, text=text, stance=moved)


class Browse(Action):
    """Read the timeline, choose one action by the scripted policy."""

    def __init__(self, agent: Agent) -> None:
        """Act for ``agent``."""
        super().__init__()
        self.agent = agent

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """The scripted action on this round's timeline (its draws seeded by the timeline's id)."""
        timeline, seed = self.agent.timeline()
        return scripted(self.agent, timeline, random.Random(seed).random)


FEED = (
    "You are a user of a social media platform. Each time you open it you see a few posts. Choose ONE "
    "action: post (write a new post), reply (to a post), repost, like, dislike, follow (the author of a "
    "post), or nothing. Name the post by its number on your timeline (0 when the action needs none). "
    'Answer with JSON only: {"action": ..., "post": number, "text": "your words, for post or reply", '
    '"stance": your view on the topic now, from -1 (against) to 1 (for)}.'
)
"""What every model-backed user is told first, byte for byte the same: an engine's prefix cache serves it."""


class BrowseWithModel(Browse):
    """Ask the model for the action (a tight schema), then name the post it chose by its id."""

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """The model's action on this round's timeline."""
        agent = self.agent
        timeline, _ = agent.timeline()
        lines = [
            f"{n}. @u{p.author}: {p.text} ({p.likes} likes, {p.dislikes} dislikes, {p.reposts} reposts)"
            for n, p in enumerate(timeline.posts, start=1)
        ]
        prompt = (
            f"You are {agent.persona.bio} The topic: {agent.config.topic}. Your stance now: {agent.stance:+.2f}.\n"
            f"Your timeline:\n{chr(10).join(lines) or '(empty)'}\nWhat do you do?"
        )
        past = agent.past() if isinstance(agent, ModelAgent) else []
        if isinstance(agent, ModelAgent) and past:  # a first timeline needs no window: a million users make none
            remembered = await agent.window.compose(past, query=query_of(timeline), round=timeline.round, asker=self)
            prompt = f"What you remember of the feed:\n{remembered}\n\n{prompt}"
        choice = await self.aask(prompt, system_msgs=[FEED], output_model=FeedChoice)
        chosen = timeline.posts[choice.post - 1].id if 0 < choice.post <= len(timeline.posts) else None
        return FeedAct(action=choice.action, post=chosen, text=choice.text, stance=choice.stance)


class ArchetypeChoice(BaseModel):
    """What a user of an archetype does; the post it acts on it picks on its own timeline."""

    action: Literal["post", "reply", "repost", "like", "dislike", "follow", "nothing"]
    text: str = Field(default="", max_length=280)
    """A new post's or a reply's text."""
    stance: float = Field(default=0.0, ge=-1, le=1)
    """The stance the group's members lean to now, from -1 (against) to 1 (for)."""


FEED_ARCHETYPE = (
    "You speak for a group of users of a social media platform, people alike in what they think and how they "
    "use it. Each time they open it they see a few posts and do ONE thing: post (write a new post), reply (to "
    "a post), repost, like, dislike, follow (the author of a post), or nothing."
)
"""What every archetype's call is told first, byte for byte the same."""


class BrowseByArchetype(Browse):
    """Draw the action from the user's archetype's distribution; pick the post by the user's own stance."""

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """The drawn action on this round's timeline (the draws seeded by the timeline's id)."""
        agent = self.agent
        timeline, seed = agent.timeline()
        rng = random.Random(f"archetype:{seed}")
        choice = await agent.cast.archetypes.choose(self, agent.archetype, timeline.round, rng)
        stance = agent.stance
        moved = round(max(-1.0, min(1.0, stance + agent.config.assimilation * (choice.stance - stance))), 4)
        kind, post = choice.action, None
        if kind not in ("post", "nothing"):
            if not timeline.posts:
                kind = "nothing"
            else:  # the post it agrees with most (like, repost, follow) or least (dislike, reply)
                closest = sorted(timeline.posts, key=lambda p: (abs(p.stance - stance), p.id))
                post = (closest[-1] if kind in ("dislike", "reply") else closest[0]).id
        return FeedAct(action=kind, post=post, text=choice.text if kind in ("post", "reply") else "", stance=moved)


BROWSE, BROWSE_WITH_MODEL = Browse.action_id(), BrowseWithModel.action_id()
BROWSE_BY_ARCHETYPE = BrowseByArchetype.action_id()


class Agent(Role):
    """A user of the feed: acts on the timeline the platform sends it, one action a round.

    Its stance is what it last said (its persona's before that): all its state is on the bus.
    """

    def __init__(self, *, number: int, cast: Agents, llm_backed: bool, archetypal: bool = False) -> None:
        """The ``number``-th user of ``cast``; whether its model chooses, or its archetype's (``archetypal``)."""
        self.number = number
        self.cast = cast
        action = (BrowseByArchetype if archetypal else BrowseWithModel if llm_backed else Browse)(self)
        super().__init__(name=f"u{number}", actions=[action], watch=[Recommend], send_to=TO_PLATFORM)

    @property
    def profile(self) -> str:
        """The persona's bio (an interview's system prompt says who the user is)."""
        return self.personas.bio(self.number)

    @profile.setter
    def profile(self, value: str) -> None:
        """The persona decides the profile; what a role's constructor sets is not kept."""

    @property
    def config(self) -> Config:
        """The feed's options."""
        return self.cast.config

    @property
    def personas(self) -> Personas:
        """Every user's persona."""
        return self.cast.personas

    def _get_prefix(self) -> str:
        """No prefix of the role's own: the feed's prompt says who the user is (the shared prefix comes first)."""
        return ""

    @property
    def persona(self) -> Persona:
        """Who the user is."""
        return self.personas[self.number]

    @property
    def archetype(self) -> int:
        """The user's archetype (archetype mode): its cluster among the personas."""
        return self.cast.labels[self.number]

    @property
    def herd_weight(self) -> float:
        """How much the crowd sways the user."""
        return self.personas.herd(self.number)

    @property
    def stance(self) -> float:
        """The stance of the user's last action, else its persona's."""
        for message in reversed(self.rc.memory.get_by_action(self.actions[0].cause_by)):
            if message.sent_from == self.name and isinstance(message.instruct_content, FeedAct):
                return message.instruct_content.stance
        return self.personas.stance(self.number)

    def timeline(self) -> tuple[Timeline, str]:
        """This round's timeline and the id of the message that brought it."""
        for message in reversed(self.rc.news):
            if isinstance(message.instruct_content, Timeline):
                return message.instruct_content, message.id
        return Timeline(round=0, posts=[]), self.name


def query_of(timeline: Timeline) -> str:
    """What a timeline is about, to recall memories by."""
    return " ".join(post.text for post in timeline.posts)


def remembered(message: Message, round: int) -> ContextItem | None:
    """A user's memory of a timeline or of its own action, as its prompt shows it (``None``: neither)."""
    shown = message.instruct_content
    if isinstance(shown, Timeline):
        seen = "; ".join(f"#{p.id} @u{p.author}: {p.text} ({p.likes} likes)" for p in shown.posts) or "nothing"
        return ContextItem(id=message.id, round=shown.round, text=f"Round {shown.round}, you saw: {seen}")
    if isinstance(shown, FeedAct):
        target = f" #{shown.post}" if shown.post is not None else ""
        said = f": {shown.text}" if shown.text else ""
        return ContextItem(id=message.id, round=round, text=f"Round {round}, you did: {shown.action}{target}{said}")
    return None


class ModelAgent(Agent):
    """A user whose model chooses, shown what it remembers of the feed within its context budget.

    Its window (``metaroles.bus.context_budget``: recent items verbatim, older ones summarised, memories
    recalled) is made when first used and saved with it.
    """

    _window: ContextWindow | None = None

    @property
    def window(self) -> ContextWindow:
        """What its prompts carry of its past."""
        if self._window is None:
            tokens = self.config.context_tokens
            self._window = ContextWindow(ContextBudget(tokens=tokens) if tokens else None)
        return self._window

    _past: tuple[int, list[ContextItem]] | None = None

    def past(self) -> list[ContextItem]:
        """What it saw and did before this round, oldest first (rendered once each: the memory only grows)."""
        memory, now = self.rc.memory, {m.id for m in self.rc.news}
        done, items = self._past if self._past is not None and self._past[0] <= len(memory) else (0, [])
        newer = memory.get(len(memory) - done) if len(memory) > done else []
        round = items[-1].round if items else 0
        for message in newer:
            if message.id in now:
                break  # this round's news, and what follows it, are not the past yet
            if isinstance(message.instruct_content, Timeline):
                round = message.instruct_content.round
            item = remembered(message, round)
            if item is not None:
                items.append(item)
            done += 1
        if items:  # nothing to keep for a user that has only its first timeline
            self._past = (done, items)
        return items

    def extra_state(self) -> dict[str, Any] | None:
        """The context window, once it has folded something."""
        return None if self._window is None else self._window.state()

    @property
    def keeps_extra_state(self) -> bool:
        """Only once its window has folded something: until then it is checkpointed as a plain user."""
        return self._window is not None and bool(self._window.compactions)

    def load_extra_state(self, data: dict[str, Any]) -> None:
        """Restore the context window."""
        self.window.load(data)


class Agents:
    """The users, the ``i``-th built from the config alone (a :class:`Cast`: shards build their own)."""

    def __init__(self, config: Config, personas: Personas) -> None:
        """Build users by ``config`` with these ``personas`` (in archetype mode, their archetypes first)."""
        self.config = config
        self.personas = personas
        self.labels = array("i")
        self.centres: list[tuple[float, float, float]] = []
        if config.archetypes:
            features = [(personas.stance(i), personas.activity(i), personas.herd(i)) for i in range(config.agents)]
            self.labels = array("i", clusters(features, config.archetypes, seed=config.graph_seed))
            sums = [[0.0, 0.0, 0.0] for _ in range(config.archetypes)]
            counts = [0] * config.archetypes
            for label, row in zip(self.labels, features, strict=True):
                counts[label] += 1
                sums[label] = [a + b for a, b in zip(sums[label], row, strict=True)]
            self.centres = [
                (s[0] / max(n, 1), s[1] / max(n, 1), s[2] / max(n, 1)) for s, n in zip(sums, counts, strict=True)
            ]
        room = 8 * 110 if config.archetype_form == "examples" else None  # eight actions, a post's text in each
        self.archetypes = Archetypes(ArchetypeChoice, describe=self.describe, system=FEED_ARCHETYPE,
                                     form=config.archetype_form, answer_tokens=room)  # fmt: skip
        """The archetypes' calls (archetype mode), shared by the users of this process."""

    def __call__(self, i: int) -> Agent:
        """The ``i``-th user: archetypal in archetype mode (but the promoted), else model-backed under ``llm_share``."""
        config = self.config
        if config.archetypes:
            backed = i < config.promoted
            return (ModelAgent if backed else Agent)(number=i, cast=self, llm_backed=backed, archetypal=not backed)
        backed = unit(config.graph_seed, i, 7) < config.llm_share
        return (ModelAgent if backed else Agent)(number=i, cast=self, llm_backed=backed)

    def describe(self, key: Hashable, round: int) -> str:
        """Archetype ``key``'s prompt in ``round``: who its users are (their centre) and the topic."""
        stance, activity, herd = self.centres[int(cast(int, key))]
        return (
            f"The group: users whose stance on {self.config.topic} is about {stance:+.2f} (from -1, against, to 1, "
            f"for), who open the platform {'often' if activity > 0.5 else 'now and then'} and whom the crowd sways "
            f"{'much' if herd > 0.5 else 'little'}. It is round {round}. What do they do, and where does their "
            "stance go?"
        )


# -- the platform -------------------------------------------------------------------------------------


class FeedWarning(UserWarning):
    """A user's action the platform refused (the first is said; all are counted in ``metrics.jsonl``)."""


class Platform(Role):
    """The platform: applies the users' actions, activates users, sends them timelines; the rules are a :class:`Feed`.

    The feed is rebuilt from the platform's memory (its turns replayed) whenever it does not match
    it — after a restore, on a shard — so the platform's state is the bus's.
    """

    def __init__(self, config: Config, personas: Personas, recommender: Recommender | None = None) -> None:
        """The platform of ``config``'s users; ``recommender`` replaces the one ``config`` names."""
        self.config = config
        self.personas = personas
        self.recommender = recommender
        self.feed: Feed | None = None
        self.turns = 0
        """Turns the feed reflects (each is a round)."""
        self.applied = 0
        """Remembered messages the feed reflects."""
        self.warned = False
        """Whether a refused action was said (the first is; all are counted)."""
        watch = [UserRequirement, Refresh, Browse, BrowseWithModel, *([BrowseByArchetype] if config.archetypes else [])]
        super().__init__(name=PLATFORM, actions=[Refresh], watch=watch)

    def new_feed(self) -> Feed:
        """The platform before any round: its users, the follower graph, the seeded posts."""
        config, personas = self.config, self.personas
        n = config.agents
        feed = Feed(
            stances=[personas.stance(i) for i in range(n)],
            activity=[personas.activity(i) for i in range(n)],
            follows=generated_follows(n, config.follows, str(config.graph_seed)),
            activation=config.activation,
            recommend=self.recommender or RECOMMENDERS[config.recommender],
            timeline=config.timeline,
            key=self.ids.key if self.ids is not None else "",
            interests=personas.bio,
        )
        for seeded in config.seed_posts:
            post = feed.publish(seeded.author, seeded.text, seeded.stance, round=0)
            post.likes, post.dislikes = seeded.likes, seeded.dislikes
            feed.track(post.id)
        return feed

    def current_feed(self) -> Feed:
        """The feed as the memory says, before this turn's news (rebuilt by replaying the turns if it differs)."""
        before = len(self.rc.memory) - self.rc.remembered
        if self.feed is None or self.applied != before:
            self.feed, self.turns = self.new_feed(), 0
            turn: list[Message] = []
            for message in self.rc.memory.get()[:before]:
                if message.cause_by == REFRESH and turn:
                    self.play(self.feed, turn, live=False)
                    turn = []
                turn.append(message)
            if turn:
                self.play(self.feed, turn, live=False)
            self.feed.metrics()  # the replayed rounds' counts are not this round's
        return self.feed

    def play(self, feed: Feed, news: Sequence[Message], *, live: bool) -> list[tuple[int, list[int]]]:
        """One turn: apply the actions in ``news``, activate this round's users, pick their timelines."""
        self.turns += 1
        for message in news:
            if message.cause_by in (BROWSE, BROWSE_WITH_MODEL, BROWSE_BY_ARCHETYPE):
                self.apply(feed, message, live=live)
        users = feed.activate(self.turns)
        feed.counts["activated"] += len(users)
        try:
            shown = feed.timelines(users, self.turns)
        except Exception as exc:
            raise RunError(
                f"the feed's recommender failed in round {self.turns}: {type(exc).__name__}: {exc}; fix the "
                "recommender, then resume the run"
            ) from exc
        return list(zip(users, shown, strict=True))

    def apply(self, feed: Feed, message: Message, *, live: bool) -> None:
        """Apply one user's action; a refused one is counted (and said once per kind when live)."""
        act = message.instruct_content
        user = int(message.sent_from[1:]) if message.sent_from[1:].isdigit() else -1
        if isinstance(act, FeedAct) and 0 <= user < feed.users:
            why = feed.apply(user, act.action, post=act.post, text=act.text, stance=act.stance, round=self.turns)
        else:
            feed.counts["invalid"] += 1
            error = message.metadata.get("error") if message.has_metadata else None
            raw = error.get("raw") if isinstance(error, dict) else message.content
            why = f"unknown action: {str(raw)[:80]!r} is not one of {', '.join(KINDS)}"
        if why is not None and live and not self.warned:
            self.warned = True
            said = f"{message.sent_from}'s action refused: {why}; refusals are counted in metrics.jsonl (invalid)"
            warnings.warn(FeedWarning(said), stacklevel=2)

    async def _act(self) -> Message | None:
        """Apply the news, send this round's timelines, and note the round (to itself)."""
        feed = self.current_feed()
        seen: dict[int, Shown] = {}  # a post as it stands this round, one object for every timeline that shows it
        for user, posts in self.play(feed, self.rc.news, live=True):
            for n in posts:
                if n not in seen:
                    seen[n] = Shown.model_validate(feed.posts[n], from_attributes=True)
            shown = [seen[n] for n in posts]
            timeline = Timeline(round=self.turns, posts=shown)
            content = " ".join(f"#{p.id}" for p in shown) or "(empty)"
            self.publish_message(Message(content, instruct_content=timeline, cause_by=Recommend, send_to={f"u{user}"}))
        self.applied = len(self.rc.memory)
        self.last_metrics = feed.metrics()
        return Message(f"round {self.turns}", cause_by=Refresh, send_to={PLATFORM})


REFRESH = Refresh.action_id()


def build(config: Config, llm: LLM, *, recommender: Recommender | None = None) -> ScenarioPlan:
    """The platform first, then the users; the idea starts the platform's first round.

    ``recommender``: a function of one's own, ``recommend(feed, users, k)`` → post ids per user.
    """
    personas = Personas(config)
    team = Team(llm=llm)
    team.hire([Platform(config, personas, recommender)])
    team.hire(Cast(config.agents, Agents(config, personas), names="u{}"))
    return ScenarioPlan(team=team, idea=f"Open the feed on {config.topic}.", send_to=PLATFORM, n_round=config.rounds)


def shard_by(role: Role, shards: int) -> int | None:
    """Users in blocks of consecutive numbers; the platform on the first shard.

    Raises:
        ConfigError: In archetype mode: each shard would ask every archetype (one process runs a million users).
    """
    if isinstance(role, Agent) and role.config.archetypes:
        raise ConfigError(
            f"archetypes={role.config.archetypes} runs in one process: each shard would ask the model for every "
            "archetype; drop --shards (a million archetypal users fit one process)"
        )
    if isinstance(role, Agent):
        return role.number * shards // role.config.agents
    return 0


def platform_metrics(roles: Sequence[Role]) -> dict[str, Any] | None:
    """The platform's measures of the round just run, if it is among ``roles`` (a part of :func:`round_metrics`)."""
    for role in roles:
        if isinstance(role, Platform):  # before its first turn: the feed as it starts (every row has every key)
            measured = getattr(role, "last_metrics", None)
            return measured if measured is not None else role.current_feed().metrics()
    return None


METRIC_PARTS = (platform_metrics,)
"""On shards, the shard holding the platform measures; :func:`round_metrics` takes its part."""


def round_metrics(team: Team) -> dict[str, Any]:
    """The round's actions by kind, polarization, cascades and follower-graph growth."""
    parts = [part for part in team.gathered(platform_metrics) if part is not None]
    return parts[0] if parts else {}


def summary(run_dir: Path) -> dict[str, Any]:
    """Where the feed ended: polarization, the largest cascade, the seeded posts' spread (a sweep's columns)."""
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    last = json.loads(lines[-1]) if lines else {}
    spread: dict[str, Any] = next(iter(last.get("tracked", {}).values()), {})
    return {
        "polarization": last.get("polarization"),
        "extremity": last.get("extremity"),
        "largest_cascade": last.get("largest_cascade"),
        "seed_reach": spread.get("reach"),
        "seed_size": spread.get("size"),
        "follow_edges": last.get("follow_edges"),
    }


__all__ = ["KINDS", "Agent", "Config", "FeedAct", "Persona", "Platform", "build"]
