"""The sidecar's TOML config, validated at start: every key, its type and its range."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from dsh_system_prompt_core import PERSONA_SECTION, RenderFailure, check_template

from ..guard import ADMIN, DEFAULT_LAG_S, Credential, Grants, Role
from ..registry import Limits, RegistryError, RegistrySettings, validate_tool_order
from ..reports import DEFAULT_LAYOUT, TOKENIZERS, Layout
from ..wire import AddressError, host_and_port, is_loopback
from .config_values import (
    ConfigError,
    check_pem,
    check_token,
    count,
    no_unknown,
    optional_path,
    seconds,
    typed,
)

LogFormat = Literal["text", "json"]
LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_HISTORY = 1_000_000  # change events kept for resuming watchers, at most
MAX_WATCH_COALESCE_S = 1.0  # every batching watcher's events wait this long at most
MAX_FAIR_SHARE_LAG_S = 1.0  # how late the loop may run before clients get equal shares, at most
MAX_EJECT_AFTER = 1_000  # consecutive timeouts before a callback is ejected, at most


@dataclass(frozen=True)
class ServerLimits:
    """Limits of the transport and of the sidecar as a whole."""

    max_message_bytes: int = 4 * 1024 * 1024
    max_sessions: int = 1_000
    max_sessions_per_peer: int = 100  # per client (rpc/guard/clients.py): headroom for others
    max_watchers: int = 1_000
    max_outbox_bytes: int = 8 * 1024 * 1024  # unread by one session or listener
    max_watchers_per_peer: int = 64  # change and prompt watches per client
    max_response_cache_bytes: int = 32 * 1024 * 1024  # encoded Assemble responses kept
    max_report_history_bytes: int = 64 * 1024 * 1024  # prompt-cache report history kept
    max_connections: int = 4096  # open connections on the gRPC port; more are closed at once


@dataclass(frozen=True)
class Security:
    """Optional bearer-token auth and TLS (mutual when a client CA is given)."""

    auth_token_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None


@dataclass(frozen=True)
class SidecarConfig:
    """Everything the sidecar reads from its config file (and flags)."""

    registry: RegistrySettings = field(default_factory=RegistrySettings)
    server_limits: ServerLimits = field(default_factory=ServerLimits)
    security: Security = field(default_factory=Security)
    shutdown_grace_s: float = 5.0
    dead_peer_timeout_s: float = 20.0
    handshake_timeout_s: float = 5.0  # a connection's HTTP/2 preface (or request head) deadline
    watch_buffer: int = 1024
    prompt_coalesce_s: float = 0.1  # a prompt watcher's wait for a burst of changes to end
    watch_coalesce_s: float = 0.005  # a batching change watcher's wait for a burst to end
    fair_share_lag_s: float = DEFAULT_LAG_S  # how late the loop may run before shares apply
    reflection: bool | None = None  # None: on when listening on loopback or a unix socket
    log_level: str = "info"
    log_format: LogFormat = "text"
    metrics_listen: str | None = None
    metrics_key_labels: bool = False  # /metrics is unauthenticated: no scope keys unless asked
    tokenizer: str | None = None  # for token counts in reports; None: bytes only
    report_history: int = 8  # recent reported assemblies kept per history key
    report_keys: int = 1024  # history keys kept (scopes or caller-named keys)
    prefix_layout: Layout = DEFAULT_LAYOUT  # the model server's prefix order, for reports
    admin_listen: str | None = None  # HOST:PORT of the read-only admin page; None: off
    admin_allow_remote: bool = False  # else admin_listen must be a loopback address
    credentials: tuple[Credential, ...] = ()  # [[credentials]]: besides auth_token_file's admin


_TOP_KEYS = {  # every top-level key a config file may have, sorted
    "admin_allow_remote",
    "admin_listen",
    "change_history",
    "credentials",
    "dead_peer_timeout_s",
    "eject_after_timeouts",
    "fair_share_lag_s",
    "handshake_timeout_s",
    "include_harness_identity",
    "include_runtime_context",
    "limits",
    "log_format",
    "log_level",
    "max_callback_timeout_s",
    "metrics_key_labels",
    "metrics_listen",
    "persona",
    "prefix_layout",
    "prompt_coalesce_s",
    "provider_timeout_s",
    "reflection",
    "report_history",
    "report_keys",
    "shutdown_grace_s",
    "tokenizer",
    "tool_order",
    "watch_buffer",
    "watch_coalesce_s",
    *(f.name for f in fields(Security)),
}
_AGENT_GRANTS = {
    "global": "global_layer",
    "complete": "complete",
    "global_listeners": "global_listeners",
    "builtins": "builtins",
}
CREDENTIAL_KEYS = {
    "name",
    "role",
    "token_file",
    "client_certificate",
    "scopes",
    "values",
    *_AGENT_GRANTS,
}
_LIMIT_KEYS = {f.name for f in (*fields(Limits), *fields(ServerLimits))}


def load_config(path: str | Path | None) -> SidecarConfig:
    """Read and validate `path`; None gives the defaults."""
    if path is None:
        return SidecarConfig()
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
    no_unknown(raw, _TOP_KEYS, "")
    limits_table = raw.get("limits", {})
    if not isinstance(limits_table, dict):
        raise ConfigError("config key 'limits' must be a table")
    no_unknown(limits_table, _LIMIT_KEYS, "limits.")
    registry = RegistrySettings(
        persona=_persona(raw),
        include_harness_identity=typed(raw, "include_harness_identity", bool, True),
        include_runtime_context=typed(raw, "include_runtime_context", bool, True),
        tool_order=_tool_order(raw.get("tool_order")),
        provider_timeout_s=seconds(raw, "provider_timeout_s", 5.0),
        eject_after_timeouts=_eject_after(raw),
        max_callback_timeout_s=_callback_timeout(raw),
        limits=Limits(**_counts(limits_table, Limits())),
        change_history=_history(raw),
    )
    log_level = typed(raw, "log_level", str, "info")
    if log_level not in LOG_LEVELS:
        raise ConfigError(f"config key 'log_level' must be one of {', '.join(LOG_LEVELS)}")
    log_format = typed(raw, "log_format", str, "text")
    if log_format not in ("text", "json"):
        raise ConfigError("config key 'log_format' must be 'text' or 'json'")
    reflection = raw.get("reflection")
    if reflection is not None and not isinstance(reflection, bool):
        raise ConfigError(f"config key 'reflection' must be a bool, not {reflection!r}")
    return _checked(
        SidecarConfig(
            registry=registry,
            server_limits=ServerLimits(**_counts(limits_table, ServerLimits())),
            security=Security(**{f.name: optional_path(raw, f.name) for f in fields(Security)}),
            shutdown_grace_s=seconds(raw, "shutdown_grace_s", 5.0, allow_zero=True),
            dead_peer_timeout_s=seconds(raw, "dead_peer_timeout_s", 20.0),
            handshake_timeout_s=seconds(raw, "handshake_timeout_s", 5.0),
            watch_buffer=count(raw, "watch_buffer", 1024),
            prompt_coalesce_s=seconds(raw, "prompt_coalesce_s", 0.1, allow_zero=True),
            watch_coalesce_s=_watch_coalesce(raw),
            fair_share_lag_s=_fair_share_lag(raw),
            reflection=reflection,
            log_level=log_level,
            log_format="json" if log_format == "json" else "text",
            metrics_listen=typed(raw, "metrics_listen", str, "") or None,
            metrics_key_labels=typed(raw, "metrics_key_labels", bool, False),
            tokenizer=_tokenizer(raw),
            report_history=count(raw, "report_history", 8),
            report_keys=count(raw, "report_keys", 1024),
            prefix_layout=_layout(raw),
            admin_listen=typed(raw, "admin_listen", str, "") or None,
            admin_allow_remote=typed(raw, "admin_allow_remote", bool, False),
            credentials=_credentials(raw.get("credentials", [])),
        )
    )


def with_overrides(config: SidecarConfig, **overrides: Any) -> SidecarConfig:
    """The config with command-line flags applied (None means "not given")."""
    security = {k: v for k, v in overrides.items() if k in {f.name for f in fields(Security)}}
    top = {k: v for k, v in overrides.items() if k not in security and v is not None}
    given_security = {k: v for k, v in security.items() if v is not None}
    return _checked(replace(config, security=replace(config.security, **given_security), **top))


def _history(raw: dict[str, Any]) -> int:
    value = count(raw, "change_history", 1024)
    if value > MAX_HISTORY:  # each kept event costs memory for as long as it is kept
        raise ConfigError(
            f"config key 'change_history' must be from 1 to {MAX_HISTORY}, not {value}"
        )
    return value


def _eject_after(raw: dict[str, Any]) -> int:
    value = typed(raw, "eject_after_timeouts", int, 1)
    if not 0 <= value <= MAX_EJECT_AFTER:
        raise ConfigError(
            f"config key 'eject_after_timeouts' must be from 0 (never eject) to"
            f" {MAX_EJECT_AFTER}, not {value}"
        )
    return value


def _callback_timeout(raw: dict[str, Any]) -> float:
    value = seconds(raw, "max_callback_timeout_s", 60.0)
    default = seconds(raw, "provider_timeout_s", 5.0)
    if value < default:  # the default time must be one a callback may have
        raise ConfigError(
            f"config key 'max_callback_timeout_s' ({value:g}) must be at least"
            f" 'provider_timeout_s' ({default:g})"
        )
    return value


def _fair_share_lag(raw: dict[str, Any]) -> float:
    # a loop that late has long failed its callers
    return _seconds_up_to(raw, "fair_share_lag_s", DEFAULT_LAG_S, MAX_FAIR_SHARE_LAG_S, " (never)")


def _watch_coalesce(raw: dict[str, Any]) -> float:
    # a delay on every change event of every watcher
    return _seconds_up_to(raw, "watch_coalesce_s", 0.005, MAX_WATCH_COALESCE_S)


def _seconds_up_to(
    raw: dict[str, Any], key: str, default: float, most: float, zero_means: str = ""
) -> float:
    """Seconds from 0 (which means `zero_means`, when said) to `most`."""
    value = seconds(raw, key, default, allow_zero=True)
    if value > most:
        raise ConfigError(
            f"config key '{key}' must be from 0{zero_means} to {most:g} seconds, not {value!r}"
        )
    return value


def _checked(config: SidecarConfig) -> SidecarConfig:
    """What no single key can say: addresses, files and keys that need each other."""
    if config.metrics_listen is not None:
        try:
            host_and_port(config.metrics_listen)
        except AddressError as error:
            raise ConfigError(f"config key 'metrics_listen': {error}") from None
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


def _credentials(value: object) -> tuple[Credential, ...]:
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise ConfigError("config key 'credentials' must be an array of tables ([[credentials]])")
    return tuple(_credential(entry, f"credentials[{index}].") for index, entry in enumerate(value))


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


def _check_credentials(config: SidecarConfig) -> None:
    """Names and tokens that tell credentials apart; certificates only under mutual TLS."""
    admin = config.security.auth_token_file
    names = {ADMIN.name} if admin else set()
    tokens = {check_token("auth_token_file", admin): ADMIN.name} if admin else {}
    for index, credential in enumerate(config.credentials):
        prefix = f"credentials[{index}]."
        if credential.name in names:
            raise ConfigError(
                f"config key '{prefix}name': {credential.name!r} names another"
                " credential too ('admin' is auth_token_file's)"
            )
        names.add(credential.name)
        if credential.client_certificate and not config.security.tls_client_ca_file:
            raise ConfigError(
                f"config key '{prefix}client_certificate' needs 'tls_client_ca_file': client"
                " certificates are verified only under mutual TLS"
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
    try:
        host, _ = host_and_port(config.admin_listen)
    except AddressError as error:
        raise ConfigError(f"config key 'admin_listen': {error}") from None
    if not config.admin_allow_remote and not is_loopback(host):
        raise ConfigError(
            f"config key 'admin_listen': {host} is not a loopback address; the admin page"
            " shows every prompt, so serving it elsewhere needs 'admin_allow_remote = true'"
            " (and 'auth_token_file')"
        )
    if config.admin_allow_remote and not config.security.auth_token_file:
        raise ConfigError(
            "config key 'admin_allow_remote' needs 'auth_token_file': a page reachable from"
            " other hosts must ask for the token"
        )


def _check_security(security: Security) -> None:
    cert, key, client_ca = (
        security.tls_cert_file,
        security.tls_key_file,
        security.tls_client_ca_file,
    )
    if client_ca and not (cert and key):
        raise ConfigError(
            f"config key 'tls_client_ca_file' ({client_ca}) needs 'tls_cert_file' and"
            " 'tls_key_file' too:"
            " client certificates are checked only over TLS (else it would serve plaintext)"
        )
    if bool(cert) != bool(key):
        given, missing = (
            ("tls_cert_file", "tls_key_file") if cert else ("tls_key_file", "tls_cert_file")
        )
        raise ConfigError(f"config key '{given}' ({cert or key}) needs '{missing}' too")
    if cert and key:
        check_pem("tls_cert_file", cert, lambda context: context.load_verify_locations(cert))
        check_pem("tls_key_file", key, lambda context: context.load_cert_chain(cert, key))
    if client_ca:
        check_pem(
            "tls_client_ca_file",
            client_ca,
            lambda context: context.load_verify_locations(client_ca),
        )


def _persona(raw: dict[str, Any]) -> str:
    persona = typed(raw, "persona", str, "")
    try:
        check_template(persona, f'section "{PERSONA_SECTION}"')
    except RenderFailure as error:  # it would fail every render of the pod
        raise ConfigError(f"config key 'persona': {error}") from None
    return persona


def _tokenizer(raw: dict[str, Any]) -> str | None:
    name = typed(raw, "tokenizer", str, "") or None
    if name is not None and name not in TOKENIZERS:
        known = ", ".join(TOKENIZERS)
        raise ConfigError(f"config key 'tokenizer' must be one of: {known} (not {name!r})")
    return name


def _layout(raw: dict[str, Any]) -> Layout:
    name = typed(raw, "prefix_layout", str, DEFAULT_LAYOUT.value)
    if name not in {layout.value for layout in Layout}:
        known = ", ".join(layout.value for layout in Layout)
        raise ConfigError(f"config key 'prefix_layout' must be one of: {known} (not {name!r})")
    return Layout(name)


def _tool_order(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ConfigError("config key 'tool_order' must be a list of tool names")
    try:
        return validate_tool_order(value)
    except RegistryError as error:
        raise ConfigError(error.message) from None


def _counts(table: dict[str, Any], defaults: Limits | ServerLimits) -> dict[str, int]:
    return {
        f.name: count(table, f.name, getattr(defaults, f.name), prefix="limits.")
        for f in fields(defaults)
    }
