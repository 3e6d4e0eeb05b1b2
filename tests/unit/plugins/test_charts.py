"""The view's small charts read as charts (issue 38: "a dot or two with no axis"): every known value a point, a gap
where there is no data, the scale's top and bottom written in the chart's unit, the window's ends, and words when
there is nothing to draw."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from khipu_airflow.view.charts import sparkline

SVG = "{http://www.w3.org/2000/svg}"


def drawn(fragment: str) -> ET.Element:
    return ET.fromstring(fragment.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1))


def texts(svg: ET.Element) -> dict[str, str]:
    return {str(t.get("data-role")): str(t.text) for t in svg.iter(f"{SVG}text")}


def test_a_sparse_window_draws_each_value_as_a_point_on_a_written_scale() -> None:
    """A burst in two of the hour's 30 steps, 4 minutes apart: two points, no line joining them across the gap."""
    values: list[float | None] = [None] * 30
    values[20], values[22] = 0.02, 0.0
    svg = drawn(sparkline(values, label="loss rate", unit="rate", name="loss rate", start="1 h ago", threshold=0.05))
    assert len(list(svg.iter(f"{SVG}circle"))) == 2 and svg.get("data-points") == "2"
    assert list(svg.iter(f"{SVG}polyline")) == []  # a step without verdicts is a gap, not a zero
    assert texts(svg) == {"name": "loss rate", "top": "5.00 %", "bottom": "0.00 %", "start": "1 h ago", "end": "now"}
    circles = sorted((float(c.get("cx", 0)), float(c.get("cy", 0))) for c in svg.iter(f"{SVG}circle"))
    assert circles[0][1] < circles[1][1]  # 2 % drawn above 0 %


def test_neighbouring_values_are_joined_and_the_scale_is_the_largest_value_in_its_unit() -> None:
    svg = drawn(sparkline([120, 130, None, 2_500, 900], label="p99", unit="ms", threshold=None))
    assert len(list(svg.iter(f"{SVG}circle"))) == 4
    assert [p.get("points", "").count(",") for p in svg.iter(f"{SVG}polyline")] == [2, 2]  # 120-130, 2500-900
    assert texts(svg)["top"] == "2500 ms" and texts(svg)["bottom"] == "0 ms"


def test_a_chart_with_nothing_to_draw_says_so() -> None:
    svg = drawn(
        sparkline([None] * 30, label="loss rate", unit="rate", start="1 h ago", empty="no verdicts in the hour")
    )
    assert texts(svg)["empty"] == "no verdicts in the hour"
    assert "top" not in texts(svg) and list(svg.iter(f"{SVG}circle")) == []
