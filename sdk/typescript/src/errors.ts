// Typed errors. moatd answers errors as {"error": {"code", "message", "field"}};
// each becomes a MoatError (or a subclass picked by its code) carrying the
// HTTP status, the code and the field. Client-side failures have status 0.

export interface MoatErrorInit {
  status: number;
  code: string;
  message: string;
  field?: string | undefined;
  cause?: unknown;
}

export class MoatError extends Error {
  /** The HTTP status; 0 for client-side errors (timeout, connection, abort). */
  readonly status: number;
  /** moatd's machine-readable code (`not_found`, `invalid_request`, ...) or the client's. */
  readonly code: string;
  /** The request field at fault (`spec.cpus`, `cmd[1]`, `path`), when moatd names one. */
  readonly field: string | undefined;

  constructor(init: MoatErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.status = init.status;
    this.code = init.code;
    this.field = init.field;
  }
}

/** 404 `not_found`: no such environment, process, file or endpoint (or one an API key does not own). */
export class NotFoundError extends MoatError {}
/** 401 `unauthorized`: a missing, wrong or revoked token. */
export class UnauthorizedError extends MoatError {}
/** 403 `forbidden`: the API key lacks the scope, or a file permission. */
export class ForbiddenError extends MoatError {}
/** 409 `conflict`: the environment (or process) is not running, stdin is closed. */
export class ConflictError extends MoatError {}
/** 429 `capacity`: the environment, memory or process limit is reached. */
export class CapacityError extends MoatError {}
/** 400 `invalid_request`, `unknown_field`, `bad_json`, ...: `field` names what is wrong. */
export class InvalidRequestError extends MoatError {}
/** 413 `too_large`. */
export class TooLargeError extends MoatError {}
/** 400 `file_error` (another errno) and 507 `no_space` (the storage quota): `message` names the path and errno. */
export class FileError extends MoatError {}
/** 503 `unavailable`: moatd has too many open connections. */
export class UnavailableError extends MoatError {}
/** 504 `timeout`: moatd's own wait for the environment timed out (not the client's: see MoatTimeoutError). */
export class ServerTimeoutError extends MoatError {}

/** The client gave up waiting (request timeout, or an idle follow stream). */
export class MoatTimeoutError extends MoatError {
  constructor(message: string) {
    super({ status: 0, code: "client_timeout", message });
  }
}

/** moatd could not be reached, or the connection broke before an answer. */
export class MoatConnectionError extends MoatError {
  constructor(message: string, cause?: unknown) {
    super({ status: 0, code: "connection_error", message, cause });
  }
}

/** The caller's AbortSignal fired. */
export class MoatAbortError extends MoatError {
  constructor(cause?: unknown) {
    super({ status: 0, code: "aborted", message: "the request was aborted", cause });
  }
}

const byCode: Record<string, typeof MoatError> = {
  not_found: NotFoundError,
  unauthorized: UnauthorizedError,
  forbidden: ForbiddenError,
  conflict: ConflictError,
  gone: ConflictError,
  capacity: CapacityError,
  invalid_request: InvalidRequestError,
  unknown_field: InvalidRequestError,
  bad_json: InvalidRequestError,
  bad_request: InvalidRequestError,
  invalid_argument: InvalidRequestError,
  unsupported: InvalidRequestError,
  too_large: TooLargeError,
  file_error: FileError,
  no_space: FileError,
  unavailable: UnavailableError,
  timeout: ServerTimeoutError,
};

const byStatus: Record<number, typeof MoatError> = {
  400: InvalidRequestError,
  401: UnauthorizedError,
  403: ForbiddenError,
  404: NotFoundError,
  409: ConflictError,
  413: TooLargeError,
  429: CapacityError,
  503: UnavailableError,
  504: ServerTimeoutError,
};

/** Builds the error for an HTTP error answer (any status >= 400). */
export function errorFromResponse(status: number, body: Buffer | string): MoatError {
  const text = typeof body === "string" ? body : body.toString("utf8");
  let code = `http_${status}`;
  let message = text.trim() || `HTTP ${status}`;
  let field: string | undefined;
  try {
    const parsed = JSON.parse(text) as { error?: { code?: unknown; message?: unknown; field?: unknown } };
    const e = parsed?.error;
    if (e && typeof e === "object") {
      if (typeof e.code === "string") code = e.code;
      if (typeof e.message === "string") message = e.message;
      if (typeof e.field === "string" && e.field !== "") field = e.field;
    }
  } catch {
    // not JSON: keep the text
  }
  const Cls = byCode[code] ?? byStatus[status] ?? MoatError;
  return new Cls({ status, code, message, field });
}
