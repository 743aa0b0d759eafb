"""Finding moatd and its token exactly as the CLI does (src/cli/client.cc)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from moat import Moat, NoTokenError, UnauthorizedError
from moat.transport import discover, parse_url


@pytest.fixture()
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("MOAT_URL", "MOAT_TOKEN", "MOAT_STATE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_no_token_lists_every_place_it_looked(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with pytest.raises(NoTokenError) as caught:
        Moat(state_dir=str(state))
    e = caught.value
    assert e.code == "no_token"
    assert len(e.looked) == 3
    message = str(e)
    assert "the token argument (not given)" in message
    assert "$MOAT_TOKEN (not set)" in message
    assert f"{state}/master-token (No such file or directory; the state directory {state} is given as state_dir)" in message
    assert e.message.endswith(f"make {state}/master-token readable.")


def test_an_empty_token_file_and_empty_variable_are_named(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "master-token").write_text("\n")
    clean_env.setenv("MOAT_TOKEN", "  ")
    clean_env.setenv("MOAT_STATE", str(tmp_path))
    with pytest.raises(NoTokenError) as caught:
        Moat()
    assert "$MOAT_TOKEN (empty)" in str(caught.value)
    assert f"{tmp_path}/master-token (empty; the state directory {tmp_path} is from $MOAT_STATE)" in str(caught.value)


def test_the_default_state_directory_is_var_lib_moat(clean_env: pytest.MonkeyPatch) -> None:
    if os.access("/var/lib/moat/master-token", os.R_OK):  # a host running moatd: its token is found
        endpoint, token = discover()
        assert endpoint.display == "unix:/var/lib/moat/moatd.sock"
        assert token == open("/var/lib/moat/master-token").read().strip()
        return
    with pytest.raises(NoTokenError) as caught:
        Moat()
    assert "/var/lib/moat/master-token (" in str(caught.value) and "is the default" in str(caught.value)
    assert Moat(token="t").url == "unix:/var/lib/moat/moatd.sock"


def test_order_argument_then_variable_then_file(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "master-token").write_text("from-file\n")
    endpoint, token = discover(state_dir=str(tmp_path))
    assert token == "from-file"
    assert endpoint.display == f"unix:{tmp_path}/moatd.sock"  # no url: the state directory's socket
    clean_env.setenv("MOAT_TOKEN", "from-variable")
    assert discover(state_dir=str(tmp_path))[1] == "from-variable"
    assert discover(token="from-argument", state_dir=str(tmp_path))[1] == "from-argument"
    clean_env.setenv("MOAT_URL", "http://127.0.0.1:7070")
    assert discover(state_dir=str(tmp_path))[0].display == "http://127.0.0.1:7070"
    assert discover(url="unix:///run/x.sock", state_dir=str(tmp_path))[0].display == "unix:/run/x.sock"


def test_bad_urls_are_refused_naming_the_variable(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="absolute path"):
        parse_url("unix:relative.sock")
    with pytest.raises(ValueError, match="neither"):
        parse_url("ftp://x:1")
    clean_env.setenv("MOAT_URL", "nonsense")
    with pytest.raises(ValueError, match="^MOAT_URL: "):
        Moat(token="t")


def test_the_state_directory_token_and_socket_reach_a_real_moatd(clean_env: pytest.MonkeyPatch, moatd) -> None:  # type: ignore[no-untyped-def]
    # Nothing given: $MOAT_STATE leads to <state>/moatd.sock and <state>/master-token.
    clean_env.setenv("MOAT_STATE", moatd.state)
    client = Moat()
    assert client.url == f"unix:{moatd.state}/moatd.sock"
    assert client.health()["status"] == "ok"
    assert isinstance(client.list(), list)  # authenticated with the file's token


def test_the_token_variable_is_used_and_a_wrong_one_is_unauthorized(clean_env: pytest.MonkeyPatch, moatd) -> None:  # type: ignore[no-untyped-def]
    clean_env.setenv("MOAT_URL", moatd.url)
    clean_env.setenv("MOAT_TOKEN", moatd.token)
    client = Moat()
    assert isinstance(client.list(), list)
    assert moatd.token not in repr(client) and moatd.token not in repr(client.transport.endpoint)
    clean_env.setenv("MOAT_TOKEN", "0" * 64)
    with pytest.raises(UnauthorizedError) as caught:
        Moat().list()
    assert "0" * 64 not in str(caught.value)  # the token is never in a message
    assert caught.value.status == 401
    assert caught.value.code == "unauthorized"
