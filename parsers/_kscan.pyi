"""Stub of the native scanner (parsers/_kscan.c and the _kscan_*.c parts it includes)."""

# ((n, nx, ids, cat_offsets, cat_data, cat_validity, name_offsets, name_data, name_validity,
#   pid, pid_validity, tid, tid_validity, ts, ts_validity, dur, dur_validity, correlation,
#   correlation_validity, external_id, external_id_validity, bytes, bytes_validity), candidates)
# or the reason the scanner gave up (validity bitmaps are None when every row is valid)
def scan(pieces: list[bytes], keep_prefixes: tuple[bytes, ...], /) -> tuple[tuple[object, ...], bytes] | str: ...

# one piece of a JSON text through the structural guard: state = (pos, depth, end, events, in_str,
# esc, ev_depth); code 0 ok, 1 nested deeper than max_depth, 2 trailing data, 3 more than max_events events;
# offset = the byte of the finding (-1 when none)
def guard(
    text: bytes | bytearray | memoryview,
    state: tuple[int, int, int, int, int, int, int],
    max_depth: int,
    max_events: int,
    /,
) -> tuple[tuple[int, int, int, int, int, int, int], int, int]: ...
