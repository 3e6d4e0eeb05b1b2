"""Which streams a person sees in the Khipu view, and what of Khipu's data goes with a stream.

A stream's ``owner`` in the registry names a team. A person sees a stream when the auth manager puts them in that
team, or lets them see every stream (:func:`sees_stream`). Asking the auth manager is the plugin's part; what it
answered comes here as a :class:`Viewer`.

The view reads every page through :func:`seen_registry`: the registry as this person sees it, holding only their
streams. Every report shows nothing of a stream its registry does not hold, so another team's stream answers
exactly as one that does not exist. What goes with a stream is its :class:`Reach`:

- its verdicts, metrics, messages, their traces, history and resend attempts;
- its hops (their clock skew);
- the reads of its route as (cluster, group, topic): the consumer health of those partitions, their offset windows
  and status changes;
- the emitter locations of its route (their trace-channel gaps);
- an alert naming the stream, or a group the route reads with (:func:`alert_in_reach`).

Khipu's own health belongs to no stream and is shown to everyone logged in: the detector's heartbeat, the
quarantined trace records (counted, with their position and reason), storage, and alerts that name neither a
stream nor a group (detector down, the state disk, a resend run's counts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from khipu.registry.model import Registry, Stream

EVERY_STREAM_TEAM = "khipu-every-stream"  # an Airflow team: its members (and Airflow's admins) see every stream
EVERY_STREAM_RESOURCE = "Khipu every stream"  # a custom view: whoever may read it sees every stream
TEAM_RESOURCE_PREFIX = "Khipu team "  # a custom view per team: "Khipu team team-orders"


class AccessUnanswered(RuntimeError):
    """The auth manager cannot answer what the view is set to ask of it (``KHIPU_VIEW_ACCESS``): nobody sees
    anything until the setting matches the auth manager."""


def team_resource(owner: str) -> str:
    """The custom-view resource naming ``owner``'s streams (for auth managers without Airflow's teams)."""
    return f"{TEAM_RESOURCE_PREFIX}{owner}"


@dataclass(frozen=True, slots=True)
class Viewer:
    """What the auth manager said of the person asking: the teams they are in (of those the registry's owners
    name), whether they see every stream, and which manual resend DAGs they may trigger runs of
    (:mod:`khipu.access.dags`)."""

    name: str
    teams: frozenset[str] = frozenset()
    every_stream: bool = False
    resend_dags: frozenset[str] = frozenset()


def sees_stream(viewer: Viewer, stream: Stream) -> bool:
    """A stream is seen by its owner's team, and by whoever sees every stream."""
    return viewer.every_stream or stream.owner in viewer.teams


@dataclass(frozen=True, slots=True)
class SeenRegistry(Registry):
    """The registry as one person sees it in the view. A report given one shows nothing beyond its
    :func:`reach_limit`; given the registry itself (the CLI, the exporter), or the one of a person who sees every
    stream, it shows everything it reads."""

    viewer: str = ""
    every_stream: bool = False


def seen_registry(viewer: Viewer, registry: Registry) -> SeenRegistry:
    """The registry as ``viewer`` sees it: their streams, and the clusters those streams use (every stream and
    cluster, for whoever sees every stream)."""
    streams = {name: stream for name, stream in registry.streams.items() if sees_stream(viewer, stream)}
    used = {hop.topic.cluster for stream in streams.values() for hop in stream.route.hops}
    clusters = {name: c for name, c in registry.clusters.items() if viewer.every_stream or name in used}
    return SeenRegistry(clusters=clusters, streams=streams, viewer=viewer.name, every_stream=viewer.every_stream)


@dataclass(frozen=True, slots=True)
class Reach:
    """What goes with a registry's streams: the streams, their hops, the reads of their routes and the locations
    of their emitters."""

    streams: frozenset[str]
    hops: frozenset[tuple[str, str]]  # (stream, hop id)
    reads: frozenset[tuple[str, str, str]]  # (cluster, group, topic)
    locations: frozenset[str]

    @property
    def groups(self) -> frozenset[tuple[str, str]]:
        """(cluster, group) of every read."""
        return frozenset((cluster, group) for cluster, group, _ in self.reads)


def reach_of(registry: Registry) -> Reach:
    hops = {(name, hop.id) for name, stream in registry.streams.items() for hop in stream.route.hops}
    reads = {
        (topic.cluster, consumer.group, topic.topic)
        for stream in registry.streams.values()
        for consumer in stream.route.consumers
        for topic in consumer.reads
    }
    locations = {p.location for s in registry.streams.values() for p in s.route.producers}
    locations |= {c.location for s in registry.streams.values() for c in s.route.consumers}
    return Reach(frozenset(registry.streams), frozenset(hops), frozenset(reads), frozenset(locations))


def reach_limit(registry: Registry) -> Reach | None:
    """What a report given ``registry`` may show: a seen registry's reach; None (no limit) for the registry itself
    and for a person who sees every stream (data of streams the registry no longer names included)."""
    return reach_of(registry) if isinstance(registry, SeenRegistry) and not registry.every_stream else None


def alert_in_reach(details: Mapping[str, Any], reach: Reach) -> bool:
    """An alert goes with what its details name: a stream, or a group (with its cluster). One naming neither is
    about Khipu itself (the detector, the state disk, a resend run's counts)."""
    stream, group = details.get("stream"), details.get("group")
    if stream is not None and str(stream) not in reach.streams:
        return False
    return group is None or (str(details.get("cluster")), str(group)) in reach.groups
