"""The audit log (list, follow) and agent runs (start, get, list, follow, stop) against a real moatd,
with a local model server speaking OpenAI's Chat Completions (plain answers) on loopback."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from moat import Moat, NotFoundError

KEY = "sk-pysdk-agent-test-0a1b2c3d4e5f"


def test_events_list_and_follow(moat: Moat) -> None:
    env = moat.create(ram_mb=128, labels={"suite": "events"})
    try:
        env.run(["echo", "audited"])
        events = moat.events.list(environment=env.id)
        types = [e["type"] for e in events]
        assert types[0] == "environment.created" and "process.ended" in types
        assert all(e["environment"] == env.id for e in events)
        ids = [e["id"] for e in events]
        assert ids == sorted(ids)
        only = moat.events.list(environment=env.id, type="environment.")
        assert {e["type"] for e in only} == {"environment.created"}
        assert moat.events.list(environment=env.id, since=ids[-1]) == []

        follower = moat.events.follow(environment=env.id, type="file.", since=ids[-1])
        seen: list[dict[str, Any]] = []
        got = threading.Event()

        def follow() -> None:
            for event in follower:
                seen.append(event)
                got.set()
                return

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        env.files.write("/workspace/followed.txt", "x")
        assert got.wait(20)
        assert seen[0]["type"] == "file.written" and seen[0]["data"]["path"] == "/workspace/followed.txt"
        follower.close()
    finally:
        env.destroy()


class _Model:
    """Answers each request with the next of `answers`; records what it was sent."""

    def __init__(self, answers: list[dict[str, Any]], silent: bool = False) -> None:
        self.requests: list[dict[str, Any]] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                model.requests.append({"path": self.path, "auth": self.headers["Authorization"], "body": body})
                if silent:
                    model.release.wait(60)
                    return
                answer = answers[min(len(model.requests) - 1, len(answers) - 1)]
                message: dict[str, Any] = {"role": "assistant", "content": answer.get("text")}
                if "call" in answer:
                    message["tool_calls"] = [{
                        "id": f"call_{len(model.requests)}", "type": "function",
                        "function": {"name": answer["call"]["name"], "arguments": json.dumps(answer["call"]["arguments"])},
                    }]
                data = json.dumps({
                    "id": "x", "object": "chat.completion",
                    "choices": [{"index": 0, "message": message,
                                 "finish_reason": "tool_calls" if "call" in answer else "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.release = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def model() -> Iterator[_Model]:
    m = _Model([
        {"call": {"name": "write_file", "arguments": {"path": "/workspace/note.txt", "content": "from python"}}},
        {"text": "done"},
    ])
    yield m
    m.close()


def test_an_agent_run_to_its_end_each_step_heard(moat: Moat, model: _Model) -> None:
    kinds: list[str] = []
    run = moat.agents.run(
        "write a note",
        provider="openai", model="double", base_url=model.url, api_key=KEY,
        permissions={"read_file": "allow", "write_file": "allow", "run_command": "deny", "network": "deny"},
        max_iterations=5, keep_environment=True,
        on_step=lambda step: kinds.append(step["kind"]),
    )
    assert run["state"] == "completed" and run["result"] == "done" and run["iterations"] == 2
    assert kinds == ["instruction", "model", "tool_result", "model", "end"]
    assert model.requests[0]["auth"] == f"Bearer {KEY}"
    assert model.requests[0]["path"] == "/v1/chat/completions"
    env = moat.get(run["environment"])
    assert env.files.read_text("/workspace/note.txt") == "from python"
    assert run["id"] in [r["id"] for r in moat.agents.list()]
    steps = moat.agents.transcript(run["id"])
    assert [s["kind"] for s in steps] == kinds and KEY not in json.dumps(steps)
    assert [s["seq"] for s in moat.agents.transcript(run["id"], after=3)] == [4, 5]
    env.destroy()


def test_an_agent_run_is_stopped_and_an_unknown_one_not_found(moat: Moat) -> None:
    silent = _Model([], silent=True)
    try:
        started = moat.agents.start("wait", provider="openai", model="double", base_url=silent.url, api_key=KEY)
        assert started["state"] == "running" and moat.agents.get(started["id"])["id"] == started["id"]
        stopped = moat.agents.stop(started["id"])
        assert stopped["state"] == "stopped"
        steps = list(moat.agents.follow(started["id"]))  # an ended run: every step, then the end
        assert steps[0]["kind"] == "instruction" and steps[-1]["kind"] == "end"
        with pytest.raises(NotFoundError):
            moat.agents.get("000000000000")
    finally:
        silent.close()
