"""The registry's side of callbacks (dynamic providers and listeners): the installed listeners by
scope, the cached answers of callbacks that declared a cache policy, each callback's time with
its ejection after timeouts in a row, and what an assembly does when one fails (its failure
policy).

Inside `registry/`: it may import the registry's own modules, not `assembly/`; the registry's
face re-exports what the floors above need (a context's cache key).
"""

from .cache import MISSING, CallbackCache, combined, context_key
from .ejection import Budget, Ejector, StepSpans
from .failure_policy import Skips
from .listener_index import ListenerIndex

__all__ = [
    "MISSING",
    "Budget",
    "CallbackCache",
    "Ejector",
    "ListenerIndex",
    "Skips",
    "StepSpans",
    "combined",
    "context_key",
]
