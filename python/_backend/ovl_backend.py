"""The package's PEP 517 build backend: setuptools', run on a copy of the
source tree, so that `pip install ./python` leaves no build/ and no
ovl.egg-info/ in it (setuptools writes both where it builds, and pip builds
in the source tree). Editable installs are setuptools' own: they point at
the source tree, so they build there.
"""
import os
import shutil
import tempfile

from setuptools import build_meta as _setuptools

_SKIP = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".*")


def _in_copy(hook, *args):
    """hook(*args) with the current directory a temporary copy of it.
    Paths among args are pip's, absolute."""
    src = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="ovl-build-") as tmp:
        copy = os.path.join(tmp, os.path.basename(src) or "src")
        shutil.copytree(src, copy, ignore=_SKIP)
        os.chdir(copy)
        try:
            return hook(*args)
        finally:
            os.chdir(src)


def get_requires_for_build_wheel(config_settings=None):
    # setuptools runs egg_info to answer: in the copy too
    return _in_copy(_setuptools.get_requires_for_build_wheel, config_settings)


def get_requires_for_build_sdist(config_settings=None):
    return _in_copy(_setuptools.get_requires_for_build_sdist, config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _in_copy(_setuptools.prepare_metadata_for_build_wheel,
                    os.path.abspath(metadata_directory), config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _in_copy(_setuptools.build_wheel, os.path.abspath(wheel_directory), config_settings,
                    metadata_directory and os.path.abspath(metadata_directory))


def build_sdist(sdist_directory, config_settings=None):
    return _in_copy(_setuptools.build_sdist, os.path.abspath(sdist_directory), config_settings)


if hasattr(_setuptools, "build_editable"):
    get_requires_for_build_editable = _setuptools.get_requires_for_build_editable
    prepare_metadata_for_build_editable = _setuptools.prepare_metadata_for_build_editable
    build_editable = _setuptools.build_editable
