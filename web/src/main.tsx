// The dashboard's shell: the session decides between the login pages and the app; the app
// is a navigation bar and the page the path names. The console and the replay player are
// loaded only when opened.
import { render, type JSX } from "preact";
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

/// The dashboard's pages, in the navigation bar's order: a path pattern (see `match`), the page
/// it shows, and its label when the navigation bar links it (`adminOnly`: only for owners and
/// admins). The first pattern that matches wins.
type Route = {
  pattern: string;
  page: (params: Record<string, string>) => JSX.Element;
  nav?: string;
  adminOnly?: boolean;
};

const ROUTES: Route[] = [
  { pattern: "/", nav: "Overview", page: () => <Overview /> },
  { pattern: "/sandboxes", nav: "Sandboxes", page: () => <Sandboxes /> },
  {
    pattern: "/sandboxes/:id/console",
    page: ({ id }) => <Lazy key={id} load={() => import("./pages/console")} props={{ id }} />,
  },
  { pattern: "/sandboxes/:id", page: ({ id }) => <SandboxDetail key={id} id={id} /> },
  { pattern: "/keys", nav: "API keys", page: () => <Keys /> },
  { pattern: "/members", nav: "Members", page: () => <Members /> },
  { pattern: "/credits", nav: "Credits", page: () => <Credits /> },
  { pattern: "/billing/success", page: () => <CheckoutReturn /> },
  { pattern: "/billing/cancel", page: () => <Credits cancelled /> },
  { pattern: "/usage", nav: "Usage", page: () => <Usage /> },
  { pattern: "/audit", nav: "Audit log", adminOnly: true, page: () => <Audit /> },
  { pattern: "/secrets", nav: "Secrets", page: () => <Secrets /> },
  { pattern: "/store", nav: "Models", page: () => <Store /> },
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
          {ROUTES.filter(({ nav, adminOnly }) => nav && (!adminOnly || isAdmin())).map(({ pattern, nav }) => (
            <li>
              <a
                href={pattern}
                aria-current={(pattern === "/" ? path === "/" : path.startsWith(pattern)) ? "page" : undefined}
              >
                {nav}
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
  for (const { pattern, page } of ROUTES) {
    const params = match(pattern, path);
    if (params) return page(params);
  }
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
