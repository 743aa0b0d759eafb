"""The README's agent tool loop (examples/tool_loop.py): the model's tool calls
played by hand (no model), against a real moatd and the gate."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

from moat import Moat

spec = importlib.util.spec_from_file_location("tool_loop", Path(__file__).parent.parent / "examples" / "tool_loop.py")
assert spec is not None and spec.loader is not None
tool_loop = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool_loop)


def test_tool_calls_map_to_the_sdk_and_the_gate_answers_as_tool_errors(moat: Moat) -> None:
    with moat.create(ram_mb=256, permissions=tool_loop.PERMISSIONS) as env:
        run = tool_loop.run_tool
        assert run(moat, env, "write_file", {"path": "/workspace/p.py", "content": "print(6*7)\n"}) == (
            "wrote 11 characters to /workspace/p.py", False)
        out, is_error = run(moat, env, "run_command", {"command": "python3 p.py"})
        assert not is_error and "exit code 0" in out and "42" in out
        assert run(moat, env, "read_file", {"path": "/workspace/p.py"}) == ("print(6*7)\n", False)

        # Denied by a rule: the model hears why.
        out, is_error = run(moat, env, "write_file", {"path": "/etc/passwd", "content": "x"})
        assert is_error and out.startswith("denied by policy: ")
        # A missing file: the error's code and message.
        out, is_error = run(moat, env, "read_file", {"path": "/workspace/none"})
        assert is_error and out.startswith("not_found: ")

        # rm inside the shell line: the program is refused, the command reports it.
        out, is_error = run(moat, env, "run_command", {"command": "rm /workspace/p.py"})
        assert not is_error and "Operation not permitted" in out
        assert env.files.exists("/workspace/p.py")

        # An ask: the loop waits for a person; approved, the call runs once.
        results: list[tuple[str, bool]] = []
        t = threading.Thread(target=lambda: results.append(
            run(moat, env, "run_command", {"command": "echo install-asked"})))
        t.start()
        pending = moat.approvals.wait_for_pending(environment=env.id, timeout=20)
        assert pending["action"]["argv"] == ["/bin/sh", "-c", "echo install-asked"]
        moat.approvals.approve(pending["id"])
        t.join(30)
        assert not results[0][1] and "install-asked" in results[0][0]
        # Denied by a person: a tool error naming the decision.
        t = threading.Thread(target=lambda: results.append(
            run(moat, env, "run_command", {"command": "echo install-no"})))
        t.start()
        pending = moat.approvals.wait_for_pending(environment=env.id, timeout=20)
        moat.approvals.deny(pending["id"], reason="not this one")
        t.join(30)
        assert results[1] == ("a person did not allow this (denied: not this one)", True)
