// Snapshots of environments' files, restores and forks (docs/API.md,
// "Snapshots"). A snapshot holds files, not processes.

import { type Transport, gatedCall, seg } from "./client.js";
import type { EnvironmentInfo, ForkRequest, GatedOptions, RequestOptions, Snapshot } from "./types.js";

export class Snapshots {
  constructor(private readonly transport: Transport) {}

  /**
   * Snapshots the environment's files now (a power cut's view: what was
   * written is in, processes are not). Never retried: a POST. At most 64
   * per owner (CapacityError).
   */
  create(envId: string, request: { name?: string } = {}, options: RequestOptions = {}): Promise<Snapshot> {
    return this.transport.json<Snapshot>({
      method: "POST",
      path: `/v1/environments/${seg(envId)}/snapshots`,
      json: request,
      ...options,
    });
  }

  /** The caller's snapshots (of one environment with `environment_id`), newest first. */
  async list(filter: { environment_id?: string } = {}, options: RequestOptions = {}): Promise<Snapshot[]> {
    const answer = await this.transport.json<{ snapshots: Snapshot[] }>({
      method: "GET",
      path: "/v1/snapshots",
      query: { environment_id: filter.environment_id },
      ...options,
    });
    return answer.snapshots;
  }

  get(snapshotId: string, options: RequestOptions = {}): Promise<Snapshot> {
    return this.transport.json<Snapshot>({ method: "GET", path: `/v1/snapshots/${seg(snapshotId)}`, ...options });
  }

  /** Deletes a snapshot; environments made from it keep their files. */
  async delete(snapshotId: string, options: RequestOptions = {}): Promise<void> {
    await this.transport.json({ method: "DELETE", path: `/v1/snapshots/${seg(snapshotId)}`, ...options });
  }

  /**
   * Puts the environment's files back as the snapshot has them; every
   * process in it ends. The gate's `write_file` for `/` decides
   * (DeniedByPolicyError, or an approval as with exec).
   */
  restore(envId: string, snapshotId: string, options: GatedOptions = {}): Promise<EnvironmentInfo> {
    return this.transport.json<EnvironmentInfo>({
      method: "POST",
      path: `/v1/environments/${seg(envId)}/restore`,
      json: { snapshot: snapshotId },
      ...gatedCall(options),
    });
  }

  /**
   * A new environment with a copy of the environment's files and all its
   * settings (`task_id`, `labels`, `ttl_s` may differ). Never retried.
   */
  fork(envId: string, request: ForkRequest = {}, options: RequestOptions = {}): Promise<EnvironmentInfo> {
    return this.transport.json<EnvironmentInfo>({
      method: "POST",
      path: `/v1/environments/${seg(envId)}/fork`,
      json: request,
      ...options,
    });
  }
}
