"""The client: ``moat = Moat()``; ``env = moat.create()``."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

from .agents import Agents
from .approvals import Approvals
from .environments import Environment
from .events import Events
from .keys import Keys
from .snapshots import Snapshots
from .templates import Templates
from .transport import Transport, seg


class Moat:
    """A connection to moatd.

    Found as the CLI finds it: ``url``, else ``$MOAT_URL``, else
    ``unix:<state>/moatd.sock``; ``token``, else ``$MOAT_TOKEN``, else
    ``<state>/master-token``; the state directory is ``state_dir``, else
    ``$MOAT_STATE``, else ``/var/lib/moat``. Without a token, NoTokenError
    says every place it looked. ``timeout``: seconds a request waits for its
    answer (a run's own length is not bounded by it); ``approval_timeout``:
    how long a call the gate checks may wait for a person's decision.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        state_dir: Optional[str] = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 2,
        approval_timeout: float = 900.0,
    ) -> None:
        self.transport = Transport(url, token, state_dir, timeout=timeout, max_retries=max_retries,
                                   approval_timeout=approval_timeout)
        #: Snapshots across environments (list, get, delete).
        self.snapshots = Snapshots(self.transport)
        #: What the gate asks a person (list, get, wait, approve, deny).
        self.approvals = Approvals(self.transport)
        #: Scoped API keys (create, list, revoke; master token only).
        self.keys = Keys(self.transport)
        #: Agent runs moatd drives (start, get, list, follow, stop, run).
        self.agents = Agents(self.transport)
        #: The audit log (list, follow).
        self.events = Events(self.transport)
        #: Templates (list, get, import_, build, wait, remove).
        self.templates = Templates(self.transport)

    @property
    def url(self) -> str:
        """The address in use (``unix:/var/lib/moat/moatd.sock``, ``http://127.0.0.1:7070``)."""
        return self.transport.url

    def __repr__(self) -> str:
        return f"Moat(url={self.url!r})"

    def create(
        self,
        template: Optional[str] = None,
        *,
        cpus: Optional[float] = None,
        ram_mb: Optional[int] = None,
        storage_gb: Optional[float] = None,
        pids: Optional[int] = None,
        isolation: Optional[str] = None,
        ttl_s: Optional[int] = None,
        ttl_while_paused: Optional[str] = None,
        on_expiry: Optional[str] = None,
        task_id: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        permissions: Optional[Mapping[str, Any]] = None,
        network: Union[str, Mapping[str, Any], None] = None,
        secrets: Optional[Sequence[Mapping[str, Any]]] = None,
        snapshot: Optional[str] = None,
        **fields: Any,
    ) -> Environment:
        """Creates an environment (POST /v1/environments) and returns its handle.

        ``template``: ``host``, a template's name (``python:3.12``) or a root
        directory; ``snapshot``: start from one of your snapshots instead;
        ``isolation``: ``namespaces`` or ``microvm`` (docs/MICROVM.md);
        ``ttl_while_paused``: ``stops`` (the default: a pause stops the time
        to live) or ``runs`` (docs/PAUSE.md); ``on_expiry``: ``destroy`` (the
        default) or ``pause`` (paused when its time runs out; a resume gives
        it ``ttl_s`` again).
        Anything else the API takes goes in ``fields``.
        """
        body: dict[str, Any] = {}
        spec = {k: v for k, v in {"cpus": cpus, "ram_mb": ram_mb, "storage_gb": storage_gb, "pids": pids,
                                  "isolation": isolation}.items()
                if v is not None}
        if spec:
            body["spec"] = spec
        for key, value in {
            "template": template, "ttl_s": ttl_s, "ttl_while_paused": ttl_while_paused, "on_expiry": on_expiry,
            "task_id": task_id,
            "labels": labels, "env": env, "permissions": permissions, "network": network, "secrets": secrets,
            "snapshot": snapshot,
        }.items():
            if value is not None:
                body[key] = value
        body.update(fields)
        return Environment(self, self.transport.json("POST", "/v1/environments", json=body))

    def get(self, environment_id: str) -> Environment:
        """The environment with this id (NotFoundError if there is none you may see)."""
        return Environment(self, self.transport.json("GET", f"/v1/environments/{seg(environment_id)}"))

    def list(
        self,
        *,
        labels: Optional[Mapping[str, str]] = None,
        task_id: Optional[str] = None,
        state: Optional[str] = None,
    ) -> list[Environment]:
        """Environments, newest first; without ``state``, gone ones are left out."""
        query = {"label": [f"{k}={v}" for k, v in (labels or {}).items()], "task_id": task_id, "state": state}
        answer = self.transport.json("GET", "/v1/environments", query=query)
        return [Environment(self, info) for info in answer["environments"]]

    def health(self) -> dict[str, Any]:
        """``GET /healthz``."""
        result: dict[str, Any] = self.transport.json("GET", "/healthz")
        return result

    def metrics(self) -> str:
        """``GET /metrics``: Prometheus text."""
        return self.transport.request("GET", "/metrics").body.decode()
