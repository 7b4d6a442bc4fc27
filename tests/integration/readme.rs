//! The README's quick start, run: its command, what it prints and its exit status are
//! read from README.md itself (the `console` block after "## Quick start"), so the
//! README cannot drift from the program. The figures its prose quotes are checked too:
//! a size in GiB must be one the program prints, a size in MiB one the replayed
//! snapshot holds (as `nvidia-smi` would show it, or as used or reserved).

use crate::helpers::repository;
use crate::helpers::*;
use serde_json::Value;

/// The quick start section of the README: its prose and its one `console` block.
struct QuickStart {
    prose: String,
    block: ConsoleBlock,
}

fn quick_start() -> QuickStart {
    let readme = std::fs::read_to_string(repository().join("README.md")).unwrap();
    let section = readme
        .split("\n## Quick start\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("README.md has no Quick start section");
    let (before, rest) = section
        .split_once("```console\n")
        .expect("the Quick start has no ```console block");
    let after = rest
        .split_once("\n```")
        .expect("an unclosed ```console block")
        .1;
    let mut blocks = console_blocks(section, "README.md's quick start");
    assert_eq!(blocks.len(), 1, "the quick start has one console block");
    QuickStart {
        prose: format!("{before}\n{after}"),
        block: blocks.remove(0),
    }
}

/// The numbers written before `unit` in `text` (`76,107 MiB` -> 76107.0, `74.3 GiB` -> 74.3).
fn figures(text: &str, unit: &str) -> Vec<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(2)
        .filter(|pair| pair[1].trim_end_matches([',', '.', ')', ';', ':']) == unit)
        .map(|pair| pair[0].trim_start_matches(['(', '`']).to_string())
        .filter(|number| number.starts_with(|c: char| c.is_ascii_digit()))
        .collect()
}

/// Every `used` and `reserved` figure of the snapshot, wherever the format keeps them.
fn memory_readings(value: &Value, out: &mut Vec<(u64, u64)>) {
    match value {
        Value::Object(fields) => {
            if let (Some(used), Some(reserved)) = (
                fields.get("used").and_then(Value::as_u64),
                fields.get("reserved").and_then(Value::as_u64),
            ) {
                out.push((used, reserved));
            }
            fields.values().for_each(|item| memory_readings(item, out));
        }
        Value::Array(items) => items.iter().for_each(|item| memory_readings(item, out)),
        _ => {}
    }
}

#[test]
fn quick_start_prints_what_the_readme_shows_and_exits_as_it_says() {
    let quick = quick_start();
    let args = quick
        .block
        .command
        .strip_prefix("cargo run --release -- ")
        .unwrap_or_else(|| {
            panic!(
                "the quick start runs `cargo run --release -- ...`: {}",
                quick.block.command
            )
        });
    // The built binary with the same arguments, in the repository as the README assumes.
    let (printed, status) = run_as_in_a_terminal(
        &exporter_binary(),
        &args.split_whitespace().collect::<Vec<_>>(),
        &repository(),
    );
    assert_block_matches(&quick.block, &printed, status, "README.md's quick start");

    // The prose's GiB are figures the program prints.
    for figure in figures(&quick.prose, "GiB") {
        assert!(
            printed.contains(&format!("{figure} GiB")),
            "the quick start speaks of {figure} GiB, which `check` does not print"
        );
    }
    // Its MiB are the snapshot's: what nvidia-smi shows (used and reserved together),
    // or either alone.
    let snapshot_path = args
        .split_whitespace()
        .skip_while(|arg| *arg != "--replay")
        .nth(1)
        .expect("the quick start replays a snapshot");
    let snapshot: Value =
        serde_json::from_str(&std::fs::read_to_string(repository().join(snapshot_path)).unwrap())
            .unwrap();
    let mut readings = Vec::new();
    memory_readings(&snapshot, &mut readings);
    assert!(!readings.is_empty(), "no memory figures in {snapshot_path}");
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
    let mib_figures = figures(&quick.prose, "MiB");
    assert!(
        !mib_figures.is_empty(),
        "the quick start quotes nvidia-smi's MiB"
    );
    for figure in mib_figures {
        let number: f64 = figure.replace(',', "").parse().unwrap();
        assert!(
            readings.iter().any(|&(used, reserved)| {
                [mib(used + reserved), mib(used), mib(reserved)].contains(&number)
            }),
            "the quick start speaks of {figure} MiB, which is no figure of {snapshot_path}"
        );
    }
}

#[test]
fn elisions_stand_for_any_number_of_lines_and_nothing_else() {
    let expected: Vec<String> = ["a", "...", "c", "..."].map(String::from).to_vec();
    assert!(matches_with_elisions(&expected, &["a", "c"]));
    assert!(matches_with_elisions(&expected, &["a", "b", "b", "c", "d"]));
    assert!(!matches_with_elisions(&expected, &["a", "b"]));
    assert!(!matches_with_elisions(&expected, &["x", "c"]));
    assert!(!matches_with_elisions(&["a".to_string()], &["a", "b"]));
    assert_eq!(
        figures("holding 76,107 MiB (74.3 GiB), and 3 MiB.", "MiB"),
        ["76,107", "3"]
    );
}
