"""The route map, drawn: a stream's route laid out by Graphviz's ``dot`` and rendered here as inline SVG.

``dot`` only lays the graph out (``-Tjson``: where each node, cluster box, edge spline and label goes);
this module draws it, so every element carries what the page and its tests need (the hop, its figures
and state as ``data-`` attributes, links to the hop's lost messages and to a group's consumer health).
``dot`` runs as a subprocess with a time limit; a layout is kept for the same graph text (the same
figures), so a page asked again in the same minute does not run it again. Without ``dot`` (Debian's
``graphviz`` package, which ``scripts/ensure-graphviz`` installs) or when it fails, the map is a
problem paragraph saying so, and the rest of the page is unchanged.

Every name in the map (stream, topic, group, location) comes from the registry, which users write: it
is escaped for DOT's quoted strings on the way in and for SVG on the way out.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import urlencode

from khipu.clock import iso_text
from khipu.health.rules import PartitionStatus
from khipu.report.routemap import EdgeState, HealthBadge, MapEdge, MapNode, NodeKind, RouteMap
from khipu_airflow.view.formats import duration, pct

log = logging.getLogger(__name__)

DOT_TIMEOUT_S = 10.0
FONT = "DejaVu Sans"  # what dot measures labels with (Debian's fonts-dejavu-core comes with graphviz)
NODE_FONT_PT = 11
EDGE_FONT_PT = 10

STATE_COLOUR = {
    EdgeState.LOSS: "#b91c1c",
    EdgeState.DUPLICATES: "#d97706",
    EdgeState.LOSS_WITHIN: "#f87171",
    EdgeState.OK: "#16a34a",
    EdgeState.IDLE: "#94a3b8",
}
STATE_WORDS = {
    EdgeState.LOSS: "loss rate above the stream's threshold",
    EdgeState.DUPLICATES: "duplicate rate above the stream's threshold",
    EdgeState.LOSS_WITHIN: "losses, within the threshold",
    EdgeState.OK: "no loss, duplicates within the threshold",
    EdgeState.IDLE: "no verdict in the window",
}
NODE_STYLE = {  # fill, stroke
    NodeKind.PRODUCER: ("#eef2ff", "#6366f1"),
    NodeKind.TOPIC: ("#eff6ff", "#2563eb"),
    NodeKind.GROUP: ("#f8fafc", "#475569"),
    NodeKind.PROCESSOR: ("#f0fdf4", "#15803d"),
}


class LayoutUnavailable(Exception):
    """``dot`` is missing, failed or took too long: the map cannot be drawn."""


def route_map_svg(route: RouteMap, base: str, dot: str | None = None, timeout_s: float = DOT_TIMEOUT_S) -> str:
    """The route map of ``route`` as an HTML fragment: a figure holding the SVG and its legend, or a problem
    paragraph naming why it could not be drawn. Links start at ``base`` (the app's root path). ``dot``: the
    program to lay it out with (default: ``dot`` on PATH)."""
    graph = _dot_source(route)
    try:
        layout = _layout(dot or shutil.which("dot") or "dot", graph.source, timeout_s)
    except LayoutUnavailable as exc:
        log.warning("route map of %s not drawn: %s", route.stream, exc)
        return (
            f'<div class="problem" data-testid="routemap-problem" data-stream="{escape(route.stream)}">'
            f"The route map of {escape(route.stream)} could not be drawn: {escape(str(exc))}</div>"
        )
    return _svg(route, graph, layout, base)


@dataclass(frozen=True, slots=True)
class _Graph:
    source: str  # the DOT text
    node_names: dict[str, str]  # DOT name -> node id
    node_lines: dict[str, list[tuple[str, str]]]  # node id -> (text, role) lines
    edge_lines: dict[str, list[tuple[str, str]]]  # hop -> (text, role) lines


def _dot_string(text: str) -> str:
    """``text`` as a DOT double-quoted string whose label shows it as written (no escString expansion)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def _dot_lines(lines: Sequence[tuple[str, str]]) -> str:
    """Lines of text as one DOT label: each escaped, joined by DOT's centred line break."""
    return '"' + "\\n".join(_dot_string(text)[1:-1] for text, _ in lines) + '"'


def _node_lines(node: MapNode) -> list[tuple[str, str]]:
    lines = [(node.kind.value, "kind"), (node.name, "name")]
    if node.location:
        lines.append((f"at {node.location}", "kind"))
    if node.kind in (NodeKind.GROUP, NodeKind.PROCESSOR):
        if not node.watched:
            lines.append(("offsets outside Kafka", "kind"))
        elif node.health is not None:
            lines.append((node.health.label, "health"))
    return lines


def _edge_lines(edge: MapEdge) -> list[tuple[str, str]]:
    f = edge.figures
    if not f.verdicts:
        lines = [("no verdicts", "idle")]
    else:
        rates = f"loss {pct(f.loss_rate)}" + (f" \N{MIDDLE DOT} dup {pct(f.duplicate_rate)}" if f.duplicate else "")
        lines = [(f"{f.verdicts:,} msgs", "volume"), (rates, "rates"), (_p95_line(edge), "p95")]
    if edge.health is not None and edge.health.status is not PartitionStatus.OK:
        lines.append((edge.health.label, "health"))
    return lines


FIRST_WRITE = "a producer's write is the message's first trace: there is no earlier one to measure a latency from"
NONE_MEASURED = (
    "no latency was measured in the window: none delivered, or a processor that stamps its writes with its input's "
    "timestamp (Kafka Streams does by default)"
)


def _p95_line(edge: MapEdge) -> str:
    """The edge's p95 latency, or why it has none: a producer's write never has one."""
    p95 = edge.figures.latency_p95_ms
    if p95 is not None:
        return f"p95 {duration(p95)}"
    return "first write: no latency" if edge.enters_route else "p95 \N{EN DASH}: none measured"


def _latency_note(edge: MapEdge) -> str:
    """What the edge's tooltip says of a latency it has not."""
    if edge.figures.latency_p95_ms is not None or not edge.figures.verdicts:
        return ""
    return f"; {FIRST_WRITE if edge.enters_route else NONE_MEASURED}"


def _dot_source(route: RouteMap) -> _Graph:
    names = {node.id: f"n{i}" for i, node in enumerate(route.nodes)}
    node_lines = {node.id: _node_lines(node) for node in route.nodes}
    edge_lines = {edge.hop: _edge_lines(edge) for edge in route.edges}

    def node_statement(node: MapNode) -> str:
        return f"{names[node.id]} [label={_dot_lines(node_lines[node.id])}]"

    out = [
        "digraph route {",
        '  graph [rankdir=LR, nodesep=0.3, ranksep=0.45, margin=0, labeljust="l", '
        f'fontname="{FONT}", fontsize={NODE_FONT_PT}];',
        f'  node [shape=box, fontname="{FONT}", fontsize={NODE_FONT_PT}, margin="0.14,0.06"];',
        f'  edge [fontname="{FONT}", fontsize={EDGE_FONT_PT}];',
    ]
    for node in route.nodes:  # a producer runs outside Kafka; a topic, and a group reading it, on its cluster
        if node.cluster is None or node.kind is NodeKind.PRODUCER:
            out.append("  " + node_statement(node) + ";")
    for i, cluster in enumerate(route.clusters):
        out.append(f"  subgraph cluster_{i} {{ label={_dot_string('cluster ' + cluster)};")
        out += [
            "    " + node_statement(n) + ";"
            for n in route.nodes
            if n.kind is not NodeKind.PRODUCER and n.cluster == cluster
        ]
        out.append("  }")
    for i, edge in enumerate(route.edges):
        label = _dot_lines(edge_lines[edge.hop])
        out.append(f"  {names[edge.source]} -> {names[edge.target]} [id=e{i}, label={label}];")
    out.append("}")
    return _Graph("\n".join(out) + "\n", {v: k for k, v in names.items()}, node_lines, edge_lines)


@functools.lru_cache(maxsize=64)
def _layout(dot: str, source: str, timeout_s: float) -> dict[str, Any]:
    """``dot -Tjson`` of ``source`` (kept for the same text: only successes are)."""
    try:
        done = subprocess.run(
            [dot, "-Tjson"], input=source, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError:
        raise LayoutUnavailable(
            f"Graphviz's dot was not found ({dot!r}); install Debian's graphviz package as root with "
            "scripts/ensure-graphviz (make up and make test run it)"
        ) from None
    except subprocess.TimeoutExpired:
        raise LayoutUnavailable(f"Graphviz's dot ({dot}) did not lay the route out within {timeout_s:g} s") from None
    except OSError as exc:
        raise LayoutUnavailable(f"Graphviz's dot ({dot}) could not be run: {exc}") from None
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
        raise LayoutUnavailable(f"Graphviz's dot ({dot}) failed: {first}")
    try:
        layout: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        raise LayoutUnavailable(f"Graphviz's dot ({dot}) answered something other than JSON") from None
    return layout


def _numbers(text: str) -> list[float]:
    return [float(v) for v in text.replace(",", " ").split()]


@dataclass(frozen=True, slots=True)
class _Frame:
    """From dot's points (origin bottom left) to the SVG's (origin top left, a margin around)."""

    left: float
    top: float
    pad: float = 6.0

    def xy(self, x: float, y: float) -> tuple[float, float]:
        return x - self.left + self.pad, self.top - y + self.pad

    def at(self, x: float, y: float) -> str:
        sx, sy = self.xy(x, y)
        return f"{sx:.1f},{sy:.1f}"


@dataclass(frozen=True, slots=True)
class _Line:
    text: str
    role: str  # kind, name, health, volume, rates, p95, idle
    x: float  # SVG coordinates of its baseline's centre
    y: float
    width: float  # as dot measured it


def _placed(
    lines: Sequence[tuple[str, str]], drawn: Mapping[str, Any], frame: _Frame, size: int, centre: tuple[float, float]
) -> list[_Line]:
    """The lines of a label where dot put them (its ``_ldraw_`` text operations, one per line, in order); around
    ``centre`` when dot said nothing of them."""
    texts = [op for op in drawn.get("_ldraw_", []) if op.get("op") == "T"]
    if len(texts) == len(lines):
        return [
            _Line(text, role, *frame.xy(*op["pt"]), float(op.get("width", 0)))
            for (text, role), op in zip(lines, texts, strict=True)
        ]
    step, (cx, cy) = size * 1.1, centre
    first = cy - step * (len(lines) - 1) / 2 + size * 0.35
    return [_Line(text, role, cx, first + i * step, 0.6 * size * len(text)) for i, (text, role) in enumerate(lines)]


def _svg(route: RouteMap, graph: _Graph, layout: dict[str, Any], base: str) -> str:
    x0, y0, x1, y1 = _numbers(layout["bb"])
    frame = _Frame(x0, y1)
    width, height = x1 - x0 + 2 * frame.pad, y1 - y0 + 2 * frame.pad
    objects = layout.get("objects", [])
    nodes = {n.id: n for n in route.nodes}
    widest = max((e.figures.verdicts for e in route.edges), default=0)
    drawn_edges = [(route.edges[int(str(d["id"]).removeprefix("e"))], d) for d in layout.get("edges", [])]

    parts = [
        f'<svg class="routemap" role="img" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.1f} {height:.1f}" font-family="{FONT}, Verdana, sans-serif" '
        f'data-stream="{escape(route.stream)}" data-since-ms="{route.since_ms}">',
        f"<title>Route of {escape(route.stream)}</title>",
    ]
    for obj in objects:  # the clusters' boxes, under everything
        if str(obj.get("name", "")).startswith("cluster_") and "bb" in obj:
            cx0, cy0, cx1, cy1 = _numbers(obj["bb"])
            left, top = frame.xy(cx0, cy1)
            cluster = route.clusters[int(str(obj["name"]).removeprefix("cluster_"))]  # the name it was written with
            label = f"cluster {cluster}"
            parts.append(
                f'<g class="cluster" data-cluster="{escape(cluster)}">'
                f'<rect x="{left:.1f}" y="{top:.1f}" width="{cx1 - cx0:.1f}" height="{cy1 - cy0:.1f}" rx="6" '
                'fill="#f8fafc" stroke="#cbd5e1" stroke-dasharray="4 3"/>'
                f'<text x="{left + 6:.1f}" y="{top + 13:.1f}" font-size="{NODE_FONT_PT}" fill="#475569" '
                f'font-weight="600">{escape(label)}</text></g>'
            )
    for edge, drawn in drawn_edges:  # the edges, then their labels above every edge
        parts.append(_edge_svg(route, edge, drawn, widest, base, frame))
    for edge, drawn in drawn_edges:
        parts.append(_edge_label_svg(route, edge, drawn, graph.edge_lines[edge.hop], base, frame))
    for obj in objects:
        name = str(obj.get("name", ""))
        if name in graph.node_names and "pos" in obj:
            node = nodes[graph.node_names[name]]
            parts.append(_node_svg(node, obj, graph.node_lines[node.id], base, frame))
    parts.append("</svg>")
    return (
        f'<figure class="routemap" data-stream="{escape(route.stream)}">'
        f'<div class="routemap-scroll">{"".join(parts)}</div>'
        f"<figcaption>{_legend()}</figcaption></figure>"
    )


def _lost_link(route: RouteMap, edge: MapEdge, base: str) -> str:
    return f"{base}/lost?" + urlencode({"stream": route.stream, "hop": edge.hop, "since": iso_text(route.since_ms)})


def _edge_svg(route: RouteMap, edge: MapEdge, drawn: Mapping[str, Any], widest: int, base: str, frame: _Frame) -> str:
    colour = STATE_COLOUR[edge.state]
    f = edge.figures
    stroke = 1.5 + (3.5 * math.log1p(f.verdicts) / math.log1p(widest) if widest else 0.0)
    tip: tuple[float, float] | None = None
    points: list[tuple[float, float]] = []
    for token in str(drawn.get("pos", "")).split():
        if token.startswith("e,"):
            ex, ey = _numbers(token[2:])
            tip = (ex, ey)
        elif not token.startswith("s,"):
            px, py = _numbers(token)
            points.append((px, py))
    path = ""
    if points:  # dot's spline: a start, then three control points per cubic Bezier piece
        path = "M" + frame.at(*points[0])
        path += "".join(" C" + " ".join(frame.at(*p) for p in points[i : i + 3]) for i in range(1, len(points) - 2, 3))
    arrow = ""
    if tip is not None and points:
        (bx, by), (tx, ty) = points[-1], tip
        length = math.hypot(tx - bx, ty - by) or 1.0
        nx, ny = -(ty - by) / length, (tx - bx) / length
        half = 2.0 + stroke
        corners = [(tx, ty), (bx + nx * half, by + ny * half), (bx - nx * half, by - ny * half)]
        arrow = f'<polygon points="{" ".join(frame.at(*c) for c in corners)}" fill="{colour}"/>'
    dash = ' stroke-dasharray="5 4"' if edge.state is EdgeState.IDLE else ""
    attributes = {
        "data-hop": edge.hop,
        "data-kind": edge.kind.value,
        "data-source": edge.source,
        "data-target": edge.target,
        "data-state": edge.state.name,
        "data-colour": colour,
        "data-verdicts": f.verdicts,
        "data-delivered": f.delivered,
        "data-lost": f.lost,
        "data-confirmed-lost": f.confirmed_lost,
        "data-duplicate": f.duplicate,
        "data-loss-rate": repr(f.loss_rate),
        "data-duplicate-rate": repr(f.duplicate_rate),
        "data-p95-ms": "" if f.latency_p95_ms is None else f.latency_p95_ms,
        "data-health": edge.health.status.name if edge.health is not None else "",
    }
    return (
        f'<a class="edge-link" href="{escape(_lost_link(route, edge, base))}">'
        f'<g class="edge" {_attributes(attributes)}>'
        f"<title>{escape(edge.hop)} ({escape(STATE_WORDS[edge.state])}): its lost messages"
        f"{escape(_latency_note(edge))}</title>"
        f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="{stroke:.1f}"{dash}/>{arrow}</g></a>'
    )


def _edge_label_svg(
    route: RouteMap, edge: MapEdge, drawn: Mapping[str, Any], lines: Sequence[tuple[str, str]], base: str, frame: _Frame
) -> str:
    if "lp" not in drawn:
        return ""
    placed = _placed(lines, drawn, frame, EDGE_FONT_PT, frame.xy(*_numbers(str(drawn["lp"]))))
    colour = STATE_COLOUR[edge.state]
    left = min(line.x - line.width / 2 for line in placed) - 2
    right = max(line.x + line.width / 2 for line in placed) + 2
    top, bottom = min(line.y for line in placed) - EDGE_FONT_PT, max(line.y for line in placed) + 3
    texts = "".join(_text(line, EDGE_FONT_PT, colour, edge.health) for line in placed)
    return (
        f'<a class="edge-link" href="{escape(_lost_link(route, edge, base))}">'
        f'<g class="edge-label" data-hop="{escape(edge.hop)}"><title>{escape(edge.hop)}: its lost messages'
        f"{escape(_latency_note(edge))}</title>"
        f'<rect x="{left:.1f}" y="{top:.1f}" width="{right - left:.1f}" height="{bottom - top:.1f}" rx="3" '
        f'fill="#ffffff" fill-opacity="0.85"/>{texts}</g></a>'
    )


def _node_svg(node: MapNode, obj: Mapping[str, Any], lines: Sequence[tuple[str, str]], base: str, frame: _Frame) -> str:
    cx, cy = frame.xy(*_numbers(str(obj["pos"])))
    w, h = float(obj["width"]) * 72, float(obj["height"]) * 72
    fill, stroke = NODE_STYLE[node.kind]
    radius = min(h / 2, 14) if node.kind is NodeKind.TOPIC else 5
    attributes = {
        "data-node": node.id,
        "data-kind": node.kind.value,
        "data-name": node.name,
        "data-cluster": node.cluster or "",
        "data-health": node.health.status.name if node.health is not None else "",
    }
    where = f" on cluster {node.cluster}" if node.kind is NodeKind.TOPIC and node.cluster else ""
    health = f": consumer health {node.health.label}" if node.health is not None else ""
    texts = "".join(
        _text(line, NODE_FONT_PT, "#0f172a", node.health) for line in _placed(lines, obj, frame, NODE_FONT_PT, (cx, cy))
    )
    body = (
        f'<g class="node" {_attributes(attributes)}><title>{escape(f"{node.kind.value} {node.name}{where}{health}")}'
        f'</title><rect x="{cx - w / 2:.1f}" y="{cy - h / 2:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{radius:.1f}" '
        f'fill="{fill}" stroke="{stroke}" stroke-width="1.2"/>{texts}</g>'
    )
    if node.kind in (NodeKind.GROUP, NodeKind.PROCESSOR) and node.watched:
        query = {"group": node.name} if node.cluster is None else {"cluster": node.cluster, "group": node.name}
        return f'<a class="node-link" href="{escape(f"{base}/consumers?{urlencode(query)}")}">{body}</a>'
    return body


def _text(line: _Line, size: int, colour: str, badge: HealthBadge | None = None) -> str:
    attrs = f'x="{line.x:.1f}" y="{line.y:.1f}" text-anchor="middle" data-field="{line.role}"'
    text = escape(line.text)
    if line.role == "kind":
        return f'<text {attrs} font-size="{size - 2}" fill="#64748b">{text}</text>'
    if line.role == "name":
        return f'<text {attrs} font-size="{size}" font-weight="600" fill="#0f172a">{text}</text>'
    if line.role == "health":
        tone = _health_colour(badge.status if badge is not None else None)
        return f'<text {attrs} font-size="{size - 1}" font-weight="700" fill="{tone}">{text}</text>'
    if line.role == "rates":
        return f'<text {attrs} font-size="{size}" font-weight="600" fill="{colour}">{text}</text>'
    return f'<text {attrs} font-size="{size}" fill="#334155">{text}</text>'


def _health_colour(status: PartitionStatus | None) -> str:
    if status is PartitionStatus.OK:
        return "#15803d"
    return "#b45309" if status in (PartitionStatus.WARN, PartitionStatus.REWIND) else "#b91c1c"


def _attributes(values: Mapping[str, object]) -> str:
    return " ".join(f'{name}="{escape(str(value))}"' for name, value in values.items())


def _legend() -> str:
    dashed = ' stroke-dasharray="5 4"'
    keys = "".join(
        f'<span class="key" data-state="{state.name}"><svg width="26" height="10" aria-hidden="true">'
        f'<line x1="1" y1="5" x2="25" y2="5" stroke="{STATE_COLOUR[state]}" stroke-width="3"'
        f"{dashed if state is EdgeState.IDLE else ''}/></svg> {escape(STATE_WORDS[state])}</span>"
        for state in sorted(EdgeState, reverse=True)
    )
    return (
        f'{keys}<span class="key muted">Each edge: messages judged, loss (and duplicate) rate, p95 latency over the '
        "window (a read's from the write it read, a processor's write from its read; a producer's write has none: "
        "it is the message's first trace), and a read's consumer health when not OK; a thicker edge carries more. "
        "Click an edge for its lost messages, a group for its consumer health.</span>"
    )
