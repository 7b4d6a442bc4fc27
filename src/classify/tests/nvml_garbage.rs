//! Garbage from NVML: figures that contradict each other are clamped, never believed.

use crate::classify::tests::fixtures::*;
use crate::classify::*;
use crate::observe::{NvmlLists, ProcessLookup};

#[test]
fn used_beyond_the_total_is_clamped_flagged_and_not_called_orphaned() {
    let mut host = Host::idle().owner(432, Some(CHARGED_ONE_OWNER), present(cuda(432, &[0])));
    *host.readings(0).0 = MemoryReading {
        total: TOTAL,
        reserved: RESERVED,
        used: 4 * TOTAL,
        free: 0,
    };
    let Judged { account, verdict } = host.judged();
    assert!(account.memory_inconsistent);
    assert_eq!(account.memory.used, TOTAL - RESERVED);
    assert_eq!(account.memory.free, 0);
    assert_eq!(account.unattributed_trust, UnattributedTrust::Inconsistent);
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(verdict.finding.kind(), FindingKind::CannotTell);
}

#[test]
fn free_and_reserved_beyond_the_total_are_clamped() {
    let mut host = Host::idle();
    *host.readings(0).0 = MemoryReading {
        total: TOTAL,
        reserved: u64::MAX,
        used: 0,
        free: u64::MAX,
    };
    let account = host.account();
    assert!(account.memory_inconsistent);
    assert_eq!(
        (
            account.memory.reserved,
            account.memory.used,
            account.memory.free
        ),
        (TOTAL, 0, 0)
    );
    assert_eq!(account.orphaned_bytes(), 0);
}

#[test]
fn a_pid_listed_twice_counts_once_with_the_larger_figure() {
    let mut host = Host::idle().used(USED_ONE_OWNER).owner(
        503,
        Some(CHARGED_ONE_OWNER),
        ProcessLookup::Missing,
    );
    host.readings(0).1.push(NvmlProcess {
        pid: 503,
        used_bytes: None,
        mps_only: false,
        lists: NvmlLists::COMPUTE,
    });
    let account = host.account();
    assert_eq!(account.owners.len(), 1);
    assert_eq!(account.orphaned_owner_gone_bytes, CHARGED_ONE_OWNER);
    assert_eq!(account.usage_unavailable_owners, 0);
}

#[test]
fn absurd_per_process_figures_never_exceed_the_gpu() {
    let mut host = Host::idle().used(USED_ONE_OWNER);
    for pid in 1000..1010 {
        host = host.owner(pid, Some(u64::MAX), ProcessLookup::Missing);
    }
    let account = host
        .owner(2000, Some(u64::MAX), present(cuda(2000, &[0])))
        .account();
    let capacity = TOTAL - RESERVED;
    assert!(account.memory_inconsistent);
    // Orphaned memory is part of the used memory; what owners hold, part of the GPU.
    assert_eq!(account.orphaned_bytes(), USED_ONE_OWNER);
    assert_eq!(account.tally.bytes(OwnerState::Gone), capacity);
    assert_eq!(account.tally.bytes(OwnerState::Running), capacity);
}
