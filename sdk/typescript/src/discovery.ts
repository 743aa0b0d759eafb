// Where moatd is and which token to send, found exactly as the CLI finds them
// (src/cli/client.cc, docs/CLI.md "Connection"):
//
//   state directory: the `stateDir` option, else $MOAT_STATE, else /var/lib/moat
//   address:         the `baseUrl` option, else $MOAT_URL, else unix:<state>/moatd.sock
//   token:           the `token` option, else $MOAT_TOKEN, else the file <state>/master-token
//
// An empty option or variable counts as not given (as in the CLI). The token
// file is read when a request first needs it (and again while it cannot be
// read), so a client made before moatd wrote it still works once it has.

import { readFileSync, statSync } from "node:fs";

/**
 * The CLI reads at most this much of the token file (and sends what it read);
 * the SDK refuses a larger file outright, naming it: no token is that long.
 */
const MAX_TOKEN_FILE = 4096;

/** The state directory moatd and the CLI use when nothing says otherwise. */
export const DEFAULT_STATE_DIR = "/var/lib/moat";

export interface DiscoveryOptions {
  baseUrl?: string | undefined;
  token?: string | undefined;
  stateDir?: string | undefined;
}

/** Where the address came from, for messages. */
export interface ResolvedUrl {
  url: string;
  /** `the baseUrl option`, `$MOAT_URL`, or a sentence naming the default and the state directory. */
  source: string;
  /** True when neither the option nor $MOAT_URL gave it (the state directory's socket). */
  defaulted: boolean;
}

export interface StateDir {
  path: string;
  /** `the stateDir option`, `$MOAT_STATE`, or `the default`. */
  source: string;
}

function given(value: string | undefined): value is string {
  return value !== undefined && value !== "";
}

export function resolveStateDir(options: DiscoveryOptions, env: NodeJS.ProcessEnv = process.env): StateDir {
  if (given(options.stateDir)) return { path: options.stateDir, source: "the stateDir option" };
  if (given(env.MOAT_STATE)) return { path: env.MOAT_STATE, source: "$MOAT_STATE" };
  return { path: DEFAULT_STATE_DIR, source: "the default (neither the stateDir option nor $MOAT_STATE is set)" };
}

export function resolveUrl(options: DiscoveryOptions, env: NodeJS.ProcessEnv = process.env): ResolvedUrl {
  if (given(options.baseUrl)) return { url: options.baseUrl, source: "the baseUrl option", defaulted: false };
  if (given(env.MOAT_URL)) return { url: env.MOAT_URL, source: "$MOAT_URL", defaulted: false };
  const state = resolveStateDir(options, env);
  return {
    url: `unix:${state.path}/moatd.sock`,
    source:
      `the state directory's socket (no baseUrl option, $MOAT_URL not set; ` +
      `state directory ${state.path} from ${state.source})`,
    defaulted: true,
  };
}

/** What token discovery found: a token, or every place it looked and why each gave none. */
export type TokenLookup = { token: string; source: string } | { token?: undefined; looked: string[]; tokenFile: string };

/** Looks for the token in the CLI's order; the file is read now. */
export function lookUpToken(options: DiscoveryOptions, env: NodeJS.ProcessEnv = process.env): TokenLookup {
  const looked: string[] = [];
  if (given(options.token) && options.token.trim() !== "") return { token: options.token.trim(), source: "the token option" };
  looked.push(options.token === undefined ? "the token option (not given)" : "the token option (empty)");
  if (given(env.MOAT_TOKEN) && env.MOAT_TOKEN.trim() !== "") return { token: env.MOAT_TOKEN.trim(), source: "$MOAT_TOKEN" };
  looked.push(env.MOAT_TOKEN === undefined ? "$MOAT_TOKEN (not set)" : "$MOAT_TOKEN (empty)");
  const state = resolveStateDir(options, env);
  const tokenFile = `${state.path}/master-token`;
  let text: string;
  try {
    if (statSync(tokenFile).size > MAX_TOKEN_FILE) {
      looked.push(`${tokenFile} (larger than ${MAX_TOKEN_FILE} bytes; state directory from ${state.source})`);
      return { looked, tokenFile };
    }
    text = readFileSync(tokenFile, "utf8");
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    const why = err.code === "ENOENT" ? "no such file" : err.code === "EACCES" ? "permission denied" : err.code ?? err.message;
    looked.push(`${tokenFile} (${why}; state directory from ${state.source})`);
    return { looked, tokenFile };
  }
  const token = text.trim();
  if (token === "") {
    looked.push(`${tokenFile} (empty; state directory from ${state.source})`);
    return { looked, tokenFile };
  }
  return { token, source: tokenFile };
}

/** The message of the error thrown when no token was found. */
export function noTokenMessage(lookup: { looked: string[]; tokenFile: string }): string {
  return (
    `no token for moatd; looked at: ${lookup.looked.join(", ")}. ` +
    `Pass { token }, set MOAT_TOKEN, or make ${lookup.tokenFile} readable ` +
    `(or point the stateDir option or MOAT_STATE at moatd's state directory)`
  );
}
