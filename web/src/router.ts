// A small history-API router: paths are the dashboard's own (the gateway answers them with
// index.html), links are intercepted so a click does not reload the page.
import { useEffect, useState } from "preact/hooks";

const listeners = new Set<() => void>();

export function navigate(to: string, replace = false): void {
  if (replace) history.replaceState(null, "", to);
  else history.pushState(null, "", to);
  listeners.forEach((listener) => listener());
}

window.addEventListener("popstate", () => listeners.forEach((listener) => listener()));

export function useLocation(): URL {
  const [, bump] = useState(0);
  useEffect(() => {
    const listener = () => bump((n) => n + 1);
    listeners.add(listener);
    return () => {
      listeners.delete(listener);
    };
  }, []);
  return new URL(location.href);
}

/// `pattern` like `/sandboxes/:id`; the named parts, or null when it does not match.
export function match(pattern: string, path: string): Record<string, string> | null {
  // A trailing slash does not count, and the empty path is the root.
  const want = pattern.split("/");
  const got = (path.length > 1 ? path.replace(/\/$/, "") : "/").split("/");
  if (want.length !== got.length) return null;
  const params: Record<string, string> = {};
  for (let i = 0; i < want.length; i++) {
    if (want[i].startsWith(":")) params[want[i].slice(1)] = decodeURIComponent(got[i]);
    else if (want[i] !== got[i]) return null;
  }
  return params;
}

/// A click on an in-app link: navigate without reloading (modifier clicks open as usual).
export function follow(event: MouseEvent): void {
  const anchor = (event.target as HTMLElement).closest("a");
  if (!anchor || anchor.target || event.ctrlKey || event.metaKey || event.shiftKey) return;
  const url = new URL(anchor.href, location.href);
  if (url.origin !== location.origin || anchor.hasAttribute("download")) return;
  event.preventDefault();
  navigate(url.pathname + url.search);
}
