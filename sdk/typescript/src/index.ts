// @moat/sdk: a TypeScript client for moatd (docs/API.md).

export { Moat } from "./moat.js";
export { Transport, SDK_VERSION, type MoatOptions } from "./client.js";
export { DEFAULT_STATE_DIR } from "./discovery.js";
export { Environment, EnvironmentFiles, EnvironmentProcesses, EnvironmentPreviews } from "./environment.js";
export {
  CommandHandle,
  toArgv,
  type Command,
  type CommandOptions,
  type OutputCallback,
  type RunOptions,
  type RunResult,
  type StartOptions,
} from "./commands.js";
export {
  Templates,
  type BuildTemplateRequest,
  type CreateTemplateOptions,
  type ImportTemplateOptions,
  type WaitTemplateOptions,
} from "./templates.js";
export { Previews, type CreatePreviewOptions } from "./previews.js";
export { Approvals } from "./approvals.js";
export { Agents, Agent, createAgent, type AgentOptions } from "./agents.js";
export { EnvironmentPermissions } from "./permissions.js";
export { Environments, EXEC_MARGIN_MS } from "./environments.js";
export { EnvironmentNetwork } from "./network.js";
export { Files } from "./files.js";
export { Keys } from "./keys.js";
export { Snapshots } from "./snapshots.js";
export { Processes, Process, OutputStream, parseOutputEvent } from "./processes.js";
export { Shell, type ShellEvents } from "./shell.js";
export { WebSocketClient, FrameParser, encodeFrame, acceptKey } from "./websocket.js";
export {
  MoatError,
  NotFoundError,
  UnauthorizedError,
  NoTokenError,
  ForbiddenError,
  DeniedByPolicyError,
  ApprovalPendingError,
  ConflictError,
  CapacityError,
  InvalidRequestError,
  TooLargeError,
  FileError,
  UnavailableError,
  PortUnreachableError,
  InternalError,
  TemplateFailedError,
  CommandError,
  ServerTimeoutError,
  MoatTimeoutError,
  MoatConnectionError,
  MoatAbortError,
  errorFromResponse,
} from "./errors.js";
export type * from "./types.js";
