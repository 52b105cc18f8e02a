"""Stub of the native scanner (parsers/_kscan.c and the _kscan_*.c parts it includes)."""

# ((n, nx, ids, cat_offsets, cat_data, cat_validity, name_offsets, name_data, name_validity,
#   pid, pid_validity, tid, tid_validity, ts, ts_validity, dur, dur_validity, correlation,
#   correlation_validity, external_id, external_id_validity, bytes, bytes_validity), candidates)
# or the reason the scanner gave up (validity bitmaps are None when every row is valid)
def scan(pieces: list[bytes], keep_prefixes: tuple[bytes, ...], /) -> tuple[tuple[object, ...], bytes] | str: ...
