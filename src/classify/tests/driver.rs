//! What the driver says the GPU needs.

use crate::classify::tests::fixtures::*;
use crate::classify::*;
use crate::observe::{GpuHealth, ProcessLookup, RecoveryAction};

#[test]
fn an_unheld_orphan_names_the_nvml_clients_a_reset_must_wait_for() {
    let Judged { account, verdict } = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(nvml_client(1711, "nv-hostengine", &[0]))
        .judged();
    assert!(account.culprits.is_empty());
    assert_eq!(
        verdict.remedy,
        Remedy::ResetGpu {
            blockers: vec![1711]
        }
    );
}

#[test]
fn when_the_driver_asks_for_a_reboot_an_unheld_orphan_needs_one() {
    let Judged {
        account: _,
        verdict,
    } = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .scanned()
        .health(recovery(RecoveryAction::NodeReboot))
        .judged();
    assert_eq!(verdict.remedy, Remedy::Reboot);
    assert_eq!(
        verdict.notes[0],
        Note::DriverAsks {
            action: RecoveryAction::NodeReboot
        }
    );
    // A culprit is still the first thing to end: its memory may come back without a reboot.
    let Judged {
        account: _,
        verdict,
    } = fork_orphan()
        .health(recovery(RecoveryAction::NodeReboot))
        .judged();
    assert!(matches!(verdict.remedy, Remedy::Kill { .. }));
}

#[test]
fn a_gpu_reset_action_on_a_healthy_gpu_is_a_note_not_an_orphan() {
    let Judged {
        account: _,
        verdict,
    } = Host::idle()
        .scanned()
        .health(recovery(RecoveryAction::GpuReset))
        .judged();
    assert_eq!(verdict.finding.kind(), FindingKind::Idle);
    assert_eq!(
        verdict.notes,
        vec![Note::DriverAsks {
            action: RecoveryAction::GpuReset
        }]
    );
    // None is nothing to say.
    let Judged {
        account: _,
        verdict,
    } = Host::idle()
        .health(recovery(RecoveryAction::NoneNeeded))
        .judged();
    assert!(verdict.notes.is_empty());
}

#[test]
fn memory_the_operating_system_manages_is_never_called_orphaned() {
    // A GH200 in NUMA mode keeps pages after a process exits: 4 GiB charged to nobody
    // there is normal, and cannot be told from an orphan.
    let Judged { account, verdict } = Host::idle()
        .used(4 * GIB)
        .health(GpuHealth {
            numa_node: Some(1),
            ..GpuHealth::default()
        })
        .judged();
    assert_eq!(account.unattributed_bytes, 4 * GIB);
    assert_eq!(
        account.unattributed_trust,
        UnattributedTrust::NotCounted(NotCounted::OsManaged)
    );
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(verdict.finding.kind(), FindingKind::CannotTell);
}
