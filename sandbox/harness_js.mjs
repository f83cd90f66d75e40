// runnerd's JavaScript harness: runs inside the jail, calls the tool's run(input) once.
//
// argv: RESULT_FD
// stdin: one JSON request {"code", "file", "module", "input", "env": {NAME: VALUE}}, read
// to the end. The jail may be started before its call: it waits here, Node loaded, until
// the request arrives. The code is written to the jail's own /tmp and imported from there
// (so packages resolve from /node_modules).
// RESULT_FD: one JSON reply, {"ok": true, "output": ...} or
//            {"ok": false, "kind": "error"|"output", "type", "message", "stack"}.
// console.log and friends stay the tool's own: they are the run's logs, never the result.
import { closeSync, mkdirSync, readFileSync, writeFileSync, writeSync } from 'node:fs';
import { basename } from 'node:path';

const MAX_FRAMES = 8;
const TOOL_DIR = '/tmp/.tool/';
const [resultFd] = process.argv.slice(2);
const FRAME_FILE = /(?:file:\/\/)?\/tmp\/\.tool\/(?:[^\s:()]*\/)?([^/\s:()]+)(?=:\d)/g;
let names = new Set();
let display = '';

function stackOf(err) {
  if (!err || typeof err.stack !== 'string') return '';
  return err.stack
    .split('\n')
    .filter((line) => line.includes(TOOL_DIR))
    .slice(0, MAX_FRAMES)
    .map((line) => line.replace(FRAME_FILE, (m, name) => (names.has(name) ? display : name)))
    .join('\n');
}

function pick(mod) {
  if (typeof mod.run === 'function') return mod.run;
  if (typeof mod.default === 'function') return mod.default;
  if (mod.default && typeof mod.default.run === 'function') return mod.default.run;
  return null;
}

function write(reply) {
  const data = Buffer.from(reply);
  let offset = 0;
  while (offset < data.length) offset += writeSync(Number(resultFd), data, offset);
}

const request = JSON.parse(readFileSync(0, 'utf8'));
display = request.file;
const toolFile = TOOL_DIR + request.module;
names = new Set([basename(toolFile), basename(display)]);
Object.assign(process.env, request.env || {});
let reply;
try {
  mkdirSync(TOOL_DIR, { mode: 0o700 });
  writeFileSync(toolFile, request.code, { mode: 0o400 });
  const fn = pick(await import(toolFile));
  if (!fn) throw new TypeError('the tool exports no run function and no default-exported function');
  const output = await fn(request.input);
  try {
    const text = JSON.stringify({ ok: true, output: output === undefined ? null : output });
    reply = text;
  } catch (err) {
    reply = JSON.stringify({ ok: false, kind: 'output', type: err.name, message: err.message, stack: '' });
  }
} catch (err) {
  const isError = err instanceof Error;
  reply = JSON.stringify({
    ok: false,
    kind: 'error',
    type: isError ? err.name : typeof err,
    message: isError ? err.message : String(err),
    stack: stackOf(err),
  });
}
write(reply);
closeSync(Number(resultFd));
// Timers, sockets or promises the tool left behind must not keep the jail alive.
process.exit(0);
