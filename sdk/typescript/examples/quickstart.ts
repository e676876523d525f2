// A consumer of the published package: type-checked by `npm run check` (tsc --noEmit).
import { InsufficientCredits, RateLimited, Sandbase, Sandbox } from "@sandbase/sdk";

const client = new Sandbase(); // SANDBASE_API_KEY, SANDBASE_URL
await using sbx = await Sandbox.create({ template: "base", timeoutSecs: 600 }, client);

const result = await sbx.commands.run("echo hi && python3 --version");
console.log(result.exit_code, result.stdout);
for await (const event of sbx.commands.stream(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 1; done"])) {
  if (event.kind === "stdout") process.stdout.write(event.text);
}
const cat = await sbx.commands.start(["cat"]);
await cat.sendStdin("hello\n", true);
console.log((await cat.wait()).stdout);

await sbx.files.write("/work/notes.txt", "hello");
console.log(await sbx.files.readText("/work/notes.txt"), (await sbx.files.list()).map((file) => file.name));
const tar = await sbx.files.archive("/work");
await sbx.files.extract("/tmp/copy", tar);

const terminal = await sbx.pty.create({ cols: 120, rows: 40 });
const attachment = await terminal.attach((data) => process.stdout.write(data));
attachment.send("echo from the terminal; exit\n");
console.log("exit", await attachment.wait());

console.log(await sbx.egress.flows(), (await sbx.snapshot()).id, (await client.balance()).available);
try {
  await client.me();
} catch (error) {
  if (error instanceof RateLimited) console.log("retry after", error.retryAfter);
  if (error instanceof InsufficientCredits) console.log("top up");
}
