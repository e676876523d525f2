// The TypeScript SDK's scenario table against a real `sandbase dev` (started by the
// dashboard's test harness: fresh database, own Redis prefix, containerd namespace, ports),
// whose worker has an egress network leading `api.test.example` and `other.test.example` to
// an upstream in a network namespace of the test's own (tests/support/upstream.py).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { InsufficientCredits, NotFound, RateLimited, Sandbase, Sandbox } from "../dist/index.js";
import { signup, start, waitFor } from "../../../web/tests/harness.mjs";

const REPOSITORY = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
const TOKEN = randomBytes(16).toString("hex");
let server;
let upstream;

/// The upstream (tests/support/upstream.py), once it serves: its address, CA, request log and the
/// worker's options for `names`; it ends when its stdin closes.
async function startUpstream(names) {
  const child = spawn("python3", ["-m", "tests.support.upstream", ...names], {
    cwd: REPOSITORY,
    env: { ...process.env, SANDBASE_UPSTREAM_TOKEN: TOKEN },
    stdio: ["pipe", "pipe", "inherit"],
  });
  const [line] = await Promise.race([
    createInterface({ input: child.stdout })[Symbol.asyncIterator]().next().then((next) => [next.value]),
    new Promise((_, fail) => child.on("exit", (code) => fail(new Error(`upstream.py exited ${code}`)))),
  ]);
  const ready = JSON.parse(line);
  return { ...ready, stop: () => new Promise((done) => { child.on("exit", done); child.stdin.end(); }) };
}

before(async () => {
  upstream = await startUpstream(["api.test.example", "other.test.example"]);
  server = await start({ egress: upstream.worker_args });
});

after(async () => {
  await server?.stop();
  await upstream?.stop();
});

test("the scenario table", async () => {
  const account = await signup(server, "ts-sdk");
  const client = new Sandbase({ apiKey: account.key, baseUrl: server.url });
  const sbx = await Sandbox.create({ template: "base", timeoutSecs: 300, metadata: { suite: "ts" } }, client);
  try {
    // exec, whole and streamed
    const result = await sbx.commands.run("echo hi && python3 -c 'print(6*7)'");
    assert.deepEqual([result.exit_code, result.stdout], [0, "hi\n42\n"]);
    assert.equal((await sbx.commands.run(["sh", "-c", "exit 3"])).exit_code, 3);
    const events = [];
    for await (const event of sbx.commands.stream("for i in 1 2 3; do echo $i; sleep 0.1; done; echo e >&2")) events.push(event);
    assert.equal(events[0].kind, "pid");
    assert.equal(events.filter((e) => e.kind === "stdout").map((e) => e.text).join(""), "1\n2\n3\n");
    assert.equal(events.filter((e) => e.kind === "stderr").map((e) => e.text).join(""), "e\n");
    assert.deepEqual([events.at(-1).kind, events.at(-1).exitCode], ["exit", 0]);
    // shell session
    await sbx.commands.run("cd /tmp && export A=1", { session: "main" });
    assert.equal((await sbx.commands.run("pwd; echo $A", { session: "main" })).stdout, "/tmp\n1\n");
    // background: stdin, signal
    const cat = await sbx.commands.start(["cat"]);
    await cat.sendStdin("through stdin\n", true);
    const done = await cat.wait();
    assert.deepEqual([done.exit_code, done.stdout], [0, "through stdin\n"]);
    const sleeper = await sbx.commands.start("sleep 600");
    await sleeper.signal("KILL");
    assert.equal((await sleeper.wait()).running, false);
    // files, archives
    await sbx.files.write("/work/a.txt", "alpha");
    assert.equal(await sbx.files.readText("/work/a.txt"), "alpha");
    await sbx.files.write("/work/bin", new Uint8Array([0, 1, 2, 255]));
    assert.deepEqual([...(await sbx.files.read("/work/bin"))], [0, 1, 2, 255]);
    assert.ok((await sbx.files.list("/work")).some((file) => file.name === "a.txt"));
    const tar = await sbx.files.archive("/work");
    await sbx.files.extract("/tmp/copy", tar);
    assert.equal((await sbx.commands.run("cat /tmp/copy/a.txt")).stdout, "alpha");
    await sbx.files.remove("/work/bin");
    await assert.rejects(sbx.files.read("/work/bin"), NotFound);
    // egress: deny by default, nothing flowed
    assert.deepEqual(await sbx.egress.flows(), []);
    // a terminal over the WebSocket: typed into, resized, ended
    const terminal = await sbx.pty.create({ cols: 100, rows: 30 });
    let seen = "";
    const attachment = await terminal.attach((data) => (seen += new TextDecoder().decode(data)));
    attachment.send("echo ws-$((6*7))\n");
    await waitFor(() => seen.includes("ws-42"));
    attachment.resize(132, 43);
    await waitFor(async () => (await terminal.refresh()).cols === 132);
    attachment.send("exit 7\n");
    assert.equal(await attachment.wait(), 7);
    // extend, snapshot, restore
    const before = Date.parse(sbx.info.expires_at);
    assert.ok(Date.parse((await sbx.extend(900)).expires_at) > before);
    const snapshot = await sbx.snapshot();
    const restored = await Sandbox.create({ snapshot: snapshot.id }, client);
    try {
      assert.equal(await restored.files.readText("/work/a.txt"), "alpha");
    } finally {
      await restored.destroy();
    }
  } finally {
    await sbx.destroy();
  }
  assert.equal((await Sandbox.connect(sbx.id, client)).info.state, "stopped");
  // The team.
  assert.equal((await client.me()).role, "owner");
  const made = await client.createKey({ name: "ci", max_credits: "1" });
  assert.match(made.token, /^sb_/);
  await client.revokeKey(made.id);
  assert.ok((await client.balance()).available_micro > 0);
  assert.ok((await client.audit({ action: "sandbox.*" })).items.length > 0);
  assert.ok((await client.storeModels()).some((model) => model.id === "openai/gpt-4o-mini"));
});

test("egress: a policy, a credential the sandbox never holds, and the flow log", async () => {
  const account = await signup(server, "ts-egress");
  const client = new Sandbase({ apiKey: account.key, baseUrl: server.url });
  await client.setSecret({ name: "api-token", value: TOKEN, hosts: ["api.test.example"], inject: { header: "Authorization", format: "Bearer {value}" } });
  const sbx = await Sandbox.create({ template: "base", egress: ["api.test.example"], credentials: ["api-token"], timeoutSecs: 120 }, client);
  try {
    const curl = "curl -sS --max-time 10";
    assert.equal((await sbx.commands.run(`${curl} https://api.test.example/whoami`)).stdout, "hello\n");
    assert.ok(!(await sbx.commands.run("env")).stdout.includes(TOKEN));
    assert.equal((await sbx.commands.run(`${curl} -o /dev/null -w '%{http_code}' http://other.test.example/x`)).stdout, "403");
    assert.deepEqual((await sbx.egress.setPolicy(["api.test.example", "other.test.example"])).allow, ["api.test.example", "other.test.example"]);
    assert.equal((await sbx.commands.run(`${curl} http://other.test.example/x`)).stdout, "GET /x HTTP/1.1\n");
    let flows = [];
    await waitFor(async () => (flows = await sbx.egress.flows()).length >= 3);
    assert.deepEqual(flows.map((flow) => [flow.host, flow.decision]), [
      ["api.test.example", "injected"], ["other.test.example", "denied"], ["other.test.example", "allowed"],
    ]);
    assert.deepEqual(flows[0].credentials, ["api-token"]);
  } finally {
    await sbx.destroy();
  }
  assert.ok(readFileSync(upstream.log, "utf8").includes("GET /whoami HTTP/1.1"));
});

test("402 and 429", async () => {
  const account = await signup(server, "ts-limits");
  server.sql(`UPDATE grants SET expires_at = now() WHERE team_id = '${account.team.id}'`);
  const broke = new Sandbase({ apiKey: account.key, baseUrl: server.url, maxRetries: 0 });
  await waitFor(async () => (await broke.balance()).available_micro === 0);
  await assert.rejects(Sandbox.create({ template: "base" }, broke), (error) => error instanceof InsufficientCredits && error.status === 402);
  // A burst past the key's rate (50/s, burst 100): refused without retries…
  const answers = await Promise.allSettled(Array.from({ length: 250 }, () => broke.me()));
  const limited = answers.filter((answer) => answer.status === "rejected").map((answer) => answer.reason);
  assert.ok(limited.length > 0 && limited.every((error) => error instanceof RateLimited && error.retryAfter > 0));
  // …and all through with them (the SDK waits as Retry-After says).
  await new Promise((done) => setTimeout(done, 2000));
  const patient = new Sandbase({ apiKey: account.key, baseUrl: server.url, maxRetries: 8 });
  const all = await Promise.all(Array.from({ length: 250 }, () => patient.me()));
  assert.equal(all.length, 250);
});
