// The test-run form, generated from a tool's input schema: one control per top-level
// property (text, number, checkbox, select), an editable JSON field for nested objects
// and arrays, required marks, defaults and descriptions from the schema, and a raw-JSON
// mode for the whole input.
import { h } from './dom.js';

let counter = 0;

function kindOf(prop) {
  if (Array.isArray(prop.enum)) return 'enum';
  const type = Array.isArray(prop.type) ? prop.type.find((t) => t !== 'null') : prop.type;
  if (['string', 'number', 'integer', 'boolean'].includes(type)) return type;
  return 'json';
}

function control(name, prop, required) {
  const id = `f${(counter += 1)}`;
  const kind = kindOf(prop);
  const described = prop.description ? `${id}-hint` : null;
  const common = { id, name, 'aria-describedby': [described, `${id}-error`].filter(Boolean).join(' ') };
  if (required) common['aria-required'] = 'true';
  let input;
  if (kind === 'boolean') {
    input = h('input', { ...common, type: 'checkbox', checked: prop.default === true });
  } else if (kind === 'enum') {
    // An empty first choice, required or not: a required field without a default is left
    // for the person to pick (the input check names it if they do not), never pre-picked.
    const picked = prop.enum.some((v) => v === prop.default);
    input = h('select', common,
      h('option', { value: '', selected: !picked }, required ? 'Choose…' : '(none)'),
      prop.enum.map((v) => h('option', { value: JSON.stringify(v), selected: picked && v === prop.default }, String(v))));
  } else if (kind === 'json') {
    input = h('textarea', { ...common, rows: 3, class: 'mono', spellcheck: 'false',
      placeholder: prop.type === 'array' ? '[ ]' : '{ }' },
      prop.default === undefined ? '' : JSON.stringify(prop.default, null, 2));
  } else {
    const numeric = kind === 'number' || kind === 'integer';
    input = h('input', { ...common, type: numeric ? 'number' : 'text',
      step: kind === 'integer' ? '1' : numeric ? 'any' : null,
      min: prop.minimum, max: prop.maximum, maxlength: prop.maxLength,
      value: prop.default === undefined ? '' : String(prop.default) });
  }
  const field = h('div', { class: `field ${kind === 'boolean' ? 'check' : ''}`, 'data-pointer': `/${name}` },
    h('label', { for: id }, name, required ? h('span', { class: 'req', 'aria-hidden': 'true' }, ' *') : null,
      h('span', { class: 'type' }, ` ${kind === 'enum' ? 'one of' : kind === 'json' ? (prop.type || 'JSON') : kind}`)),
    input,
    prop.description ? h('p', { class: 'hint', id: described }, prop.description) : null,
    h('p', { class: 'field-error', id: `${id}-error` }));
  return { name, kind, input, field, required };
}

export function schemaForm(schema, submitLabel, onSubmit) {
  const properties = (schema && schema.properties) || {};
  const required = new Set((schema && schema.required) || []);
  const controls = Object.entries(properties).map(([name, prop]) => control(name, prop || {}, required.has(name)));
  const raw = h('textarea', { class: 'mono raw', rows: 10, spellcheck: 'false', 'aria-label': 'Input as JSON', hidden: true });
  const rawError = h('p', { class: 'field-error', role: 'alert' });
  const rawToggle = h('input', { type: 'checkbox', id: `raw${(counter += 1)}` });
  const fields = h('div', { class: 'fields' }, controls.map((c) => c.field),
    controls.length ? null : h('p', { class: 'muted' }, 'This tool takes no named fields; use raw JSON for anything else.'));
  const status = h('p', { class: 'form-error', role: 'alert' });
  const button = h('button', { type: 'submit' }, submitLabel);
  const form = h('form', { class: 'schema-form', novalidate: true },
    h('div', { class: 'field check' }, rawToggle, h('label', { for: rawToggle.id }, 'Raw JSON')),
    fields, raw, rawError, status, h('div', { class: 'actions' }, button));

  function collect() {
    const value = {};
    for (const c of controls) {
      if (c.kind === 'boolean') {
        value[c.name] = c.input.checked;
        continue;
      }
      const text = c.input.value;
      if (text === '') {
        continue;
      }
      if (c.kind === 'number' || c.kind === 'integer') value[c.name] = Number(text);
      else if (c.kind === 'enum') value[c.name] = JSON.parse(text);
      else if (c.kind === 'json') {
        try {
          value[c.name] = JSON.parse(text);
        } catch (err) {
          throw Object.assign(new Error(`not JSON: ${err.message}`), { pointer: `/${c.name}` });
        }
      } else value[c.name] = text;
    }
    return value;
  }

  rawToggle.addEventListener('change', () => {
    if (rawToggle.checked) {
      try {
        raw.value = JSON.stringify(collect(), null, 2);
      } catch {
        raw.value = '{}';
      }
    }
    raw.hidden = !rawToggle.checked;
    fields.hidden = rawToggle.checked;
  });

  function clearErrors() {
    for (const el of form.querySelectorAll('.field-error, .form-error')) el.textContent = '';
    for (const el of form.querySelectorAll('[aria-invalid]')) el.removeAttribute('aria-invalid');
  }

  // Show a refusal next to the field its JSON pointer names (or above the button).
  function showError(message, pointer) {
    const top = pointer ? `/${pointer.split('/')[1] || ''}` : null;
    const c = !rawToggle.checked && top && controls.find((x) => `/${x.name}` === top);
    if (c) {
      c.field.querySelector('.field-error').textContent = message;
      c.input.setAttribute('aria-invalid', 'true');
      c.input.focus();
    } else if (rawToggle.checked) {
      rawError.textContent = message;
    } else {
      status.textContent = message;
    }
  }

  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clearErrors();
    let value;
    try {
      value = rawToggle.checked ? JSON.parse(raw.value || '{}') : collect();
    } catch (err) {
      showError(err.message, err.pointer);
      return;
    }
    button.disabled = true;
    try {
      await onSubmit(value, showError);
    } finally {
      button.disabled = false;
    }
  });
  return form;
}
