// The dashboard's shell: the session decides between the login pages and the app; the app
// is a navigation bar and the page the path names. The console and the replay player are
// loaded only when opened.
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import "./styles.css";
import { api, ok } from "./api/client";
import { follow, match, navigate, useLocation } from "./router";
import { isAdmin, onSession, session, setSession } from "./session";
import { ErrorNote, useAction } from "./ui";
import { Login, Signup, openSession } from "./pages/login";
import { Overview } from "./pages/overview";
import { Keys } from "./pages/keys";
import { Members } from "./pages/members";
import { Credits, CheckoutReturn } from "./pages/credits";
import { Usage } from "./pages/usage";
import { Sandboxes } from "./pages/sandboxes";
import { SandboxDetail } from "./pages/sandbox";
import { Audit } from "./pages/audit";
import { Secrets } from "./pages/secrets";
import { Store } from "./pages/store";
import { Lazy } from "./lazy";

const NAV: [string, string, boolean][] = [
  ["/", "Overview", false],
  ["/sandboxes", "Sandboxes", false],
  ["/keys", "API keys", false],
  ["/members", "Members", false],
  ["/credits", "Credits", false],
  ["/usage", "Usage", false],
  ["/audit", "Audit log", true],
  ["/secrets", "Secrets", false],
  ["/store", "Models", false],
];

function useSession() {
  const [, bump] = useState(0);
  useEffect(() => onSession(() => bump((n) => n + 1)), []);
  return session();
}

function TeamSwitch() {
  const current = session()!;
  const { error, run } = useAction();
  if (current.teams.length < 2) return <span class="team">{current.team.name}</span>;
  return (
    <label class="team">
      <span class="sr-only">Team</span>
      <select
        value={current.team.id}
        onChange={(event) => {
          const team_id = (event.target as HTMLSelectElement).value;
          return run(async () => {
            openSession(ok(await api.POST("/v1/auth/switch", { body: { team_id } })));
            navigate("/");
          });
        }}
      >
        {current.teams.map((membership) => (
          <option value={membership.team.id}>
            {membership.team.name} ({membership.role})
          </option>
        ))}
      </select>
      <ErrorNote error={error} />
    </label>
  );
}

function Shell({ path }: { path: string }) {
  const current = session()!;
  return (
    <div class="shell">
      <nav class="nav" aria-label="Main">
        <a class="brand" href="/">
          SandBase
        </a>
        <ul>
          {NAV.filter(([, , admin]) => !admin || isAdmin()).map(([href, label]) => (
            <li>
              <a href={href} aria-current={(href === "/" ? path === "/" : path.startsWith(href)) ? "page" : undefined}>
                {label}
              </a>
            </li>
          ))}
        </ul>
        <div class="who">
          <TeamSwitch />
          <span class="muted">
            {current.user.email} · {current.role}
          </span>
          <button type="button" class="secondary" onClick={() => setSession(null)}>
            Log out
          </button>
        </div>
      </nav>
      <main>{route(path)}</main>
    </div>
  );
}

function route(path: string) {
  let params: Record<string, string> | null;
  if (path === "/" || path === "") return <Overview />;
  if (path === "/keys") return <Keys />;
  if (path === "/members") return <Members />;
  if (path === "/credits") return <Credits />;
  if (path === "/billing/success") return <CheckoutReturn />;
  if (path === "/billing/cancel") return <Credits cancelled />;
  if (path === "/usage") return <Usage />;
  if (path === "/sandboxes") return <Sandboxes />;
  if ((params = match("/sandboxes/:id/console", path)))
    return <Lazy key={params.id} load={() => import("./pages/console")} props={{ id: params.id }} />;
  if ((params = match("/sandboxes/:id", path))) return <SandboxDetail key={params.id} id={params.id} />;
  if (path === "/audit") return <Audit />;
  if (path === "/secrets") return <Secrets />;
  if (path === "/store") return <Store />;
  return (
    <section class="page">
      <h1>Not found</h1>
      <p>
        Nothing here. <a href="/">Back to the overview</a>
      </p>
    </section>
  );
}

function App() {
  const current = useSession();
  const url = useLocation();
  const path = url.pathname;
  const open = path === "/login" || path === "/signup";
  useEffect(() => {
    if (!current && !open) navigate(`/login?next=${encodeURIComponent(path + url.search)}`, true);
    if (current && open) {
      const next = url.searchParams.get("next");
      navigate(next?.startsWith("/") && !next.startsWith("//") ? next : "/", true);
    }
  }, [current, path]);
  if (!current) return path === "/signup" ? <Signup /> : <Login />;
  if (open) return null;
  return <Shell path={path} />;
}

document.addEventListener("click", follow);
render(<App />, document.getElementById("app")!);
