"""Fixtures of the image tests: what a test made is removed after it, and agents in the
pod's agent container are driven line by line.

These tests run real containers of the built image (`make image-test`, never `make test`:
pyproject's norecursedirs keeps this folder out of the default run).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from engine import Cleanup, cleanup, podman


@pytest.fixture(scope="session", autouse=True)
def engine_answers() -> None:
    """Fail at once, with podman's words, when the engine cannot run containers."""
    podman("info")


@pytest.fixture
def made() -> Iterator[Cleanup]:
    with cleanup() as things:
        yield things
