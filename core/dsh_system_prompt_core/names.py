"""Names and texts fixed by the contract, shared by the sidecar and its clients."""

from __future__ import annotations

import functools
import re

# toolOrder's rest entry: where every tool it does not list goes, sorted by name.
TOOL_ORDER_REST = "<unlisted-tools>"

# The sidecar's own sections, from its config.
HARNESS_IDENTITY_SECTION = "harness:identity"
HARNESS_IDENTITY_ORDER = -100
HARNESS_IDENTITY_TEXT = "You are an AI agent powered by DeepSeek Harness."
PERSONA_SECTION = "deployment:persona"
PERSONA_ORDER = 0

# What a {{name}} may be: registered variable names and complete groups alike.
VARIABLE_NAME = re.compile(r"[a-z][a-z0-9_]*")

# Rendered parts are joined with one blank line.
SECTION_SEPARATOR = "\n\n"
CONTEXT_SNAPSHOT_HEADER = (
    "Current runtime context. This snapshot supersedes earlier runtime-context snapshots."
)


def is_variable_name(name: str) -> bool:
    """Whether `name` matches ^[a-z][a-z0-9_]*$."""
    return VARIABLE_NAME.fullmatch(name) is not None


# Protocol features a peer may list in a stream's start message (docs/protocol.md).
FEATURE_TOOL_SLOTS = "tool-slots"
FEATURE_CALLBACK_CACHE = "callback-cache"
FEATURE_PART_SLOTS = "part-slots"
# A session's client answers a ProvideRequest provider by provider (several ProvideResponses).
FEATURE_EACH_ANSWER = "each-answer"


@functools.cache
def package_version() -> str:
    """This installation's version of dsh-system-prompt, for logs and diagnostics; read
    once, when first asked (importlib.metadata is no part of a sidecar's start)."""
    from importlib import metadata

    try:
        return metadata.version("dsh-system-prompt")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"
