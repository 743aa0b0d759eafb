"""Templates: what an environment's root file system starts from (docs/TEMPLATES.md).

``moat.templates.import_("docker-archive:/tmp/py.tar", name="python:3.12")``
imports an OCI image; ``build(name, base=..., run=[...])`` runs commands in an
environment of ``base`` and keeps the result. Both return once the template
is ``ready`` (``wait=False``: at once, in state ``importing``/``building``;
the work goes on in moatd either way). A template that ends ``failed``
raises TemplateFailedError.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Optional, Sequence

from .errors import MoatTimeoutError, TemplateFailedError
from .transport import Transport, seg

ProgressCallback = Callable[[dict[str, Any]], Any]


class Templates:
    def __init__(self, transport: Transport, poll_interval: float = 0.5) -> None:
        self._transport = transport
        self.poll_interval = poll_interval

    def list(self) -> list[dict[str, Any]]:
        """Every template, the built-in ``host`` included."""
        return list(self._transport.json("GET", "/v1/templates")["templates"])

    def get(self, name: str) -> dict[str, Any]:
        """``{"name", "source", "state", "progress"?, "error"?, "size_bytes"?, "created_at", "config"}``."""
        result: dict[str, Any] = self._transport.json("GET", f"/v1/templates/{seg(name)}")
        return result

    def import_(
        self,
        source: str,
        name: str,
        *,
        wait: bool = True,
        timeout: Optional[float] = 1800,
        on_progress: Optional[ProgressCallback] = None,
    ) -> dict[str, Any]:
        """Imports an image: ``oci:DIR[:TAG]``, ``oci-archive:FILE``, ``docker-archive:FILE`` (master token) or ``docker://REF``."""
        template: dict[str, Any] = self._transport.json(
            "POST", "/v1/templates", json={"name": name, "source": source}
        )
        return self.wait(name, timeout=timeout, on_progress=on_progress, first=template) if wait else template

    def build(
        self,
        name: str,
        *,
        base: str,
        run: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        wait: bool = True,
        timeout: Optional[float] = 1800,
        on_progress: Optional[ProgressCallback] = None,
    ) -> dict[str, Any]:
        """Builds a template from ``base`` by running each shell line of ``run`` in turn."""
        recipe: dict[str, Any] = {"base": base, "run": list(run)}
        if env:
            recipe["env"] = dict(env)
        template: dict[str, Any] = self._transport.json(
            "POST", "/v1/templates", json={"name": name, "build": recipe}
        )
        return self.wait(name, timeout=timeout, on_progress=on_progress, first=template) if wait else template

    def wait(
        self,
        name: str,
        *,
        timeout: Optional[float] = 1800,
        on_progress: Optional[ProgressCallback] = None,
        first: Optional[dict[str, Any]] = None,
    ) -> dict[str, Any]:
        """Polls the template until it is ``ready`` (returned) or ``failed`` (TemplateFailedError)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        template = first if first is not None else self.get(name)
        last_progress: Any = None
        while True:
            state = template.get("state")
            if on_progress is not None and template.get("progress") != last_progress:
                last_progress = template.get("progress")
                on_progress(template)
            if state == "ready":
                return template
            if state == "failed":
                raise TemplateFailedError(template)
            if deadline is not None and time.monotonic() >= deadline:
                raise MoatTimeoutError(f"template {name!r} was not ready within {timeout} s (state {state})")
            time.sleep(self.poll_interval)
            template = self.get(name)

    def remove(self, name: str) -> None:
        """Deletes a template (ConflictError while an environment uses it)."""
        self._transport.json("DELETE", f"/v1/templates/{seg(name)}")
