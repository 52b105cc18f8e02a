"""figure_html's spec: the same figure (as parsed JSON) as copying the figure and moving its title
out with plotly itself, and the caller's figure is left as it was."""

from __future__ import annotations

import json
import re

import plotly.graph_objects as go

from ep_trace.reports.figure_style import apply_layout
from ep_trace.reports.html_page import figure_html


def _spec(html: str) -> dict:
    m = re.search(r'-spec">(.*?)</script>', html, flags=re.S)
    assert m is not None
    return json.loads(m.group(1).replace("<\\/", "</"))


def _plotly_way(fig: go.Figure) -> dict:
    copy = go.Figure(fig)
    copy.update_layout(title_text=None, margin={"t": 34})
    return json.loads(copy.to_json())


def test_spec_equals_plotly_copy_and_keeps_the_callers_figure():
    styled = apply_layout(go.Figure(go.Bar(x=["r0", "r1"], y=[1.5, 2.0], name="a</b>")), "Styled", height=300)
    bare = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))  # no title, no margin
    titled_only = go.Figure(go.Heatmap(z=[[1, 2], [3, 4]]), layout={"title": {"text": "T"}})
    for fig in (styled, bare, titled_only):
        before = fig.to_json()
        html = figure_html(fig, "f", "missing")
        assert _spec(html) == _plotly_way(fig)
        assert fig.to_json() == before
    assert '<h3 class="figtitle">Styled</h3>' in figure_html(styled, "f", "missing")
    assert "figtitle" not in figure_html(bare, "f", "missing")
    spec = figure_html(styled, "f", "missing").split('-spec">', 1)[1]
    assert "</" not in spec.removesuffix("</script></div>")  # "a</b>" never ends the script block early
    assert 'style="height:300px' in figure_html(styled, "f", "missing")
    assert 'style="height:400px' in figure_html(bare, "f", "missing")
