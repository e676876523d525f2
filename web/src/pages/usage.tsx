// Usage: what the team spent in a date range, grouped by time or by what spent it, stacked
// by a second grouping, as a chart with the table under it.
import { useState } from "preact/hooks";
import { api, ok } from "../api/client";
import { StackedChart, buckets, stack } from "../chart";
import { ErrorNote, Field, Loading, Page, credits, useLoad } from "../ui";

const GROUPS = ["day", "hour", "kind", "key", "sandbox", "model"] as const;
const SPLITS = ["", "kind", "key", "sandbox", "model"] as const;
/// Rows shown in the table under the chart.
const ROWS = 500;

function day(offset: number): string {
  return new Date(Date.now() + offset * 86400_000).toISOString().slice(0, 10);
}

export function Usage() {
  const [group, setGroup] = useState<string>("day");
  const [split, setSplit] = useState<string>("kind");
  const [from, setFrom] = useState(day(-6));
  const [to, setTo] = useState(day(0));
  const splitBy = split && split !== group ? split : undefined;
  const usage = useLoad(
    async () =>
      ok(
        await api.GET("/v1/usage", {
          params: {
            query: {
              group_by: group,
              split_by: splitBy,
              from: new Date(`${from}T00:00:00Z`).toISOString(),
              to: new Date(Date.parse(`${to}T00:00:00Z`) + 86400_000).toISOString(),
            },
          },
        }),
      ),
    [group, splitBy, from, to],
  );
  const time = group === "day" || group === "hour";
  const rows = usage.data?.series ?? [];
  const range: [Date, Date] = [new Date(`${from}T00:00:00Z`), new Date(Date.parse(`${to}T00:00:00Z`) + 86400_000)];
  const chart = stack(rows, time, time ? buckets(range[0], range[1], group as "day" | "hour") : []);
  return (
    <Page title="Usage">
      <form class="panel filters" onSubmit={(event) => event.preventDefault()} aria-label="Usage filters">
        <Field label="Group by">
          <select value={group} onChange={(event) => setGroup((event.target as HTMLSelectElement).value)}>
            {GROUPS.map((name) => (
              <option value={name}>{name}</option>
            ))}
          </select>
        </Field>
        <Field label="Stack by">
          <select value={split} onChange={(event) => setSplit((event.target as HTMLSelectElement).value)}>
            {SPLITS.map((name) => (
              <option value={name}>{name || "nothing"}</option>
            ))}
          </select>
        </Field>
        <Field label="From">
          <input type="date" value={from} max={to} onChange={(event) => setFrom((event.target as HTMLInputElement).value)} />
        </Field>
        <Field label="To">
          <input type="date" value={to} min={from} onChange={(event) => setTo((event.target as HTMLInputElement).value)} />
        </Field>
      </form>
      <ErrorNote error={usage.error} />
      {!usage.data ? (
        <Loading what="usage" />
      ) : (
        <>
          <div class="panel" data-testid="usage-chart" data-points={rows.length}>
            <StackedChart title={`Credits by ${group}${splitBy ? ` and ${splitBy}` : ""}`} x={chart.x} stacks={chart.stacks} time={time} labels={chart.labels} />
            <p>
              Total <strong>{usage.data.total}</strong> credits
            </p>
          </div>
          <table>
            <thead>
              <tr>
                <th>{group}</th>
                {splitBy ? <th>{splitBy}</th> : null}
                <th class="number">Credits</th>
              </tr>
            </thead>
            <tbody>
              {rows.slice(0, ROWS).map((row) => (
                <tr>
                  <td>{row.key}</td>
                  {splitBy ? <td>{row.split}</td> : null}
                  <td class="number">{credits(row.amount_micro)}</td>
                </tr>
              ))}
            </tbody>
          </table>
          {rows.length > ROWS ? (
            <p class="muted">
              The first {ROWS} of {rows.length} rows; the chart has them all.
            </p>
          ) : null}
        </>
      )}
    </Page>
  );
}
