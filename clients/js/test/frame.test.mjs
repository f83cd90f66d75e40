// The frame's side of the app bridge (frame.js): the messages getAppClient() posts to the
// page that opened the frame, and how it reads the answers. Two windows of the test's own
// stand for the frame and the Manage page; the page's real side (runnerd/web/static/
// bridge.js) is proven in a browser by tests/test_app_bridge.py.
import assert from 'node:assert/strict';
import { mock, test } from 'node:test';

import { AppBridgeError as FrameBridgeError, getAppClient as frameClient } from '../frame.js';
import { AppBridgeError, getAppClient } from '../index.js';

const MANAGE = 'http://127.0.0.1:8686';

// A window: addEventListener('message') and postMessage, delivering a structured clone
// (as browsers do) with the sender as event.source, a task later.
function fakeWindow(name) {
  const listeners = new Set();
  const win = {
    name,
    parent: null,
    addEventListener(type, fn) { if (type === 'message') listeners.add(fn); },
    removeEventListener(type, fn) { listeners.delete(fn); },
    deliver(data, source) {
      for (const fn of [...listeners]) fn({ data, source, origin: 'null' });
    },
    listeners: () => listeners.size,
  };
  win.parent = win;
  return win;
}

// A frame inside a page; the page records each message and answers through `page.reply`.
function embedded({ ancestorOrigins = [MANAGE] } = {}) {
  const page = fakeWindow('page');
  const frame = fakeWindow('frame');
  frame.parent = page;
  frame.location = { ancestorOrigins };
  page.sent = [];
  page.postMessage = (data, targetOrigin) => {
    page.sent.push({ data: structuredClone(data), targetOrigin });
  };
  page.reply = (data, source = page) => frame.deliver(structuredClone(data), source);
  page.last = () => page.sent.at(-1).data;
  return { page, frame, client: frameClient({ window: frame }) };
}

const settled = () => new Promise((resolve) => setImmediate(resolve));

async function refused(promise) {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof AppBridgeError, `not an AppBridgeError: ${err}`);
    return err;
  }
  assert.fail('the call was not refused');
}

test('runTool posts one message to the parent, to the page\'s origin', async () => {
  const { page, client } = embedded();
  const done = client.runTool('score_offer', { discountPct: 12 });
  assert.equal(page.sent.length, 1);
  assert.deepEqual(page.sent[0], {
    data: { runnerd: 1, id: 1, method: 'runTool', params: { name: 'score_offer', input: { discountPct: 12 } } },
    targetOrigin: MANAGE,
  });
  page.reply({ runnerd: 1, id: 1, result: { runId: 'run_1', status: 'succeeded', output: { score: 89 },
    error: null, durationMs: 41, outputAvailable: true } });
  assert.deepEqual(await done, { runId: 'run_1', status: 'succeeded', output: { score: 89 },
    error: null, durationMs: 41 });
});

test('without ancestorOrigins (not Chromium) the message goes to "*"', async () => {
  const { page, client } = embedded({ ancestorOrigins: null });
  const done = client.listTools();
  assert.equal(page.sent[0].targetOrigin, '*');
  assert.deepEqual(page.sent[0].data, { runnerd: 1, id: 1, method: 'listTools', params: {} });
  page.reply({ runnerd: 1, id: 1, result: [] });
  assert.deepEqual(await done, []);
});

test('a failed and a timed-out run resolve with their status and error', async () => {
  const { page, client } = embedded();
  const failed = client.runTool('boom', {});
  const slow = client.runTool('deal-desk/slow', {});
  assert.deepEqual(page.sent.map((s) => s.data.id), [1, 2]);
  // Answers come in any order; each settles its own call.
  page.reply({ runnerd: 1, id: 2, result: { runId: 'run_2', status: 'timed_out', output: null,
    error: 'the tool ran out of time (1000 ms)', durationMs: 1003 } });
  page.reply({ runnerd: 1, id: 1, result: { runId: 'run_1', status: 'failed', output: null,
    error: 'ValueError: the ledger is closed', durationMs: 30 } });
  assert.deepEqual(await failed, { runId: 'run_1', status: 'failed', output: null,
    error: 'ValueError: the ledger is closed', durationMs: 30 });
  assert.equal((await slow).status, 'timed_out');
});

test('a refusal rejects with an AppBridgeError: its code, status and details', async () => {
  const { page, client } = embedded();
  const cases = [
    [{ code: 'INVALID_INPUT', message: '/n: must be <= 10', details: { code: 'INVALID_INPUT', pointer: '/n' }, status: 400 }],
    [{ code: 'budget_exhausted', message: 'the budget is spent', details: { code: 'budget_exhausted' }, status: 403 }],
    [{ code: 'PENDING_APPROVAL', message: 'held for approval', details: { approvalId: 'apr_1', expiresAt: '2026-12-04T00:00:00Z' }, status: 202 }],
    [{ code: 'OTHER_APP_REFUSED', message: 'not this app', details: {}, status: 403 }],
  ];
  for (const [error] of cases) {
    const done = client.runTool('echo', { n: 11 });
    page.reply({ runnerd: 1, id: page.last().id, error });
    const err = await refused(done);
    assert.ok(err instanceof FrameBridgeError); // one class, whichever module it came from
    assert.equal(err.name, 'AppBridgeError');
    assert.deepEqual([err.code, err.reason, err.envelopeCode, err.status, err.message],
      [error.code, error.code, error.code, error.status, error.message]);
    assert.deepEqual(err.details, error.details);
  }
  // A malformed error still rejects, with what can be read of it.
  const done = client.runTool('echo', {});
  page.reply({ runnerd: 1, id: page.last().id, error: { code: 7, details: 'x' } });
  const err = await refused(done);
  assert.deepEqual([err.code, err.status, err.details], ['BRIDGE_ERROR', 0, {}]);
});

test('only the parent\'s answers of the right shape are read', async () => {
  const { page, frame, client } = embedded();
  const done = client.runTool('echo', {});
  const forged = { runnerd: 1, id: 1, result: { runId: 'run_forged', status: 'succeeded' } };
  page.reply(forged, fakeWindow('another frame')); // another window: not the parent
  page.reply(forged, frame); // the frame itself
  page.reply(forged, null);
  for (const bad of [null, 'text', [1], { runnerd: 2, id: 1, result: {} }, { runnerd: 1, id: '1', result: {} },
    { runnerd: 1, id: 99, result: {} }, { runnerd: 1, id: 1 }]) {
    page.reply(bad);
  }
  let state = 'waiting';
  done.then(() => { state = 'settled'; }, () => { state = 'settled'; });
  await settled();
  assert.equal(state, 'waiting');
  page.reply({ runnerd: 1, id: 1, result: { runId: 'run_real', status: 'succeeded', output: {}, error: null, durationMs: 5 } });
  assert.equal((await done).runId, 'run_real');
  page.reply({ runnerd: 1, id: 1, error: { code: 'LATE', message: 'late' } }); // settled already: ignored
  await settled();
});

test('outside a frame getAppClient() rejects with NO_BRIDGE and posts nothing', async () => {
  const top = fakeWindow('top');
  top.postMessage = () => assert.fail('posted to itself');
  const err = await refused(frameClient({ window: top }).runTool('echo', {}));
  assert.deepEqual([err.code, err.status], ['NO_BRIDGE', 0]);
  assert.match(err.message, /url, apiKey, workspaceId/);
  const none = await refused(frameClient({ window: undefined }).listTools());
  assert.equal(none.code, 'NO_BRIDGE');
});

test('an input the browser cannot copy rejects with BAD_MESSAGE', async () => {
  const { page, client } = embedded();
  const err = await refused(client.runTool('echo', { f: () => 1 }));
  assert.equal(err.code, 'BAD_MESSAGE');
  assert.equal(page.sent.length, 0);
  await assert.rejects(client.runTool('', {}), TypeError);
});

test('no answer within the tool\'s timeout and a margin rejects with BRIDGE_TIMEOUT', async (t) => {
  mock.timers.enable({ apis: ['setTimeout'] });
  t.after(() => mock.timers.reset());
  const { page, client } = embedded();
  const pending = (promise) => {
    const seen = { state: 'waiting' };
    promise.then(() => { seen.state = 'resolved'; }, (err) => { seen.state = 'rejected'; seen.err = err; });
    return seen;
  };
  // Before listTools the SDK knows no timeout: the longest a tool may have (300 s), plus 30 s.
  const unknown = pending(client.runTool('echo', {}));
  mock.timers.tick(329999);
  await settled();
  assert.equal(unknown.state, 'waiting');
  mock.timers.tick(1);
  await settled();
  assert.equal(unknown.state, 'rejected');
  assert.deepEqual([unknown.err.code, unknown.err.status, unknown.err.details], ['BRIDGE_TIMEOUT', 0, { timeoutMs: 330000 }]);
  // listTools teaches it each tool's own, by name and by reference.
  const listed = client.listTools();
  page.reply({ runnerd: 1, id: page.last().id, result: [
    { name: 'echo', reference: 'demo/echo', timeoutMs: 1000 }] });
  await listed;
  for (const name of ['echo', 'demo/echo']) {
    const known = pending(client.runTool(name, {}));
    mock.timers.tick(30999);
    await settled();
    assert.equal(known.state, 'waiting');
    mock.timers.tick(1);
    await settled();
    assert.equal(known.err.code, 'BRIDGE_TIMEOUT');
    assert.equal(known.err.details.timeoutMs, 31000);
  }
  const given = pending(client.runTool('echo', {}, { timeoutMs: 50 }));
  mock.timers.tick(50);
  await settled();
  assert.equal(given.err.code, 'BRIDGE_TIMEOUT');
  // A late answer to a call that timed out is dropped.
  page.reply({ runnerd: 1, id: 1, result: { runId: 'run_late', status: 'succeeded' } });
  await settled();
});

test('an aborted call rejects with the signal\'s reason; a late answer is dropped', async () => {
  const { page, client } = embedded();
  const control = new AbortController();
  const done = client.runTool('echo', {}, { signal: control.signal });
  control.abort(new Error('the person left'));
  await assert.rejects(done, /the person left/);
  page.reply({ runnerd: 1, id: 1, result: { runId: 'run_1', status: 'succeeded' } });
  const before = page.sent.length;
  await assert.rejects(client.listTools({ signal: control.signal }), /the person left/);
  assert.equal(page.sent.length, before); // an aborted signal sends nothing
});

test('the package\'s getAppClient() with no arguments is the frame\'s client', async (t) => {
  const { page, frame } = embedded();
  globalThis.window = frame;
  t.after(() => { delete globalThis.window; });
  const client = getAppClient();
  const done = client.runTool('echo', { n: 1 });
  assert.deepEqual(page.last(), { runnerd: 1, id: 1, method: 'runTool', params: { name: 'echo', input: { n: 1 } } });
  page.reply({ runnerd: 1, id: 1, result: { runId: 'run_1', status: 'succeeded', output: { n: 1 }, error: null, durationMs: 3 } });
  assert.equal((await done).runId, 'run_1');
  assert.equal(frame.listeners(), 1); // one listener per client, whatever the calls
  // The server client still wants its URL, key and workspace.
  assert.throws(() => getAppClient({}), /url, apiKey and workspaceId/);
  assert.throws(() => getAppClient(null), /url, apiKey and workspaceId/);
});
