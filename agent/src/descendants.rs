//! The processes descended from one: read from `/proc` (the sandbox's own, the agent being
//! its PID 1), for interrupting what a shell runs without ending the shell.

use std::collections::HashMap;

/// Every process descended from `root` (children, their children, …), not `root` itself.
pub fn of(root: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some(parent) = parent_of(&stat) {
            children.entry(parent).or_default().push(pid);
        }
    }
    let mut found = Vec::new();
    let mut next = vec![root];
    while let Some(pid) = next.pop() {
        for &child in children.get(&pid).map(Vec::as_slice).unwrap_or_default() {
            if !found.contains(&child) {
                found.push(child);
                next.push(child);
            }
        }
    }
    found
}

/// The parent pid in a `/proc/PID/stat` line: the second field after the command name,
/// which is in parentheses and may hold spaces and parentheses itself.
fn parent_of(stat: &str) -> Option<u32> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_is_read_past_a_name_with_spaces_and_parentheses() {
        assert_eq!(parent_of("42 (a b) c)) S 7 42 42 0"), Some(7));
        assert_eq!(parent_of("garbage"), None);
    }

    #[test]
    fn a_process_tree_is_found_below_its_root_only() {
        let child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .expect("spawn");
        let root = child.id();
        let mut found = Vec::new();
        for _ in 0..100 {
            found = of(root);
            if !found.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(found.len(), 1, "the sleep below the shell: {found:?}");
        assert!(!found.contains(&root));
        let _ = std::process::Command::new("kill")
            .arg(found[0].to_string())
            .status();
        let mut child = child;
        let _ = child.wait();
    }
}
