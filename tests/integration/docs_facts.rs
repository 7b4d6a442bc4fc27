//! What the documents say, against what made it true: an output they quote from a run is
//! in that run's file as printed, the units they and the errors name are the ones the
//! parser takes, a command they time is the one the script runs, and `--help` says what
//! the server answers. (The image's size is checked where the release image is built, by
//! tests/packages/test.sh; the unit's device names by deploy.rs.)

use crate::helpers::{exporter_binary, repository};
use std::path::{Path, PathBuf};
use std::process::Command;

/// README.md and docs/*.md.
fn documents() -> Vec<PathBuf> {
    let mut found = vec![repository().join("README.md")];
    for entry in std::fs::read_dir(repository().join("docs"))
        .unwrap()
        .flatten()
    {
        if entry
            .path()
            .extension()
            .is_some_and(|extension| extension == "md")
        {
            found.push(entry.path());
        }
    }
    found.sort();
    found
}

/// Each fenced block of printed output in `text` (a fence without a language, or
/// `text`; commands to run are `sh`) with the paragraph that introduces it (the last one
/// before it, blank lines between them skipped).
fn blocks_with_their_introductions(text: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut index = 0;
    while index < lines.len() {
        if !lines[index].trim_start().starts_with("```") {
            index += 1;
            continue;
        }
        let language = lines[index].trim_start().trim_start_matches('`').trim();
        if !language.is_empty() && language != "text" {
            index = (index + 1..lines.len())
                .find(|&at| lines[at].trim_start().starts_with("```"))
                .map_or(lines.len(), |end| end + 1);
            continue;
        }
        let end = (index + 1..lines.len())
            .find(|&at| lines[at].trim_start().starts_with("```"))
            .unwrap_or(lines.len());
        let mut last = index;
        while last > 0 && lines[last - 1].trim().is_empty() {
            last -= 1;
        }
        let mut first = last;
        while first > 0 && !lines[first - 1].trim().is_empty() {
            first -= 1;
        }
        found.push((
            lines[first..last].join("\n"),
            lines[index + 1..end].join("\n"),
        ));
        index = end + 1;
    }
    found
}

/// The run files (`.../runs/....md`) an introduction links to, resolved from `document`.
fn runs_cited(document: &Path, introduction: &str) -> Vec<PathBuf> {
    introduction
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|target| target.split('#').next().unwrap())
        .filter(|target| target.contains("runs/") && target.ends_with(".md"))
        .map(|target| document.parent().unwrap().join(target))
        .collect()
}

#[test]
fn an_output_the_documents_quote_from_a_run_is_in_that_run_as_printed() {
    let mut checked = 0;
    let mut problems = Vec::new();
    for document in documents() {
        let text = std::fs::read_to_string(&document).unwrap();
        for (introduction, block) in blocks_with_their_introductions(&text) {
            for run in runs_cited(&document, &introduction) {
                checked += 1;
                let printed = std::fs::read_to_string(&run)
                    .unwrap_or_else(|error| panic!("{}: {error}", run.display()));
                if !printed.contains(&block) {
                    problems.push(format!(
                        "{} quotes from {} a block that is not there as printed:\n{block}",
                        document.display(),
                        run.display()
                    ));
                }
            }
        }
    }
    assert!(checked >= 1, "no quoted run found: the check finds nothing");
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
    // The check itself: the block after an introduction that cites a run.
    let sample = "A verdict ([runs](../tests/gpu/runs/x.md)):\n\n```\nGPU 0\n```\n";
    let found = blocks_with_their_introductions(sample);
    assert_eq!(found[0].1, "GPU 0");
    assert_eq!(
        runs_cited(Path::new("/r/docs/a.md"), &found[0].0),
        [PathBuf::from("/r/docs/../tests/gpu/runs/x.md")]
    );
}

/// The units a one-line error lists after `needs a unit: `.
fn units_in_error(args: &[&str]) -> Vec<String> {
    let output = Command::new(exporter_binary()).args(args).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let list = stderr
        .split("needs a unit: ")
        .nth(1)
        .unwrap_or_else(|| panic!("{stderr}"))
        .split(';')
        .next()
        .unwrap();
    list.split([',', ' '])
        .filter(|word| !word.is_empty() && *word != "or")
        .map(str::to_string)
        .collect()
}

#[test]
fn the_units_the_documents_and_help_name_are_those_the_errors_name_and_the_parser_takes() {
    // Durations: what the error of a number without a unit lists, each of which parses.
    let durations = units_in_error(&["check", "--wait", "30"]);
    assert!(durations.contains(&"ns".to_string()) && durations.contains(&"y".to_string()));
    let story = repository().join("examples/story-gpu2-orphaned.json");
    for unit in &durations {
        let output = Command::new(exporter_binary())
            .args(["check", "--timeout", &format!("3{unit}"), "--replay"])
            .arg(&story)
            .output()
            .unwrap();
        assert_ne!(output.status.code(), Some(2), "3{unit} does not parse");
    }
    // reference.md names the same units, in backticks, in its sentence on durations.
    let reference = std::fs::read_to_string(repository().join("docs/reference.md")).unwrap();
    let paragraph = reference
        .split("\n\n")
        .find(|paragraph| paragraph.contains("Durations are a number and a unit"))
        .expect("reference.md says what a duration is");
    let sentence = &paragraph[paragraph.find("Durations are").unwrap()..];
    let sentence = &sentence[..sentence.find(". Sizes").unwrap_or(sentence.len())];
    let named: Vec<String> = sentence
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.chars().all(|c| c.is_ascii_lowercase()) && span.len() <= 2)
        .map(str::to_string)
        .collect();
    assert_eq!(named, durations, "reference.md's units against the error's");
    // Sizes: the error's list is the one --help gives for the flag that takes a size.
    let sizes = units_in_error(&["--orphan.context-overhead", "16"]);
    let help = Command::new(exporter_binary())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout).replace('\n', " ");
    let listed = help
        .split("with its unit (")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .expect("--help lists the size units");
    let listed: Vec<&str> = listed.split(", ").collect();
    assert_eq!(listed, sizes, "--help's size units against the error's");
}

#[test]
fn help_says_what_a_scrape_gets_while_an_nvml_call_hangs() {
    // web::bad_clients::hung_nvml_call_is_answered_at_once_not_stacked_and_the_exporter_recovers
    // proves it: a 200 with vram_gpu_error{error="timeout"}; a 503 only for a collection
    // that overruns all of the wait.
    let help = Command::new(exporter_binary())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout).replace('\n', " ");
    let text = help
        .split("--web.collection-timeout <DURATION>")
        .nth(1)
        .unwrap()
        .split("[default:")
        .next()
        .unwrap();
    assert!(
        text.contains("vram_gpu_error{error=\"timeout\"}") && text.contains("as a 200"),
        "{text}"
    );
    assert!(
        !text.contains("(a hung NVML call) before it gets 503"),
        "{text}"
    );
    assert!(text.contains("overruns"), "{text}");
}

/// The versions deploy/packages/build.sh pins, by tool.
fn pinned(tool: &str) -> String {
    let script = std::fs::read_to_string(repository().join("deploy/packages/build.sh")).unwrap();
    let variable = format!("{}_VERSION=", tool.to_uppercase().replace('-', "_"));
    script
        .lines()
        .find_map(|line| line.strip_prefix(&variable))
        .unwrap_or_else(|| panic!("build.sh pins no {tool}"))
        .to_string()
}

#[test]
fn the_install_commands_the_documents_time_are_the_ones_build_sh_runs() {
    let script = std::fs::read_to_string(repository().join("deploy/packages/build.sh")).unwrap();
    let runs = script
        .lines()
        .find(|line| line.trim_start().starts_with("cargo install "))
        .expect("build.sh installs its tools with cargo install");
    let deployment = std::fs::read_to_string(repository().join("docs/deployment.md")).unwrap();
    let prose = deployment.replace('\n', " ");
    let mut timed = 0;
    for span in prose.split('`').skip(1).step_by(2) {
        let Some(args) = span.strip_prefix("time cargo install ") else {
            continue;
        };
        timed += 1;
        let tool = args.split_whitespace().last().unwrap();
        for flag in ["--quiet", "--locked", "--debug"] {
            assert_eq!(
                args.contains(flag),
                runs.contains(flag),
                "deployment.md times `{span}`, build.sh runs `{}`",
                runs.trim()
            );
        }
        assert!(
            args.contains(&format!("--version {}", pinned(tool))),
            "{span}"
        );
    }
    assert_eq!(timed, 2, "deployment.md times both tools' installs");
}
