// The official MCP TypeScript SDK 1.x client (StreamableHTTPClientTransport), driven by
// tests/test_mcp_typescript.py one JSON line at a time: each line read on stdin is a
// command, each answer one JSON line on stdout. Nothing is printed but the answers.
//
//   {"op": "connect", "url": ..., "key": ..., "elicit": null | "accept" | "decline"}
//       -> {protocolVersion, sessionId, listChanged}   (elicit null: no elicitation
//          capability declared; otherwise the form is answered so). With "command",
//          "args" and "env" instead of url and key: over stdio, that command's.
//   {"op": "list"}                                    -> {tools}
//   {"op": "call", "name": ..., "arguments": {...}}   -> {result} or {thrown}
//   {"op": "wait", "ms": N}  -> {changed}: the tools/list_changed notifications seen
//                               so far, once there is one or N ms passed
//   {"op": "close"}                                   -> {}
// Every answer carries `asked`: the messages of the elicitation forms the server sent.
import readline from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import {
  ElicitRequestSchema,
  ToolListChangedNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";

let client = null;
let transport = null;
const asked = [];
const changed = [];

async function connect({ url, key, elicit, command, args, env }) {
  const capabilities = elicit ? { elicitation: { form: {} } } : {};
  client = new Client({ name: "runnerd-ts-test", version: "1.0.0" }, { capabilities });
  if (elicit) {
    client.setRequestHandler(ElicitRequestSchema, async (request) => {
      asked.push(request.params.message);
      if (elicit === "accept") return { action: "accept", content: { confirm: true } };
      return { action: "decline" };
    });
  }
  client.setNotificationHandler(ToolListChangedNotificationSchema, (notification) => {
    changed.push(notification.method);
  });
  transport = command
    ? new StdioClientTransport({ command, args, env })
    : new StreamableHTTPClientTransport(new URL(url), {
        requestInit: { headers: { Authorization: `Bearer ${key}` } },
      });
  await client.connect(transport);
  return {
    protocolVersion: transport.protocolVersion ?? null,
    sessionId: transport.sessionId ?? null,
    listChanged: client.getServerCapabilities()?.tools?.listChanged ?? false,
  };
}

async function call({ name, arguments: args }) {
  try {
    return { result: await client.callTool({ name, arguments: args }) };
  } catch (error) {
    return { thrown: `${error?.name}: ${error?.message}` };
  }
}

async function wait({ ms }) {
  const deadline = Date.now() + ms;
  while (changed.length === 0 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  return { changed: [...changed] };
}

const ops = {
  connect,
  call,
  wait,
  list: async () => ({ tools: (await client.listTools()).tools }),
  close: async () => {
    await client?.close();
    return {};
  },
};

const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  const command = JSON.parse(line);
  let answer;
  try {
    answer = await ops[command.op](command);
  } catch (error) {
    answer = { error: `${error?.name}: ${error?.message}` };
  }
  process.stdout.write(`${JSON.stringify({ ...answer, asked: [...asked] })}\n`);
  if (command.op === "close") break;
}
process.exit(0);
