// The model store: the operator's models with their prices, and copy-paste set-ups for the
// OpenAI and Anthropic SDKs, Claude Code, Codex and Cursor (over MCP) with a key of the
// team's (a new one made here is put into the snippets, shown this once).
import { useState } from "preact/hooks";
import { api, ok } from "../api/client";
import { CopyButton, ErrorNote, Field, Loading, Page, useAction, useLoad } from "../ui";

/// The set-ups, with `token` written in when there is one, else read from SANDBASE_API_KEY
/// the way each client reads the environment.
function snippets(origin: string, token: string | null, model: string): [string, string][] {
  const python = token ? `"${token}"` : 'os.environ["SANDBASE_API_KEY"]';
  const imports = token ? "" : "import os\n";
  const shell = token ?? "$SANDBASE_API_KEY";
  return [
    [
      "OpenAI SDK (Python)",
      `${imports}from openai import OpenAI\n\nclient = OpenAI(base_url="${origin}/openai/v1", api_key=${python})\nprint(client.chat.completions.create(\n    model="${model}", messages=[{"role": "user", "content": "Hello"}],\n).choices[0].message.content)`,
    ],
    [
      "Anthropic SDK (Python)",
      `${imports}from anthropic import Anthropic\n\nclient = Anthropic(base_url="${origin}/anthropic", api_key=${python})\nprint(client.messages.create(\n    model="${model}", max_tokens=256, messages=[{"role": "user", "content": "Hello"}],\n).content[0].text)`,
    ],
    ["Claude Code", `export ANTHROPIC_BASE_URL=${origin}/anthropic ANTHROPIC_AUTH_TOKEN=${shell}\nclaude mcp add --transport http sandbase ${origin}/mcp --header "Authorization: Bearer ${shell}"`],
    [
      "Codex (~/.codex/config.toml)",
      `[mcp_servers.sandbase]\nurl = "${origin}/mcp"\nbearer_token_env_var = "SANDBASE_API_KEY"${token ? `\n\n# and in the shell that starts Codex:\n# export SANDBASE_API_KEY=${token}` : ""}`,
    ],
    [
      "Cursor (~/.cursor/mcp.json)",
      JSON.stringify({ mcpServers: { sandbase: { url: `${origin}/mcp`, headers: { Authorization: `Bearer ${token ?? "${env:SANDBASE_API_KEY}"}` } } } }, null, 2),
    ],
  ];
}

export function Store() {
  const models = useLoad(async () => ok(await api.GET("/v1/store/models")), []);
  const [token, setToken] = useState<string | null>(null);
  const { error, run } = useAction();
  const list = models.data?.models ?? [];
  const [model, setModel] = useState("");
  const chosenModel = model || list[0]?.id || "MODEL";
  const makeKey = () =>
    run(async () => {
      const made = ok(await api.POST("/v1/api-keys", { body: { name: `store-${new Date().toISOString().slice(0, 10)}`, role: "member" } }));
      setToken(made.token);
    });
  return (
    <Page title="Models and agent set-up">
      <ErrorNote error={models.error || error} />
      {!models.data ? (
        <Loading what="models" />
      ) : list.length === 0 ? (
        <p class="muted">This server offers no models (its operator configures them under [store]). The MCP set-ups below work regardless.</p>
      ) : (
        <table>
          <thead>
            <tr>
              <th>Model</th>
              <th>Family</th>
              <th class="number">Context</th>
              <th class="number">Input / 1M</th>
              <th class="number">Cached / 1M</th>
              <th class="number">Output / 1M</th>
            </tr>
          </thead>
          <tbody>
            {list.map((entry) => (
              <tr>
                <td>
                  <code>{entry.id}</code>
                </td>
                <td>{entry.family}</td>
                <td class="number">{entry.context_window.toLocaleString()}</td>
                <td class="number">{entry.prices.input}</td>
                <td class="number">{entry.prices.cached_input}</td>
                <td class="number">{entry.prices.output}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <div class="panel form-grid">
        <h2>Set up a client</h2>
        <p class="muted">
          {token ? "A new key is in the snippets below: copy it now, it is shown this once." : "The snippets read your key from $SANDBASE_API_KEY, or make one for them here."}
        </p>
        <button type="button" class="secondary" onClick={makeKey}>
          Make a key for this
        </button>
        {list.length ? (
          <Field label="Model">
            <select value={chosenModel} onChange={(event) => setModel((event.target as HTMLSelectElement).value)}>
              {list.map((entry) => (
                <option value={entry.id}>{entry.id}</option>
              ))}
            </select>
          </Field>
        ) : null}
      </div>
      {snippets(location.origin, token, chosenModel).map(([title, text]) => (
        <div class="panel">
          <h3>
            {title} <CopyButton text={text} />
          </h3>
          <pre>{text}</pre>
        </div>
      ))}
    </Page>
  );
}
