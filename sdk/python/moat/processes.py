"""Commands in an environment: ``run`` (to the end, output as it comes) and
``start`` (a background :class:`Process` with ``wait()`` and ``kill()``).

Both start a process moatd keeps (``POST .../processes``) and follow its
output stream (``GET .../output?follow=1``, NDJSON): each ``output`` event is
handed to the callbacks in the order the bytes were produced, and the stream
ends with exactly one ``exit`` (or ``end``) event. A followed process is
started ``lossless``: a slow callback holds the command up rather than losing
its output (docs/API.md, "Processes").
"""

from __future__ import annotations

import base64
import codecs
import json
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, Sequence, Union

from .errors import CommandError, ConflictError, MoatConnectionError, MoatError, MoatTimeoutError
from .transport import Transport, seg

if TYPE_CHECKING:
    from .environments import Environment

#: A command: a string is a shell line (``/bin/sh -c``), a sequence is argv.
Command = Union[str, Sequence[str]]
OutputCallback = Callable[[str], Any]

#: A stdin piece sent at once (its base64 must fit moatd's 1 MiB JSON body).
_STDIN_PIECE = 512 * 1024


def argv_of(cmd: Command) -> list[str]:
    """``"make test"`` -> ``["/bin/sh", "-c", "make test"]``; a list is argv as it is."""
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    argv = list(cmd)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise TypeError("cmd: a shell line (str) or a non-empty list of strings (argv)")
    return argv


def gated(transport: Transport, approval: str) -> dict[str, Any]:
    """The request options of a call the gate checks.

    ``approval="wait"`` (the default): an ``ask`` holds the request until a
    person decides, so it may wait ``transport.approval_timeout`` (not the
    usual request timeout). ``approval="async"``: ``Prefer: respond-async``,
    and an ``ask`` raises ApprovalPendingError at once.
    """
    if approval == "async":
        return {"headers": {"Prefer": "respond-async"}}
    if approval != "wait":
        raise ValueError(f'approval: "wait" or "async", not {approval!r}')
    return {"timeout": max(transport.timeout, transport.approval_timeout)}


@dataclass
class OutputEvent:
    """One line of a process's output stream, its data decoded to bytes."""

    type: str  # output, dropped, heartbeat, exit, end, error
    offset: int = 0
    stream: str = ""  # output: stdout or stderr
    data: bytes = b""  # output
    bytes: int = 0  # dropped
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def next_offset(self) -> int:
        if self.type == "output":
            return self.offset + len(self.data)
        if self.type == "dropped":
            return self.offset + self.bytes
        return self.offset


def parse_event(line: bytes) -> OutputEvent:
    raw = json.loads(line)
    if not isinstance(raw, dict):
        raise ValueError("not an object")
    kind = str(raw.get("type", ""))
    event = OutputEvent(kind, int(raw.get("offset", 0) or 0), raw=raw)
    if kind == "output":
        event.stream = "stderr" if raw.get("stream") == "stderr" else "stdout"
        text = raw.get("data", "")
        event.data = base64.b64decode(text) if raw.get("encoding") == "base64" else str(text).encode()
    elif kind == "dropped":
        event.bytes = int(raw.get("bytes", 0))
    return event


@dataclass
class RunResult:
    """How a command ended, and what it wrote."""

    cmd: list[str]
    exit_code: int
    stdout_bytes: bytes
    stderr_bytes: bytes
    #: ``exited``, ``failed`` (could not start: exit_code 127/126, ``error`` says why) or ``lost``.
    state: str = "exited"
    signal: int = 0
    timed_out: bool = False
    duration_ms: Optional[int] = None
    #: Why it failed to start, or (``lost``) why it could not be followed to its end.
    error: Optional[str] = None
    #: Output bytes moatd dropped before they were read (its log keeps 1 MiB per stream).
    dropped: int = 0
    process_id: int = 0

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return self.state == "exited" and self.exit_code == 0

    def check(self) -> "RunResult":
        """Raises CommandError unless the command exited 0."""
        if not self.ok:
            raise CommandError(self)
        return self


class _Collector:
    """Hands output to callbacks (as text, decoded across chunk boundaries) and keeps it."""

    def __init__(self, on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback]) -> None:
        self.callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self.decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in ("stdout", "stderr")}
        self.chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        self.dropped = 0
        self.final: Optional[OutputEvent] = None

    def take(self, event: OutputEvent) -> None:
        if event.type == "output":
            self.chunks[event.stream].append(event.data)
            callback = self.callbacks[event.stream]
            if callback is not None:
                text = self.decoders[event.stream].decode(event.data)
                if text:
                    callback(text)
        elif event.type == "dropped":
            self.dropped += event.bytes
        elif event.type in ("exit", "end"):
            for stream, callback in self.callbacks.items():
                rest = self.decoders[stream].decode(b"", final=True)
                if rest and callback is not None:
                    callback(rest)
            self.final = event

    def result(self, cmd: list[str], process_id: int) -> RunResult:
        final = self.final.raw if self.final is not None else {}
        state = str(final.get("state", "lost"))
        error = final.get("error") if state != "lost" else final.get("reason", "the stream ended without a final event")
        return RunResult(
            cmd=cmd,
            exit_code=int(final.get("exit_code", -1)) if "exit_code" in final else -1,
            stdout_bytes=b"".join(self.chunks["stdout"]),
            stderr_bytes=b"".join(self.chunks["stderr"]),
            state=state,
            signal=int(final.get("signal", 0) or 0),
            timed_out=bool(final.get("timed_out", False)),
            duration_ms=final.get("duration_ms"),
            error=error if isinstance(error, str) else None,
            dropped=self.dropped,
            process_id=process_id,
        )


def follow_output(
    transport: Transport,
    path: str,
    since: int = 0,
    follow: bool = True,
    idle_timeout: Optional[float] = 60.0,
) -> Iterator[OutputEvent]:
    """The events of ``path`` (a process's ``/output``) from ``since``.

    With ``follow``, until the final event: a connection that breaks first is
    followed again from the offset reached (a bounded number of times), so no
    byte is lost or repeated. Heartbeats are not yielded.
    """
    offset = since
    failures = 0
    while True:
        stream = transport.stream(
            path, query={"since": offset, "follow": True if follow else None}, idle_timeout=idle_timeout
        )
        broken: Optional[MoatError] = None
        try:
            for line in stream.lines():
                if not line.strip():
                    continue
                try:
                    event = parse_event(line)
                except (ValueError, KeyError) as e:
                    raise MoatError(f"a line of {path} is not an event: {line[:200]!r} ({e})", code="bad_response")
                offset = max(offset, event.next_offset)
                failures = 0
                if event.type == "error":
                    raise MoatError(str(event.raw.get("message", "the output stream ended with an error")),
                                    code="stream_error")
                if event.type == "heartbeat":
                    continue
                yield event
                if event.type in ("exit", "end"):
                    return
        except MoatConnectionError as e:
            broken = e
        finally:
            stream.close()
        if not follow:
            if broken is not None:
                raise broken
            return
        if failures >= transport.max_retries:
            raise broken or MoatConnectionError(f"the output stream of {path} ended before the process did")
        transport.backoff(failures)
        failures += 1


class Process:
    """A process in an environment: ``id``, ``wait()``, ``kill()``, its output.

    Started with callbacks, a thread follows its output and calls them (and
    ``on_exit`` with the :class:`RunResult`); ``wait()`` then returns what that
    thread collected. Without callbacks, ``wait()`` follows the output itself
    from the start (what moatd still holds: 1 MiB per stream).
    """

    def __init__(
        self,
        env: "Environment",
        info: dict[str, Any],
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        on_exit: Optional[Callable[[RunResult], Any]] = None,
    ) -> None:
        self.env = env
        #: What moatd last said about the process (see ``refresh()``).
        self.info: dict[str, Any] = info
        self._on_exit = on_exit
        self._collector = _Collector(on_stdout, on_stderr)
        self._result: Optional[RunResult] = None
        self._failure: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        if on_stdout is not None or on_stderr is not None or on_exit is not None:
            self._thread = threading.Thread(target=self._follow_in_thread, name=f"moat-process-{self.id}", daemon=True)
            self._thread.start()

    @property
    def id(self) -> int:
        """moatd's id for the process (1, 2, ... per environment)."""
        return int(self.info["id"])

    @property
    def pid(self) -> int:
        """The process id inside the environment."""
        return int(self.info.get("pid", 0))

    @property
    def state(self) -> str:
        return str(self.info.get("state", ""))

    @property
    def cmd(self) -> list[str]:
        return list(self.info.get("cmd", []))

    def __repr__(self) -> str:
        return f"Process(env={self.env.id!r}, id={self.id}, cmd={self.cmd!r}, state={self.state!r})"

    def _path(self, action: str = "") -> str:
        p = f"/v1/environments/{seg(self.env.id)}/processes/{seg(self.id)}"
        return p + (f"/{action}" if action else "")

    def refresh(self) -> dict[str, Any]:
        """Fetches the process again and updates ``info``."""
        self.info = self.env._transport.json("GET", self._path())
        return self.info

    def output(self, since: int = 0, follow: bool = False) -> Iterator[OutputEvent]:
        """Its output events from byte offset ``since``; with ``follow``, until it ends."""
        return follow_output(self.env._transport, self._path("output"), since, follow)

    def _collect(self) -> RunResult:
        for event in self.output(0, follow=True):
            self._collector.take(event)
        result = self._collector.result(self.cmd, self.id)
        try:
            self.refresh()
        except MoatError:
            pass
        return result

    def _follow_in_thread(self) -> None:
        try:
            result = self._collect()
        except BaseException as e:  # handed to wait()
            self._failure = e
            return
        self._result = result
        if self._on_exit is not None:
            try:
                self._on_exit(result)
            except BaseException as e:
                self._failure = e

    def wait(self, timeout: Optional[float] = None) -> RunResult:
        """Waits until the process ends; its exit code and output. MoatTimeoutError after ``timeout`` s."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise MoatTimeoutError(f"process {self.id} did not end within {timeout} s")
            if self._failure is not None:
                raise self._failure
            assert self._result is not None
            return self._result
        with self._lock:
            if self._result is None:
                if timeout is None:
                    self._result = self._collect()
                else:
                    box: dict[str, Any] = {}

                    def collect() -> None:
                        try:
                            box["result"] = self._collect()
                        except BaseException as e:
                            box["error"] = e

                    t = threading.Thread(target=collect, daemon=True)
                    t.start()
                    t.join(timeout)
                    if t.is_alive():
                        raise MoatTimeoutError(f"process {self.id} did not end within {timeout} s")
                    if "error" in box:
                        raise box["error"]
                    self._result = box["result"]
            return self._result

    def signal(self, signal: Union[str, int] = "TERM") -> None:
        """Sends a signal (``"TERM"``, ``"INT"``, 9) to its process group."""
        self.env._transport.json("POST", self._path("signal"), json={"signal": signal})

    def kill(self, signal: Union[str, int] = "KILL") -> None:
        """Kills its process group (SIGKILL unless told otherwise); a process already ended is fine."""
        try:
            self.signal(signal)
        except ConflictError:
            pass

    def write(self, data: Union[str, bytes], close: bool = False) -> None:
        """Writes to its stdin (waits while 1 MiB of earlier input is unread)."""
        write_stdin(self.env._transport, self._path("stdin"), data, close)

    def close_stdin(self) -> None:
        self.env._transport.json("POST", self._path("stdin"), json={"close": True})


def write_stdin(transport: Transport, path: str, data: Union[str, bytes], close: bool) -> None:
    raw = data.encode() if isinstance(data, str) else bytes(data)
    pieces = [raw[i : i + _STDIN_PIECE] for i in range(0, len(raw), _STDIN_PIECE)] or [b""]
    for n, piece in enumerate(pieces):
        body: dict[str, Any] = {"data": base64.b64encode(piece).decode(), "encoding": "base64"}
        if close and n == len(pieces) - 1:
            body["close"] = True
        while True:
            try:
                transport.json("POST", path, json=body)
                break
            except ConflictError as e:
                if e.code != "stdin_full":  # none of the piece was taken: send it again
                    raise


def start_request(
    cmd: Command,
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    timeout: Optional[float],
    stdin: bool,
    lossless: bool,
    pty: bool = False,
) -> dict[str, Any]:
    body: dict[str, Any] = {"cmd": argv_of(cmd), "stdin": stdin, "lossless": lossless}
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    if timeout is not None:
        body["timeout_ms"] = max(1, int(timeout * 1000))
    if pty:
        body["pty"] = True
    return body
