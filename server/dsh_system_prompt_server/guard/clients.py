"""Who a call comes from, as far as the sidecar can tell clients apart: what the per-client
quotas (`limits.max_sessions_per_peer`, `limits.max_watchers_per_peer`, and through the
sessions that hold them, `limits.max_listeners_per_peer` and `limits.max_bytes_per_peer`)
count by.

In order of what is known about the call:

1. the credential it presented (auth configured): one principal, one quota, as
   Kubernetes and Envoy count per user, whatever transport and connections it uses;
2. over TCP, the peer's IP address (not its port: one host opening more connections
   stays one client), except a loopback address, which every local process shares, so
   there only the connection tells clients apart (each Python and TypeScript client
   opens its own);
3. nobody, on a unix socket without credentials: gRPC names every such peer `unix:`,
   and grpcio exposes neither the socket nor its SO_PEERCRED (uid, pid), not even
   under local credentials (grpc/grpc#15511, #28755); only the sidecar-wide limits
   bound its sessions and watches there (the socket file's permissions are the
   boundary), and what a session registers counts against the session itself.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable
from contextvars import ContextVar
from urllib.parse import unquote

from ..registry import Client

# The credential name of the call being served, set by the AuthInterceptor for each call it
# admits; each gRPC call runs in a context of its own, so one call never sees another's.
CALLER: ContextVar[str | None] = ContextVar("caller", default=None)
# Whether the call being served may see registered values: False only for a credential not
# granted them (a reader without `values`), set by the AuthInterceptor with CALLER; without
# credentials every caller is an admin. What such a reader is shown of a value is its keyed
# fingerprint (registry.Fingerprints) and, but for a variable's, its size. Asked when a value
# is shown: an open listing's answer follows its credential through a reload.
VALUES: ContextVar[Callable[[], bool]] = ContextVar("values", default=lambda: True)
# Which layers' waterfall steps the call being served is shown by name (None: every one's),
# set with CALLER: a credential that may not read every scope is shown a step held in the
# global layer or in a scope it does not list without its name (docs/operations.md, "Trust
# model"): in its watches and its listings alike.
STEP_NAMES: ContextVar[Callable[[str | None], bool] | None] = ContextVar("steps", default=None)
_TCP = ("ipv4:", "ipv6:")
CREDENTIALED = "credential:"  # the keys of clients told apart by their credential
IDENTIFIED = (CREDENTIALED, "ip:")  # the keys of clients told apart by more than a connection


def client_of(peer: str) -> Client | None:
    """The client of the call being served, which gRPC names `peer`; None when the
    sidecar cannot tell it from any other (a unix socket, no credential)."""
    credential = CALLER.get()
    if credential is not None:
        return Client(f"{CREDENTIALED}{credential}", f'credential "{credential}"')
    return _by_address(peer)


@functools.lru_cache(maxsize=4096)  # a connection's calls name one peer: parsed once each
def _by_address(peer: str) -> Client | None:
    """The client of a call without a credential, from its peer's address."""
    if not peer.startswith(_TCP):
        return None
    # gRPC writes the address as a URI: "ipv4:127.0.0.1:53210", "ipv6:%5B::1%5D:53210".
    address = unquote(peer.partition(":")[2])
    host = address.rpartition(":")[0].strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return Client(peer, f"the connection from {address}")  # not an address: count it alone
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # an IPv4 peer of a dual-stack socket (gRPC names it ipv4: now)
    if ip.is_loopback:
        return Client(peer, f"the connection from {address}")
    return Client(f"ip:{ip}", f"the address {ip}")


def shown_steps() -> Callable[[str | None], bool] | None:
    """Which layers' steps the call being served is shown by name; None: every layer's."""
    return STEP_NAMES.get()


def sees_values() -> Callable[[], bool]:
    """Whether the call being served may see registered values (and their exact sizes), to
    ask when it is shown one: a stream's answer is its credential's as the last reload left it."""
    return VALUES.get()
