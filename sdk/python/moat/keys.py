"""Scoped API keys (master token only): ``moat.keys.create/list/revoke``."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from .transport import Transport, seg


class Keys:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def create(
        self,
        scopes: Sequence[str],
        name: Optional[str] = None,
        permissions: Optional[Mapping[str, Any]] = None,
    ) -> dict[str, Any]:
        """A new key: ``{"id", "name", "scopes", "token", ...}``; its ``token`` is shown this once."""
        body: dict[str, Any] = {"scopes": list(scopes)}
        if name is not None:
            body["name"] = name
        if permissions is not None:
            body["permissions"] = dict(permissions)
        result: dict[str, Any] = self._transport.json("POST", "/v1/keys", json=body)
        return result

    def list(self) -> list[dict[str, Any]]:
        """Every key, newest first, revoked ones too; never a token."""
        return list(self._transport.json("GET", "/v1/keys")["keys"])

    def revoke(self, key_id: str) -> None:
        """Its token is 401 from then on; its environments live on."""
        self._transport.json("DELETE", f"/v1/keys/{seg(key_id)}")
