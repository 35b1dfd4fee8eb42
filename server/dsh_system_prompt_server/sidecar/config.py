"""The sidecar's TOML config: every component's keys composed into one, validated at start.

Each key is declared once, with its default, kind, reload rule and doc, in the settings of
the component it feeds (`config/keys.py` says how); this module composes them (`SidecarConfig`),
adds the process's own, and checks what no single key can say.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..config import (
    Choice,
    ConfigError,
    Custom,
    Flag,
    Reload,
    Seconds,
    Text,
    group,
    names,
    read,
    setting,
    with_values,
)
from ..guard import ADMIN, Credential, Grants, Role
from ..registry import RegistrySettings, check_callback_timeouts
from ..rpc import StateSettings
from ..wire import host_and_port, is_loopback
from .config_values import check_pem, check_token, no_unknown, typed

LOG_LEVELS = ("debug", "info", "warning", "error")
_A_FILE = "a file name"


def _pem_file(doc: str, flag: str) -> str | None:
    """A TLS file's key: a file name, read when the server starts, so kept until a restart."""
    return setting(None, Text(what=_A_FILE), doc, reload=Reload.RESTART, flag=flag)


@dataclass(frozen=True)
class Security:
    """Optional bearer-token auth and TLS (mutual when a client CA is given); each file is
    read at start: missing, unreadable, not UTF-8 or empty (a token), not PEM (TLS) is refused
    naming its key and file."""

    auth_token_file: str | None = setting(
        None,
        Text(what=_A_FILE),
        "require `authorization: Bearer <token>` with the token in this file: the `admin`"
        " credential (read again at every reload)",
        reload=Reload.WITH_AUTH,
        flag="--auth-token-file",
    )
    tls_cert_file: str | None = _pem_file("the server's certificate (PEM)", "--tls-cert")
    tls_key_file: str | None = _pem_file("the server's private key (PEM)", "--tls-key")
    tls_client_ca_file: str | None = _pem_file(
        "the CA of client certificates (mutual TLS); needs the certificate and key",
        "--tls-client-ca",
    )


def _address(value: str) -> None:
    host_and_port(value)


def _credentials(name: str, value: object) -> tuple[Credential, ...]:
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise ConfigError(f"config key '{name}' must be an array of tables ([[{name}]])")
    return tuple(_credential(entry, f"{name}[{index}].") for index, entry in enumerate(value))


@dataclass(frozen=True)
class SidecarConfig:
    """Everything the sidecar reads from its config file (and flags)."""

    registry: RegistrySettings = group(RegistrySettings)
    state: StateSettings = group(StateSettings)
    security: Security = group(Security)
    shutdown_grace_s: float = setting(
        5.0, Seconds(zero=""), "how long calls in flight may take after SIGTERM"
    )
    dead_peer_timeout_s: float = setting(
        20.0,
        Seconds(),
        "a client that stops answering keepalive pings is dropped (its session disposed)"
        " within this bound",
        reload=Reload.RESTART,
    )
    handshake_timeout_s: float = setting(
        5.0,
        Seconds(),
        "a connection that has not sent the HTTP/2 preface and SETTINGS (after TLS) within"
        " this is closed, so idle connections cannot hold `limits.max_connections`; on the"
        " admin page, one that has not sent a whole request head",
        reload=Reload.RESTART,
    )
    reflection: bool | None = setting(
        None,
        Flag(),
        "server reflection (default: on for loopback and unix sockets)",
        reload=Reload.RESTART,
        flag="--reflection",
        shown="by address",
    )
    log_level: str = setting("info", Choice(LOG_LEVELS), "the log's level", flag="--log-level")
    log_format: str = setting(
        "text",
        Choice(("text", "json")),
        "the log's format: a line of text, or a JSON object, per record",
        reload=Reload.RESTART,
        flag="--log-format",
    )
    metrics_listen: str | None = setting(
        None,
        Text(_address, "an address"),
        "serve Prometheus /metrics on `HOST:PORT`",
        reload=Reload.RESTART,
        flag="--metrics-listen",
    )
    metrics_key_labels: bool = setting(
        False,
        Flag(),
        "fill the `scope` and `key` labels of the prompt-cache metrics with scope keys and"
        " report keys; off, `/metrics` (which has no auth) names none",
        reload=Reload.RESTART,
    )
    admin_listen: str | None = setting(
        None,
        Text(_address, "an address"),
        "serve the read-only admin page on `HOST:PORT` (a loopback address unless"
        " `admin_allow_remote`)",
        reload=Reload.RESTART,
        flag="--admin-listen",
        shown="absent (off)",
    )
    admin_allow_remote: bool = setting(
        False,
        Flag(),
        "let `admin_listen` take a non-loopback address; needs `auth_token_file`",
        reload=Reload.RESTART,
        flag="--admin-allow-remote",
    )
    credentials: tuple[Credential, ...] = setting(
        (),
        Custom(_credentials, "[[credentials]] tables"),
        "more credentials, each with a role (`admin`, `agent`, `reader`), a `token_file` or a"
        " `client_certificate` name, and its scopes and grants (Trust model)",
        reload=Reload.WITH_AUTH,
    )


_AGENT_GRANTS = {
    "global": "global_layer",
    "complete": "complete",
    "global_listeners": "global_listeners",
    "builtins": "builtins",
}
POLL_S = 1.0  # how often a config file is compared with what was loaded (sidecar/reload.py)
CREDENTIAL_KEYS = {
    "name",
    "role",
    "token_file",
    "client_certificate",
    "scopes",
    "values",
    *_AGENT_GRANTS,
}


def load_config(path: str | Path | None) -> SidecarConfig:
    """Read and validate `path`; None gives the defaults."""
    if path is None:
        return SidecarConfig()
    import tomllib  # only a config file needs it

    try:
        with open(path, "rb") as file:
            raw = tomllib.load(file)
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
    except UnicodeDecodeError as error:  # tomllib decodes the bytes itself
        raise ConfigError(f"config file {path} is not UTF-8 text ({error.reason})") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from None
    return parse_config(raw)


def parse_config(raw: dict[str, Any]) -> SidecarConfig:
    """Validate a parsed config table."""
    return _checked(read(SidecarConfig, raw))


def with_overrides(config: SidecarConfig, values: dict[str, object]) -> SidecarConfig:
    """The config with the keys the command line gave (`config.flag_values`) over it."""
    return _checked(with_values(config, values))


def _checked(config: SidecarConfig) -> SidecarConfig:
    """What no single key can say: files, and keys that need each other."""
    check_callback_timeouts(config.registry)
    if config.admin_listen is not None:
        _check_admin(config)
    _check_security(config.security)
    _check_credentials(config)
    return config


def all_credentials(config: SidecarConfig) -> list[Credential]:
    """Every credential: `auth_token_file`'s admin first, then [[credentials]]."""
    token_file = config.security.auth_token_file
    admin = [replace(ADMIN, token_file=token_file)] if token_file else []
    return [*admin, *config.credentials]


def auth_enabled(config: SidecarConfig) -> bool:
    """Whether calls must present a credential (else every caller is an admin)."""
    return bool(all_credentials(config))


def _credential(entry: dict[str, Any], prefix: str) -> Credential:
    no_unknown(entry, CREDENTIAL_KEYS, prefix)
    name = typed(entry, "name", str, "", prefix)
    if not name:
        raise ConfigError(f"config key '{prefix}name' must name the credential (logs and errors)")
    roles = ", ".join(role.value for role in Role)
    role_name = typed(entry, "role", str, "", prefix)
    if role_name not in {role.value for role in Role}:
        raise ConfigError(f"config key '{prefix}role' must be one of {roles}, not {role_name!r}")
    role = Role(role_name)
    token_file = typed(entry, "token_file", str, "", prefix) or None
    certificate = typed(entry, "client_certificate", str, "", prefix) or None
    if bool(token_file) == bool(certificate):
        raise ConfigError(
            f"config key '{prefix}token_file': a credential is a token file or a"
            " client_certificate name, exactly one of them"
        )
    return Credential(
        name=name,
        role=role,
        grants=_grants(entry, role, prefix),
        token_file=token_file,
        client_certificate=certificate,
    )


def _grants(entry: dict[str, Any], role: Role, prefix: str) -> Grants:
    allowed = {
        Role.ADMIN: set(),
        Role.AGENT: {"scopes", *_AGENT_GRANTS},
        Role.READER: {"scopes", "values"},
    }[role]
    for key in ("scopes", "values", *_AGENT_GRANTS):
        if key in entry and key not in allowed:
            raise ConfigError(f"config key '{prefix}{key}' does not apply to role {role.value!r}")
    scopes = entry.get("scopes", ["*"] if role is Role.READER else [])
    if not isinstance(scopes, list) or not all(isinstance(p, str) and p for p in scopes):
        raise ConfigError(f"config key '{prefix}scopes' must be a list of scope key patterns")
    flags = {field: typed(entry, key, bool, False, prefix) for key, field in _AGENT_GRANTS.items()}
    return Grants(scopes=tuple(scopes), values=typed(entry, "values", bool, False, prefix), **flags)


_SECURITY = names(Security)
_SIDECAR = names(SidecarConfig)


def _check_credentials(config: SidecarConfig) -> None:
    """Names and tokens that tell credentials apart; certificates only under mutual TLS."""
    admin = config.security.auth_token_file
    names = {ADMIN.name} if admin else set()
    tokens = {check_token(_SECURITY.auth_token_file, admin): ADMIN.name} if admin else {}
    for index, credential in enumerate(config.credentials):
        prefix = f"credentials[{index}]."
        if credential.name in names:
            raise ConfigError(
                f"config key '{prefix}name': {credential.name!r} names another"
                f" credential too ('admin' is {_SECURITY.auth_token_file}'s)"
            )
        names.add(credential.name)
        if credential.client_certificate and not config.security.tls_client_ca_file:
            raise ConfigError(
                f"config key '{prefix}client_certificate' needs '{_SECURITY.tls_client_ca_file}':"
                " client certificates are verified only under mutual TLS"
            )
        if credential.token_file:
            token = check_token(f"{prefix}token_file", credential.token_file)
            if token in tokens:
                raise ConfigError(
                    f"config key '{prefix}token_file': the same token as"
                    f" credential {tokens[token]!r}"
                )
            tokens[token] = credential.name


def _check_admin(config: SidecarConfig) -> None:
    """The admin page shows every prompt: loopback only, unless allowed and behind a token."""
    assert config.admin_listen is not None
    listen, allow, token = (
        _SIDECAR.admin_listen,
        _SIDECAR.admin_allow_remote,
        _SECURITY.auth_token_file,
    )
    host, _ = host_and_port(config.admin_listen)  # its kind checked it
    if not config.admin_allow_remote and not is_loopback(host):
        raise ConfigError(
            f"config key '{listen}': {host} is not a loopback address; the admin page"
            f" shows every prompt, so serving it elsewhere needs '{allow} = true'"
            f" (and '{token}')"
        )
    if config.admin_allow_remote and not config.security.auth_token_file:
        raise ConfigError(
            f"config key '{allow}' needs '{token}': a page reachable from other hosts must"
            " ask for the token"
        )


def _check_security(security: Security) -> None:
    cert, key, client_ca = (
        security.tls_cert_file,
        security.tls_key_file,
        security.tls_client_ca_file,
    )
    named = _SECURITY
    if client_ca and not (cert and key):
        raise ConfigError(
            f"config key '{named.tls_client_ca_file}' ({client_ca}) needs"
            f" '{named.tls_cert_file}' and '{named.tls_key_file}' too: client certificates"
            " are checked only over TLS (else it would serve plaintext)"
        )
    if bool(cert) != bool(key):
        pair = (named.tls_cert_file, named.tls_key_file)
        given, missing = pair if cert else pair[::-1]
        raise ConfigError(f"config key '{given}' ({cert or key}) needs '{missing}' too")
    if cert and key:
        check_pem(named.tls_cert_file, cert, lambda context: context.load_verify_locations(cert))
        check_pem(
            named.tls_key_file,
            key,
            lambda context: context.load_cert_chain(cert, key),
            f"private key for {named.tls_cert_file}",
        )
    if client_ca:
        check_pem(
            named.tls_client_ca_file,
            client_ca,
            lambda context: context.load_verify_locations(client_ca),
        )
