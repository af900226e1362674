"""What pyproject.toml cannot say: the tokenizer's C core as an optional extension, and the
files a VM needs (startup/, the Packer template, the lock) inside the wheel.

The C core (fleet_jobs/text/tokenizers/wordpiece.c and unigram.c, and fleet/formats/tfrecord/records.c: TFRecord
framing, beside its Python reference) is a plain C library loaded with ctypes (fleet_jobs/text/tokenizers/native.py),
not a CPython module: it uses no Python.h, so one build serves every Python 3 (an abi3 wheel)
and needs no python3-dev. It stays optional: where no compiler works, the build warns and
goes on, and the package tokenizes in Python (the same records, about 3x slower).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.errors import CCompilerError, ExecError, PlatformError

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [
    "fleet_jobs/text/tokenizers/wordpiece.c",
    "fleet_jobs/text/tokenizers/unigram.c",
    "fleet/formats/tfrecord/records.c",
]
# Copied into the wheel as fleet/_data/<path> (fleet.core.codesync finds them there when there
# is no checkout): what `fleet sync` uploads besides the packages, and the worker image's template.
DATA = ("startup", "images/packer", "requirements.lock", "pyproject.toml")


def source_sha256() -> str:
    """Of the sources end to end, as fleet_jobs/text/tokenizers/native.py checks it."""
    digest = hashlib.sha256()
    for source in SOURCES:
        with open(os.path.join(HERE, source), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


class optional_build_ext(build_ext):
    """build_ext that warns instead of failing: no compiler is no reason not to install."""

    def run(self):
        try:
            super().run()
        except (CCompilerError, ExecError, PlatformError, OSError) as e:
            self._skipped(e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except (CCompilerError, ExecError, PlatformError, OSError) as e:
            self._skipped(e)

    @staticmethod
    def _skipped(error: Exception) -> None:
        print(
            f"WARNING: the tokenizer's C core was not built ({error}); fleet will tokenize in Python, "
            f"about 3x slower (install a C compiler and reinstall for the C core)",
            file=sys.stderr,
        )


class build_py_with_data(build_py):
    """build_py that also puts DATA under fleet/_data. Not for an editable install: there the
    checkout is the data."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for rel in DATA:
            src, dst = os.path.join(HERE, rel), os.path.join(self.build_lib, "fleet", "_data", rel)
            if os.path.isdir(src):
                shutil.copytree(
                    src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
                )
            else:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy2(src, dst)


setup(
    ext_modules=[
        Extension(
            "fleet_jobs.text.tokenizers._ccore",
            SOURCES,
            py_limited_api=True,
            define_macros=[("WP_SOURCE_SHA256", f'"{source_sha256()}"')],
            extra_compile_args=["-O2", "-std=c99"],
        )
    ],
    cmdclass={"build_ext": optional_build_ext, "build_py": build_py_with_data},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
