"""Who may call, and when: credentials and their roles, each request as the policy sees it,
each client's fair share of the event loop, and the drain gate that refuses new calls once
the sidecar is stopping.

Imports `registry/` and `wire/` (`handlers`, `status`); imported by `rpc/` (the streams,
the state, the servicer), `admin/` and `sidecar/`.
"""

from .auth import Authenticator, AuthInterceptor
from .clients import client_of
from .gate import Gate
from .policy import ADMIN, Credential, Grants, Request, Role, Verb, decide
from .shares import DEFAULT_LAG_S, Shares, ShareSettings, share_key, sharing, wire_s

__all__ = [
    "ADMIN",
    "DEFAULT_LAG_S",
    "AuthInterceptor",
    "Authenticator",
    "Credential",
    "Gate",
    "Grants",
    "Request",
    "Role",
    "ShareSettings",
    "Shares",
    "Verb",
    "client_of",
    "decide",
    "share_key",
    "sharing",
    "wire_s",
]
