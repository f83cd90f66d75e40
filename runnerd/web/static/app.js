// The Manage page: sign-in, the layout, and a router over location.hash. No framework,
// no build step; every screen is drawn from the JSON API (views.js).
import { api, can, membership, session } from './api.js';
import { append, clear, errorBox, h } from './dom.js';
import { approvalsView } from './approvals.js';
import { appFrameView } from './bridge.js';
import { consentView } from './consent.js';
import {
  appsView, auditView, diffView, installView, ledgerView, peopleView, runView, runsView, toolView,
} from './views.js';

const main = document.getElementById('main');

const ROUTES = [
  [/^\/?$/, appsView, 'Apps'],
  [/^\/apps\/([^/]+)$/, appFrameView, 'App', ['installId']],
  [/^\/apps\/([^/]+)\/diff$/, diffView, 'Changes', ['appSlug']],
  [/^\/installs\/([^/]+)$/, installView, 'Manage', ['installId']],
  [/^\/installs\/([^/]+)\/tools\/([^/]+)$/, toolView, 'Tool', ['installId', 'tool']],
  [/^\/installs\/([^/]+)\/runs$/, runsView, 'Runs', ['installId']],
  [/^\/runs\/([^/]+)$/, runView, 'Run', ['runId']],
  [/^\/approvals$/, approvalsView, 'Approvals'],
  [/^\/audit$/, auditView, 'Audit'],
  [/^\/ledger$/, ledgerView, 'Ledger'],
  [/^\/people$/, peopleView, 'People'],
  [/^\/consent$/, consentView, 'Allow access'],
];

function chooseWorkspace() {
  const stored = window.localStorage.getItem('runnerd.workspace');
  const list = session.info.workspaces;
  session.workspaceId = (list.find((w) => w.workspaceId === stored) || list[0] || {}).workspaceId || null;
}

function drawChrome() {
  const nav = clear(document.getElementById('nav'));
  const who = clear(document.getElementById('who'));
  if (!session.info) return;
  const link = (href, text) => h('a', { href }, text);
  append(nav, [link('#/', 'Apps'),
    can('member', false) ? h('a', { href: '#/approvals' }, 'Approvals', h('span', { id: 'approvals-waiting', class: 'count' })) : null,
    can('admin', false) ? [link('#/audit', 'Audit'), link('#/ledger', 'Ledger'), link('#/people', 'People')] : null]);
  const picker = h('select', { id: 'workspace', 'aria-label': 'Workspace', onchange: () => {
    window.localStorage.setItem('runnerd.workspace', picker.value);
    chooseWorkspace();
    drawChrome();
    window.location.hash = '#/';
    route();
  } }, session.info.workspaces.map((w) => h('option', { value: w.workspaceId, selected: w.workspaceId === session.workspaceId },
    `${w.name} (${w.role})`)));
  append(who, [picker, h('span', { class: 'email' }, session.info.email),
    h('button', { type: 'button', class: 'small secondary', onclick: signOut }, 'Sign out')]);
}

async function signOut() {
  try {
    await api('DELETE', '/api/v2/session');
  } catch {
    // the session may be gone already
  }
  session.info = null;
  signInView();
}

function signInView(message) {
  session.info = null;
  drawChrome();
  clear(main);
  const key = h('input', { id: 'api-key', type: 'password', autocomplete: 'off', required: true });
  const problem = h('p', { class: 'form-error', role: 'alert' }, message || '');
  append(main, [h('section', { class: 'card sign-in' },
    h('h1', {}, 'Sign in to runnerd'),
    h('form', { onsubmit: async (e) => {
      e.preventDefault();
      problem.textContent = '';
      try {
        session.info = await api('POST', '/api/v2/session', { body: { apiKey: key.value } });
        key.value = '';
        start();
      } catch (err) {
        problem.textContent = err.message;
      }
    } },
    h('div', { class: 'field' }, h('label', { for: 'api-key' }, 'Personal API key'), key),
    problem,
    h('div', { class: 'actions' }, h('button', { type: 'submit' }, 'Sign in'))),
    h('p', { class: 'muted' }, 'No key at hand? An admin can print a one-time sign-in link with ',
      h('code', {}, 'runnerd admin login-link --email you@example.com'), '.'))]);
  document.getElementById('api-key').focus();
}

// /login#token=…: the token is in the fragment, so it never reaches a log. It is spent
// only when the person presses the button (a link previewer cannot use it up).
function loginLinkView(token) {
  clear(main);
  const problem = h('p', { class: 'form-error', role: 'alert' });
  append(main, [h('section', { class: 'card sign-in' }, h('h1', {}, 'Sign in to runnerd'),
    h('p', {}, 'This one-time link signs you in on this browser.'),
    problem,
    h('div', { class: 'actions' }, h('button', { type: 'button', id: 'use-link', onclick: async () => {
      try {
        session.info = await api('POST', '/api/v2/session', { body: { loginToken: token } });
        window.history.replaceState(null, '', '/#/');
        start();
      } catch (err) {
        problem.textContent = err.message;
      }
    } }, 'Sign in')))]);
}

// How many write calls wait for a decision, next to the Approvals link (members and up).
async function countWaiting() {
  const badge = document.getElementById('approvals-waiting');
  if (!badge || !session.workspaceId) return;
  try {
    const found = await api('GET', '/api/v2/approvals', { query: { workspaceId: session.workspaceId, status: 'pending' } });
    const n = found.data.length;
    badge.textContent = n ? ` (${n})` : '';
    badge.title = n ? `${n} waiting for a decision` : '';
  } catch {
    badge.textContent = '';
  }
}

async function route() {
  if (!session.info) return;
  countWaiting();
  const [path, search] = window.location.hash.replace(/^#/, '').split('?');
  const query = new URLSearchParams(search || '');
  clear(main);
  if (!session.workspaceId) {
    append(main, [errorBox(new Error('You belong to no workspace yet: ask an admin to add you.'))]);
    return;
  }
  if (!membership().appsAccess && !['/audit', '/ledger', '/people', '/consent'].includes(path)) {
    append(main, [errorBox(new Error('Your role in this workspace does not include the Apps module: ask an admin.'))]);
    return;
  }
  for (const [pattern, view, title, names] of ROUTES) {
    const found = (path || '/').match(pattern);
    if (!found) continue;
    const params = Object.fromEntries((names || []).map((n, i) => [n, decodeURIComponent(found[i + 1])]));
    document.title = `${title} · runnerd`;
    try {
      await view(main, params, query);
    } catch (err) {
      if (err.status !== 401) append(main, [errorBox(err)]);
    }
    main.focus({ preventScroll: true });
    return;
  }
  append(main, [errorBox(new Error('No such page.'))]);
}

function start() {
  chooseWorkspace();
  drawChrome();
  route();
}

window.addEventListener('hashchange', route);
window.addEventListener('runnerd:signed-out', () => signInView('Your session has ended: sign in again.'));

async function boot() {
  const token = window.location.pathname === '/login'
    ? new URLSearchParams(window.location.hash.slice(1)).get('token') : null;
  if (token) {
    loginLinkView(token);
    return;
  }
  try {
    session.info = await api('GET', '/api/v2/session');
    start();
  } catch {
    signInView();
  }
}

boot();
