"""Who may call, and when: credentials and their roles, each request as the policy sees it,
who a call comes from, each client's fair share of the event loop, and the drain gate that
refuses new calls once the sidecar is stopping.

It may import only the folders before it in `LAYERS` in tests/package/test_package.py (the wire's
handlers and statuses among them).

Credentials are checked only when the config has some: `Authenticator` and `AuthInterceptor`
(`auth.py`, `access.py`) load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .charging import sharing, wire_s
from .clients import client_of, sees_values, shown_steps
from .gate import Gate
from .paying import Payer, payer, paying_turn
from .policy import ADMIN, Credential, Grants, Request, Role, Verb, decide, step_names
from .shares import ANONYMOUS, Shares, ShareSettings, share_key

if TYPE_CHECKING:
    from .auth import Authenticator, AuthInterceptor

__all__ = [
    "ADMIN",
    "ANONYMOUS",
    "AuthInterceptor",
    "Authenticator",
    "Credential",
    "Gate",
    "Grants",
    "Payer",
    "Request",
    "Role",
    "ShareSettings",
    "Shares",
    "Verb",
    "client_of",
    "decide",
    "payer",
    "paying_turn",
    "sees_values",
    "share_key",
    "sharing",
    "shown_steps",
    "step_names",
    "wire_s",
]


def __getattr__(name: str) -> Any:
    """`Authenticator` and `AuthInterceptor` on first use (PEP 562): only credentials need them."""
    if name in ("Authenticator", "AuthInterceptor"):
        from . import auth

        return getattr(auth, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
