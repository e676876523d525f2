// The TypeScript SDK's scenario table against a real `sandbase dev` (started by the
// dashboard's test harness: fresh database, own Redis prefix, containerd namespace, ports).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { InsufficientCredits, NotFound, RateLimited, Sandbase, Sandbox } from "../dist/index.js";
import { signup, start, waitFor } from "../../../web/tests/harness.mjs";

let server;

before(async () => {
  server = await start();
});

after(async () => {
  await server?.stop();
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
