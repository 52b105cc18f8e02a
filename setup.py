"""The optional native scanner of Kineto slices (parsers/_kscan*.c); the metadata is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and ep-trace uses its Python
decoders (``ep_trace.parsers.kineto_native`` reports the extension missing)."""

from setuptools import Extension, setup

# One translation unit: parsers/_kscan.c includes the scanner's parts (it says why: measured
# speed); depends= names them and the private headers, so that editing any of them rebuilds.
_KSCAN_PARTS = [
    "parsers/_kscan_buf.h",
    "parsers/_kscan_json.h",
    "parsers/_kscan_json.c",
    "parsers/_kscan_num.h",
    "parsers/_kscan_num.c",
    "parsers/_kscan_record.h",
    "parsers/_kscan_record.c",
    "parsers/_kscan_guard.c",
]

setup(
    ext_modules=[
        Extension(
            "ep_trace.parsers._kscan",
            ["parsers/_kscan.c"],
            depends=_KSCAN_PARTS,
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
