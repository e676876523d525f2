// Signing up and logging in. The session token goes to sessionStorage only; a sign-up's first
// API key is shown once on the overview, then never again.
import { useState } from "preact/hooks";
import { api, ok, type S } from "../api/client";
import { setSession } from "../session";
import { ErrorNote, Field } from "../ui";

/// The key a sign-up just made, shown once by the overview.
export let freshKey: string | null = null;
export function takeFreshKey(): string | null {
  const key = freshKey;
  freshKey = null;
  return key;
}

function open(answer: S<"LoginResponse">) {
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
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  async function submit(event: Event) {
    event.preventDefault();
    const form = new FormData(event.target as HTMLFormElement);
    setBusy(true);
    try {
      open(ok(await api.POST("/v1/auth/login", { body: { email: String(form.get("email")), password: String(form.get("password")) } })));
    } catch (failure) {
      setError(failure);
    } finally {
      setBusy(false);
    }
  }
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
  const [error, setError] = useState<unknown>(null);
  const [sent, setSent] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  async function submit(event: Event) {
    event.preventDefault();
    const form = new FormData(event.target as HTMLFormElement);
    const body = { email: String(form.get("email")), password: String(form.get("password")), team_name: String(form.get("team")) };
    setBusy(true);
    try {
      const answer = await api.POST("/v1/auth/signup", { body });
      if (answer.response.status === 202) {
        setSent(body.email);
        return;
      }
      const created = ok(answer) as S<"SignupResponse">;
      freshKey = created.api_key.token;
      setSession({ ...created.session, user: created.user, team: created.team, role: "owner", teams: [{ team: created.team, role: "owner" }] });
    } catch (failure) {
      setError(failure);
    } finally {
      setBusy(false);
    }
  }
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
