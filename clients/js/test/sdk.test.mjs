// The JS SDK against a live daemon. Run by tests/test_sdk.py (the README's test command),
// which starts the daemon, ships the apps and passes what they are in RUNNERD_SDK_TEST.
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { test } from 'node:test';

import { AppBridgeError, getAppClient } from '../index.js';

const world = JSON.parse(process.env.RUNNERD_SDK_TEST || 'null');
const skip = world ? false : 'RUNNERD_SDK_TEST is not set: run through pytest tests/test_sdk.py';

function client(overrides = {}) {
  return getAppClient({ url: world.url, apiKey: world.apiKey, workspaceId: world.workspaceId,
    app: 'sdk-demo', ...overrides });
}

async function refused(promise) {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof AppBridgeError, `not an AppBridgeError: ${err}`);
    return err;
  }
  assert.fail('the call was not refused');
}

test('a succeeded, a failed and a timed-out run all resolve', { skip }, async () => {
  const ok = await client().runTool('echo', { n: 3 });
  assert.equal(ok.status, 'succeeded');
  assert.deepEqual(ok.output, { echo: { n: 3 } });
  assert.match(ok.runId, /^run_/);
  assert.ok(ok.durationMs > 0);
  const failed = await client().runTool('boom', {});
  assert.equal(failed.status, 'failed');
  assert.match(failed.error, /the ledger is closed/);
  const slow = await client().runTool('sdk-demo/slow', {});
  assert.equal(slow.status, 'timed_out');
  assert.equal(slow.output, null);
});

test('every refusal rejects with its reason (code the same), envelope code and status', { skip }, async () => {
  const cases = [
    [() => client().runTool('echo', { n: 11 }), 'BAD_REQUEST', 'INVALID_INPUT', 400],
    [() => client({ app: 'sdk-broke' }).runTool('echo', {}), 'FORBIDDEN', 'budget_exhausted', 403],
    [() => client({ apiKey: world.viewerKey }).runTool('echo', {}), 'FORBIDDEN', 'INSUFFICIENT_WORKSPACE_ROLE', 403],
    [() => client({ apiKey: world.workspaceKey }).runTool('echo', {}), 'FORBIDDEN', 'WORKSPACE_KEY_NOT_ALLOWED', 403],
    [() => client().runTool('nope', {}), 'NOT_FOUND', 'TOOL_NOT_FOUND', 404],
    [() => client({ apiKey: 'rk_p_wrong' }).runTool('echo', {}), 'UNAUTHORIZED', 'UNAUTHORIZED', 401],
  ];
  for (const [call, envelopeCode, reason, status] of cases) {
    const err = await refused(call());
    assert.deepEqual([err.reason, err.code, err.envelopeCode, err.status],
      [reason, reason, envelopeCode, status]);
    assert.ok(err.message.length > 0);
  }
  const invalid = await refused(client().runTool('echo', { n: 11 }));
  assert.equal(invalid.details.pointer, '/n');
});

test('a spent budget, an invalid input and an unknown tool match err.code as the docs write it', { skip }, async () => {
  // What a user writes (docs/SDK.md, Errors): the seed's budget_exhausted, on code or reason.
  const spent = await refused(client({ app: 'sdk-broke' }).runTool('echo', {}));
  assert.ok(spent.code === 'budget_exhausted' && spent.reason === 'budget_exhausted', spent.code);
  assert.ok(typeof spent.details.resetsAt === 'string');
  const invalid = await refused(client().runTool('echo', { n: 11 }));
  assert.ok(invalid.code === 'INVALID_INPUT', invalid.code);
  const unknown = await refused(client().runTool('nope', {}));
  assert.ok(unknown.code === 'TOOL_NOT_FOUND', unknown.code);
});

test('an idempotent retry returns the first run', { skip }, async () => {
  const key = `js-${Date.now()}`;
  const first = await client().runTool('echo', { n: 1 }, { idempotencyKey: key });
  const again = await client().runTool('echo', { n: 1 }, { idempotencyKey: key });
  assert.equal(again.runId, first.runId);
  const reused = await refused(client().runTool('echo', { n: 2 }, { idempotencyKey: key }));
  assert.equal(reused.reason, 'IDEMPOTENCY_KEY_REUSED');
});

test('listTools gives the app\'s tools with their schemas', { skip }, async () => {
  const tools = await client().listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), ['boom', 'echo', 'slow']);
  const echo = tools.find((t) => t.name === 'echo');
  assert.equal(echo.reference, 'sdk-demo/echo');
  assert.equal(echo.inputSchema.properties.n.maximum, 10);
});

test('an unreachable daemon rejects as UNAVAILABLE', { skip }, async () => {
  const err = await refused(getAppClient({ url: 'http://127.0.0.1:9', apiKey: 'k', workspaceId: 'w', app: 'a' })
    .runTool('t', {}));
  assert.deepEqual([err.reason, err.code, err.envelopeCode, err.status],
    ['connection_failed', 'connection_failed', 'UNAVAILABLE', 0]);
});

test('a bare tool name needs an app', { skip }, async () => {
  await assert.rejects(client({ app: null }).runTool('echo', {}), TypeError);
});

// --- redirects: the key and the input never go to another origin ---------------------------
// A redirecting server of the test's own on 127.0.0.1, and traps (on 127.0.0.2, and on
// 127.0.0.1 at another port) that count every connection they get. No daemon is needed,
// but for the same-origin calls, which the redirector passes on (under /via/) to it.

const KEY = 'rk_p_redirect-test-key-3f9a1c';
const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function listening(server, host) {
  await new Promise((resolve) => server.listen(0, host, resolve));
  return server.address().port;
}

async function trap(host) {
  const server = net.createServer((socket) => socket.destroy());
  let count = 0;
  server.on('connection', () => { count += 1; });
  const port = await listening(server, host);
  return { port, connections: () => count, close: () => new Promise((r) => server.close(r)) };
}

async function redirectLab() {
  const lab = { route: () => null, seen: [], connections: 0 };
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const body = Buffer.concat(chunks);
    lab.seen.push({ method: req.method, path: req.url, headers: req.headers, body: body.toString() });
    const reply = (status, headers, content = '') => {
      res.writeHead(status, { Connection: 'close', ...headers });
      res.end(content);
    };
    if (req.url.startsWith('/via/') && world) {
      const keep = ['x-api-key', 'content-type', 'idempotency-key'];
      const headers = Object.fromEntries(keep.filter((k) => req.headers[k]).map((k) => [k, req.headers[k]]));
      const answer = await fetch(`${world.url}${req.url.slice(4)}`, { method: req.method, headers,
        body: req.method === 'GET' ? undefined : body });
      reply(answer.status, { 'Content-Type': 'application/json' }, await answer.text());
      return;
    }
    const found = lab.route(req.url);
    if (found === null) {
      reply(404, { 'Content-Type': 'application/json' },
        JSON.stringify({ error: { code: 'NOT_FOUND', message: 'no route', details: {} } }));
      return;
    }
    reply(found[0], { Location: found[1] });
  });
  server.on('connection', () => { lab.connections += 1; });
  lab.port = await listening(server, '127.0.0.1');
  lab.url = `http://127.0.0.1:${lab.port}`;
  lab.far = await trap('127.0.0.2');
  lab.near = await trap('127.0.0.1');
  lab.close = async () => {
    server.closeAllConnections();
    await Promise.all([new Promise((r) => server.close(r)), lab.far.close(), lab.near.close()]);
  };
  return lab;
}

const CALLS = {
  runTool: (c) => c.runTool('echo', { n: 3 }),
  listTools: (c) => c.listTools(),
};

function labClient(url, overrides = {}) {
  return getAppClient({ url, apiKey: KEY, workspaceId: 'ws_1', app: 'a', ...overrides });
}

function assertRefused(err, reason, status) {
  assert.deepEqual([err.envelopeCode, err.reason, err.code, err.status],
    ['REDIRECT_REFUSED', reason, reason, status]);
  assert.ok(!`${err.message} ${JSON.stringify(err.details)}`.includes(KEY), 'the key is in the error');
}

test('a redirect to another origin is refused and nothing is sent there', async () => {
  const lab = await redirectLab();
  try {
    const { port } = lab;
    const far = lab.far.port;
    const near = lab.near.port;
    const cases = [
      [`http://127.0.0.2:${far}/api/x`, `http://127.0.0.2:${far}`],
      [`http://127.0.0.1:${near}/api/x`, `http://127.0.0.1:${near}`],
      [`https://127.0.0.1:${near}/api/x`, `https://127.0.0.1:${near}`],
      [`https://127.0.0.1:${port}/api/x`, `https://127.0.0.1:${port}`],
      [`http://127.0.0.1:${port}@127.0.0.2:${far}/x`, `http://127.0.0.2:${far}`],
      [`//127.0.0.2:${far}/api/x`, `http://127.0.0.2:${far}`],
      [`/\\127.0.0.2:${far}/api/x`, `http://127.0.0.2:${far}`], // fetch's parser reads \ as /
      [`http://127.0.0.2.:${far}/x`, `http://127.0.0.2:${far}`],
      [`http://LOCALHOST:${near}/x`, `http://localhost:${near}`],
      [`http://127.0.0.2\t:${far}/x`, `http://127.0.0.2:${far}`], // the parser drops the tab
      ['file:///etc/passwd', 'file:'],
      ['javascript:alert(1)', 'javascript:'],
      ['data:text/plain,x', 'data:'],
    ];
    for (const [location, origin] of cases) {
      for (const status of [301, 302, 303, 307, 308]) {
        for (const [name, call] of Object.entries(CALLS)) {
          lab.route = () => [status, location];
          const before = lab.connections;
          const err = await refused(call(labClient(lab.url)));
          assertRefused(err, 'CROSS_ORIGIN_REDIRECT', status);
          assert.equal(err.details.origin, origin, `${location} ${name}`);
          assert.ok(err.message.includes(origin), err.message);
          await pause(20); // let every connection a call might have made be counted
          assert.equal(lab.connections - before, 1, `${location} ${name}: a second connection`);
        }
      }
    }
    await pause(100);
    assert.deepEqual([lab.far.connections(), lab.near.connections()], [0, 0]);
  } finally {
    await lab.close();
  }
});

test('a cross-origin hop after same-origin hops is refused', async () => {
  const lab = await redirectLab();
  try {
    lab.route = (path) => [308, path.startsWith('/next') ? `//127.0.0.2:${lab.far.port}/` : `/next${path}`];
    assertRefused(await refused(CALLS.runTool(labClient(lab.url))), 'CROSS_ORIGIN_REDIRECT', 308);
    await pause(100);
    assert.equal(lab.far.connections(), 0);
    assert.deepEqual(lab.seen.map((s) => s.method), ['POST', 'POST']);
  } finally {
    await lab.close();
  }
});

test('a host that differs only by a trailing dot is another origin', async () => {
  const lab = await redirectLab();
  try {
    lab.route = (path) => [307, `http://localhost.:${lab.port}${path}`];
    const err = await refused(CALLS.runTool(labClient(`http://localhost:${lab.port}`)));
    assertRefused(err, 'CROSS_ORIGIN_REDIRECT', 307);
    assert.equal(err.details.origin, `http://localhost.:${lab.port}`);
    assert.equal(lab.seen.length, 1);
  } finally {
    await lab.close();
  }
});

test('a redirect that would turn a run into a GET is refused', async () => {
  const lab = await redirectLab();
  try {
    for (const status of [301, 302, 303]) {
      lab.route = (path) => [status, `/via${path}`];
      assertRefused(await refused(CALLS.runTool(labClient(lab.url))), 'REDIRECT_CHANGES_METHOD', status);
    }
    assert.deepEqual(lab.seen.map((s) => s.method), ['POST', 'POST', 'POST']);
  } finally {
    await lab.close();
  }
});

test('a Location that is no URL is refused', async () => {
  const lab = await redirectLab();
  try {
    lab.route = () => [307, 'http://[::1'];
    for (const call of Object.values(CALLS)) {
      assertRefused(await refused(call(labClient(lab.url))), 'BAD_REDIRECT', 307);
    }
    assert.equal(lab.seen.length, 2);
  } finally {
    await lab.close();
  }
});

test('a browser\'s opaque redirect, or a fetch that followed one itself, is refused', async () => {
  const opaque = async () => ({ type: 'opaqueredirect', status: 0, redirected: false, url: '',
    headers: new Headers(), body: null });
  for (const call of Object.values(CALLS)) {
    assertRefused(await refused(call(labClient('http://127.0.0.1:9', { fetch: opaque }))), 'OPAQUE_REDIRECT', 0);
  }
  const followed = async () => new Proxy(new Response('{"data": []}', { status: 200 }), {
    get: (target, prop) => (prop === 'redirected' ? true : prop === 'url' ? 'http://127.0.0.2:9/x'
      : typeof target[prop] === 'function' ? target[prop].bind(target) : target[prop]),
  });
  const err = await refused(CALLS.listTools(labClient('http://127.0.0.1:9', { fetch: followed })));
  assertRefused(err, 'CROSS_ORIGIN_REDIRECT', 200);
  assert.equal(err.details.origin, 'http://127.0.0.2:9');
});

test('a same-origin redirect keeps the key and the input', { skip }, async () => {
  const lab = await redirectLab();
  try {
    const cases = [['runTool', [307, 308]], ['listTools', [301, 302, 303, 307, 308]]];
    for (const [name, statuses] of cases) {
      for (const status of statuses) {
        // A host spelled in another case is the same origin.
        lab.route = (path) => [status, `http://LocalHost:${lab.port}/via${path}`];
        const found = await CALLS[name](client({ url: `http://localhost:${lab.port}` }));
        if (name === 'runTool') {
          assert.equal(found.status, 'succeeded');
          assert.deepEqual(found.output, { echo: { n: 3 } });
        } else {
          assert.deepEqual(found.map((t) => t.name).sort(), ['boom', 'echo', 'slow']);
        }
        const last = lab.seen.at(-1);
        assert.ok(last.path.startsWith('/via/api/v2/apps/tools') && last.path.includes('workspaceId='));
        assert.equal(last.headers['x-api-key'], world.apiKey);
        if (name === 'runTool') assert.deepEqual(JSON.parse(last.body).input, { n: 3 });
      }
    }
  } finally {
    await lab.close();
  }
});

test('redirects are followed at most five hops', { skip }, async () => {
  const chain = (hops) => (path) => {
    const found = /^\/hop(\d+)(\/.*)$/.exec(path);
    const [done, rest] = found ? [Number(found[1]), found[2]] : [0, path];
    return [307, done + 1 < hops ? `/hop${done + 1}${rest}` : `/via${rest}`];
  };
  const lab = await redirectLab();
  try {
    lab.route = chain(5);
    assert.equal((await CALLS.runTool(client({ url: lab.url }))).status, 'succeeded');
    assert.equal(lab.seen.length, 6); // the call and its five hops
    lab.route = chain(6);
    for (const call of Object.values(CALLS)) {
      const err = await refused(call(client({ url: lab.url })));
      assertRefused(err, 'TOO_MANY_REDIRECTS', 307);
      assert.equal(err.details.hops, 5);
    }
    assert.equal(lab.seen.length, 6 + 6 * 2);
    assert.ok(!lab.seen.slice(6).some((s) => s.path.startsWith('/via')));
  } finally {
    await lab.close();
  }
});
