//! The `console` blocks of a Markdown document: a command after `$ `, what it prints, and
//! its exit status after `$ echo $?`. The README and `examples/README.md` quote the
//! program this way; the tests run each command and compare.

use std::path::Path;
use std::process::Command;

/// One ```` ```console ```` block.
#[derive(Debug, Clone)]
pub struct ConsoleBlock {
    /// The command, without the `$ ` prompt.
    pub command: String,
    /// The lines printed, where a line `...` stands for any number of lines.
    pub output: Vec<String>,
    /// The status shown after `$ echo $?`.
    pub status: i32,
}

/// Every `console` block of `markdown`, in order; `name` is the document's, for failures.
/// Each block is one command, its output and its status: a block in any other shape fails.
pub fn console_blocks(markdown: &str, name: &str) -> Vec<ConsoleBlock> {
    markdown
        .split("```console\n")
        .skip(1)
        .map(|rest| {
            let block = rest
                .split_once("\n```")
                .unwrap_or_else(|| panic!("{name}: an unclosed ```console block"))
                .0;
            console_block(block, name)
        })
        .collect()
}

fn console_block(block: &str, name: &str) -> ConsoleBlock {
    let mut lines = block.lines();
    let command = lines
        .next()
        .and_then(|line| line.strip_prefix("$ "))
        .unwrap_or_else(|| panic!("{name}: a console block starts with the command, after '$ '"))
        .to_string();
    let mut output = Vec::new();
    let mut status = None;
    while let Some(line) = lines.next() {
        if line == "$ echo $?" {
            let shown = lines
                .next()
                .unwrap_or_else(|| panic!("{name}: a status after '$ echo $?'"));
            status = Some(
                shown
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}: the status {shown:?} is a number")),
            );
            assert_eq!(
                lines.next(),
                None,
                "{name}: the block of `{command}` ends with its status"
            );
            break;
        }
        output.push(line.to_string());
    }
    ConsoleBlock {
        status: status.unwrap_or_else(|| {
            panic!("{name}: the block of `{command}` shows its exit status with '$ echo $?'")
        }),
        command,
        output,
    }
}

/// Whether `actual` is `expected` where each `...` line stands for any number of lines.
pub fn matches_with_elisions(expected: &[String], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first == "..." => {
            (0..=actual.len()).any(|skip| matches_with_elisions(rest, &actual[skip..]))
        }
        Some((first, rest)) => actual
            .split_first()
            .is_some_and(|(line, more)| line == first && matches_with_elisions(rest, more)),
    }
}

/// Run `program` with `args` in `folder`, its standard error merged into its standard
/// output as a terminal shows them: what it printed and its exit status.
pub fn run_as_in_a_terminal(program: &Path, args: &[&str], folder: &Path) -> (String, i32) {
    let output = Command::new("sh")
        .arg("-c")
        .arg("exec \"$0\" \"$@\" 2>&1")
        .arg(program)
        .args(args)
        .current_dir(folder)
        .output()
        .expect("run the documented command");
    let printed = String::from_utf8(output.stdout).expect("the program prints UTF-8");
    let status = output
        .status
        .code()
        .expect("the documented command exits, not killed by a signal");
    (printed, status)
}

/// Fail unless running `block`'s command printed what the block shows and exited with
/// its status. `printed` and `status` are what the run gave; `document` names the file.
pub fn assert_block_matches(block: &ConsoleBlock, printed: &str, status: i32, document: &str) {
    let lines: Vec<&str> = printed.lines().collect();
    assert!(
        matches_with_elisions(&block.output, &lines),
        "{document} shows:\n{}\nbut `{}` prints:\n{printed}",
        block.output.join("\n"),
        block.command
    );
    assert_eq!(
        status, block.status,
        "{document} says `{}` exits with status {}",
        block.command, block.status
    );
}
