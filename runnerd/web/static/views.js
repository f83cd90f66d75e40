// The screens. Each takes the main element and the route's parameters, asks the API,
// and draws. Buttons appear by the same rules the API applies; the API still decides.
import { api, can, session } from './api.js';
import { schemaForm } from './form.js';
import {
  append, badge, clear, confirmDialog, empty, errorBox, h, ms, pretty, statusBadge, table,
  toast, when,
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
    const rows = app.versions.slice().reverse().map((v) => {
      const actions = [];
      const isInstalled = install && install.versionId === v.versionId;
      if (!v.publishedAt && can('builder')) {
        actions.push(h('button', { type: 'button', class: 'small', 'data-action': 'publish',
          onclick: () => publish(app, v) }, 'Publish'));
      }
      if (v.publishedAt && !isInstalled && can('admin')) {
        actions.push(h('button', { type: 'button', class: 'small', 'data-action': 'install',
          onclick: () => (install ? switchTo(app, install, v) : installApp(app, v)) },
        install ? 'Switch to this' : 'Install'));
      }
      return [v.version, v.publishedAt ? badge('published', 'ok') : badge('draft', 'muted'),
        when(v.publishedAt || v.createdAt), v.tools.join(', '),
        isInstalled ? badge('installed', 'info') : '', actions];
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
      table(['Version', 'State', 'Date', 'Tools', '', ''], rows, 'No versions.'))]);
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

async function publish(app, version) {
  if (!await confirmDialog(`Publish ${app.appSlug} ${version.version}?`,
    'A published version can be installed; it can never change again.', 'Publish')) return;
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
    `${EVERY_CALLER} Egress granted: ${version.egress.join(', ') || 'none'}.`, 'Switch')) return;
  await act(() => api('POST', `/api/v2/apps/installs/${install.installId}/switch`,
    { body: { version: version.version } }), `Switched to ${version.version}`);
}

async function rollback(app, install, previous) {
  if (!await confirmDialog(`Roll ${app.appSlug} back from ${install.version} to ${previous.version}?`,
    EVERY_CALLER, 'Roll back')) return;
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
    h('img', { class: 'chart', src: `/manage/installs/${installId}/usage.svg`,
      alt: 'Runs per day by status, and sandbox time per day, for the last 30 days' }))]);
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
    append(box, [table(['Name', 'Last set', ''], list.data.map((s) => [h('code', {}, s.name), when(s.updatedAt),
      can('admin') ? h('button', { type: 'button', class: 'small danger', onclick: async () => {
        if (!await confirmDialog(`Delete ${s.name}?`, 'Runs of this install will no longer get it.', 'Delete')) return;
        await act(() => api('DELETE', `/api/v2/apps/installs/${install.installId}/secrets/${s.name}`), `Deleted ${s.name}`);
      } }, 'Delete') : '']), 'No secrets set.')]);
    if (can('admin')) {
      const name = h('input', { id: 'secret-name', name: 'name', required: true, pattern: '[A-Z_][A-Z0-9_]*', autocomplete: 'off' });
      const value = h('input', { id: 'secret-value', name: 'value', type: 'password', required: true, autocomplete: 'new-password' });
      const form = h('form', { class: 'inline', onsubmit: async (e) => {
        e.preventDefault();
        const secretName = name.value.trim();
        const secretValue = value.value;
        value.value = ''; // write-only: the field never keeps it
        await act(() => api('PUT', `/api/v2/apps/installs/${install.installId}/secrets/${secretName}`,
          { body: { value: secretValue } }), `Set ${secretName}`);
      } },
      h('div', { class: 'field' }, h('label', { for: 'secret-name' }, 'Name'), name),
      h('div', { class: 'field' }, h('label', { for: 'secret-value' }, 'Value (write-only)'), value),
      h('button', { type: 'submit' }, 'Set secret'));
      append(box, [form]);
    }
  });
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
    const share = limit ? Math.min(1, used / limit) : 0;
    append(box, [
      h('p', {}, `${b.month}: ${ms(b.usedMs)} used, ${ms(b.reservedMs)} reserved, `,
        limit === null ? 'no limit' : `limit ${ms(limit)}`, ` · resets ${when(b.resetsAt)}`),
      limit === null ? null : h('meter', { min: 0, max: 1, value: share, high: 0.8, optimum: 0,
        'aria-label': `Budget used: ${Math.round(share * 100)}%` }),
    ]);
    if (can('admin')) {
      const input = h('input', { id: 'budget-ms', type: 'number', min: 0, step: 1000,
        value: limit === null ? '' : limit, placeholder: 'empty: unlimited' });
      append(box, [h('form', { class: 'inline', onsubmit: async (e) => {
        e.preventDefault();
        const monthlyMs = input.value === '' ? null : Number(input.value);
        await act(() => api('PUT', `/api/v2/apps/installs/${install.installId}/budget`,
          { body: { monthlyMs } }), 'Budget set');
      } }, h('div', { class: 'field' }, h('label', { for: 'budget-ms' }, 'Monthly sandbox ms'), input),
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
        showError(err.message, err.details.pointer);
        return;
      }
      if (tool.effect === 'write' && !await confirmDialog(`Run ${tool.reference}?`,
        'This is a real run: it is metered, counts against the budget and makes real changes.', 'Run it')) return;
      try {
        const run = await api('POST', `${path}/run`, { body: { input, surface: 'test' } });
        append(result, [h('p', {}, statusBadge(run.status || 'pending'), ' ',
          run.durationMs !== undefined ? ms(run.durationMs) : '', ' ',
          run.runId ? runLink(run) : `waiting for approval ${run.approvalId}`),
        run.error ? h('pre', { class: 'run-error' }, run.error) : null,
        run.output !== undefined && run.output !== null ? pretty(run.output) : null]);
        await loadRuns();
      } catch (err) {
        showError(err.message, err.details.pointer);
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

export async function auditView(main, _params, query) {
  const cursor = query.get('cursor');
  const [found, emails] = await Promise.all([
    api('GET', '/api/v2/audit', { query: { workspaceId: ws(), limit: 200, cursor } }), emailsById()]);
  const verdict = h('p', { class: 'verdict', 'aria-live': 'polite' });
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
    table(['#', 'When', 'Action', 'Who', 'Tool', 'Status', 'Detail'], found.data.map((e) =>
      [e.seq, when(e.at), e.action, emails.get(e.actorUserId) || e.actorUserId || '', e.tool || '', e.status || e.reason || '',
        h('code', { class: 'detail' }, JSON.stringify(e.detail || {}))]), 'No entries.'),
    found.nextCursor ? h('a', { href: `#/audit?cursor=${found.nextCursor}` }, 'Newer entries →') : null]);
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
    section('Keys', table(['Name', 'Kind', 'Key', 'Owner', 'Created', ''], keys.data.map((k) => [k.name || '(unnamed)', k.kind,
      h('code', {}, `${k.prefix}…`), k.email || 'workspace', when(k.createdAt),
      h('button', { type: 'button', class: 'small danger', onclick: async () => {
        if (!await confirmDialog(`Revoke ${k.prefix}…?`, 'Programs using this key stop working at once.', 'Revoke')) return;
        await act(() => api('DELETE', `/api/v2/workspaces/${ws()}/keys/${k.keyId}`), 'Revoked');
      } }, 'Revoke')]), 'No keys.'),
    h('form', { class: 'inline', onsubmit: async (e) => {
      e.preventDefault();
      try {
        const made = await api('POST', `/api/v2/workspaces/${ws()}/keys`,
          { body: { kind: keyKind.value, name: keyName.value, email: keyEmail.value || null } });
        clear(shown).append(h('div', { class: 'new-key', role: 'alert' },
          h('p', {}, 'The new key, shown this once: copy it now.'), h('code', {}, made.apiKey)));
      } catch (err) {
        clear(shown).append(errorBox(err));
      }
    } }, h('div', { class: 'field' }, h('label', { for: 'key-name' }, 'Name'), keyName),
    h('div', { class: 'field' }, h('label', { for: 'key-kind' }, 'Kind'), keyKind),
    h('div', { class: 'field' }, h('label', { for: 'key-email' }, 'For (email, personal keys)'), keyEmail),
    h('button', { type: 'submit' }, 'Create key')), shown)]);
}
