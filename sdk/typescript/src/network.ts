// /v1/environments/{id}/network: an environment's egress policy and its link
// into moatd's egress namespace (docs/EGRESS.md).

import { type Transport, seg } from "./client.js";
import type { EgressPolicy, EgressState, RequestOptions } from "./types.js";

export class EnvironmentNetwork {
  constructor(private readonly transport: Transport) {}

  /**
   * The policy as moatd stores it (every field written out: `mode`, `allow`,
   * `deny`, `max_connections`, `bandwidth_mbps` when set) and `link` (the
   * environment's address, the gateway and the proxy URL) while it has one.
   */
  get(envId: string, options: RequestOptions = {}): Promise<EgressState> {
    return this.transport.json<EgressState>({
      method: "GET",
      path: `/v1/environments/${seg(envId)}/network`,
      ...options,
    });
  }

  /**
   * Replaces the policy of a running environment: `"none"`, `"open"` or a
   * policy object. New connections follow it; open ones finish as they were.
   * Leaving `none` plugs the link in (commands started from then on get the
   * proxy variables, resolver and CA bundle); `"none"` takes it out. A new
   * policy can loosen: the master token or the `permissions` scope
   * (ForbiddenError otherwise). A bad policy throws InvalidRequestError whose
   * `field` names the entry (`network.allow[0]`); a stopped environment
   * ConflictError; a moatd run with `--no-egress` UnavailableError (for
   * anything but `"none"`). Answers the policy as it is now.
   */
  set(envId: string, policy: EgressPolicy, options: RequestOptions = {}): Promise<EgressState> {
    return this.transport.json<EgressState>({
      method: "PUT",
      path: `/v1/environments/${seg(envId)}/network`,
      json: { network: policy },
      ...options,
    });
  }
}
