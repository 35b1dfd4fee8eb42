"""dsh_system_prompt: the Python client of the dsh-system-prompt sidecar.

import dsh_system_prompt as dsp
async with dsp.connect() as client:  # $DSP_ADDRESS, else 127.0.0.1:50051
    await client.section("rules", 10, "Be precise.")
    print(dsp.render_prompt(await client.assemble()))
"""

from dsh_system_prompt_core import PERSONA_ORDER, PERSONA_SECTION, TOOL_ORDER_REST, Reason

from . import _quiet  # noqa: F401  (before anything here imports grpc)
from ._cache_history import CacheHistory, CacheHistoryEntry
from ._callback_cache import Cache
from ._changes import ChangeStream
from ._channel import DEFAULT_ADDRESS, TLS, default_address, open_channel
from ._listeners import Listener, Next
from ._prompts import PromptStream
from ._registrar import (
    Disposer,
    Handle,
    ListenerHandle,
    TextProvider,
    TextSource,
    ToolsProvider,
    ToolsSource,
    VariableProvider,
    VariableSource,
)
from ._rules import Mutation, Rule, RulePart
from .client import Client, Scope, connect
from .errors import RenderError, SystemPromptError
from .render import render_context_snapshot, render_prompt
from .types import (
    AssembleContext,
    AssembledContext,
    AssembledSection,
    AssemblyReport,
    ChangeEvent,
    ChangesMissed,
    ChangesResynced,
    FailurePolicy,
    PartReport,
    PrefixLayout,
    PrefixStability,
    PromptAssembly,
    PromptChange,
    RegistrationInfo,
    RenderedPrompt,
    Size,
    SkippedCount,
    SkippedStep,
    Snapshot,
    Source,
    ToolFreeze,
    ToolOrderReport,
    ToolProviderResult,
    ToolSchema,
)

__all__ = [
    "DEFAULT_ADDRESS",
    "PERSONA_ORDER",
    "PERSONA_SECTION",
    "TLS",
    "TOOL_ORDER_REST",
    "AssembleContext",
    "AssembledContext",
    "AssembledSection",
    "AssemblyReport",
    "Cache",
    "CacheHistory",
    "CacheHistoryEntry",
    "ChangeEvent",
    "ChangeStream",
    "ChangesMissed",
    "ChangesResynced",
    "Client",
    "Disposer",
    "FailurePolicy",
    "Handle",
    "Listener",
    "ListenerHandle",
    "Mutation",
    "Next",
    "PartReport",
    "PrefixLayout",
    "PrefixStability",
    "PromptAssembly",
    "PromptChange",
    "PromptStream",
    "Reason",
    "RegistrationInfo",
    "RenderError",
    "RenderedPrompt",
    "Rule",
    "RulePart",
    "Scope",
    "Size",
    "SkippedCount",
    "SkippedStep",
    "Snapshot",
    "Source",
    "SystemPromptError",
    "TextProvider",
    "TextSource",
    "ToolFreeze",
    "ToolOrderReport",
    "ToolProviderResult",
    "ToolSchema",
    "ToolsProvider",
    "ToolsSource",
    "VariableProvider",
    "VariableSource",
    "connect",
    "default_address",
    "open_channel",
    "render_context_snapshot",
    "render_prompt",
]
