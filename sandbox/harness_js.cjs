// runnerd's JavaScript harness: runs inside the jail, calls the tool's run(input) once.
//
// argv: RESULT_FD [waiting]  (waiting: started ahead of its call, in the warm pool, for
//       tools with packages: the ES module loader is set up meanwhile)
// stdin: one JSON request {"code", "file", "module", "input", "env": {NAME: VALUE}}, read
// to the end. The jail may be started before its call: it waits here, Node loaded, until
// the request arrives. The code is written to the jail's own /tmp and loaded from there
// (so packages resolve from /node_modules): required when it is CommonJS (.cjs), else
// imported.
// RESULT_FD: one JSON reply, {"ok": true, "output": ...} or
//            {"ok": false, "kind": "error"|"output", "type", "message", "stack"},
//            after its length in bytes and a newline (the daemon answers once it has
//            them all, without waiting for the jail to end).
// console.log and friends stay the tool's own: they are the run's logs, never the result.
'use strict';

const { closeSync, mkdirSync, readFileSync, unlinkSync, writeFileSync, writeSync } = require('node:fs');
const { basename } = require('node:path');

const MAX_FRAMES = 8;
const TOOL_DIR = '/tmp/.tool/';
const [resultFd, mode] = process.argv.slice(2);
const FRAME_FILE = /(?:file:\/\/)?\/tmp\/\.tool\/(?:[^\s:()]*\/)?([^/\s:()]+)(?=:\d)/g;
let names = new Set();
let request = {};
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

// What the jail's own network answers: it has only lo, and no resolver.
const NO_NETWORK = new Set(['ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN']);

// fetch says only 'fetch failed'; what failed is in its cause (a refusal, a TLS error).
function messageOf(err) {
  let message = String(err.message);
  let offline = NO_NETWORK.has(err.code);
  let cause = err.cause;
  for (let depth = 0; cause && depth < 3; depth += 1, cause = cause.cause) {
    message += ` (cause: ${cause instanceof Error ? cause.message : String(cause)})`;
    offline ||= NO_NETWORK.has(cause.code);
  }
  if (offline) {
    message += request.egress
      ? ' [runnerd: the jail has no network of its own; use fetch, or connect through the egress proxy in HTTPS_PROXY]'
      : ' [runnerd: this run has no network: a tool reaches another system only through egress its app lists in agentserve.app.yaml and its install grants]';
  }
  return message;
}

function pick(mod) {
  if (mod === null || mod === undefined) return null; // module.exports = null, required
  if (typeof mod.run === 'function') return mod.run;
  if (typeof mod === 'function') return mod; // module.exports = fn, required
  if (typeof mod.default === 'function') return mod.default;
  if (mod.default && typeof mod.default.run === 'function') return mod.default.run;
  return null;
}

function write(reply) {
  const body = Buffer.from(reply);
  const data = Buffer.concat([Buffer.from(`${body.length}\n`), body]);
  let offset = 0;
  while (offset < data.length) offset += writeSync(Number(resultFd), data, offset);
}

// Egress: the jail has only lo. Relay 127.0.0.1:PORT (what HTTP_PROXY names) to the
// daemon's proxy socket, and give global fetch (whose Node 20 and 24 versions ignore
// proxy variables) a dispatcher that tunnels every connection through the proxy.
async function egress({ socket, token }) {
  const net = require('node:net');
  const server = net.createServer((inner) => {
    const outer = net.connect(socket);
    inner.pipe(outer);
    outer.pipe(inner);
    inner.on('error', () => outer.destroy());
    outer.on('error', () => inner.destroy());
  });
  await new Promise((ok, fail) => {
    server.once('error', fail);
    server.listen(0, '127.0.0.1', ok);
  });
  server.unref();
  const url = `http://run:${token}@127.0.0.1:${server.address().port}`;
  for (const name of ['HTTP_PROXY', 'HTTPS_PROXY', 'http_proxy', 'https_proxy']) process.env[name] = url;
  for (const name of ['NO_PROXY', 'no_proxy', 'ALL_PROXY', 'all_proxy']) delete process.env[name];
  const auth = 'Basic ' + Buffer.from(`run:${token}`).toString('base64');
  let tls = null;

  // undici's connector: a CONNECT tunnel through the proxy socket, TLS inside it for
  // https (NODE_EXTRA_CA_CERTS, set by the tool, is read at each connection).
  function connect(opts, callback) {
    const https = opts.protocol === 'https:';
    const port = opts.port || (https ? 443 : 80);
    const bare = String(opts.hostname).replace(/^\[(.*)\]$/, '$1'); // an IPv6 URL's host has brackets
    const host = net.isIPv6(bare) ? `[${bare}]` : bare;
    const raw = net.connect(socket);
    let settled = false;
    const fail = (err) => {
      if (settled) return;
      settled = true;
      raw.destroy();
      callback(err, null);
    };
    let head = Buffer.alloc(0);
    const onData = (chunk) => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end === -1) {
        if (head.length > 16384) fail(new Error('the egress proxy sent no answer'));
        return;
      }
      raw.off('data', onData);
      const line = head.subarray(0, head.indexOf('\r\n')).toString('latin1');
      if (!/^HTTP\/1\.[01] 200 /.test(line)) {
        const err = new Error(`${host}:${port}: ${line.replace(/^HTTP\/1\.[01] /, '')}`);
        err.code = 'EGRESS_REFUSED';
        fail(err);
        return;
      }
      const rest = head.subarray(end + 4);
      if (rest.length) raw.unshift(rest);
      raw.off('error', fail);
      if (!https) {
        settled = true;
        callback(null, raw);
        return;
      }
      let ca;
      const extra = process.env.NODE_EXTRA_CA_CERTS;
      if (extra) {
        try {
          ca = [...tls.rootCertificates, readFileSync(extra, 'utf8')];
        } catch {}
      }
      // The certificate is checked against the destination the tunnel names, whatever
      // undici passes as servername: a name is sent as SNI and checked against the
      // certificate's names; an IP address (SNI cannot carry one) against its IP SANs.
      const destination = bare;
      const secure = tls.connect({
        socket: raw,
        host: destination,
        servername: net.isIP(destination) ? undefined : destination,
        checkServerIdentity: (_, cert) => tls.checkServerIdentity(destination, cert),
        ALPNProtocols: ['http/1.1'],
        ca,
      });
      secure.once('secureConnect', () => {
        if (settled) return;
        settled = true;
        secure.off('error', fail);
        callback(null, secure);
      });
      secure.once('error', fail);
    };
    raw.once('error', fail);
    raw.on('data', onData);
    raw.once('connect', () =>
      raw.write(`CONNECT ${host}:${port} HTTP/1.1\r\nHost: ${host}:${port}\r\nProxy-Authorization: ${auth}\r\n\r\n`),
    );
  }

  const original = globalThis.fetch;
  if (typeof original !== 'function') return;
  tls = require('node:tls');
  let installed = false;
  globalThis.fetch = function fetch(input, init) {
    if (!installed) {
      installed = true;
      void globalThis.Response; // loads Node's undici, which sets its global dispatcher
      for (const name of ['undici.globalDispatcher.1', 'undici.globalDispatcher.2']) {
        const current = globalThis[Symbol.for(name)];
        if (current && typeof current.constructor === 'function') {
          globalThis[Symbol.for(name)] = new current.constructor({ connect });
        }
      }
    }
    return original.call(this, input, init);
  };
}

async function main() {
  // A waiting jail for tools with packages pays the ESM loader's one-time set-up (about
  // 2 ms) before its call comes, not after; tools without packages are mostly CommonJS
  // (compiled at upload) and are required. (This file is CommonJS: an ES module as
  // Node's entry costs about 8 ms more of every jail's start.)
  if (mode === 'waiting') {
    const warm = '/tmp/.warm.mjs';
    writeFileSync(warm, 'export function run(i) { return { n: i.n } }\n', { mode: 0o400 });
    JSON.stringify({ ok: true, output: (await import(warm)).run(JSON.parse('{"n":1}')) });
    unlinkSync(warm);
  }

  request = JSON.parse(readFileSync(0, 'utf8'));
  display = request.file;
  const toolFile = TOOL_DIR + request.module;
  names = new Set([basename(toolFile), basename(display)]);
  Object.assign(process.env, request.env || {});
  if (request.egress) await egress(request.egress);
  let reply;
  try {
    mkdirSync(TOOL_DIR, { mode: 0o700 });
    writeFileSync(toolFile, request.code, { mode: 0o400 });
    const fn = pick(toolFile.endsWith('.cjs') ? require(toolFile) : await import(toolFile));
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
      message: isError ? messageOf(err) : String(err),
      stack: stackOf(err),
    });
  }
  write(reply);
  closeSync(Number(resultFd));
  // Timers, sockets or promises the tool left behind must not keep the jail alive.
  process.exit(0);
}

main();
