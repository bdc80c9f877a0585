"""The one compiled module, fastdata._lookup (fastdata/_lookup.c); everything else is in
pyproject.toml. It is optional: without a C compiler the install goes on without it and
the CPU ``gpu.Normalize`` uses OpenCV's lookups instead (the same bytes, slower)."""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "fastdata._lookup",
            ["fastdata/_lookup.c"],
            extra_compile_args=[] if sys.platform == "win32" else ["-O3"],
            optional=True,
        )
    ]
)
