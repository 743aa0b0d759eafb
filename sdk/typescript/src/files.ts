// /v1/environments/{id}/files: paths are absolute paths inside the environment.
// Every operation passes the gate (read_file for read, stat and list;
// write_file for the rest): each takes `approval: "async"` (see GatedOptions).

import { type Transport, gatedCall, seg } from "./client.js";
import type { FileInfo, FileList, GatedOptions, ReadFileOptions, WriteFileOptions } from "./types.js";

function toBytes(data: string | Uint8Array): Uint8Array {
  return typeof data === "string" ? Buffer.from(data, "utf8") : data;
}

export class Files {
  constructor(private readonly transport: Transport) {}

  private base(envId: string, sub = ""): string {
    return `/v1/environments/${seg(envId)}/files${sub}`;
  }

  /** The file's bytes (at most 8 MiB per request; use offset/length for more). */
  read(envId: string, path: string, options?: ReadFileOptions): Promise<Buffer>;
  /** The file as text. */
  read(envId: string, path: string, options: ReadFileOptions & { encoding: BufferEncoding }): Promise<string>;
  async read(envId: string, path: string, options: ReadFileOptions & { encoding?: BufferEncoding } = {}): Promise<Buffer | string> {
    const answer = await this.transport.request({
      method: "GET",
      path: this.base(envId),
      query: { path, offset: options.offset, length: options.length },
      ...gatedCall(options),
    });
    return options.encoding ? answer.body.toString(options.encoding) : answer.body;
  }

  /** The file as UTF-8 text. */
  readText(envId: string, path: string, options: ReadFileOptions = {}): Promise<string> {
    return this.read(envId, path, { ...options, encoding: "utf8" });
  }

  /** Writes (or with `append`, appends to) a file, at most 16 MiB; parents are created. */
  async write(envId: string, path: string, data: string | Uint8Array, options: WriteFileOptions = {}): Promise<void> {
    const mode = typeof options.mode === "number" ? options.mode.toString(8) : options.mode;
    await this.transport.json({
      method: "PUT",
      path: this.base(envId),
      query: { path, append: options.append ? true : undefined, mode },
      body: toBytes(data),
      ...gatedCall(options),
    });
  }

  /** The entries of a directory. */
  async list(envId: string, path: string, options: GatedOptions = {}): Promise<FileInfo[]> {
    const answer = await this.transport.json<FileList>({
      method: "GET",
      path: this.base(envId, "/list"),
      query: { path },
      ...gatedCall(options),
    });
    return answer.entries;
  }

  /** lstat of a path. */
  stat(envId: string, path: string, options: GatedOptions = {}): Promise<FileInfo> {
    return this.transport.json<FileInfo>({ method: "GET", path: this.base(envId, "/stat"), query: { path }, ...gatedCall(options) });
  }

  /** Does the path exist? (a stat that answers false on not_found) */
  async exists(envId: string, path: string, options: GatedOptions = {}): Promise<boolean> {
    try {
      await this.stat(envId, path, options);
      return true;
    } catch (e) {
      if ((e as { code?: string }).code === "not_found") return false;
      throw e;
    }
  }

  async mkdir(envId: string, path: string, options: GatedOptions & { parents?: boolean } = {}): Promise<void> {
    const { parents, ...rest } = options;
    await this.transport.json({
      method: "POST",
      path: this.base(envId, "/mkdir"),
      json: parents === undefined ? { path } : { path, parents },
      ...gatedCall(rest),
    });
  }

  /** Removes a file or an empty directory; `recursive` removes a tree. */
  async remove(envId: string, path: string, options: GatedOptions & { recursive?: boolean } = {}): Promise<void> {
    const { recursive, ...rest } = options;
    await this.transport.json({
      method: "DELETE",
      path: this.base(envId),
      query: { path, recursive: recursive ? true : undefined },
      ...gatedCall(rest),
    });
  }

  async move(envId: string, from: string, to: string, options: GatedOptions = {}): Promise<void> {
    await this.transport.json({ method: "POST", path: this.base(envId, "/move"), json: { from, to }, ...gatedCall(options) });
  }
}
