//! The documents link to each other by relative paths and heading anchors, and sections
//! move between them: every such link must name a file that exists and, in a Markdown
//! file, a heading it has (as GitHub names headings).

use crate::alerts::markdown_anchors;
use crate::helpers::repository;
use std::path::{Path, PathBuf};

/// The Markdown files people read: the README, `docs/`, and every README below the root.
fn documents() -> Vec<PathBuf> {
    let root = repository();
    let mut found = vec![root.join("README.md")];
    let mut folders = vec![root.join("docs"), root.join("examples"), root.join("tests")];
    folders.extend(["deploy", "fake-nvml", "charts", "alerts"].map(|name| root.join(name)));
    while let Some(folder) = folders.pop() {
        // Every folder named above, and every one found below them, is read: a renamed
        // folder fails here instead of leaving the check.
        let entries = std::fs::read_dir(&folder)
            .unwrap_or_else(|error| panic!("{}: {error}", folder.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|extension| extension == "md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The targets of the inline links `[text](target)` of `text`, outside code blocks and
/// inline code.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        // Inline code spans hold no links: drop every other backtick-delimited part.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    targets
}

/// What is wrong with the relative link `target` of the document `from`, if anything.
fn broken(from: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (file, anchor) = match target.split_once('#') {
        Some((file, anchor)) => (file, Some(anchor)),
        None => (target, None),
    };
    let file = if file.is_empty() {
        from.to_path_buf()
    } else {
        from.parent().unwrap().join(file)
    };
    if !file.exists() {
        return Some(format!("{} does not exist", file.display()));
    }
    let anchor = anchor?;
    if file.extension().is_none_or(|extension| extension != "md") {
        return None;
    }
    let anchors = markdown_anchors(&std::fs::read_to_string(&file).unwrap());
    (!anchors.iter().any(|known| known == anchor))
        .then(|| format!("{} has no heading #{anchor}", file.display()))
}

#[test]
fn every_relative_link_of_the_documents_names_a_file_and_heading_that_exist() {
    let documents = documents();
    assert!(documents.len() > 5, "{documents:?}");
    let mut problems = Vec::new();
    for document in &documents {
        let text = std::fs::read_to_string(document).unwrap();
        for target in link_targets(&text) {
            if let Some(problem) = broken(document, &target) {
                let shown = document.strip_prefix(repository()).unwrap();
                problems.push(format!("{}: ({target}): {problem}", shown.display()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn links_are_found_outside_code_and_anchors_checked() {
    let text = "see [a](b.md#c) and `[not](a link)`\n```\n[nor](this)\n```\n[x](#y)";
    assert_eq!(link_targets(text), ["b.md#c", "#y"]);
    let readme = repository().join("README.md");
    assert_eq!(broken(&readme, "docs/reference.md#metrics"), None);
    assert!(broken(&readme, "docs/reference.md#no-such-heading").is_some());
    assert!(broken(&readme, "docs/no-such-file.md").is_some());
    assert_eq!(broken(&readme, "https://example.invalid/x#y"), None);
}
