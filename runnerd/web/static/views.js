// The screens. Each takes the main element and the route's parameters, asks the API,
// and draws. Buttons appear by the same rules the API applies; the API still decides.
import { api, can, session } from './api.js';
import { schemaForm } from './form.js';
import {
  append, badge, clear, confirmDialog, empty, errorBox, h, ms, pretty, seconds, srOnly,
  statusBadge, table, toast, when,
} from './dom.js';

const ws = () => session.workspaceId;

// People's emails by user id, for admins (the members list is theirs to read); others see ids.
export async function emailsById() {
  if (!can('admin', false)) return new Map();
  try {
    const found = await api('GET', `/api/v2/workspaces/${ws()}/members`);
    return new Map(found.data.map((m) => [m.userId, m.email]));
  } catch {
    return new Map();
  }
}

export function section(title, ...children) {
  return h('section', { class: 'card' }, h('h2', {}, title), ...children);
}

async function guarded(target, work) {
  try {
    await work();
  } catch (err) {
    append(target, [errorBox(err)]);
  }
}

function runLink(run) {
  return h('a', { href: `#/runs/${run.runId}` }, run.runId);
}

function runsTable(runs, emptyText) {
  return table(['Run', 'Status', 'Tool', 'Duration', 'Surface', 'Who', 'When'],
    runs.map((r) => [runLink(r), statusBadge(r.status), r.tool, ms(r.durationMs), r.surface,
      r.userEmail || r.userId, when(r.startedAt)]), emptyText);
}

// --- apps and installs -------------------------------------------------------------------

export async function appsView(main) {
  const [apps, installs] = await Promise.all([
    api('GET', '/api/v2/apps', { query: { workspaceId: ws() } }),
    api('GET', '/api/v2/apps/installs', { query: { workspaceId: ws() } }),
  ]);
  const installOf = new Map(installs.data.map((i) => [i.appSlug, i]));
  append(main, [h('h1', {}, 'Apps'), launcher(installs.data)]);
  if (!apps.data.length) {
    append(main, [empty('No apps yet: deploy one with runnerd app deploy.')]);
    return;
  }
  for (const app of apps.data) {
    const install = installOf.get(app.appSlug);
    const versionById = new Map(app.versions.map((v) => [v.versionId, v]));
    const previous = install && install.previousVersionId ? versionById.get(install.previousVersionId) : null;
    const rows = app.versions.slice().reverse().map((v, i, newestFirst) => {
      const actions = [];
      // What this version changes, from the installed one (else from the one before it).
      const base = install ? install.version : (newestFirst[i + 1] || {}).version;
      if (base && base !== v.version) {
        actions.push(h('a', { href: `#/apps/${encodeURIComponent(app.appSlug)}/diff?${new URLSearchParams({ from: base, to: v.version })}`,
          'data-action': 'diff', 'aria-label': `Changes from ${base} to ${v.version}` }, 'Changes'));
      }
      const isInstalled = install && install.versionId === v.versionId;
      if (!v.publishedAt && can('builder')) {
        actions.push(h('button', { type: 'button', class: 'small', 'data-action': 'publish',
          onclick: () => publish(app, v, install ? install.version : latestPublished(app, v)) }, 'Publish'));
      }
      if (v.publishedAt && !isInstalled && can('admin')) {
        actions.push(h('button', { type: 'button', class: 'small', 'data-action': 'install',
          onclick: () => (install ? switchTo(app, install, v) : installApp(app, v)) },
        install ? 'Switch to this' : 'Install'));
      }
      return [v.version, v.publishedAt ? badge('published', 'ok') : badge('draft', 'muted'),
        when(v.publishedAt || v.createdAt), v.tools.join(', '),
        isInstalled ? badge('installed', 'info') : '', h('span', { class: 'row-actions' }, actions)];
    });
    append(main, [section(`${app.name} (${app.appSlug})`,
      install
        ? h('p', {}, 'Installed: ', h('strong', {}, install.version),
          previous ? ` · previous: ${previous.version}` : '', ' · ',
          h('a', { href: `#/installs/${install.installId}` }, 'Manage'),
          previous && can('admin')
            ? [' · ', h('button', { type: 'button', class: 'small danger', 'data-action': 'rollback',
              onclick: () => rollback(app, install, previous) }, `Roll back to ${previous.version}`)]
            : null)
        : h('p', { class: 'muted' }, 'Not installed in this workspace.'),
      table(['Version', 'State', 'Date', 'Tools', srOnly('Installed'), srOnly('Actions')], rows, 'No versions.'))]);
  }
}

// The launcher: the installs whose version has pages, each opened in its frame
// (bridge.js); for the people who may run tools (members and up, with the Apps module).
function launcher(installs) {
  const withPages = installs.filter((i) => i.pageEntry);
  if (!withPages.length || !can('member')) return null;
  return h('section', { class: 'card', id: 'launcher' }, h('h2', {}, 'Open an app'),
    h('ul', { class: 'launcher' }, withPages.map((i) => h('li', {},
      h('a', { class: 'button', href: `#/apps/${i.installId}`, 'data-install': i.installId },
        `Open ${i.appSlug}`), ' ', h('span', { class: 'muted' }, `version ${i.version}`)))));
}

const EVERY_CALLER = 'Every caller of this app in the workspace (apps, chat agents, relays, '
  + 'workflows, people) gets the new version at once, with its tools, schemas and egress.';

// The newest published version other than ``version`` (what a publish is compared with
// where the app is not installed here), or null.
function latestPublished(app, version) {
  const found = app.versions.filter((v) => v.publishedAt && v.versionId !== version.versionId);
  return found.length ? found[found.length - 1].version : null;
}

// What going from version ``from`` to ``to`` changes, drawn for a dialog or a screen;
// null when there is nothing to compare with.
async function changes(app, from, to) {
  if (!from || from === to) return null;
  try {
    const diff = await api('GET', `/api/v2/apps/${encodeURIComponent(app.appSlug)}/versions/${encodeURIComponent(to)}/diff`,
      { query: { workspaceId: ws(), from } });
    return diffSummary(diff);
  } catch (err) {
    return errorBox(err);
  }
}

function names(list) {
  return list.map((x, i) => [i ? ', ' : '', h('code', {}, x)]);
}

function shortJson(value) {
  const text = JSON.stringify(value);
  return text === undefined ? '(none)' : text.length > 80 ? `${text.slice(0, 79)}…` : text;
}

// A version diff (GET …/versions/{version}/diff) as lists a person reads: tools,
// their schemas and packages, the app's packages and egress, each added or removed.
export function diffSummary(diff) {
  const items = [];
  const line = (label, list, kind) => (list.length
    ? items.push(h('li', { 'data-change': kind }, `${label}: `, names(list))) : null);
  line('Tools added', diff.toolsAdded, 'tools-added');
  line('Tools removed', diff.toolsRemoved, 'tools-removed');
  for (const t of diff.toolsChanged) {
    const schema = [...t.inputSchema.map((c) => ['input', c]), ...t.outputSchema.map((c) => ['output', c])];
    items.push(h('li', { 'data-change': 'tool', 'data-tool': t.name }, 'Tool ', h('code', {}, t.name), ' changes: ',
      t.changed.map((w) => w.replace('Schema', ' schema')).join(', '),
      schema.length || t.packagesAdded.length || t.packagesRemoved.length ? h('ul', {},
        schema.map(([side, c]) => h('li', {}, `${side} `, h('code', {}, c.pointer), ` ${c.kind}`,
          c.kind === 'changed' ? `: ${shortJson(c.before)} → ${shortJson(c.after)}`
            : `: ${shortJson(c.kind === 'added' ? c.after : c.before)}`)),
        t.truncated ? h('li', {}, '… and more') : null,
        t.packagesAdded.length ? h('li', {}, 'packages added: ', names(t.packagesAdded)) : null,
        t.packagesRemoved.length ? h('li', {}, 'packages removed: ', names(t.packagesRemoved)) : null) : null));
  }
  line('Packages added', diff.packagesAdded, 'packages-added');
  line('Packages removed', diff.packagesRemoved, 'packages-removed');
  line('Egress added', diff.egressAdded, 'egress-added');
  line('Egress removed', diff.egressRemoved, 'egress-removed');
  return h('section', { class: 'diff', 'aria-label': `Changes from ${diff.fromVersion} to ${diff.toVersion}` },
    h('h2', {}, `Changes from ${diff.fromVersion} to ${diff.toVersion}`),
    items.length ? h('ul', {}, items) : h('p', { class: 'muted' }, 'No change to tools, schemas, packages or egress (the code may differ).'));
}

async function publish(app, version, base) {
  if (!await confirmDialog(`Publish ${app.appSlug} ${version.version}?`,
    'A published version can be installed; it can never change again.', 'Publish',
    await changes(app, base, version.version))) return;
  await act(() => api('POST', `/api/v2/apps/${app.appSlug}/versions/${encodeURIComponent(version.version)}/publish`,
    { query: { workspaceId: ws() } }), `Published ${version.version}`);
}

async function installApp(app, version) {
  if (!await confirmDialog(`Install ${app.appSlug} ${version.version}?`,
    `${EVERY_CALLER} Egress granted: ${version.egress.join(', ') || 'none'}.`, 'Install')) return;
  await act(() => api('POST', '/api/v2/apps/installs', { query: { workspaceId: ws() },
    body: { appSlug: app.appSlug, version: version.version } }), `Installed ${version.version}`);
}

async function switchTo(app, install, version) {
  if (!await confirmDialog(`Switch ${app.appSlug} from ${install.version} to ${version.version}?`,
    `${EVERY_CALLER} Egress granted: ${version.egress.join(', ') || 'none'}.`, 'Switch',
    await changes(app, install.version, version.version))) return;
  await act(() => api('POST', `/api/v2/apps/installs/${install.installId}/switch`,
    { body: { version: version.version } }), `Switched to ${version.version}`);
}

async function rollback(app, install, previous) {
  if (!await confirmDialog(`Roll ${app.appSlug} back from ${install.version} to ${previous.version}?`,
    EVERY_CALLER, 'Roll back', await changes(app, install.version, previous.version))) return;
  await act(() => api('POST', `/api/v2/apps/installs/${install.installId}/rollback`),
    `Rolled back to ${previous.version}`);
}

export async function act(work, done) {
  try {
    await work();
    toast(done);
  } catch (err) {
    toast(err.message);
  }
  window.dispatchEvent(new HashChangeEvent('hashchange'));
}

// --- an install's Manage page ------------------------------------------------------------

export async function installView(main, { installId }) {
  const installs = await api('GET', '/api/v2/apps/installs', { query: { workspaceId: ws() } });
  const install = installs.data.find((i) => i.installId === installId);
  if (!install) {
    append(main, [errorBox(new Error('No such install in this workspace'))]);
    return;
  }
  const [tools, latest] = await Promise.all([
    api('GET', '/api/v2/apps/tools', { query: { workspaceId: ws(), installId } }),
    api('GET', `/api/v2/apps/installs/${installId}/runs/latest`, { query: { perTool: 3 } }),
  ]);
  append(main, [
    h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'Apps'), ' / ', install.appSlug),
    h('h1', {}, `${install.appSlug} `, h('span', { class: 'muted' }, `version ${install.version}`)),
    h('nav', { class: 'tabs', 'aria-label': 'Sections' },
      ['Tools', 'Secrets', 'Egress', 'Budget', 'Usage', 'Runs'].map((x) =>
        h('a', { href: x === 'Runs' ? `#/installs/${installId}/runs` : `#${x.toLowerCase()}`,
          onclick: x === 'Runs' ? null : (e) => { e.preventDefault(); document.getElementById(x.toLowerCase()).scrollIntoView(); } }, x))),
  ]);
  const toolCards = tools.data.map((tool) => h('article', { class: 'tool' },
    h('h3', {}, h('a', { href: `#/installs/${installId}/tools/${tool.name}` }, tool.name), ' ',
      tool.effect === 'write' ? badge('write', 'warn') : badge('read', 'muted'),
      badge(tool.language, 'muted')),
    referenceLine(tool.reference),
    h('p', {}, tool.description),
    runsTable(latest.data[tool.name] || [], 'No runs yet.')));
  append(main, [h('section', { class: 'card', id: 'tools' }, h('h2', {}, 'Tools'),
    toolCards.length ? toolCards : empty('This version ships no tools.'))]);
  const rest = h('div');
  append(main, [rest]);
  await Promise.all([
    secretsSection(rest, install), egressSection(rest, install), budgetSection(rest, install),
  ]);
  append(rest, [h('section', { class: 'card', id: 'usage' }, h('h2', {}, 'Usage, last 30 days'),
    usageChart(installId))]);
}

// The usage chart, drawn anew each time the screen is (a run elsewhere shows on coming
// back), every USAGE_REFRESH_MS while it is on screen, and when the window is shown again.
const USAGE_REFRESH_MS = 30000;

function usageChart(installId) {
  const img = h('img', { class: 'chart', alt: 'Runs per day by status, and sandbox time per day, for the last 30 days' });
  const load = () => {
    img.src = `/manage/installs/${installId}/usage.svg?at=${Date.now()}`;
  };
  load();
  const timer = setInterval(() => {
    if (!img.isConnected) {
      clearInterval(timer);
      document.removeEventListener('visibilitychange', shown);
    } else if (document.visibilityState === 'visible') load();
  }, USAGE_REFRESH_MS);
  function shown() {
    if (img.isConnected && document.visibilityState === 'visible') load();
  }
  document.addEventListener('visibilitychange', shown);
  return img;
}

function referenceLine(reference) {
  return h('p', { class: 'reference' }, h('code', {}, reference), ' ',
    h('button', { type: 'button', class: 'small secondary', 'aria-label': `Copy ${reference}`,
      onclick: async () => {
        try {
          await navigator.clipboard.writeText(reference);
          toast(`Copied ${reference}`);
        } catch {
          toast('Copying is not allowed here: select the reference instead');
        }
      } }, 'Copy'));
}

async function secretsSection(parent, install) {
  const box = h('section', { class: 'card', id: 'secrets' }, h('h2', {}, 'Secrets'));
  parent.append(box);
  if (!can('builder')) {
    append(box, [h('p', { class: 'muted' }, 'Builders and admins see the names of secrets.')]);
    return;
  }
  await guarded(box, async () => {
    const list = await api('GET', `/api/v2/apps/installs/${install.installId}/secrets`);
    append(box, [table(['Name', 'Last set', srOnly('Actions')], list.data.map((s) => [h('code', {}, s.name), when(s.updatedAt),
      can('admin') ? h('button', { type: 'button', class: 'small danger', onclick: async () => {
        if (!await confirmDialog(`Delete ${s.name}?`, 'Runs of this install will no longer get it.', 'Delete')) return;
        await act(() => api('DELETE', `/api/v2/apps/installs/${install.installId}/secrets/${s.name}`), `Deleted ${s.name}`);
      } }, 'Delete') : '']), 'No secrets set.')]);
    if (can('admin')) append(box, [secretForm(install)]);
  });
}

// Set a secret. A refusal stays next to the field it is about (the name, the value) or
// above the button, until the next try: it never vanishes on its own.
function secretForm(install) {
  const name = h('input', { id: 'secret-name', name: 'name', autocomplete: 'off', placeholder: 'STRIPE_KEY',
    'aria-describedby': 'secret-name-error' });
  const value = h('input', { id: 'secret-value', name: 'value', type: 'password', autocomplete: 'new-password',
    'aria-describedby': 'secret-value-error' });
  const errors = {
    name: h('p', { class: 'field-error', id: 'secret-name-error' }),
    value: h('p', { class: 'field-error', id: 'secret-value-error' }),
    form: h('p', { class: 'form-error', id: 'secret-error', role: 'alert' }),
  };
  const inputs = { name, value };
  const show = (where, message) => {
    errors[where].textContent = message;
    if (inputs[where]) {
      inputs[where].setAttribute('aria-invalid', 'true');
      inputs[where].focus();
    }
  };
  const form = h('form', { class: 'inline secret-form', novalidate: true, onsubmit: async (e) => {
    e.preventDefault();
    for (const el of Object.values(errors)) el.textContent = '';
    for (const el of Object.values(inputs)) el.removeAttribute('aria-invalid');
    const secretName = name.value.trim();
    const secretValue = value.value;
    if (!secretName) return show('name', 'Name a secret: capital letters, digits and underscores.');
    if (!secretValue) return show('value', 'Give the secret a value.');
    value.value = ''; // write-only: the field never keeps it
    try {
      await api('PUT', `/api/v2/apps/installs/${install.installId}/secrets/${encodeURIComponent(secretName)}`,
        { body: { value: secretValue } });
    } catch (err) {
      // The refusal's reason is details.code (the envelope's code is the HTTP kind).
      const reason = err.details.code;
      const field = reason === 'INVALID_SECRET_VALUE' ? 'value'
        : ['INVALID_SECRET_NAME', 'INVALID_QUERY'].includes(reason) || err.details.field === 'name' ? 'name' : 'form';
      return show(field, err.message);
    }
    toast(`Set ${secretName}`);
    window.dispatchEvent(new HashChangeEvent('hashchange'));
    return null;
  } },
  h('div', { class: 'field' }, h('label', { for: 'secret-name' }, 'Name'), name, errors.name),
  h('div', { class: 'field' }, h('label', { for: 'secret-value' }, 'Value (write-only)'), value, errors.value),
  h('button', { type: 'submit' }, 'Set secret'));
  return h('div', {}, form, errors.form);
}

async function egressSection(parent, install) {
  const box = h('section', { class: 'card', id: 'egress' }, h('h2', {}, 'Egress'));
  parent.append(box);
  await guarded(box, async () => {
    const grant = await api('GET', `/api/v2/apps/installs/${install.installId}/egress`);
    append(box, [grant.granted.length
      ? h('ul', {}, grant.granted.map((d) => h('li', {}, h('code', {}, d))))
      : empty('No network: this version asks for no egress, or the grant is empty.'),
    grant.requested.length && grant.requested.join() !== grant.granted.join()
      ? h('p', { class: 'muted' }, `The version asks for: ${grant.requested.join(', ')}`) : null]);
  });
}

async function budgetSection(parent, install) {
  const box = h('section', { class: 'card', id: 'budget' }, h('h2', {}, 'Budget'));
  parent.append(box);
  await guarded(box, async () => {
    const b = await api('GET', `/api/v2/apps/installs/${install.installId}/budget`);
    const limit = b.monthlyMs;
    const used = b.usedMs + b.reservedMs;
    const share = limit ? Math.min(1, used / limit) : limit === 0 ? 1 : 0;
    // The store's rule (BudgetStatus.spent): what ran and what is reserved reach the limit.
    const spent = limit !== null && used >= limit;
    append(box, [
      h('p', { class: 'budget-line' }, `${b.month}: ${seconds(b.usedMs)} used, ${seconds(b.reservedMs)} reserved, `,
        limit === null ? 'no limit' : `limit ${seconds(limit)}`, ' · resets ', when(b.resetsAt),
        spent ? [' ', badge('exhausted', 'bad')] : null),
      spent ? h('p', { class: 'error', id: 'budget-exhausted' },
        'Budget exhausted: every run of this install is refused until it resets or an admin raises the limit.') : null,
      limit === null ? null : h('meter', { min: 0, max: 1, value: share, high: 0.8, optimum: 0,
        'aria-label': `Budget used: ${Math.round(share * 100)}%` }),
    ]);
    if (can('admin')) {
      const input = h('input', { id: 'budget-s', type: 'number', min: 0, step: 'any',
        value: limit === null ? '' : limit / 1000, placeholder: 'empty: unlimited' });
      append(box, [h('form', { class: 'inline', onsubmit: async (e) => {
        e.preventDefault();
        const monthlyMs = input.value === '' ? null : Math.round(Number(input.value) * 1000);
        await act(() => api('PUT', `/api/v2/apps/installs/${install.installId}/budget`,
          { body: { monthlyMs } }), 'Budget set');
      } }, h('div', { class: 'field' }, h('label', { for: 'budget-s' }, 'Monthly sandbox seconds'), input),
      h('button', { type: 'submit' }, 'Set budget'))]);
    }
  });
}

// --- one tool ----------------------------------------------------------------------------

// A field's JSON Schema keywords that constrain its value, as short text: what the input
// check enforces, so a person filling the form sees it before a run is refused.
const RULES = [
  ['minimum', (v) => `≥ ${v}`], ['exclusiveMinimum', (v) => `> ${v}`],
  ['maximum', (v) => `≤ ${v}`], ['exclusiveMaximum', (v) => `< ${v}`],
  ['multipleOf', (v) => `a multiple of ${v}`],
  ['minLength', (v) => `at least ${v} character${v === 1 ? '' : 's'}`],
  ['maxLength', (v) => `at most ${v} character${v === 1 ? '' : 's'}`],
  ['pattern', (v) => `matches ${v}`], ['format', (v) => `format ${v}`],
  ['minItems', (v) => `at least ${v} item${v === 1 ? '' : 's'}`],
  ['maxItems', (v) => `at most ${v} item${v === 1 ? '' : 's'}`],
  ['uniqueItems', (v) => (v ? 'unique items' : '')],
  ['minProperties', (v) => `at least ${v} field${v === 1 ? '' : 's'}`],
  ['maxProperties', (v) => `at most ${v} field${v === 1 ? '' : 's'}`],
  ['const', (v) => `exactly ${JSON.stringify(v)}`],
  ['default', (v) => `default ${JSON.stringify(v)}`],
];

function fieldRules(p) {
  return RULES.filter(([key]) => p[key] !== undefined).map(([key, text]) => text(p[key]))
    .filter(Boolean).join(', ');
}

function fieldType(p) {
  if (Array.isArray(p.enum)) return `one of ${p.enum.map((x) => JSON.stringify(x)).join(', ')}`;
  return Array.isArray(p.type) ? p.type.join(' or ') : (p.type || 'any');
}

function fieldTable(schema) {
  const props = (schema && schema.properties) || {};
  const required = new Set((schema && schema.required) || []);
  const rows = Object.entries(props).map(([name, p]) => [h('code', {}, name), fieldType(p),
    required.has(name) ? 'yes' : '', p.description || '', fieldRules(p)]);
  return table(['Field', 'Type', 'Required', 'Description', 'Rules'], rows, 'No named fields.');
}

function schemaBlock(title, schema) {
  const raw = pretty(schema);
  raw.hidden = true;
  const toggle = h('button', { type: 'button', class: 'small secondary', 'aria-expanded': 'false',
    onclick: () => {
      raw.hidden = !raw.hidden;
      toggle.setAttribute('aria-expanded', String(!raw.hidden));
      toggle.textContent = raw.hidden ? 'Raw JSON' : 'Hide JSON';
    } }, 'Raw JSON');
  return h('div', { class: 'schema' }, h('h3', {}, title, ' ', toggle), fieldTable(schema), raw);
}

// An input refusal names every problem (details.inputProblems): each field shows its own,
// and the form's message lists them all. The first field's are shown last, so it keeps
// the focus; the whole message last of all, as it goes where a problem of no field goes.
function showRefusal(err, showError) {
  const problems = (err.details && err.details.inputProblems) || [];
  if (problems.length < 2) {
    showError(err.message, err.details && err.details.pointer);
    return;
  }
  const byField = new Map();
  for (const p of problems) {
    const top = `/${p.pointer.split('/')[1] || ''}`;
    if (top === '/') continue;
    byField.set(top, [...(byField.get(top) || []), p.message]);
  }
  for (const [top, messages] of [...byField].reverse()) showError(messages.join('; '), top);
  showError(err.message, null);
}

export async function toolView(main, { installId, tool: name }) {
  const detail = await api('GET', `/api/v2/apps/installs/${installId}/tools/${name}`);
  const tool = detail.tool;
  const runs = h('div');
  async function loadRuns() {
    const found = await api('GET', `/api/v2/apps/installs/${installId}/runs`, { query: { tool: name, limit: 10 } });
    clear(runs).append(runsTable(found.data, 'No runs yet.'));
  }
  append(main, [
    h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'Apps'), ' / ',
      h('a', { href: `#/installs/${installId}` }, tool.appSlug), ' / ', tool.name),
    h('h1', {}, tool.name, ' ', tool.effect === 'write' ? badge('write', 'warn') : badge('read', 'muted')),
    referenceLine(tool.reference),
    h('p', {}, tool.description),
    h('dl', { class: 'facts' },
      h('dt', {}, 'Language'), h('dd', {}, tool.language),
      h('dt', {}, 'Timeout'), h('dd', {}, ms(tool.timeoutMs)),
      h('dt', {}, 'Packages'), h('dd', {}, detail.packages.length ? detail.packages.join(', ') : 'none'),
      h('dt', {}, 'Version'), h('dd', {}, tool.version),
      h('dt', {}, 'Egress'), h('dd', {}, detail.egress.length ? detail.egress.join(', ') : 'none')),
  ]);
  if (can('member')) {
    const result = h('div', { class: 'result', 'aria-live': 'polite' });
    const form = schemaForm(tool.inputSchema, 'Run', async (input, showError) => {
      clear(result);
      const path = `/api/v2/apps/installs/${installId}/tools/${name}`;
      try {
        await api('POST', `${path}/check`, { body: { input } });
      } catch (err) {
        showRefusal(err, showError);
        return;
      }
      if (tool.effect === 'write' && !await confirmDialog(`Run ${tool.reference}?`,
        'This is a real run: it is metered, counts against the budget and makes real changes.', 'Run it')) return;
      const stop = running(result);
      try {
        const run = await api('POST', `${path}/run`, { body: { input, surface: 'test' } }).finally(stop);
        append(result, [h('p', {}, statusBadge(run.status || 'pending'), ' ',
          run.durationMs !== undefined ? ms(run.durationMs) : '', ' ',
          run.runId ? runLink(run) : `waiting for approval ${run.approvalId}`),
        run.error ? h('pre', { class: 'run-error' }, run.error) : null,
        run.output !== undefined && run.output !== null ? pretty(run.output) : null]);
        await loadRuns();
      } catch (err) {
        showRefusal(err, showError);
      }
    });
    append(main, [section('Test run', h('p', { class: 'muted' },
      'A real run of the installed version (surface test), checked against the input schema first.'), form, result)]);
  }
  append(main, [
    section('Input', schemaBlock('Input schema', tool.inputSchema)),
    section('Output', schemaBlock('Output schema', tool.outputSchema)),
    section('Last runs', runs),
  ]);
  await loadRuns();
}

// While a test run runs: a spinner and the seconds so far, in ``box``; the function it
// returns takes them away.
function running(box) {
  const started = performance.now();
  const elapsed = h('span', { class: 'elapsed' }, '0.0 s');
  const shown = h('p', { class: 'running', role: 'status' },
    h('span', { class: 'spinner', 'aria-hidden': 'true' }), ' Running… ', elapsed);
  box.append(shown);
  const timer = setInterval(() => {
    elapsed.textContent = `${((performance.now() - started) / 1000).toFixed(1)} s`;
  }, 100);
  return () => {
    clearInterval(timer);
    shown.remove();
  };
}

// --- runs --------------------------------------------------------------------------------

export async function runsView(main, { installId }, query) {
  const filters = { tool: query.get('tool') || '', status: query.get('status') || '',
    surface: query.get('surface') || '', since: query.get('since') || '' };
  const cursor = query.get('cursor');
  const found = await api('GET', `/api/v2/apps/installs/${installId}/runs`,
    { query: { ...filters, cursor, limit: 50 } });
  const runs = found.data;
  const control = (id, label, input) => h('div', { class: 'field' }, h('label', { for: id }, label), input);
  const select = (id, options, value) => h('select', { id, name: id },
    options.map((o) => h('option', { value: o, selected: o === value }, o || 'any')));
  const form = h('form', { class: 'inline filters', onsubmit: (e) => {
    e.preventDefault();
    const data = new URLSearchParams();
    for (const el of form.elements) if (el.name && el.value) data.set(el.name, el.value);
    window.location.hash = `#/installs/${installId}/runs?${data}`;
  } },
  control('tool', 'Tool', h('input', { id: 'tool', name: 'tool', value: filters.tool })),
  control('status', 'Status', select('status', ['', 'succeeded', 'failed', 'timed_out', 'running'], filters.status)),
  control('surface', 'Surface', select('surface', ['', 'app', 'chat', 'relay', 'workflow', 'api', 'cli', 'test'], filters.surface)),
  control('since', 'Since', h('input', { id: 'since', name: 'since', type: 'date', value: filters.since })),
  h('button', { type: 'submit' }, 'Filter'));
  const next = found.nextCursor
    ? h('a', { href: `#/installs/${installId}/runs?${new URLSearchParams({ ...filters, cursor: found.nextCursor })}` }, 'Older runs →')
    : null;
  append(main, [
    h('p', { class: 'crumbs' }, h('a', { href: `#/installs/${installId}` }, 'Manage'), ' / runs'),
    h('h1', {}, 'Run history'), form, runsTable(runs, 'No runs match.'), next,
  ]);
}

export async function runView(main, { runId }) {
  const detail = await api('GET', `/api/v2/runs/${runId}`);
  const run = detail.run;
  append(main, [
    h('p', { class: 'crumbs' }, h('a', { href: `#/installs/${run.installId}` }, 'Manage'), ' / ',
      h('a', { href: `#/installs/${run.installId}/runs` }, 'runs'), ' / ', run.runId),
    h('h1', {}, `Run of ${run.tool} `, statusBadge(run.status)),
    h('dl', { class: 'facts' },
      h('dt', {}, 'Duration'), h('dd', {}, ms(run.durationMs)),
      h('dt', {}, 'Version'), h('dd', {}, run.version || run.versionId),
      h('dt', {}, 'Surface'), h('dd', {}, run.surface),
      h('dt', {}, 'Who'), h('dd', {}, run.userEmail || run.userId),
      h('dt', {}, 'Started'), h('dd', {}, when(run.startedAt)),
      h('dt', {}, 'Ended'), h('dd', {}, when(run.endedAt)),
      run.errorKind ? [h('dt', {}, 'Error kind'), h('dd', {}, run.errorKind)] : null),
    detail.error ? h('pre', { class: 'run-error' }, detail.error) : null,
    detail.outputAvailable ? section('Output', pretty(detail.output))
      : h('p', { class: 'muted' }, 'The output is kept in memory for a while only, never on disk; it is no longer held.'),
    run.egress ? section('Egress', table(['Destination', 'Connections', 'Sent', 'Received', 'Refused'],
      run.egress.map((e) => [e.destination, e.connections, e.bytesSent, e.bytesReceived, e.refused || '']), '')) : null,
  ]);
}

// --- admin pages -------------------------------------------------------------------------

// The audit trail. The API filters by action (or family) and install; surface, person and
// time range are applied here, to the entries the page loaded (AUDIT_PAGE at a time).
const AUDIT_PAGE = 1000;
const SURFACES = ['', 'app', 'chat', 'relay', 'workflow', 'api', 'cli', 'test'];

export async function auditView(main, _params, query) {
  const f = Object.fromEntries(['action', 'installId', 'surface', 'person', 'since', 'until']
    .map((k) => [k, query.get(k) || '']));
  const cursor = query.get('cursor');
  const [found, emails, installs] = await Promise.all([
    api('GET', '/api/v2/audit', { query: { workspaceId: ws(), limit: AUDIT_PAGE, cursor, action: f.action, installId: f.installId } }),
    emailsById(),
    api('GET', '/api/v2/apps/installs', { query: { workspaceId: ws() } }).catch(() => ({ data: [] }))]);
  const since = f.since ? new Date(`${f.since}T00:00:00`) : null;
  const until = f.until ? new Date(`${f.until}T23:59:59.999`) : null;
  const entries = found.data.filter((e) => (!f.surface || e.surface === f.surface)
    && (!f.person || e.actorUserId === f.person)
    && (!since || new Date(e.at) >= since) && (!until || new Date(e.at) <= until));
  const verdict = h('p', { class: 'verdict', 'aria-live': 'polite' });
  const control = (id, label, input) => h('div', { class: 'field' }, h('label', { for: `audit-${id}` }, label), input);
  const select = (id, options, value) => h('select', { id: `audit-${id}`, name: id },
    options.map(([v, text]) => h('option', { value: v, selected: v === value }, text)));
  const people = [...emails.entries()].sort((a, b) => a[1].localeCompare(b[1]));
  const form = h('form', { class: 'inline filters', 'aria-label': 'Filter the audit trail', onsubmit: (e) => {
    e.preventDefault();
    const data = new URLSearchParams();
    for (const el of form.elements) if (el.name && el.value) data.set(el.name, el.value);
    window.location.hash = `#/audit?${data}`;
  } },
  control('action', 'Action', h('input', { id: 'audit-action', name: 'action', value: f.action, placeholder: 'tool, app.install…', autocomplete: 'off' })),
  control('installId', 'Install', select('installId', [['', 'any'], ...installs.data.map((i) => [i.installId, `${i.appSlug} (${i.installId})`])], f.installId)),
  control('surface', 'Surface', select('surface', SURFACES.map((x) => [x, x || 'any']), f.surface)),
  control('person', 'Person', select('person', [['', 'anyone'], ...people], f.person)),
  control('since', 'From', h('input', { id: 'audit-since', name: 'since', type: 'date', value: f.since })),
  control('until', 'To', h('input', { id: 'audit-until', name: 'until', type: 'date', value: f.until })),
  h('button', { type: 'submit' }, 'Filter'),
  Object.values(f).some(Boolean) ? h('a', { href: '#/audit' }, 'Clear') : null);
  const narrowed = entries.length !== found.data.length;
  append(main, [h('h1', {}, 'Audit trail'),
    h('p', {}, h('button', { type: 'button', onclick: async () => {
      verdict.textContent = 'Checking…';
      try {
        const v = await api('POST', '/api/v2/audit/verify', { query: { workspaceId: ws() } });
        verdict.textContent = v.ok ? `Chain intact: ${v.entries} entries verified.`
          : `Chain broken at entry ${v.firstBreak} (${v.entries} checked).`;
        verdict.className = `verdict ${v.ok ? 'ok' : 'bad'}`;
      } catch (err) {
        verdict.textContent = err.message;
      }
    } }, 'Verify chain'), ' ', verdict),
    form,
    h('p', { class: 'muted', id: 'audit-count', 'data-filters': new URLSearchParams(Object.entries(f).filter(([, v]) => v)).toString() }, narrowed
      ? `${entries.length} of the ${found.data.length} entries loaded match.` : `${entries.length} entries.`),
    table(['#', 'When', 'Action', 'Who', 'Surface', 'Tool', 'Status', 'Duration', 'Detail'], entries.map((e) =>
      [e.seq, when(e.at), e.action, emails.get(e.actorUserId) || e.actorUserId || '', e.surface || '', e.tool || '',
        e.status || e.reason || '', ms(e.durationMs),
        h('code', { class: 'detail' }, JSON.stringify(e.detail || {}))]), 'No entries match.'),
    found.nextCursor ? h('a', { href: `#/audit?${new URLSearchParams({ ...Object.fromEntries(Object.entries(f).filter(([, v]) => v)), cursor: found.nextCursor })}` }, 'Newer entries →') : null]);
}

export async function ledgerView(main, _params, query) {
  const month = query.get('month') || new Date().toISOString().slice(0, 7);
  const [found, emails] = await Promise.all([
    api('GET', '/api/v2/ledger', { query: { workspaceId: ws(), month } }), emailsById()]);
  const input = h('input', { id: 'month', name: 'month', type: 'month', value: month });
  const total = found.data.reduce((sum, r) => sum + r.sandboxMs, 0);
  append(main, [h('h1', {}, 'Usage ledger'),
    h('form', { class: 'inline', onsubmit: (e) => { e.preventDefault(); window.location.hash = `#/ledger?month=${input.value}`; } },
      h('div', { class: 'field' }, h('label', { for: 'month' }, 'Month'), input), h('button', { type: 'submit' }, 'Show'),
      h('a', { class: 'button secondary', href: `/api/v2/ledger?${new URLSearchParams({ workspaceId: ws(), month, format: 'csv' })}`, download: `runnerd-ledger-${month}.csv` }, 'Download CSV')),
    h('p', {}, `${found.data.length} runs, ${ms(total)} of sandbox time.`),
    table(['When', 'Tool', 'Run', 'Sandbox', 'Payer', 'Who'], found.data.map((r) => [when(r.createdAt), r.tool,
      r.runId ? h('a', { href: `#/runs/${r.runId}` }, r.runId) : '', ms(r.sandboxMs), `${r.payerKind} ${r.payerId}`, emails.get(r.userId) || r.userId]),
    'No usage this month.')]);
}

function keysTable(keys) {
  return table(['Name', 'Kind', 'Key', 'Owner', 'Created', srOnly('Actions')], keys.map((k) => [k.name || '(unnamed)', k.kind,
    h('code', {}, `${k.prefix}…`), k.email || 'workspace', when(k.createdAt),
    h('button', { type: 'button', class: 'small danger', 'aria-label': `Revoke ${k.prefix}…`, onclick: async () => {
      if (!await confirmDialog(`Revoke ${k.prefix}…?`, 'Programs using this key stop working at once.', 'Revoke')) return;
      await act(() => api('DELETE', `/api/v2/workspaces/${ws()}/keys/${k.keyId}`), 'Revoked');
    } }, 'Revoke')]), 'No keys.');
}

export async function peopleView(main) {
  const [members, keys] = await Promise.all([
    api('GET', `/api/v2/workspaces/${ws()}/members`),
    api('GET', `/api/v2/workspaces/${ws()}/keys`),
  ]);
  const roles = ['viewer', 'member', 'builder', 'admin'];
  const memberRows = members.data.map((m) => {
    const role = h('select', { 'aria-label': `Role of ${m.email}` }, roles.map((r) => h('option', { value: r, selected: r === m.role }, r)));
    const apps = h('input', { type: 'checkbox', checked: m.appsAccess, 'aria-label': `Apps access of ${m.email}` });
    const approver = h('input', { type: 'checkbox', checked: m.approver, 'aria-label': `Approver ${m.email}` });
    const save = () => act(() => api('PUT', `/api/v2/workspaces/${ws()}/members`,
      { body: { email: m.email, role: role.value, appsAccess: apps.checked, approver: approver.checked } }), `Saved ${m.email}`);
    role.addEventListener('change', async () => {
      if (!await confirmDialog(`Make ${m.email} ${role.value}?`,
        `${m.email} is ${m.role} now; the new role counts from their next request.`, 'Change role')) {
        role.value = m.role;
        return;
      }
      await save();
    });
    apps.addEventListener('change', save);
    approver.addEventListener('change', save);
    return [m.email, role, apps, approver];
  });
  const email = h('input', { id: 'person-email', type: 'email', required: true, autocomplete: 'off' });
  const newRole = h('select', { id: 'person-role' }, roles.map((r) => h('option', { value: r, selected: r === 'member' }, r)));
  const shown = h('div', { 'aria-live': 'polite' });
  const keysBox = h('div', { id: 'keys-list' }, keysTable(keys.data));
  const keyName = h('input', { id: 'key-name', autocomplete: 'off' });
  const keyKind = h('select', { id: 'key-kind' }, ['personal', 'workspace'].map((k) => h('option', { value: k }, k)));
  const keyEmail = h('input', { id: 'key-email', type: 'email', autocomplete: 'off', placeholder: 'you' });
  append(main, [h('h1', {}, 'People and keys'),
    section('People', table(['Email', 'Role', 'Apps module', 'Approver'], memberRows, 'No people.'),
      h('form', { class: 'inline', onsubmit: (e) => {
        e.preventDefault();
        act(() => api('PUT', `/api/v2/workspaces/${ws()}/members`, { body: { email: email.value, role: newRole.value, appsAccess: true } }), `Added ${email.value}`);
      } }, h('div', { class: 'field' }, h('label', { for: 'person-email' }, 'Email'), email),
      h('div', { class: 'field' }, h('label', { for: 'person-role' }, 'Role'), newRole),
      h('button', { type: 'submit' }, 'Add person'))),
    section('Keys', keysBox,
    h('form', { class: 'inline', onsubmit: async (e) => {
      e.preventDefault();
      try {
        const made = await api('POST', `/api/v2/workspaces/${ws()}/keys`,
          { body: { kind: keyKind.value, name: keyName.value, email: keyEmail.value || null } });
        clear(shown).append(h('div', { class: 'new-key', role: 'alert' },
          h('p', {}, 'The new key, shown this once: copy it now.'), h('code', {}, made.apiKey)));
        keyName.value = '';
        const now = await api('GET', `/api/v2/workspaces/${ws()}/keys`);
        clear(keysBox).append(keysTable(now.data));
      } catch (err) {
        clear(shown).append(errorBox(err));
      }
    } }, h('div', { class: 'field' }, h('label', { for: 'key-name' }, 'Name'), keyName),
    h('div', { class: 'field' }, h('label', { for: 'key-kind' }, 'Kind'), keyKind),
    h('div', { class: 'field' }, h('label', { for: 'key-email' }, 'For (email, personal keys)'), keyEmail),
    h('button', { type: 'submit' }, 'Create key')), shown)]);
}

// --- changes between two versions ---------------------------------------------------------

// #/apps/{slug}/diff?from=A&to=B: what going from A to B changes, with a picker of both.
export async function diffView(main, { appSlug }, query) {
  const apps = await api('GET', '/api/v2/apps', { query: { workspaceId: ws() } });
  const app = apps.data.find((a) => a.appSlug === appSlug);
  if (!app) {
    append(main, [errorBox(new Error(`No app ${appSlug} in this workspace`))]);
    return;
  }
  const versions = app.versions.map((v) => v.version);
  const to = query.get('to') || versions[versions.length - 1];
  const from = query.get('from') || versions[Math.max(0, versions.indexOf(to) - 1)];
  const picker = (id, label, value) => h('div', { class: 'field' }, h('label', { for: id }, label),
    h('select', { id, name: id.replace('diff-', '') }, versions.map((v) => h('option', { value: v, selected: v === value }, v))));
  const form = h('form', { class: 'inline', onsubmit: (e) => {
    e.preventDefault();
    window.location.hash = `#/apps/${encodeURIComponent(appSlug)}/diff?${new URLSearchParams({ from: form.elements.from.value, to: form.elements.to.value })}`;
  } }, picker('diff-from', 'From', from), picker('diff-to', 'To', to), h('button', { type: 'submit' }, 'Compare'));
  append(main, [h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'Apps'), ' / ', appSlug, ' / changes'),
    h('h1', {}, `Changes in ${app.name}`), form]);
  if (from === to) {
    append(main, [h('section', { class: 'diff card' }, h('p', { class: 'muted' }, 'Pick two different versions.'))]);
    return;
  }
  const diff = await api('GET', `/api/v2/apps/${encodeURIComponent(appSlug)}/versions/${encodeURIComponent(to)}/diff`,
    { query: { workspaceId: ws(), from } });
  append(main, [h('div', { class: 'card' }, diffSummary(diff))]);
}
