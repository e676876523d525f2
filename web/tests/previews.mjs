// Previews are their own sites, in a real browser: a signed preview link on the dashboard's
// origin opens the preview (a cross-site top-level navigation) and its page's WebSocket to
// its own origin works; another preview's page (same site: every preview shares the preview
// domain) fetching, embedding or opening a WebSocket to it with the browser's cookie is
// refused by the gateway (403 `preview_cross_site`) before the sandbox sees anything.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { WEB, call, page, shot, signup, waitFor } from "./harness.mjs";

const VICTIM_PORT = 8001;
const ATTACKER_PORT = 8002;

/// A sandbox serving the victim's page on one port and the attacker's on another, each
/// behind a preview (the victim's private, the attacker's public).
async function twoPreviews(server) {
  const owner = await signup(server, "preview");
  const created = await call(server, "POST", "/v1/sandboxes", owner.key, { template: "base" });
  assert.equal(created.status, 201, JSON.stringify(created.body));
  const id = created.body.id;
  const put = await fetch(`${server.url}/v1/sandboxes/${id}/files?path=/work/preview_server.py`, {
    method: "PUT",
    headers: { authorization: `Bearer ${owner.key}`, "content-type": "application/octet-stream" },
    body: readFileSync(join(WEB, "tests", "fixtures", "preview_server.py")),
  });
  assert.equal(put.status, 200);
  for (const [port, role] of [[VICTIM_PORT, "victim"], [ATTACKER_PORT, "attacker"]]) {
    const started = await call(server, "POST", `/v1/sandboxes/${id}/exec`, owner.key, {
      command: `python3 /work/preview_server.py ${port} ${role}`,
      background: true,
    });
    assert.ok(started.status < 300, JSON.stringify(started.body));
  }
  const victim = await call(server, "POST", `/v1/sandboxes/${id}/previews`, owner.key, { port: VICTIM_PORT });
  const attacker = await call(server, "POST", `/v1/sandboxes/${id}/previews`, owner.key, { port: ATTACKER_PORT, public: true });
  assert.equal(victim.status, 201, JSON.stringify(victim.body));
  assert.equal(attacker.status, 201, JSON.stringify(attacker.body));
  // Until both servers listen (a connection without a request: nothing logged).
  const probe = `import socket\nfor port in (${VICTIM_PORT}, ${ATTACKER_PORT}): socket.create_connection(("127.0.0.1", port)).close()`;
  await waitFor(async () => {
    const answer = await call(server, "POST", `/v1/sandboxes/${id}/exec`, owner.key, { cmd: ["python3", "-c", probe] });
    return answer.status === 200 && answer.body.exit_code === 0;
  }, 30_000);
  return { owner, id, victim: victim.body, attacker: attacker.body };
}

/// The paths the sandbox's server on `port` was asked for.
async function requested(server, owner, id, port) {
  const answer = await fetch(`${server.url}/v1/sandboxes/${id}/files?path=/work/requests-${port}.log`, {
    headers: { authorization: `Bearer ${owner.key}` },
  });
  return answer.status === 200 ? (await answer.text()).split("\n").filter(Boolean) : [];
}

export async function previewsAreTheirOwnSites(server, chrome) {
  const { owner, id, victim, attacker } = await twoPreviews(server);
  const victimOrigin = new URL(victim.url).origin;
  const errors = [];
  const opened = await page(chrome, errors);
  const statuses = [];
  opened.on("response", (response) => statuses.push([new URL(response.url()).pathname, response.status()]));

  // A link on the dashboard's origin: the signed URL leaves the preview's cookie and the
  // preview's own page opens its WebSocket.
  await opened.goto(`${server.url}/login`);
  await opened.evaluate((href) => {
    const link = document.createElement("a");
    link.href = href;
    link.textContent = "open the preview";
    document.body.append(link);
  }, victim.signed_url);
  await opened.getByRole("link", { name: "open the preview" }).click();
  await opened.waitForURL((url) => url.origin === victimOrigin && !url.search.includes("sandbase_preview"));
  await waitFor(async () => (await opened.title()) === "ws:hello");
  await shot(opened, "30-preview-opened");
  const cookies = await opened.context().cookies(victimOrigin);
  assert.ok(cookies.some((cookie) => cookie.name === "sandbase_preview"), JSON.stringify(cookies));
  const before = await requested(server, owner, id, VICTIM_PORT);
  assert.ok(before.includes("/") && before.includes("/ws"), JSON.stringify(before));

  // Another preview's page, with the victim's cookie in the same browser: a fetch, an image
  // and a WebSocket to the victim are refused at the gateway, and never reach the sandbox.
  await opened.goto(`${attacker.url}#${encodeURIComponent(victimOrigin)}`);
  await waitFor(async () => (await opened.title()).startsWith("done:"));
  const results = JSON.parse((await opened.title()).slice("done:".length));
  await shot(opened, "31-preview-cross-site");
  assert.equal(results.ws, "refused", JSON.stringify(results));
  assert.equal(results.image, "refused", JSON.stringify(results));
  // The fetch's answer is the gateway's refusal (the image's is blocked from the page's view
  // by the browser); that none of the three reached the sandbox is in its server's log.
  const fetched = statuses.filter(([pathname]) => pathname === "/secret-fetch").map(([, status]) => status);
  assert.deepEqual(fetched, [403], JSON.stringify(statuses));
  const after = await requested(server, owner, id, VICTIM_PORT);
  assert.deepEqual(after.filter((path) => path.startsWith("/secret")), [], JSON.stringify(after));

  // The victim's preview goes on working for its own pages.
  await opened.goto(victim.url);
  await waitFor(async () => (await opened.title()) === "ws:hello");
  assert.deepEqual(errors.filter((error) => !error.includes("Failed to load resource") && !error.includes("WebSocket")), []);
  await call(server, "DELETE", `/v1/sandboxes/${id}`, owner.key);
  await opened.context().close();
}
