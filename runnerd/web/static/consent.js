// The OAuth consent screen (#/consent?request=…): /oauth/authorize sends a client's
// browser here; the person, signed in as always, sees which client asks, where it sends
// them back, picks a workspace and the scopes, and allows or denies. The API answers
// where the browser goes next (the client's redirect URI, with a code or an error).
import { api, session } from './api.js';
import { append, errorBox, h } from './dom.js';

const SCOPE_TEXT = {
  'api:read': 'Read what you can read in the workspace: apps, runs and approvals, and for an admin its audit trail, usage ledger, people and key names',
  'tools:run': 'Run tools as you (write tools still ask for approval)',
};

export async function consentView(main, params, query) {
  const id = query.get('request') || '';
  const ask = await api('GET', `/api/v2/oauth/requests/${encodeURIComponent(id)}`);
  const problem = h('p', { class: 'form-error', role: 'alert' });
  const workspaces = session.info.workspaces.filter((w) => w.appsAccess);
  const picker = h('select', { id: 'consent-workspace', name: 'workspace' },
    workspaces.map((w) => h('option', { value: w.workspaceId, selected: w.workspaceId === session.workspaceId },
      `${w.name} (${w.role})`)));
  const boxes = ask.scopes.map((scope) => h('input', { type: 'checkbox', name: 'scope', value: scope, checked: true, id: `scope-${scope}` }));
  const decide = async (allow) => {
    problem.textContent = '';
    const scopes = boxes.filter((b) => b.checked).map((b) => b.value);
    try {
      const body = allow ? { allow, workspaceId: picker.value, scopes } : { allow, workspaceId: picker.value || undefined };
      const next = await api('POST', `/api/v2/oauth/requests/${encodeURIComponent(id)}/decision`, { body });
      window.location.assign(next.redirectTo);
    } catch (err) {
      problem.textContent = err.message;
    }
  };
  append(main, [h('section', { class: 'card consent', id: 'consent' },
    h('h1', {}, 'Allow access?'),
    h('p', {}, h('strong', { id: 'consent-client' }, ask.clientName || ask.clientId), ' wants to act as ',
      h('strong', {}, session.info.email), '.'),
    h('p', { class: 'muted' }, 'It sends you back to ', h('code', { id: 'consent-host' }, ask.redirectHost),
      ask.clientName ? [' · client ', h('code', {}, ask.clientId)] : null),
    workspaces.length ? h('div', { class: 'field' }, h('label', { for: 'consent-workspace' }, 'Workspace'), picker)
      : errorBox(new Error('None of your workspaces includes the Apps module.')),
    h('fieldset', { class: 'field' }, h('legend', {}, 'It may'),
      ask.scopes.map((scope, i) => h('div', {}, boxes[i], ' ',
        h('label', { for: `scope-${scope}` }, SCOPE_TEXT[scope] || scope, ' ', h('code', {}, scope))))),
    problem,
    h('div', { class: 'actions' },
      h('button', { type: 'button', class: 'secondary', id: 'consent-deny', onclick: () => decide(false) }, 'Deny'),
      h('button', { type: 'button', id: 'consent-allow', disabled: !workspaces.length, onclick: () => decide(true) }, 'Allow')))]);
}
