"""The optional native scanner of Kineto slices (parsers/_kscan.c); the metadata is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and ep-trace uses its Python
decoders (``ep_trace.parsers.kineto_native`` reports the extension missing)."""

from setuptools import Extension, setup

setup(
    ext_modules=[Extension("ep_trace.parsers._kscan", ["parsers/_kscan.c"], optional=True, extra_compile_args=["-O2"])]
)
