// runnerd's JavaScript harness: runs inside the jail, calls the tool's run(input) once.
//
// argv: RESULT_FD TOOL_FILE DISPLAY_PATH
// stdin: one JSON request {"input": ..., "env": {NAME: VALUE}}, read to the end.
// RESULT_FD: one JSON reply, {"ok": true, "output": ...} or
//            {"ok": false, "kind": "error"|"output", "type", "message", "stack"}.
// console.log and friends stay the tool's own: they are the run's logs, never the result.
import { readFileSync, writeSync } from 'node:fs';
import { basename } from 'node:path';

const MAX_FRAMES = 8;
const [resultFd, toolFile, display] = process.argv.slice(2);
const names = new Set([basename(toolFile), basename(display)]);
const FRAME_FILE = /(?:file:\/\/)?\/tool\/(?:[^\s:()]*\/)?([^/\s:()]+)(?=:\d)/g;

function stackOf(err) {
  if (!err || typeof err.stack !== 'string') return '';
  return err.stack
    .split('\n')
    .filter((line) => line.includes('/tool/'))
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
Object.assign(process.env, request.env || {});
let reply;
try {
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
// Timers, sockets or promises the tool left behind must not keep the jail alive.
process.exit(0);
