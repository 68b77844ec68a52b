"""The one thing pyproject.toml cannot say: which folders make which packages.

The installed distribution has one top-level import name, ``stager``. The FUSE
front end lives in the top-level ``fuse/`` folder (the project's layout) but is
installed as ``stager.fuse``, so it never collides with the ``fuse`` module of
fusepy and mfusepy. Everything else is found under ``stager/``.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["stager", "stager.*"]) + ["stager.fuse"],
    package_dir={"stager.fuse": "fuse"},
)
