// /v1/environments/{id}/previews: URLs that open a port inside an environment
// in a browser without the token, until they expire or are revoked
// (docs/PORTS.md). Needs the `ports` scope.

import { type Transport, seg } from "./client.js";
import type { Preview, PreviewCreated, RequestOptions } from "./types.js";

export interface CreatePreviewOptions extends RequestOptions {
  /** Seconds until the URL stops working (moatd's default when left out). */
  ttlS?: number;
}

export class Previews {
  constructor(private readonly transport: Transport) {}

  private base(envId: string, id?: string): string {
    return `/v1/environments/${seg(envId)}/previews${id === undefined ? "" : `/${seg(id)}`}`;
  }

  /**
   * A preview of `port` (1 to 65535): its `url` holds a secret and is shown
   * only in this answer. Never retried: a POST.
   */
  async create(envId: string, port: number, options: CreatePreviewOptions = {}): Promise<PreviewCreated> {
    const { ttlS, ...rest } = options;
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new TypeError(`port: 1 to 65535, not ${port}`);
    const json: Record<string, unknown> = { port };
    if (ttlS !== undefined) json.ttl_s = ttlS;
    return this.transport.json<PreviewCreated>({ method: "POST", path: this.base(envId), json, ...rest });
  }

  /** The environment's live previews (without their urls). */
  async list(envId: string, options: RequestOptions = {}): Promise<Preview[]> {
    const answer = await this.transport.json<{ previews: Preview[] }>({ method: "GET", path: this.base(envId), ...options });
    return answer.previews;
  }

  /** Revokes a preview at once: its URL stops working. */
  async revoke(envId: string, previewId: string, options: RequestOptions = {}): Promise<void> {
    await this.transport.json({ method: "DELETE", path: this.base(envId, previewId), ...options });
  }
}
