// submit.js - the job submit form. Every change is checked by the server
// (POST /v1/jobs:validate, the same rules as a submit) while the user types;
// each error is shown next to its field, and errors for fields without an
// input next to the extra-JSON box. Only filled-in fields are sent, so the
// server's defaults apply to the rest.

import { api, ApiError } from './api.js';
import { el, debounce } from './util.js';

// The form's groups: [legend, [[path, label, kind, options, hint], ...]].
// kind: text | int | num | bool | select | list.
const GROUPS = [
  ['Job', [
    ['name', 'name', 'text', null, 'letters, digits, - and _'],
    ['output_dir', 'output dir', 'text', null, 'runs/<name>'],
    ['max_restarts', 'max restarts', 'int'],
  ]],
  ['Model', [
    ['model_path', 'model path', 'text', null, 'dir with config.json + safetensors'],
    ['init_from_scratch', 'init from scratch', 'bool'],
    ['dtype', 'dtype', 'select', ['', 'float32', 'bfloat16', 'float16']],
    ['device', 'device', 'select', ['', 'auto', 'cpu', 'cuda']],
  ]],
  ['Parallelism', [
    ['world_size', 'world size', 'int', null, 'ranks'],
    ['allocation_mode', 'allocation mode', 'text', null, 'static or fsdp:d<N>'],
    ['fsdp.memory_efficient_load', 'memory-efficient load', 'bool'],
    ['fsdp.bucket_mb', 'staging bucket (MiB)', 'int'],
  ]],
  ['LoRA', [
    ['use_lora', 'LoRA', 'bool'],
    ['lora_rank', 'rank', 'int'],
    ['lora_alpha', 'alpha', 'num'],
    ['target_modules', 'target modules', 'list', null, 'q_proj, v_proj or all-linear'],
    ['merge_adapter', 'merge into output_dir/merged', 'bool'],
  ]],
  ['Data', [
    ['data.path', 'data path', 'text'],
    ['data.format', 'format', 'select', ['', 'text', 'u16', 'u32']],
    ['data.seq_len', 'sequence length', 'int'],
  ]],
  ['Training', [
    ['train.steps', 'steps', 'int'],
    ['train.micro_batch_size', 'micro-batch', 'int'],
    ['train.grad_accum', 'grad accumulation', 'int'],
    ['train.lr', 'learning rate', 'num'],
    ['train.warmup_steps', 'warmup steps', 'int'],
    ['train.weight_decay', 'weight decay', 'num'],
    ['train.grad_clip', 'grad clip', 'num'],
    ['train.seed', 'seed', 'int'],
    ['train.checkpoint_every', 'checkpoint every', 'int'],
    ['gradient_checkpointing', 'gradient checkpointing', 'bool'],
  ]],
];

// Keeps what was typed while the user looks at other pages of this tab.
let draft = { values: {}, extra: '' };

function setPath(obj, path, value) {
  const parts = path.split('.');
  let o = obj;
  for (const p of parts.slice(0, -1)) o = o[p] = o[p] && typeof o[p] === 'object' ? o[p] : {};
  o[parts[parts.length - 1]] = value;
}

function deepMerge(into, from) {
  for (const [k, v] of Object.entries(from)) {
    if (v && typeof v === 'object' && !Array.isArray(v) && into[k] && typeof into[k] === 'object')
      deepMerge(into[k], v);
    else into[k] = v;
  }
  return into;
}

// A value as typed: numbers that do not parse are sent as the text, so the
// server names the field ("must be an integer, got ...").
function typed(kind, raw) {
  if (kind === 'int' || kind === 'num') {
    const n = Number(raw);
    return raw.trim() !== '' && isFinite(n) ? n : raw;
  }
  if (kind === 'list') {
    const items = raw.split(',').map((s) => s.trim()).filter(Boolean);
    return items.length === 1 && items[0] === 'all-linear' ? 'all-linear' : items;
  }
  return raw;
}

// A random Idempotency-Key (crypto.randomUUID needs a secure context; a
// server reached over plain HTTP off loopback is not one).
function randomKey() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

export function mountSubmit(root) {
  const inputs = new Map();  // path -> {input, err, kind}
  let seq = 0;               // validation requests sent; only the newest counts
  let idemKey = randomKey();

  const form = el('form', { class: 'spec', id: 'submit-form', novalidate: true,
                            onsubmit: (e) => { e.preventDefault(); submit(); } });
  for (const [legend, fields] of GROUPS) {
    const set = el('fieldset', {}, el('legend', {}, legend));
    form.append(set);
    for (const [path, label, kind, options, hint] of fields)
      addField(set, path, label, kind, options, hint);
  }

  function addField(set, path, label, kind, options, hint) {
    const id = 'f-' + path.replace(/\./g, '-');
    let input;
    if (kind === 'bool') {
      input = el('select', { id, name: path },
        el('option', { value: '' }, 'default'), el('option', { value: 'true' }, 'yes'),
        el('option', { value: 'false' }, 'no'));
    } else if (kind === 'select') {
      input = el('select', { id, name: path },
        options.map((o) => el('option', { value: o }, o || 'default')));
    } else {
      input = el('input', { id, name: path, type: 'text', autocomplete: 'off', spellcheck: 'false',
                            inputmode: kind === 'int' ? 'numeric' : kind === 'num' ? 'decimal' : null,
                            placeholder: hint || '' });
    }
    if (draft.values[path] !== undefined) input.value = draft.values[path];
    const err = el('div', { class: 'field-error', id: id + '-error', role: 'alert' });
    input.setAttribute('aria-describedby', err.id);
    inputs.set(path, { input, err, kind });
    set.append(el('div', { class: 'field', dataset: { field: path } },
                  el('label', { for: id, title: path }, label), input, err));
  }
  const extra = el('textarea', { id: 'f-extra', rows: 3, spellcheck: 'false',
                                 placeholder: '{"model": {"hidden_size": 256, ...}}' });
  extra.value = draft.extra;
  const extraErr = el('div', { class: 'field-error', id: 'f-extra-error', role: 'alert' });
  form.append(el('div', { class: 'field full' },
    el('label', { for: 'f-extra' }, 'extra fields (JSON, merged over the form)'), extra, extraErr));

  const verdict = el('p', { class: 'verdict', id: 'verdict', role: 'status' });
  const normalized = el('pre', { class: 'spec-json', id: 'normalized' });
  const preview = el('details', { class: 'full', hidden: true },
                     el('summary', {}, 'the spec as the server would run it'), normalized);
  const submitBtn = el('button', { type: 'submit', class: 'primary', id: 'submit-btn' }, 'Submit');
  form.append(el('div', { class: 'row full' }, verdict, el('span', { class: 'grow' }), submitBtn),
              preview);
  root.replaceChildren(el('section', { class: 'card' }, el('h1', {}, 'New job'),
    el('p', { class: 'muted small' }, 'Fields left empty take the server\'s defaults. ' +
      'The spec is checked as you type, with the same rules as a submit.'), form));

  // The spec as the form describes it; throws a message for bad extra JSON.
  function spec() {
    const s = {};
    draft.values = {};
    for (const [path, { input, kind }] of inputs) {
      draft.values[path] = input.value;
      if (input.value.trim() === '') continue;
      setPath(s, path, kind === 'bool' ? input.value === 'true' : typed(kind, input.value));
    }
    draft.extra = extra.value;
    if (extra.value.trim()) {
      let x;
      try { x = JSON.parse(extra.value); } catch (e) { throw new Error('not JSON: ' + e.message); }
      if (!x || typeof x !== 'object' || Array.isArray(x)) throw new Error('must be a JSON object');
      deepMerge(s, x);
    }
    return s;
  }

  // The input a detail's field path belongs to: itself, its list ("x[2]"),
  // or its nearest parent with an input.
  function inputFor(field) {
    let f = (field || '').replace(/\[\d+\]$/, '');
    while (f) {
      if (inputs.has(f)) return inputs.get(f);
      const dot = f.lastIndexOf('.');
      f = dot < 0 ? '' : f.slice(0, dot);
    }
    return null;
  }

  function showErrors(details, message) {
    preview.hidden = true;
    const per = new Map();
    const rest = [];
    for (const d of details) {
      const target = inputFor(d.field);
      if (target) {
        if (!per.has(target)) per.set(target, []);
        per.get(target).push(d.field && !inputs.has(d.field) ? d.field + ': ' + d.message
                                                              : d.message);
      } else {
        rest.push((d.field ? d.field + ': ' : '') + d.message);
      }
    }
    for (const t of inputs.values()) {
      const msgs = per.get(t) || [];
      t.err.textContent = msgs.join('; ');
      t.input.classList.toggle('invalid', msgs.length > 0);
      t.input.setAttribute('aria-invalid', msgs.length > 0 ? 'true' : 'false');
    }
    extraErr.textContent = rest.join('; ');
    extra.classList.toggle('invalid', rest.length > 0);
    const n = details.length;
    verdict.className = 'verdict ' + (n || message ? 'bad' : 'good');
    verdict.textContent = n ? n + (n === 1 ? ' problem' : ' problems') + ' to fix'
                        : message || '✓ valid: the server would accept this job';
  }

  async function validate() {
    const my = ++seq;
    let s;
    try { s = spec(); } catch (e) {
      extraErr.textContent = e.message;
      verdict.className = 'verdict bad';
      verdict.textContent = 'the extra fields are not a JSON object';
      return;
    }
    verdict.className = 'verdict';
    verdict.textContent = 'checking…';
    try {
      const r = await api('POST', '/v1/jobs:validate', s);
      if (my !== seq) return;
      showErrors([]);
      normalized.textContent = JSON.stringify(r.spec, null, 2);
      preview.hidden = false;
    } catch (e) {
      if (my !== seq) return;
      if (e instanceof ApiError && e.status === 400) showErrors(e.details.length ? e.details
        : [{ field: '', message: e.message }]);
      else showErrors([], 'cannot check: ' + e.message);
    }
  }
  const validateSoon = debounce(validate, 250);
  form.addEventListener('input', () => { idemKey = randomKey(); validateSoon(); });
  form.addEventListener('change', validateSoon);

  async function submit() {
    let s;
    try { s = spec(); } catch (e) { extraErr.textContent = e.message; return; }
    submitBtn.disabled = true;
    try {
      // The same key for the same form contents: a double submit makes one job.
      const job = await api('POST', '/v1/jobs', s, { headers: { 'Idempotency-Key': idemKey } });
      location.hash = '#/jobs/' + encodeURIComponent(job.id);
    } catch (e) {
      if (e instanceof ApiError && e.details.length) showErrors(e.details);
      else showErrors([], 'not submitted: ' + e.message);
    } finally {
      submitBtn.disabled = false;
    }
  }

  if (Object.values(draft.values).some((v) => v) || draft.extra) validate();
  return () => { seq++; };
}
