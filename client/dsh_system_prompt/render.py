"""Strict rendering in the client: the shared core's rules, failures raised as `RenderError`."""

from __future__ import annotations

from collections.abc import Callable

from dsh_system_prompt_core import RenderFailure, render
from dsh_system_prompt_core.render import Renderable

from .errors import RenderError


def render_prompt(assembly: Renderable) -> str:
    """Interpolate every section, drop the empty ones, join with one blank line."""
    return _strict(render.render_prompt, assembly)


def render_context_snapshot(assembly: Renderable) -> str:
    """The runtime-context snapshot, or "" when no context text is left."""
    return _strict(render.render_context_snapshot, assembly)


def _strict(rendering: Callable[[Renderable], str], assembly: Renderable) -> str:
    try:
        return rendering(assembly)
    except RenderFailure as failure:
        raise RenderError(str(failure)) from None
