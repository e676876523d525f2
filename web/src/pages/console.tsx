// The console: a terminal session in the sandbox (recorded, like every session), attached
// over the sessions WebSocket with a single-use ticket. The session id is kept for this tab,
// so a reload re-attaches to the same shell, its kept output drawn again. What the sandbox
// prints is hostile: xterm.js runs without proposed APIs and without the clipboard addon, so
// no escape sequence reaches the clipboard or anything beyond the terminal.
import { useEffect, useRef, useState } from "preact/hooks";
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import "@xterm/xterm/css/xterm.css";
import { ApiFailure, api, ok } from "../api/client";
import { ErrorNote, Page } from "../ui";

/// Keystroke → echo times (ms) of this page, for the browser test's measurement.
declare global {
  interface Window {
    sandbaseConsole?: { latencies: number[]; session?: number; state: string };
  }
}

const remembered = (id: string) => `sandbase.console.${id}`;

async function session(id: string, cols: number, rows: number): Promise<number> {
  const kept = Number(sessionStorage.getItem(remembered(id)) ?? 0);
  if (kept) {
    const answer = await api.GET("/v1/sandboxes/{id}/pty/{sid}", { params: { path: { id, sid: kept } } });
    if (answer.response.ok && answer.data && answer.data.exit_code == null) return kept;
  }
  const opened = ok(await api.POST("/v1/sandboxes/{id}/pty", { params: { path: { id } }, body: { cols, rows, record: true } }));
  sessionStorage.setItem(remembered(id), String(opened.session_id));
  return opened.session_id;
}

export default function Console({ id }: { id: string }) {
  const box = useRef<HTMLDivElement>(null);
  const [state, setState] = useState("connecting");
  const [error, setError] = useState<unknown>(null);
  const [again, setAgain] = useState(0);
  useEffect(() => {
    const probe: NonNullable<Window["sandbaseConsole"]> = { latencies: [], state: "connecting" };
    window.sandbaseConsole = probe;
    const terminal = new Terminal({ cursorBlink: true, convertEol: false, allowProposedApi: false, fontSize: 14, scrollback: 5000 });
    const fit = new FitAddon();
    terminal.loadAddon(fit);
    terminal.open(box.current!);
    fit.fit();
    let socket: WebSocket | null = null;
    let typed: number[] = [];
    let closed = false;
    const show = (next: string) => {
      probe.state = next;
      setState(next);
    };
    (async () => {
      const sid = await session(id, terminal.cols, terminal.rows);
      probe.session = sid;
      const ticket = ok(await api.POST("/v1/sandboxes/{id}/pty/{sid}/ticket", { params: { path: { id, sid } } }));
      const scheme = location.protocol === "https:" ? "wss" : "ws";
      socket = new WebSocket(`${scheme}://${location.host}/v1/sandboxes/${id}/pty/${sid}/attach?since=0&ticket=${encodeURIComponent(ticket.ticket)}`);
      socket.binaryType = "arraybuffer";
      const encoder = new TextEncoder();
      socket.onmessage = (message) => {
        if (typeof message.data === "string") {
          const control = JSON.parse(message.data) as { type: string; code?: number };
          if (control.type === "attached") show("attached");
          if (control.type === "exit") {
            sessionStorage.removeItem(remembered(id));
            show(`exited (${control.code ?? "?"})`);
          }
          return;
        }
        const now = performance.now();
        for (const at of typed) probe.latencies.push(now - at);
        typed = [];
        terminal.write(new Uint8Array(message.data as ArrayBuffer));
      };
      socket.onclose = () => {
        if (!closed && probe.state === "attached") show("disconnected");
      };
      terminal.onData((data) => {
        if (socket?.readyState !== WebSocket.OPEN) return;
        typed.push(performance.now());
        socket.send(encoder.encode(data));
      });
      terminal.onResize(({ cols, rows }) => {
        if (socket?.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "resize", cols, rows }));
      });
      terminal.focus();
    })().catch((failure) => {
      if (failure instanceof ApiFailure && failure.code === "terminal_not_found") sessionStorage.removeItem(remembered(id));
      setError(failure);
      show("failed");
    });
    const resize = () => fit.fit();
    window.addEventListener("resize", resize);
    return () => {
      closed = true;
      window.removeEventListener("resize", resize);
      socket?.close();
      terminal.dispose();
    };
  }, [id, again]);
  const ended = state.startsWith("exited") || state === "disconnected" || state === "failed";
  return (
    <Page
      title={`Console · ${id.slice(0, 8)}`}
      actions={
        <>
          <span class="muted" data-testid="console-state" role="status">
            {state}
          </span>
          {ended ? (
            <button type="button" onClick={() => setAgain((n) => n + 1)}>
              {state.startsWith("exited") ? "New session" : "Reconnect"}
            </button>
          ) : null}
          <a class="button secondary" href={`/sandboxes/${id}`}>
            Sandbox
          </a>
        </>
      }
    >
      <ErrorNote error={error} />
      <div class="terminal" ref={box} data-testid="terminal" />
    </Page>
  );
}
