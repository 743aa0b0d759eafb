"""The audit log (docs/API.md, "Audit"): ``moat.events.list()`` and ``moat.events.follow()``.

``GET /v1/events`` is Server-Sent Events; each event's ``data`` line is the
event as JSON: ``{"id", "time", "type", "environment", "actor", "data", "hash", ...}``.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Optional

from .errors import MoatConnectionError, MoatError
from .transport import Stream, Transport


def _frames(stream: Stream) -> Iterator[dict[str, Any]]:
    data: list[bytes] = []
    for line in stream.lines():
        if line.startswith(b":"):
            if line.startswith(b": error:"):
                raise MoatError(line[len(b": error:"):].decode("utf-8", "replace").strip(), code="stream_error")
            continue  # a heartbeat
        if line == b"":
            if data:
                yield json.loads(b"\n".join(data))
                data = []
            continue
        if line.startswith(b"data:"):
            data.append(line[5:].lstrip(b" "))


class Events:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def list(
        self, environment: Optional[str] = None, type: Optional[str] = None, since: int = 0
    ) -> list[dict[str, Any]]:
        """Up to 1000 matching events after id ``since``, oldest first (ask again from the last id for more)."""
        query = {"environment": environment, "type": type, "since": since}
        with self._transport.stream("/v1/events", query=query) as stream:
            return list(_frames(stream))

    def follow(
        self, environment: Optional[str] = None, type: Optional[str] = None, since: int = 0
    ) -> Iterator[dict[str, Any]]:
        """Every matching event after ``since`` as it is recorded, for as long as you iterate.

        A connection that breaks is resumed from the last id seen (none lost,
        none twice), a bounded number of times in a row.
        """
        last = since
        failures = 0
        while True:
            query = {"environment": environment, "type": type, "since": last, "follow": True}
            stream = self._transport.stream("/v1/events", query=query)
            try:
                for event in _frames(stream):
                    last = max(last, int(event.get("id", last)))
                    failures = 0
                    yield event
            except MoatConnectionError:
                if failures >= self._transport.max_retries:
                    raise
            finally:
                stream.close()
            self._transport.backoff(failures)
            failures += 1
