"""Dynamic providers: the functions this client registered, and answering the sidecar's
ProvideRequests with their values.

Providers stay here across reconnects under the key the sidecar quotes back,
so a replayed registration finds its provider again.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from ._convert import context_from_proto, tools_to_proto
from ._tracing import span
from .types import AssembleContext

# What a provider returns is checked when it answers (a hostile or buggy one fails the assembly).
Provider = Callable[[AssembleContext], object]
Waiting = list[tuple[pb.ProvidedValue, Coroutine[Any, Any, None]]]  # an answer, what fills it
"""What a ProvideRequest's answer still waits for: its async (or traced) providers."""


class Providers:
    """The dynamic providers of this client, by the key the sidecar asks for."""

    def __init__(self) -> None:
        self._providers: dict[str, Provider] = {}
        self._labels: dict[str, str] = {}
        self._keys = itertools.count(1)

    def add(self, provider: Provider, label: str = "provider") -> str:
        """Keep `provider` here; the returned key is what the sidecar asks for.
        `label` names its trace spans (`section provider "cwd"`)."""
        key = f"p{next(self._keys)}"
        self._providers[key] = provider
        self._labels[key] = label
        return key

    def __len__(self) -> int:
        """How many providers are kept (one per live dynamic registration)."""
        return len(self._providers)

    def remove(self, key: str | None) -> None:
        if key is not None:
            self._providers.pop(key, None)
            self._labels.pop(key, None)

    def begin(self, request: pb.ProvideRequest) -> tuple[pb.ProvideResponse, Waiting]:
        """Call every provider `request` asks for: the response, with the values of those
        that answered at once, and what to await for the others' (none when all did).
        A provider's failure is its answer, not ours."""
        response = pb.ProvideResponse(call_id=request.call_id)
        answers = [response.values.add(provider_key=call.provider_key) for call in request.calls]
        try:
            context = context_from_proto(request.context)
        except (ValueError, RecursionError) as error:  # fields not JSON: no provider can answer
            for answer in answers:
                _fail(answer, error)
            return response, []
        pairs = list(zip(answers, request.calls, strict=True))
        if request.trace_context:  # the sidecar traces: one span per provider, in a task
            carrier = request.trace_context
            return response, [(a, self._traced(a, call, context, carrier)) for a, call in pairs]
        waiting = [  # async providers run concurrently; sync ones have answered already
            (answer, _finish(answer, call.kind, pending))
            for answer, call in pairs
            if (pending := self._start(answer, call, context)) is not None
        ]
        return response, waiting

    async def _traced(
        self,
        answer: pb.ProvidedValue,
        call: pb.ProvideCall,
        context: AssembleContext,
        carrier: Mapping[str, str],
    ) -> None:
        with span(self._labels.get(call.provider_key, "provider"), carrier):
            pending = self._start(answer, call, context)
            if pending is not None:
                await _finish(answer, call.kind, pending)

    def _start(
        self, answer: pb.ProvidedValue, call: pb.ProvideCall, context: AssembleContext
    ) -> Awaitable[object] | None:
        """Call the provider: fill `answer` now, or return what to await for it."""
        try:
            provider = self._providers.get(call.provider_key)
            if provider is None:
                raise LookupError("the provider was disposed in this client")
            value = provider(context)
            if inspect.isawaitable(value):
                return value
            _fill(answer, call.kind, value)
        except Exception as error:  # the provider's failure fails the assembly, not us
            _fail(answer, error)
        return None


async def _finish(answer: pb.ProvidedValue, kind: int, pending: Awaitable[object]) -> None:
    try:
        _fill(answer, kind, await pending)
    except Exception as error:
        _fail(answer, error)


def _fail(answer: pb.ProvidedValue, error: Exception) -> None:
    answer.error.message = f"{type(error).__name__}: {error}"


def _fill(answer: pb.ProvidedValue, kind: int, value: object) -> None:
    if kind == pb.PROVIDER_KIND_TOOLS:
        answer.tools.CopyFrom(tools_to_proto(value))
    elif kind == pb.PROVIDER_KIND_VARIABLE:
        if value is None:
            answer.no_value.SetInParent()
        elif isinstance(value, str):
            answer.variable_value = value
        else:
            raise TypeError(f"a variable provider must return str or None, not {value!r}")
    elif kind not in _TEXT_KINDS:  # a newer sidecar's kind: say so rather than guess
        raise TypeError(f"this client does not know provider kind {kind}")
    elif isinstance(value, str):
        answer.text = value
    else:
        raise TypeError(f"a text provider must return str, not {value!r}")


_TEXT_KINDS = frozenset({pb.PROVIDER_KIND_SECTION, pb.PROVIDER_KIND_CONTEXT})
