"""for_display's string shortening: each long value keeps its head and tail, short values and other
columns are untouched, control characters escaped only when asked (golden cases)."""

from __future__ import annotations

import polars as pl

from ep_trace.cli.outputs import _shorten, _shorten_frame


def test_shorten_frame_matches_the_string_rule():
    long_a, long_b = "a" * 30 + "TAIL", "é" * 25  # é: 2 bytes a char (25 chars, 50 bytes)
    df = pl.DataFrame(
        {
            "name": [long_a, "short", None, long_a, "x" * 20],
            "other": ["ok", long_b, "ok", None, "ok"],
            "n": [1, 2, 3, 4, 5],
        }
    )
    out = _shorten_frame(df, 20, escape=False)
    assert out.schema == df.schema
    assert out["n"].to_list() == [1, 2, 3, 4, 5]
    assert out["name"].to_list() == [_shorten(long_a, 20), "short", None, _shorten(long_a, 20), "x" * 20]
    assert out["other"].to_list() == ["ok", _shorten(long_b, 20), "ok", None, "ok"]
    assert _shorten(long_a, 20) == "a" * 13 + "…" + "aaTAIL"
    # 50 bytes but 25 chars: shortened by characters, not bytes
    assert _shorten_frame(df.select("other"), 25, escape=False).equals(df.select("other"))


def test_shorten_frame_escapes_controls_only_when_asked():
    df = pl.DataFrame({"name": ["k\x1b[31m", "plain"]})
    assert _shorten_frame(df, 512, escape=False).equals(df)
    assert _shorten_frame(df, 512, escape=True)["name"].to_list() == ["k\\x1b[31m", "plain"]
