// The audit log (owners and admins): filters by action, actor, outcome and time, page by
// page; a row opens its detail, and terminal sessions have a Replay button that plays their
// recording in the page.
import { useState } from "preact/hooks";
import { api, ok, type S } from "../api/client";
import { Lazy } from "../lazy";
import { ActionsHead, ErrorNote, Field, Loading, Page, Pager, useLoad, usePages, when } from "../ui";

type Filters = { action: string; actor: string; outcome: string; from: string; to: string };

function recordingOf(event: S<"AuditEvent">): string | null {
  const details = event.details as Record<string, unknown> | null;
  const recording = details?.recording;
  return event.action.startsWith("sandbox.session.") && typeof recording === "string" ? recording : null;
}

function iso(local: string): string | undefined {
  return local ? new Date(local).toISOString() : undefined;
}

function Detail({ event }: { event: S<"AuditEvent"> }) {
  const recording = recordingOf(event);
  const [playing, setPlaying] = useState(false);
  return (
    <div class="panel" data-testid="audit-detail">
      <h2>
        {event.action} <small class="muted">#{event.id}</small>
      </h2>
      <dl class="facts">
        <dt>When</dt>
        <dd>{when(event.occurred_at)}</dd>
        <dt>Actor</dt>
        <dd>
          {event.actor_type} {event.actor_id ?? ""}
        </dd>
        <dt>Target</dt>
        <dd>{event.target ?? "—"}</dd>
        <dt>Outcome</dt>
        <dd>
          {event.outcome}
          {event.status_code ? ` (${event.status_code})` : ""}
        </dd>
        <dt>From</dt>
        <dd>{event.source_ip ?? "—"}</dd>
        <dt>Request</dt>
        <dd>
          <code>{event.request_id ?? "—"}</code>
        </dd>
      </dl>
      <pre class="details">{JSON.stringify(event.details, null, 2)}</pre>
      {recording ? (
        playing ? (
          <Lazy key={recording} load={() => import("./replay")} props={{ recording }} />
        ) : (
          <button type="button" onClick={() => setPlaying(true)}>
            Replay session
          </button>
        )
      ) : null}
    </div>
  );
}

export function Audit() {
  const [filters, setFilters] = useState<Filters>({ action: "", actor: "", outcome: "", from: "", to: "" });
  const pages = usePages();
  const [open, setOpen] = useState<S<"AuditEvent"> | null>(null);
  const cursor = pages.cursor;
  const audit = useLoad(
    async () =>
      ok(
        await api.GET("/v1/audit", {
          params: {
            query: {
              action: filters.action || undefined,
              actor: filters.actor || undefined,
              outcome: filters.outcome || undefined,
              from: iso(filters.from),
              to: iso(filters.to),
              cursor,
              limit: 25,
            },
          },
        }),
      ),
    [JSON.stringify(filters), cursor],
  );
  const page = audit.data;
  function filter(event: Event) {
    event.preventDefault();
    const form = new FormData(event.target as HTMLFormElement);
    setFilters({
      action: String(form.get("action") ?? "").trim(),
      actor: String(form.get("actor") ?? "").trim(),
      outcome: String(form.get("outcome") ?? ""),
      from: String(form.get("from") ?? ""),
      to: String(form.get("to") ?? ""),
    });
    pages.reset();
  }
  return (
    <Page title="Audit log">
      <form class="panel filters" onSubmit={filter} aria-label="Audit filters">
        <Field label="Action" hint="e.g. sandbox.session.* or api_key.create">
          <input name="action" value={filters.action} />
        </Field>
        <Field label="Actor" hint="A user id or API key id.">
          <input name="actor" value={filters.actor} />
        </Field>
        <Field label="Outcome">
          <select name="outcome" value={filters.outcome}>
            <option value="">any</option>
            <option value="success">success</option>
            <option value="failure">failure</option>
            <option value="denied">denied</option>
          </select>
        </Field>
        <Field label="From">
          <input name="from" type="datetime-local" value={filters.from} />
        </Field>
        <Field label="To">
          <input name="to" type="datetime-local" value={filters.to} />
        </Field>
        <button type="submit">Filter</button>
      </form>
      <ErrorNote error={audit.error} />
      {open ? <Detail key={open.id} event={open} /> : null}
      {!page ? (
        <Loading what="the audit log" />
      ) : (
        <>
          <table data-testid="audit">
            <thead>
              <tr>
                <th>When</th>
                <th>Action</th>
                <th>Actor</th>
                <th>Target</th>
                <th>Outcome</th>
                <ActionsHead />
              </tr>
            </thead>
            <tbody>
              {page.items.map((event) => (
                <tr class={open?.id === event.id ? "selected" : ""}>
                  <td>{when(event.occurred_at)}</td>
                  <td>{event.action}</td>
                  <td>
                    {event.actor_type} <code>{event.actor_id?.slice(0, 8) ?? ""}</code>
                  </td>
                  <td>{event.target ?? ""}</td>
                  <td>{event.outcome}</td>
                  <td>
                    <button type="button" class="secondary" onClick={() => setOpen(event)}>
                      {recordingOf(event) ? "Replay" : "Detail"}
                    </button>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          <Pager pages={pages} next={page.next_cursor} />
        </>
      )}
    </Page>
  );
}
