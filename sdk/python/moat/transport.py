"""The transport: finding moatd and its token, one HTTP/1.1 request at a time.

Discovery is the CLI's (src/cli/client.cc), in the same order:

- the state directory: ``state_dir``, else ``$MOAT_STATE``, else ``/var/lib/moat``;
- the address: ``url``, else ``$MOAT_URL``, else ``unix:<state>/moatd.sock``;
- the token: ``token``, else ``$MOAT_TOKEN``, else the file ``<state>/master-token``.

When no token is found, :class:`~moat.errors.NoTokenError` lists every place
that was looked at. Each request goes on a connection of its own (moatd is
local or near; nothing idle to go stale); idempotent ones (GET, PUT, DELETE)
are retried after a connection error, a 503 or a 429 (waiting what
Retry-After asks, up to 30 s).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

from .errors import (
    InvalidRequestError,
    MoatConnectionError,
    MoatError,
    MoatTimeoutError,
    NoTokenError,
    error_from_response,
    pending_from_response,
)

SDK_VERSION = "0.1.0"
DEFAULT_STATE = "/var/lib/moat"
#: A Retry-After longer than this is not waited for: the error goes to the caller.
MAX_RETRY_AFTER_S = 30.0

QueryValue = Union[str, int, float, bool, None, Sequence[str]]


@dataclass(frozen=True)
class Endpoint:
    """Where moatd listens: a unix socket, or http(s)://host:port with an optional path prefix."""

    scheme: str  # "unix", "http", "https"
    host: str = ""
    port: int = 0
    path: str = ""  # the socket's path (unix) or a path prefix (http)

    @property
    def display(self) -> str:
        if self.scheme == "unix":
            return "unix:" + self.path
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def parse_url(url: str) -> Endpoint:
    """``unix:/path/to.sock``, ``http://HOST:PORT[/prefix]`` or ``https://...``."""
    if url.startswith("unix:"):
        path = url[len("unix:"):]
        if path.startswith("//"):
            path = path[2:]  # unix:///path
        if not path.startswith("/"):
            raise ValueError(f"{url}: a unix socket needs an absolute path (unix:/path/to.sock)")
        return Endpoint("unix", path=path)
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{url} is neither http(s)://HOST:PORT nor unix:/path/to.sock")
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError as e:
        raise ValueError(f"{url}: {e}") from None
    return Endpoint(parsed.scheme, host=parsed.hostname, port=port, path=parsed.path.rstrip("/"))


def discover(
    url: Optional[str] = None, token: Optional[str] = None, state_dir: Optional[str] = None
) -> tuple[Endpoint, str]:
    """moatd's address and a token, found as the CLI finds them (see the module's doc)."""
    state = state_dir or os.environ.get("MOAT_STATE") or DEFAULT_STATE
    if url:
        endpoint = parse_url(url)
    elif os.environ.get("MOAT_URL"):
        try:
            endpoint = parse_url(os.environ["MOAT_URL"])
        except ValueError as e:
            raise ValueError(f"MOAT_URL: {e}") from None
    else:
        endpoint = Endpoint("unix", path=os.path.join(state, "moatd.sock"))

    looked: list[str] = []
    if token is not None and token.strip():
        return endpoint, token.strip()
    looked.append("the token argument (not given)" if token is None else "the token argument (empty)")
    env_token = os.environ.get("MOAT_TOKEN")
    if env_token is not None and env_token.strip():
        return endpoint, env_token.strip()
    looked.append("$MOAT_TOKEN (not set)" if env_token is None else "$MOAT_TOKEN (empty)")
    token_file = os.path.join(state, "master-token")
    if state_dir:
        origin = "given as state_dir"
    elif os.environ.get("MOAT_STATE"):
        origin = "from $MOAT_STATE"
    else:
        origin = "the default; state_dir= or $MOAT_STATE name another"
    try:
        with open(token_file, "rb") as f:
            text = f.read(4096).decode("utf-8", "replace").strip()
        if text:
            return endpoint, text
        why = "empty"
    except OSError as e:
        why = e.strerror or str(e)
    looked.append(f"{token_file} ({why}; the state directory {state} is {origin})")
    raise NoTokenError(
        "no token for moatd. Looked at: " + "; ".join(looked)
        + f". Pass token=..., set MOAT_TOKEN, or make {token_file} readable.",
        looked,
    )


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("localhost", timeout=timeout)
        self._socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


@dataclass
class Answer:
    """A whole answer: its status, headers (lower-case names) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        if self.status == 204 or not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            raise MoatError("moatd answered with a body that is not JSON", code="bad_response", status=self.status)


class Stream:
    """An answer whose body is read as it arrives (NDJSON or Server-Sent Events). Close it when done."""

    def __init__(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse, where: str) -> None:
        self._conn = conn
        self.response = response
        self.where = where

    def lines(self) -> Iterator[bytes]:
        """Each line (without its end) as it arrives; ends with the answer."""
        while True:
            try:
                line = self.response.readline()
            except socket.timeout:
                raise MoatTimeoutError(f"{self.where}: nothing arrived, not even a heartbeat, in time") from None
            except (OSError, http.client.HTTPException) as e:
                raise MoatConnectionError(f"{self.where}: the stream broke ({e})") from None
            if not line:
                return
            yield line.rstrip(b"\r\n")

    def close(self) -> None:
        try:
            if self._conn.sock is not None:
                self._conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._conn.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _query_string(query: Optional[Mapping[str, QueryValue]]) -> str:
    pairs: list[tuple[str, str]] = []
    for key, value in (query or {}).items():
        if value is None:
            continue
        if isinstance(value, bool):
            pairs.append((key, "1" if value else "0"))
        elif isinstance(value, (list, tuple)):
            pairs.extend((key, str(v)) for v in value)
        else:
            pairs.append((key, str(value)))
    return urllib.parse.urlencode(pairs, quote_via=urllib.parse.quote)


def seg(value: Union[str, int]) -> str:
    """One path segment (an id, a name), escaped.

    moatd decodes a path before it splits it, so an escaped '/' would still
    name another endpoint: an id with '/' (or one that is '.' or '..') is
    refused here, before anything is sent, as the CLI does.
    """
    text = str(value)
    if not text or "/" in text or text in (".", "..") or any(ord(c) < 0x20 for c in text):
        raise InvalidRequestError(f"{text!r} is not an id or a name", code="invalid_request", field="id")
    return urllib.parse.quote(text, safe="")


class Transport:
    """Every call of the SDK goes through here."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        state_dir: Optional[str] = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        retry_delay: float = 0.2,
        approval_timeout: float = 900.0,
    ) -> None:
        self.endpoint, self.token = discover(url, token, state_dir)
        #: Seconds a request waits for its answer (0 or None: forever).
        self.timeout = timeout
        #: Seconds a call the gate checks may wait for a person's decision (moatd's
        #: --approval-timeout, 120 s by default, decides; this only bounds a hung answer).
        self.approval_timeout = approval_timeout
        self.max_retries = max(0, max_retries)
        self.retry_delay = retry_delay

    @property
    def url(self) -> str:
        return self.endpoint.display

    def _connect(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        ep = self.endpoint
        if ep.scheme == "unix":
            return _UnixConnection(ep.path, timeout)
        if ep.scheme == "https":
            return http.client.HTTPSConnection(ep.host, ep.port, timeout=timeout)
        return http.client.HTTPConnection(ep.host, ep.port, timeout=timeout)

    def _send(
        self,
        method: str,
        path: str,
        query: Optional[Mapping[str, QueryValue]],
        json_body: Any,
        body: Optional[bytes],
        headers: Optional[Mapping[str, str]],
        timeout: Optional[float],
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, str]:
        qs = _query_string(query)
        target = self.endpoint.path if self.endpoint.scheme != "unix" else ""
        target += path + (f"?{qs}" if qs else "")
        where = f"{method} {self.endpoint.display}{path}"
        h = {"User-Agent": f"moat-sdk-python/{SDK_VERSION}", "Authorization": f"Bearer {self.token}"}
        payload: Optional[bytes] = None
        if json_body is not None:
            payload = json.dumps(json_body).encode()
            h["Content-Type"] = "application/json"
        elif body is not None:
            payload = body
            h["Content-Type"] = "application/octet-stream"
        if payload is None and method in ("POST", "PUT"):
            payload = b""
        h.update(headers or {})
        t = self.timeout if timeout is None else timeout
        conn = self._connect(t if t and t > 0 else None)
        try:
            conn.request(method, target, body=payload, headers=h)
            response = conn.getresponse()
        except socket.timeout:
            conn.close()
            raise MoatTimeoutError(f"{where}: no answer within {t} s") from None
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise MoatConnectionError(f"{where}: cannot reach moatd ({e}; is moatd running?)") from None
        return conn, response, where

    @staticmethod
    def _refusal(response: http.client.HTTPResponse, body: bytes) -> Optional[MoatError]:
        status = response.status
        if status == 202:
            pending = pending_from_response(body, response.getheader("Location"))
            if pending is not None:
                return pending
        if status >= 400:
            return error_from_response(status, body, response.getheader("Retry-After"))
        return None

    def _with_retries(self, method: str, attempt: Any) -> Any:
        idempotent = method in ("GET", "PUT", "DELETE")
        tries = 0
        while True:
            try:
                return attempt()
            except MoatError as e:
                retryable = isinstance(e, MoatConnectionError) or e.status in (429, 503)
                if not idempotent or tries >= self.max_retries or not retryable:
                    raise
                asked = e.retry_after_s or 0.0
                if asked > MAX_RETRY_AFTER_S:
                    raise
                self.backoff(tries, asked)
                tries += 1

    def backoff(self, attempt: int, at_least: float = 0.0) -> None:
        """Waits before retry ``attempt`` (0-based): exponential with jitter, at most 5 s, or what moatd asked."""
        base = min(self.retry_delay * 2**attempt, 5.0)
        time.sleep(max(base / 2 + random.random() * base / 2, at_least * (1 + random.random() * 0.2)))

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, QueryValue]] = None,
        json: Any = None,
        body: Optional[bytes] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Answer:
        """One call; an error answer raises its MoatError; idempotent calls are retried."""

        def once() -> Answer:
            conn, response, where = self._send(method, path, query, json, body, headers, timeout)
            try:
                data = response.read()
            except socket.timeout:
                raise MoatTimeoutError(f"{where}: the answer did not end in time") from None
            except (OSError, http.client.HTTPException) as e:
                raise MoatConnectionError(f"{where}: the connection broke ({e})") from None
            finally:
                conn.close()
            refusal = self._refusal(response, data)
            if refusal is not None:
                raise refusal
            return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, data)

        return self._with_retries(method, once)

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """A call whose JSON answer (None for 204) is returned."""
        return self.request(method, path, **kwargs).json()

    def stream(
        self,
        path: str,
        *,
        query: Optional[Mapping[str, QueryValue]] = None,
        headers: Optional[Mapping[str, str]] = None,
        idle_timeout: Optional[float] = 60.0,
    ) -> Stream:
        """A GET whose body is read as it arrives; ``idle_timeout``: the longest silence allowed."""

        def once() -> Stream:
            conn, response, where = self._send("GET", path, query, None, None, headers, idle_timeout or 0)
            if response.status >= 300 or response.status == 202:
                try:
                    data = response.read()
                finally:
                    conn.close()
                refusal = self._refusal(response, data)
                raise refusal or MoatError(f"{where}: unexpected HTTP {response.status}", status=response.status)
            return Stream(conn, response, where)

        return self._with_retries("GET", once)
