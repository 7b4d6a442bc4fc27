//! MPS: the control daemon and server are never culprits of a client's orphan.

use crate::classify::tests::fixtures::*;
use crate::classify::*;
use crate::observe::{NvmlLists, ProcessFacts, ProcessLookup};

#[test]
fn a_process_mapping_the_gpu_only_write_only_holds_no_context_and_is_no_culprit() {
    // The footprint the MPS control daemon showed on the H200, without MPS around it: the
    // driver initialised, no context. The mapping rule alone clears it.
    let writer = ProcessFacts {
        comm: "gpu-probe".into(),
        ..mps_daemon(447)
    };
    let Judged { account, verdict } = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(writer)
        .judged();
    assert!(account.culprits.is_empty());
    assert_eq!(pids(&account.bystanders), vec![447]);
    assert_eq!(
        account.bystanders[0].evidence,
        vec![Evidence::MapsGpuWithoutContext {
            access: NarrowAccess::WriteOnly
        }]
    );
    assert_eq!(
        verdict.remedy,
        Remedy::ResetGpu {
            blockers: vec![447]
        }
    );
    // Beside a real heir, only the heir is killed.
    let account = fork_orphan()
        .holder(ProcessFacts {
            comm: "gpu-probe".into(),
            ..mps_daemon(447)
        })
        .account();
    assert_eq!(pids(&account.culprits), vec![524]);
    assert_eq!(pids(&account.bystanders), vec![447]);
}

#[test]
fn an_owners_pid_held_by_a_write_only_mapper_is_reused_not_live() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(447, Some(CHARGED_ONE_OWNER), present(mps_daemon(447)))
        .account();
    assert_eq!(
        account.owners[0].gone().map(WhyGone::reason),
        Some(GoneReason::Reused)
    );
}

#[test]
fn under_mps_the_forked_child_alone_is_the_culprit_and_the_daemon_and_server_stand_apart() {
    let Judged { account, verdict } = mps_fork_orphan().judged();
    assert_eq!(verdict.finding.kind(), FindingKind::Orphaned);
    // Only the dead client's 4,934,598,656 bytes are orphaned; the live client and the
    // server own theirs.
    assert_eq!(account.orphaned_bytes(), 4_934_598_656);
    assert_eq!(pids(&account.culprits), vec![500]);
    assert_eq!(
        account.culprits[0].evidence,
        vec![
            Evidence::MapsGpu,
            Evidence::Inherited,
            Evidence::ProcessGroupOf { pid: 479 },
            Evidence::SessionOf { pid: 479 },
        ]
    );
    assert_eq!(pids(&account.bystanders), vec![447, 466]);
    assert_eq!(
        account.bystanders[0].evidence,
        vec![
            Evidence::MpsControlDaemon { server: 466 },
            Evidence::MapsGpuWithoutContext {
                access: NarrowAccess::WriteOnly
            },
            Evidence::MpsCommandName,
        ]
    );
    assert_eq!(
        account.bystanders[1].evidence,
        vec![
            Evidence::MpsServer { daemon: 447 },
            Evidence::MpsCommandName
        ]
    );
    let Remedy::Kill { targets } = &verdict.remedy else {
        panic!("{:?}", verdict.remedy)
    };
    assert_eq!(targets.iter().map(|t| t.pid).collect::<Vec<_>>(), vec![500]);
    assert!(verdict.notes.contains(&Note::MpsNotBlamed {
        pids: vec![447, 466]
    }));
    assert!(!verdict
        .notes
        .iter()
        .any(|note| matches!(note, Note::BystandersNotBlamed { .. })));
    // The live client and the server are live owners.
    let live: Vec<u32> = account.live_owners().map(|owner| owner.pid).collect();
    assert_eq!(live, vec![449, 466]);
}

#[test]
fn the_mps_parts_are_never_culprits_whatever_they_map() {
    // A daemon that mapped the GPU read-write (another driver, say) is still the daemon:
    // the structural guard stands beside the mapping rule.
    let mut host = mps_fork_orphan();
    let holders = host.holders.as_mut().unwrap();
    let daemon = holders.iter_mut().find(|holder| holder.pid == 447).unwrap();
    daemon.mappings = nodes(&[0]);
    let account = host.account();
    assert_eq!(pids(&account.culprits), vec![500]);
    assert_eq!(pids(&account.bystanders), vec![447, 466]);
    assert_eq!(
        account.bystanders[0].evidence,
        vec![
            Evidence::MpsControlDaemon { server: 466 },
            Evidence::MpsCommandName
        ]
    );
}

#[test]
fn the_mps_server_alone_holding_a_dead_clients_memory_means_restarting_mps() {
    let Judged { account, verdict } = mps_dead_client_without_heir().judged();
    assert!(account.culprits.is_empty());
    assert_eq!(pids(&account.bystanders), vec![447, 466]);
    assert_eq!(
        verdict.remedy,
        Remedy::RestartMps {
            servers: vec![466],
            daemons: vec![447],
            clients: vec![449],
        }
    );
}

#[test]
fn an_exporter_that_never_saw_the_owners_alive_reaches_the_same_verdict() {
    // `check` is a fresh process: it has seen no process before this one look.
    for host in [mps_fork_orphan(), mps_dead_client_without_heir()] {
        let Judged {
            account: seen,
            verdict: seen_verdict,
        } = host.judged();
        let Judged {
            account: fresh,
            verdict: fresh_verdict,
        } = host.seen_for_the_first_time().judged();
        assert_eq!(fresh.culprits, seen.culprits);
        assert_eq!(fresh.bystanders, seen.bystanders);
        assert_eq!(fresh_verdict.remedy, seen_verdict.remedy);
        assert_eq!(fresh_verdict.notes, seen_verdict.notes);
    }
}

#[test]
fn a_live_mps_client_owns_its_memory_and_nothing_is_blamed() {
    let Judged { account, verdict } = mps_live_client().judged();
    assert_eq!(verdict.finding.kind(), FindingKind::Owned);
    assert_eq!(account.tally.processes(OwnerState::Running), 2);
    assert!(account.culprits.is_empty() && account.bystanders.is_empty());
    assert_eq!(verdict.remedy, Remedy::None);
}

#[test]
fn the_mps_server_is_told_by_its_listing_and_its_parent_not_by_its_name() {
    // The lists were not recorded (a snapshot of an older version): no server can be
    // told, so the live owner stays out of the candidates and the stop is suggested.
    let mut host = mps_dead_client_without_heir();
    for process in host.readings(0).1.iter_mut() {
        process.lists = NvmlLists::default();
    }
    let Judged { account, verdict } = host.judged();
    assert_eq!(pids(&account.bystanders), vec![447]);
    assert_eq!(
        account.bystanders[0].evidence,
        vec![
            Evidence::MapsGpuWithoutContext {
                access: NarrowAccess::WriteOnly
            },
            Evidence::MpsCommandName
        ]
    );
    assert_eq!(
        verdict.remedy,
        Remedy::StopOwners {
            pids: vec![449, 466]
        }
    );

    // Listed as a server, but its parent leads no session of its own: no daemon, so not
    // the MPS server, whatever its name. That parent maps the GPU read-write and NVML
    // lists it nowhere: an inherited context, the culprit.
    let mut host = mps_dead_client_without_heir();
    let holders = host.holders.as_mut().unwrap();
    holders.retain(|holder| holder.pid != 447);
    holders.push(cuda(447, &[0]).child_of(1));
    let account = host.account();
    assert!(account.bystanders.iter().all(|b| !b.is_mps_part()));
    assert_eq!(pids(&account.culprits), vec![447]);

    // With no client on the MPS list, there is no MPS to speak of.
    let mut host = mps_dead_client_without_heir();
    for process in host.readings(0).1.iter_mut() {
        process.lists = NvmlLists::COMPUTE;
    }
    assert!(host.account().bystanders.iter().all(|b| !b.is_mps_part()));
}

#[test]
fn a_snapshot_without_the_access_of_mappings_keeps_its_old_verdict() {
    // Written before how a node is mapped was recorded: every mapped GPU node was a
    // context, and the verdict replays as it was given.
    let mut host = mps_fork_orphan();
    for process in host.readings(0).1.iter_mut() {
        process.lists = NvmlLists::default();
    }
    let holders = host.holders.as_mut().unwrap();
    let daemon = holders.iter_mut().find(|holder| holder.pid == 447).unwrap();
    daemon.mappings = nodes(&[0]);
    let account = host.account();
    assert_eq!(pids(&account.culprits), vec![447, 500]);
}
