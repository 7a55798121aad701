//! A folder's whole state, to compare before and after (a revoked turn must leave a workspace
//! byte for byte as it was).

use std::collections::BTreeMap;
use std::path::Path;

/// Everything under `dir`, links not followed: each relative path with what it is (`dir`,
/// `link <target>`, or `file <bytes>`). Entries that cannot be read are marked so.
pub fn snapshot(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(folder) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = path
                .strip_prefix(dir)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            let what = match entry.file_type() {
                Ok(kind) if kind.is_dir() => {
                    stack.push(path.clone());
                    "dir".to_owned()
                }
                Ok(kind) if kind.is_symlink() => match std::fs::read_link(&path) {
                    Ok(target) => format!("link {}", target.display()),
                    Err(error) => format!("unreadable link: {error}"),
                },
                Ok(_) => match std::fs::read(&path) {
                    Ok(bytes) => format!("file {bytes:?}"),
                    Err(error) => format!("unreadable file: {error}"),
                },
                Err(error) => format!("unreadable entry: {error}"),
            };
            out.insert(name, what);
        }
    }
    out
}
