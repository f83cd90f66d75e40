// Types of the runnerd app SDK. `runnerd tools types --lang ts` prints a `RunnerdTools`
// map for the installed tools; pass it as the type argument to get inputs and outputs
// checked at compile time:
//
//   import type { RunnerdTools } from './runnerd-tools';
//   const client = getAppClient<RunnerdTools>({ url, apiKey, workspaceId, app: 'deal-desk' });
//   const run = await client.runTool('score_offer', offer); // offer: ScoreOfferInput
//
// In the app's own pages (its frame, opened by the Manage page), no arguments:
//
//   const run = await getAppClient<RunnerdTools>().runTool('score_offer', offer);

/** The tools of a workspace, by name or reference: their input and output types. */
export type ToolMap = Record<string, { input: unknown; output: unknown }>;

export interface RunResult<Output = unknown> {
  /** null only for a call held for approval */
  runId: string | null;
  status: 'succeeded' | 'failed' | 'timed_out' | 'pending_approval';
  /** the tool's output, checked against its output schema, when status is succeeded */
  output: Output | null;
  /** why the run failed or timed out, scrubbed of secrets */
  error: string | null;
  durationMs: number | null;
  /** for status pending_approval: the approval that will decide the call */
  approvalId?: string;
  expiresAt?: string;
}

export interface ToolInfo {
  reference: string;
  name: string;
  description: string;
  effect: 'read' | 'write';
  language: 'python' | 'javascript' | 'typescript';
  inputSchema: Record<string, unknown>;
  outputSchema: Record<string, unknown>;
  timeoutMs: number;
  appId: string;
  appSlug: string;
  installId: string;
  versionId: string;
  version: string;
}

export interface RunOptions {
  /** the same key returns the first run's result instead of running again */
  idempotencyKey?: string;
  signal?: AbortSignal;
}

export interface AppClient<Tools extends ToolMap = ToolMap> {
  runTool<Name extends keyof Tools & string>(
    name: Name,
    input: Tools[Name]['input'],
    options?: RunOptions,
  ): Promise<RunResult<Tools[Name]['output']>>;
  listTools(options?: { signal?: AbortSignal }): Promise<ToolInfo[]>;
}

export interface AppClientOptions {
  url: string;
  apiKey: string;
  workspaceId: string;
  /** the app whose tools bare names refer to; a reference app/tool works without it */
  app?: string | null;
  /** opt-in retries on 429 and 503, honouring Retry-After, with one idempotency key */
  retries?: number;
  /** a fetch of your own; it must honour `redirect: 'manual'` (the SDK follows redirects
   * itself, only within the daemon's origin: a fetch that follows one on its own has sent
   * the key already, and its answer from another origin is refused) */
  fetch?: typeof fetch;
}

export interface FrameRunOptions {
  /** how long to wait for the page's answer; default: the tool's timeoutMs (known once
   * listTools ran, else the longest, 300,000), plus 30,000 ms for the sandbox's start */
  timeoutMs?: number;
  /** stops waiting (rejects with its reason); a run that started goes on */
  signal?: AbortSignal;
}

/** A run that started, in a frame: a call held for approval rejects (PENDING_APPROVAL). */
export interface FrameRunResult<Output = unknown> {
  runId: string;
  status: 'succeeded' | 'failed' | 'timed_out';
  output: Output | null;
  error: string | null;
  durationMs: number | null;
}

/** The client of an app's frame: the Manage page that opened it runs the calls, with the
 * signed-in person's session, for this app's install only (surface app). */
export interface FrameClient<Tools extends ToolMap = ToolMap> {
  /** name: the app's own tool, or its reference app/tool; another app's is refused
   * (OTHER_APP_REFUSED) */
  runTool<Name extends keyof Tools & string>(
    name: Name,
    input: Tools[Name]['input'],
    options?: FrameRunOptions,
  ): Promise<FrameRunResult<Tools[Name]['output']>>;
  /** the tools of this app's install, with their schemas */
  listTools(options?: { signal?: AbortSignal }): Promise<ToolInfo[]>;
}

export declare class AppBridgeError extends Error {
  readonly name: 'AppBridgeError';
  /** The field to branch on: the precise reason, from a server client and in a frame alike.
   * The API's details.code: INVALID_INPUT, INPUT_TOO_LARGE, budget_exhausted (a spent
   * budget), TOOL_NOT_FOUND, INSTALL_NOT_FOUND, INSUFFICIENT_WORKSPACE_ROLE,
   * WORKSPACE_KEY_NOT_ALLOWED, UNAUTHORIZED, RATE_LIMITED...; the server client's own:
   * connection_failed (the daemon cannot be reached), and for a redirect it does not
   * follow (nothing was sent to its target) CROSS_ORIGIN_REDIRECT (details.origin names
   * the target's origin), REDIRECT_CHANGES_METHOD, TOO_MANY_REDIRECTS, BAD_REDIRECT,
   * OPAQUE_REDIRECT (a browser); a frame's own: PENDING_APPROVAL (details.approvalId,
   * details.expiresAt), OTHER_APP_REFUSED, BAD_MESSAGE, TOO_MANY_CALLS, UNAVAILABLE (the
   * page could not reach the daemon), BRIDGE_TIMEOUT (no answer in time), NO_BRIDGE (not
   * inside an app's frame). */
  readonly reason: string;
  /** The same as `reason`, always. */
  readonly code: string;
  /** From a server client, the envelope's error.code, the class of many reasons:
   * BAD_REQUEST, UNAUTHORIZED, FORBIDDEN, NOT_FOUND, CONFLICT, RATE_LIMITED,
   * INTERNAL_ERROR, SERVICE_UNAVAILABLE; or the SDK's own UNAVAILABLE (no answer) and
   * REDIRECT_REFUSED. In a frame, the same as `reason`. */
  readonly envelopeCode: string;
  /** the HTTP status; 0 when the daemon could not be reached, or for a browser's opaque redirect */
  readonly status: number;
  readonly details: Record<string, unknown>;
  readonly retryAfter: number | null;
}

/** Inside an app's frame: no arguments. */
export declare function getAppClient<Tools extends ToolMap = ToolMap>(): FrameClient<Tools>;
/** From a server (or any program holding a person's key): the daemon's URL and the key. */
export declare function getAppClient<Tools extends ToolMap = ToolMap>(
  options: AppClientOptions,
): AppClient<Tools>;
