// A real `sandbase dev` for the browser tests: a fresh PostgreSQL database, its own Redis
// prefix, containerd namespace and ports, the built dashboard, and a local stand-in for
// Stripe's API (Checkout sessions; its "payment page" sends the buyer back to the dashboard,
// and the test delivers the signed webhook). Chromium is Debian's, driven by playwright-core.
import { spawn, execFileSync } from "node:child_process";
import { createHmac, randomBytes } from "node:crypto";
import { createServer } from "node:http";
import { mkdirSync, mkdtempSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { createServer as netServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
export const WEB = resolve(here, "..");
const ROOT = resolve(WEB, "..");
const BINARY = resolve(ROOT, process.env.SANDBASE_BINARY ?? "target/debug/sandbase");
const DATABASE_URL = process.env.SANDBASE_TEST_DATABASE_URL ?? "postgres://sandbase:sandbase@127.0.0.1:5432/sandbase";
const REDIS_URL = process.env.SANDBASE_TEST_REDIS_URL ?? "redis://127.0.0.1:6379";
const SOCKET = process.env.SANDBASE_CONTAINERD_SOCKET ?? "/run/sandbase/containerd.sock";
const TEMPLATES = dirname(process.env.SANDBASE_BASE_TARBALL ?? "/var/lib/sandbase/templates/base.tar");
export const SCREENSHOTS = resolve(ROOT, "target/web-screenshots");
export const WEBHOOK_SECRET = "whsec_web_test_secret";

export function freePort() {
  return new Promise((done, fail) => {
    const server = netServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => done(port));
    });
    server.on("error", fail);
  });
}

function psql(sql) {
  execFileSync("psql", [DATABASE_URL, "-qAt", "-c", sql], { stdio: "pipe" });
}

/// Stripe's API as far as Checkout goes: customers and sessions (form-encoded, as Stripe's
/// API takes them); each session's `url` is a page here that returns the buyer to the
/// session's success URL.
async function stripeStandIn() {
  const sessions = new Map();
  const server = createServer((request, response) => {
    let body = "";
    request.on("data", (chunk) => (body += chunk));
    request.on("end", () => {
      const url = new URL(request.url, "http://stand-in");
      const form = new URLSearchParams(body);
      response.setHeader("content-type", "application/json");
      if (request.method === "POST" && url.pathname === "/v1/customers") {
        response.end(JSON.stringify({ id: `cus_${randomBytes(6).toString("hex")}`, object: "customer" }));
      } else if (request.method === "POST" && url.pathname === "/v1/checkout/sessions") {
        const id = `cs_test_${randomBytes(8).toString("hex")}`;
        sessions.set(id, { success: form.get("success_url"), form });
        response.end(JSON.stringify({ id, object: "checkout.session", url: `http://127.0.0.1:${server.address().port}/pay/${id}` }));
      } else if (request.method === "GET" && url.pathname.startsWith("/pay/")) {
        const session = sessions.get(url.pathname.slice(5));
        response.statusCode = session ? 303 : 404;
        if (session) response.setHeader("location", session.success);
        response.end();
      } else {
        response.statusCode = 404;
        response.end(JSON.stringify({ error: { message: "no such route" } }));
      }
    });
  });
  await new Promise((done) => server.listen(0, "127.0.0.1", done));
  return { server, sessions, url: `http://127.0.0.1:${server.address().port}` };
}

/// Starts everything; `stop()` ends it and drops the database. `egress`: the worker's egress
/// options (none by default: sandboxes get loopback only).
export async function start({ egress = ["--egress-pool", "none"] } = {}) {
  mkdirSync(SCREENSHOTS, { recursive: true });
  const work = mkdtempSync(join(tmpdir(), "sandbase-web-"));
  const unique = randomBytes(8).toString("hex");
  const database = `sandbase_test_web_${unique}`;
  psql(`CREATE DATABASE "${database}"`);
  const stripe = await stripeStandIn();
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const slot = parseInt(unique.slice(0, 4), 16) % 1000;
  const env = {
    PATH: process.env.PATH,
    HOME: work,
    DATABASE_URL: `${DATABASE_URL.replace(/\/[^/]*$/, "")}/${database}`,
    REDIS_URL,
    ...(process.env.SANDBASE_AGENT_BINARY ? { SANDBASE_AGENT_BINARY: process.env.SANDBASE_AGENT_BINARY } : {}),
    SANDBASE_REDIS__KEY_PREFIX: `sandbase-web-test:${unique}:`,
    SANDBASE_SERVER__INTERNAL_LISTEN: `127.0.0.1:${await freePort()}`,
    SANDBASE_SERVER__WEB_DIR: join(WEB, "dist"),
    SANDBASE_AUTH__SIGNUPS_PER_HOUR: "1000000",
    SANDBASE_AUTH__LOGINS_PER_MINUTE: "1000000",
    SANDBASE_BILLING__CHARGE_EVERY_SECS: "2",
    SANDBASE_STRIPE__SECRET_KEY: "sk_test_web",
    SANDBASE_STRIPE__WEBHOOK_SECRET: WEBHOOK_SECRET,
    SANDBASE_STRIPE__API_BASE: stripe.url,
    SANDBASE_RUNS__ARTIFACTS_DIR: join(work, "artifacts"),
    // The dev store's models, for the Models page (never called: nothing listens there).
    OPENAI_API_KEY: "sk-web-test-not-used",
    OPENAI_BASE_URL: "http://127.0.0.1:9/v1",
  };
  const log = join(work, "dev.log");
  const output = join(work, "dev.out");
  const dev = spawn(
    BINARY,
    [
      "dev", "--listen", `127.0.0.1:${port}`, "--state-dir", join(work, "state"),
      "--worker-listen", `127.0.0.1:${await freePort()}`, ...egress,
      "--namespace", `sandbase-test-web-${unique}`, "--containerd-socket", SOCKET,
      "--run-dir", join(work, "run"), "--id-base", String(5_000_000 + slot * 65_536),
      "--pool", "busybox=0", "--pool", "base=1", "--templates-dir", TEMPLATES,
    ],
    { env, stdio: ["ignore", openSync(output, "w"), openSync(log, "w")] },
  );
  const server = { url, work, dev, stripe, database, log, output };
  /// A statement against the dev server's own database (test set-up only).
  server.sql = (statement) =>
    execFileSync("psql", [env.DATABASE_URL, "-qAt", "-c", statement], { stdio: "pipe" }).toString().trim();
  server.stop = async () => {
    dev.kill("SIGTERM");
    await new Promise((done) => {
      const timer = setTimeout(() => {
        dev.kill("SIGKILL");
        done();
      }, 20_000);
      dev.on("exit", () => {
        clearTimeout(timer);
        done();
      });
    });
    stripe.server.close();
    try {
      psql(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
    } catch {
      // the suite's next run drops what is left
    }
  };
  // Ready: the dev server printed its key, and a worker offers the `base` template.
  const deadline = Date.now() + 240_000;
  while (true) {
    if (dev.exitCode !== null) throw new Error(`sandbase dev exited:\n${readFileSync(log, "utf8").slice(-4000)}`);
    if (Date.now() > deadline) throw new Error(`sandbase dev did not get ready:\n${readFileSync(log, "utf8").slice(-4000)}`);
    const printed = readFileSync(output, "utf8");
    const key = printed.match(/API key\s+(\S+)/)?.[1];
    const login = printed.match(/Login\s+(\S+) \/ (\S+)/);
    if (key && login) {
      const templates = await fetch(`${url}/v1/templates`, { headers: { authorization: `Bearer ${key}` } })
        .then((answer) => answer.json())
        .catch(() => null);
      if (templates?.templates?.some((template) => template.name === "base" && template.workers > 0)) {
        Object.assign(server, { key, email: login[1], password: login[2] });
        return server;
      }
    }
    await new Promise((done) => setTimeout(done, 500));
  }
}

/// A JSON call of the API.
export async function call(server, method, path, token, body) {
  const answer = await fetch(`${server.url}${path}`, {
    method,
    headers: { ...(token ? { authorization: `Bearer ${token}` } : {}), ...(body !== undefined ? { "content-type": "application/json" } : {}) },
    body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
  });
  const text = await answer.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = text;
  }
  return { status: answer.status, body: json };
}

/// A new account: its e-mail, password, team, session and first key.
export async function signup(server, name = "web") {
  const email = `${name}-${randomBytes(6).toString("hex")}@example.com`;
  const password = "a long enough password";
  const answer = await call(server, "POST", "/v1/auth/signup", null, { email, password, team_name: `Team ${name}` });
  if (answer.status !== 201) throw new Error(`signup: ${answer.status} ${JSON.stringify(answer.body)}`);
  return { email, password, team: answer.body.team, session: answer.body.session.token, key: answer.body.api_key.token, user: answer.body.user };
}

/// Delivers a Checkout session's completion, signed as Stripe signs webhooks.
export async function deliverPaid(server, sessionId) {
  const event = JSON.stringify({
    id: `evt_${randomBytes(8).toString("hex")}`,
    object: "event",
    type: "checkout.session.completed",
    data: { object: { id: sessionId, object: "checkout.session", payment_status: "paid", payment_intent: `pi_${sessionId}` } },
  });
  const timestamp = Math.floor(Date.now() / 1000);
  const signature = createHmac("sha256", WEBHOOK_SECRET).update(`${timestamp}.${event}`).digest("hex");
  const answer = await fetch(`${server.url}/v1/billing/stripe/webhook`, {
    method: "POST",
    headers: { "content-type": "application/json", "stripe-signature": `t=${timestamp},v1=${signature}` },
    body: event,
  });
  if (!answer.ok) throw new Error(`webhook: ${answer.status} ${await answer.text()}`);
}

/// Debian's Chromium (never a downloaded browser), headless.
export async function browser() {
  const executablePath = process.env.SANDBASE_CHROMIUM ?? "/usr/bin/chromium";
  return chromium.launch({ executablePath, headless: true, args: ["--no-sandbox", "--disable-dev-shm-usage"] });
}

/// A page that fails the test on any script error or console error it records.
export async function page(browserInstance, errors) {
  const context = await browserInstance.newContext({ viewport: { width: 1280, height: 860 } });
  const opened = await context.newPage();
  opened.on("pageerror", (error) => errors.push(`pageerror: ${error.message}`));
  opened.on("console", (message) => {
    if (message.type() === "error") errors.push(`console: ${message.text()}`);
  });
  return opened;
}

export async function shot(opened, name, fullPage = true) {
  await opened.screenshot({ path: join(SCREENSHOTS, `${name}.png`), fullPage });
}

export function record(name, value) {
  const file = join(SCREENSHOTS, "measurements.json");
  let saved = {};
  try {
    saved = JSON.parse(readFileSync(file, "utf8"));
  } catch {
    // first measurement
  }
  saved[name] = value;
  writeFileSync(file, JSON.stringify(saved, null, 2));
}

/// Polls `check` until it holds, or fails after `timeout` ms.
export async function waitFor(check, timeout = 15_000) {
  const deadline = Date.now() + timeout;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((done) => setTimeout(done, 250));
  }
  throw new Error(`timed out: ${check}`);
}
