"""HTML primitives of the report pages: escaping, tables, figure placeholders and the page shell.

The page shell embeds plotly.js once (the vendored "cartesian" partial bundle, else
``plotly.offline.get_plotlyjs()``; no CDN) as inert text plus a small renderer script that draws
each figure from its JSON spec, one per browser task. Used by the analysis report
(:mod:`ep_trace.reports.html`), the comparison and the sweep pages. Nothing here knows an
:class:`~ep_trace.analysis.result.Analysis`.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

log = logging.getLogger(__name__)

__all__ = ["Section", "plotly_bundle", "CARTESIAN_TRACES", "page", "table_html", "figure_html", "esc", "LEFT_CLASS"]


@dataclass(frozen=True)
class Section:
    """An extra section appended before the definitions (e.g. the HTA cross-check).

    Attributes:
        anchor: HTML id.
        title: Heading.
        body_html: Trusted HTML body (built with :func:`table_html` / :func:`figure_html`).
    """

    anchor: str
    title: str
    body_html: str


_CSS = """
*{box-sizing:border-box}
html,body{max-width:100%;overflow-x:hidden}
body{font-family:-apple-system,Segoe UI,Roboto,Helvetica,Arial,sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:1400px;margin:0 auto;padding:12px clamp(8px,2.5vw,24px) 48px}
h1{font-size:20px;margin:6px 0 4px}h2{font-size:18px;margin:32px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3.figtitle{font-size:15px;margin:14px 0 2px;font-weight:600}
.sub{color:#666;font-size:13px;overflow-wrap:anywhere}.note{color:#555;font-size:13px;margin:4px 0 8px}.warn{color:#8A5A00;font-size:13px;margin:4px 0 8px;font-weight:600}
.caption{color:#444;font-size:12.5px;margin:2px 0 12px;font-style:italic}
.verdict{border-left:6px solid #999;background:#fff;padding:12px 16px;margin:10px 0;box-shadow:0 1px 2px #0001}
.verdict.high{border-color:#B2182B}.verdict.medium{border-color:#E69F00}.verdict.low{border-color:#DDCC77}.verdict.none{border-color:#117733}
.verdict .headline{font-size:20px;font-weight:600;overflow-wrap:anywhere}.verdict .detail{margin-top:6px}.verdict .context{margin-top:6px;color:#555;font-size:13px}
.tbl{max-width:100%;overflow-x:auto;-webkit-overflow-scrolling:touch;margin:6px 0}
table{border-collapse:collapse;font-size:13px;background:#fff}th,td{border:1px solid #e3e3e3;padding:3px 8px;text-align:right;vertical-align:top}
th{background:#f0f0f0}td.l,th.l{text-align:left}td.wide{min-width:16em}.sev-high{color:#B2182B;font-weight:600}.sev-medium{color:#A86B00;font-weight:600}
nav{display:flex;flex-wrap:wrap;gap:4px 12px;margin:6px 0}nav a{font-size:13px}
.fig{background:#fff;margin:4px 0;box-shadow:0 1px 2px #0001;max-width:100%;overflow:hidden}
.pair{display:flex;flex-wrap:wrap;gap:12px}.pair>div{flex:1 1 520px;min-width:0;max-width:100%}
dl dt{font-weight:600;margin-top:8px}dl dd{margin-left:16px}
"""


#: Attribute of a left-aligned (text) table cell.
LEFT_CLASS = ' class="l"'


def esc(x: object) -> str:
    """``x`` as escaped HTML text; None as an en dash (a missing value)."""
    return "–" if x is None else html.escape(str(x))


def table_html(
    headers: Sequence[str], rows: Sequence[Sequence[object]], left: int | Sequence[int] = 1, cls: str = ""
) -> str:
    """A plain HTML table. Cells are escaped.

    Args:
        headers: Column headings.
        rows: Cell values (``str()`` is applied).
        left: Left-aligned (text) columns: the first ``left`` columns, or the given column indices.
        cls: CSS class of the table.

    Wrapped in a ``div.tbl`` that scrolls sideways on narrow screens (the page itself never does).
    """
    lefts = set(range(left)) if isinstance(left, int) else set(left)
    th = "".join(f"<th{LEFT_CLASS if i in lefts else ''}>{esc(h)}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f"<td{LEFT_CLASS if i in lefts else ''}>{esc(c)}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    table = f"<table{f' class={cls!r}' if cls else ''}><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"
    return f'<div class="tbl">{table}</div>'


def figure_html(fig: go.Figure | None, div_id: str, missing: str, caption: str = "") -> str:
    """A figure placeholder plus its JSON spec, or the ``missing`` sentence when ``fig`` is None.

    The figure is drawn by the page's renderer script (see :func:`page`), one figure per browser
    task, so the verdict and the first figures show while the rest are still being drawn. The
    plotly title becomes an HTML heading above the plot, and the plot keeps an empty top margin,
    so plotly's toolbar (top right) never covers a title or a legend (legends sit below the plot).

    Args:
        fig: The figure, or None.
        div_id: HTML id of the plot.
        missing: The sentence shown instead of an empty figure.
        caption: One line under the figure explaining its notation.
    """
    if fig is None:
        return f'<p class="note">{esc(missing)}</p>'
    # The figure's plain dict (a deep copy: the caller's figure keeps its title) with the title
    # moved out and a 34 px top margin; the same JSON as ``go.Figure(fig).update_layout(title_text=None,
    # margin={"t": 34}).to_json()`` without re-validating the figure and its template (~25 ms a figure).
    spec_dict = fig.to_dict()
    layout = spec_dict["layout"]
    title = ""
    if isinstance(layout.get("title"), dict):
        title = layout["title"].pop("text", None) or ""
    layout.setdefault("margin", {})["t"] = 34
    height = layout.get("height") or 400
    # "</script" inside a <script> block ends it early and "<!--" (script data escape states) can keep the
    # next "</script>" from ending it: no "<" at all (JSON has "<" only inside strings, as "\u003c" too)
    spec = pio.to_json(spec_dict, validate=False).replace("<", "\\u003c")
    head = f'<h3 class="figtitle">{esc(title)}</h3>' if title else ""
    cap = f'<p class="caption">{esc(caption)}</p>' if caption else ""
    return (
        f'{head}<div class="fig"><div id="{div_id}" class="plotly-graph-div ep-fig" style="height:{height}px;width:100%"></div>'
        f'<script type="application/json" id="{div_id}-spec">{spec}</script></div>{cap}'
    )


#: Draws every ``div.ep-fig`` in document order, one per task (setTimeout) so the browser paints in
#: between; marks ``ep-plotly-ready`` / ``ep-first-figure`` / ``ep-all-figures`` (performance API)
#: and sets ``body[data-figures-rendered]`` when done (the browser test waits on it). plotly.js
#: comes as inert text (``script type="text/plain"``): it is compiled only after the first frame
#: with the verdict has been painted (requestAnimationFrame, then a task), so the verdict never
#: waits for the 4.8 MB bundle, whatever the HTML parser does.
_RENDERER = """
(function () {
  var figs = Array.prototype.slice.call(document.querySelectorAll("div.ep-fig"));
  var config = {displaylogo: false, responsive: true};
  function draw(i) {
    if (i >= figs.length) {
      performance.mark("ep-all-figures");
      document.body.setAttribute("data-figures-rendered", String(figs.length));
      return;
    }
    var div = figs[i];
    var t0 = performance.now();
    var spec = JSON.parse(document.getElementById(div.id + "-spec").textContent);
    Plotly.newPlot(div, spec.data, spec.layout, config).then(function () {
      performance.measure(div.id, {start: t0, end: performance.now()});
      if (i === 0) { performance.mark("ep-first-figure"); }
      setTimeout(function () { draw(i + 1); }, 0);
    });
  }
  function start() {
    var src = document.getElementById("ep-plotly-src");
    (0, eval)(src.textContent);  // global scope, as a classic <script> would run it
    src.textContent = "";
    performance.mark("ep-plotly-ready");
    draw(0);
  }
  requestAnimationFrame(function () { setTimeout(start, 0); });
})();
"""


_CARTESIAN = Path(__file__).with_name("plotly-cartesian.min.js")
#: Trace types the report draws; all are in plotly.js' "cartesian" partial bundle.
CARTESIAN_TRACES = frozenset({"bar", "scatter", "heatmap", "box", "histogram", "histogram2d", "contour"})


@lru_cache(maxsize=1)
def plotly_bundle() -> str:
    """plotly.js for the page: the "cartesian" partial bundle (bar, scatter, heatmap, … 1.5 MB,
    vendored from npm ``plotly.js-cartesian-dist-min``, MIT, ``reports/plotly-cartesian.LICENSE.txt``)
    when its version is the one plotly.py writes figures for, else plotly.py's full 4.8 MB bundle.
    The partial bundle compiles ~3x faster, which is most of the time to the first figure."""
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    if _CARTESIAN.exists():
        text = _CARTESIAN.read_text(encoding="utf-8")
        m = re.search(r"plotly\.js \(cartesian - minified\) v(\d+\.\d+\.\d+)", text[:400])
        if m and m.group(1) == get_plotlyjs_version():
            return text
        log.debug(
            "plotly-cartesian.min.js is v%s, plotly.py wants %s: full bundle", m and m.group(1), get_plotlyjs_version()
        )
    return get_plotlyjs()


def page(title: str, body: str, subtitle: str = "", lead: str = "") -> str:
    """Wrap ``body`` into a complete offline HTML document with plotly.js embedded once.

    ``lead`` (the verdict) comes right under the title, before the subtitle and the navigation.
    plotly.js (about 4.8 MB) sits at the end of ``<body>`` as inert text, compiled by the renderer
    script after the verdict has painted; the renderer then draws the figures.
    """
    sub = f'<div class="sub">{esc(subtitle)}</div>' if subtitle else ""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head>'
        f"<body><main><h1>{esc(title)}</h1>{lead}{sub}{body}</main>"
        f'<script type="text/plain" id="ep-plotly-src">{plotly_bundle()}</script>'
        f'<script type="text/javascript">{_RENDERER}</script></body></html>'
    )
