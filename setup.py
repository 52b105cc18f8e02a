"""The optional native scanner of Kineto slices (parsers/_kscan*.c); the metadata is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and ep-trace uses its Python
decoders (``ep_trace.parsers.kineto_native`` reports the extension missing)."""

from setuptools import Extension, find_packages, setup

# parsers/ and reports/ live at the top of the repository (the layout tells the architecture) but are
# installed inside the ep_trace namespace (pyproject.toml's package-dir): no generic top-level `parsers`
# / `reports` package ever lands in site-packages. The packages are discovered, never listed by hand, so
# that a new subpackage cannot be left out of the wheel (ep_trace.capture was, up to 0.1.0's stop 35).
_ROOTS = {"ep_trace": "ep_trace", "ep_trace.parsers": "parsers", "ep_trace.reports": "reports"}


def _packages() -> list[str]:
    """Every package under each root folder, named in the ep_trace namespace."""
    out: list[str] = []
    for name, folder in _ROOTS.items():
        out += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]
    return sorted(out)


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
    packages=_packages(),
    ext_modules=[
        Extension(
            "ep_trace.parsers._kscan",
            ["parsers/_kscan.c"],
            depends=_KSCAN_PARTS,
            optional=True,
            extra_compile_args=["-O2"],
        )
    ],
)
