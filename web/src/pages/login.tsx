// Signing up and logging in. The session token goes to sessionStorage only; a sign-up's first
// API key is shown once on the overview, then never again.
import { useState } from "preact/hooks";
import { api, ok, type S } from "../api/client";
import { setSession } from "../session";
import { ErrorNote, Field, fields, useAction } from "../ui";

/// The key a sign-up just made, shown once by the overview.
export let freshKey: string | null = null;
export function takeFreshKey(): string | null {
  const key = freshKey;
  freshKey = null;
  return key;
}

/// A session from a login's (or a team switch's) answer.
export function openSession(answer: S<"LoginResponse">) {
  setSession({ ...answer.session, user: answer.user, team: answer.team, role: answer.role, teams: answer.teams });
}

function Card({ title, children }: { title: string; children: preact.ComponentChildren }) {
  return (
    <main class="auth">
      <div class="card">
        <p class="brand">SandBase</p>
        <h1>{title}</h1>
        {children}
      </div>
    </main>
  );
}

export function Login() {
  const { error, busy, run } = useAction();
  const submit = (event: Event) => {
    const { get } = fields(event);
    return run(async () => openSession(ok(await api.POST("/v1/auth/login", { body: { email: get("email"), password: get("password") } }))));
  };
  return (
    <Card title="Log in">
      <form onSubmit={submit}>
        <Field label="E-mail">
          <input name="email" type="email" autocomplete="username" required autofocus />
        </Field>
        <Field label="Password">
          <input name="password" type="password" autocomplete="current-password" required />
        </Field>
        <ErrorNote error={error} />
        <button type="submit" disabled={busy}>
          Log in
        </button>
      </form>
      <p>
        New here? <a href="/signup">Create an account</a>
      </p>
    </Card>
  );
}

export function Signup() {
  const { error, busy, run } = useAction();
  const [sent, setSent] = useState<string | null>(null);
  const submit = (event: Event) => {
    const { get } = fields(event);
    const body = { email: get("email"), password: get("password"), team_name: get("team") };
    return run(async () => {
      const answer = await api.POST("/v1/auth/signup", { body });
      if (answer.response.status === 202) {
        setSent(body.email);
        return;
      }
      const created = ok(answer) as S<"SignupResponse">;
      freshKey = created.api_key.token;
      setSession({ ...created.session, user: created.user, team: created.team, role: "owner", teams: [{ team: created.team, role: "owner" }] });
    });
  };
  if (sent) {
    return (
      <Card title="Check your mail">
        <p>
          A confirmation went to <strong>{sent}</strong>. Follow it, then <a href="/login">log in</a>.
        </p>
      </Card>
    );
  }
  return (
    <Card title="Create an account">
      <form onSubmit={submit}>
        <Field label="E-mail">
          <input name="email" type="email" autocomplete="username" required autofocus />
        </Field>
        <Field label="Password" hint="At least 10 characters.">
          <input name="password" type="password" autocomplete="new-password" minLength={10} required />
        </Field>
        <Field label="Team name">
          <input name="team" required maxLength={100} />
        </Field>
        <ErrorNote error={error} />
        <button type="submit" disabled={busy}>
          Create account
        </button>
      </form>
      <p>
        Have an account? <a href="/login">Log in</a>
      </p>
    </Card>
  );
}
