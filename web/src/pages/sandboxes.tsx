// Sandboxes: the live list (refreshed every few seconds) and the form that makes one. Running
// out of credits answers 402, shown as "insufficient credits" with the top-up link.
import { useState } from "preact/hooks";
import { api, ok, type S } from "../api/client";
import { navigate } from "../router";
import { ErrorNote, Field, Loading, Page, age, credits, fields, useAction, useLoad, words } from "../ui";

export const SIZES: Record<string, { cpu: number; memory_mb: number; label: string }> = {
  small: { cpu: 0.5, memory_mb: 512, label: "small — 0.5 CPU, 512 MiB" },
  medium: { cpu: 1, memory_mb: 1024, label: "medium — 1 CPU, 1 GiB" },
  large: { cpu: 2, memory_mb: 4096, label: "large — 2 CPU, 4 GiB" },
};

export function size(resources: S<"Resources">): string {
  return `${resources.cpu_millis / 1000} CPU · ${resources.memory_mb} MiB`;
}

export function egressLine(egress?: S<"EgressPolicy"> | null): string {
  if (!egress?.allow?.length) return "none";
  return egress.allow.join(", ");
}

function Create({ onMade }: { onMade: (sandbox: S<"Sandbox">) => void }) {
  const templates = useLoad(async () => ok(await api.GET("/v1/templates")), []);
  const secrets = useLoad(async () => ok(await api.GET("/v1/secrets")), []);
  const { error, busy, run } = useAction();
  const submit = (event: Event) => {
    const { get, all } = fields(event);
    const chosen = SIZES[get("size")];
    const allow = words(get("allow"));
    const body: S<"CreateSandboxRequest"> = {
      template: get("template"),
      resources: { cpu: chosen.cpu, memory_mb: chosen.memory_mb },
      timeout_secs: Number(get("timeout")) * 60,
      egress: allow.length ? { allow } : null,
      credentials: all("credentials"),
      store: get("store") === "on",
    };
    return run(async () => onMade(ok(await api.POST("/v1/sandboxes", { body }))));
  };
  return (
    <form class="panel form-grid" onSubmit={submit} aria-label="New sandbox">
      <h2>New sandbox</h2>
      <Field label="Template">
        <select name="template" required>
          {(templates.data?.templates ?? [{ name: "base", warm: 0, workers: 0 }]).map((template) => (
            <option value={template.name}>
              {template.name}
              {template.warm ? ` (${template.warm} warm)` : ""}
            </option>
          ))}
        </select>
      </Field>
      <Field label="Size">
        <select name="size">
          {Object.entries(SIZES).map(([name, chosen]) => (
            <option value={name}>{chosen.label}</option>
          ))}
        </select>
      </Field>
      <Field label="Timeout (minutes)">
        <input name="timeout" type="number" min={1} max={1440} value={15} required />
      </Field>
      <Field label="Egress allow-list" hint="Hosts or patterns (*.github.com), one per line; empty: no network.">
        <textarea name="allow" rows={2} />
      </Field>
      <fieldset class="field">
        <legend>Credentials injected by the proxy</legend>
        {secrets.data?.secrets.length ? (
          secrets.data.secrets.map((secret) => (
            <label class="check">
              <input type="checkbox" name="credentials" value={secret.name} /> {secret.name} <small class="muted">({secret.hosts.join(", ")})</small>
            </label>
          ))
        ) : (
          <small class="muted">No secrets yet (Secrets page).</small>
        )}
      </fieldset>
      <label class="check">
        <input type="checkbox" name="store" /> Model store access from inside (no key in the sandbox)
      </label>
      <ErrorNote error={error} />
      <button type="submit" disabled={busy}>
        {busy ? "Starting…" : "Create sandbox"}
      </button>
    </form>
  );
}

export function Sandboxes() {
  const params = new URLSearchParams(location.search);
  const [state, setState] = useState(params.get("state") ?? "live");
  const [creating, setCreating] = useState(params.has("new"));
  const list = useLoad(
    async () => ok(await api.GET("/v1/sandboxes", { params: { query: { state: state === "live" ? undefined : state, limit: 200 } } })),
    [state],
    3000,
  );
  const shown = (list.data?.sandboxes ?? []).filter((sandbox) => state !== "live" || sandbox.state !== "stopped");
  return (
    <Page
      title="Sandboxes"
      actions={
        <button type="button" onClick={() => setCreating(!creating)} aria-expanded={creating}>
          {creating ? "Close" : "New sandbox"}
        </button>
      }
    >
      {creating ? <Create onMade={(sandbox) => navigate(`/sandboxes/${sandbox.id}`)} /> : null}
      <div class="filters">
        <Field label="Show">
          <select value={state} onChange={(event) => setState((event.target as HTMLSelectElement).value)}>
            <option value="live">live</option>
            <option value="running">running</option>
            <option value="paused">paused</option>
            <option value="stopped">stopped</option>
          </select>
        </Field>
      </div>
      <ErrorNote error={list.error} />
      {!list.data ? (
        <Loading what="sandboxes" />
      ) : shown.length === 0 ? (
        <p class="muted">No sandboxes here.</p>
      ) : (
        <table data-testid="sandboxes">
          <thead>
            <tr>
              <th>Sandbox</th>
              <th>State</th>
              <th>Template</th>
              <th>Size</th>
              <th>Age</th>
              <th class="number">Spent</th>
              <th>Egress</th>
            </tr>
          </thead>
          <tbody>
            {shown.map((sandbox) => (
              <tr>
                <td>
                  <a href={`/sandboxes/${sandbox.id}`}>
                    <code>{sandbox.id.slice(0, 8)}</code>
                  </a>{" "}
                  {Object.entries(sandbox.metadata)
                    .slice(0, 2)
                    .map(([key, value]) => (
                      <span class="tag">
                        {key}={value}
                      </span>
                    ))}
                </td>
                <td>
                  <span class={`state ${sandbox.state}`}>{sandbox.state}</span>
                </td>
                <td>{sandbox.template}</td>
                <td>{size(sandbox.resources)}</td>
                <td>{age(sandbox.created_at)}</td>
                <td class="number">{credits(sandbox.spent_micro ?? 0)}</td>
                <td>{egressLine(sandbox.egress)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </Page>
  );
}
