// The JS SDK against a live daemon. Run by tests/test_sdk.py (the README's test command),
// which starts the daemon, ships the apps and passes what they are in RUNNERD_SDK_TEST.
import assert from 'node:assert/strict';
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

test('every refusal rejects with its code, reason and status', { skip }, async () => {
  const cases = [
    [() => client().runTool('echo', { n: 11 }), 'BAD_REQUEST', 'INVALID_INPUT', 400],
    [() => client({ app: 'sdk-broke' }).runTool('echo', {}), 'FORBIDDEN', 'budget_exhausted', 403],
    [() => client({ apiKey: world.viewerKey }).runTool('echo', {}), 'FORBIDDEN', 'INSUFFICIENT_WORKSPACE_ROLE', 403],
    [() => client({ apiKey: world.workspaceKey }).runTool('echo', {}), 'FORBIDDEN', 'WORKSPACE_KEY_NOT_ALLOWED', 403],
    [() => client().runTool('nope', {}), 'NOT_FOUND', 'TOOL_NOT_FOUND', 404],
    [() => client({ apiKey: 'rk_p_wrong' }).runTool('echo', {}), 'UNAUTHORIZED', 'UNAUTHORIZED', 401],
  ];
  for (const [call, code, reason, status] of cases) {
    const err = await refused(call());
    assert.deepEqual([err.code, err.reason, err.status], [code, reason, status]);
    assert.ok(err.message.length > 0);
  }
  const invalid = await refused(client().runTool('echo', { n: 11 }));
  assert.equal(invalid.details.pointer, '/n');
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
  assert.deepEqual([err.code, err.reason, err.status], ['UNAVAILABLE', 'connection_failed', 0]);
});

test('a bare tool name needs an app', { skip }, async () => {
  await assert.rejects(client({ app: null }).runTool('echo', {}), TypeError);
});
