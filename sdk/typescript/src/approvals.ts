// /v1/approvals: what the gate asks a person (docs/GATE.md). Listing,
// following and deciding need the master token or the `approve` scope; a key
// can never decide an approval it asked for itself.

import { type Transport, seg } from "./client.js";
import type { Approval, DecideOptions, GetApprovalOptions, ListApprovalsFilter, RequestOptions } from "./types.js";

/** How much longer than `wait` a following get waits for moatd's answer. */
const WAIT_MARGIN_MS = 15_000;

export class Approvals {
  constructor(private readonly transport: Transport) {}

  /** Approvals, newest first; filter by `state` and `environment`. */
  async list(filter: ListApprovalsFilter = {}, options: RequestOptions = {}): Promise<Approval[]> {
    const answer = await this.transport.json<{ approvals: Approval[] }>({
      method: "GET",
      path: "/v1/approvals",
      query: { state: filter.state, environment: filter.environment },
      ...options,
    });
    return answer.approvals;
  }

  /**
   * One approval. With `wait` (seconds, at most 300) moatd answers when it is
   * decided, or after `wait` seconds with it still `pending`. The call's own
   * timeout is stretched to cover the wait.
   */
  get(id: string, options: GetApprovalOptions = {}): Promise<Approval> {
    const { wait, timeoutMs, signal } = options;
    return this.transport.json<Approval>({
      method: "GET",
      path: `/v1/approvals/${seg(id)}`,
      query: { wait },
      timeoutMs: timeoutMs ?? (wait ? Math.max(this.transport.timeoutMs, wait * 1000 + WAIT_MARGIN_MS) : undefined),
      signal,
    });
  }

  /** Approves: the waiting request runs (or the next identical request, for a caller that did not wait). */
  approve(id: string, options: DecideOptions = {}): Promise<Approval> {
    return this.decide(id, "approve", options);
  }

  /** Denies: the waiting request fails with DeniedByPolicyError naming this approval. */
  deny(id: string, options: DecideOptions = {}): Promise<Approval> {
    return this.decide(id, "deny", options);
  }

  /** ConflictError (409) if it was already decided or expired. */
  private decide(id: string, decision: "approve" | "deny", options: DecideOptions): Promise<Approval> {
    const { reason, remember, ...rest } = options;
    const body: Record<string, unknown> = { decision };
    if (reason !== undefined) body.reason = reason;
    if (remember !== undefined) body.remember = remember;
    return this.transport.json<Approval>({ method: "POST", path: `/v1/approvals/${seg(id)}`, json: body, ...rest });
  }
}
