"""Agent runs moatd drives itself (docs/AGENTS.md): ``moat.agents.start/get/list/follow/stop``.

moatd calls the model provider from the host and carries out the model's
tool calls in the run's own environment, each through the gate.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Mapping, Optional, Union

from .transport import Transport, seg

#: The states of a run that has ended.
ENDED = frozenset({"completed", "failed", "max_iterations", "stopped"})


class Agents:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def start(
        self,
        instruction: str,
        *,
        provider: Union[str, Mapping[str, Any]],
        model: Optional[str] = None,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        api_key_env: Optional[str] = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Starts a run (and its environment) and returns it at once.

        ``provider``: ``"anthropic"`` or ``"openai"`` (also Ollama, vLLM, ...)
        with ``model``; or the whole provider object as docs/AGENTS.md has it
        (``{"kind": "replay", "run": RUN_ID}``). ``api_key`` defaults to ``$ANTHROPIC_API_KEY`` /
        ``$OPENAI_API_KEY`` of this process (sent to moatd for this run only).
        ``fields``: ``permissions``, ``max_iterations``, ``timeout_s``,
        ``token_budget``, ``keep_environment``, ``labels``, ``spec``,
        ``template``, ``snapshot``, ``network``, ``secrets``.
        """
        if not isinstance(provider, str):
            spec: dict[str, Any] = dict(provider)
            body = {"instruction": instruction, "provider": spec, **{k: v for k, v in fields.items() if v is not None}}
            result: dict[str, Any] = self._transport.json("POST", "/v1/agents", json=body)
            return result
        if model is None:
            raise TypeError("model: required with provider=" + repr(provider))
        spec = {"kind": provider, "model": model}
        if base_url is not None:
            spec["base_url"] = base_url
        if api_key_env is not None:
            spec["api_key_env"] = api_key_env
        else:
            default_env = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}.get(provider)
            key = api_key if api_key is not None else (os.environ.get(default_env) if default_env else None)
            if key:
                spec["api_key"] = key
        body = {"instruction": instruction, "provider": spec, **{k: v for k, v in fields.items() if v is not None}}
        started: dict[str, Any] = self._transport.json("POST", "/v1/agents", json=body)
        return started

    def list(self) -> list[dict[str, Any]]:
        """Your runs (every run for the master token), newest first."""
        return list(self._transport.json("GET", "/v1/agents")["agents"])

    def get(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._transport.json("GET", f"/v1/agents/{seg(run_id)}")
        return result

    def stop(self, run_id: str) -> dict[str, Any]:
        """Ends a run now; answers once it has ended (``stopped``)."""
        result: dict[str, Any] = self._transport.json("POST", f"/v1/agents/{seg(run_id)}/stop")
        return result

    def transcript(self, run_id: str, after: int = 0, wait: Optional[int] = None) -> list[dict[str, Any]]:
        """The steps after the ``after``-th; with ``wait`` (s, at most 60), waits for one or the run's end."""
        answer = self._transport.json(
            "GET", f"/v1/agents/{seg(run_id)}/transcript", query={"after": after or None, "wait": wait},
            timeout=(wait or 0) + 30,
        )
        return list(answer["steps"])

    def follow(self, run_id: str) -> Iterator[dict[str, Any]]:
        """Every step of the run (from the first) as it happens, until the run ends."""
        seen = 0
        while True:
            for step in self.transcript(run_id, after=seen, wait=20):
                seen = max(seen, int(step["seq"]))
                yield step
            run = self.get(run_id)
            if run.get("state") in ENDED and run.get("ended_at"):
                for step in self.transcript(run_id, after=seen):
                    seen = max(seen, int(step["seq"]))
                    yield step
                return

    def run(
        self, instruction: str, *, on_step: Optional[Callable[[dict[str, Any]], Any]] = None, **start: Any
    ) -> dict[str, Any]:
        """Starts a run, hands each step to ``on_step`` as it happens, and returns the ended run."""
        started = self.start(instruction, **start)
        for step in self.follow(started["id"]):
            if on_step is not None:
                on_step(step)
        return self.get(started["id"])


