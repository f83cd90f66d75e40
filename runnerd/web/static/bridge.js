// The Manage page's side of the app bridge: the calls an app's frame asks for with
// getAppClient() (clients/js/frame.js), made with the signed-in person's session for that
// frame's install only.
//
// The frame is sandboxed without allow-same-origin: its origin is opaque ('null'), so a
// message is known to be its own only by its window: event.source === iframe.contentWindow.
// Anything else (another frame, another tab, a message of the wrong shape) is ignored.
// Answers go to event.source alone ('*' is the only target an opaque origin can have).
//
//   frame -> page  {runnerd: 1, id, method: 'runTool' | 'listTools', params}
//   page -> frame  {runnerd: 1, id, result} | {runnerd: 1, id, error: {code, message, details, status}}
//
// runTool     -> POST /api/v2/apps/installs/{id}/tools/{name}/run {"input"}
// listTools   -> GET  /api/v2/apps/tools?workspaceId=&installId=
// Both carry X-Runnerd-Frame: <the frame's token>, which proves surface app to the API.
import { ApiError, api, session } from './api.js';
import { append, h } from './dom.js';

const VERSION = 1;
const MAX_IN_FLIGHT = 16; // calls one frame may have waiting at once
const MAX_NAME_CHARS = 200; // app/tool: a slug, a slash and a tool name, with room
const TOOL_NAME = /^[a-z][a-z0-9_]{0,39}$/; // schemas/agentserve.tool.schema.json's name
const RENEW_BEFORE_MS = 60000; // a frame token is renewed this long before it expires

class Refusal extends Error {
  constructor(code, status, message, details = {}) {
    super(message);
    this.code = code;
    this.status = status;
    this.details = details;
  }
}

function isObject(value) {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function otherApp(what) {
  return new Refusal('OTHER_APP_REFUSED', 403,
    `${what}: an app's frame runs only its own app's tools`);
}

// The answer's error for what a call threw: the API's precise code (details.code) first.
function errorOf(err) {
  if (err instanceof Refusal) {
    return { code: err.code, message: err.message, details: err.details, status: err.status };
  }
  if (err instanceof ApiError) {
    const details = err.details || {};
    return { code: details.code || err.code || 'INTERNAL_ERROR', message: err.message, details,
      status: err.status };
  }
  return { code: 'UNAVAILABLE', message: `cannot reach runnerd: ${err && err.message}`,
    details: {}, status: 0 };
}

// Serve the frame `iframe` of `install` ({installId, appSlug}); `frame` is the answer of
// POST .../frame ({token, expiresAt}); `renew` gets a fresh one (default: POST .../frame
// again). Returns a function that stops serving; serving also stops by itself once the
// iframe has left the page.
export function serveFrame(iframe, install, frame, renew) {
  const { installId, appSlug } = install;
  const workspaceId = session.workspaceId;
  let current = frame;
  let inFlight = 0;

  async function token() {
    if (Date.parse(current.expiresAt) - Date.now() < RENEW_BEFORE_MS) {
      current = await (renew ? renew() : api('POST', `/api/v2/apps/installs/${installId}/frame`));
    }
    return current.token;
  }

  async function runTool(params) {
    const { name, input } = params;
    if (typeof name !== 'string' || !name || name.length > MAX_NAME_CHARS) {
      throw new Refusal('BAD_MESSAGE', 400, 'runTool: params.name must be a tool name');
    }
    const slash = name.lastIndexOf('/');
    if (slash !== -1 && name.slice(0, slash) !== appSlug) throw otherApp(name);
    const tool = name.slice(slash + 1);
    // A tool name as the tool file's schema has it: never '.', '..' or anything a URL reads
    // as more than one path segment.
    if (!TOOL_NAME.test(tool)) {
      throw new Refusal('BAD_MESSAGE', 400, 'runTool: params.name must be a tool name');
    }
    const headers = { 'X-Runnerd-Frame': await token() };
    const path = `/api/v2/apps/installs/${encodeURIComponent(installId)}/tools/${encodeURIComponent(tool)}/run`;
    const run = await api('POST', path, { body: { input }, headers });
    if (run && run.status === 'pending_approval') {
      throw new Refusal('PENDING_APPROVAL', 202, `${name} waits for an approval (${run.approvalId})`,
        { approvalId: run.approvalId, expiresAt: run.expiresAt });
    }
    return run;
  }

  async function listTools() {
    const headers = { 'X-Runnerd-Frame': await token() };
    const found = await api('GET', '/api/v2/apps/tools', { query: { workspaceId, installId }, headers });
    return found.data;
  }

  const METHODS = { runTool, listTools };

  async function answer(method, params) {
    if (!Object.hasOwn(METHODS, method)) {
      throw new Refusal('BAD_MESSAGE', 400, `no such bridge method: ${String(method).slice(0, 40)}`);
    }
    if (params !== undefined && !isObject(params)) {
      throw new Refusal('BAD_MESSAGE', 400, `${method}: params must be an object`);
    }
    const given = params || {};
    // A call may not name another install or app: this frame's are the only ones it has.
    if (given.installId !== undefined && given.installId !== installId) throw otherApp(`installId ${given.installId}`);
    for (const key of ['app', 'appSlug']) {
      if (given[key] !== undefined && given[key] !== appSlug) throw otherApp(`${key} ${given[key]}`);
    }
    return METHODS[method](given);
  }

  async function onMessage(event) {
    if (!iframe.isConnected) {
      stop();
      return;
    }
    if (event.source !== iframe.contentWindow || event.source === null) return;
    const data = event.data;
    if (!isObject(data) || data.runnerd !== VERSION || !Number.isSafeInteger(data.id)) return;
    const target = event.source;
    const reply = (body) => target.postMessage({ runnerd: VERSION, id: data.id, ...body }, '*');
    if (inFlight >= MAX_IN_FLIGHT) {
      reply({ error: errorOf(new Refusal('TOO_MANY_CALLS', 429,
        `at most ${MAX_IN_FLIGHT} calls of a frame wait at once`)) });
      return;
    }
    inFlight += 1;
    try {
      reply({ result: await answer(data.method, data.params) });
    } catch (err) {
      reply({ error: errorOf(err) });
    } finally {
      inFlight -= 1;
    }
  }

  function stop() {
    window.removeEventListener('message', onMessage);
  }

  window.addEventListener('message', onMessage);
  return stop;
}

// The address the apps origin lets frame its pages (their CSP's frame-ancestors): the
// origin of public_url, which the OAuth metadata names as its issuer. null when it cannot
// be told (the page then opens the frame as before).
let framedBy;
async function framingOrigin() {
  if (framedBy === undefined) {
    try {
      const metadata = await api('GET', '/.well-known/oauth-authorization-server');
      framedBy = { base: metadata.issuer.replace(/\/+$/, ''), origin: new URL(metadata.issuer).origin };
    } catch {
      framedBy = null;
    }
  }
  return framedBy;
}

// The frame's height: the window's below the frame's top (at least 420 px, as the CSS
// says), kept so as the window is resized; the app's page scrolls inside it.
function fitFrame(iframe) {
  const fit = () => {
    if (!iframe.isConnected) return;
    const top = iframe.getBoundingClientRect().top + window.scrollY;
    iframe.style.height = `${Math.max(420, window.innerHeight - top - 24)}px`;
  };
  window.addEventListener('resize', fit);
  window.addEventListener('hashchange', () => window.removeEventListener('resize', fit), { once: true });
  fit();
}

// #/apps/{installId}: the install's pages in their sandboxed frame, on the apps origin.
// #/apps/{installId}?dev=1: the pages `runnerd app dev` sends from the person's machine
// instead (api/dev_pages.py), in the same frame and bridge, the tools as installed; the
// frame reloads when the revision changes (polled each second).
export async function appFrameView(main, { installId }, query) {
  const installs = await api('GET', '/api/v2/apps/installs', { query: { workspaceId: session.workspaceId } });
  const install = installs.data.find((i) => i.installId === installId);
  if (!install) throw new Error('No such install in this workspace');
  const dev = Boolean(query && query.get('dev') === '1');
  const heading = [
    h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'Apps'), ' / ', install.appSlug, ' · ',
      h('a', { href: `#/installs/${installId}` }, 'Manage')),
    h('h1', {}, `${install.appSlug} `, h('span', { class: 'muted' }, `version ${install.version}`)),
  ];
  // Opened at another address than public_url (localhost for 127.0.0.1, say), the frame
  // would stay blank: the browser refuses it by the pages' frame-ancestors. Say where to go
  // instead, before a frame is opened (and audited) for nothing.
  const framing = await framingOrigin();
  if (framing && framing.origin !== window.location.origin) {
    const target = `${framing.base}/#/apps/${encodeURIComponent(installId)}${dev ? '?dev=1' : ''}`;
    append(main, [heading, h('div', { class: 'error frame-origin', role: 'alert' },
      'Open the Manage page at ', h('a', { href: target }, framing.base),
      ' to use apps: the apps origin lets only that address frame them (this page is at ',
      window.location.origin, '; sign in there: a session belongs to one address).')]);
    return;
  }
  const devPath = `/api/v2/apps/installs/${encodeURIComponent(installId)}/dev-pages`;
  const frame = dev ? await api('GET', devPath)
    : await api('POST', `/api/v2/apps/installs/${encodeURIComponent(installId)}/frame`);
  // No allow-same-origin: the frame's origin is opaque, with no cookies and no storage of
  // the apps origin, and it can reach the Manage page only through serveFrame.
  const iframe = h('iframe', { class: 'app-frame', sandbox: 'allow-scripts allow-forms',
    referrerpolicy: 'no-referrer', title: `${install.appSlug} ${install.version}`, src: frame.url });
  // listening before the frame can speak
  const stop = serveFrame(iframe, install, frame, dev ? () => api('GET', devPath) : undefined);
  window.addEventListener('hashchange', stop, { once: true });
  const note = dev ? h('p', { class: 'muted', id: 'dev-note' },
    `Dev pages from your machine (revision ${frame.revision}), shown to you only; tools run version ${install.version} as installed.`) : null;
  if (dev) {
    let revision = frame.revision;
    const timer = setInterval(async () => {
      if (!iframe.isConnected) {
        clearInterval(timer);
        return;
      }
      try {
        const now = await api('GET', devPath);
        if (now.revision !== revision) {
          revision = now.revision;
          iframe.src = now.url; // the same window: the bridge keeps serving it
          note.textContent = `Dev pages from your machine (revision ${revision}), shown to you only; tools run version ${install.version} as installed.`;
        }
      } catch (err) {
        note.textContent = `No dev pages now (${err.message}): is runnerd app dev running against this node?`;
      }
    }, 1000);
    window.addEventListener('hashchange', () => clearInterval(timer), { once: true });
  }
  append(main, [heading, note, iframe]);
  fitFrame(iframe);
}
