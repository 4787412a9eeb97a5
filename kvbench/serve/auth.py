"""Who the server answers: an API key checked as a bearer token (`Authorization: Bearer KEY`) on
every route but /health, as vLLM's OpenAI server checks its --api-key; and which binds need one
(a server other machines can reach serves only those given the key, unless told --no-auth)."""
from __future__ import annotations

import hmac
import ipaddress
from typing import Awaitable, Callable

from fastapi import Request as HTTPRequest

from kvbench.config.secrets import API_KEY_ENV
from kvbench.serve.errors import APIError

OPEN_PATHS = ("/health",)  # a load balancer's or a launcher's probe needs no key
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    """Whether a bind address is reachable from this machine only."""
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost: it may resolve to anything
        return False


def check_access(host: str, allow_remote: bool, api_key: str | None, no_auth: bool) -> None:
    """ValueError for a bind the user did not ask for (not loopback without --allow-remote), a
    bind other machines can reach without an API key (unless --no-auth), and a key that cannot
    be one (empty, or given together with --no-auth)."""
    if not (allow_remote or is_loopback(host)):
        raise ValueError(f"--host {host} is not a loopback address; add --allow-remote to serve"
                         " other machines")
    if api_key is not None and not api_key.strip():
        raise ValueError(f"the API key (--api-key or {API_KEY_ENV}) is empty")
    if no_auth and api_key is not None:
        raise ValueError(f"--no-auth and an API key (--api-key or {API_KEY_ENV}) contradict each"
                         " other: give one of them")
    if not is_loopback(host) and api_key is None and not no_auth:
        raise ValueError(f"--host {host} lets other machines reach the server: give it an API"
                         f" key (--api-key KEY, or the environment variable {API_KEY_ENV}),"
                         " which every request but /health must send as 'Authorization: Bearer"
                         " KEY', or add --no-auth to serve anyone who reaches the port")


def require_api_key(api_key: str) -> Callable[[HTTPRequest], Awaitable[None]]:
    """A FastAPI dependency that refuses a request without `api_key` as its bearer token
    (401 in OpenAI's error shape), but on OPEN_PATHS."""
    expected = api_key.encode()

    async def check(request: HTTPRequest) -> None:
        if request.url.path in OPEN_PATHS:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise unauthorized("no API key: send it as the header 'Authorization: Bearer KEY'")
        # constant time: how long the compare takes says nothing of how much of a key matched
        if not hmac.compare_digest(token.strip().encode(), expected):
            raise unauthorized("the API key is not this server's")

    return check


def unauthorized(message: str) -> APIError:
    # OpenAI's code for a bad key; the header is what RFC 6750 has a 401 name
    return APIError(401, message, code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})
