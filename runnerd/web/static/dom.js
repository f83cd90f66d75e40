// Small DOM helpers. Every text goes in as a text node: nothing the API returns is ever
// parsed as HTML.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else if (key === 'class') el.className = value;
    else if (key === 'value') el.value = value;
    else if (key === 'checked') el.checked = Boolean(value);
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

// A date as the viewer's locale writes it, in a <time> whose title is the ISO text.
export function when(iso) {
  if (!iso) return '';
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return iso;
  return h('time', { datetime: iso, title: iso }, date.toLocaleString());
}

export function ms(value) {
  if (value === null || value === undefined) return '';
  return value >= 10000 ? `${(value / 1000).toFixed(1)} s` : `${value} ms`;
}

// Sandbox time always in seconds (a budget and its parts in one unit), in the locale.
export function seconds(value) {
  if (value === null || value === undefined) return '';
  const s = value / 1000;
  return `${s.toLocaleString(undefined, { maximumFractionDigits: s < 10 ? 2 : 1 })} s`;
}

// Text a screen reader reads and the eye does not see (a column of buttons' header).
export function srOnly(text) {
  return h('span', { class: 'sr-only' }, text);
}

export function badge(text, kind) {
  return h('span', { class: `badge ${kind || ''}` }, text);
}

export function statusBadge(status) {
  const kinds = { succeeded: 'ok', failed: 'bad', timed_out: 'warn', running: 'info',
                  pending: 'info', approved: 'ok', denied: 'bad', expired: 'muted' };
  return badge(status.replace('_', ' '), kinds[status] || '');
}

export function empty(text) {
  return h('p', { class: 'empty' }, text);
}

export function errorBox(err) {
  return h('div', { class: 'error', role: 'alert' }, err.message || String(err));
}

// Formatted JSON; focusable, so a keyboard can scroll it when it overflows.
export function pretty(value) {
  return h('pre', { class: 'json', tabindex: 0 }, JSON.stringify(value, null, 2));
}

export function toast(text) {
  const box = document.getElementById('toast');
  box.textContent = text;
  box.classList.add('shown');
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => box.classList.remove('shown'), 2500);
}

// A confirmation dialog (``more``: nodes shown below the text); resolves true or false.
export function confirmDialog(title, text, action = 'Confirm', more = null) {
  return new Promise((resolve) => {
    const dialog = h('dialog', { class: 'confirm', 'aria-labelledby': 'confirm-title' },
      h('h2', { id: 'confirm-title' }, title),
      h('p', {}, text), more,
      h('div', { class: 'actions' },
        h('button', { type: 'button', class: 'secondary', onclick: () => dialog.close('no') }, 'Cancel'),
        h('button', { type: 'button', class: 'danger', onclick: () => dialog.close('yes') }, action)));
    dialog.addEventListener('close', () => {
      dialog.remove();
      resolve(dialog.returnValue === 'yes');
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}

// A table; a header may be a node (srOnly). Its wrapper scrolls sideways on a narrow
// screen, and is focusable so a keyboard can scroll it too.
export function table(headers, rows, emptyText) {
  if (!rows.length) return empty(emptyText);
  return h('div', { class: 'table-wrap', tabindex: 0 },
    h('table', {},
      h('thead', {}, h('tr', {}, headers.map((x) => h('th', { scope: 'col' }, x)))),
      h('tbody', {}, rows.map((cells) => h('tr', {}, cells.map((c) => h('td', {}, c)))))));
}
