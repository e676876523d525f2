// SDK overhead per call against raw fetch, measured in the same run: `Sandbase.me()` against
// the same GET with fetch and `response.json()`, alternated, N of each. Needs a running
// SandBase (SANDBASE_URL, SANDBASE_API_KEY) with rate limits above the pace (docs/benchmarks.md).
import { Sandbase } from "./dist/index.js";

const N = Number(process.env.BENCH_CALLS ?? 1000);
const url = process.env.SANDBASE_URL;
const key = process.env.SANDBASE_API_KEY;
const client = new Sandbase({ apiKey: key, baseUrl: url });
const raw = async () => (await fetch(`${url}/v1/me`, { headers: { authorization: `Bearer ${key}` } })).json();
const sdk = [];
const direct = [];
for (let i = 0; i < 50; i++) await Promise.all([client.me(), raw()]);
for (let i = 0; i < N; i++) {
  let started = performance.now();
  await client.me();
  sdk.push(performance.now() - started);
  started = performance.now();
  await raw();
  direct.push(performance.now() - started);
}
const p = (values, q) => [...values].sort((a, b) => a - b)[Math.floor(values.length * q)];
console.log(`calls ${N} each, GET /v1/me`);
console.log(`SDK  p50 ${p(sdk, 0.5).toFixed(3)} ms  p99 ${p(sdk, 0.99).toFixed(3)} ms`);
console.log(`raw  p50 ${p(direct, 0.5).toFixed(3)} ms  p99 ${p(direct, 0.99).toFixed(3)} ms`);
console.log(`overhead p50 ${(p(sdk, 0.5) - p(direct, 0.5)).toFixed(3)} ms (ratio ${(p(sdk, 0.5) / p(direct, 0.5)).toFixed(3)})`);
