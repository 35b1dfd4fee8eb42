"""A sidecar holding a prompt, a runtime context and three tools in an order of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import dsh_system_prompt as dsp
import pytest
from helpers import SidecarFactory
from model_calls import loaded_client


@pytest.fixture
async def agent(make_sidecar: SidecarFactory) -> AsyncIterator[dsp.Client]:
    async for client in loaded_client(make_sidecar):
        yield client
