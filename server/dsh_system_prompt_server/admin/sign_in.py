"""Signing in to the admin page: a credential's token, once, then an expiring cookie.

The form posts (by GET: the page is read-only) to the fixed path `/sign-in`, and
the redirect after it goes to one of the page's own paths, never to one taken
from the request as it came (`//host/x` would be another origin). The cookie is
not the token: it names the credential, when it expires, and an HMAC keyed by
the credential's token over both and over the sidecar's incarnation and the
page's port, so a restart, a new token or another port signs everyone out.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from aiohttp import web
from yarl import URL

from ..guard import Authenticator, Credential

COOKIE = "dsp_admin"
PATH = "/sign-in"
SIGNED_IN_S = 8 * 3600  # a working day; then the token is asked for again
_HOME = "/scopes"


@dataclass(frozen=True)
class SignIn:
    """Who the page's visitors are: by `Authorization: Bearer`, or by the cookie."""

    authenticator: Authenticator
    incarnation: str
    port: int
    secure: bool  # the page is served over TLS: the cookie is Secure

    def credential(self, request: web.Request) -> Credential | None:
        """The credential the request presents, or None (then it must sign in)."""
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            return self.authenticator.by_token(given.strip().encode())
        return self._from_cookie(request.cookies.get(COOKIE, ""))

    def signed_in(self, token: str, target: str) -> web.HTTPSeeOther | None:
        """The redirect to `target` that sets the cookie, or None for a wrong token."""
        credential = self.authenticator.by_token(token.encode())
        if credential is None:
            return None
        expires = int(time.time()) + SIGNED_IN_S
        redirect = web.HTTPSeeOther(location=target)
        redirect.set_cookie(
            COOKIE,
            self._cookie(credential.name, token.encode(), expires),
            max_age=SIGNED_IN_S,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=self.secure,
        )
        return redirect

    def _cookie(self, name: str, token: bytes, expires: int) -> str:
        encoded = base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")
        return f"{encoded}.{expires}.{self._mac(token, encoded, expires)}"

    def _mac(self, token: bytes, name: str, expires: int) -> str:
        # Keyed by the token: a leaked cookie opens this page for a while, never the gRPC API.
        message = f"dsh-system-prompt admin|{self.incarnation}|{self.port}|{name}|{expires}"
        return hmac.new(token, message.encode(), hashlib.sha256).hexdigest()

    def _from_cookie(self, value: str) -> Credential | None:
        encoded, _, rest = value.partition(".")
        expires_text, _, mac = rest.partition(".")
        if not expires_text.isdigit() or int(expires_text) < time.time():
            return None
        try:
            name = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        known = self.authenticator.token_of(name)
        if known is None:
            return None
        token, credential = known
        expected = self._mac(token, encoded, int(expires_text))
        return credential if hmac.compare_digest(mac.encode(), expected.encode()) else None


def target(path: str, query: Mapping[str, str], pages: Collection[str]) -> str:
    """Where to go after signing in: `path` if it is one of the page's `pages` (with its
    query, less the token), else the home view; always a path of this origin."""
    kept = {name: value for name, value in query.items() if name not in ("token", "next")}
    if path not in pages:
        return _HOME
    return str(URL.build(path=path, query=kept))


def next_of(given: str, pages: Collection[str]) -> str:
    """The `next` field of the sign-in form, made safe: only a path of the page's own."""
    url = URL(given)
    if url.scheme or url.host is not None or url.user or not url.path.startswith("/"):
        return _HOME
    return target(url.path, url.query, pages)
