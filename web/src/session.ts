// The dashboard's session: the token from /v1/auth/login, held in sessionStorage (this tab
// only, gone when it closes) and sent as a Bearer token. No cookies: nothing for another site
// to ride on, so no CSRF surface.
import type { S } from "./api/types";

export type SessionState = {
  token: string;
  expires_at: string;
  user: S<"User">;
  team: S<"Team">;
  role: S<"Role">;
  teams: S<"TeamMembership">[];
};

const KEY = "sandbase.session";
let current: SessionState | null = read();
const listeners = new Set<() => void>();

function read(): SessionState | null {
  try {
    const saved = sessionStorage.getItem(KEY);
    if (!saved) return null;
    const session = JSON.parse(saved) as SessionState;
    return Date.parse(session.expires_at) > Date.now() ? session : null;
  } catch {
    return null;
  }
}

export function session(): SessionState | null {
  return current;
}

export function setSession(next: SessionState | null): void {
  current = next;
  if (next) sessionStorage.setItem(KEY, JSON.stringify(next));
  else sessionStorage.removeItem(KEY);
  listeners.forEach((listener) => listener());
}

export function onSession(listener: () => void): () => void {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

/// Owners and admins manage keys, members, secrets and the egress default.
export function isAdmin(): boolean {
  return current?.role === "owner" || current?.role === "admin";
}
