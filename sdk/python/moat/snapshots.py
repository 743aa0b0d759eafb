"""Snapshots across environments: ``moat.snapshots.list/get/delete``.

Taking, restoring and forking are on the environment:
``env.snapshot()``, ``env.restore(snap)``, ``env.fork()``.
"""

from __future__ import annotations

from typing import Any, Optional

from .transport import Transport, seg


class Snapshots:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def list(self, environment_id: Optional[str] = None) -> list[dict[str, Any]]:
        """Your snapshots (of one environment with ``environment_id``), newest first."""
        answer = self._transport.json("GET", "/v1/snapshots", query={"environment_id": environment_id})
        return list(answer["snapshots"])

    def get(self, snapshot_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._transport.json("GET", f"/v1/snapshots/{seg(snapshot_id)}")
        return result

    def delete(self, snapshot_id: str) -> None:
        """Deletes a snapshot; environments made from it keep their files."""
        self._transport.json("DELETE", f"/v1/snapshots/{seg(snapshot_id)}")
