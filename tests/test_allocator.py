"""ep_trace.parsers.allocator: polars' jemalloc options set at ``import ep_trace`` (before polars loads),
never over the user's own, and never after polars is loaded; glibc heap trim is harmless."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ep_trace.parsers import allocator

_PROBE = (
    "import json, os\n"
    "{pre}"
    "import ep_trace, polars\n"
    "from ep_trace.parsers import allocator\n"
    "print(json.dumps([os.environ.get('_RJEM_MALLOC_CONF'), allocator.jemalloc_configured()]))\n"
)


def _probe(pre: str = "", env_value: str | None = None) -> tuple[str | None, bool]:
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    if env_value is not None:
        env["_RJEM_MALLOC_CONF"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(pre=pre)], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    value, configured = json.loads(out.stdout.strip().splitlines()[-1])
    return value, configured


def test_import_sets_options_before_polars_loads() -> None:
    value, configured = _probe()
    assert configured
    # polars prepends its own defaults; ours come last, so they win
    assert value == "dirty_decay_ms:500,muzzy_decay_ms:1000," + allocator.POLARS_JEMALLOC_CONF


def test_user_value_is_kept() -> None:
    value, configured = _probe(env_value="dirty_decay_ms:0")
    assert not configured
    assert value == "dirty_decay_ms:500,muzzy_decay_ms:1000,dirty_decay_ms:0"


def test_empty_user_value_is_an_opt_out() -> None:
    value, configured = _probe(env_value="")
    assert not configured
    assert value == "dirty_decay_ms:500,muzzy_decay_ms:1000"


def test_no_effect_once_polars_is_loaded() -> None:
    value, configured = _probe(pre="import polars\n")
    assert not configured
    assert value == "dirty_decay_ms:500,muzzy_decay_ms:1000"


def test_spawned_workers_inherit_the_options(tmp_path) -> None:
    script = tmp_path / "spawn_probe.py"  # spawn re-imports __main__, so a file, not -c
    script.write_text(
        "import json, multiprocessing as mp\n"
        "import ep_trace\n"
        "from ep_trace.parsers import allocator\n"
        "def child(_):\n"
        "    import polars\n"
        "    return allocator.jemalloc_configured()\n"
        "if __name__ == '__main__':\n"
        "    with mp.get_context('spawn').Pool(1) as p:\n"
        "        print(json.dumps(p.map(child, [0])))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True]


def test_release_free_heap_is_safe_to_call() -> None:
    blocks = [bytearray(1 << 20) for _ in range(8)]
    del blocks
    allocator.release_free_heap()
    allocator.release_free_heap()
