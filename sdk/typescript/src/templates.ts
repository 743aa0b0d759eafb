// /v1/templates: what environments start from (docs/TEMPLATES.md). Importing
// an image or building a recipe runs on in moatd; import() and build() wait
// for the template to be ready by default, polling GET /v1/templates/{name}.

import { setTimeout as sleep } from "node:timers/promises";

import { type Transport, seg } from "./client.js";
import { MoatAbortError, MoatTimeoutError, TemplateFailedError } from "./errors.js";
import type { RequestOptions, Template } from "./types.js";

/** A template name as a path segment: `:` stays as is (`/v1/templates/python:3.12`), anything else is escaped. */
function nameSeg(name: string): string {
  return seg(name).replace(/%3A/gi, ":");
}

export interface WaitTemplateOptions extends RequestOptions {
  /** Called with the template each time it is polled while it imports or builds (its `progress`). */
  onProgress?: (template: Template) => void;
  /** How often to poll, in ms (default 500). */
  pollIntervalMs?: number;
  /** Give up waiting (MoatTimeoutError; moatd carries on) after this many ms. Default: no limit. */
  waitTimeoutMs?: number;
}

export interface CreateTemplateOptions extends WaitTemplateOptions {
  /** Wait until the template is ready (default true); false returns the 202's template at once. */
  wait?: boolean;
}

export interface ImportTemplateOptions extends CreateTemplateOptions {
  /** The template's name: `^[a-z0-9][a-z0-9._:-]{0,63}$`, not `host` (e.g. `python:3.12`). */
  name: string;
}

export interface BuildTemplateRequest {
  /** The new template's name. */
  name: string;
  /** The template it starts from (`host` or another template). */
  base: string;
  /** Shell lines run in order in an environment made from `base` (a single line may be a string). */
  run: string | string[];
  /** Variables for those commands. */
  env?: Record<string, string>;
}

export class Templates {
  constructor(private readonly transport: Transport) {}

  /** Every template, the built-in `host` included (source `builtin`). */
  async list(options: RequestOptions = {}): Promise<Template[]> {
    const answer = await this.transport.json<{ templates: Template[] }>({ method: "GET", path: "/v1/templates", ...options });
    return answer.templates;
  }

  get(name: string, options: RequestOptions = {}): Promise<Template> {
    return this.transport.json<Template>({ method: "GET", path: `/v1/templates/${nameSeg(name)}`, ...options });
  }

  /**
   * Imports an image as template `options.name`: `docker://REF` (pulled by
   * moatd), `oci:DIR[:TAG]`, `oci-archive:FILE` or `docker-archive:FILE`
   * (host paths: master token only). Waits until it is ready (see
   * CreateTemplateOptions); a failed import throws TemplateFailedError.
   * ConflictError when the name exists.
   */
  async import(source: string, options: ImportTemplateOptions): Promise<Template> {
    const { name, ...rest } = options;
    return this.create({ name, source }, rest);
  }

  /**
   * Builds template `request.name` from a recipe: an environment from
   * `base` runs each line of `run`, then its files become the template.
   * Waits like import().
   */
  async build(request: BuildTemplateRequest, options: CreateTemplateOptions = {}): Promise<Template> {
    const build: Record<string, unknown> = {
      base: request.base,
      run: typeof request.run === "string" ? [request.run] : request.run,
    };
    if (request.env !== undefined) build.env = request.env;
    return this.create({ name: request.name, build }, options);
  }

  /** Deletes a template (ConflictError while an environment uses it). */
  async remove(name: string, options: RequestOptions = {}): Promise<void> {
    await this.transport.json({ method: "DELETE", path: `/v1/templates/${nameSeg(name)}`, ...options });
  }

  /**
   * Polls the template until it is `ready` (returned) or `failed`
   * (TemplateFailedError). moatd carries on whatever the client does.
   */
  async wait(name: string, options: WaitTemplateOptions = {}): Promise<Template> {
    const { onProgress, pollIntervalMs = 500, waitTimeoutMs, signal, timeoutMs } = options;
    const deadline = waitTimeoutMs !== undefined && waitTimeoutMs > 0 ? Date.now() + waitTimeoutMs : undefined;
    for (;;) {
      const template = await this.get(name, { signal, timeoutMs });
      if (template.state === "ready") return template;
      if (template.state === "failed") throw new TemplateFailedError(template);
      onProgress?.(template);
      if (deadline !== undefined && Date.now() + pollIntervalMs > deadline) {
        throw new MoatTimeoutError(`template ${name} is still ${template.state} after ${waitTimeoutMs} ms (moatd carries on)`);
      }
      await sleep(pollIntervalMs, undefined, signal ? { signal } : undefined).catch(() => {
        throw new MoatAbortError(signal?.reason);
      });
    }
  }

  private async create(body: Record<string, unknown>, options: CreateTemplateOptions): Promise<Template> {
    const { wait = true, signal, timeoutMs } = options;
    const started = await this.transport.json<Template>({ method: "POST", path: "/v1/templates", json: body, signal, timeoutMs });
    if (!wait) return started;
    if (started.state === "ready") return started;
    if (started.state === "failed") throw new TemplateFailedError(started);
    options.onProgress?.(started);
    return this.wait(started.name ?? String(body.name), options);
  }
}
