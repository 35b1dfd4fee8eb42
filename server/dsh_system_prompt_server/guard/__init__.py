"""Who may call, and when: credentials and their roles, each request as the policy sees it,
who a call comes from, each client's fair share of the event loop, and the drain gate that
refuses new calls once the sidecar is stopping.

It may import only the folders before it in `LAYERS` in tests/package/test_package.py (the wire's
handlers and statuses among them).
"""

from .auth import Authenticator, AuthInterceptor
from .clients import client_of
from .gate import Gate
from .policy import ADMIN, Credential, Grants, Request, Role, Verb, decide
from .shares import Shares, ShareSettings, share_key, sharing, wire_s

__all__ = [
    "ADMIN",
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
