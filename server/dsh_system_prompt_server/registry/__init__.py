"""The registry's semantics in plain Python: layers, shadowing, ordering, assembly.

Nothing here knows about gRPC; the service translates to and from it.
"""

from .callback_cache import CallbackCache
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
    Kind,
    ListenerHost,
    NextFn,
    Part,
    ProvidedValue,
    ProviderCall,
    ProviderHost,
    Registration,
    Tool,
    ToolSet,
    ValueRegistration,
    new_id,
)
from .provenance import Origin, OriginKind, Origins, PartKey, PartKind, Step, Trace
from .registry import Registry
from .settings import RegistrySettings
from .tool_order import validate_tool_order

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
    "Dynamic",
    "Failure",
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
