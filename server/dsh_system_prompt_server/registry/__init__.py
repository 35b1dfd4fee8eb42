"""The registry's semantics in plain Python: layers, shadowing, ordering, assembly.

Belongs here: the values (`model`, `provenance`, `errors`, `limits`, `settings`), what is
admitted (`admission`, `accounts`), how far each owner's callbacks reach (`reach`), the layers
and scope tree, change notifications, filters, each scope's plan kept until a change
(`plan_cache`) and the `Registry` itself; how one assembly is made in `assembly/`; the
registry's side of callbacks in `callbacks/`. Nothing here knows about gRPC. It sits on
`config/` alone in `LAYERS` in tests/package/test_package.py: it imports nothing else of the
package, and the shared core.
"""

from .accounts import Client, ClientCounts
from .admission import BUILTIN_SECTIONS
from .assembly import Plan, validate_tool_order
from .callbacks import CallbackCache, context_key
from .changes import ChangeFeed, Missed, Subscription
from .errors import CALLBACK_FAILURES, Failure, RegistryError, ServiceError, Status
from .filters import (
    STEPS,
    Filter,
    anonymous,
    everywhere_step,
    owner_label,
    public_ref,
    shown_failure,
    shown_skipped,
)
from .limits import LIMIT_KEYS, Limits, quota_exceeded, quota_limit, too_large, value_bytes
from .model import (
    SIDECAR_OWNER,
    Action,
    AnyRegistration,
    AssembleContext,
    Assembly,
    CachePolicy,
    ChangeEvent,
    ContextRegistration,
    Dynamic,
    Exchange,
    FailurePolicy,
    Kind,
    ListenerHost,
    ListenerRegistration,
    NextFn,
    Part,
    ProvidedValue,
    ProviderCall,
    ProviderHost,
    Registration,
    RuleRegistration,
    SectionRegistration,
    Skipped,
    StepRegistration,
    Tool,
    ToolSet,
    ValueRegistration,
    new_id,
    runs_everywhere,
)
from .provenance import Origin, OriginKind, Origins, PartKey, PartKind, Step, Trace, unnamed_step
from .reach import Reach
from .registry import Registry
from .rules import Inputs, OperatorRule, Rule, apply, read_rules
from .settings import RegistrySettings, check_callback_timeouts

__all__ = [
    "BUILTIN_SECTIONS",
    "CALLBACK_FAILURES",
    "LIMIT_KEYS",
    "SIDECAR_OWNER",
    "STEPS",
    "Action",
    "AnyRegistration",
    "AssembleContext",
    "Assembly",
    "CachePolicy",
    "CallbackCache",
    "ChangeEvent",
    "ChangeFeed",
    "Client",
    "ClientCounts",
    "ContextRegistration",
    "Dynamic",
    "Exchange",
    "Failure",
    "FailurePolicy",
    "Filter",
    "Inputs",
    "Kind",
    "Limits",
    "ListenerHost",
    "ListenerRegistration",
    "Missed",
    "NextFn",
    "OperatorRule",
    "Origin",
    "OriginKind",
    "Origins",
    "Part",
    "PartKey",
    "PartKind",
    "Plan",
    "ProvidedValue",
    "ProviderCall",
    "ProviderHost",
    "Reach",
    "Registration",
    "Registry",
    "RegistryError",
    "RegistrySettings",
    "Rule",
    "RuleRegistration",
    "SectionRegistration",
    "ServiceError",
    "Skipped",
    "Status",
    "Step",
    "StepRegistration",
    "Subscription",
    "Tool",
    "ToolSet",
    "Trace",
    "ValueRegistration",
    "anonymous",
    "apply",
    "check_callback_timeouts",
    "context_key",
    "everywhere_step",
    "new_id",
    "owner_label",
    "public_ref",
    "quota_exceeded",
    "quota_limit",
    "read_rules",
    "runs_everywhere",
    "shown_failure",
    "shown_skipped",
    "too_large",
    "unnamed_step",
    "validate_tool_order",
    "value_bytes",
]
