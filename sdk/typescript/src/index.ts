// SandBase's TypeScript SDK: `Sandbase` (the team's resources) and `Sandbox` (one sandbox:
// commands, files, terminals, egress, snapshots). ESM for Node ≥ 20 and browsers; the types
// are generated from the API's OpenAPI document (schema.ts).
import { Http, ndjson, type Options, type Request } from "./http.js";
import type { components } from "./schema.js";

export * from "./errors.js";
export type { Options } from "./http.js";
export type Schemas = components["schemas"];
type S<K extends keyof Schemas> = Schemas[K];

export type CommandEvent =
  | { kind: "pid"; pid: number }
  | { kind: "stdout" | "stderr"; text: string }
  | { kind: "exit"; exitCode: number; signal?: number | null; timedOut: boolean; durationMs: number };

export type CommandOptions = { cwd?: string; env?: Record<string, string>; timeoutSecs?: number; stdin?: string; session?: string };

export type CreateOptions = {
  template?: string;
  egress?: string[];
  credentials?: string[];
  timeoutSecs?: number;
  cpu?: number;
  memoryMb?: number;
  env?: Record<string, string>;
  metadata?: Record<string, string>;
  store?: boolean;
  snapshot?: string;
};

function execBody(cmd: string | string[], options: CommandOptions, extra: Partial<S<"ExecRequest">> = {}): S<"ExecRequest"> {
  return {
    ...(typeof cmd === "string" ? { command: cmd } : { cmd }),
    cwd: options.cwd,
    env: options.env,
    timeout_secs: options.timeoutSecs,
    stdin: options.stdin,
    session: options.session,
    ...extra,
  };
}

/** Bytes a request body takes (a copy of a view over a shared or foreign buffer). */
function bytes(data: string | Uint8Array): Uint8Array<ArrayBuffer> {
  return typeof data === "string" ? new TextEncoder().encode(data) : new Uint8Array(data);
}

export class Sandbase {
  readonly http: Http;

  constructor(options: Options = {}) {
    this.http = new Http(options);
  }

  /** Any route of the API; the decoded JSON answer. */
  call<T = unknown>(method: string, path: string, json?: unknown, query?: Request["query"]): Promise<T> {
    return this.http.json<T>({ method, path, json, query });
  }

  me() {
    return this.call<S<"Me">>("GET", "/v1/me");
  }
  async sandboxes(state?: string) {
    return (await this.http.json<S<"SandboxList">>({ method: "GET", path: "/v1/sandboxes", query: { state } })).sandboxes;
  }
  async templates() {
    return (await this.call<S<"TemplateList">>("GET", "/v1/templates")).templates;
  }
  async keys() {
    return (await this.call<S<"ApiKeyList">>("GET", "/v1/api-keys")).items;
  }
  createKey(request: S<"CreateApiKeyRequest">) {
    return this.call<S<"CreatedApiKey">>("POST", "/v1/api-keys", request);
  }
  async revokeKey(id: string) {
    await this.http.send({ method: "DELETE", path: `/v1/api-keys/${id}` });
  }
  async members() {
    return (await this.call<S<"MemberList">>("GET", "/v1/team/members")).items;
  }
  invite(email: string, role: S<"Role"> = "member") {
    return this.call<S<"Invitation">>("POST", "/v1/team/members", { email, role });
  }
  balance() {
    return this.call<S<"BalanceAnswer">>("GET", "/v1/billing/balance");
  }
  ledger(before?: string, limit?: number) {
    return this.http.json<S<"LedgerPage">>({ method: "GET", path: "/v1/billing/ledger", query: { before, limit } });
  }
  usage(query: { group_by?: string; split_by?: string; from?: string; to?: string } = {}) {
    return this.http.json<S<"UsageAnswer">>({ method: "GET", path: "/v1/usage", query });
  }
  audit(query: { action?: string; actor?: string; outcome?: string; cursor?: string; limit?: number } = {}) {
    return this.http.json<S<"AuditPage">>({ method: "GET", path: "/v1/audit", query });
  }
  async secrets() {
    return (await this.call<S<"SecretList">>("GET", "/v1/secrets")).secrets;
  }
  setSecret(request: S<"CreateSecretRequest">) {
    return this.call<S<"Secret">>("POST", "/v1/secrets", request);
  }
  run(request: S<"CreateRunRequest">) {
    return this.call<S<"Run">>("POST", "/v1/runs", request);
  }
  getRun(id: string) {
    return this.call<S<"Run">>("GET", `/v1/runs/${id}`);
  }
  async storeModels() {
    return (await this.call<S<"StoreModelList">>("GET", "/v1/store/models")).models;
  }
}

export class Sandbox {
  readonly id: string;
  readonly commands: Commands;
  readonly files: Files;
  readonly egress: Egress;
  readonly pty: Pty;

  private constructor(
    readonly client: Sandbase,
    public info: S<"Sandbox">,
  ) {
    this.id = info.id;
    this.commands = new Commands(this);
    this.files = new Files(this);
    this.egress = new Egress(this);
    this.pty = new Pty(this);
  }

  /** A new sandbox. `await using sbx = await Sandbox.create()` destroys it at the end of the scope. */
  static async create(options: CreateOptions = {}, client = new Sandbase()): Promise<Sandbox> {
    const body: S<"CreateSandboxRequest"> = {
      template: options.template,
      egress: options.egress?.length ? { allow: options.egress } : undefined,
      credentials: options.credentials,
      timeout_secs: options.timeoutSecs,
      resources: options.cpu !== undefined || options.memoryMb !== undefined ? { cpu: options.cpu, memory_mb: options.memoryMb } : undefined,
      env: options.env,
      metadata: options.metadata,
      store: options.store,
      snapshot: options.snapshot,
    };
    return new Sandbox(client, await client.call<S<"Sandbox">>("POST", "/v1/sandboxes", body));
  }

  static async connect(id: string, client = new Sandbase()): Promise<Sandbox> {
    return new Sandbox(client, await client.call<S<"Sandbox">>("GET", `/v1/sandboxes/${id}`));
  }

  /** @internal */
  path(tail = ""): string {
    return `/v1/sandboxes/${this.id}${tail}`;
  }

  async refresh() {
    this.info = await this.client.call<S<"Sandbox">>("GET", this.path());
    return this.info;
  }
  /** Expires `seconds` from now. */
  async extend(seconds: number) {
    this.info = await this.client.call<S<"Sandbox">>("POST", this.path("/timeout"), { timeout_secs: seconds });
    return this.info;
  }
  /** Its /work and /tmp kept; `Sandbox.create({ snapshot })` starts from them. */
  snapshot() {
    return this.client.call<S<"Snapshot">>("POST", this.path("/snapshots"), {});
  }
  async destroy() {
    await this.client.http.send({ method: "DELETE", path: this.path() });
  }
  async [Symbol.asyncDispose]() {
    await this.destroy();
  }
}

export class Commands {
  constructor(private readonly sandbox: Sandbox) {}

  /** Runs a shell line or an argv to its end. */
  run(cmd: string | string[], options: CommandOptions = {}) {
    return this.sandbox.client.call<S<"ExecResult">>("POST", this.sandbox.path("/exec"), execBody(cmd, options));
  }

  /** Runs it, yielding its output as it comes, then its exit. */
  async *stream(cmd: string | string[], options: CommandOptions = {}): AsyncGenerator<CommandEvent> {
    const response = await this.sandbox.client.http.send({ method: "POST", path: this.sandbox.path("/exec"), json: execBody(cmd, options, { stream: true }) });
    for await (const event of ndjson<Record<string, unknown>>(response)) {
      if ("error" in event) {
        const detail = event.error as S<"ErrorDetail">;
        throw Object.assign(new Error(`${detail.code}: ${detail.message}`), { code: detail.code });
      }
      if ("stdout" in event) yield { kind: "stdout", text: String(event.stdout) };
      else if ("stderr" in event) yield { kind: "stderr", text: String(event.stderr) };
      else if ("exit_code" in event)
        yield { kind: "exit", exitCode: Number(event.exit_code), signal: event.signal as number | null, timedOut: Boolean(event.timed_out), durationMs: Number(event.duration_ms) };
      else if ("pid" in event) yield { kind: "pid", pid: Number(event.pid) };
    }
  }

  /** Starts it in the background. */
  async start(cmd: string | string[], options: CommandOptions = {}) {
    const started = await this.sandbox.client.call<S<"BackgroundStarted">>("POST", this.sandbox.path("/exec"), execBody(cmd, options, { background: true }));
    return new Process(this.sandbox, started.pid);
  }

  async list() {
    return (await this.sandbox.client.call<S<"ProcessList">>("GET", this.sandbox.path("/processes"))).processes;
  }
}

export class Process {
  private readonly base: string;

  constructor(
    private readonly sandbox: Sandbox,
    readonly pid: number,
  ) {
    this.base = sandbox.path(`/processes/${pid}`);
  }

  info() {
    return this.sandbox.client.call<S<"Process">>("GET", this.base);
  }
  async sendStdin(data: string | Uint8Array, close = false) {
    await this.sandbox.client.http.send({ method: "POST", path: `${this.base}/stdin`, query: { close: close || undefined }, body: bytes(data), contentType: "application/octet-stream" });
  }
  async signal(signal: string | number = "TERM") {
    await this.sandbox.client.http.send({ method: "POST", path: `${this.base}/signal`, json: { signal } });
  }
  /** Its state once it has exited (polling). */
  async wait(timeoutMs = 60_000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const info = await this.info();
      if (!info.running) return info;
      if (Date.now() > deadline) throw new Error(`process ${this.pid} still running after ${timeoutMs} ms`);
      await new Promise((done) => setTimeout(done, 100));
    }
  }
}

export class Files {
  constructor(private readonly sandbox: Sandbox) {}

  async read(path: string): Promise<Uint8Array> {
    const response = await this.sandbox.client.http.send({ method: "GET", path: this.sandbox.path("/files"), query: { path } });
    return new Uint8Array(await response.arrayBuffer());
  }
  async readText(path: string) {
    return new TextDecoder().decode(await this.read(path));
  }
  write(path: string, data: string | Uint8Array) {
    return this.sandbox.client.http
      .send({ method: "PUT", path: this.sandbox.path("/files"), query: { path }, body: bytes(data), contentType: "application/octet-stream" })
      .then((response) => response.json() as Promise<S<"FileInfo">>);
  }
  async list(path = "/work") {
    return (await this.sandbox.client.http.json<S<"DirectoryListing">>({ method: "GET", path: this.sandbox.path("/files"), query: { path } })).entries;
  }
  async remove(path: string, recursive = false) {
    await this.sandbox.client.http.send({ method: "DELETE", path: this.sandbox.path("/files"), query: { path, recursive } });
  }
  /** `path` as a tar archive. */
  async archive(path = "/work") {
    const response = await this.sandbox.client.http.send({ method: "GET", path: this.sandbox.path("/archive"), query: { path } });
    return new Uint8Array(await response.arrayBuffer());
  }
  /** A tar archive unpacked into `path`. */
  async extract(path: string, tar: Uint8Array) {
    await this.sandbox.client.http.send({ method: "PUT", path: this.sandbox.path("/archive"), query: { path }, body: bytes(tar), contentType: "application/x-tar" });
  }
}

export class Egress {
  constructor(private readonly sandbox: Sandbox) {}

  policy() {
    return this.sandbox.client.call<S<"EgressPolicy">>("GET", this.sandbox.path("/egress-policy"));
  }
  setPolicy(allow: string[], deny: string[] = []) {
    return this.sandbox.client.call<S<"EgressPolicy">>("PUT", this.sandbox.path("/egress-policy"), { allow, deny });
  }
  async flows() {
    return (await this.sandbox.client.call<S<"EgressFlowList">>("GET", this.sandbox.path("/egress"))).flows;
  }
}

export class Pty {
  constructor(private readonly sandbox: Sandbox) {}

  async create(options: { cols?: number; rows?: number; cmd?: string[]; record?: boolean } = {}) {
    const info = await this.sandbox.client.call<S<"Terminal">>("POST", this.sandbox.path("/pty"), { cols: 80, rows: 24, record: true, ...options });
    return new Terminal(this.sandbox, info);
  }
  async list() {
    return (await this.sandbox.client.call<S<"TerminalList">>("GET", this.sandbox.path("/pty"))).terminals;
  }
}

/** A terminal session, attached over a WebSocket (with a single-use ticket, as browsers do). */
export class Terminal {
  private readonly base: string;

  constructor(
    private readonly sandbox: Sandbox,
    public info: S<"Terminal">,
  ) {
    this.base = sandbox.path(`/pty/${info.session_id}`);
  }

  /** Attaches: `onData` gets its output (from offset `since`), the socket sends input. */
  async attach(onData: (data: Uint8Array) => void, since = 0): Promise<Attachment> {
    const ticket = await this.sandbox.client.call<S<"AttachTicket">>("POST", `${this.base}/ticket`);
    const url = this.sandbox.client.http.url(`${this.base}/attach`, { since, ticket: ticket.ticket }).replace(/^http/, "ws");
    const socket = new WebSocket(url);
    socket.binaryType = "arraybuffer";
    const attachment = new Attachment(socket);
    socket.onmessage = (message) => {
      if (typeof message.data === "string") attachment.control(JSON.parse(message.data) as { type: string; code?: number });
      else onData(new Uint8Array(message.data as ArrayBuffer));
    };
    await new Promise<void>((done, fail) => {
      socket.onopen = () => done();
      socket.onerror = () => fail(new Error("the terminal's WebSocket did not open"));
    });
    return attachment;
  }
  async resize(cols: number, rows: number) {
    await this.sandbox.client.http.send({ method: "POST", path: `${this.base}/resize`, json: { cols, rows } });
  }
  async refresh() {
    this.info = await this.sandbox.client.call<S<"Terminal">>("GET", this.base);
    return this.info;
  }
  async close() {
    await this.sandbox.client.http.send({ method: "DELETE", path: this.base });
  }
}

export class Attachment {
  /** The session's exit code once it ended. */
  exitCode?: number;
  private readonly ended: Promise<number | undefined>;
  private finish!: (code: number | undefined) => void;

  constructor(private readonly socket: WebSocket) {
    this.ended = new Promise((done) => (this.finish = done));
    socket.addEventListener("close", () => this.finish(this.exitCode));
  }

  /** @internal */
  control(message: { type: string; code?: number }) {
    if (message.type === "exit") {
      this.exitCode = message.code;
      this.finish(message.code);
    }
  }
  send(data: string | Uint8Array) {
    this.socket.send(bytes(data));
  }
  resize(cols: number, rows: number) {
    this.socket.send(JSON.stringify({ type: "resize", cols, rows }));
  }
  /** Resolves with the exit code when the session ends (or the socket closes). */
  wait() {
    return this.ended;
  }
  close() {
    this.socket.close();
  }
}
