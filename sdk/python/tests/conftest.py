"""A real moatd for the tests: a fresh state directory, TCP on an ephemeral
port, the master token from <state>/master-token (as sdk/typescript/test/moatd.mjs).

moatd comes from $MOAT_BIN_DIR (default: ../../build/bin). It needs root
(namespaces, cgroups, mounts): without root, or without the binary, the
tests that need it are skipped saying why, except in CI (MOAT_CI=1), where
that is a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the package under test, not an installed one

from moat import Moat  # noqa: E402

BIN_DIR = Path(os.environ.get("MOAT_BIN_DIR") or HERE.parent.parent.parent / "build" / "bin").resolve()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    """In CI (MOAT_CI=1) nothing may skip: a skipped test is reported failed."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("MOAT_CI") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (MOAT_CI=1 runs every test): {report.longrepr}"


def _unavailable(why: str) -> None:
    if os.environ.get("MOAT_CI") == "1":
        pytest.fail(f"{why} (CI runs every test: MOAT_CI=1)")
    pytest.skip(why)


class Moatd:
    """One moatd process and its state directory."""

    def __init__(self, extra_args: Optional[list[str]] = None) -> None:
        self.state = tempfile.mkdtemp(prefix="moatd-pysdk-")
        self.proc = subprocess.Popen(
            [str(BIN_DIR / "moatd"), "--state", self.state, "--listen", "127.0.0.1:0", *(extra_args or [])],
            env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "MOAT_STORAGE_GB": "16"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._log: list[str] = []
        self._serving = threading.Event()
        self.port = 0
        self.socket_path = ""
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._serving.wait(30) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError("moatd did not start within 30 s:\n" + self.log())
        self.token = Path(self.state, "master-token").read_text().strip()
        self.url = f"http://127.0.0.1:{self.port}"

    def _read_log(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace")
            self._log.append(line)
            m = re.search(r"moatd: serving http://127\.0\.0\.1:(\d+) and unix:(\S+)", line)
            if m:
                self.port, self.socket_path = int(m.group(1)), m.group(2)
                self._serving.set()
        self._serving.set()  # it exited: stop waiting

    def log(self) -> str:
        return "".join(self._log)

    def client(self, token: Optional[str] = None) -> Moat:
        return Moat(url=self.url, token=token or self.token)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM destroys every environment
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # moatd leaves its storage pool mounted in the state directory.
        subprocess.run(["umount", "-l", os.path.join(self.state, "storage")],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", "--one-file-system", self.state])


@pytest.fixture(scope="session")
def moatd() -> Iterator[Moatd]:
    if os.geteuid() != 0:
        _unavailable("needs root (moatd creates namespaces, cgroups and mounts)")
    if not (BIN_DIR / "moatd").exists():
        _unavailable(f"{BIN_DIR / 'moatd'} is not built (set MOAT_BIN_DIR to the build's bin directory)")
    daemon = Moatd()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="session")
def moat(moatd: Moatd) -> Moat:
    return moatd.client()


@pytest.fixture()
def env(moat: Moat) -> Iterator["object"]:
    environment = moat.create(ram_mb=256, ttl_s=600, labels={"test": "pysdk"})
    yield environment
    environment.destroy()


def wait_until(check, timeout: float = 10.0, what: str = "the condition"):  # type: ignore[no-untyped-def]
    """Polls ``check`` until it answers something true (returned); fails after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)
