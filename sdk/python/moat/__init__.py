"""moat: the Python SDK for moatd (standard library only).

    from moat import Moat

    moat = Moat()                       # finds moatd and its token like the CLI
    with moat.create() as env:          # destroyed at the end of the block
        env.files.write("/workspace/hello.py", "print('hi')")
        result = env.run("python3 hello.py", on_stdout=print)
        assert result.exit_code == 0

See sdk/python/README.md.
"""

from .client import Moat
from .environments import Environment
from .errors import (
    ApprovalExpiredError,
    ApprovalPendingError,
    ApprovalTimeoutError,
    CapacityError,
    CommandError,
    ConflictError,
    DeniedByPolicyError,
    FileError,
    ForbiddenError,
    InvalidRequestError,
    MethodNotAllowedError,
    MoatConnectionError,
    MoatError,
    MoatTimeoutError,
    NoTokenError,
    NotFoundError,
    PortUnreachableError,
    RateLimitedError,
    ServerTimeoutError,
    TemplateFailedError,
    TooLargeError,
    UnauthorizedError,
    UnavailableError,
)
from .processes import OutputEvent, Process, RunResult
from .transport import SDK_VERSION

__version__ = SDK_VERSION

__all__ = [
    "Moat",
    "Environment",
    "Process",
    "RunResult",
    "OutputEvent",
    "MoatError",
    "NotFoundError",
    "UnauthorizedError",
    "ForbiddenError",
    "DeniedByPolicyError",
    "ApprovalPendingError",
    "ApprovalExpiredError",
    "ApprovalTimeoutError",
    "ConflictError",
    "InvalidRequestError",
    "MethodNotAllowedError",
    "TooLargeError",
    "FileError",
    "CapacityError",
    "RateLimitedError",
    "UnavailableError",
    "ServerTimeoutError",
    "PortUnreachableError",
    "TemplateFailedError",
    "CommandError",
    "NoTokenError",
    "MoatConnectionError",
    "MoatTimeoutError",
    "__version__",
]
