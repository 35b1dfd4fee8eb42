"""A callback's failure policy (docs/protocol.md, "Failure policy"): under FAIL, the spec's and
the default, a provider or listener that fails fails the assembly, naming it; under IGNORE the
assembly goes on without its step and says which step it skipped and why.

Modelled on Kubernetes admission webhooks' `failurePolicy: Fail | Ignore` and Envoy ext_proc's
`failure_mode_allow`: the callback's owner decides. IGNORE is its promise that the step only
decorates the prompt, never filters it (a skipped filter lets through what it exists to hold
back); what a callback returns does not tell the two apart, so the sidecar does not try.
"""

from __future__ import annotations

from ..errors import CALLBACK_FAILURES, Failure
from ..model import (
    AnyRegistration,
    Dynamic,
    FailurePolicy,
    ListenerRegistration,
    RuleRegistration,
    Skipped,
    runs_everywhere,
)


def policy_of(entry: AnyRegistration) -> FailurePolicy:
    """The failure policy a listener, rule or dynamic provider declared; FAIL for the rest."""
    if isinstance(entry, ListenerRegistration | RuleRegistration):
        return entry.failure_policy
    if isinstance(entry.value, Dynamic):
        return entry.value.failure_policy
    return FailurePolicy.FAIL


class Skips:
    """The steps one assembly went on without, in the order they were skipped."""

    def __init__(self) -> None:
        self.steps: list[Skipped] = []

    @staticmethod
    def ignores(entry: AnyRegistration, error: Failure) -> bool:
        """Whether the assembly goes on without `entry` when it fails with `error`: one of
        its own failures (an assembly rule its answer breaks, a reserved tool name, fails)."""
        return policy_of(entry) is FailurePolicy.IGNORE and error.reason in CALLBACK_FAILURES

    def skip(self, entry: AnyRegistration, error: Failure) -> bool:
        """Record `entry` as skipped for `error` if its policy ignores it; False (nothing
        recorded) when the failure fails the assembly."""
        step = Skipped(
            kind=entry.kind,
            name=entry.name,
            scope=entry.scope,
            registration_id=entry.id,
            reason=str(error.reason),
            message=error.message,
            everywhere=runs_everywhere(entry),
        )
        if not self.ignores(entry, error):
            if error.reason in CALLBACK_FAILURES:
                error.step = step  # it fails the assembly naming `entry`: which caller may know
            return False
        self.steps.append(step)
        return True
