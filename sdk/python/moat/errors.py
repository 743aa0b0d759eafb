"""Typed errors.

moatd answers every refusal as ``{"error": {"code", "message", "field"?}}``
(docs/API.md, "Errors"); each becomes a :class:`MoatError`, or the subclass
its code names, carrying the HTTP status, the code, the message and the field
at fault. Failures on the client's side (no token, moatd unreachable, a
timeout) have status 0.

The families::

    MoatError
    ├── NotFoundError            404 not_found
    ├── UnauthorizedError        401 unauthorized
    ├── ForbiddenError           403 forbidden (a key's scope, a host path)
    │   └── DeniedByPolicyError  403 denied_by_policy (the gate)
    │       └── ApprovalExpiredError  nobody decided in time (alias ApprovalTimeoutError)
    ├── ApprovalPendingError     202: the gate asks a person, the call did not wait
    ├── ConflictError            409 conflict, gone, stdin_full
    ├── InvalidRequestError      400 invalid_request, unknown_field, bad_json, ...
    ├── TooLargeError            413 too_large
    ├── FileError                400 file_error, 507 no_space
    ├── CapacityError            429 capacity (RateLimitedError when moatd said Retry-After)
    ├── UnavailableError         503 unavailable
    ├── ServerTimeoutError       504 timeout
    ├── PortUnreachableError     502 port_unreachable
    ├── TemplateFailedError      a template's import or build ended "failed"
    ├── CommandError             run(..., check=True) of a command that failed
    ├── NoTokenError             no token was found (lists where it looked)
    ├── MoatConnectionError      moatd could not be reached / the connection broke
    └── MoatTimeoutError         the client gave up waiting
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional


class MoatError(Exception):
    """An error from moatd (``status`` >= 400) or from the client (``status`` 0)."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "error",
        status: int = 0,
        field: Optional[str] = None,
        retry_after_s: Optional[float] = None,
        details: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.message: str = message
        #: moatd's machine-readable code (``not_found``, ``invalid_request``, ...) or the client's.
        self.code: str = code
        #: The HTTP status; 0 for client-side errors.
        self.status: int = status
        #: The request field at fault (``spec.cpus``, ``cmd[1]``, ``path``), when moatd names one.
        self.field: Optional[str] = field
        #: How long moatd asked the caller to wait before trying again (Retry-After), if it said.
        self.retry_after_s: Optional[float] = retry_after_s
        #: The whole ``error`` object moatd sent.
        self.details: dict[str, Any] = dict(details or {})

    def __str__(self) -> str:
        where = f", field {self.field}" if self.field else ""
        status = f"HTTP {self.status} " if self.status else ""
        return f"{self.message} ({status}{self.code}{where})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status}, message={self.message!r})"


class NotFoundError(MoatError):
    """404 ``not_found``: no such environment, process, file, snapshot, template (or one a key does not own)."""


class UnauthorizedError(MoatError):
    """401 ``unauthorized``: a missing, wrong or revoked token."""


class ForbiddenError(MoatError):
    """403 ``forbidden``: the API key lacks the scope, a key called /v1/keys, a file permission."""


class DeniedByPolicyError(ForbiddenError):
    """403 ``denied_by_policy``: the gate refused the action (docs/GATE.md).

    A rule said deny, no rule matched, or a person denied it (or nobody decided
    in time). ``scope``, ``action`` and ``rule`` say which; ``approval`` names
    the approval when a person was asked.
    """

    @property
    def scope(self) -> Optional[str]:
        return self.details.get("scope")

    @property
    def action(self) -> Optional[dict[str, Any]]:
        return self.details.get("action")

    @property
    def rule(self) -> Optional[dict[str, Any]]:
        return self.details.get("rule")

    @property
    def approval(self) -> Optional[str]:
        value = self.details.get("approval")
        return value if isinstance(value, str) else None


class ApprovalExpiredError(DeniedByPolicyError):
    """403 ``denied_by_policy`` after a person was asked and nobody decided in time
    (``moatd --approval-timeout``, default 120 s), or moatd stopped meanwhile.
    ``approval`` names the expired approval; asking again makes a new one."""


#: The name the family is also known by.
ApprovalTimeoutError = ApprovalExpiredError


class ApprovalPendingError(MoatError):
    """202: the gate asks a person, and the call was made with ``approval="async"``.

    Nothing happened yet. Follow ``approval["id"]`` with
    ``moat.approvals.wait(id)``; once approved, repeat the same call (a
    one-time grant for exactly that action).
    """

    def __init__(self, approval: dict[str, Any], message: str, location: Optional[str] = None) -> None:
        super().__init__(message, code="approval_pending", status=202)
        self.approval: dict[str, Any] = approval
        self.location: Optional[str] = location

    @property
    def approval_id(self) -> str:
        return str(self.approval.get("id", ""))


class ConflictError(MoatError):
    """409 ``conflict`` (not running, already decided, name taken), ``gone``, ``stdin_full``."""


class InvalidRequestError(MoatError):
    """400 ``invalid_request``, ``unknown_field``, ``bad_json``, ``invalid_argument``, ``unsupported``: ``field`` names what."""


class TooLargeError(MoatError):
    """413 ``too_large``."""


class FileError(MoatError):
    """400 ``file_error`` and 507 ``no_space``: the message names the path and the errno."""


class CapacityError(MoatError):
    """429 ``capacity``: a limit is reached (environments, memory, processes, snapshots)."""


class RateLimitedError(CapacityError):
    """429 ``capacity`` with ``Retry-After``: the key is over its rate; ``retry_after_s`` says how long to wait."""


class UnavailableError(MoatError):
    """503 ``unavailable``: moatd is busy or stopping, or runs without egress control."""


class ServerTimeoutError(MoatError):
    """504 ``timeout``: moatd's own wait timed out (not the client's: see MoatTimeoutError)."""


class MethodNotAllowedError(InvalidRequestError):
    """405 ``method_not_allowed``."""


class PortUnreachableError(MoatError):
    """502 ``port_unreachable``: nothing listens on that port inside the environment."""


class TemplateFailedError(MoatError):
    """A template's import or build ended in state ``failed``; ``template`` is its last record."""

    def __init__(self, template: dict[str, Any]) -> None:
        err = template.get("error") or {}
        super().__init__(
            f"template {template.get('name')!r} failed: {err.get('message', 'no reason given')}",
            code=str(err.get("code", "failed")),
            status=0,
        )
        self.template: dict[str, Any] = template


class CommandError(MoatError):
    """``run(..., check=True)`` of a command that did not exit 0; ``result`` holds its output."""

    def __init__(self, result: Any) -> None:
        tail = (result.stderr or "").strip().splitlines()[-1:] or [""]
        super().__init__(
            f"{result.cmd!r} exited {result.exit_code}" + (f": {tail[0]}" if tail[0] else ""),
            code="command_failed",
        )
        self.result = result


class NoTokenError(MoatError):
    """No token was given or found; ``looked`` lists every place that was tried."""

    def __init__(self, message: str, looked: list[str]) -> None:
        super().__init__(message, code="no_token")
        self.looked: list[str] = looked


class MoatConnectionError(MoatError):
    """moatd could not be reached, or the connection broke before an answer."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="connection_error")


class MoatTimeoutError(MoatError):
    """The client gave up waiting (the request's timeout, an idle stream, a wait)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="client_timeout")


_BY_CODE: dict[str, type[MoatError]] = {
    "not_found": NotFoundError,
    "unauthorized": UnauthorizedError,
    "forbidden": ForbiddenError,
    "denied_by_policy": DeniedByPolicyError,
    "conflict": ConflictError,
    "gone": ConflictError,
    "stdin_full": ConflictError,
    "capacity": CapacityError,
    "invalid_request": InvalidRequestError,
    "unknown_field": InvalidRequestError,
    "bad_json": InvalidRequestError,
    "bad_request": InvalidRequestError,
    "invalid_argument": InvalidRequestError,
    "unsupported": InvalidRequestError,
    "method_not_allowed": MethodNotAllowedError,
    "upgrade_required": InvalidRequestError,
    "too_large": TooLargeError,
    "file_error": FileError,
    "no_space": FileError,
    "unavailable": UnavailableError,
    "timeout": ServerTimeoutError,
    "port_unreachable": PortUnreachableError,
}

_BY_STATUS: dict[int, type[MoatError]] = {
    400: InvalidRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    405: MethodNotAllowedError,
    409: ConflictError,
    413: TooLargeError,
    429: CapacityError,
    502: PortUnreachableError,
    503: UnavailableError,
    504: ServerTimeoutError,
    507: FileError,
}


def error_from_response(status: int, body: bytes, retry_after: Optional[str] = None) -> MoatError:
    """The error for an HTTP answer with status >= 400 (``retry_after``: its Retry-After header)."""
    retry_after_s: Optional[float] = None
    if retry_after is not None and retry_after.strip().isdigit() and len(retry_after.strip()) <= 6:
        retry_after_s = float(retry_after.strip())
    text = body.decode("utf-8", "replace")
    code = f"http_{status}"
    message = text.strip()[:500] or f"HTTP {status}"
    field: Optional[str] = None
    details: dict[str, Any] = {}
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        details = parsed["error"]
        if isinstance(details.get("code"), str):
            code = details["code"]
        if isinstance(details.get("message"), str):
            message = details["message"]
        if isinstance(details.get("field"), str) and details["field"]:
            field = details["field"]
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status) or MoatError
    if cls is DeniedByPolicyError and "); approval expired: " in message:
        cls = ApprovalExpiredError
    if cls is CapacityError and retry_after_s is not None:
        cls = RateLimitedError
    return cls(message, code=code, status=status, field=field, retry_after_s=retry_after_s, details=details)


def pending_from_response(body: bytes, location: Optional[str]) -> Optional[ApprovalPendingError]:
    """The ApprovalPendingError of a 202 whose body names an approval; None otherwise."""
    try:
        parsed = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("approval"), dict):
        return None
    approval = parsed["approval"]
    message = parsed.get("message")
    if not isinstance(message, str):
        message = f"waiting for a person's decision on approval {approval.get('id')}"
    return ApprovalPendingError(approval, message, location)
