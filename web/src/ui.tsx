// Shared pieces of every page: loading data, showing API refusals, copy buttons, formats.
// Everything the API returns is rendered as text (JSX escapes it); nothing is ever set as
// HTML.
import type { ComponentChildren } from "preact";
import { useCallback, useEffect, useState } from "preact/hooks";
import { ApiFailure } from "./api/client";

export type Loaded<T> = {
  data: T | undefined;
  error: unknown;
  reload: () => void;
};

/// Calls `load` now and whenever `deps` change (and every `everyMs`, when given).
export function useLoad<T>(load: () => Promise<T>, deps: unknown[], everyMs?: number): Loaded<T> {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<unknown>(null);
  const [tick, setTick] = useState(0);
  const reload = useCallback(() => setTick((n) => n + 1), []);
  useEffect(() => {
    let live = true;
    load().then(
      (value) => {
        if (!live) return;
        setData(value);
        setError(null);
      },
      (failure) => live && setError(failure),
    );
    return () => {
      live = false;
    };
  }, [...deps, tick]);
  useEffect(() => {
    if (!everyMs) return;
    const timer = setInterval(reload, everyMs);
    return () => clearInterval(timer);
  }, [everyMs]);
  return { data, error, reload };
}

/// A form's or a button's action: `run` carries it out, keeping its refusal in `error` (for
/// `ErrorNote`) and `busy` while it runs; it answers whether the action succeeded.
export function useAction() {
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  const run = useCallback(async (action: () => Promise<unknown>): Promise<boolean> => {
    setBusy(true);
    try {
      await action();
      setError(null);
      return true;
    } catch (failure) {
      setError(failure);
      return false;
    } finally {
      setBusy(false);
    }
  }, []);
  return { error, busy, run };
}

/// A form's fields by name, from its submit event (whose default it prevents).
export function fields(event: Event): { form: HTMLFormElement; get: (name: string) => string; all: (name: string) => string[] } {
  event.preventDefault();
  const form = event.target as HTMLFormElement;
  const data = new FormData(form);
  return { form, get: (name) => String(data.get(name) ?? ""), all: (name) => data.getAll(name).map(String) };
}

/// A list typed into a field: items separated by commas, spaces or new lines.
export function words(value: string): string[] {
  return value
    .split(/[\s,]+/)
    .map((word) => word.trim())
    .filter(Boolean);
}

/// Cursor paging, newest first: the cursor of the page shown, and the way back and on.
export function usePages() {
  const [cursors, setCursors] = useState<(string | undefined)[]>([undefined]);
  return {
    cursor: cursors[cursors.length - 1],
    first: cursors.length < 2,
    newer: () => setCursors(cursors.slice(0, -1)),
    older: (next: string) => setCursors([...cursors, next]),
    reset: () => setCursors([undefined]),
  };
}

export function Pager({ pages, next }: { pages: ReturnType<typeof usePages>; next?: string | null }) {
  return (
    <div class="pager">
      <button type="button" class="secondary" disabled={pages.first} onClick={pages.newer}>
        Newer
      </button>
      <button type="button" class="secondary" disabled={!next} onClick={() => next && pages.older(next)}>
        Older
      </button>
    </div>
  );
}

/// The header of a table's column of buttons (named for screen readers only).
export function ActionsHead() {
  return (
    <th>
      <span class="sr-only">Actions</span>
    </th>
  );
}

/// An API refusal: its code and message; running out of credits links to the top-up.
export function ErrorNote({ error }: { error: unknown }) {
  if (!error) return null;
  if (error instanceof ApiFailure) {
    const credits = error.code === "insufficient_credits" || error.status === 402;
    return (
      <p class="error" role="alert">
        {credits ? "Insufficient credits: " : ""}
        {error.message} <code>{error.code}</code>
        {credits ? (
          <>
            {" "}
            <a href="/credits">Top up credits</a>
          </>
        ) : null}
      </p>
    );
  }
  return (
    <p class="error" role="alert">
      {String(error instanceof Error ? error.message : error)}
    </p>
  );
}

export function Loading({ what }: { what: string }) {
  return <p class="muted">Loading {what}…</p>;
}

export function CopyButton({ text, label = "Copy" }: { text: string; label?: string }) {
  const [done, setDone] = useState(false);
  return (
    <button
      type="button"
      class="secondary"
      onClick={() => {
        navigator.clipboard?.writeText(text).then(
          () => setDone(true),
          () => setDone(false),
        );
      }}
    >
      {done ? "Copied" : label}
    </button>
  );
}

export function Page({ title, actions, children }: { title: string; actions?: ComponentChildren; children: ComponentChildren }) {
  useEffect(() => {
    document.title = `${title} · SandBase`;
  }, [title]);
  return (
    <section class="page">
      <header class="page-head">
        <h1>{title}</h1>
        <div class="actions">{actions}</div>
      </header>
      {children}
    </section>
  );
}

/// A labelled field: the label names the control (its hint stays outside the name), so forms
/// work with the keyboard alone and with screen readers.
export function Field({ label, children, hint }: { label: string; children: ComponentChildren; hint?: string }) {
  return (
    <div class="field">
      <label>
        <span>{label}</span>
        {children}
      </label>
      {hint ? <small class="muted">{hint}</small> : null}
    </div>
  );
}

export function when(value?: string | null): string {
  if (!value) return "—";
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? value : date.toLocaleString();
}

export function age(value?: string | null): string {
  if (!value) return "—";
  const seconds = Math.max(0, (Date.now() - Date.parse(value)) / 1000);
  if (seconds < 60) return `${Math.floor(seconds)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h`;
  return `${Math.floor(seconds / 86400)} d`;
}

export function bytes(value?: number | null): string {
  if (value === undefined || value === null) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let amount = value;
  let unit = 0;
  while (amount >= 1024 && unit < units.length - 1) {
    amount /= 1024;
    unit++;
  }
  return `${unit === 0 ? amount : amount.toFixed(1)} ${units[unit]}`;
}

/// Micro-credits as credits, to the cent unless smaller.
export function credits(micro: number): string {
  const value = micro / 1_000_000;
  return Math.abs(value) >= 0.01 || value === 0 ? value.toFixed(2) : value.toFixed(6);
}
