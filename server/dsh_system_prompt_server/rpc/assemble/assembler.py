"""An Assemble request answered: refused by its size first, reused when it may be (for its
very bytes, else for its plan), else assembled, reported, rendered and encoded, and never
bigger than the sidecar sends."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import TOOL_ORDER_REST, Reason, RenderFailure

from ...guard import shown_steps
from ...registry import (
    Assembly,
    Failure,
    Kind,
    Limits,
    Plan,
    Registry,
    RegistryError,
    ServiceError,
    Skipped,
    Status,
    shown_failure,
    shown_skipped,
)
from ...reports import Freeze, HistoryKey, Layout, Reporter, Shows
from ...telemetry import Metrics, Throttled, logger
from ...wire import (
    Pieces,
    assemble_request,
    assemble_response,
    check_assemble_size,
    context_from_proto,
    freeze_from_proto,
    history_key_from_proto,
    layout_from_proto,
    report_to_proto,
    skipped_to_proto,
)
from . import part_caches
from .response_cache import MAX_BYTES, ResponseCache, Stamp, reuse_key


class Answered(NamedTuple):
    """An Assemble request's encoded response, and the steps its assembly went on without
    (for the response's trailer)."""

    response: bytes
    skipped: tuple[Skipped, ...] = ()


class Assembler:
    """Answers Assemble requests with their encoded responses, keeping the reusable ones."""

    def __init__(
        self,
        registry: Registry,
        reporter: Reporter,
        metrics: Metrics,
        max_message_bytes: int,
        response_bytes: int = MAX_BYTES,
    ) -> None:
        self._registry = registry
        self._reporter = reporter
        self._metrics = metrics
        self._max_message_bytes = max_message_bytes
        self.responses = ResponseCache(max_bytes=response_bytes)
        # One line per skipped callback and reason every 10 s: one failing on every assembly
        # must not flood the log.
        self._skip_log = Throttled(logger("assembler"), every_s=10.0)
        # the per-part encodings dynamic responses are joined from: as much again
        self.parts = part_caches.PartBudget(max_bytes=response_bytes)

    async def answer(self, encoded: bytes, deadline: float | None, layout: Layout) -> Answered:
        """The response to an Assemble request's bytes `encoded`: refused by their size before
        they are hashed or parsed; the response kept for these very bytes, unparsed; else the
        request parsed and answered by its plan by `deadline` (the loop's clock). `layout` is
        the reports' default prefix layout."""
        check_assemble_size(encoded, self._registry.limits)
        kept = self.kept(encoded)
        if kept is not None:
            return Answered(kept)
        return await self._assembled(assemble_request(encoded), deadline, layout, encoded)

    def kept(self, encoded: bytes) -> bytes | None:
        """The response kept for a request's very bytes while it holds (its scope chain's
        revision, the callback cache's generation): nothing parsed, no plan looked up."""
        registry = self._registry
        return self.responses.by_request(
            encoded, registry.chain_revision, registry.callbacks.generation, registry.reach_epoch
        )

    async def _assembled(
        self, request: pb.AssembleRequest, deadline: float | None, layout: Layout, encoded: bytes
    ) -> Answered:
        """`request` (whose bytes are `encoded`) answered by its plan by `deadline` (the loop's
        clock): the response kept for the plan when it may be reused, else assembled."""
        context = context_from_proto(request.context, self._registry.limits)
        freeze = freeze_from_proto(request.tool_freeze, request.report)
        plan = self._registry.plan(context.scope)
        generation = self._registry.callbacks.generation
        key = None if request.report else reuse_key(plan, context, request.render, generation)
        cached = None if key is None else self.responses.get(key)
        stamp = None if key is None else self._stamp(plan, context.scope, generation)
        if cached is not None and stamp is not None:  # the same bytes: answered unparsed
            self.responses.index(encoded, key, stamp)
            return Answered(cached)  # a static (or all-cached) plan's response, encoded once
        try:
            assembly = await self._registry.run(plan, context, deadline, track=request.report)
        except Failure as error:
            raise _shown(error) from None
        self._count_skipped(assembly.skipped)
        shows = shown_steps()
        # before rendering: a report names a failing part, never fails; it keeps every step's
        # name for its key's readers, and is shown to this caller in its own words
        report = None
        if request.report:
            revision = self._registry.revision
            assembly, report = self._report(request, revision, assembly, layout, freeze, shows)
        # the caller's answer names only the steps its credential is shown
        shown = shown_skipped(assembly.skipped, shows)
        if shown is not assembly.skipped:
            assembly = dataclasses.replace(assembly, skipped=shown)
        caches = self.parts.of(plan)
        rendered = _rendered(assembly, caches) if request.render else None
        payload = caches.payload(assembly)
        skipped = [skipped_to_proto(step) for step in assembly.skipped]
        self.parts.used(plan)
        response = assemble_response(
            assembly,
            self._registry.revision,
            rendered,
            report,
            plan.is_static and not plan.out_of_reach,  # a client asks again: each names them
            payload,
            skipped,
            plan.revision,
            plan.chain,
            plan.rules_only and not skipped,  # by the fields too; a skip is asked again
        )
        self._check_sendable(len(response), report is not None)
        if stamp is not None and not skipped:  # one without a step is not the plan's answer
            self.responses.put(key, response)
            self.responses.index(encoded, key, stamp)
        return Answered(response, assembly.skipped)

    def _stamp(self, plan: Plan, scope: str | None, generation: int) -> Stamp:
        """What a kept response for `plan`, asked for `scope`, holds while: the revision of
        the keys it read, taken before the assembly runs (a change while it runs moves it)."""
        keys = _read_keys(plan, scope)
        static = plan.is_static
        revision, reach = self._registry.chain_revision(keys), self._registry.reach_epoch
        return Stamp(keys, revision, None if static else generation, reach)

    def _count_skipped(self, skipped: tuple[Skipped, ...]) -> None:
        for step in skipped:
            kind = step.kind.value if step.kind in (Kind.LISTENER, Kind.RULE) else "provider"
            self._metrics.skipped_callbacks.labels(kind, step.reason).inc()
            self._skip_log.warning(
                (step.registration_id, step.reason),
                "assembly went on without %s %s: %s (failure_policy IGNORE)",
                kind,
                step.name or "(unnamed)",
                step.message,
            )

    def _report(
        self,
        request: pb.AssembleRequest,
        revision: int,
        assembly: Assembly,
        default: Layout,
        freeze: Freeze,
        shows: Shows,
    ) -> tuple[Assembly, pb.AssemblyReport]:
        """The assembly as reported (its tools in the key's stable order, when configured)
        and its report, as a caller shown the steps of the layers `shows` names sees it."""
        key = history_key(self._registry.limits, request.context.scope, request.report_key)
        layout = layout_from_proto(request.prefix_layout, default)
        settings = self._registry.settings
        stable = None
        if settings.tool_order_mode == "stable":  # the names tool_order places keep them
            stable = frozenset(settings.tool_order or ()) - {TOOL_ORDER_REST}
        reported = self._reporter.report(key, assembly, layout, revision, stable, freeze)
        self._metrics.reported(reported)
        return reported.assembly, report_to_proto(reported.report, key, shows)

    def _check_sendable(self, size: int, with_report: bool) -> None:
        """Fail with a reason here rather than let gRPC refuse to send it without one."""
        limit = self._max_message_bytes
        if size > limit:
            what = "assembly, with its report," if with_report else "assembly"
            raise ServiceError(
                Status.RESOURCE_EXHAUSTED,
                Reason.RESPONSE_TOO_LARGE,
                f"the {what} is {size} bytes, over the largest message the sidecar sends"
                f" ({limit} bytes, limits.max_message_bytes)",
            )


def _read_keys(plan: Plan, scope: str | None) -> tuple[str, ...]:
    """The scope keys an assembly for `scope` read: its plan's chain, and the key asked for
    when no handle holds it yet (its plan is the global one until one does)."""
    if scope and scope != plan.scope:
        return (scope, *plan.chain)
    return tuple(plan.chain)


def _shown(error: Failure) -> Failure:
    """`error` as the caller is told it: when a step not shown to its credential by name
    failed the assembly, in words that name neither the step nor its owner."""
    message = None if error.step is None else shown_failure(error.step, shown_steps())
    return error if message is None else RegistryError(error.status, error.reason, message)


def history_key(limits: Limits, scope: str, report_key: str) -> HistoryKey:
    """The history a request's report goes to: its report key's, else its scope's."""
    limits.check_name("report key", report_key)
    limits.check_name("scope", scope)
    return history_key_from_proto(scope, report_key)


def _rendered(assembly: Assembly, caches: part_caches.PartCaches) -> Pieces:
    """The rendered prompt and snapshot's encoding in pieces (from the plan's kept texts of
    unchanged parts); RENDER_FAILED when a section cannot be."""
    try:
        return caches.rendered(assembly)
    except RenderFailure as error:
        failure = RegistryError(Status.FAILED_PRECONDITION, Reason.RENDER_FAILED, str(error))
        raise failure from None
