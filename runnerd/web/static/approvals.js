// The Approvals screen: write calls waiting for a person (and their history), the held
// input to those who may decide it, rendered with the tool's input schema; for admins,
// who approves each app's relay calls, and the workspace's webhook. Every value goes in
// as text (dom.js h): nothing a call holds is ever parsed as HTML.
import { api, can, session } from './api.js';
import { append, clear, empty, errorBox, h, pretty, srOnly, when } from './dom.js';
import { act, emailsById, section } from './views.js';

const ws = () => session.workspaceId;
const STATUSES = ['pending', 'approved', 'denied', 'expired'];
const RULE_ROLES = ['admin', 'builder', 'member'];

// One row per property of the tool's input schema (its title, else its name, and its
// description), then any property the schema does not name; strings, numbers and
// booleans as text, objects and arrays as formatted JSON.
function heldInput(value, schema) {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return h('div', { class: 'held-input' }, pretty(value));
  }
  const props = (schema && typeof schema.properties === 'object' && schema.properties) || {};
  const names = [...Object.keys(props).filter((k) => k in value),
    ...Object.keys(value).filter((k) => !(k in props))];
  return h('dl', { class: 'held-input facts' }, names.map((name) => {
    const about = props[name] || {};
    const v = value[name];
    const shown = v !== null && typeof v === 'object' ? pretty(v) : h('span', { class: 'value' }, String(v));
    return [h('dt', { title: name }, typeof about.title === 'string' ? about.title : name),
      h('dd', {}, shown, typeof about.description === 'string' ? h('div', { class: 'muted' }, about.description) : null)];
  }));
}

function approvalRows(found, status, emails) {
  const decide = (a, verb, done) => act(() => api('POST', `/api/v2/approvals/${a.approvalId}/${verb}`), done);
  const headers = ['Approval', 'App', 'Tool', 'Asked by', 'Surface', 'Asked', status === 'pending' ? 'Expires' : 'Outcome', srOnly('Decide')];
  if (!found.data.length) return empty(status === 'pending' ? 'No write calls are waiting.' : `No ${status} approvals.`);
  // One tbody per approval: its row, and below it (to a decider) the input it holds.
  const bodies = found.data.map((a) => h('tbody', { 'data-approval': a.approvalId },
    h('tr', {}, [
      a.approvalId, a.appSlug ? `${a.appSlug} ${a.version || ''}` : a.installId, a.tool,
      a.requestedByEmail || emails.get(a.requestedBy) || a.requestedBy, a.surface, when(a.createdAt),
      status === 'pending' ? when(a.expiresAt) : [a.status, a.decidedAt ? [' ', when(a.decidedAt)] : '',
        a.decidedBy ? ` by ${emails.get(a.decidedBy) || a.decidedBy}` : '', a.runId ? [' ', h('a', { href: `#/runs/${a.runId}` }, 'run')] : ''],
      a.mayDecide ? [
        h('button', { type: 'button', class: 'small', onclick: () => decide(a, 'approve', 'Approved') }, 'Approve'), ' ',
        h('button', { type: 'button', class: 'small danger', onclick: () => decide(a, 'deny', 'Denied') }, 'Deny')] : '',
    ].map((c) => h('td', {}, c))),
    a.input !== undefined ? h('tr', { class: 'held' }, h('td', { colspan: headers.length },
      h('div', { class: 'muted' }, 'Input'), heldInput(a.input, a.inputSchema))) : null));
  return h('div', { class: 'table-wrap', tabindex: 0 }, h('table', { class: 'approvals' },
    h('thead', {}, h('tr', {}, headers.map((x) => h('th', { scope: 'col' }, x)))), bodies));
}

// Who approves each installed app's write calls from relays (admins): roles and people;
// no rule is the workspace default (approvers and admins).
async function rulesSection() {
  const [installs, rules, members] = await Promise.all([
    api('GET', '/api/v2/apps/installs', { query: { workspaceId: ws() } }),
    api('GET', `/api/v2/workspaces/${ws()}/approval-rules`),
    api('GET', `/api/v2/workspaces/${ws()}/members`),
  ]);
  const ruleOf = new Map(rules.data.map((r) => [r.appSlug, r]));
  const deciders = members.data.filter((m) => m.role !== 'viewer' && m.appsAccess);
  const path = (slug) => `/api/v2/workspaces/${ws()}/approval-rules/${slug}`;
  const rows = installs.data.map((install) => {
    const slug = install.appSlug;
    const rule = ruleOf.get(slug);
    const roles = RULE_ROLES.map((r) => h('label', { class: 'check' },
      h('input', { type: 'checkbox', value: r, checked: Boolean(rule && rule.roles.includes(r)), 'aria-label': `${r}s approve ${slug}` }), ` ${r}s `));
    const people = h('select', { multiple: true, 'aria-label': `People who approve ${slug}` },
      deciders.map((m) => h('option', { value: m.userId, selected: Boolean(rule && rule.userIds.includes(m.userId)) }, m.email)));
    const save = () => act(() => api('PUT', path(slug), { body: {
      roles: roles.map((l) => l.firstChild).filter((c) => c.checked).map((c) => c.value),
      userIds: [...people.selectedOptions].map((o) => o.value) } }), `Saved who approves ${slug}`);
    return h('tr', { 'data-rule-app': slug }, [
      h('td', {}, slug),
      h('td', {}, rule ? 'this rule' : 'default: approvers and admins'),
      h('td', {}, roles), h('td', {}, people),
      h('td', {}, h('button', { type: 'button', class: 'small', onclick: save }, 'Save'), ' ',
        rule ? h('button', { type: 'button', class: 'small secondary', onclick: () => act(() => api('DELETE', path(slug)), `${slug} uses the default`) }, 'Use default') : null),
    ]);
  });
  return section('Who approves',
    h('p', { class: 'muted' }, 'Who may approve an app\'s write calls from relays. An app\'s rule replaces the workspace default (people with the approver flag, and admins); from chat, the person who asked always decides.'),
    rows.length ? h('div', { class: 'table-wrap', tabindex: 0 }, h('table', {},
      h('thead', {}, h('tr', {}, ['App', 'Now', 'Roles', 'People', srOnly('Actions')].map((x) => h('th', { scope: 'col' }, x)))),
      h('tbody', {}, rows))) : empty('No apps installed.'));
}

// The workspace's webhook (admins): told when an approval waits; its secret shown once.
async function webhookSection() {
  let hook = null;
  try {
    hook = await api('GET', `/api/v2/workspaces/${ws()}/webhook`);
  } catch (err) {
    if (err.status !== 404) throw err;
  }
  const url = h('input', { id: 'webhook-url', type: 'url', value: hook ? hook.url : '', placeholder: 'https://…', autocomplete: 'off' });
  const shown = h('div', { 'aria-live': 'polite' });
  const path = `/api/v2/workspaces/${ws()}/webhook`;
  return section('Notify',
    h('p', { class: 'muted' }, 'A webhook that hears when an approval waits: a signed POST, retried (docs/GOVERNANCE.md). It never carries the input.'),
    h('form', { class: 'inline', onsubmit: async (e) => {
      e.preventDefault();
      try {
        const made = await api('PUT', path, { body: { url: url.value } });
        clear(shown).append(made.secret ? h('div', { class: 'new-key', role: 'alert' },
          h('p', {}, 'The signing secret, shown this once: copy it now.'), h('code', {}, made.secret)) : h('p', {}, 'Saved.'));
      } catch (err) {
        clear(shown).append(errorBox(err));
      }
    } }, h('div', { class: 'field' }, h('label', { for: 'webhook-url' }, 'Webhook URL'), url),
    h('button', { type: 'submit' }, 'Save webhook'),
    hook ? h('button', { type: 'button', class: 'secondary', onclick: () => act(() => api('DELETE', path), 'Webhook removed') }, 'Remove') : null),
    shown);
}

export async function approvalsView(main, _params, query) {
  const status = STATUSES.includes(query.get('status')) ? query.get('status') : 'pending';
  const [found, emails] = await Promise.all([
    api('GET', '/api/v2/approvals', { query: { workspaceId: ws(), status } }), emailsById()]);
  const tabs = h('p', { class: 'tabs' }, STATUSES.map((s) => [s === status ? h('strong', {}, s)
    : h('a', { href: `#/approvals?status=${s}` }, s), ' ']));
  append(main, [h('h1', {}, 'Approvals'),
    h('p', { class: 'muted' }, 'Write calls from chat agents and relays wait here for a decision: from chat, the person who asked decides; from a relay, the people the app\'s rule names, else an approver or an admin. Only they see the input.'),
    tabs, approvalRows(found, status, emails)]);
  if (can('admin', false)) append(main, [await rulesSection(), await webhookSection()]);
}
