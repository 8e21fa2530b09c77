"""A registry's authentication challenge answered: ``WWW-Authenticate: Bearer realm=...,service=...,scope=...`` (Ollama's
registry and distribution's token auth) is answered with a token from the realm, asked anonymously or with the
credentials given (``TANDEM_REGISTRY_USER`` / ``TANDEM_REGISTRY_PASSWORD``); ``Basic`` with those credentials."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field

import httpx

from .errors import RegistryError

_PARAM = re.compile(r'(\w+)\s*=\s*(?:"([^"]*)"|([^\s,]+))')


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "bearer" or "basic", lower case
    params: dict[str, str] = field(default_factory=dict)


def parse_challenge(header: str | None) -> Challenge | None:
    if not header or not header.strip():
        return None
    scheme, _, rest = header.strip().partition(" ")
    params = {m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3) for m in _PARAM.finditer(rest)}
    return Challenge(scheme.lower(), params)


def authorization(http: httpx.Client, challenge: Challenge, credentials: Credentials | None) -> str | None:
    """The Authorization header that answers ``challenge``, or None when there is nothing to answer it with."""
    if challenge.scheme == "basic":
        return credentials.basic() if credentials else None
    if challenge.scheme != "bearer" or not challenge.params.get("realm"):
        return None
    realm = challenge.params["realm"]
    if not realm.startswith(("http://", "https://")):
        return None
    query = {k: v for k, v in challenge.params.items() if k in ("service", "scope") and v}
    headers = {"Authorization": credentials.basic()} if credentials else {}
    try:
        r = http.get(realm, params=query, headers=headers)
    except httpx.HTTPError:
        raise RegistryError(f"could not reach the registry's token service at {realm}") from None
    if r.status_code != 200:
        return None
    try:
        body = r.json()
    except ValueError:
        return None
    token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
    return f"Bearer {token}" if isinstance(token, str) and token else None
