// The transport: fetch with SandBase's key, retries on 429 and 503 (honouring Retry-After),
// refusals as exceptions, NDJSON as an async iterator.
import { SandbaseError, errorFor } from "./errors.js";

export type Options = {
  /** Default: `SANDBASE_API_KEY` (in Node). */
  apiKey?: string;
  /** Default: `SANDBASE_URL`, else http://127.0.0.1:8080. */
  baseUrl?: string;
  /** Attempts after the first on 429 and 503 (default 3). */
  maxRetries?: number;
  /** Per request, in milliseconds (default 120 000). */
  timeoutMs?: number;
  fetch?: typeof fetch;
};

export type Request = {
  method: string;
  path: string;
  query?: Record<string, string | number | boolean | undefined>;
  json?: unknown;
  body?: BodyInit;
  contentType?: string;
};

function env(name: string): string | undefined {
  const process = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return process?.env?.[name];
}

const sleep = (ms: number) => new Promise((done) => setTimeout(done, ms));

export class Http {
  readonly apiKey: string;
  readonly baseUrl: string;
  private readonly maxRetries: number;
  private readonly timeoutMs: number;
  private readonly fetch: typeof fetch;

  constructor(options: Options = {}) {
    const apiKey = options.apiKey ?? env("SANDBASE_API_KEY");
    if (!apiKey) throw new Error("no API key: pass apiKey or set SANDBASE_API_KEY");
    this.apiKey = apiKey;
    this.baseUrl = (options.baseUrl ?? env("SANDBASE_URL") ?? "http://127.0.0.1:8080").replace(/\/$/, "");
    this.maxRetries = options.maxRetries ?? 3;
    this.timeoutMs = options.timeoutMs ?? 120_000;
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  url(path: string, query?: Request["query"]): string {
    const url = new URL(`${this.baseUrl}${path}`);
    for (const [name, value] of Object.entries(query ?? {})) {
      if (value !== undefined) url.searchParams.set(name, String(value));
    }
    return url.toString();
  }

  /** The answer of a successful request (retried on 429/503), or the refusal thrown. */
  async send(request: Request): Promise<Response> {
    for (let attempt = 0; ; attempt++) {
      const headers: Record<string, string> = { authorization: `Bearer ${this.apiKey}` };
      let body = request.body;
      if (request.json !== undefined) {
        headers["content-type"] = "application/json";
        body = JSON.stringify(request.json);
      } else if (request.contentType) {
        headers["content-type"] = request.contentType;
      }
      const response = await this.fetch(this.url(request.path, request.query), {
        method: request.method,
        headers,
        body,
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      if (response.ok) return response;
      const text = await response.text();
      const retryAfter = Number(response.headers.get("retry-after") ?? NaN);
      if ((response.status === 429 || response.status === 503) && attempt < this.maxRetries) {
        const wait = Number.isFinite(retryAfter) ? retryAfter * 1000 : Math.min(8000, 250 * 2 ** attempt) * (0.5 + Math.random() / 2);
        await sleep(Math.min(wait, 60_000));
        continue;
      }
      throw refusal(response, text, Number.isFinite(retryAfter) ? retryAfter : undefined);
    }
  }

  async json<T>(request: Request): Promise<T> {
    const response = await this.send(request);
    return (response.status === 204 ? undefined : await response.json()) as T;
  }
}

function refusal(response: Response, text: string, retryAfter?: number): SandbaseError {
  let code = `http_${response.status}`;
  let message = text.slice(0, 500);
  let requestId = response.headers.get("x-request-id") ?? undefined;
  try {
    const detail = (JSON.parse(text) as { error: { code: string; message: string; request_id?: string } }).error;
    code = detail.code;
    message = detail.message;
    requestId = detail.request_id ?? requestId;
  } catch {
    // not SandBase's error body: status and text
  }
  return errorFor(response.status, code, message, requestId, retryAfter);
}

/** The lines of an NDJSON answer as they arrive, parsed. */
export async function* ndjson<T>(response: Response): AsyncGenerator<T> {
  const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      pending += value;
      let end;
      while ((end = pending.indexOf("\n")) >= 0) {
        const line = pending.slice(0, end).trim();
        pending = pending.slice(end + 1);
        if (line) yield JSON.parse(line) as T;
      }
    }
    if (pending.trim()) yield JSON.parse(pending) as T;
  } finally {
    reader.releaseLock();
  }
}
