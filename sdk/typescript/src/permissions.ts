// /v1/environments/{id}/permissions: the gate's permission layers of an
// environment (docs/GATE.md).

import { type Transport, seg } from "./client.js";
import type { Permissions, PermissionsView, RequestOptions, SetPermissionsOptions } from "./types.js";

export class EnvironmentPermissions {
  constructor(private readonly transport: Transport) {}

  /** The environment's layers (the first is `permissions`) and the calling key's ceiling, if any. */
  get(envId: string, options: RequestOptions = {}): Promise<PermissionsView> {
    return this.transport.json<PermissionsView>({
      method: "GET",
      path: `/v1/environments/${seg(envId)}/permissions`,
      ...options,
    });
  }

  /**
   * Adds a layer (it can only tighten: the environment's owner may; scopes it
   * leaves out do not restrict), or with `replace: true` replaces every layer
   * with this one (can loosen: the master token or the `permissions` scope,
   * ForbiddenError otherwise). Applies from the next action on. Answers the
   * layers as they are now (no `ceiling`).
   */
  set(envId: string, permissions: Permissions, options: SetPermissionsOptions = {}): Promise<PermissionsView> {
    const { replace, ...rest } = options;
    return this.transport.json<PermissionsView>({
      method: "PUT",
      path: `/v1/environments/${seg(envId)}/permissions`,
      json: replace === undefined ? { permissions } : { permissions, replace },
      ...rest,
    });
  }
}
