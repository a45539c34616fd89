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
const acp = await import(pathToFileURL(`${sdkDir}/node_modules/@agentclientprotocol/sdk/dist/v1/stable/acp.js`).href);

function startAgent(model) {
  const child = spawn(python, ["-m", "trio_harness", "acp", "--model", model, "--store", store, "--tools", "files"], {
    cwd,
    env: process.env,
    stdio: ["pipe", "pipe", "inherit"],
  });
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  return { child, stream };
}

function editorApp(record, buffers) {
  return acp
    .client({ name: "ts-test-editor" })
    .onNotification(acp.methods.client.session.update, ({ params }) => {
      record.updates.push(params.update);
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
    const init = await ctx.request(acp.methods.agent.initialize, {
      protocolVersion: acp.PROTOCOL_VERSION,
      clientCapabilities: { fs: { readTextFile: true, writeTextFile: true } },
    });
    summary.protocolVersion = init.protocolVersion;
    const session = await ctx.request(acp.methods.agent.session.new, { cwd, mcpServers: [] });
    summary.sessionId = session.sessionId;
    const reply = await ctx.request(acp.methods.agent.session.prompt, {
      sessionId: session.sessionId,
      prompt: [{ type: "text", text: "fix it" }],
    });
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
    await ctx.request(acp.methods.agent.initialize, { protocolVersion: acp.PROTOCOL_VERSION });
    await ctx.request(acp.methods.agent.session.load, { sessionId: summary.sessionId, cwd, mcpServers: [] });
  });
  await stopAgent(child);
}
summary.replayed = replay.updates;
process.stdout.write(JSON.stringify(summary) + "\n");
