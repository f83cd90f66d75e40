// Types of the runnerd app SDK. `runnerd tools types --lang ts` prints a `RunnerdTools`
// map for the installed tools; pass it as the type argument to get inputs and outputs
// checked at compile time:
//
//   import type { RunnerdTools } from './runnerd-tools';
//   const client = getAppClient<RunnerdTools>({ url, apiKey, workspaceId, app: 'deal-desk' });
//   const run = await client.runTool('score_offer', offer); // offer: ScoreOfferInput

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

export declare class AppBridgeError extends Error {
  readonly name: 'AppBridgeError';
  /** the envelope's code: BAD_REQUEST, UNAUTHORIZED, FORBIDDEN, NOT_FOUND, RATE_LIMITED,
   * INTERNAL_ERROR, SERVICE_UNAVAILABLE; UNAVAILABLE when the daemon cannot be reached;
   * REDIRECT_REFUSED for a redirect the SDK does not follow (nothing was sent to its target) */
  readonly code: string;
  /** details.code, the precise reason: INVALID_INPUT, INPUT_TOO_LARGE, budget_exhausted,
   * INSUFFICIENT_WORKSPACE_ROLE, WORKSPACE_KEY_NOT_ALLOWED, TOOL_NOT_FOUND...; for
   * REDIRECT_REFUSED: CROSS_ORIGIN_REDIRECT (details.origin names the target's origin),
   * REDIRECT_CHANGES_METHOD, TOO_MANY_REDIRECTS, BAD_REDIRECT, OPAQUE_REDIRECT (a browser) */
  readonly reason: string;
  /** the HTTP status; 0 when the daemon could not be reached, or for a browser's opaque redirect */
  readonly status: number;
  readonly details: Record<string, unknown>;
  readonly retryAfter: number | null;
}

export declare function getAppClient<Tools extends ToolMap = ToolMap>(
  options: AppClientOptions,
): AppClient<Tools>;
