// /v1/keys: scoped API keys (master token only).

import { type Transport, seg } from "./client.js";
import type { ApiKey, ApiKeyCreated, CreateKeyRequest, RequestOptions } from "./types.js";

export class Keys {
  constructor(private readonly transport: Transport) {}

  /** Creates a key; its `token` is shown this once. */
  create(request: CreateKeyRequest, options: RequestOptions = {}): Promise<ApiKeyCreated> {
    return this.transport.json<ApiKeyCreated>({ method: "POST", path: "/v1/keys", json: request, ...options });
  }

  /** Every key, newest first, revoked ones too; never a token. */
  async list(options: RequestOptions = {}): Promise<ApiKey[]> {
    const answer = await this.transport.json<{ keys: ApiKey[] }>({ method: "GET", path: "/v1/keys", ...options });
    return answer.keys;
  }

  /** Revokes a key: its token is 401 from then on. Its environments live on. */
  async revoke(id: string, options: RequestOptions = {}): Promise<void> {
    await this.transport.json({ method: "DELETE", path: `/v1/keys/${seg(id)}`, ...options });
  }
}
