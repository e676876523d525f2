//! The `files` tool's commands — view (with a line range), create, str_replace, insert —
//! on the MCP server's own file tools (`files_read`, `files_write`, `files_list`): a path
//! relative to `/work` is taken as under it.

use sandbase_mcp::rmcp::model::CallToolResult;
use sandbase_mcp::tools::{files_list, files_read, files_write};
use sandbase_mcp::{Backend, Caller, Encoding, ListParams, PathParams, WriteParams};
use serde_json::Value;

/// What a command gave: the text the model sees, and whether it is an error.
pub type Done = Result<String, String>;

/// `path` in the sandbox: absolute as given, else under `/work`.
fn absolute(path: &str) -> String {
    if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/work/{path}")
    }
}

fn field<'a>(arguments: &'a Value, name: &str) -> Result<&'a str, String> {
    arguments[name]
        .as_str()
        .ok_or_else(|| format!("`{name}` (a string) is required"))
}

/// The text a tool gave, from its result: the structured `content` of a read, else the
/// text blocks (an error's `code: message`).
fn text_of(result: &CallToolResult) -> String {
    if let Some(content) = result
        .structured_content
        .as_ref()
        .and_then(|value| value["content"].as_str())
    {
        return content.to_owned();
    }
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|text| text.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn read<B: Backend>(backend: &B, caller: &Caller<'_>, sandbox: &str, path: &str) -> Done {
    let params = PathParams {
        sandbox_id: sandbox.to_owned(),
        path: path.to_owned(),
    };
    match files_read(backend, caller, params).await {
        Ok(result)
            if result
                .structured_content
                .as_ref()
                .is_some_and(|value| value["encoding"] == "base64") =>
        {
            Err(format!("{path} is not a text file"))
        }
        Ok(result) => Ok(text_of(&result)),
        Err(error) => Err(text_of(&error)),
    }
}

async fn write<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    sandbox: &str,
    path: &str,
    content: String,
) -> Result<(), String> {
    let params = WriteParams {
        sandbox_id: sandbox.to_owned(),
        path: path.to_owned(),
        content,
        encoding: Encoding::Text,
    };
    files_write(backend, caller, params)
        .await
        .map(|_| ())
        .map_err(|error| text_of(&error))
}

/// Runs one `files` command.
pub async fn run<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    sandbox: &str,
    arguments: &Value,
) -> Done {
    let command = field(arguments, "command")?;
    let path = absolute(field(arguments, "path")?);
    match command {
        "view" => view(backend, caller, sandbox, &path, arguments).await,
        "create" => {
            let text = field(arguments, "file_text")?.to_owned();
            let bytes = text.len();
            write(backend, caller, sandbox, &path, text).await?;
            Ok(format!("created {path} ({bytes} bytes)"))
        }
        "str_replace" => {
            let old = field(arguments, "old_str")?;
            let new = arguments["new_str"].as_str().unwrap_or_default();
            let text = read(backend, caller, sandbox, &path).await?;
            match text.matches(old).count() {
                0 => return Err(format!("`old_str` does not occur in {path}")),
                1 => {}
                n => {
                    return Err(format!(
                        "`old_str` occurs {n} times in {path}: make it unique"
                    ));
                }
            }
            let line = text[..text.find(old).unwrap_or(0)].lines().count().max(1);
            write(backend, caller, sandbox, &path, text.replacen(old, new, 1)).await?;
            Ok(format!("replaced the text at line {line} of {path}"))
        }
        "insert" => {
            let after = arguments["insert_line"]
                .as_u64()
                .ok_or("`insert_line` (a line number, 0 for the top) is required")?;
            let insert = field(arguments, "insert_text")?;
            let text = read(backend, caller, sandbox, &path).await?;
            let mut lines: Vec<&str> = text.lines().collect();
            let at = usize::try_from(after).unwrap_or(usize::MAX);
            if at > lines.len() {
                return Err(format!("{path} has {} lines", lines.len()));
            }
            lines.splice(at..at, insert.lines());
            let mut joined = lines.join("\n");
            joined.push('\n');
            write(backend, caller, sandbox, &path, joined).await?;
            Ok(format!(
                "inserted {} line(s) after line {after} of {path}",
                insert.lines().count()
            ))
        }
        other => Err(format!(
            "no command `{other}`: use view, create, str_replace or insert"
        )),
    }
}

async fn view<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    sandbox: &str,
    path: &str,
    arguments: &Value,
) -> Done {
    match read(backend, caller, sandbox, path).await {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let (first, last) = match arguments["view_range"].as_array().map(Vec::as_slice) {
                Some([first, last]) => (
                    first.as_u64().unwrap_or(1).max(1) as usize,
                    match last.as_i64() {
                        Some(-1) | None => lines.len(),
                        Some(n) => usize::try_from(n).unwrap_or(0).min(lines.len()),
                    },
                ),
                _ => (1, lines.len()),
            };
            Ok(lines
                .iter()
                .enumerate()
                .skip(first - 1)
                .take(last.saturating_sub(first - 1))
                .map(|(index, line)| format!("{:6}\t{line}", index + 1))
                .collect::<Vec<_>>()
                .join("\n"))
        }
        Err(error) if error.contains("is_a_directory") => {
            let params = ListParams {
                sandbox_id: sandbox.to_owned(),
                path: Some(path.to_owned()),
            };
            files_list(backend, caller, params)
                .await
                .map(|listed| text_of(&listed))
                .map_err(|error| text_of(&error))
        }
        Err(error) => Err(error),
    }
}
