"""Environments, commands, processes, files and snapshots against a real moatd."""

from __future__ import annotations

import threading
import time

import pytest

from moat import CommandError, ConflictError, Environment, Moat, NotFoundError, RunResult

from conftest import wait_until


def test_create_get_list_destroy(moat: Moat) -> None:
    env = moat.create(ram_mb=128, ttl_s=300, labels={"suite": "lifecycle"}, env={"GREETING": "hello"},
                      task_id="pysdk-lifecycle")
    try:
        assert env.state == "running"
        assert env.info["spec"]["ram_mb"] == 128
        again = moat.get(env.id)
        assert isinstance(again, Environment) and again.id == env.id
        assert [e.id for e in moat.list(labels={"suite": "lifecycle"})] == [env.id]
        assert [e.id for e in moat.list(task_id="pysdk-lifecycle")] == [env.id]
        assert env.run("echo $GREETING").stdout == "hello\n"
        before = env.info["expires_at"]
        assert env.set_timeout(30)["expires_at"] < before
        stats = env.stats()
        assert stats["memory_limit_bytes"] == 128 << 20
    finally:
        env.destroy()
    assert moat.get(env.id).state == "gone"
    assert env.id not in [e.id for e in moat.list()]
    env.destroy()  # idempotent


def test_an_environment_is_a_context_manager(moat: Moat) -> None:
    with moat.create(ram_mb=128) as env:
        assert env.run(["true"]).exit_code == 0
    assert moat.get(env.id).state == "gone"


def test_pause_stops_the_processes_and_resume_lets_them_go_on(moat: Moat) -> None:
    with moat.create(ram_mb=256, ttl_s=600) as env:
        assert env.info["ttl_while_paused"] == "stops" and "paused_at" not in env.info
        assert env.info["on_expiry"] == "destroy"
        env.start(["sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /workspace/n.tmp; mv /workspace/n.tmp /workspace/n; done"])

        def counter() -> int:
            """The counter's value now (0 while the file is being rewritten)."""
            try:
                text = env.files.read_text("/workspace/n").strip()
            except NotFoundError:
                return 0
            return int(text) if text.isdigit() else 0

        wait_until(lambda: counter() > 0, what="the counter to start")
        info = env.pause()
        assert info is env.info and env.state == "paused" and info["paused_at"]
        assert env.refresh()["state"] == "paused"
        with pytest.raises(ConflictError) as caught:
            env.run(["true"])
        assert (caught.value.status, caught.value.code) == (409, "conflict")
        assert "paused" in str(caught.value)
        first = env.files.read_text("/workspace/n")  # file reads still answer
        time.sleep(0.3)
        assert env.files.read_text("/workspace/n") == first  # and the counter stands still
        assert env.pause()["paused_at"] == info["paused_at"]  # pausing a paused one: no error, as it is
        stopped = counter()
        assert env.resume()["state"] == "running" and "paused_at" not in env.info
        wait_until(lambda: counter() > stopped, what="the counter to move again")
        assert env.run("echo running").stdout == "running\n"
        assert env.resume()["state"] == "running"  # resuming a running one: no error
    with moat.create(ttl_s=600, on_expiry="pause") as kept:
        assert kept.info["on_expiry"] == "pause"
    with moat.create(ttl_s=600, ttl_while_paused="runs") as runs:
        assert runs.info["ttl_while_paused"] == "runs"
        assert runs.pause()["ttl_while_paused"] == "runs" and runs.state == "paused"
    assert moat.get(runs.id).state == "gone"  # a paused one is destroyed at once


def test_a_string_is_a_shell_line_and_a_list_is_argv(env: Environment) -> None:
    shell = env.run("echo one; echo two | tr a-z A-Z; exit 3")
    assert (shell.exit_code, shell.stdout, shell.stderr) == (3, "one\nTWO\n", "")
    assert shell.cmd == ["/bin/sh", "-c", "echo one; echo two | tr a-z A-Z; exit 3"]
    argv = env.run(["echo", "one; echo two", "$HOME"])  # no shell: the ; and $ are plain text
    assert argv.stdout == "one; echo two $HOME\n"
    assert argv.ok and argv.state == "exited"


def test_cwd_env_stdin_and_timeout(env: Environment) -> None:
    assert env.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert env.run(["sh", "-c", "echo $A-$B"], env={"A": "x", "B": "y"}).stdout == "x-y\n"
    assert env.run("tr a-z A-Z", stdin="shout\n").stdout == "SHOUT\n"
    big = bytes(range(256)) * 8192  # 2 MiB, not UTF-8: several stdin pieces, lossless output
    result = env.run("cat > /tmp/in; sha256sum < /tmp/in | cut -c1-64; wc -c < /tmp/in", stdin=big)
    import hashlib
    assert result.stdout.split() == [hashlib.sha256(big).hexdigest(), str(len(big))]
    started = time.monotonic()
    slow = env.run("sleep 30", timeout=0.5)
    assert slow.timed_out and slow.exit_code == 137 and slow.signal == 9
    assert time.monotonic() - started < 15


def test_output_reaches_the_callbacks_in_order_before_run_returns(env: Environment) -> None:
    seen: list[tuple[str, str, float]] = []
    script = "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.3; done; echo done"
    started = time.monotonic()
    result = env.run(
        script,
        on_stdout=lambda text: seen.append(("out", text, time.monotonic() - started)),
        on_stderr=lambda text: seen.append(("err", text, time.monotonic() - started)),
    )
    finished = time.monotonic() - started
    out = "".join(t for kind, t, _ in seen if kind == "out")
    err = "".join(t for kind, t, _ in seen if kind == "err")
    assert out == "out1\nout2\nout3\ndone\n" == result.stdout
    assert err == "err1\nerr2\nerr3\n" == result.stderr
    # As it came, not at the end: the first line arrived well before the last.
    first = next(at for kind, t, at in seen if "out1" in t)
    last = next(at for kind, t, at in seen if "done" in t)
    assert last - first > 0.5 and first < finished - 0.5
    # Both streams interleaved in the order they were written (a pair written
    # back to back may come either way; the pauses between pairs order them).
    order = [line.strip() for _, text, _ in seen for line in text.splitlines()]
    for before, after in (("out1", "out2"), ("err1", "out2"), ("err2", "out3"), ("err3", "done")):
        assert order.index(before) < order.index(after), order


def test_a_large_output_is_followed_whole(env: Environment) -> None:
    chunks: list[str] = []
    result = env.run("seq 1 400000", on_stdout=chunks.append)  # ~2.6 MiB, more than moatd's 1 MiB log
    expected = "".join(f"{i}\n" for i in range(1, 400001))
    assert "".join(chunks) == expected
    assert result.stdout == expected and result.dropped == 0


def test_a_failing_command_is_a_result_and_check_raises(env: Environment) -> None:
    missing = env.run(["no-such-program-x"])
    assert missing.exit_code == 127 and missing.state == "failed"
    assert "no-such-program-x" in (missing.error or "")
    with pytest.raises(CommandError) as caught:
        env.run("echo broken >&2; exit 2", check=True)
    assert caught.value.result.exit_code == 2
    assert "broken" in str(caught.value)
    assert env.run("true", check=True).ok


def test_a_callback_that_raises_kills_the_command(env: Environment) -> None:
    def stop(text: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        env.run("echo go; exec sleep 60", on_stdout=stop)
    procs = env.processes()
    assert procs[-1].cmd == ["/bin/sh", "-c", "echo go; exec sleep 60"]
    last = procs[-1]
    deadline = time.monotonic() + 10
    while last.refresh()["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert last.state == "exited" and last.info["exit_code"] == 137


def test_a_background_process_is_killed_and_waited_for(env: Environment) -> None:
    proc = env.start("echo started; exec sleep 600")
    assert proc.id > 0 and proc.state in ("starting", "running")
    assert any(p.id == proc.id for p in env.processes())
    wait_until(lambda: any(e.type == "output" for e in proc.output()), what="its first output")
    proc.kill()
    result = proc.wait(timeout=20)
    assert result.exit_code == 137 and result.signal == 9
    assert result.stdout == "started\n"
    assert env.process(proc.id).state == "exited"
    proc.kill()  # an ended process: nothing to do, no error


def test_a_background_process_calls_back_and_on_exit(env: Environment) -> None:
    lines: list[str] = []
    ended = threading.Event()
    results: list[RunResult] = []

    def on_exit(result: RunResult) -> None:
        results.append(result)
        ended.set()

    proc = env.start("read name; echo hello $name; echo bye >&2", stdin=True,
                     on_stdout=lines.append, on_stderr=lines.append, on_exit=on_exit)
    proc.write("moat\n", close=True)
    assert ended.wait(20)
    assert "".join(lines) == "hello moat\nbye\n"
    assert results[0].exit_code == 0 and results[0].stdout == "hello moat\n"
    assert proc.wait().stderr == "bye\n"
    events = list(proc.output(since=0))
    assert [e.type for e in events][-1] == "exit"
    assert b"".join(e.data for e in events if e.stream == "stdout") == b"hello moat\n"


def test_files_read_write_list_remove(env: Environment) -> None:
    env.files.write("/workspace/dir/a.txt", "alpha\n")
    env.files.write("/workspace/dir/a.txt", "beta\n", append=True)
    env.files.write("/workspace/dir/run.sh", b"#!/bin/sh\necho ran\n", mode=0o755)
    assert env.files.read("/workspace/dir/a.txt") == b"alpha\nbeta\n"
    assert env.files.read_text("/workspace/dir/a.txt") == "alpha\nbeta\n"
    assert env.files.read("/workspace/dir/a.txt", offset=6, length=2) == b"be"
    names = {e["name"]: e for e in env.files.list("/workspace/dir")}
    assert set(names) == {"a.txt", "run.sh"}
    assert names["run.sh"]["mode"] & 0o777 == 0o755
    assert env.run("/workspace/dir/run.sh").stdout == "ran\n"
    assert env.files.stat("/workspace/dir/a.txt")["size"] == 11
    env.files.mkdir("/workspace/x/y", parents=True)
    env.files.move("/workspace/dir/a.txt", "/workspace/x/y/a.txt")
    assert env.files.exists("/workspace/x/y/a.txt") and not env.files.exists("/workspace/dir/a.txt")
    env.files.remove("/workspace/dir/run.sh")
    assert env.files.list("/workspace/dir") == []
    env.files.remove("/workspace/x", recursive=True)
    with pytest.raises(NotFoundError) as caught:
        env.files.read("/workspace/x/y/a.txt")
    assert caught.value.status == 404


def test_snapshot_restore_fork_and_the_snapshot_list(moat: Moat, env: Environment) -> None:
    env.files.write("/workspace/state.txt", "v1")
    snap = env.snapshot(name="before")
    assert snap["id"].startswith("snap-") and snap["name"] == "before"
    assert [s["id"] for s in env.snapshots()] == [snap["id"]]
    assert snap["id"] in [s["id"] for s in moat.snapshots.list(environment_id=env.id)]
    assert moat.snapshots.get(snap["id"])["environment_id"] == env.id
    env.files.write("/workspace/state.txt", "v2")
    fork = env.fork(labels={"forked": "yes"})
    try:
        assert fork.id != env.id
        assert fork.files.read_text("/workspace/state.txt") == "v2"
        assert fork.info["labels"] == {"forked": "yes"}
    finally:
        fork.destroy()
    assert env.restore(snap) is env
    assert env.files.read_text("/workspace/state.txt") == "v1"
    moat.snapshots.delete(snap["id"])
    with pytest.raises(NotFoundError):
        moat.snapshots.get(snap["id"])
    assert env.snapshots() == []


def test_changes_permissions_and_network(env: Environment) -> None:
    env.files.write("/workspace/new.txt", "hi\n")
    changes = env.changes()
    assert any(c["path"] == "/workspace/new.txt" and c["change"] == "added" for c in changes["changes"])
    assert env.network()["network"]["mode"] == "none"
    env.set_permissions({"write_file": [{"path": "/workspace/locked/**", "action": "deny"}, {"action": "allow"}]})
    assert len(env.permissions()["layers"]) == 2


def test_health_and_metrics(moat: Moat) -> None:
    health = moat.health()
    assert health["status"] == "ok"
    assert isinstance(health["microvm"]["available"], bool)
    assert "moat_environments" in moat.metrics()


def test_the_remaining_handle_calls(env: Environment) -> None:
    assert env.refresh()["id"] == env.id and env.state == "running"
    assert env.set_network("none")["network"]["mode"] == "none"
    env.set_permissions({"run_command": "allow"}, replace=True)
    assert len(env.permissions()["layers"]) == 1
    cat = env.start(["cat"], stdin=True)
    wait_until(lambda: cat.refresh()["pid"] > 0, what="cat to start")
    assert cat.pid > 0
    cat.write("line\n")
    cat.close_stdin()  # EOF: cat ends by itself
    result = cat.wait(timeout=20)
    assert (result.exit_code, result.stdout) == (0, "line\n")
    sleeper = env.start("sleep 600")
    sleeper.signal("TERM")
    assert sleeper.wait(timeout=20).exit_code == 128 + 15
