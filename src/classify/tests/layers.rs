//! Classify's rooms stand in layers, each importing only those below it, in the order
//! docs/development.md draws them: a decider that reached up (the account importing the
//! remedy that is decided from it) is what once made classify a twelve-floor stack with
//! a circle in it. Read from the source, so a `use` that breaks the order fails here.

use std::fs;
use std::path::{Path, PathBuf};

/// Classify's rooms from the bottom up; rooms on one line share a layer and import
/// nothing of each other. `mod.rs` stands above them all.
const LAYERS: [&[&str]; 8] = [
    &["settings", "exporter_process"],
    &["processes"],
    &["owners"],
    &["holders"],
    &["account"],
    &["verdict"],
    &["report"],
    &["selection"],
];

fn layer(room: &str) -> Option<usize> {
    LAYERS.iter().position(|rooms| rooms.contains(&room))
}

/// Every source file of classify but its tests and `mod.rs`, with the room it is in.
fn sources() -> Vec<(String, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/classify");
    let mut files = Vec::new();
    for entry in fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.is_dir() && name != "tests" {
            for inner in fs::read_dir(&path).unwrap() {
                files.push((name.clone(), inner.unwrap().path()));
            }
        } else if path.extension().is_some_and(|ext| ext == "rs") && name != "mod" {
            files.push((name, path));
        }
    }
    files
}

/// The rooms of classify a file's code (not its tests) names: `crate::classify::ROOM`,
/// and `super::ROOM` where `super` is classify itself. A name taken from classify's
/// root (a re-export) is reported as `mod`: the root stands above every room.
fn rooms_named(room: &str, path: &Path) -> Vec<String> {
    let text = fs::read_to_string(path).unwrap();
    // The code before its tests, without comments (a doc link is no import).
    let code: String = text
        .split("#[cfg(test)]")
        .next()
        .unwrap()
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let at_root = path.parent().unwrap().ends_with("classify");
    let in_folder_root = path.file_name().unwrap() == "mod.rs";
    let mut named = Vec::new();
    let mut look = |prefix: &str| {
        for (at, _) in code.match_indices(prefix) {
            let rest = &code[at + prefix.len()..];
            let word: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if word.is_empty() || word.starts_with(char::is_uppercase) {
                named.push("mod".to_string());
            } else if word != room {
                named.push(word);
            }
        }
    };
    look("crate::classify::");
    if at_root || in_folder_root {
        look("super::");
    }
    named
}

#[test]
fn each_room_of_classify_imports_only_rooms_below_it() {
    let mut wrong = Vec::new();
    let files = sources();
    assert!(files.len() > 15, "classify's sources were not found");
    for (room, path) in &files {
        let own = layer(room).unwrap_or_else(|| panic!("{room} is in no layer of LAYERS"));
        for named in rooms_named(room, path) {
            if layer(&named).is_none_or(|below| below >= own) {
                let path = path
                    .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                    .unwrap_or(path);
                wrong.push(format!("{} names {named}", path.display()));
            }
        }
    }
    assert!(wrong.is_empty(), "imports that do not run down: {wrong:#?}");
}
