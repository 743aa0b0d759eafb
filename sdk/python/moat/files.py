"""An environment's files: ``env.files.read/write/list/remove/stat/mkdir/move``.

Paths are absolute paths inside the environment, resolved by its own pid 1
(``..`` and symlinks cannot reach a host file). Every operation passes the
gate (``read_file`` for read, stat and list; ``write_file`` for the rest):
a denial raises DeniedByPolicyError; an ``ask`` waits for a person, or with
``approval="async"`` raises ApprovalPendingError at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

from .errors import NotFoundError
from .processes import gated
from .transport import seg

if TYPE_CHECKING:
    from .environments import Environment


class Files:
    def __init__(self, env: "Environment") -> None:
        self._env = env

    def _path(self, sub: str = "") -> str:
        return f"/v1/environments/{seg(self._env.id)}/files{sub}"

    def read(
        self, path: str, *, offset: Optional[int] = None, length: Optional[int] = None, approval: str = "wait"
    ) -> bytes:
        """The file's bytes (at most 8 MiB per call; ``offset``/``length`` for more)."""
        answer = self._env._transport.request(
            "GET", self._path(), query={"path": path, "offset": offset, "length": length},
            **gated(self._env._transport, approval),
        )
        return answer.body

    def read_text(self, path: str, *, encoding: str = "utf-8", approval: str = "wait") -> str:
        """The file as text."""
        return self.read(path, approval=approval).decode(encoding)

    def write(
        self,
        path: str,
        data: Union[str, bytes],
        *,
        mode: Union[int, str, None] = None,
        append: bool = False,
        approval: str = "wait",
    ) -> None:
        """Writes (``append``: appends to) a file, at most 16 MiB; parents are created. ``mode``: 0o755 or "0755"."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        mode_text = format(mode, "o") if isinstance(mode, int) else mode
        self._env._transport.request(
            "PUT", self._path(), query={"path": path, "append": True if append else None, "mode": mode_text},
            body=raw, **gated(self._env._transport, approval),
        )

    def list(self, path: str = "/workspace", *, approval: str = "wait") -> list[dict[str, Any]]:
        """The entries of a directory: ``[{"name", "type", "size", "mode", "mtime"}]``."""
        answer = self._env._transport.json(
            "GET", self._path("/list"), query={"path": path}, **gated(self._env._transport, approval)
        )
        return list(answer["entries"])

    def stat(self, path: str, *, approval: str = "wait") -> dict[str, Any]:
        """lstat of a path: ``{"name", "type", "size", "mode", "mtime"}``."""
        result: dict[str, Any] = self._env._transport.json(
            "GET", self._path("/stat"), query={"path": path}, **gated(self._env._transport, approval)
        )
        return result

    def exists(self, path: str, *, approval: str = "wait") -> bool:
        try:
            self.stat(path, approval=approval)
            return True
        except NotFoundError:
            return False

    def remove(self, path: str, *, recursive: bool = False, approval: str = "wait") -> None:
        """Removes a file or an empty directory; ``recursive`` removes a tree."""
        self._env._transport.json(
            "DELETE", self._path(), query={"path": path, "recursive": True if recursive else None},
            **gated(self._env._transport, approval),
        )

    def mkdir(self, path: str, *, parents: bool = False, approval: str = "wait") -> None:
        self._env._transport.json(
            "POST", self._path("/mkdir"), json={"path": path, "parents": parents}, **gated(self._env._transport, approval)
        )

    def move(self, source: str, target: str, *, approval: str = "wait") -> None:
        self._env._transport.json(
            "POST", self._path("/move"), json={"from": source, "to": target}, **gated(self._env._transport, approval)
        )
