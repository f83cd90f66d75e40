// The runnerd app SDK: call an app's code tools. ESM, no dependencies, fetch only;
// Node >= 20 and browsers. Types: index.d.ts.
//
//   const client = getAppClient({ url, apiKey, workspaceId, app: 'deal-desk' });
//   const run = await client.runTool('score_offer', offer);
//
// A run that started resolves, whatever its status (succeeded, failed, timed_out); every
// refusal before the tool starts rejects with an AppBridgeError.

const RETRYABLE = new Set([429, 503]);
const MAX_RETRY_WAIT_MS = 30000;

export class AppBridgeError extends Error {
  constructor({ code, reason, status, message, details = {}, retryAfter = null }) {
    super(message);
    this.name = 'AppBridgeError';
    this.code = code; // the envelope's code: BAD_REQUEST, FORBIDDEN, RATE_LIMITED...
    this.reason = reason; // details.code: INVALID_INPUT, budget_exhausted...
    this.status = status; // the HTTP status (0: the daemon could not be reached)
    this.details = details;
    this.retryAfter = retryAfter; // seconds, for 429 and 503
  }
}

function retryAfterOf(response) {
  const value = response.headers.get('retry-after');
  const seconds = value === null ? NaN : Number(value);
  return Number.isFinite(seconds) ? seconds : null;
}

async function refusal(response) {
  let error = null;
  try {
    error = (await response.json()).error;
  } catch {
    error = null;
  }
  const code = (error && error.code) || 'INTERNAL_ERROR';
  const details = (error && error.details) || {};
  return new AppBridgeError({
    code,
    reason: details.code || code,
    status: response.status,
    message: (error && error.message) || `HTTP ${response.status}`,
    details,
    retryAfter: retryAfterOf(response),
  });
}

function unavailable(err) {
  return new AppBridgeError({
    code: 'UNAVAILABLE',
    reason: 'connection_failed',
    status: 0,
    message: `cannot reach runnerd: ${err && err.message}`,
  });
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    if (signal) {
      signal.addEventListener('abort', () => {
        clearTimeout(timer);
        reject(signal.reason);
      }, { once: true });
    }
  });
}

function newKey() {
  return globalThis.crypto.randomUUID();
}

export function getAppClient({ url, apiKey, workspaceId, app = null, retries = 0, fetch: fetchImpl } = {}) {
  if (!url || !apiKey || !workspaceId) {
    throw new TypeError('getAppClient needs url, apiKey and workspaceId');
  }
  const base = url.replace(/\/+$/, '');
  const doFetch = fetchImpl || globalThis.fetch.bind(globalThis);

  async function send(path, init, signal) {
    try {
      return await doFetch(`${base}${path}`, { ...init, signal });
    } catch (err) {
      if (signal && signal.aborted) throw err;
      throw unavailable(err);
    }
  }

  async function runTool(name, input, { idempotencyKey, signal } = {}) {
    const slash = name.lastIndexOf('/');
    const appSlug = slash === -1 ? app : name.slice(0, slash);
    const tool = slash === -1 ? name : name.slice(slash + 1);
    if (!appSlug) throw new TypeError(`${name}: give the reference app/tool, or the client an app`);
    const key = idempotencyKey || (retries > 0 ? newKey() : null); // a retry never runs twice
    const headers = { 'Content-Type': 'application/json', 'X-API-Key': apiKey };
    if (key) headers['Idempotency-Key'] = key;
    const path = `/api/v2/apps/tools/${encodeURIComponent(appSlug)}/${encodeURIComponent(tool)}/run`
      + `?workspaceId=${encodeURIComponent(workspaceId)}`;
    const body = JSON.stringify({ input, surface: 'app' });
    for (let attempt = 0; ; attempt += 1) {
      const response = await send(path, { method: 'POST', headers, body }, signal);
      if (response.status === 200) {
        const run = await response.json();
        return { runId: run.runId, status: run.status, output: run.output, error: run.error, durationMs: run.durationMs };
      }
      if (response.status === 202) {
        const held = await response.json();
        return { runId: null, status: 'pending_approval', output: null, error: null, durationMs: null,
          approvalId: held.approvalId, expiresAt: held.expiresAt };
      }
      const error = await refusal(response);
      if (!RETRYABLE.has(response.status) || attempt >= retries) throw error;
      const wait = Math.min((error.retryAfter ?? 2 ** attempt) * 1000, MAX_RETRY_WAIT_MS);
      await sleep(wait, signal);
    }
  }

  async function listTools({ signal } = {}) {
    const response = await send(`/api/v2/apps/tools?workspaceId=${encodeURIComponent(workspaceId)}`,
      { headers: { 'X-API-Key': apiKey } }, signal);
    if (response.status !== 200) throw await refusal(response);
    const tools = (await response.json()).data;
    return app ? tools.filter((t) => t.appSlug === app) : tools;
  }

  return { runTool, listTools };
}
