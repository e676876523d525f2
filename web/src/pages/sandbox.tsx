// One sandbox: its resources, egress policy and flow log, processes, files (browse, upload,
// download), terminal sessions and recordings; extend, destroy, open the console. What the
// sandbox wrote (file names, metadata, output) is hostile and shown as text only.
import { useState } from "preact/hooks";
import { api, ok, raw, type S } from "../api/client";
import { navigate } from "../router";
import { ActionsHead, ErrorNote, Loading, Page, age, bytes, credits, useAction, useLoad, when } from "../ui";
import { egressLine, size } from "./sandboxes";

function Files({ id }: { id: string }) {
  const [path, setPath] = useState("/work");
  const { error, run } = useAction();
  const listing = useLoad(async () => {
    const answer = await raw(`/v1/sandboxes/${id}/files?path=${encodeURIComponent(path)}`, { headers: { accept: "application/json" } });
    return (await answer.json()) as S<"DirectoryListing">;
  }, [id, path]);
  const download = (entry: S<"FileInfo">) =>
    run(async () => {
      const answer = await raw(`/v1/sandboxes/${id}/files?path=${encodeURIComponent(entry.path)}`);
      const link = document.createElement("a");
      link.href = URL.createObjectURL(await answer.blob());
      link.download = entry.name;
      link.click();
      setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
    });
  const upload = (event: Event) => {
    const input = event.target as HTMLInputElement;
    return run(async () => {
      for (const file of Array.from(input.files ?? [])) {
        await raw(`/v1/sandboxes/${id}/files?path=${encodeURIComponent(`${path.replace(/\/$/, "")}/${file.name}`)}`, {
          method: "PUT",
          headers: { "content-type": "application/octet-stream" },
          body: file,
        });
      }
      input.value = "";
      listing.reload();
    });
  };
  const parent = path.replace(/\/[^/]*\/?$/, "") || "/";
  return (
    <div class="panel">
      <h2>Files</h2>
      <p>
        <code data-testid="cwd">{path}</code>{" "}
        {path !== "/" ? (
          <button type="button" class="secondary" onClick={() => setPath(parent)}>
            Up
          </button>
        ) : null}{" "}
        <label class="button secondary">
          Upload
          <input type="file" multiple class="sr-only" onChange={upload} />
        </label>
      </p>
      <ErrorNote error={listing.error || error} />
      {!listing.data ? (
        <Loading what="files" />
      ) : (
        <table data-testid="files">
          <thead>
            <tr>
              <th>Name</th>
              <th class="number">Size</th>
              <th>Modified</th>
              <ActionsHead />
            </tr>
          </thead>
          <tbody>
            {listing.data.entries.map((entry) => (
              <tr>
                <td>
                  {entry.kind === "dir" ? (
                    <button type="button" class="link" onClick={() => setPath(entry.path)}>
                      {entry.name}/
                    </button>
                  ) : (
                    <span>{entry.name}</span>
                  )}
                </td>
                <td class="number">{entry.kind === "dir" ? "" : bytes(entry.size)}</td>
                <td>{when(entry.modified)}</td>
                <td>
                  {entry.kind === "file" ? (
                    <button type="button" class="secondary" onClick={() => download(entry)} aria-label={`Download ${entry.name}`}>
                      Download
                    </button>
                  ) : null}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </div>
  );
}

function Processes({ id }: { id: string }) {
  const list = useLoad(async () => ok(await api.GET("/v1/sandboxes/{id}/processes", { params: { path: { id } } })), [id], 5000);
  if (!list.data?.processes.length) return null;
  return (
    <div class="panel">
      <h2>Background processes</h2>
      <table>
        <thead>
          <tr>
            <th>PID</th>
            <th>Command</th>
            <th>Started</th>
            <th>State</th>
          </tr>
        </thead>
        <tbody>
          {list.data.processes.map((process) => (
            <tr>
              <td>{process.pid}</td>
              <td>
                <code>{process.cmd.join(" ")}</code>
              </td>
              <td>{when(process.started_at)}</td>
              <td>{process.running ? "running" : `exited ${process.exit_code ?? ""}`}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

function Flows({ id }: { id: string }) {
  const flows = useLoad(async () => ok(await api.GET("/v1/sandboxes/{id}/egress", { params: { path: { id } } })), [id], 5000);
  return (
    <div class="panel">
      <h2>Egress flows</h2>
      <ErrorNote error={flows.error} />
      {!flows.data?.flows.length ? (
        <p class="muted">No connections yet.</p>
      ) : (
        <table>
          <thead>
            <tr>
              <th>When</th>
              <th>Host</th>
              <th>Decision</th>
              <th class="number">Up / down</th>
              <th>Credentials</th>
            </tr>
          </thead>
          <tbody>
            {flows.data.flows
              .slice(-100)
              .reverse()
              .map((flow) => (
                <tr>
                  <td>{when(flow.at)}</td>
                  <td>
                    {flow.host}:{flow.port}
                  </td>
                  <td>
                    {flow.decision}
                    {flow.reason ? ` (${flow.reason})` : ""}
                  </td>
                  <td class="number">
                    {bytes(flow.bytes_up)} / {bytes(flow.bytes_down)}
                  </td>
                  <td>{flow.credentials?.join(", ") || "—"}</td>
                </tr>
              ))}
          </tbody>
        </table>
      )}
    </div>
  );
}

export function SandboxDetail({ id }: { id: string }) {
  const sandbox = useLoad(async () => ok(await api.GET("/v1/sandboxes/{id}", { params: { path: { id } } })), [id], 5000);
  const { error, run } = useAction();
  const act = (call: () => Promise<unknown>) =>
    run(async () => {
      await call();
      sandbox.reload();
    });
  const data = sandbox.data;
  const live = data && data.state !== "stopped";
  return (
    <Page
      title={`Sandbox ${id.slice(0, 8)}`}
      actions={
        live ? (
          <>
            <a class="button" href={`/sandboxes/${id}/console`}>
              Console
            </a>
            <button
              type="button"
              class="secondary"
              onClick={() =>
                act(async () => ok(await api.POST("/v1/sandboxes/{id}/timeout", { params: { path: { id } }, body: { timeout_secs: 15 * 60 } })))
              }
            >
              Extend 15 min
            </button>
            <button
              type="button"
              class="danger"
              onClick={() =>
                confirm("Destroy this sandbox? Its files are gone for good.") &&
                act(async () => {
                  ok(await api.DELETE("/v1/sandboxes/{id}", { params: { path: { id } } }));
                  navigate("/sandboxes");
                })
              }
            >
              Destroy
            </button>
          </>
        ) : null
      }
    >
      <ErrorNote error={sandbox.error || error} />
      {!data ? (
        <Loading what="the sandbox" />
      ) : (
        <>
          <dl class="panel facts">
            <dt>Id</dt>
            <dd>
              <code>{data.id}</code>
            </dd>
            <dt>State</dt>
            <dd>
              <span class={`state ${data.state}`}>{data.state}</span>
              {data.stop_reason ? ` (${data.stop_reason})` : ""}
            </dd>
            <dt>Template</dt>
            <dd>{data.template}</dd>
            <dt>Resources</dt>
            <dd>
              {size(data.resources)} · {data.resources.disk_mb} MiB disk · {data.resources.pids} processes
            </dd>
            <dt>Created</dt>
            <dd>
              {when(data.created_at)} ({age(data.created_at)} ago)
            </dd>
            <dt>Expires</dt>
            <dd>{when(data.expires_at)}</dd>
            <dt>Spent</dt>
            <dd>
              {credits(data.spent_micro ?? 0)}
              {data.max_credits_micro != null ? ` of ${credits(data.max_credits_micro)}` : ""} credits
            </dd>
            <dt>Egress</dt>
            <dd>{egressLine(data.egress)}</dd>
            <dt>Credentials</dt>
            <dd>{data.credentials?.join(", ") || "none"}</dd>
            <dt>Model store</dt>
            <dd>{data.store ? "yes" : "no"}</dd>
            <dt>Metadata</dt>
            <dd data-testid="metadata">
              {Object.entries(data.metadata).map(([key, value]) => (
                <span class="tag">
                  {key}={value}
                </span>
              ))}
            </dd>
          </dl>
          {live ? (
            <>
              <Files id={id} />
              <Processes id={id} />
            </>
          ) : null}
          <Flows id={id} />
        </>
      )}
    </Page>
  );
}
