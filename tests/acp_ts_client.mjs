// An ACP client on the official TypeScript SDK (@agentclientprotocol/sdk), which validates every
// session/update and every agent-to-client request with its zod schemas before a handler sees it.
// It holds an unsaved buffer, serves fs/read_text_file and fs/write_text_file, allows every
// permission, and prints one JSON summary line (tests/test_acp_ts_sdk.py runs it with node).
//
//   node acp_ts_client.mjs SDK_DIR PYTHON FIRST_MODEL SECOND_MODEL STORE CWD BUFFER_PATH

import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const [sdkDir, python, firstModel, secondModel, store, cwd, bufferPath] = process.argv.slice(2);
const sdk = `${sdkDir}/node_modules/@agentclientprotocol/sdk/dist/v1`;
const acp = await import(pathToFileURL(`${sdk}/stable/acp.js`).href);
// The SDK checks what the agent sends unasked (updates, requests); the answers to the client's
// requests are checked here with the same generated zod schemas (a mismatch throws: exit 1).
const z = await import(pathToFileURL(`${sdk}/schema/zod.gen.js`).href);

// Every raw line each side sent, for the test to check against the official JSON schema, message by message.
const wire = [];

function startAgent(model) {
  const child = spawn(python, ["-m", "trio_harness", "acp", "--model", model, "--store", store, "--tools", "files"], {
    cwd,
    env: process.env,
    stdio: ["pipe", "pipe", "inherit"],
  });
  const run = wire.length;
  let pending = "";
  child.stdout.on("data", (chunk) => {
    pending += chunk.toString("utf8");
    const lines = pending.split("\n");
    pending = lines.pop();
    for (const line of lines) if (line.trim()) wire.push({ run, from: "agent", message: JSON.parse(line) });
  });
  const write = child.stdin.write.bind(child.stdin);
  child.stdin.write = (chunk, ...rest) => {
    for (const line of Buffer.from(chunk).toString("utf8").split("\n")) {
      if (line.trim()) wire.push({ run, from: "client", message: JSON.parse(line) });
    }
    return write(chunk, ...rest);
  };
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  return { child, stream };
}

function editorApp(record, buffers) {
  return acp
    .client({ name: "ts-test-editor" })
    .onNotification(acp.methods.client.session.update, ({ params }) => {
      record.updates.push(z.zSessionNotification.parse(params).update);
    })
    .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
      record.questions.push(params.toolCall);
      return { outcome: { outcome: "selected", optionId: "allow_once" } };
    })
    .onRequest(acp.methods.client.fs.readTextFile, ({ params }) => {
      record.fsCalls.push(["read", params.path]);
      if (params.path in buffers) return { content: buffers[params.path] };
      throw acp.RequestError.resourceNotFound(params.path);
    })
    .onRequest(acp.methods.client.fs.writeTextFile, ({ params }) => {
      record.fsCalls.push(["write", params.path]);
      buffers[params.path] = params.content;
      return {};
    });
}

async function stopAgent(child) {
  child.stdin.end();
  await new Promise((resolve) => child.once("exit", resolve));
}

const summary = {};
const buffers = { [bufferPath]: "value = 'unsaved'\n" };
const live = { updates: [], questions: [], fsCalls: [] };
{
  const { child, stream } = startAgent(firstModel);
  await editorApp(live, buffers).connectWith(stream, async (ctx) => {
    const init = z.zInitializeResponse.parse(
      await ctx.request(acp.methods.agent.initialize, {
        protocolVersion: acp.PROTOCOL_VERSION,
        clientCapabilities: { fs: { readTextFile: true, writeTextFile: true } },
      }),
    );
    summary.protocolVersion = init.protocolVersion;
    const session = z.zNewSessionResponse.parse(
      await ctx.request(acp.methods.agent.session.new, { cwd, mcpServers: [] }),
    );
    summary.sessionId = session.sessionId;
    const reply = z.zPromptResponse.parse(
      await ctx.request(acp.methods.agent.session.prompt, {
        sessionId: session.sessionId,
        prompt: [{ type: "text", text: "fix it" }],
      }),
    );
    summary.stop = reply.stopReason;
  });
  await stopAgent(child);
}
summary.live = live.updates;
summary.questions = live.questions;
summary.fsCalls = live.fsCalls;
summary.buffers = buffers;

const replay = { updates: [], questions: [], fsCalls: [] };
{
  const { child, stream } = startAgent(secondModel);
  await editorApp(replay, {}).connectWith(stream, async (ctx) => {
    z.zInitializeResponse.parse(
      await ctx.request(acp.methods.agent.initialize, { protocolVersion: acp.PROTOCOL_VERSION }),
    );
    z.zLoadSessionResponse.parse(
      await ctx.request(acp.methods.agent.session.load, { sessionId: summary.sessionId, cwd, mcpServers: [] }),
    );
  });
  await stopAgent(child);
}
summary.replayed = replay.updates;
summary.wire = wire;
process.stdout.write(JSON.stringify(summary) + "\n");
