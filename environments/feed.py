"""A social platform's rules as data: posts, replies, reposts, likes, follows and the timelines a recommender picks.

``Feed`` holds the platform (OASIS's Twitter/Reddit shape) and never calls a model: who follows whom
(a generated graph plus the follows made during the run), every post with its counts, what each
user has been shown, the users' current stances, and each cascade (a post with the replies and
reposts that descend from it: size, depth, breadth by depth). It applies one user's action at a
time (:meth:`Feed.apply`, which answers why an action is refused), picks the users a round
activates (:meth:`Feed.activate`) and their timelines (:meth:`Feed.timelines`, through a
recommender), and measures a round (:meth:`Feed.metrics`).

A recommender is ``recommend(feed, users, k) -> [post ids per user]``: the built-ins are
:func:`chronological` (posts of the people one follows, newest first), :func:`popular` (likes,
reposts and replies, decaying with age), :func:`similar` (nearest posts to a user's persona by
embedding, through a Faiss index) and :func:`mixed` (half in-network, half popular; the default).
A user's own function takes the same arguments; posts already shown to a user and the user's own
are left out of any timeline, whoever picks it.

Every choice is a function of the run's key and the round (``random.Random`` seeded with a
string), never of the process: the platform gives the same timelines in any process.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from metaroles.core.exceptions import InvalidValueError

Kind = Literal["post", "reply", "repost", "like", "dislike", "follow", "nothing"]
KINDS: tuple[Kind, ...] = ("post", "reply", "repost", "like", "dislike", "follow", "nothing")
"""The actions a user may take; one per activation."""
ON_A_POST = frozenset({"reply", "repost", "like", "dislike", "follow"})
"""The actions that name a post (to follow is to follow its author)."""

Recommender = Callable[["Feed", Sequence[int], int], Sequence[Sequence[int]]]
"""Picks each user's timeline: ``recommend(feed, users, k)`` → post ids, at most ``k`` per user, in order."""


@dataclass(slots=True)
class Post:
    """A post, reply or repost on the platform, and what it has drawn so far."""

    id: int
    """Its number, from 0 in the order posted."""
    author: int
    """The user who wrote it."""
    kind: Literal["post", "reply", "repost"]
    round: int
    """The round it was posted in."""
    stance: float
    """The stance it expresses, in [-1, 1]."""
    text: str
    parent: int = -1
    """The post it replies to or reposts (-1: none)."""
    root: int = -1
    """The original post of its cascade (itself for an original post)."""
    depth: int = 0
    """How far from its root (0: the root)."""
    likes: int = 0
    dislikes: int = 0
    reposts: int = 0
    replies: int = 0
    views: int = 0
    """How many users have been shown it."""


@dataclass(slots=True)
class Cascade:
    """An original post and everything that descends from it by replies and reposts."""

    root: int
    size: int = 1
    """Posts in it, the root included."""
    depth: int = 0
    """The longest chain of replies and reposts below the root."""
    levels: list[int] = field(default_factory=lambda: [1])
    """How many posts at each depth (``breadth`` is the largest)."""

    @property
    def breadth(self) -> int:
        """The most posts at one depth."""
        return max(self.levels)

    def summary(self) -> dict[str, int]:
        """Size, depth and breadth."""
        return {"size": self.size, "depth": self.depth, "breadth": self.breadth}


@dataclass(frozen=True, slots=True, kw_only=True)
class Follows:
    """Who follows whom at the start: each user's followees, kept flat (one array for a million users).

    The ``i``-th user follows ``flat[starts[i]:starts[i + 1]]``.
    """

    flat: array[int]
    starts: array[int]

    def of(self, user: int) -> array[int]:
        """The users ``user`` follows at the start."""
        return self.flat[self.starts[user] : self.starts[user + 1]]


def generated_follows(users: int, per_user: int, seed: str) -> Follows:
    """A follower graph with a heavy tail: each user follows ``per_user`` others, the low numbers most often.

    Followee ``j`` is drawn as ``users × u³`` (``u`` uniform): user 0 is followed most, as a
    platform's celebrities are; the graph is a function of ``seed`` alone.
    """
    rng = random.Random(f"follows:{seed}")
    flat, starts = array("q"), array("q", [0])
    draw, take = rng.random, min(per_user, users - 1)
    for user in range(users):
        chosen: set[int] = set()
        while len(chosen) < take:
            j = int(users * draw() ** 3)
            if j != user:
                chosen.add(j)
        flat.extend(sorted(chosen))
        starts.append(len(flat))
    return Follows(flat=flat, starts=starts)


class Feed:
    """The platform: its users, posts, follows, what was shown to whom, and the rules of acting.

    Args:
        stances: Each user's stance at the start, in [-1, 1] (how many users there are).
        activity: Each user's activity in (0, 1]: its chance of being activated is ``activation`` × this.
        follows: Who follows whom at the start.
        activation: The chance a user of activity 1 acts in a round.
        recommend: What picks the timelines.
        timeline: Posts per timeline.
        key: The run's key: the rounds' draws are functions of it.
        interests: A user's text for :func:`similar` (its persona), by number.
    """

    def __init__(
        self,
        *,
        stances: Sequence[float],
        activity: Sequence[float],
        follows: Follows,
        activation: float,
        recommend: Recommender,
        timeline: int = 5,
        key: str = "",
        interests: Callable[[int], str] | None = None,
    ) -> None:
        """Create the platform with no posts yet."""
        self.users = len(stances)
        self.stances = array("d", stances)
        self.activity = array("d", activity)
        self.top_activity = max(self.activity, default=1.0)
        self.follows = follows
        self.added: dict[int, set[int]] = {}
        """Follows made during the run, by follower."""
        self.followers = array("q", bytes(8 * self.users))
        for j in follows.flat:
            self.followers[j] += 1
        self.edges = len(follows.flat)
        self.activation = activation
        self.recommend = recommend
        self.timeline = timeline
        self.key = key
        self.interests = interests or (lambda user: f"user {user}")
        self.posts: list[Post] = []
        self.by_author: dict[int, list[int]] = {}
        self.seen: dict[int, set[int]] = {}
        """The posts each user has been shown."""
        self.cascades: dict[int, Cascade] = {}
        self.reached: dict[int, set[int]] = {}
        """Per tracked cascade (the seeded posts), the users shown any of its posts."""
        self.sums = [math.fsum(self.stances), math.fsum(s * s for s in self.stances), math.fsum(map(abs, self.stances))]
        """The stances' sum, sum of squares and sum of absolute values (kept as they change)."""
        self.counts: dict[str, int] = dict.fromkeys((*KINDS, "invalid", "activated"), 0)
        """This round's actions by kind."""
        self.vectors: Any = None
        """The posts' embeddings for :func:`similar` (built when it is first used)."""

    # -- acting ------------------------------------------------------------------------------------

    def publish(
        self, author: int, text: str, stance: float, *, round: int, parent: int = -1, kind: str = "post"
    ) -> Post:
        """Add a post (or a reply or repost of ``parent``) and count it in its cascade."""
        number = len(self.posts)
        if parent < 0:
            post = Post(number, author, "post", round, stance, text, root=number)
            self.cascades[number] = Cascade(number)
        else:
            above = self.posts[parent]
            post = Post(number, author, kind, round, stance, text, parent, above.root, above.depth + 1)  # type: ignore[arg-type]
            self._grow(self.cascades[above.root], post.depth)
        self.posts.append(post)
        self.by_author.setdefault(author, []).append(number)
        return post

    @staticmethod
    def _grow(cascade: Cascade, depth: int) -> None:
        cascade.size += 1
        cascade.depth = max(cascade.depth, depth)
        if depth == len(cascade.levels):
            cascade.levels.append(0)
        cascade.levels[depth] += 1

    def track(self, post: int) -> None:
        """Count the users reached by ``post``'s cascade (a seeded post's spread)."""
        self.reached.setdefault(self.posts[post].root, set())

    def apply(self, user: int, kind: str, *, post: int | None, text: str, stance: float, round: int) -> str | None:
        """Apply ``user``'s action; ``None`` if done, else why it was refused (counted as invalid, nothing changed)."""
        refused = self._refusal(user, kind, post)
        if refused is not None:
            self.counts["invalid"] += 1
            return refused
        self.counts[kind] += 1
        target = self.posts[post] if post is not None and kind in ON_A_POST else None
        if kind == "post":
            self.publish(user, text, stance, round=round)
        elif kind == "reply" and target is not None:
            target.replies += 1
            self.publish(user, text, stance, round=round, parent=target.id, kind=kind)
        elif kind == "repost" and target is not None:
            target.reposts += 1
            self.publish(user, target.text, stance, round=round, parent=target.id, kind=kind)
        elif kind in ("like", "dislike") and target is not None:
            setattr(target, kind + "s", getattr(target, kind + "s") + 1)
        elif kind == "follow" and target is not None:
            self.added.setdefault(user, set()).add(target.author)
            self.followers[target.author] += 1
            self.edges += 1
        self.move(user, stance)
        return None

    def _refusal(self, user: int, kind: str, post: int | None) -> str | None:
        if kind not in KINDS:
            return f"unknown action {kind!r}; one of {', '.join(KINDS)}"
        if kind not in ON_A_POST:
            return None
        if post is None:
            return f"{kind} names no post (one on the user's timeline is needed)"
        if not 0 <= post < len(self.posts):
            return f"{kind} names post {post!r}, which does not exist"
        if kind == "follow":
            author = self.posts[post].author
            if author == user or author in self.followees(user):
                return f"follow: user {user} already follows user {author}" if author != user else "follow: oneself"
        return None

    def followees(self, user: int) -> set[int]:
        """Whom ``user`` follows now."""
        return set(self.follows.of(user)) | self.added.get(user, set())

    def move(self, user: int, stance: float) -> None:
        """Set ``user``'s stance (clipped to [-1, 1]), keeping the sums the metrics read."""
        stance = min(1.0, max(-1.0, stance))
        old = self.stances[user]
        self.sums[0] += stance - old
        self.sums[1] += stance * stance - old * old
        self.sums[2] += abs(stance) - abs(old)
        self.stances[user] = stance

    # -- a round -----------------------------------------------------------------------------------

    def activate(self, round: int) -> list[int]:
        """The users that act in ``round``: each with chance ``activation`` × its activity (at least one).

        Candidates come at the top activity's rate by geometric gaps, so a round costs what it
        activates, not the platform's size; each is kept with its activity's share of the top.
        """
        rng = random.Random(f"{self.key}:activate:{round}")
        rate = min(1.0, self.activation * self.top_activity)
        chosen: list[int] = []
        user = -1
        while rate > 0:
            user += 1 if rate >= 1 else 1 + int(math.log(1.0 - rng.random()) / math.log1p(-rate))
            if user >= self.users:
                break
            if rng.random() * self.top_activity < self.activity[user]:
                chosen.append(user)
        return chosen or [rng.randrange(self.users)]

    def timelines(self, users: Sequence[int], round: int) -> list[list[int]]:
        """Each user's timeline, by the recommender, less what the user wrote or was shown; counted as shown.

        Raises:
            InvalidValueError: If the recommender's answer is not a list of post ids per user.
        """
        picked = self.recommend(self, users, self.timeline)
        if len(picked) != len(users):
            raise InvalidValueError(
                f"the recommender gave {len(picked)} timelines for {len(users)} users; give a list of post ids per user"
            )
        shown = []
        for user, posts in zip(users, picked, strict=True):
            seen = self.seen.setdefault(user, set())
            timeline: list[int] = []
            for number in posts:
                if not isinstance(number, int) or not 0 <= number < len(self.posts):
                    raise InvalidValueError(
                        f"the recommender named post {number!r} for user {user}; name posts by number, 0 to "
                        f"{len(self.posts) - 1}"
                    )
                if number not in seen and self.posts[number].author != user and len(timeline) < self.timeline:
                    timeline.append(number)
            self._show(user, timeline, seen)
            shown.append(timeline)
        return shown

    def _show(self, user: int, timeline: list[int], seen: set[int]) -> None:
        for number in timeline:
            seen.add(number)
            post = self.posts[number]
            post.views += 1
            reached = self.reached.get(post.root)
            if reached is not None:
                reached.add(user)

    def fresh(self, user: int) -> Iterable[int]:
        """Post numbers ``user`` may still be shown (not seen, not its own), newest first."""
        seen = self.seen.get(user, ())
        return (n for n in range(len(self.posts) - 1, -1, -1) if n not in seen and self.posts[n].author != user)

    # -- measures ----------------------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """The round's actions, the stances' spread, the cascades and the follower graph (counts reset)."""
        n = self.users
        mean = self.sums[0] / n
        counts, self.counts = self.counts, dict.fromkeys(self.counts, 0)
        sizes = [c.size for c in self.cascades.values() if c.size > 1]
        tracked = {str(root): self._spread(root, users) for root, users in self.reached.items()}
        return {
            **counts,
            "posts_total": len(self.posts),
            "mean_stance": round(mean, 6),
            "polarization": round(max(0.0, self.sums[1] / n - mean * mean), 6),
            "extremity": round(self.sums[2] / n, 6),
            "cascades": len(sizes),
            "largest_cascade": max(sizes, default=1),
            "deepest_cascade": max((c.depth for c in self.cascades.values()), default=0),
            "follow_edges": self.edges,
            "most_followed": max(self.followers, default=0),
            "tracked": tracked,
        }

    def _spread(self, root: int, users: set[int]) -> dict[str, int]:
        """A tracked post's cascade, the users it reached and the votes it drew."""
        post = self.posts[root]
        votes = {"likes": post.likes, "dislikes": post.dislikes, "reposts": post.reposts, "replies": post.replies}
        return {**self.cascades[root].summary(), "reach": len(users), **votes}

    def follower_graph(self) -> Any:
        """The follower graph now, as a networkx ``DiGraph`` (an edge from follower to followee)."""
        import networkx as nx  # the graph extra; only analysis needs it

        graph = nx.DiGraph()
        graph.add_nodes_from(range(self.users))
        graph.add_edges_from((u, v) for u in range(self.users) for v in self.followees(u))
        return graph

    def cascade_graph(self, root: int) -> Any:
        """The cascade of post ``root`` as a networkx ``DiGraph`` (an edge from a post to a reply or repost of it)."""
        import networkx as nx

        graph = nx.DiGraph()
        graph.add_node(root, author=self.posts[root].author, kind="post")
        for post in self.posts[root + 1 :]:
            if post.root == root:
                graph.add_node(post.id, author=post.author, kind=post.kind, round=post.round)
                graph.add_edge(post.parent, post.id)
        return graph


# -- recommenders ------------------------------------------------------------------------------------


def chronological(feed: Feed, users: Sequence[int], k: int) -> list[list[int]]:
    """The newest posts of the people each user follows; the platform's newest fill what is left."""
    return [_newest_of(feed, user, k) for user in users]


def _newest_of(feed: Feed, user: int, k: int) -> list[int]:
    seen = feed.seen.get(user, set())
    streams = [reversed(feed.by_author.get(j, ())) for j in sorted(feed.followees(user))]
    picked = [n for n in itertools.islice(heapq.merge(*streams, reverse=True), 4 * k) if n not in seen][:k]
    if len(picked) < k:
        picked += [n for n in itertools.islice(feed.fresh(user), 4 * k) if n not in picked][: k - len(picked)]
    return picked


POPULAR_WINDOW = 3
"""Rounds a post stays in :func:`popular`'s pool."""


def hot(feed: Feed, now: int) -> list[int]:
    """The posts of the last :data:`POPULAR_WINDOW` rounds, hottest first.

    A post's heat is ``(1 + likes − dislikes + 2 × reposts + replies) / (age + 2)^1.5`` (Hacker
    News' decay), ties broken by the newer post.
    """
    start = bisect.bisect_left([p.round for p in feed.posts], now - POPULAR_WINDOW)
    pool = feed.posts[start:]

    def heat(post: Post) -> tuple[float, int]:
        score = 1 + post.likes - post.dislikes + 2 * post.reposts + post.replies
        return (-score / (now - post.round + 2) ** 1.5, -post.id)

    return [post.id for post in sorted(pool, key=heat)]


def _next_round(feed: Feed) -> int:
    """The round after the newest post's: the one the timelines are for."""
    return feed.posts[-1].round + 1 if feed.posts else 1


def popular(feed: Feed, users: Sequence[int], k: int) -> list[list[int]]:
    """The hottest recent posts (:func:`hot`), the same ranking for everyone, less what each has seen."""
    ranking = hot(feed, _next_round(feed))
    return [_first_unseen(feed, user, ranking, k) for user in users]


def _first_unseen(feed: Feed, user: int, ranking: Sequence[int], k: int) -> list[int]:
    seen = feed.seen.get(user, set())
    posts = feed.posts
    return list(itertools.islice((n for n in ranking if n not in seen and posts[n].author != user), k))


def mixed(feed: Feed, users: Sequence[int], k: int) -> list[list[int]]:
    """Half of each timeline from the people one follows (newest), the rest the hottest (OASIS's in/out-network)."""
    ranking = hot(feed, _next_round(feed))
    timelines = []
    for user in users:
        own = _newest_of(feed, user, (k + 1) // 2)
        rest = [n for n in _first_unseen(feed, user, ranking, k + len(own)) if n not in own]
        timelines.append(own + rest[: k - len(own)])
    return timelines


SIMILAR_DIM = 64
"""The dimensions of the posts' embeddings for :func:`similar` (feature hashing: offline, deterministic)."""


def similar(feed: Feed, users: Sequence[int], k: int) -> list[list[int]]:
    """The posts nearest each user's interests (its persona's text) by embedding, through a Faiss index.

    Posts are embedded once, as they come (``HashingEmbedding``); each round searches the index for
    all its users at once, then ranks the candidates again in Python by their rounded similarity
    and number, so near-ties fall the same way in every process. The ``memory`` extra provides Faiss.
    """
    import faiss  # the memory extra; only this recommender needs it
    import numpy as np

    from metaroles.longterm.embedding import HashingEmbedding

    embedding = HashingEmbedding(SIMILAR_DIM)
    if feed.vectors is None:
        feed.vectors = [faiss.IndexFlatIP(SIMILAR_DIM), 0]
    index, done = feed.vectors
    if done < len(feed.posts):
        index.add(np.asarray(embedding.embed([p.text for p in feed.posts[done:]]), dtype="float32"))
        feed.vectors[1] = len(feed.posts)
    if not feed.posts:
        return [[] for _ in users]
    queries = np.asarray(embedding.embed([feed.interests(u) for u in users]), dtype="float32")
    depth = min(len(feed.posts), 8 * k)
    scores, found = index.search(queries, depth)
    timelines = []
    for user, row, ids in zip(users, scores, found, strict=True):
        ranked = sorted((-round(float(s), 4), int(n)) for s, n in zip(row, ids, strict=True) if n >= 0)
        timelines.append(_first_unseen(feed, user, [n for _, n in ranked], k))
    return timelines


RECOMMENDERS: dict[str, Recommender] = {
    "chronological": chronological,
    "popular": popular,
    "similar": similar,
    "mixed": mixed,
}
"""The built-in recommenders by name (a scenario's ``recommender`` option)."""
