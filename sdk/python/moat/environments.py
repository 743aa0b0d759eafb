"""An environment handle: ``env = moat.create(); env.run("make test", on_stdout=print); env.destroy()``."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Union

from .errors import ConflictError, MoatError
from .files import Files
from .processes import (
    Command,
    OutputCallback,
    Process,
    RunResult,
    _Collector,
    argv_of,
    follow_output,
    gated,
    start_request,
    write_stdin,
)
from .transport import Transport, seg

if TYPE_CHECKING:
    from .client import Moat


class Environment:
    """One environment. ``info`` is what moatd last said about it (``refresh()`` asks again).

    A context manager: ``with moat.create() as env: ...`` destroys it at the end.
    """

    def __init__(self, client: "Moat", info: dict[str, Any]) -> None:
        self._client = client
        self._transport: Transport = client.transport
        #: The environment's record: id, state, template, spec, labels, expires_at, ...
        self.info: dict[str, Any] = info
        #: Its files (read, write, list, remove, stat, mkdir, move).
        self.files = Files(self)

    @property
    def id(self) -> str:
        return str(self.info["id"])

    @property
    def state(self) -> str:
        """``creating``, ``running``, ``paused``, ``destroying``, ``gone`` or ``failed`` (as last fetched)."""
        return str(self.info.get("state", ""))

    def __repr__(self) -> str:
        return f"Environment(id={self.id!r}, state={self.state!r}, template={self.info.get('template')!r})"

    def __enter__(self) -> "Environment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def _path(self, sub: str = "") -> str:
        return f"/v1/environments/{seg(self.id)}{sub}"

    # --- the environment itself ---------------------------------------------

    def refresh(self) -> dict[str, Any]:
        self.info = self._transport.json("GET", self._path())
        return self.info

    def destroy(self) -> None:
        """Destroys it (every process ends); destroying a gone one is fine."""
        self._transport.json("DELETE", self._path())
        self.info = {**self.info, "state": "gone"}

    def set_timeout(self, ttl_s: int) -> dict[str, Any]:
        """Makes it expire ``ttl_s`` seconds from now (longer or shorter)."""
        self.info = self._transport.json("POST", self._path("/timeout"), json={"ttl_s": ttl_s})
        return self.info

    def pause(self, memory: str = "ram") -> dict[str, Any]:
        """Stops every process where it is (docs/PAUSE.md): ``state`` ``paused``, with ``paused_at``.

        Until ``resume()``, commands, processes, shells and file changes raise
        ConflictError (409); file reads, snapshots and forks still work. Its
        time to live stops unless it was created with
        ``ttl_while_paused="runs"``. Pausing a paused one is no error.
        ``memory="disk"`` (microVMs) then saves its memory to disk and
        releases it; a file read brings it back into RAM, still paused, until
        no read came for a while ("To disk").
        """
        body = {} if memory == "ram" else {"memory": memory}
        self.info = self._transport.json("POST", self._path("/pause"), json=body)
        return self.info

    def resume(self) -> dict[str, Any]:
        """Lets its processes go on after ``pause()``: ``state`` ``running``.

        ``expires_at`` moves on by the pause's length unless its time to live
        ran while paused. Resuming a running one is no error.
        """
        self.info = self._transport.json("POST", self._path("/resume"), json={})
        return self.info

    def stats(self) -> dict[str, Any]:
        """What it uses now (cpu_usec, memory_bytes, pids) beside its limits."""
        result: dict[str, Any] = self._transport.json("GET", self._path("/stats"))
        return result

    def changes(self, against: str = "template", diff: bool = True) -> dict[str, Any]:
        """What changed in its files against its template or one of your snapshots (with diffs)."""
        result: dict[str, Any] = self._transport.json(
            "GET", self._path("/changes"), query={"against": against, "diff": diff}
        )
        return result

    # --- commands ------------------------------------------------------------

    def run(
        self,
        cmd: Command,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[str, bytes, None] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        check: bool = False,
        approval: str = "wait",
    ) -> RunResult:
        """Runs a command to its end: its exit code, stdout and stderr.

        ``cmd``: a string is a shell line (``/bin/sh -c``), a list is argv.
        ``on_stdout``/``on_stderr`` get the output as text as it arrives, in
        order, all of it before ``run`` returns. ``timeout`` (s) kills the
        command's process group (``timed_out`` says so). A command that fails
        is a normal result unless ``check=True`` (CommandError). The gate
        checks it first: DeniedByPolicyError, or an ``ask`` that waits for a
        person (``approval="async"``: ApprovalPendingError at once). If a
        callback raises (or Ctrl-C), the command is killed.
        """
        body = start_request(cmd, cwd, env, timeout, stdin=stdin is not None, lossless=True)
        info = self._transport.json("POST", self._path("/processes"), json=body, **gated(self._transport, approval))
        process_id = int(info["id"])
        proc_path = self._path(f"/processes/{process_id}")
        feeder: Optional[threading.Thread] = None
        feed_error: list[BaseException] = []
        if stdin is not None:
            # Written beside the follow: a lossless command may wait for its
            # output to be read before it reads more input.
            def feed() -> None:
                try:
                    write_stdin(self._transport, proc_path + "/stdin", stdin, close=True)
                except ConflictError:
                    pass  # it ended (or closed its stdin) before reading it all
                except BaseException as e:
                    feed_error.append(e)

            feeder = threading.Thread(target=feed, name=f"moat-stdin-{process_id}", daemon=True)
            feeder.start()
        collector = _Collector(on_stdout, on_stderr)
        try:
            for event in follow_output(self._transport, proc_path + "/output", 0, True):
                collector.take(event)
        except BaseException:
            try:
                self._transport.json("POST", proc_path + "/signal", json={"signal": "KILL"})
            except MoatError:
                pass
            raise
        if feeder is not None:
            feeder.join()
            if feed_error:
                raise feed_error[0]
        result = collector.result(argv_of(cmd), process_id)
        return result.check() if check else result

    def start(
        self,
        cmd: Command,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[str, bytes, bool, None] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        on_exit: Optional[Callable[[RunResult], Any]] = None,
        pty: bool = False,
        approval: str = "wait",
    ) -> Process:
        """Starts a command in the background and returns its :class:`Process` at once.

        With callbacks, a thread follows its output and calls them
        (``on_exit`` with the RunResult). ``stdin``: ``True`` keeps a pipe
        open for ``process.write()``; text or bytes are written (then closed);
        otherwise it reads ``/dev/null``. ``timeout`` (s) kills it.
        """
        followed = on_stdout is not None or on_stderr is not None or on_exit is not None
        body = start_request(cmd, cwd, env, timeout, stdin=stdin is not None and stdin is not False,
                             lossless=followed, pty=pty)
        info = self._transport.json("POST", self._path("/processes"), json=body, **gated(self._transport, approval))
        process = Process(self, info, on_stdout, on_stderr, on_exit)
        if isinstance(stdin, (str, bytes)):
            process.write(stdin, close=True)
        return process

    def processes(self) -> list[Process]:
        """Its processes (execs and shells included), oldest first."""
        answer = self._transport.json("GET", self._path("/processes"))
        return [Process(self, info) for info in answer["processes"]]

    def process(self, process_id: int) -> Process:
        return Process(self, self._transport.json("GET", self._path(f"/processes/{seg(process_id)}")))

    # --- snapshots -----------------------------------------------------------

    def snapshot(self, name: Optional[str] = None, *, approval: str = "wait") -> dict[str, Any]:
        """Snapshots its files now (not its processes): ``{"id": "snap-...", ...}``.

        It reads every file: the gate's ``read_file`` for the whole tree decides.
        """
        result: dict[str, Any] = self._transport.json(
            "POST", self._path("/snapshots"), json={"name": name} if name is not None else {},
            **gated(self._transport, approval),
        )
        return result

    def snapshots(self) -> list[dict[str, Any]]:
        """Its snapshots, newest first."""
        return list(self._transport.json("GET", self._path("/snapshots"))["snapshots"])

    def restore(self, snapshot: Union[str, Mapping[str, Any]], *, approval: str = "wait") -> "Environment":
        """Starts it again on the snapshot's files (same id; every process ends)."""
        snapshot_id = snapshot if isinstance(snapshot, str) else str(snapshot["id"])
        self.info = self._transport.json(
            "POST", self._path("/restore"), json={"snapshot": snapshot_id}, **gated(self._transport, approval)
        )
        return self

    def fork(
        self, *, task_id: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
        ttl_s: Optional[int] = None, memory: bool = False,
    ) -> "Environment":
        """A new environment with a copy of its files as they are now and all its settings.

        ``memory=True``: its running processes too, going on in the fork where they were
        (microvm environments; docs/PAUSE.md, "Forks with memory").
        """
        body: dict[str, Any] = {}
        if memory:
            body["memory"] = True
        if task_id is not None:
            body["task_id"] = task_id
        if labels is not None:
            body["labels"] = dict(labels)
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        return Environment(self._client, self._transport.json("POST", self._path("/fork"), json=body))

    # --- the gate and the network --------------------------------------------

    def permissions(self) -> dict[str, Any]:
        """``{"permissions", "layers", "ceiling"?}`` (docs/GATE.md)."""
        result: dict[str, Any] = self._transport.json("GET", self._path("/permissions"))
        return result

    def set_permissions(self, permissions: Mapping[str, Any], *, replace: bool = False) -> dict[str, Any]:
        """Adds a layer (can only tighten); ``replace=True`` replaces every layer (master or ``permissions`` scope)."""
        body: dict[str, Any] = {"permissions": dict(permissions)}
        if replace:
            body["replace"] = True
        result: dict[str, Any] = self._transport.json("PUT", self._path("/permissions"), json=body)
        return result

    def network(self) -> dict[str, Any]:
        """Its egress policy and link (docs/EGRESS.md)."""
        result: dict[str, Any] = self._transport.json("GET", self._path("/network"))
        return result

    def set_network(self, policy: Union[str, Mapping[str, Any]]) -> dict[str, Any]:
        """Replaces its egress policy: ``"open"``, ``"none"`` or ``{mode, allow, deny, ...}``."""
        result: dict[str, Any] = self._transport.json(
            "PUT", self._path("/network"), json={"network": policy if isinstance(policy, str) else dict(policy)}
        )
        return result

    # --- ports and previews (docs/API.md, "Ports") ----------------------------

    def create_preview(self, port: int, ttl_s: Optional[int] = None) -> dict[str, Any]:
        """A preview of ``port``: ``{"id", "port", "url", "expires_at"}``; the url (a secret) is shown only here."""
        body: dict[str, Any] = {"port": port}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        result: dict[str, Any] = self._transport.json("POST", self._path("/previews"), json=body)
        return result

    def get_url(self, port: int, ttl_s: Optional[int] = None) -> str:
        """A URL a browser opens without the token, serving ``port`` inside; it ends at expiry, revocation or the environment's end."""
        return str(self.create_preview(port, ttl_s)["url"])

    def previews(self) -> list[dict[str, Any]]:
        """Its previews (without their urls)."""
        return list(self._transport.json("GET", self._path("/previews"))["previews"])

    def revoke_preview(self, preview_id: str) -> None:
        """Ends a preview at once."""
        self._transport.json("DELETE", self._path(f"/previews/{seg(preview_id)}"))

    def port_path(self, port: int, path: str = "/") -> str:
        """The API path that proxies to ``port`` inside (``ANY /v1/environments/{id}/ports/{port}/...``; needs the token)."""
        return self._path(f"/ports/{int(port)}/") + path.lstrip("/")
