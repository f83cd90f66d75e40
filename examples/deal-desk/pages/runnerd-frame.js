// The runnerd app SDK inside an app's frame: getAppClient() with no arguments. ESM, no
// dependencies, no imports: a page with no build step copies this one file into its pages
// folder and loads it with <script type="module">; a bundler takes it from the package
// ('@runnerd/app-sdk' or '@runnerd/app-sdk/frame'). Types: index.d.ts.
//
//   import { getAppClient } from './runnerd-frame.js';
//   const run = await getAppClient().runTool('score_offer', offer);
//
// The frame holds no key and makes no request: it asks the Manage page that opened it
// (window.parent) over postMessage,
//   {runnerd: 1, id, method: 'runTool' | 'listTools', params}
// and the page calls the API with the signed-in person's session for this app's install
// only, and answers {runnerd: 1, id, result} or {runnerd: 1, id, error: {code, message,
// details, status}}. A run that started resolves, whatever its status (succeeded, failed,
// timed_out); every refusal rejects with an AppBridgeError.

export const BRIDGE_VERSION = 1;
const MAX_TOOL_TIMEOUT_MS = 300000; // a tool's longest timeoutMs (docs/TOOL-FILES.md)
const MARGIN_MS = 30000; // the sandbox start and a wait for a slot, past the tool's own timeout
const LIST_TIMEOUT_MS = 30000; // listTools: one API read

// Its options are an error envelope's fields: code (error.code) and reason (details.code).
export class AppBridgeError extends Error {
  constructor({ code, reason = code, status, message, details = {}, retryAfter = null }) {
    super(message);
    this.name = 'AppBridgeError';
    // Branch on reason (code is the same, always, from a server and in a frame): the
    // precise reason, budget_exhausted, INVALID_INPUT, TOOL_NOT_FOUND, connection_failed...
    this.reason = reason;
    this.code = reason;
    // From a server, the envelope's error.code (FORBIDDEN for a spent budget), or the
    // SDK's UNAVAILABLE, REDIRECT_REFUSED; in a frame, the same as reason.
    this.envelopeCode = code;
    this.status = status; // the HTTP status (0: no answer from the daemon or the page)
    this.details = details;
    this.retryAfter = retryAfter; // seconds, for 429 and 503
  }
}

function bridgeError(code, status, message, details = {}) {
  return new AppBridgeError({ code, reason: code, status, message, details });
}

function isObject(value) {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

// The client of the frame `win` runs in (the global window unless a test gives another).
export function getAppClient({ window: given } = {}) {
  const win = given || globalThis.window;
  const waiting = new Map(); // id -> {resolve, reject, timer}
  const timeouts = new Map(); // tool name and reference -> timeoutMs, learnt from listTools
  let nextId = 1;
  let listening = false;

  function onMessage(event) {
    if (event.source !== win.parent) return; // only the page that opened this frame answers
    const data = event.data;
    if (!isObject(data) || data.runnerd !== BRIDGE_VERSION || !waiting.has(data.id)) return;
    const call = waiting.get(data.id);
    if (isObject(data.error)) {
      const { code, message, details, status } = data.error;
      call.settle(false, bridgeError(typeof code === 'string' ? code : 'BRIDGE_ERROR',
        Number.isInteger(status) ? status : 0, typeof message === 'string' ? message : String(code),
        isObject(details) ? details : {}));
    } else if ('result' in data) {
      call.settle(true, data.result);
    }
  }

  // Where the request may go: the page's own origin when the browser tells it (Chromium's
  // ancestorOrigins), else '*' (the apps origin lets only the Manage page frame it).
  function parentOrigin() {
    const ancestors = win.location && win.location.ancestorOrigins;
    return ancestors && ancestors.length && ancestors[0] !== 'null' ? ancestors[0] : '*';
  }

  function ask(method, params, timeoutMs, signal) {
    if (!win || !win.parent || win.parent === win) {
      return Promise.reject(bridgeError('NO_BRIDGE', 0, 'getAppClient() without arguments works '
        + 'only inside an app\'s frame opened by the Manage page; from a server, give it '
        + '{ url, apiKey, workspaceId, app }'));
    }
    if (signal && signal.aborted) return Promise.reject(signal.reason);
    if (!listening) {
      win.addEventListener('message', onMessage);
      listening = true;
    }
    const id = nextId;
    nextId += 1;
    return new Promise((resolve, reject) => {
      const onAbort = () => settle(false, signal.reason);
      const timer = setTimeout(() => settle(false, bridgeError('BRIDGE_TIMEOUT', 0,
        `${method}: no answer from the Manage page within ${timeoutMs} ms`, { timeoutMs })), timeoutMs);
      function settle(ok, value) {
        if (!waiting.delete(id)) return;
        clearTimeout(timer);
        if (signal) signal.removeEventListener('abort', onAbort);
        (ok ? resolve : reject)(value);
      }
      waiting.set(id, { settle });
      if (signal) signal.addEventListener('abort', onAbort, { once: true });
      try {
        win.parent.postMessage({ runnerd: BRIDGE_VERSION, id, method, params }, parentOrigin());
      } catch (err) { // an input the structured clone cannot copy (a function, a DOM node)
        settle(false, bridgeError('BAD_MESSAGE', 0, `${method}: cannot send the call: ${err && err.message}`));
      }
    });
  }

  async function runTool(name, input, { timeoutMs, signal } = {}) {
    if (typeof name !== 'string' || !name) throw new TypeError('runTool needs a tool name');
    const wait = timeoutMs ?? (timeouts.get(name) ?? MAX_TOOL_TIMEOUT_MS) + MARGIN_MS;
    const run = await ask('runTool', { name, input }, wait, signal);
    return { runId: run.runId, status: run.status, output: run.output ?? null,
      error: run.error ?? null, durationMs: run.durationMs ?? null };
  }

  async function listTools({ signal } = {}) {
    const tools = await ask('listTools', {}, LIST_TIMEOUT_MS, signal);
    for (const tool of tools) {
      timeouts.set(tool.name, tool.timeoutMs);
      timeouts.set(tool.reference, tool.timeoutMs);
    }
    return tools;
  }

  return { runTool, listTools };
}
