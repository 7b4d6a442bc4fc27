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

/// Flags of other programs that the documents name in the exporter's dotted style, each
/// with the program that takes it.
const OTHER_PROGRAMS_FLAGS: [(&str, &str); 2] = [
    ("--collector.textfile.directory", "node_exporter"),
    // The central Prometheus of docs/fleet.md.
    ("--web.enable-remote-write-receiver", "prometheus"),
];

/// The flags the exporter takes: what every command's `--help` lists, and the hidden
/// ones the files of `src/cli/` declare (`long = "..."`) for tests and benchmarks.
fn exporter_flags() -> Vec<String> {
    let mut flags = Vec::new();
    for command in [&[][..], &["check"], &["snapshot"], &["textfile"]] {
        let help = std::process::Command::new(crate::helpers::exporter_binary())
            .args(command)
            .arg("--help")
            .output()
            .unwrap();
        assert!(help.status.success(), "{command:?} --help");
        flags.extend(dotted_flags(&String::from_utf8(help.stdout).unwrap()));
    }
    let mut cli = String::new();
    let mut folders = vec![repository().join("src/cli")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else {
                cli.push_str(&std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    flags.extend(
        cli.split("long = \"")
            .skip(1)
            .filter_map(|rest| Some(format!("--{}", &rest[..rest.find('"')?]))),
    );
    flags.sort();
    flags.dedup();
    flags
}

/// The flags in the exporter's dotted style (`--web.listen-address`) that `text` names.
fn dotted_flags(text: &str) -> Vec<String> {
    let is_flag_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.".contains(c);
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("--") {
        let after = &rest[start + 2..];
        let preceded_by_word = rest[..start].ends_with(|c: char| c.is_alphanumeric() || c == '-');
        let end = after
            .find(|c: char| !is_flag_char(c))
            .unwrap_or(after.len());
        let name = after[..end].trim_end_matches(['.', '-']);
        if !preceded_by_word
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name.contains('.')
        {
            found.push(format!("--{name}"));
        }
        rest = &after[end..];
    }
    found
}

#[test]
fn every_dotted_flag_the_documents_name_is_one_the_exporter_takes() {
    let known = exporter_flags();
    assert!(known.contains(&"--nvml.library".to_string()), "{known:?}");
    let mut problems = Vec::new();
    for document in documents() {
        let text = std::fs::read_to_string(&document).unwrap();
        for line in text.lines() {
            for flag in dotted_flags(line) {
                let other = OTHER_PROGRAMS_FLAGS
                    .iter()
                    .any(|(name, program)| *name == flag && text.contains(program));
                if !known.contains(&flag) && !other {
                    let shown = document.strip_prefix(repository()).unwrap();
                    problems.push(format!("{}: {flag}: {line}", shown.display()));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "flags the exporter does not take:\n{}",
        problems.join("\n")
    );
}

/// The repository paths that `text` names in inline code (`deploy/image/build.sh`, or
/// the first word of a command such as `deploy/set-runbook-url.sh URL`): those that start
/// with one of the repository's own folders and hold no pattern or placeholder.
fn named_paths(text: &str) -> Vec<String> {
    const FOLDERS: [&str; 12] = [
        "alerts/",
        "benches/",
        "build/",
        "charts/",
        "dashboards/",
        "deploy/",
        "docs/",
        "examples/",
        "fake-nvml/",
        "fuzz/",
        "src/",
        "tests/",
    ];
    let mut paths = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let parts: Vec<&str> = line.split('`').collect();
        for index in (1..parts.len()).step_by(2) {
            // A path of another repository, named just before it ("NordicHPC/sonar,
            // `src/slurm.rs`"), is not this one's.
            let before = parts[index - 1].trim_end().trim_end_matches(',');
            if before
                .split_whitespace()
                .last()
                .is_some_and(|word| word.contains('/'))
            {
                continue;
            }
            let span = parts[index];
            let word = span.split_whitespace().next().unwrap_or_default();
            let word = word.split(['#', ':']).next().unwrap_or_default();
            if FOLDERS.iter().any(|folder| word.starts_with(folder))
                && word
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c))
            {
                paths.push(word.to_string());
            }
        }
    }
    paths
}

#[test]
fn every_repository_path_the_documents_name_in_code_exists() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for document in documents() {
        let text = std::fs::read_to_string(&document).unwrap();
        for path in named_paths(&text) {
            checked += 1;
            if !repository().join(&path).exists() {
                let shown = document.strip_prefix(repository()).unwrap();
                problems.push(format!("{}: `{path}`", shown.display()));
            }
        }
    }
    assert!(checked > 20, "only {checked} paths found");
    assert!(
        problems.is_empty(),
        "paths that do not exist:\n{}",
        problems.join("\n")
    );
}

#[test]
fn flags_and_paths_are_found_where_the_documents_name_them() {
    assert_eq!(
        dotted_flags("`--web.listen-address=:9077` and --path.procfs. not-a--flag.x --help"),
        ["--web.listen-address", "--path.procfs"]
    );
    assert_eq!(
        named_paths("run `deploy/set-runbook-url.sh URL`, see `docs/runbook.md#x` and `target/x`, not `src/*.rs` nor example/other, `src/theirs.rs`\n```\n`docs/nothing.md`\n```"),
        ["deploy/set-runbook-url.sh", "docs/runbook.md"]
    );
}
