// Typed errors. moatd answers errors as {"error": {"code", "message", "field"}};
// each becomes a MoatError (or a subclass picked by its code) carrying the
// HTTP status, the code and the field. Client-side failures have status 0.

import type { Approval, CommandRule, FileRule, GateAction, GateScope, NetworkRule, Template } from "./types.js";

export interface MoatErrorInit {
  status: number;
  code: string;
  message: string;
  field?: string | undefined;
  cause?: unknown;
  retryAfterMs?: number | undefined;
}

export class MoatError extends Error {
  /** The HTTP status; 0 for client-side errors (timeout, connection, abort). */
  readonly status: number;
  /** moatd's machine-readable code (`not_found`, `invalid_request`, ...) or the client's. */
  readonly code: string;
  /** The request field at fault (`spec.cpus`, `cmd[1]`, `path`), when moatd names one. */
  readonly field: string | undefined;
  /** How long moatd asked the caller to wait before trying again (its Retry-After), if it said. */
  readonly retryAfterMs: number | undefined;

  constructor(init: MoatErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.status = init.status;
    this.code = init.code;
    this.field = init.field;
    this.retryAfterMs = init.retryAfterMs;
  }
}

/** 404 `not_found`: no such environment, process, file or endpoint (or one an API key does not own). */
export class NotFoundError extends MoatError {}
/** 401 `unauthorized`: a missing, wrong or revoked token. */
export class UnauthorizedError extends MoatError {}
/**
 * No token could be found, so nothing was sent (status 0, code `no_token`):
 * neither the `token` option, nor $MOAT_TOKEN, nor a readable
 * `<state>/master-token`. `looked` lists each place and why it gave none.
 * An UnauthorizedError too.
 */
export class NoTokenError extends UnauthorizedError {
  /** Every place looked at, in order, each with why it gave no token. */
  readonly looked: string[];

  constructor(message: string, looked: string[]) {
    super({ status: 0, code: "no_token", message });
    this.looked = looked;
  }
}
/** 403 `forbidden`: the API key lacks the scope, or a file permission. */
export class ForbiddenError extends MoatError {}

/**
 * 403 `denied_by_policy`: the gate denied the action (docs/GATE.md): a rule
 * said deny, no rule matched, or a person denied it (or did not decide in
 * time). A ForbiddenError too, so `instanceof ForbiddenError` still catches
 * every 403; `message` explains which rule of which layer, or who decided.
 */
export class DeniedByPolicyError extends ForbiddenError {
  /** `run_command`, `read_file`, `write_file` or `network`. */
  readonly scope: GateScope | undefined;
  /** The exact action that was denied. */
  readonly action: GateAction | undefined;
  /** The rule that matched; undefined when none did (deny by default). */
  readonly rule: CommandRule | FileRule | NetworkRule | undefined;
  /** The approval's id, when a person was asked. */
  readonly approval: string | undefined;

  constructor(init: MoatErrorInit & { scope?: GateScope; action?: GateAction; rule?: CommandRule | FileRule | NetworkRule; approval?: string }) {
    super(init);
    this.scope = init.scope;
    this.action = init.action;
    this.rule = init.rule;
    this.approval = init.approval;
  }
}

/**
 * 202: the gate asks a person and the call was made with `{ approval: "async" }`
 * (`Prefer: respond-async`), so it did not wait. The action has not happened.
 * Follow `approval` with `client.approvals.get(e.approval.id, { wait: 60 })`;
 * once it is `approved`, repeat the same call (a one-time grant for exactly
 * that action).
 */
export class ApprovalPendingError extends MoatError {
  /** The pending approval. */
  readonly approval: Approval;
  /** moatd's `Location`: `/v1/approvals/{id}`. */
  readonly location: string | undefined;

  constructor(approval: Approval, message: string, location?: string) {
    super({ status: 202, code: "approval_pending", message });
    this.approval = approval;
    this.location = location;
  }
}
/** 409 `conflict`: the environment (or process) is not running, stdin is closed; `stdin_full`: the process has not read earlier input (nothing of the piece was taken: send it again). */
export class ConflictError extends MoatError {}
/** 429 `capacity`: the environment, memory or process limit is reached. */
export class CapacityError extends MoatError {}
/** 400 `invalid_request`, `unknown_field`, `bad_json`, ...: `field` names what is wrong. */
export class InvalidRequestError extends MoatError {}
/** 413 `too_large`. */
export class TooLargeError extends MoatError {}
/** 400 `file_error` (another errno) and 507 `no_space` (the storage quota): `message` names the path and errno. */
export class FileError extends MoatError {}
/**
 * 503 `unavailable`: moatd has too many open connections (retried, for
 * idempotent calls), or the call needs egress control and moatd runs with
 * `--no-egress` (a network policy other than `"none"`, or secrets).
 */
export class UnavailableError extends MoatError {}
/** 502 `port_unreachable`: nothing listens on that port inside the environment (ports and previews). */
export class PortUnreachableError extends MoatError {}
/** 500: moatd (or its host) failed; `code` names what (`internal`, `syscall`, `environment_failed`, ...). */
export class InternalError extends MoatError {}
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

/**
 * A template's import or build ended in state `failed` while the SDK waited
 * for it (moat.templates.import/build): `code` and `message` are the
 * template's `error`; `template` is what moatd last said about it.
 */
export class TemplateFailedError extends MoatError {
  readonly template: Template;

  constructor(template: Template) {
    super({
      status: 0,
      code: template.error?.code ?? "failed",
      message: `template ${template.name} failed: ${template.error?.message ?? "moatd gave no reason"}`,
    });
    this.template = template;
  }
}

/**
 * `run(cmd, { check: true })` of a command that did not exit 0 (status 0,
 * code `command_failed`); `result` holds its exit code and output.
 */
export class CommandError extends MoatError {
  readonly result: { exitCode: number; stdout: string; stderr: string; timedOut: boolean };
  /** The argv that ran (a shell line as `/bin/sh -c LINE`). */
  readonly cmd: string[];

  constructor(cmd: string[], result: { exitCode: number; stdout: string; stderr: string; timedOut: boolean }) {
    const lastLine = result.stderr.trim().split("\n").at(-1) ?? "";
    super({
      status: 0,
      code: "command_failed",
      message: `${JSON.stringify(cmd)} ${result.timedOut ? "timed out" : `exited ${result.exitCode}`}${lastLine ? `: ${lastLine}` : ""}`,
    });
    this.cmd = cmd;
    this.result = result;
  }
}

const byCode: Record<string, typeof MoatError> = {
  not_found: NotFoundError,
  unauthorized: UnauthorizedError,
  forbidden: ForbiddenError,
  denied_by_policy: DeniedByPolicyError,
  conflict: ConflictError,
  gone: ConflictError,
  stdin_full: ConflictError,
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
  method_not_allowed: InvalidRequestError,
  unavailable: UnavailableError,
  port_unreachable: PortUnreachableError,
  timeout: ServerTimeoutError,
  internal: InternalError,
};

const byStatus: Record<number, typeof MoatError> = {
  400: InvalidRequestError,
  401: UnauthorizedError,
  403: ForbiddenError,
  404: NotFoundError,
  405: InvalidRequestError,
  409: ConflictError,
  413: TooLargeError,
  429: CapacityError,
  500: InternalError,
  503: UnavailableError,
  504: ServerTimeoutError,
};

/** Builds the error for an HTTP error answer (any status >= 400); `retryAfter` is its Retry-After header. */
export function errorFromResponse(status: number, body: Buffer | string, retryAfter?: string): MoatError {
  const seconds = retryAfter !== undefined && /^\d{1,6}$/.test(retryAfter.trim()) ? Number(retryAfter.trim()) : undefined;
  const retryAfterMs = seconds === undefined ? undefined : seconds * 1000;
  const text = typeof body === "string" ? body : body.toString("utf8");
  let code = `http_${status}`;
  let message = text.trim() || `HTTP ${status}`;
  let field: string | undefined;
  let details: Record<string, unknown> = {};
  try {
    const parsed = JSON.parse(text) as { error?: { code?: unknown; message?: unknown; field?: unknown } };
    const e = parsed?.error;
    if (e && typeof e === "object") {
      details = e as Record<string, unknown>;
      if (typeof e.code === "string") code = e.code;
      if (typeof e.message === "string") message = e.message;
      if (typeof e.field === "string" && e.field !== "") field = e.field;
    }
  } catch {
    // not JSON: keep the text
  }
  if (code === "denied_by_policy") {
    return new DeniedByPolicyError({
      status,
      code,
      message,
      field,
      scope: details.scope as GateScope,
      action: details.action as GateAction,
      rule: details.rule as CommandRule | FileRule | NetworkRule,
      approval: typeof details.approval === "string" ? details.approval : undefined,
    });
  }
  const Cls = byCode[code] ?? byStatus[status] ?? MoatError;
  return new Cls({ status, code, message, field, retryAfterMs });
}

/** The ApprovalPendingError for a 202 answer whose body names an approval; undefined otherwise. */
export function pendingFromResponse(body: Buffer | string, location?: string): ApprovalPendingError | undefined {
  try {
    const parsed = JSON.parse(typeof body === "string" ? body : body.toString("utf8")) as { approval?: unknown; message?: unknown };
    if (!parsed || typeof parsed.approval !== "object" || parsed.approval === null) return undefined;
    const approval = parsed.approval as Approval;
    const message =
      typeof parsed.message === "string" ? parsed.message : `waiting for a person's decision on approval ${approval.id}`;
    return new ApprovalPendingError(approval, message, location);
  } catch {
    return undefined;
  }
}
