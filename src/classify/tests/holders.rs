//! Culprits and bystanders: who keeps orphaned memory, and who merely holds the device file.

use crate::classify::tests::fixtures::*;
use crate::classify::*;
use crate::observe::{ProcessFacts, ProcessLookup, References};

#[test]
fn a_forked_child_mapping_the_gpu_is_the_culprit_with_its_evidence() {
    let Judged { account, verdict } = fork_orphan().judged();
    assert_eq!(pids(&account.culprits), vec![524]);
    assert_eq!(
        account.culprits[0].evidence,
        vec![
            Evidence::MapsGpu,
            Evidence::Inherited,
            Evidence::ChildOf { pid: 503 },
            Evidence::ProcessGroupOf { pid: 503 },
            Evidence::SessionOf { pid: 503 },
        ]
    );
    assert_eq!(
        verdict.remedy,
        Remedy::Kill {
            targets: vec![KillTarget {
                pid: 524,
                start_time_ticks: 150_000,
                started_unix_seconds: Some(BOOT + 1_500),
                started: Started::At {
                    unix_seconds: BOOT + 1_500
                },
                comm: "python3".into(),
            }]
        }
    );
}

#[test]
fn an_nvml_client_under_any_name_is_a_bystander_never_in_the_kill() {
    // The H200 case: a python3 monitoring script holding /dev/nvidia0 open was put into
    // `kill 467 513` beside the real holder. It maps nothing: it holds no context.
    let Judged { account, verdict } = fork_orphan()
        .holder(nvml_client(467, "python3", &[0]))
        .judged();
    assert_eq!(pids(&account.culprits), vec![524]);
    assert_eq!(pids(&account.bystanders), vec![467]);
    assert_eq!(account.bystanders[0].evidence, vec![Evidence::NoContext]);
    let Remedy::Kill { targets } = &verdict.remedy else {
        panic!("{:?}", verdict.remedy)
    };
    assert_eq!(targets.iter().map(|t| t.pid).collect::<Vec<_>>(), vec![524]);
}

#[test]
fn a_known_agent_name_is_a_label_not_a_verdict() {
    let account = fork_orphan()
        .holder(nvml_client(1711, "nv-hostengine", &[0]))
        .account();
    assert_eq!(
        account.bystanders[0].evidence,
        vec![Evidence::NoContext, Evidence::KnownAgent]
    );
    // A process under an agent's name that maps the GPU holds a context: it is blamed.
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(ProcessFacts {
            comm: "nv-hostengine".into(),
            ..cuda(1711, &[0])
        })
        .account();
    assert_eq!(pids(&account.culprits), vec![1711]);
    assert!(account.culprits[0].evidence.contains(&Evidence::KnownAgent));
}

#[test]
fn a_live_job_of_gpu_0_holding_gpu_1s_node_is_a_bystander_on_gpu_1() {
    // The CUDA runtime opens every visible GPU's node: a job on GPU 0 holds /dev/nvidia1
    // but maps only /dev/nvidia0. GPU 1 has a fork orphan held by 524.
    let job = cuda(900, &[0]).with_descriptors(&[0, 1]);
    let host = Host::idle()
        .gpu(1)
        .used_on(0, USED_ONE_OWNER)
        .owner_on(0, 900, Some(CHARGED_ONE_OWNER), present(job.clone()))
        .used_on(1, USED_ONE_OWNER)
        .owner_on(1, 503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(job)
        .holder(cuda(524, &[1]).child_of(503));
    let gpu1 = host.account_of(1);
    assert_eq!(pids(&gpu1.culprits), vec![524]);
    assert_eq!(pids(&gpu1.bystanders), vec![900]);
    assert_eq!(
        gpu1.bystanders[0].evidence,
        vec![Evidence::OwnerOfOtherGpus { gpus: vec![0] }]
    );
    // GPU 0 has nothing orphaned: nothing is blamed there.
    let Judged {
        account: gpu0,
        verdict: gpu0_verdict,
    } = host.judged_of(0);
    assert_eq!(gpu0_verdict.finding.kind(), FindingKind::Owned);
    assert!(gpu0.culprits.is_empty() && gpu0.bystanders.is_empty());
}

#[test]
fn holders_are_named_only_for_a_gpu_with_orphaned_memory() {
    let Judged { account, verdict } = Host::idle()
        .holder(nvml_client(467, "python3", &[0]))
        .holder(cuda(524, &[0]))
        .judged();
    assert_eq!(verdict.finding.kind(), FindingKind::Idle);
    assert!(account.culprits.is_empty() && account.bystanders.is_empty());
}

#[test]
fn three_dataloader_workers_are_all_culprits_in_pid_order() {
    let mut host = Host::idle().used(USED_ONE_OWNER).owner(
        503,
        Some(CHARGED_ONE_OWNER),
        ProcessLookup::Missing,
    );
    for pid in [530, 528, 529] {
        host = host.holder(cuda(pid, &[0]).child_of(503));
    }
    let Judged { account, verdict } = host.judged();
    assert_eq!(pids(&account.culprits), vec![528, 529, 530]);
    let Remedy::Kill { targets } = &verdict.remedy else {
        panic!("{:?}", verdict.remedy)
    };
    assert_eq!(targets.len(), 3);
}

#[test]
fn a_zombie_leader_holder_is_a_culprit_through_its_threads_mappings() {
    let mut zombie = cuda(524, &[0]).child_of(503).state('Z');
    zombie.threads = 2;
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(zombie)
        .account();
    assert_eq!(pids(&account.culprits), vec![524]);
    assert_eq!(account.culprits[0].process.state, ProcessState::Zombie);
}

#[test]
fn a_child_adopted_by_the_dead_owners_parent_carries_that_tie() {
    let mut owner = cuda(503, &[0]);
    owner.ppid = 480;
    let mut child = cuda(524, &[0]);
    child.ppid = 480;
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .first_seen(503, &owner)
        .holder(child)
        .account();
    assert!(account.culprits[0]
        .evidence
        .contains(&Evidence::AdoptedByOwnersParent {
            pid: 503,
            parent: 480
        }));
}

#[test]
fn a_candidate_with_unreadable_mappings_is_undetermined_and_nothing_is_suggested() {
    let mut unknown = cuda(524, &[0]).child_of(503);
    unknown.mappings = References::Unreadable;
    let Judged { account, verdict } = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(unknown)
        .judged();
    assert_eq!(pids(&account.undetermined), vec![524]);
    assert!(account.culprits.is_empty());
    assert_eq!(
        verdict.remedy,
        Remedy::CannotTell {
            reason: Blindness::MappingsUnreadable { processes: 1 }
        }
    );
}

#[test]
fn culprits_beside_an_undetermined_holder_are_named_with_a_note() {
    let mut unknown = cuda(600, &[0]);
    unknown.mappings = References::Unreadable;
    let Judged {
        account: _,
        verdict,
    } = fork_orphan().holder(unknown).judged();
    assert!(matches!(verdict.remedy, Remedy::Kill { .. }));
    assert!(verdict
        .notes
        .contains(&Note::UndeterminedHolders { pids: vec![600] }));
}

#[test]
fn a_gpus_own_live_owner_is_never_its_candidate() {
    let Judged { account, verdict } = Host::idle()
        .used(2 * USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(cuda(432, &[0])))
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(cuda(432, &[0]))
        .judged();
    assert!(account.culprits.is_empty() && account.bystanders.is_empty());
    assert_eq!(verdict.remedy, Remedy::StopOwners { pids: vec![432] });
}

#[test]
fn with_no_holder_and_a_complete_scan_only_a_reset_frees_it() {
    let Judged {
        account: _,
        verdict,
    } = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .scanned()
        .judged();
    assert_eq!(verdict.remedy, Remedy::ResetGpu { blockers: vec![] });
}

#[test]
fn an_incomplete_scan_without_a_culprit_cannot_tell() {
    let mut host = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .scanned();
    host.scan_cut_short = true;
    assert_eq!(
        host.judged().verdict.remedy,
        Remedy::CannotTell {
            reason: Blindness::ScanCutShort
        }
    );
    host.scan_cut_short = false;
    host.scan_denied = 3;
    assert_eq!(
        host.judged().verdict.remedy,
        Remedy::CannotTell {
            reason: Blindness::ScanDenied { processes: 3 }
        }
    );
    host.holders = None;
    assert_eq!(
        host.judged().verdict.remedy,
        Remedy::CannotTell {
            reason: Blindness::NoScan
        }
    );
}

#[test]
fn culprits_found_by_an_incomplete_scan_are_named_with_a_warning() {
    let mut host = fork_orphan();
    host.scan_denied = 2;
    let Judged {
        account: _,
        verdict,
    } = host.judged();
    assert!(matches!(verdict.remedy, Remedy::Kill { .. }));
    assert!(verdict.notes.contains(&Note::MoreHoldersPossible {
        reason: Blindness::ScanDenied { processes: 2 }
    }));
}

#[test]
fn a_culprit_not_visible_here_is_named_but_not_suggested_for_kill() {
    let mut culprit = cuda(524_000, &[0]);
    culprit.local_pid = None;
    let mut host = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(3, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(culprit);
    host.procfs_view = ProcfsView::Foreign;
    let Judged { account, verdict } = host.judged();
    assert_eq!(pids(&account.culprits), vec![524_000]);
    assert!(!account.culprits[0].process.visible_here);
    assert_eq!(
        verdict.remedy,
        Remedy::CannotTell {
            reason: Blindness::CulpritsNotVisible
        }
    );
}

#[test]
fn kinship_is_not_claimed_across_pid_namespaces() {
    // In a foreign procfs, parents are the host's PIDs and owners ours: 503 may be both.
    let mut host = fork_orphan();
    host.procfs_view = ProcfsView::Foreign;
    assert_eq!(
        host.account().culprits[0].evidence,
        vec![Evidence::MapsGpu, Evidence::Inherited]
    );
}
