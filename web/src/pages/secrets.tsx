// Secrets and the team's default egress policy. A secret's value is typed into a password
// field, sent once, and never shown again (the API has no way to read it back); the list
// shows names, hosts, how it is injected and its version.
import { useState } from "preact/hooks";
import { api, ok, type S } from "../api/client";
import { isAdmin } from "../session";
import { ActionsHead, ErrorNote, Field, Loading, Page, fields, useAction, useLoad, when, words } from "../ui";

export function injection(inject: S<"Injection">): string {
  if (inject.header) return `header ${inject.header}: ${inject.format ?? "{value}"}`;
  if (inject.basic) return `basic auth as ${inject.basic.username}`;
  if (inject.query) return `query ?${inject.query}=`;
  if (inject.placeholder) return `placeholder in $${typeof inject.placeholder === "string" ? inject.placeholder : inject.placeholder.env}`;
  return "—";
}

function NewSecret({ onDone }: { onDone: () => void }) {
  const { error, run } = useAction();
  const submit = (event: Event) => {
    const { form, get } = fields(event);
    const body: S<"CreateSecretRequest"> = {
      name: get("name"),
      hosts: words(get("hosts")),
      inject: { header: get("header"), format: get("format") || null },
      value: get("value"),
      usable_by: get("usable_by") as S<"UsableBy">,
    };
    return run(async () => {
      ok(await api.POST("/v1/secrets", { body }));
      form.reset();
      onDone();
    });
  };
  return (
    <form class="panel form-grid" onSubmit={submit} aria-label="New secret">
      <h2>New secret</h2>
      <Field label="Name">
        <input name="name" required pattern="[A-Za-z0-9_.\-]+" maxLength={64} placeholder="github" />
      </Field>
      <Field label="Hosts" hint="Where it is injected: api.github.com, *.example.com">
        <input name="hosts" required />
      </Field>
      <Field label="Header">
        <input name="header" required value="Authorization" />
      </Field>
      <Field label="Header value" hint="{value} is replaced by the secret.">
        <input name="format" value="Bearer {value}" />
      </Field>
      <Field label="Value" hint="Sent once; never shown again.">
        <input name="value" type="password" autocomplete="off" required />
      </Field>
      <Field label="Usable by">
        <select name="usable_by">
          <option value="member">members and up</option>
          <option value="admin">admins and owners</option>
        </select>
      </Field>
      <ErrorNote error={error} />
      <button type="submit">Save secret</button>
    </form>
  );
}

function Rotate({ secret, onDone }: { secret: S<"Secret">; onDone: () => void }) {
  const { error, run } = useAction();
  const submit = (event: Event) => {
    const { form, get } = fields(event);
    return run(async () => {
      ok(await api.PUT("/v1/secrets/{name}", { params: { path: { name: secret.name } }, body: { value: get("value") } }));
      form.reset();
      onDone();
    });
  };
  return (
    <form class="inline" onSubmit={submit} aria-label={`New value for ${secret.name}`}>
      <label>
        <span class="sr-only">New value for {secret.name}</span>
        <input name="value" type="password" autocomplete="off" required placeholder="new value" />
      </label>
      <button type="submit" class="secondary">
        Rotate
      </button>
      <ErrorNote error={error} />
    </form>
  );
}

function EgressDefault() {
  // No default yet is `null`: an empty policy (deny by default).
  const policy = useLoad(async () => ok(await api.GET("/v1/egress-policy")) ?? { allow: [], deny: [] }, []);
  const { error, run } = useAction();
  const [saved, setSaved] = useState(false);
  const admin = isAdmin();
  const submit = (event: Event) => {
    const { get } = fields(event);
    return run(async () => {
      ok(await api.PUT("/v1/egress-policy", { body: { allow: words(get("allow")), deny: words(get("deny")) } }));
      setSaved(true);
      policy.reload();
    });
  };
  return (
    <form class="panel form-grid" onSubmit={submit} aria-label="Default egress policy">
      <h2>Default egress policy</h2>
      <p class="muted">Sandboxes created without an egress policy get this one. Empty: no network (deny by default).</p>
      {!policy.data ? (
        <Loading what="the policy" />
      ) : (
        <>
          <Field label="Allow" hint="Hosts or patterns, one per line.">
            <textarea name="allow" rows={3} disabled={!admin} value={(policy.data.allow ?? []).join("\n")} />
          </Field>
          <Field label="Deny">
            <textarea name="deny" rows={2} disabled={!admin} value={(policy.data.deny ?? []).join("\n")} />
          </Field>
        </>
      )}
      <ErrorNote error={policy.error || error} />
      {saved ? <p role="status">Saved.</p> : null}
      {admin ? <button type="submit">Save policy</button> : null}
    </form>
  );
}

export function Secrets() {
  const secrets = useLoad(async () => ok(await api.GET("/v1/secrets")), []);
  const { error, run } = useAction();
  const admin = isAdmin();
  return (
    <Page title="Secrets and egress">
      {admin ? <NewSecret onDone={secrets.reload} /> : <p class="muted">Only owners and admins add, rotate and delete secrets.</p>}
      <ErrorNote error={secrets.error || error} />
      {!secrets.data ? (
        <Loading what="secrets" />
      ) : (
        <table>
          <thead>
            <tr>
              <th>Name</th>
              <th>Hosts</th>
              <th>Injected as</th>
              <th>Version</th>
              <th>Usable by</th>
              <th>Updated</th>
              {admin ? <ActionsHead /> : null}
            </tr>
          </thead>
          <tbody>
            {secrets.data.secrets.map((secret) => (
              <tr>
                <td>{secret.name}</td>
                <td>{secret.hosts.join(", ")}</td>
                <td>{injection(secret.inject)}</td>
                <td>{secret.version}</td>
                <td>{secret.usable_by}</td>
                <td>{when(secret.updated_at)}</td>
                {admin ? (
                  <td>
                    <Rotate secret={secret} onDone={secrets.reload} />
                    <button
                      type="button"
                      class="danger"
                      aria-label={`Delete ${secret.name}`}
                      onClick={() =>
                        confirm(`Delete the secret ${secret.name}?`) &&
                        run(async () => {
                          ok(await api.DELETE("/v1/secrets/{name}", { params: { path: { name: secret.name } } }));
                          secrets.reload();
                        })
                      }
                    >
                      Delete
                    </button>
                  </td>
                ) : null}
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <EgressDefault />
    </Page>
  );
}
