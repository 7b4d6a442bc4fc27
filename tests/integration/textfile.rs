//! `vram-exporter textfile`: the metrics written once for node_exporter's textfile
//! collector, which may read the file at any moment, so it must never see half of one.

use crate::helpers::*;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The family the exporter writes last: a file that ends with it is whole.
const LAST_FAMILY: &str = "vram_scrape_duration_seconds";

#[test]
fn textfile_passes_promtool_and_holds_the_expected_series() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    let live_owner = Holder::spawn(&rig.device(1));
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, dead_owner))
            .gpu(Gpu::one_owner(1, live_owner.pid))
            .into_json(),
    );
    let output = rig.dir.path().join("textfile/vram.prom");
    std::fs::create_dir(output.parent().unwrap()).unwrap();

    let outcome = rig.run(&[
        "textfile",
        "--output",
        output.to_str().unwrap(),
        "--collector.processes",
    ]);
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    assert_eq!(outcome.stdout, "");
    let text = std::fs::read_to_string(&output).unwrap();
    assert_promtool_clean(&text);

    let metrics = Metrics::parse(&text);
    assert_eq!(metrics.value("vram_nvml_up", &[]), 1.0);
    assert_eq!(metrics.value("vram_host_pid_namespace", &[]), 1.0);
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "0"), ("reason", "owner_gone")]
        ),
        CHARGED as f64
    );
    assert_eq!(
        metrics.value("vram_owned_bytes", &[("gpu", "1"), ("state", "running")]),
        CHARGED as f64
    );
    let child_pid = child.pid.to_string();
    assert_eq!(
        metrics.value(
            "vram_holder_info",
            &[("gpu", "0"), ("pid", &child_pid), ("comm", "dataloader")]
        ),
        1.0
    );
    let live_pid = live_owner.pid.to_string();
    assert_eq!(
        metrics.value(
            "vram_process_used_bytes",
            &[("gpu", "1"), ("pid", &live_pid), ("state", "running")]
        ),
        CHARGED as f64
    );
    assert_eq!(metrics.value("vram_holder_scan_complete", &[]), 1.0);
    assert!(text
        .lines()
        .last()
        .unwrap()
        .starts_with(&format!("{LAST_FAMILY} ")));
}

/// `gpus` GPUs with `per_gpu` processes each, all gone: with `--collector.processes`, a
/// body of over a hundred kilobytes, many pages long. (Few GPUs with many processes:
/// the fake NVML parses its whole scenario on every call, and calls grow with GPUs.)
fn crowded_host(rig: &Rig, gpus: u32, per_gpu: u32) {
    let first_pid = nonexistent_pid();
    let mut scenario = Gpus::new();
    for index in 0..gpus {
        let mut gpu = Gpu::idle(index).used(u64::from(per_gpu) * CHARGED);
        for n in 0..per_gpu {
            gpu = gpu.process(first_pid + index * per_gpu + n, Some(CHARGED));
        }
        scenario = scenario.gpu(gpu);
    }
    rig.write_scenario(&scenario.into_json());
}

/// Whether `text` is a whole document: every line parses, it ends with the last
/// family's sample and a newline, and it has every per-process series.
fn whole_document(text: &str, processes: usize) -> Result<(), String> {
    if !text.ends_with('\n') {
        return Err("does not end with a newline".into());
    }
    let last = text.lines().last().unwrap_or_default();
    if !last.starts_with(&format!("{LAST_FAMILY} ")) {
        return Err(format!("ends with {last:?}"));
    }
    let metrics = std::panic::catch_unwind(|| Metrics::parse(text))
        .map_err(|_| "a line does not parse".to_string())?;
    let found = metrics.find("vram_process_used_bytes", &[]).len();
    if found != processes {
        return Err(format!("{found} of {processes} per-process series"));
    }
    Ok(())
}

#[test]
fn textfile_is_never_seen_half_written() {
    const RUNS: usize = 50;
    const GPUS: u32 = 2;
    const PER_GPU: u32 = 600;
    let processes = (GPUS * PER_GPU) as usize;
    let rig = Rig::new();
    crowded_host(&rig, GPUS, PER_GPU);
    let folder = rig.dir.path().join("textfile");
    std::fs::create_dir(&folder).unwrap();
    let output = folder.join("vram.prom");
    let limit = processes.to_string();
    let args = [
        "textfile",
        "--output",
        output.to_str().unwrap(),
        "--collector.processes",
        "--collector.processes.limit",
        &limit,
    ];
    // One run first, so the reader has something to read from its first try on.
    assert_eq!(rig.run(&args).status, Some(0));
    let size = std::fs::metadata(&output).unwrap().len();
    assert!(size > 100 * 1024, "the body is large: {size} bytes");

    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let done = Arc::clone(&done);
        let output = output.clone();
        std::thread::spawn(move || {
            let mut reads = 0usize;
            let mut versions = BTreeSet::new();
            let mut last_whole = String::new();
            while !done.load(Ordering::Acquire) {
                let text = std::fs::read_to_string(&output).expect("the file is always there");
                reads += 1;
                // Two cores may be all there is: leave the writer its turn.
                std::thread::yield_now();
                // A read identical to the last whole one is whole: parse only what is new.
                if text == last_whole {
                    continue;
                }
                if let Err(problem) = whole_document(&text, processes) {
                    return Err(format!(
                        "read {reads} saw a partial file ({problem}), {} bytes",
                        text.len()
                    ));
                }
                versions.insert(text.lines().last().unwrap().to_string());
                last_whole = text;
            }
            Ok((reads, versions.len()))
        })
    };

    for run in 0..RUNS {
        let outcome = rig.run(&args);
        assert_eq!(outcome.status, Some(0), "run {run}: {outcome:?}");
    }
    done.store(true, Ordering::Release);
    let (reads, versions) = reader.join().expect("reader thread").unwrap();
    // The reader read while the file was being replaced, not only before or after.
    assert!(reads >= RUNS, "only {reads} reads during {RUNS} writes");
    assert!(
        versions >= 2,
        "the reader saw {versions} version(s) of the file"
    );

    let left: Vec<String> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["vram.prom"], "no temporary file is left behind");
}

#[test]
fn textfile_into_a_missing_folder_fails_with_one_line() {
    let rig = Rig::new();
    let output = rig.dir.path().join("no-such-folder/vram.prom");
    let outcome = rig.run(&["textfile", "--output", output.to_str().unwrap()]);
    assert_eq!(outcome.status, Some(2), "{outcome:?}");
    assert_eq!(
        outcome.stderr.lines().last().unwrap_or_default(),
        format!(
            "vram-exporter: cannot write {}: No such file or directory (os error 2)",
            output.display()
        )
    );
    assert!(!output.parent().unwrap().exists());
}

#[test]
fn the_help_example_is_the_file_the_systemd_unit_writes() {
    // One path for the textfile directory, Debian's node_exporter default: the one the
    // unit writes (its directory the flags file's, by default the unit's own) and the one
    // `textfile --help` gives as its example.
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy/systemd/vram-exporter-textfile.service"),
    )
    .unwrap();
    let written = unit
        .lines()
        .find_map(|line| line.strip_prefix("ExecStart="))
        .and_then(|command| {
            command
                .split_whitespace()
                .skip_while(|arg| *arg != "-o")
                .nth(1)
        })
        .expect("the unit's ExecStart writes with -o FILE");
    let directory = unit
        .lines()
        .find_map(|line| line.strip_prefix("Environment=VRAM_EXPORTER_TEXTFILE_DIR="))
        .expect("the unit gives the textfile directory a default");
    let written = written.replace("${VRAM_EXPORTER_TEXTFILE_DIR}", directory);
    let help = Rig::new().run(&["textfile", "--help"]);
    assert_eq!(help.status, Some(0), "{help:?}");
    assert!(
        help.stdout.contains(&format!("e.g. {written}")),
        "`textfile --help` does not give {written} as its example:\n{}",
        help.stdout
    );
}
