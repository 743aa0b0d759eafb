// createAgent and client.agents against a real moatd (needs root, like
// moatd) and a local model server speaking OpenAI's Chat Completions with
// plain (unstreamed) answers: a tool call, then the final text.

import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, describe, it } from "node:test";

import { Moat, NotFoundError, createAgent } from "../dist/index.js";
import { startMoatd } from "./moatd.mjs";

const root = process.getuid?.() === 0;
const skip = root ? false : "needs root (moatd creates namespaces, cgroups and mounts)";
const KEY = "sk-sdk-agent-test-0a1b2c3d4e5f";

// Answers each request with the next of `answers`; records what it was sent.
function modelServer(answers) {
  const requests = [];
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      requests.push({ path: req.url, auth: req.headers.authorization, body: JSON.parse(body) });
      const answer = answers[Math.min(requests.length - 1, answers.length - 1)];
      const message = { role: "assistant", content: answer.text ?? null };
      if (answer.call) {
        message.tool_calls = [
          { id: `call_${requests.length}`, type: "function", function: { name: answer.call.name, arguments: JSON.stringify(answer.call.arguments) } },
        ];
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end(
        JSON.stringify({
          id: "x",
          object: "chat.completion",
          choices: [{ index: 0, message, finish_reason: answer.call ? "tool_calls" : "stop" }],
          usage: { prompt_tokens: 10, completion_tokens: 2, total_tokens: 12 },
        }),
      );
    });
  });
  return new Promise((res) =>
    server.listen(0, "127.0.0.1", () => res({ server, requests, url: `http://127.0.0.1:${server.address().port}/v1` })),
  );
}

describe("agents, against a real moatd", { skip }, () => {
  let moatd;
  let client;

  before(async () => {
    moatd = await startMoatd();
    client = new Moat({ baseUrl: moatd.baseUrl, token: moatd.token });
  });

  after(async () => {
    client?.close();
    await moatd?.stop();
  });

  it("createAgent runs an instruction to its end, each step heard on the way", async () => {
    const model = await modelServer([
      { call: { name: "write_file", arguments: { path: "/workspace/note.txt", content: "from the sdk" } } },
      { text: "done" },
    ]);
    try {
      const agent = createAgent({
        provider: "openai",
        model: "double",
        baseUrl: model.url,
        apiKey: KEY,
        permissions: { read_file: "allow", write_file: "allow", run_command: "deny", network: "deny" },
        maxIterations: 5,
        keepEnvironment: true,
        client,
      });
      const kinds = [];
      const run = await agent.run("write a note", (step) => kinds.push(step.kind));
      assert.equal(run.state, "completed");
      assert.equal(run.result, "done");
      assert.equal(run.iterations, 2);
      assert.deepEqual(run.usage, { input_tokens: 20, output_tokens: 4 });
      assert.deepEqual(kinds, ["instruction", "model", "tool_result", "model", "end"]);
      assert.equal(model.requests[0].auth, `Bearer ${KEY}`);
      assert.equal(model.requests[0].path, "/v1/chat/completions");
      assert.equal(model.requests[1].body.messages.at(-1).role, "tool");
      const note = await client.environments.files.read(run.environment, "/workspace/note.txt");
      assert.equal(Buffer.from(note).toString(), "from the sdk");
      assert.ok((await client.agents.list()).some((r) => r.id === run.id));
      assert.ok(!JSON.stringify(await client.agents.transcript(run.id)).includes(KEY));
      await client.environments.destroy(run.environment);
    } finally {
      model.server.close();
    }
  });

  it("a run is stopped on request and an unknown one is NotFoundError", async () => {
    const never = createServer(() => {}); // accepts and never answers
    await new Promise((res) => never.listen(0, "127.0.0.1", res));
    try {
      const agent = createAgent({
        provider: "openai",
        model: "double",
        baseUrl: `http://127.0.0.1:${never.address().port}/v1`,
        apiKey: KEY,
        client,
      });
      const started = await agent.start("wait");
      const stopped = await client.agents.stop(started.id);
      assert.equal(stopped.state, "stopped");
      await assert.rejects(client.agents.get("000000000000"), NotFoundError);
    } finally {
      never.closeAllConnections?.();
      never.close();
    }
  });
});
