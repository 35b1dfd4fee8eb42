"""Listen addresses: parsed strictly, and exclusive (a second sidecar never shares one);
and which host names are loopback (`is_loopback`), for the admin page's Host check."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import stat

UNIX_PREFIX = "unix:"


class AddressError(ValueError):
    """A listen address that is not `HOST:PORT` or `unix:PATH`."""


class AddressInUse(OSError):
    """Another process serves on the address already."""

    def __init__(self) -> None:
        super().__init__("address in use")


def host_and_port(address: str) -> tuple[str, int]:
    """(host, port) of `HOST:PORT` or `[V6]:PORT`; the port is 0 to 65535 and required
    (gRPC would quietly take 443 for `localhost`)."""
    host, colon, port = address.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if not colon or not host or not port.isdigit() or (":" in host and not bracketed):
        raise AddressError(f"{address!r} is not HOST:PORT (e.g. 127.0.0.1:50051, [::1]:0)")
    if int(port) > 65_535:
        raise AddressError(f"{address!r}: port {port} is not 0 to 65535")
    return host.strip("[]"), int(port)


def check_listen(address: str) -> None:
    """Raise AddressError unless `address` is `HOST:PORT` or `unix:PATH`."""
    if address.startswith(UNIX_PREFIX):
        if not address[len(UNIX_PREFIX) :]:
            raise AddressError(f"{address!r} names no socket path (unix:PATH)")
        return
    host_and_port(address)


def claim_unix_socket(address: str) -> None:
    """Before binding `unix:PATH`: a live socket there is AddressInUse; a stale one
    (nothing accepts on it) is removed. gRPC itself would unlink a live one."""
    path = address[len(UNIX_PREFIX) :]
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return  # not a socket: the bind fails on its own and says so
    except OSError:
        return  # nothing there
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        except OSError:
            pass  # it exists and did not refuse: treat as live
    raise AddressInUse()


def bind_failure(address: str) -> OSError:
    """Why gRPC could not bind `address` (it only says "failed to bind"): probe it."""
    if address.startswith(UNIX_PREFIX):
        return OSError("cannot bind the unix socket")
    host, port = host_and_port(address)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        return OSError(error.strerror or str(error))
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        try:
            probe.bind(sockaddr)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return AddressInUse()
            return OSError(error.strerror or str(error))
    return OSError("cannot bind")


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an IP address, without brackets) is this host only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
