"""What the gate asks a person (docs/GATE.md): ``moat.approvals.list/get/wait/approve/deny``.

Listing and deciding need the master token or the ``approve`` scope; a key
can never decide an approval it asked for itself.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from .errors import MoatTimeoutError
from .transport import Transport, seg


class Approvals:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def list(self, state: Optional[str] = None, environment: Optional[str] = None) -> list[dict[str, Any]]:
        """Approvals, newest first (``state="pending"`` for those waiting)."""
        answer = self._transport.json("GET", "/v1/approvals", query={"state": state, "environment": environment})
        return list(answer["approvals"])

    def get(self, approval_id: str, wait: Optional[int] = None) -> dict[str, Any]:
        """One approval; with ``wait`` (s, at most 300) moatd answers once it is decided, or after ``wait`` s."""
        timeout = max(self._transport.timeout, wait + 15) if wait else None
        result: dict[str, Any] = self._transport.json(
            "GET", f"/v1/approvals/{seg(approval_id)}", query={"wait": wait}, timeout=timeout
        )
        return result

    def wait(self, approval_id: str, timeout: Optional[float] = None) -> dict[str, Any]:
        """Waits until the approval is decided (or expired) and returns it; MoatTimeoutError after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 60 if deadline is None else min(60, max(0, int(deadline - time.monotonic())))
            approval = self.get(approval_id, wait=left or None)
            if approval.get("state") != "pending":
                return approval
            if deadline is not None and time.monotonic() >= deadline:
                raise MoatTimeoutError(f"approval {approval_id} was not decided within {timeout} s")

    def wait_for_pending(
        self, environment: Optional[str] = None, timeout: float = 30.0, poll: float = 0.1
    ) -> dict[str, Any]:
        """The first pending approval (of ``environment``) once there is one; MoatTimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            pending = self.list(state="pending", environment=environment)
            if pending:
                return pending[-1]
            if time.monotonic() >= deadline:
                raise MoatTimeoutError(f"no pending approval within {timeout} s")
            time.sleep(poll)

    def approve(self, approval_id: str, reason: Optional[str] = None, remember: bool = False) -> dict[str, Any]:
        """Approves: the waiting request runs (or the caller's next identical one). ConflictError once decided."""
        return self._decide(approval_id, "approve", reason, remember)

    def deny(self, approval_id: str, reason: Optional[str] = None, remember: bool = False) -> dict[str, Any]:
        """Denies: the waiting request raises DeniedByPolicyError naming this approval."""
        return self._decide(approval_id, "deny", reason, remember)

    def _decide(self, approval_id: str, decision: str, reason: Optional[str], remember: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"decision": decision}
        if reason is not None:
            body["reason"] = reason
        if remember:
            body["remember"] = True
        result: dict[str, Any] = self._transport.json("POST", f"/v1/approvals/{seg(approval_id)}", json=body)
        return result
