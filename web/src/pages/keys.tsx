// API keys: made with a name, role (at most the caller's own), expiry, spend cap and allowed
// models; the token is shown once, masked after; revoked with a confirmation where the API
// allows it (an admin or owner of at least the key's role, or the person who made it).
import { useState } from "preact/hooks";
import { api, ok, type S } from "../api/client";
import { session } from "../session";

const RANK: Record<string, number> = { owner: 3, admin: 2, member: 1 };

function mayRevoke(key: S<"ApiKey">): boolean {
  const me = session();
  if (!me) return false;
  if (key.created_by === me.user.id) return true;
  return RANK[me.role] >= RANK.admin && RANK[me.role] >= RANK[key.role];
}
import { ActionsHead, CopyButton, ErrorNote, Field, Loading, Page, credits, fields, useAction, useLoad, when } from "../ui";

function NewKey({ onMade }: { onMade: (key: S<"CreatedApiKey">) => void }) {
  const { error, run } = useAction();
  const submit = (event: Event) => {
    const { form, get } = fields(event);
    const days = Number(get("days") || 0);
    const cap = get("max_credits").trim();
    const models = get("models")
      .split(/[\s,]+/)
      .filter(Boolean);
    const body: S<"CreateApiKeyRequest"> = {
      name: get("name"),
      role: get("role") as S<"Role">,
      expires_in_secs: days > 0 ? days * 86400 : null,
      max_credits: cap || null,
      allowed_models: models.length ? models : null,
    };
    return run(async () => {
      onMade(ok(await api.POST("/v1/api-keys", { body })));
      form.reset();
    });
  };
  return (
    <form class="panel form-grid" onSubmit={submit} aria-label="New API key">
      <h2>New key</h2>
      <Field label="Name">
        <input name="name" required maxLength={100} placeholder="ci, agent-prod…" />
      </Field>
      <Field
        label="Role"
        hint="Member unless you choose. Only an admin's or owner's key with no expiry, no cap and no parent key changes membership."
      >
        <select name="role">
          {["member", "admin", "owner"]
            .filter((role) => RANK[role] <= RANK[session()?.role ?? "member"])
            .map((role) => (
              <option value={role}>{role}</option>
            ))}
        </select>
      </Field>
      <Field label="Expires in (days)" hint="Empty: never.">
        <input name="days" type="number" min={1} max={3650} />
      </Field>
      <Field label="Spend cap (credits)" hint="Empty: no cap.">
        <input name="max_credits" inputMode="decimal" pattern="[0-9]+(\.[0-9]+)?" />
      </Field>
      <Field label="Allowed models" hint="Model ids, comma separated; empty: all.">
        <input name="models" />
      </Field>
      <ErrorNote error={error} />
      <button type="submit">Create key</button>
    </form>
  );
}

function Made({ made, onDone }: { made: S<"CreatedApiKey">; onDone: () => void }) {
  const [shown, setShown] = useState(true);
  return (
    <div class="panel notice" role="status">
      <h2>Key “{made.name}” created</h2>
      {shown ? (
        <>
          <p>Copy the token now: it is shown this once and never again.</p>
          <p>
            <code class="secret" data-testid="new-token">
              {made.token}
            </code>{" "}
            <CopyButton text={made.token} />
          </p>
        </>
      ) : (
        <p>
          <code data-testid="new-token">{made.public_id}…••••••••</code>
        </p>
      )}
      <button
        type="button"
        class="secondary"
        onClick={() => {
          setShown(false);
          onDone();
        }}
      >
        Done
      </button>
    </div>
  );
}

export function Keys() {
  const keys = useLoad(async () => ok(await api.GET("/v1/api-keys")), []);
  const [made, setMade] = useState<S<"CreatedApiKey"> | null>(null);
  const { error, run } = useAction();
  const revoke = (key: S<"ApiKey">) =>
    confirm(`Revoke “${key.name}”? Clients using it stop working at once.`) &&
    run(async () => {
      ok(await api.DELETE("/v1/api-keys/{id}", { params: { path: { id: key.id } } }));
      keys.reload();
    });
  return (
    <Page title="API keys">
      {made ? <Made made={made} onDone={() => setMade(null)} /> : null}
      <NewKey
        onMade={(key) => {
          setMade(key);
          keys.reload();
        }}
      />
      <ErrorNote error={keys.error || error} />
      {!keys.data ? (
        <Loading what="keys" />
      ) : (
        <table>
          <thead>
            <tr>
              <th>Name</th>
              <th>Key</th>
              <th>Role</th>
              <th>Created</th>
              <th>Last used</th>
              <th>Expires</th>
              <th>Spent / cap</th>
              <th>Models</th>
              <ActionsHead />
            </tr>
          </thead>
          <tbody>
            {keys.data.items.map((key) => (
              <tr>
                <td>{key.name}</td>
                <td>
                  <code>{key.public_id}…</code>
                </td>
                <td>{key.role}</td>
                <td>{when(key.created_at)}</td>
                <td>{when(key.last_used_at)}</td>
                <td>{when(key.expires_at)}</td>
                <td>
                  {credits(key.spent_micro ?? 0)} / {key.max_credits_micro == null ? "no cap" : credits(key.max_credits_micro)}
                </td>
                <td>{key.allowed_models?.join(", ") || "all"}</td>
                <td>
                  {mayRevoke(key) ? (
                    <button type="button" class="danger" onClick={() => revoke(key)} aria-label={`Revoke ${key.name}`}>
                      Revoke
                    </button>
                  ) : null}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </Page>
  );
}
