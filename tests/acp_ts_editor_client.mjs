// The official ACP TypeScript SDK as an editor with terminals (run by tests/test_acp_editor_sdk.py).
//
// node acp_ts_editor_client.mjs MODEL_A MODEL_B STORE CWD   (PYTHON: the interpreter; run from the SDK's install directory)
//
// Spawns `python -m trio_harness acp --model A --model B` twice (a session, then its load), implements
// terminal/* by running the command, and checks every message the agent sends against the SDK's zod
// schemas (besides the checks the SDK's own connection makes).  Prints one JSON summary line, with
// every raw message of both connections ("wire") for the test to check against the SDK's schema.json.

import { spawn } from "node:child_process";
import path from "node:path";
import { Readable, Writable } from "node:stream";
import { fileURLToPath, pathToFileURL } from "node:url";

// This script runs from the directory holding node_modules (ES modules resolve packages from there).
const sdkRoot = path.join(path.dirname(fileURLToPath(import.meta.url)), "node_modules", "@agentclientprotocol", "sdk");
const acp = await import("@agentclientprotocol/sdk");
const z = await import(pathToFileURL(path.join(sdkRoot, "dist/v1/schema/zod.gen.js")).href);

const [first, second, store, cwd] = process.argv.slice(2);
const python = process.env.PYTHON || "python3";

const RESPONSES = {
  initialize: z.zInitializeResponse,
  "session/new": z.zNewSessionResponse,
  "session/load": z.zLoadSessionResponse,
  "session/prompt": z.zPromptResponse,
  "session/set_config_option": z.zSetSessionConfigOptionResponse,
  "session/set_mode": z.zSetSessionModeResponse,
  "session/close": z.zCloseSessionResponse,
};
const REQUESTS = {
  "session/request_permission": z.zRequestPermissionRequest,
  "terminal/create": z.zCreateTerminalRequest,
  "terminal/output": z.zTerminalOutputRequest,
  "terminal/wait_for_exit": z.zWaitForTerminalExitRequest,
  "terminal/kill": z.zKillTerminalRequest,
  "terminal/release": z.zReleaseTerminalRequest,
};
const NOTIFICATIONS = { "session/update": z.zSessionNotification };

const summary = { schemaErrors: [], validated: 0, wire: [] };
let run = 0; // which server process (0: the session, 1: its load)

function check(schema, value, what) {
  if (schema === undefined) {
    summary.schemaErrors.push(`no schema for ${what}`);
    return;
  }
  const parsed = schema.safeParse(value);
  summary.validated += 1;
  if (!parsed.success) summary.schemaErrors.push(`${what}: ${parsed.error.message} in ${JSON.stringify(value)}`);
}

// A stream whose every message is checked: agent requests, notifications and responses to our requests.
function checkedStream(child) {
  const raw = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  const sent = new Map();
  const outgoing = new TransformStream({
    transform(message, controller) {
      summary.wire.push({ run, from: "client", message });
      if (message.method !== undefined && message.id !== undefined) sent.set(message.id, message.method);
      controller.enqueue(message);
    },
  });
  outgoing.readable.pipeTo(raw.writable).catch(() => {});
  const incoming = raw.readable.pipeThrough(
    new TransformStream({
      transform(message, controller) {
        summary.wire.push({ run, from: "agent", message }); // the test checks each against schema.json
        if (message.jsonrpc !== "2.0") summary.schemaErrors.push(`not JSON-RPC 2.0: ${JSON.stringify(message)}`);
        if (message.method !== undefined && message.id !== undefined) {
          check(REQUESTS[message.method], message.params, `request ${message.method}`);
        } else if (message.method !== undefined) {
          check(NOTIFICATIONS[message.method], message.params, `notification ${message.method}`);
        } else if ("result" in message) {
          const method = sent.get(message.id);
          check(RESPONSES[method], message.result, `response to ${method}`);
        }
        controller.enqueue(message);
      },
    }),
  );
  return { writable: outgoing.writable, readable: incoming };
}

function editor(record) {
  const terminals = new Map();
  const finish = (id) => terminals.get(id).exited;
  return acp
    .client({ name: "trio-harness-test-editor" })
    .onNotification("session/update", ({ params }) => {
      record.updates.push(params.update);
    })
    .onRequest("session/request_permission", () => {
      record.log.push("session/request_permission");
      return { outcome: { outcome: "selected", optionId: "allow_once" } };
    })
    .onRequest("terminal/create", ({ params }) => {
      record.log.push("terminal/create");
      const child = spawn(params.command, params.args ?? [], { cwd: params.cwd ?? undefined });
      const id = `t${terminals.size + 1}`;
      const entry = { output: "", released: false, child };
      child.stdout.on("data", (chunk) => (entry.output += chunk));
      child.stderr.on("data", (chunk) => (entry.output += chunk));
      entry.exited = new Promise((resolve) => child.on("close", (code, signal) => resolve({ exitCode: code, signal })));
      terminals.set(id, entry);
      record.terminals.push(entry);
      return { terminalId: id };
    })
    .onRequest("terminal/wait_for_exit", async ({ params }) => {
      record.log.push("terminal/wait_for_exit");
      return await finish(params.terminalId);
    })
    .onRequest("terminal/output", async ({ params }) => {
      record.log.push("terminal/output");
      const status = await finish(params.terminalId);
      return { output: terminals.get(params.terminalId).output, truncated: false, exitStatus: status };
    })
    .onRequest("terminal/kill", ({ params }) => {
      record.log.push("terminal/kill");
      terminals.get(params.terminalId).child.kill("SIGKILL");
      return {};
    })
    .onRequest("terminal/release", ({ params }) => {
      record.log.push("terminal/release");
      terminals.get(params.terminalId).released = true;
      return {};
    });
}

async function withAgent(record, op) {
  const child = spawn(
    python,
    ["-m", "trio_harness", "acp", "--model", first, "--model", second, "--store", store, "--tools", "bash,plan"],
    { cwd, stdio: ["pipe", "pipe", "inherit"] },
  );
  const closed = new Promise((resolve) => child.on("close", resolve));
  try {
    return await editor(record).connectWith(checkedStream(child), op);
  } finally {
    child.stdin.end();
    await closed;
  }
}

const textOf = (updates) =>
  updates
    .filter((u) => u.sessionUpdate === "agent_message_chunk")
    .map((u) => u.content.text)
    .join("");
const prompt = (ctx, sessionId, text) =>
  ctx.request("session/prompt", { sessionId, prompt: [{ type: "text", text }] });
const initialize = (ctx) =>
  ctx.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: { terminal: true } });

let record = { updates: [], log: [], terminals: [] };
let sessionId;
await withAgent(record, async (ctx) => {
  await initialize(ctx);
  const created = await ctx.request("session/new", { cwd, mcpServers: [] });
  sessionId = created.sessionId;
  summary.configOptions = created.configOptions;
  let start = record.updates.length;
  summary.statusStop = (await prompt(ctx, sessionId, "/status")).stopReason;
  summary.status = textOf(record.updates.slice(start));
  summary.work = (await prompt(ctx, sessionId, "plan and check")).stopReason;
  const values = created.configOptions.find((o) => o.id === "model").options.map((o) => o.value);
  const changed = await ctx.request("session/set_config_option", {
    sessionId,
    configId: "model",
    value: values[1],
  });
  summary.changed = changed.configOptions;
  start = record.updates.length;
  await prompt(ctx, sessionId, "and now?");
  summary.afterSwitch = textOf(record.updates.slice(start));
});
summary.live = record.updates;
summary.log = record.log;
summary.released = record.terminals.map((t) => t.released);

record = { updates: [], log: [], terminals: [] };
run = 1;
await withAgent(record, async (ctx) => {
  await initialize(ctx);
  const loaded = await ctx.request("session/load", { sessionId, cwd, mcpServers: [] });
  summary.loadedOptions = loaded.configOptions;
  summary.replayed = [...record.updates];
  const start = record.updates.length;
  await prompt(ctx, sessionId, "after load");
  summary.afterLoad = textOf(record.updates.slice(start));
});
console.log(JSON.stringify(summary));
