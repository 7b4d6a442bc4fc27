//! One report says the same in text, JSON and Prometheus.

use super::*;

/// What `check` ends with for what each output says: `status` in the document; in the
/// text, the worst sentence; in the metrics, the figures.
fn status_of_text(text: &str) -> &'static str {
    let sentences: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("GPU ") && line.contains(": "))
        .collect();
    if text.starts_with("NVML is not available") {
        "nvml_down"
    } else if sentences.iter().any(|line| line.contains(" held ")) {
        "orphaned"
    } else if sentences
        .iter()
        .any(|line| line.contains(": cannot tell: "))
    {
        "cannot_tell"
    } else {
        "clear"
    }
}

fn status_of_metrics(samples: &[Sample]) -> &'static str {
    let total = |family: &str| -> f64 {
        find(samples, family, &[])
            .iter()
            .map(|(_, _, value)| value)
            .sum()
    };
    if total("vram_nvml_up") == 0.0 {
        "nvml_down"
    } else if total("vram_orphaned_bytes") > 0.0 {
        "orphaned"
    } else if find(samples, "vram_gpu_up", &[])
        .iter()
        .any(|(_, _, up)| *up == 0.0)
        || value(samples, "vram_host_pid_namespace", &[]) == 0.0
        || find(samples, "vram_owner_processes", &[("state", "unknown")])
            .iter()
            .any(|(_, _, count)| *count > 0.0)
    {
        "cannot_tell"
    } else {
        "clear"
    }
}

/// The figure in MiB a sentence gives before `then`: `8,802` of `8.6 GiB (8,802 MiB)
/// held`.
fn mib_before(sentence: &str, then: &str) -> u64 {
    let before = sentence.split(&format!(" MiB) {then}")).next().unwrap();
    let figure = before.rsplit('(').next().unwrap().replace(',', "");
    figure.parse().unwrap()
}

#[test]
fn one_report_says_the_same_in_text_json_and_prometheus() {
    let mut cut_short = fork_orphan().holder(nvml_client(467, "nvidia-smi", &[0]));
    cut_short.scan_cut_short = true;
    let mut blind = Host::idle().used(4 * GIB);
    blind.host_pid_namespace = Some(false);
    let hosts = [
        ("stuck", stuck_in_an_ended_container()),
        ("cut short", cut_short),
        ("unheld", Host::idle().used(4 * GIB).scanned()),
        ("blind", blind),
        (
            "owned",
            Host::idle().gpu(1).used(USED_ONE_OWNER).owner(
                432,
                Some(CHARGED_ONE_OWNER),
                present(cuda(432, &[0])),
            ),
        ),
    ];
    for (name, host) in hosts {
        let report = host.report();
        let text = text_of(&report);
        let document = json_of(&report);
        let samples = samples(&metrics_of(&report));
        let status = document["status"].as_str().unwrap();

        // Exit status.
        assert_eq!(status_of_text(&text), status, "{name}: {text}");
        assert_eq!(status_of_metrics(&samples), status, "{name}");
        let gpus: Vec<_> = report.gpus.iter().collect();
        let check = report.check_status(&gpus);
        assert_eq!(json!(check), json!(status), "{name}");
        assert_eq!(
            crate::exit_codes::of(check),
            match status {
                "clear" => 0,
                "orphaned" => 1,
                "cannot_tell" => 3,
                _ => 2,
            },
            "{name}"
        );

        for (index, gpu) in report.gpus.iter().enumerate() {
            let label = index.to_string();
            let gpu_labels = [("gpu", label.as_str())];
            let json = &document["gpus"][index];
            let words = verdict(gpu);

            // Amounts.
            let orphaned = json["orphaned_bytes"].as_u64().unwrap();
            let metric: f64 = find(&samples, "vram_orphaned_bytes", &gpu_labels)
                .iter()
                .map(|(_, _, value)| value)
                .sum();
            assert_eq!(metric as u64, orphaned, "{name} GPU {index}");
            if orphaned > 0 {
                assert_eq!(
                    mib_before(&words.sentence, "held"),
                    orphaned >> 20,
                    "{name}"
                );
            }
            if words.sentence.contains(" owned by ") {
                let live = ["running", "stopped", "uninterruptible", "zombie"];
                let metric: f64 = live
                    .iter()
                    .map(|state| {
                        value(
                            &samples,
                            "vram_owned_bytes",
                            &[gpu_labels[0], ("state", state)],
                        )
                    })
                    .sum();
                let data: u64 = live
                    .iter()
                    .map(|state| json["owners_by_state"][state]["bytes"].as_u64().unwrap())
                    .sum();
                assert_eq!(metric as u64, data, "{name}");
                assert_eq!(
                    mib_before(&words.sentence, "owned by"),
                    data >> 20,
                    "{name}"
                );
            }
            assert_eq!(
                value(&samples, "vram_used_bytes", &gpu_labels) as u64,
                json["memory"]["used"].as_u64().unwrap()
            );

            // Culprits: the kill the text suggests, the document's, the series'.
            let culprits = json_pids(&json["culprits"]);
            let killed: Vec<u32> = words
                .suggestion
                .as_deref()
                .and_then(|command| command.strip_prefix("kill "))
                .map(|rest| {
                    rest.split("   #")
                        .next()
                        .unwrap()
                        .split(' ')
                        .map(|pid| pid.parse().unwrap())
                        .collect()
                })
                .unwrap_or_default();
            let held_by = words
                .sentence
                .split("; still held by ")
                .nth(1)
                .map(pids_named)
                .unwrap_or_default();
            let series: Vec<u32> = find(&samples, "vram_holder_info", &gpu_labels)
                .iter()
                .map(|(_, labels, _)| labels[2].1.parse().unwrap())
                .collect();
            if json["remedy"]["action"] == "kill" {
                assert_eq!(killed, culprits, "{name}");
            }
            assert_eq!(
                held_by,
                if killed.is_empty() {
                    vec![]
                } else {
                    culprits.clone()
                }
            );
            assert_eq!(series, culprits, "{name}");
            let holders = |role: &str| {
                let labels = [gpu_labels[0], ("role", role)];
                value(&samples, "vram_holder_processes", &labels) as usize
            };
            assert_eq!(holders("culprit"), culprits.len(), "{name}");

            // Bystanders.
            let bystanders = json_pids(&json["bystanders"]);
            let noted: Vec<u32> = words
                .notes
                .iter()
                .filter(|note| note.starts_with("Not blamed"))
                .flat_map(|note| pids_named(note))
                .collect();
            assert_eq!(noted, bystanders, "{name}");
            assert_eq!(holders("bystander"), bystanders.len(), "{name}");

            // Notes: one line each in words, one object each in data, and the series
            // that carry the same facts.
            let notes = json["notes"].as_array().unwrap();
            assert_eq!(words.notes.len(), notes.len(), "{name}: {:#?}", words.notes);
            assert_eq!(json["verdict"]["notes"], json!(words.notes));
            let kinds: Vec<&str> = notes
                .iter()
                .map(|note| note["note"].as_str().unwrap())
                .collect();
            assert_eq!(
                kinds.contains(&"bystanders_not_blamed"),
                !bystanders.is_empty(),
                "{name}"
            );
            assert_eq!(
                kinds.contains(&"culprits_container_ended")
                    || kinds.contains(&"owner_container_ended"),
                value(&samples, "vram_exited_container_processes", &gpu_labels) > 0.0,
                "{name}"
            );
            assert_eq!(
                kinds.contains(&"driver_asks"),
                find(&samples, "vram_gpu_recovery_action", &gpu_labels)
                    .iter()
                    .any(|(_, labels, value)| *value == 1.0 && labels[2].1 != "none"),
                "{name}"
            );
            assert_eq!(
                kinds.contains(&"unattributed_not_counted"),
                value(&samples, "vram_unattributed_bytes", &gpu_labels) > 0.0
                    && find(
                        &samples,
                        "vram_orphaned_bytes",
                        &[gpu_labels[0], ("reason", "unattributed")]
                    )[0]
                    .2 == 0.0,
                "{name}"
            );
        }
    }
}
