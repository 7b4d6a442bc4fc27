//! Unattributed memory: what no listed process is charged for, and when it is orphaned.

use crate::classify::tests::fixtures::*;
use crate::classify::*;
use crate::observe::ProcessLookup;

#[test]
fn used_memory_without_any_owner_is_orphaned_as_unattributed() {
    let Judged { account, verdict } = Host::idle().used(4 * GIB).scanned().judged();
    assert_eq!(account.unattributed_bytes, 4 * GIB);
    assert_eq!(account.orphaned_unattributed_bytes(), 4 * GIB);
    assert_eq!(verdict.remedy, Remedy::ResetGpu { blockers: vec![] });
}

#[test]
fn unattributed_is_used_less_charges_less_the_floor_per_context() {
    // 10 GiB used, 8 GiB charged to one live owner: 2 GiB - 16 MiB = 2,130,706,432 bytes.
    let account = Host::idle()
        .used(10 * GIB)
        .owner(432, Some(8 * GIB), present(cuda(432, &[0])))
        .account();
    assert_eq!(account.unattributed_bytes, 2_130_706_432);
    assert_eq!(account.orphaned_bytes(), 2_130_706_432);
}

#[test]
fn unattributed_memory_never_goes_below_zero() {
    let account = Host::idle()
        .used(8 * GIB)
        .owner(432, Some(8 * GIB), present(cuda(432, &[0])))
        .account();
    assert_eq!(account.unattributed_bytes, 0);
}

#[test]
fn a_blind_exporter_reports_unattributed_memory_but_cannot_tell() {
    let mut host = Host::idle().used(4 * GIB);
    host.host_pid_namespace = Some(false);
    let Judged { account, verdict } = host.judged();
    assert_eq!(account.unattributed_bytes, 4 * GIB);
    assert_eq!(
        account.unattributed_trust,
        UnattributedTrust::NotCounted(NotCounted::Blind)
    );
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(verdict.finding.kind(), FindingKind::CannotTell);
    assert_eq!(host.report().gpus[0].status(), CheckStatus::CannotTell);
}

#[test]
fn a_blind_exporter_still_reports_the_gone_owners_it_can_see() {
    let mut host = fork_orphan();
    host.host_pid_namespace = Some(false);
    assert_eq!(host.account().orphaned_bytes(), CHARGED_ONE_OWNER);
}

#[test]
fn a_live_owner_with_unavailable_usage_blocks_unattributed_orphans() {
    let Judged { account, verdict } = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, None, present(cuda(432, &[0])))
        .judged();
    assert_eq!(account.usage_unavailable_owners, 1);
    assert_eq!(account.unattributed_bytes, USED_ONE_OWNER - 16 * MIB);
    assert_eq!(
        account.unattributed_trust,
        UnattributedTrust::NotCounted(NotCounted::OwnersUncertain)
    );
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(verdict.finding.kind(), FindingKind::CannotTell);
}

#[test]
fn a_gone_owner_with_unavailable_usage_leaves_its_memory_unattributed_and_orphaned() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, None, ProcessLookup::Missing)
        .scanned()
        .account();
    assert_eq!(account.orphaned_owner_gone_bytes, 0);
    assert_eq!(
        account.orphaned_unattributed_bytes(),
        USED_ONE_OWNER - 16 * MIB
    );
}

#[test]
fn the_context_overhead_setting_moves_the_floor() {
    let host = Host::idle().used(USED_ONE_OWNER).owner(
        432,
        Some(CHARGED_ONE_OWNER),
        present(cuda(432, &[0])),
    );
    let strict = Settings {
        context_overhead_bytes: 0,
        ..Settings::default()
    };
    let report = classify(&host.observation(), &strict);
    // 9,238,806,528 - 9,229,565,952 with no floor.
    assert_eq!(
        report.gpus[0].account().unwrap().unattributed_bytes,
        9_240_576
    );
}
