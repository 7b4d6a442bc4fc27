//! After a kill: workers a server left behind, and kills that wait in the driver.

use crate::classify::owners::after_kill::{Clue, Seen};
use crate::classify::tests::fixtures::*;
use crate::classify::*;
use crate::observe::ProcessFacts;

/// When the fixtures' looks are taken (seconds since the epoch).
const LOOKED_AT: u64 = 1_764_930_000;

/// A worker of a server (PID 4200) in the server's group and session, with where it came
/// from as first read: `parent` then, and the group's leader's fate.
fn worker(pid: u32, parent: u32, group_leader: Leader, spawned_worker: bool) -> ProcessFacts {
    let mut facts = cuda(pid, &[0]);
    facts.ppid = parent;
    facts.pgid = 4200;
    facts.sid = 4200;
    facts.lineage = Some(Lineage {
        parent: Relative {
            pid: parent,
            start_time_ticks: Some(90_000),
            comm: Some(
                if parent == 4200 {
                    "api-server"
                } else {
                    "systemd"
                }
                .into(),
            ),
            pgid: Some(if parent == 4200 { 4200 } else { 1 }),
        },
        parent_exit_seen_unix_seconds: None,
        group_leader,
        session_leader: group_leader,
        spawned_worker,
        pipes_to_parent_closed: false,
    });
    facts
}

fn host_with(owners: &[ProcessFacts]) -> Host {
    let mut host = Host::idle().used(owners.len() as u64 * USED_ONE_OWNER);
    host.taken_at = Some(LOOKED_AT);
    for facts in owners {
        host = host.owner(facts.pid, Some(CHARGED_ONE_OWNER), present(facts.clone()));
    }
    host.scanned()
}

#[test]
fn a_worker_whose_parent_was_seen_to_exit_is_left_behind_and_counted() {
    let mut seen = worker(4242, 1, Leader::Alive, false);
    let lineage = seen.lineage.as_mut().unwrap();
    lineage.parent.pid = 4200;
    lineage.parent.comm = Some("api-server".into());
    lineage.parent_exit_seen_unix_seconds = Some(LOOKED_AT - 300);
    let seen_again = seen.clone();
    let Judged { account, verdict } = host_with(&[seen]).judged();
    assert_eq!(verdict.finding.kind(), FindingKind::LeftBehind);
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(
        account.left_behind_bytes(),
        LeftBehindBytes {
            witnessed: CHARGED_ONE_OWNER,
            possibly: 0
        }
    );
    let Seen::ParentExited {
        parent,
        alone_seconds,
        ..
    } = &account.left_behind[0].seen
    else {
        panic!("{:?}", account.left_behind)
    };
    assert_eq!(
        (parent.pid, parent.comm.as_deref()),
        (4200, Some("api-server"))
    );
    assert_eq!(*alone_seconds, Some(300));
    let Remedy::KillLeftBehind { targets } = &verdict.remedy else {
        panic!("{:?}", verdict.remedy)
    };
    assert_eq!(targets.iter().map(|t| t.pid).collect::<Vec<_>>(), [4242]);
    assert_eq!(
        host_with(&[seen_again]).report().gpus[0].status(),
        CheckStatus::StillHeld
    );
}

#[test]
fn a_worker_never_seen_with_its_parent_is_possibly_left_behind_only_with_evidence() {
    // A spawned worker whose group's leader is gone, adopted by a parent outside the group.
    let Judged { account, verdict } = host_with(&[worker(4242, 1, Leader::Gone, true)]).judged();
    assert_eq!(verdict.finding.kind(), FindingKind::LeftBehind);
    assert!(matches!(
        account.left_behind[0].seen,
        Seen::Possibly {
            group_leader: 4200,
            adopted_by: 1,
            clue: Clue::SpawnedWorker,
            ..
        }
    ));
    // Counted apart from what was seen: the alert's series counts only that.
    assert_eq!(
        account.left_behind_bytes(),
        LeftBehindBytes {
            witnessed: 0,
            possibly: CHARGED_ONE_OWNER
        }
    );

    // Not left behind: its parent is the live leader; its group's leader lives; a
    // double-forked daemon (group = session, no worker's command line); a process that
    // leads its own group.
    let mut daemon = worker(4242, 1, Leader::Gone, false);
    daemon.sid = daemon.pgid;
    let mut leader = worker(4242, 1, Leader::Itself, true);
    leader.pgid = 4242;
    for facts in [
        worker(4242, 4200, Leader::Alive, true),
        worker(4242, 1, Leader::Alive, true),
        daemon,
        leader,
    ] {
        let Judged { account, verdict } = host_with(std::slice::from_ref(&facts)).judged();
        assert!(account.left_behind.is_empty(), "{facts:?}");
        assert_eq!(verdict.finding.kind(), FindingKind::Owned, "{facts:?}");
    }
    // A member of a shell's job (its group is not its session) whose leader exited.
    let mut job = worker(4242, 1, Leader::Gone, false);
    job.sid = 3000;
    let account = host_with(&[job]).account();
    assert!(matches!(
        account.left_behind[0].seen,
        Seen::Possibly {
            clue: Clue::JobLeaderGone,
            ..
        }
    ));
    // A worker whose title setproctitle rewrote, in its server's session: only its pipes
    // to the parent that is gone say what it is.
    let mut renamed = worker(4242, 1, Leader::Gone, false);
    renamed.lineage.as_mut().unwrap().pipes_to_parent_closed = true;
    let account = host_with(std::slice::from_ref(&renamed)).account();
    assert!(matches!(
        account.left_behind[0].seen,
        Seen::Possibly {
            clue: Clue::PipesToParentClosed,
            ..
        }
    ));
    // The same in a Slurm job step that runs: the job's, not left behind.
    let in_job = in_slurm_job(renamed, 4242, "0");
    let account = host_with(&[in_job]).slurm_running(&[(4242, "0")]).account();
    assert!(account.left_behind.is_empty(), "{:?}", account.left_behind);
}

#[test]
fn a_kill_that_waits_in_the_driver_past_a_minute_moves_the_remedy_to_a_reset_or_reboot() {
    let killed = |seconds: u64| {
        let mut facts = cuda(4242, &[0]).state('D');
        facts.wchan = Some("uvm_va_space_destroy".into());
        facts.kill_pending_since_unix_seconds = Some(LOOKED_AT - seconds);
        host_with(&[facts]).judged()
    };
    let fresh = killed(5);
    assert_eq!(fresh.account.owners[0].state(), OwnerState::Killed);
    assert_eq!(fresh.verdict.finding.kind(), FindingKind::KilledStuck);
    assert!(matches!(fresh.verdict.remedy, Remedy::Wait { .. }));
    let stuck = killed(KILL_STUCK_SECONDS);
    let Remedy::ResetOrReboot { stuck: targets, .. } = &stuck.verdict.remedy else {
        panic!("{:?}", stuck.verdict.remedy)
    };
    assert_eq!(targets[0].pid, 4242);
    // The same owner with no kill pending is an uninterruptible owner, and fine.
    let mut sleeping = cuda(4242, &[0]).state('D');
    sleeping.wchan = Some("uvm_va_space_destroy".into());
    let Judged { account, verdict } = host_with(&[sleeping]).judged();
    assert_eq!(account.owners[0].state(), OwnerState::Uninterruptible);
    assert_eq!(verdict.finding.kind(), FindingKind::Owned);
}

#[test]
fn a_left_behind_worker_kill_cannot_reach_is_named_but_not_suggested_for_kill() {
    let mut hidden = worker(4242, 1, Leader::Gone, true);
    hidden.local_pid = None;
    let Judged {
        account: _,
        verdict,
    } = host_with(&[hidden]).judged();
    assert_eq!(verdict.finding.kind(), FindingKind::LeftBehind);
    assert_eq!(
        verdict.remedy,
        Remedy::CannotTell {
            reason: Blindness::WorkersNotVisible
        }
    );
}
