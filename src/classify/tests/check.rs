//! What `check` reports, and the GPUs it is asked about.

use crate::classify::tests::fixtures::*;
use crate::classify::*;

#[test]
fn check_reports_orphaned_before_cannot_tell_before_clear() {
    let orphaned = fork_orphan().report();
    let mut lost = Host::idle().observation();
    if let NvmlReading::Up { gpus, .. } = &mut lost.nvml {
        gpus[0].state = GpuState::Failed {
            error: GpuError::GpuLost,
            message: "GPU is lost".into(),
        };
    }
    let lost = classify(&lost, &Settings::default());
    let clear = Host::idle().report();
    let all = [&orphaned.gpus[0], &lost.gpus[0], &clear.gpus[0]];
    assert_eq!(orphaned.check_status(&all), CheckStatus::Orphaned);
    assert_eq!(orphaned.check_status(&all[1..]), CheckStatus::CannotTell);
    assert_eq!(orphaned.check_status(&all[2..]), CheckStatus::Clear);
    assert_eq!(lost.gpus[0].orphaned_bytes(), 0);
}

#[test]
fn a_gpu_that_does_not_answer_is_cannot_tell_and_says_so_above_an_orphan() {
    let report = fork_orphan().gpu(1).not_answering(1, 25.0).report();
    let hung = &report.gpus[1];
    assert_eq!(
        hung.outcome,
        GpuOutcome::NotAnswering {
            call: "nvmlDeviceGetMemoryInfo_v2".into(),
            stuck_seconds: 25.0
        }
    );
    // Neither orphaned nor fine: nothing is known of its memory.
    assert_eq!(hung.account(), None);
    assert_eq!(hung.orphaned_bytes(), 0);
    assert!(!hung.has_orphan());
    assert_eq!(hung.outcome.error_kind(), Some(GpuError::Timeout));
    assert_eq!(hung.status(), CheckStatus::NotAnswering);
    // The orphan beside it is judged as usual, and still named...
    assert_eq!(report.gpus[0].status(), CheckStatus::Orphaned);
    assert!(report.gpus[0].has_orphan());
    assert_eq!(report.orphaned_bytes(), CHARGED_ONE_OWNER);
    // ...but the look is incomplete, and `check` says so above it.
    let all: Vec<&GpuVerdict> = report.gpus.iter().collect();
    assert_eq!(report.check_status(&all), CheckStatus::NotAnswering);
    assert_eq!(report.check_status(&all[..1]), CheckStatus::Orphaned);
    assert_eq!(report.written(), Written::NotAnswered);
    assert_eq!(fork_orphan().report().written(), Written::Complete);
}

#[test]
fn nvml_that_does_not_answer_is_cannot_tell_and_missing_nvml_an_error() {
    let mut observation = Host::idle().observation();
    observation.nvml = nvml_not_answering(12.0);
    let report = classify(&observation, &Settings::default());
    assert!(report.gpus.is_empty());
    assert_eq!(report.check_status(&[]), CheckStatus::NotAnswering);
    assert_eq!(report.nvml.failure(), Some(NvmlFailure::NotAnswering));
    assert_eq!(report.nvml.stuck().unwrap().call, "nvmlInit_v2");
    assert_eq!(report.written(), Written::NotAnswered);
    observation.nvml = nvml_down("cannot load NVML");
    let report = classify(&observation, &Settings::default());
    assert_eq!(report.written(), Written::NvmlDown);
}

#[test]
fn a_scan_cut_short_by_a_blocked_read_is_the_reason_nothing_is_suggested() {
    let mut observation = fork_orphan().observation();
    if let Some(scan) = &mut observation.holder_scan {
        scan.cut_short = true;
        scan.holders.clear();
    }
    observation.procfs_stuck = Some(StuckRead {
        call: "scanning /proc for holders".into(),
        stuck_seconds: 7.6,
    });
    let report = classify(&observation, &Settings::default());
    assert_eq!(report.holder_scan.unwrap().blocked_seconds, Some(7));
    let verdict = report.gpus[0].verdict().unwrap();
    assert_eq!(
        verdict.remedy,
        Remedy::CannotTell {
            reason: Blindness::ScanBlocked { seconds: 7 }
        }
    );
    assert_eq!(report.written(), Written::NotAnswered);
}

#[test]
fn nvml_down_is_its_own_status_with_no_gpus() {
    let mut observation = Host::idle().observation();
    observation.nvml = NvmlReading::Down {
        error: "libnvidia-ml.so.1: cannot open shared object file".into(),
        reason: NvmlFailure::Missing,
        stuck: None,
    };
    let report = classify(&observation, &Settings::default());
    assert!(report.gpus.is_empty());
    assert_eq!(report.check_status(&[]), CheckStatus::NvmlDown);
}

#[test]
fn a_selection_resolves_the_gpus_and_their_status_once() {
    let report = fork_orphan().report();
    let all = report.select(&[]).unwrap();
    assert_eq!(all.gpus.len(), report.gpus.len());
    assert_eq!(all.status, CheckStatus::Orphaned);
    assert_eq!(all.held_as(), HeldAs::Orphaned);
    assert!(all.awaits_freeing() && !all.unseen());
    assert_eq!(all.to_free_bytes(), report.orphaned_bytes());
    assert_eq!(all.orphaned_bytes(), report.orphaned_bytes());
    let missing = report.select(&[0, 7]).unwrap_err();
    assert_eq!(
        missing.to_string(),
        format!(
            "there is no GPU 7; this host has {} (indices 0 to {})",
            report.gpus.len(),
            report.gpus.len() - 1
        )
    );
    assert!(missing
        .in_snapshot()
        .to_string()
        .starts_with("there is no GPU 7; the snapshot has "));
}
