"""Typed errors for bad input, and the gate: denials, approvals (ask) waited for and async."""

from __future__ import annotations

import threading

import pytest

from moat import (
    ApprovalExpiredError,
    ApprovalPendingError,
    CapacityError,
    ConflictError,
    DeniedByPolicyError,
    ForbiddenError,
    InvalidRequestError,
    Moat,
    MoatConnectionError,
    MoatError,
    NotFoundError,
    UnauthorizedError,
)
from moat.errors import RateLimitedError, error_from_response

from conftest import Moatd


def test_an_unknown_environment_is_not_found(moat: Moat) -> None:
    with pytest.raises(NotFoundError) as caught:
        moat.get("000000000000")
    e = caught.value
    assert (e.status, e.code) == (404, "not_found")
    assert isinstance(e, MoatError) and e.message


def test_an_id_cannot_reach_another_endpoint(moatd: Moatd, moat: Moat) -> None:
    # moatd decodes paths before splitting them: '../keys' as an environment id
    # would list the keys. Refused before anything is sent, whatever the token.
    key = moat.keys.create(["read", "files"], name="pysdk-traversal")
    reader = moatd.client(token=key["token"])
    for bad in ("../keys", "x/../../keys", "..", ".", "", "a\nb"):
        with pytest.raises(InvalidRequestError) as caught:
            reader.get(bad)
        assert caught.value.field == "id" and caught.value.status == 0
    with pytest.raises(InvalidRequestError):
        moat.snapshots.delete("../environments")
    with pytest.raises(InvalidRequestError):
        moat.approvals.approve("../../keys")
    # A name that only looks odd is escaped and reaches moatd as one segment.
    with pytest.raises(NotFoundError):
        reader.get("..%2Fkeys")
    moat.keys.revoke(key["id"])


def test_malformed_input_names_the_field(moat: Moat) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        moat.create(cpus=99999)
    assert (caught.value.status, caught.value.code, caught.value.field) == (400, "invalid_request", "spec.cpus")
    with pytest.raises(InvalidRequestError) as caught:
        moat.create(no_such_field=1)
    assert (caught.value.code, caught.value.field) == ("unknown_field", "no_such_field")
    with pytest.raises(InvalidRequestError) as caught:
        moat.list(state="sideways")
    assert caught.value.field == "state"


def test_a_file_that_is_not_there_and_a_destroyed_environment(moat: Moat) -> None:
    env = moat.create(ram_mb=128)
    with pytest.raises(NotFoundError):
        env.files.read("/workspace/nope")
    env.destroy()
    with pytest.raises(ConflictError) as caught:
        env.run("true")
    assert caught.value.status == 409


def test_a_key_without_the_scope_is_forbidden_and_a_revoked_key_unauthorized(moatd: Moatd, moat: Moat) -> None:
    key = moat.keys.create(["read"], name="pysdk-readonly")
    assert key["token"].startswith("moat_") and key["scopes"] == ["read"]
    reader = moatd.client(token=key["token"])
    assert reader.list() == []  # sees only its own environments
    with pytest.raises(ForbiddenError) as caught:
        reader.create()
    assert caught.value.code == "forbidden" and "create" in caught.value.message
    assert not isinstance(caught.value, DeniedByPolicyError)
    with pytest.raises(ForbiddenError):
        reader.keys.list()
    listed = {k["id"]: k for k in moat.keys.list()}
    assert listed[key["id"]]["name"] == "pysdk-readonly" and "token" not in listed[key["id"]]
    moat.keys.revoke(key["id"])
    assert {k["id"]: k for k in moat.keys.list()}[key["id"]]["revoked"] is True
    with pytest.raises(UnauthorizedError):
        reader.list()
    with pytest.raises(NotFoundError):
        moat.keys.revoke(key["id"])  # twice: 404


def test_a_command_the_policy_denies_is_denied_by_policy(moat: Moat) -> None:
    with moat.create(ram_mb=128, permissions={
        "run_command": [{"match": ["rm", "*"], "action": "deny"}, {"action": "allow"}],
        "write_file": [{"path": "/etc/**", "action": "deny"}, {"action": "allow"}],
    }) as env:
        with pytest.raises(DeniedByPolicyError) as caught:
            env.run(["rm", "-rf", "/workspace"])
        e = caught.value
        assert (e.status, e.code, e.scope) == (403, "denied_by_policy", "run_command")
        assert e.action is not None and e.action["argv"] == ["rm", "-rf", "/workspace"]
        assert e.rule == {"match": ["rm", "*"], "action": "deny"}
        assert isinstance(e, ForbiddenError)  # every 403 is caught as ForbiddenError too
        with pytest.raises(DeniedByPolicyError) as caught:
            env.files.write("/etc/motd", "x")
        assert caught.value.scope == "write_file"
        assert env.run(["echo", "fine"]).stdout == "fine\n"


def test_an_ask_answered_async_then_approved_and_repeated(moat: Moat) -> None:
    with moat.create(ram_mb=128, permissions={"run_command": "ask"}) as env:
        with pytest.raises(ApprovalPendingError) as caught:
            env.run(["echo", "approved"], approval="async")
        pending = caught.value
        assert pending.status == 202 and pending.approval["state"] == "pending"
        assert pending.location == f"/v1/approvals/{pending.approval_id}"
        listed = moat.approvals.list(state="pending", environment=env.id)
        assert [a["id"] for a in listed] == [pending.approval_id]
        assert moat.approvals.get(pending.approval_id)["action"]["argv"] == ["echo", "approved"]
        decided = moat.approvals.approve(pending.approval_id, reason="looks fine")
        assert decided["state"] == "approved"
        assert moat.approvals.wait(pending.approval_id, timeout=5)["state"] == "approved"
        with pytest.raises(ConflictError):
            moat.approvals.deny(pending.approval_id)  # already decided
        assert env.run(["echo", "approved"]).stdout == "approved\n"  # the one-time grant


def test_an_ask_waited_for_and_denied_by_a_person(moat: Moat) -> None:
    with moat.create(ram_mb=128, permissions={"run_command": "ask"}) as env:
        outcome: list[BaseException] = []

        def agent() -> None:
            try:
                env.run(["touch", "/workspace/x"])
            except BaseException as e:
                outcome.append(e)

        t = threading.Thread(target=agent)
        t.start()
        approval = moat.approvals.wait_for_pending(environment=env.id, timeout=20)
        waited: list[dict] = []
        waiter = threading.Thread(target=lambda: waited.append(moat.approvals.get(approval["id"], wait=30)))
        waiter.start()
        moat.approvals.deny(approval["id"], reason="not now")
        t.join(30)
        waiter.join(30)
        assert isinstance(outcome[0], DeniedByPolicyError)
        assert outcome[0].approval == approval["id"] and "not now" in outcome[0].message
        assert waited[0]["state"] == "denied"


def test_a_person_may_take_longer_than_the_request_timeout(moatd: Moatd) -> None:
    # An ask holds the request until a person decides: the client's usual
    # request timeout (here 0.5 s) does not cut that wait short.
    moat = Moat(url=moatd.url, token=moatd.token, timeout=0.5)
    with moat.create(ram_mb=128, permissions={"write_file": "ask"}) as env:
        done: list[object] = []
        t = threading.Thread(target=lambda: done.append(env.files.write("/workspace/slow.txt", "ok")))
        t.start()
        pending = moat.approvals.wait_for_pending(environment=env.id, timeout=20)
        t.join(1.0)  # longer than the request timeout: the call must still be waiting
        assert t.is_alive() and not done
        moat.approvals.approve(pending["id"])
        t.join(30)
        assert done == [None] and env.files.read_text("/workspace/slow.txt") == "ok"


def test_an_ask_nobody_decides_expires_as_its_own_error(moatd: Moatd) -> None:
    daemon = Moatd(["--approval-timeout", "1"])  # a moatd of its own (the fixture's: root and binary checked)
    try:
        moat = daemon.client()
        with moat.create(ram_mb=128, permissions={"run_command": "ask"}) as env:
            with pytest.raises(ApprovalExpiredError) as caught:
                env.run(["echo", "nobody"])
            e = caught.value
            assert isinstance(e, DeniedByPolicyError) and "no decision within 1 s" in e.message
            assert moat.approvals.get(e.approval or "")["state"] == "expired"
    finally:
        daemon.stop()


def test_status_and_code_map_to_their_families() -> None:
    assert isinstance(error_from_response(429, b'{"error":{"code":"capacity","message":"m"}}'), CapacityError)
    limited = error_from_response(429, b'{"error":{"code":"capacity","message":"m"}}', "3")
    assert isinstance(limited, RateLimitedError) and limited.retry_after_s == 3
    odd = error_from_response(502, b"<html>bad gateway</html>")
    assert odd.code == "http_502" and "bad gateway" in odd.message
    assert error_from_response(500, b'{"error":{"code":"internal","message":"bug"}}').status == 500


def test_an_unreachable_moatd_is_a_connection_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    client = Moat(url=f"unix:{tmp_path}/none.sock", token="t", max_retries=0)
    with pytest.raises(MoatConnectionError) as caught:
        client.list()
    assert "is moatd running?" in str(caught.value) and caught.value.status == 0
