"""An agent's tool loop on moat: a model's tool calls run in an environment, through the gate.

    ANTHROPIC_API_KEY=... python3 sdk/python/examples/tool_loop.py "Write primes.py, run it, report"

The model (Anthropic's Messages API, called with urllib: standard library
only) gets three tools; each call becomes an SDK call on one environment. The
gate's answers come back as typed errors: a denial (DeniedByPolicyError) is
told to the model as the tool's error, so it can adapt; an action that asks
a person (ApprovalPendingError, because the calls use approval="async") is
shown to the operator, waited for, and repeated once approved.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from moat import ApprovalPendingError, DeniedByPolicyError, Environment, Moat, MoatError  # noqa: E402

TOOLS = [
    {"name": "run_command", "description": "Run a shell command in the sandbox (cwd /workspace).",
     "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
    {"name": "read_file", "description": "Read a file of the sandbox.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "write_file", "description": "Write a file of the sandbox.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                      "required": ["path", "content"]}},
]

# What the model may do (docs/GATE.md). Files: read anything, write only under
# /workspace (anything else: no rule matches, so deny). Commands: a tool call
# is the argv ["/bin/sh", "-c", LINE], and every program it starts is judged
# again: `rm` is refused at any depth (the shell sees "Operation not
# permitted"), a line that installs something asks a person first.
PERMISSIONS: dict[str, Any] = {
    "read_file": "allow",
    "write_file": [{"path": "/workspace/**", "action": "allow"}],
    "run_command": [{"match": ["rm", "*"], "action": "deny"},
                    {"match": ["/bin/sh", "-c", "*install*"], "action": "ask"},
                    {"action": "allow"}],
    "network": "deny",
}


def call_tool(env: Environment, name: str, args: dict[str, Any]) -> str:
    """One tool call as an SDK call (approval="async": an ask raises ApprovalPendingError at once)."""
    if name == "run_command":
        r = env.run(args["command"], cwd="/workspace", timeout=120, approval="async")
        return f"exit code {r.exit_code}\nstdout:\n{r.stdout[-8000:]}\nstderr:\n{r.stderr[-4000:]}"
    if name == "read_file":
        return env.files.read_text(args["path"], approval="async")[:16000]
    if name == "write_file":
        env.files.write(args["path"], args["content"], approval="async")
        return f"wrote {len(args['content'])} characters to {args['path']}"
    raise ValueError(f"unknown tool {name}")


def run_tool(moat: Moat, env: Environment, name: str, args: dict[str, Any]) -> tuple[str, bool]:
    """The tool's result for the model and whether it is an error; the gate's answers included."""
    try:
        return call_tool(env, name, args), False
    except ApprovalPendingError as pending:
        print(f"[moat] {name} waits for a person: moat approvals approve {pending.approval_id}", file=sys.stderr)
        decided = moat.approvals.wait(pending.approval_id, timeout=600)
        if decided["state"] != "approved":
            return f"a person did not allow this ({decided['state']}: {decided.get('reason') or 'no reason'})", True
        return run_tool(moat, env, name, args)  # the approval grants exactly this call, once
    except DeniedByPolicyError as denied:
        return f"denied by policy: {denied.message}", True
    except MoatError as e:  # a missing file, a bad path: the model can fix its call
        return f"{e.code}: {e.message}", True


def ask_model(messages: list[dict[str, Any]]) -> dict[str, Any]:
    request = urllib.request.Request(
        "https://api.anthropic.com/v1/messages",
        data=json.dumps({"model": os.environ.get("MODEL", "claude-sonnet-4-5"), "max_tokens": 4096,
                         "tools": TOOLS, "messages": messages}).encode(),
        headers={"x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01",
                 "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        answer: dict[str, Any] = json.load(response)
        return answer


def main(task: str) -> None:
    moat = Moat()
    with moat.create(permissions=PERMISSIONS, ttl_s=3600) as env:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        for _ in range(30):  # the runaway bound
            answer = ask_model(messages)
            messages.append({"role": "assistant", "content": answer["content"]})
            calls = [block for block in answer["content"] if block["type"] == "tool_use"]
            if not calls:
                print("".join(block.get("text", "") for block in answer["content"]))
                return
            results = []
            for call in calls:
                content, is_error = run_tool(moat, env, call["name"], call["input"])
                results.append({"type": "tool_result", "tool_use_id": call["id"], "content": content,
                                "is_error": is_error})
            messages.append({"role": "user", "content": results})
        print("stopped after 30 turns", file=sys.stderr)


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or "Write primes.py printing the primes below 50, run it and report the output")
