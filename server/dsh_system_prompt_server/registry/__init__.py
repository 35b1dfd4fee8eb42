"""The registry's semantics in plain Python: layers, shadowing, ordering, assembly.

Nothing here knows about gRPC; the service translates to and from it. Here: the values
(`model`, `provenance`, `errors`, `limits`, `settings`), what is admitted (`admission`), the
layers and scope tree, change notifications, filters, each scope's plan kept until a change
(`plan_cache`) and the `Registry` itself; how one assembly is made in `assembly/`; the
registry's side of callbacks (listeners, cached answers, ejection) in `callbacks/`.
Everything above imports it; it imports only the shared core.
"""

from .accounts import Client, ClientCounts
from .assembly.tool_order import validate_tool_order
from .callbacks.cache import CallbackCache
from .changes import ChangeFeed, Missed, Subscription
from .errors import Failure, RegistryError, ServiceError, Status
from .filters import Filter, owner_label, public_ref
from .limits import Limits
from .model import (
    SIDECAR_OWNER,
    Action,
    AnyRegistration,
    AssembleContext,
    Assembly,
    CachePolicy,
    ChangeEvent,
    Dynamic,
    FailurePolicy,
    Kind,
    ListenerHost,
    NextFn,
    Part,
    ProvidedValue,
    ProviderCall,
    ProviderHost,
    Registration,
    Skipped,
    Tool,
    ToolSet,
    ValueRegistration,
    new_id,
)
from .provenance import Origin, OriginKind, Origins, PartKey, PartKind, Step, Trace
from .registry import Registry
from .settings import RegistrySettings

__all__ = [
    "SIDECAR_OWNER",
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
    "Dynamic",
    "Failure",
    "FailurePolicy",
    "Filter",
    "Kind",
    "Limits",
    "ListenerHost",
    "Missed",
    "NextFn",
    "Origin",
    "OriginKind",
    "Origins",
    "Part",
    "PartKey",
    "PartKind",
    "ProvidedValue",
    "ProviderCall",
    "ProviderHost",
    "Registration",
    "Registry",
    "RegistryError",
    "RegistrySettings",
    "ServiceError",
    "Skipped",
    "Status",
    "Step",
    "Subscription",
    "Tool",
    "ToolSet",
    "Trace",
    "ValueRegistration",
    "new_id",
    "owner_label",
    "public_ref",
    "validate_tool_order",
]
