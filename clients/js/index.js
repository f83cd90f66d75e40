// The runnerd app SDK: call an app's code tools. ESM, no dependencies, fetch only;
// Node >= 20 and browsers. Types: index.d.ts.
//
//   const client = getAppClient({ url, apiKey, workspaceId, app: 'deal-desk' });
//   const run = await client.runTool('score_offer', offer);
//
// Inside an app's frame (its pages, opened by the Manage page), getAppClient() with no
// arguments asks the page over postMessage instead: frame.js, which this file imports.
//
// A run that started resolves, whatever its status (succeeded, failed, timed_out); every
// refusal before the tool starts rejects with an AppBridgeError, whose reason (and code,
// the same) is the precise one: budget_exhausted, INVALID_INPUT, TOOL_NOT_FOUND...
//
// The API key and the input never go to another origin: fetch runs with redirect 'manual',
// and the SDK itself follows a redirect only within the daemon's origin (scheme, host and
// port, as the URL parser fetch uses reads them), at most MAX_REDIRECTS hops. Any other
// rejects with code REDIRECT_REFUSED before anything is sent to its target.

import { AppBridgeError, getAppClient as frameClient } from './frame.js';

export { AppBridgeError };

const RETRYABLE = new Set([429, 503]);
const MAX_RETRY_WAIT_MS = 30000;
const MAX_REDIRECTS = 5; // same-origin hops one request follows (a proxy's path rewrite, not a loop)
const REDIRECTS = new Set([301, 302, 303, 307, 308]); // the statuses fetch treats as redirects

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

function redirectRefused(status, reason, message, details = {}) {
  return new AppBridgeError({ code: 'REDIRECT_REFUSED', reason, status, message,
    details: { code: reason, ...details } });
}

function parsed(value, base) {
  try {
    return new URL(value, base);
  } catch {
    return null;
  }
}

// The origin a URL connects to, for messages: fetch's own for http(s), the scheme else
// (data:, javascript:, file:... have the opaque origin 'null').
function shownOrigin(url) {
  return url.origin === 'null' ? url.protocol : url.origin;
}

// The URL a same-origin redirect asks for (307 and 308 keep the method and body; 301, 302
// and 303 only for a GET); null when the response is no redirect. Throws an AppBridgeError
// for any other redirect. Sends nothing: the caller fetches the very URL compared here.
function nextHop(response, current, origin, method, hops) {
  if (response.type === 'opaqueredirect') {
    // A browser hides a redirect's target from a 'manual' fetch: it cannot be checked.
    throw redirectRefused(0, 'OPAQUE_REDIRECT', 'the daemon answered with a redirect whose '
      + 'target the browser hides; not followed: give getAppClient the final URL');
  }
  const landed = response.redirected ? parsed(String(response.url)) : null;
  if (response.redirected && (landed === null || landed.origin !== origin)) {
    // A custom fetch that ignored redirect 'manual' and followed: never use another
    // origin's answer (the request has gone, but its answer is not believed).
    const shown = landed === null ? 'an unknown URL' : shownOrigin(landed).slice(0, 200);
    throw redirectRefused(response.status, 'CROSS_ORIGIN_REDIRECT', `${origin} was redirected `
      + `to ${shown} by a fetch that ignores redirect 'manual'; its answer is not used`,
    { origin: shown });
  }
  const location = response.headers.get('location');
  if (!REDIRECTS.has(response.status) || location === null) return null;
  const target = parsed(location, current);
  if (target === null) {
    throw redirectRefused(response.status, 'BAD_REDIRECT',
      `a redirect (${response.status}) to a Location that is no URL; not followed`);
  }
  if (target.origin !== origin || target.origin === 'null') {
    const shown = shownOrigin(target).slice(0, 200);
    throw redirectRefused(response.status, 'CROSS_ORIGIN_REDIRECT', `${origin} redirected `
      + `(${response.status}) to another origin, ${shown}; not followed: the API key and the `
      + 'input were not sent there', { origin: shown });
  }
  if (method !== 'GET' && [301, 302, 303].includes(response.status)) {
    throw redirectRefused(response.status, 'REDIRECT_CHANGES_METHOD', `a redirect `
      + `(${response.status}) would turn the ${method} into a GET without its input; not `
      + 'followed (307 and 308 keep them)');
  }
  if (hops >= MAX_REDIRECTS) {
    throw redirectRefused(response.status, 'TOO_MANY_REDIRECTS',
      `more than ${MAX_REDIRECTS} redirects; not followed`, { hops });
  }
  return target;
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

export function getAppClient(options) {
  return options === undefined ? frameClient() : serverClient(options || {});
}

function serverClient({ url, apiKey, workspaceId, app = null, retries = 0, fetch: fetchImpl }) {
  if (!url || !apiKey || !workspaceId) {
    throw new TypeError('getAppClient needs url, apiKey and workspaceId');
  }
  const base = url.replace(/\/+$/, '');
  const doFetch = fetchImpl || globalThis.fetch.bind(globalThis);

  // The answer to path, after the same-origin redirects nextHop allows.
  async function send(path, init, signal) {
    let url = null;
    for (let hops = 0; ; hops += 1) {
      let response;
      try {
        url = url || new URL(`${base}${path}`);
        response = await doFetch(url.href, { ...init, signal, redirect: 'manual' });
      } catch (err) {
        if (signal && signal.aborted) throw err;
        throw unavailable(err);
      }
      const target = nextHop(response, url, new URL(base).origin, init.method || 'GET', hops);
      if (target === null) return response;
      await response.body?.cancel().catch(() => {}); // free the connection for the next hop
      url = target;
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
    const body = JSON.stringify({ input }); // the server records the surface the key proves
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
