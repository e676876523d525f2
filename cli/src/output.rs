//! Output: the API's JSON with `--json`, else a human form (aligned tables, short
//! timestamps).

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Prints `value` as the API's JSON when `json` is asked for, else in its human form.
pub fn emit<T: Serialize>(json: bool, value: &T, human: impl FnOnce(&T)) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        human(value);
    }
    Ok(())
}

/// Prints rows under headers, each column as wide as its widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers
        .iter()
        .map(|header| header.chars().count())
        .collect();
    for row in rows {
        for (index, cell) in row.iter().enumerate() {
            if let Some(width) = widths.get_mut(index) {
                *width = (*width).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let text: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(index, cell)| format!("{cell:<width$}", width = widths[index]))
            .collect();
        println!("{}", text.join("  ").trim_end());
    };
    line(headers.iter().map(|header| header.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

pub fn time(value: &DateTime<Utc>) -> String {
    value.format("%Y-%m-%d %H:%M:%S").to_string()
}

pub fn optional_time(value: &Option<DateTime<Utc>>) -> String {
    value.as_ref().map(time).unwrap_or_else(|| "-".to_owned())
}
