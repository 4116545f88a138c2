"""Who may use the dashboard's controls (POST /api/command): whoever knows the operator's
token (the `http_token_file` setting, or HERDER_HTTP_TOKEN, which the master takes out of its
environment at start so no child inherits it). A login trades the token for a session cookie
(HttpOnly, SameSite=Strict) and a CSRF token the page sends back in a header; every comparison
takes constant time. No token configured: read-only, every control refused. The token is
never logged, shown in status or metrics, nor sent back.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets
import threading
import time
from collections.abc import Callable
from http.cookies import CookieError, SimpleCookie

log = logging.getLogger("herder")

ENV_TOKEN = "HERDER_HTTP_TOKEN"
COOKIE = "herder_session"
SESSION_TTL = 12 * 3600.0  # seconds a login lasts
MAX_SESSIONS = 64  # the oldest is forgotten past this
MAX_TOKEN = 4096  # bytes read of a token file


def read_token(path: str, from_env: str) -> str:
    """The token: the environment's, else the file's first line; "" for none. OSError and
    ValueError (an empty file) for the caller to report: a configured file that cannot be read
    must not silently leave the controls off or on."""
    if from_env.strip():
        return from_env.strip()
    if not path:
        return ""
    with open(path, "rb") as f:
        text = f.read(MAX_TOKEN).decode("utf-8", "replace").strip()
    if not text:
        raise ValueError(f"the token file {path} is empty")
    return text.splitlines()[0].strip()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "replace")).digest()


class Controls:
    def __init__(self, token: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._token = _digest(token) if token else None  # only its digest is kept
        self.clock = clock
        self._sessions: dict[str, tuple[str, float]] = {}  # session -> (csrf, expires at)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def login(self, token: object) -> tuple[str, str] | None:
        """(session, csrf) for the right token; None otherwise (and with no token configured)."""
        if self._token is None or not isinstance(token, str):
            return None
        if not hmac.compare_digest(_digest(token), self._token):
            return None
        session, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock:
            for old in [s for s, (_, until) in self._sessions.items() if until <= now]:
                del self._sessions[old]
            while len(self._sessions) >= MAX_SESSIONS:
                del self._sessions[next(iter(self._sessions))]
            self._sessions[session] = (csrf, now + SESSION_TTL)
        return session, csrf

    def allowed(self, cookie_header: str | None, csrf_header: str | None) -> bool:
        """A live session's cookie and its own CSRF token."""
        if self._token is None or not cookie_header or not csrf_header:
            return False
        try:
            morsel = SimpleCookie(cookie_header).get(COOKIE)
        except CookieError:
            return False
        if morsel is None:
            return False
        with self._lock:
            found = self._sessions.get(morsel.value)
        if found is None or found[1] <= self.clock():
            return False
        return hmac.compare_digest(found[0].encode(), csrf_header.encode("utf-8", "replace"))


def cookie(session: str) -> str:
    return f"{COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/"
