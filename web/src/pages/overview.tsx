// The team at a glance: what is left to spend and until when, what runs now, what was spent
// today and this month, and the last 30 days as a chart.
import { useState } from "preact/hooks";
import { api, ok } from "../api/client";
import { StackedChart, buckets, stack } from "../chart";
import { CopyButton, ErrorNote, Loading, Page, credits, useLoad, when } from "../ui";
import { takeFreshKey } from "./login";

function FirstKey() {
  const [key, setKey] = useState(takeFreshKey);
  if (!key) return null;
  return (
    <div class="panel notice" role="status">
      <h2>Your first API key</h2>
      <p>Shown this once: copy it now. It works for the CLI, the SDKs, MCP clients and the model store.</p>
      <p>
        <code class="secret" data-testid="fresh-key">
          {key}
        </code>{" "}
        <CopyButton text={key} />
      </p>
      <button type="button" class="secondary" onClick={() => setKey(null)}>
        I have copied it
      </button>
    </div>
  );
}

export function Overview() {
  const monthStart = new Date();
  monthStart.setUTCDate(1);
  monthStart.setUTCHours(0, 0, 0, 0);
  const thirty = new Date(Date.now() - 30 * 86400_000);
  const from = (thirty < monthStart ? thirty : monthStart).toISOString();
  const balance = useLoad(async () => ok(await api.GET("/v1/billing/balance")), [], 10_000);
  const running = useLoad(async () => ok(await api.GET("/v1/sandboxes", { params: { query: { state: "running", limit: 100 } } })), [], 10_000);
  const usage = useLoad(async () => ok(await api.GET("/v1/usage", { params: { query: { group_by: "day", split_by: "kind", from } } })), [], 30_000);

  const today = new Date().toISOString().slice(0, 10);
  const month = monthStart.toISOString().slice(0, 10);
  const points = usage.data?.series ?? [];
  const spentToday = points.filter((point) => point.key === today).reduce((sum, point) => sum + point.amount_micro, 0);
  const spentMonth = points.filter((point) => point.key >= month).reduce((sum, point) => sum + point.amount_micro, 0);
  const grants = (balance.data?.grants ?? []).filter((grant) => !grant.expired && grant.remaining_micro > 0);
  const expiring = grants
    .filter((grant) => grant.expires_at)
    .sort((a, b) => Date.parse(a.expires_at!) - Date.parse(b.expires_at!))[0];
  const chart = stack(
    points.filter((point) => point.key >= thirty.toISOString().slice(0, 10)),
    true,
    buckets(thirty, new Date(Date.now() + 1000), "day"),
  );

  return (
    <Page title="Overview" actions={<a class="button" href="/sandboxes?new=1">New sandbox</a>}>
      <FirstKey />
      <ErrorNote error={balance.error || running.error || usage.error} />
      <div class="tiles">
        <div class="tile">
          <span class="muted">Balance</span>
          <strong data-testid="balance">{balance.data ? balance.data.available : "…"}</strong>
          <small class="muted">
            {expiring ? `${credits(expiring.remaining_micro)} of them expire ${when(expiring.expires_at)}` : "credits, none expiring"}
          </small>
          <a href="/credits">Buy credits</a>
        </div>
        <div class="tile">
          <span class="muted">Running sandboxes</span>
          <strong data-testid="running">{running.data ? running.data.sandboxes.length : "…"}</strong>
          <a href="/sandboxes">All sandboxes</a>
        </div>
        <div class="tile">
          <span class="muted">Spent today</span>
          <strong>{usage.data ? credits(spentToday) : "…"}</strong>
        </div>
        <div class="tile">
          <span class="muted">Spent this month</span>
          <strong>{usage.data ? credits(spentMonth) : "…"}</strong>
          <a href="/usage">Usage</a>
        </div>
      </div>
      <div class="panel">
        {usage.data ? (
          <StackedChart title="Last 30 days, by kind" x={chart.x} stacks={chart.stacks} time height={200} />
        ) : (
          <Loading what="usage" />
        )}
      </div>
    </Page>
  );
}
