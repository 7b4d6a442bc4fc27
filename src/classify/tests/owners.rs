//! Owners: who each listed process is, and in which state.

use crate::classify::tests::fixtures::*;
use crate::classify::*;
use crate::observe::{ProcessFacts, ProcessLookup, References};

#[test]
fn an_idle_gpu_is_idle_with_nothing_orphaned() {
    let Judged { account, verdict } = Host::idle().scanned().judged();
    assert_eq!(verdict.finding.kind(), FindingKind::Idle);
    assert_eq!(verdict.remedy, Remedy::None);
    assert_eq!(account.orphaned_bytes(), 0);
    assert!(account.culprits.is_empty() && account.bystanders.is_empty());
}

#[test]
fn an_owner_that_maps_its_gpu_is_live_in_its_state() {
    let Judged { account, verdict } = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(cuda(432, &[0])))
        .judged();
    let owner = &account.owners[0];
    assert_eq!(owner.state(), OwnerState::Running);
    assert!(matches!(owner.standing, Standing::Live(_)));
    let process = owner.process().expect("the live process");
    assert_eq!(process.state, ProcessState::Sleeping);
    // Started 100,000 ticks (1,000 s) after a boot at BOOT.
    assert_eq!(process.started_unix_seconds, Some(BOOT + 1_000));
    assert_eq!(
        process.started,
        Started::At {
            unix_seconds: BOOT + 1_000
        }
    );
    assert_eq!(account.tally.bytes(OwnerState::Running), CHARGED_ONE_OWNER);
    // 9,238,806,528 - 9,229,565,952 = 9,240,576 bytes (8.8 MiB) uncharged: under the
    // 16 MiB floor of one context, so nothing is unattributed.
    assert_eq!(account.unattributed_bytes, 0);
    assert_eq!(verdict.finding.kind(), FindingKind::Owned);
}

#[test]
fn without_a_boot_time_a_start_is_seconds_after_boot_never_a_date() {
    let host = Host::idle().used(USED_ONE_OWNER).owner(
        432,
        Some(CHARGED_ONE_OWNER),
        present(cuda(432, &[0]).started(48_213)),
    );
    let mut observation = host.observation();
    observation.boot_time_unix_seconds = None;
    let report = classify(&observation, &Settings::default());
    let process = report.gpus[0].account().unwrap().owners[0]
        .process()
        .expect("a live owner")
        .clone();
    assert_eq!(process.started_unix_seconds, None);
    // 48,213 ticks at 100 a second: 482 whole seconds.
    assert_eq!(process.started, Started::AfterBoot { seconds: 482 });
    assert_eq!(process.start_time_ticks, 48_213);
}

#[test]
fn label_values_are_the_json_words() {
    use strum::VariantArray;
    let json = |value: serde_json::Value| value.as_str().unwrap().to_string();
    for state in OwnerState::VARIANTS {
        assert_eq!(json(serde_json::to_value(state).unwrap()), state.as_str());
    }
    for reason in GoneReason::VARIANTS {
        assert_eq!(json(serde_json::to_value(reason).unwrap()), reason.as_str());
    }
    for role in Role::VARIANTS {
        assert_eq!(json(serde_json::to_value(role).unwrap()), role.as_str());
    }
    // The order the series list them in.
    let order: Vec<&str> = OwnerState::VARIANTS
        .iter()
        .map(|state| state.as_str())
        .collect();
    assert_eq!(
        order,
        [
            "running",
            "stopped",
            "uninterruptible",
            "zombie",
            "killed",
            "exiting",
            "gone",
            "unknown"
        ]
    );
}

#[test]
fn ps_letters_r_s_and_i_are_the_running_label_under_their_own_words() {
    for (letter, words) in [('R', "running"), ('S', "sleeping"), ('I', "idle")] {
        let state = ProcessState::from_letter(letter);
        assert_eq!(state.owner_state(), OwnerState::Running, "{letter}");
        assert_eq!(state.words(), words);
    }
    assert_eq!(
        ProcessState::from_letter('T').owner_state(),
        OwnerState::Stopped
    );
    assert_eq!(
        ProcessState::from_letter('t').words(),
        "stopped by a tracer"
    );
    assert_eq!(
        ProcessState::from_letter('D').owner_state(),
        OwnerState::Uninterruptible
    );
}

#[test]
fn a_stopped_owner_keeps_its_memory_and_gets_a_note() {
    let Judged { account, verdict } = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(
            432,
            Some(CHARGED_ONE_OWNER),
            present(cuda(432, &[0]).state('T')),
        )
        .judged();
    assert_eq!(account.owners[0].state(), OwnerState::Stopped);
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(
        verdict.notes,
        vec![Note::OwnerStopped {
            pid: 432,
            comm: "python3".into()
        }]
    );
}

#[test]
fn an_owner_in_uninterruptible_sleep_is_live() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(
            465,
            Some(CHARGED_ONE_OWNER),
            present(cuda(465, &[0]).state('D')),
        )
        .account();
    assert_eq!(account.owners[0].state(), OwnerState::Uninterruptible);
    assert_eq!(account.orphaned_bytes(), 0);
}

#[test]
fn a_zombie_leader_whose_threads_map_the_gpu_is_a_live_zombie() {
    // pthread_exit in main: state Z, the mappings read from a live thread. Threads and
    // mappings are varied apart: only both together keep a zombie leader a live owner.
    let judged = |threads: u32, maps: &[u32]| {
        let mut facts = cuda(454, maps).with_descriptors(&[0]).state('Z');
        facts.threads = threads;
        Host::idle()
            .used(4_850_000_000)
            .owner(454, Some(4_840_000_000), present(facts))
            .scanned()
            .judged()
    };
    let zombie = |threads: u32, maps: &[u32]| judged(threads, maps).account;

    // Live threads that map the GPU: the context is alive, held by a zombie leader.
    let account = zombie(4, &[0]);
    assert_eq!(account.owners[0].state(), OwnerState::Zombie);
    let process = account.owners[0].process().expect("a live owner");
    assert_eq!(process.state, ProcessState::Zombie);
    assert_eq!(process.threads, 4);
    assert_eq!(account.orphaned_bytes(), 0);

    // Live threads, but nothing of this GPU mapped (another GPU's, or none at all): the
    // PID no longer holds this context, whatever its threads do.
    for maps in [&[1][..], &[]] {
        let account = zombie(4, maps);
        assert_eq!(account.owners[0].state(), OwnerState::Gone, "maps {maps:?}");
        let Standing::Gone(WhyGone::Reused { by }) = &account.owners[0].standing else {
            panic!("maps {maps:?}: {:?}", account.owners[0].standing)
        };
        assert_eq!((by.pid, by.threads), (454, 4));
        assert_eq!(account.orphaned_owner_gone_bytes, 4_840_000_000);
    }

    // No live thread and nothing mapped: the process is being reaped and the driver is
    // freeing its memory.
    let account = zombie(1, &[]);
    assert_eq!(account.owners[0].state(), OwnerState::Exiting);
    assert!(matches!(judged(1, &[]).verdict.remedy, Remedy::Wait { .. }));

    // No live thread, yet the mappings still name the GPU: the address space is not
    // torn down yet, so the context is still there and the owner still live.
    let account = zombie(1, &[0]);
    assert_eq!(account.owners[0].state(), OwnerState::Zombie);
    assert_eq!(account.orphaned_bytes(), 0);
}

#[test]
fn a_pid_with_no_process_is_gone_and_its_charge_is_orphaned() {
    let Judged { account, verdict } = fork_orphan().judged();
    let owner = &account.owners[0];
    assert_eq!(owner.state(), OwnerState::Gone);
    assert_eq!(owner.standing, Standing::Gone(WhyGone::Exited));
    assert_eq!(account.gone(GoneReason::Exited), 1);
    assert_eq!(account.orphaned_owner_gone_bytes, 9_229_565_952);
    assert_eq!(verdict.finding.kind(), FindingKind::Orphaned);
}

#[test]
fn a_pid_reused_by_an_nvml_client_is_gone_not_live() {
    // The H200 case: the dead owner's PID handed to an NVML-only client, which holds
    // /dev/nvidia0 open but maps nothing. The exporter used to call the owner live.
    let owner = cuda(503, &[0]);
    let reuser = nvml_client(503, "python3", &[0]).started(400_000);
    let Judged { account, verdict } = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), present(reuser))
        .first_seen(503, &owner)
        .judged();
    assert_eq!(account.owners[0].state(), OwnerState::Gone);
    assert!(matches!(
        &account.owners[0].standing,
        Standing::Gone(WhyGone::Reused { by }) if by.start_time_ticks == 400_000
    ));
    assert_eq!(account.gone(GoneReason::Reused), 1);
    assert_eq!(account.orphaned_bytes(), CHARGED_ONE_OWNER);
    assert!(matches!(
        &verdict.notes[0],
        Note::OwnerPidReused { pid: 503, was: Some(comm), .. } if comm == "python3"
    ));
}

#[test]
fn a_pid_first_seen_without_a_context_here_is_reused_even_with_no_history() {
    // The exporter started after the reuse: the start time matches what it first saw, but
    // the process maps nothing of GPU 0, so it holds no context there.
    let Judged { account, verdict } = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(
            503,
            Some(CHARGED_ONE_OWNER),
            present(nvml_client(503, "gpu-health", &[0])),
        )
        .judged();
    assert_eq!(account.owners[0].state(), OwnerState::Gone);
    assert_eq!(account.gone(GoneReason::Reused), 1);
    // No earlier process seen: the note cannot say who the owner was.
    assert!(matches!(
        &verdict.notes[0],
        Note::OwnerPidReused { was: None, .. }
    ));
}

#[test]
fn a_pid_reused_by_a_cuda_job_of_another_gpu_is_gone_on_this_one() {
    let account = Host::idle()
        .gpu(1)
        .used(USED_ONE_OWNER)
        .owner(
            503,
            Some(CHARGED_ONE_OWNER),
            present(cuda(503, &[1]).started(400_000)),
        )
        .first_seen(503, &cuda(503, &[0]))
        .account();
    assert_eq!(account.owners[0].state(), OwnerState::Gone);
    assert_eq!(account.orphaned_bytes(), CHARGED_ONE_OWNER);
}

#[test]
fn a_new_start_time_means_a_new_process_even_when_its_mappings_cannot_be_read() {
    let mut reuser = cuda(503, &[]).started(400_000);
    reuser.mappings = References::Unreadable;
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), present(reuser))
        .first_seen(503, &cuda(503, &[0]))
        .account();
    assert_eq!(account.owners[0].state(), OwnerState::Gone);
    assert_eq!(account.gone(GoneReason::Reused), 1);
}

#[test]
fn a_new_process_with_its_own_context_here_owns_the_charge() {
    // The first owner exited and freed its memory; a new CUDA process got the PID before
    // a scrape saw the gap. Its context on GPU 0 is evidence; calling it gone would page
    // on its memory for as long as it runs.
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(
            503,
            Some(CHARGED_ONE_OWNER),
            present(cuda(503, &[0]).started(400_000)),
        )
        .first_seen(503, &cuda(503, &[0]))
        .account();
    assert_eq!(account.owners[0].state(), OwnerState::Running);
    assert_eq!(account.orphaned_bytes(), 0);
}

#[test]
fn an_exiting_owner_is_being_freed_not_orphaned_and_the_remedy_is_to_wait() {
    // SIGKILLed: a zombie with one thread and no address space, or a main thread in its
    // exit path (PF_EXITING) whose files the kernel is closing; the driver frees the
    // memory within 0.12-0.20 s. Branch 2 of the story: never a page.
    let mut zombie = cuda(432, &[]).state('Z');
    zombie.threads = 1;
    let mut exiting = cuda(432, &[]).state('D');
    exiting.exiting = true;
    for facts in [zombie, exiting] {
        let Judged { account, verdict } = Host::idle()
            .used(USED_ONE_OWNER)
            .owner(432, Some(CHARGED_ONE_OWNER), present(facts))
            .scanned()
            .judged();
        assert_eq!(account.owners[0].state(), OwnerState::Exiting);
        assert_eq!(account.orphaned_bytes(), 0);
        assert_eq!(verdict.finding.kind(), FindingKind::BeingFreed);
        assert!(matches!(verdict.remedy, Remedy::Wait { .. }));
        assert_eq!(account.tally.bytes(OwnerState::Exiting), CHARGED_ONE_OWNER);
    }
    // SIGKILLed with many threads: the main thread a zombie while the others exit (the
    // reader saw every thread exiting), as PyTorch owners showed on an H100.
    let mut group_exit = cuda(432, &[0]).state('Z');
    group_exit.threads = 12;
    group_exit.exiting = true;
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(group_exit))
        .scanned()
        .account();
    assert_eq!(account.owners[0].state(), OwnerState::Exiting);
    // A zombie main thread whose other threads live (pthread_exit) is not exiting: they
    // keep the context, a live owner, as before.
    let mut leader = cuda(432, &[0]).state('Z');
    leader.threads = 4;
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(leader))
        .scanned()
        .account();
    assert_eq!(account.owners[0].state(), OwnerState::Zombie);
}

#[test]
fn an_unreaped_owner_still_charged_past_a_free_is_gone_and_its_forked_child_named() {
    // The story's commonest branch with a parent that does not reap: the owner forked a
    // child that kept its device file and was SIGKILLed; a zombie with nothing mapped,
    // which NVML goes on charging (an H100 showed it at 0.3, 1, 3 and 15 s) because the
    // child keeps the context. Being freed for as long as a free can take, then gone.
    const LOOKED_AT_MILLIS: u64 = 1_796_300_000_000;
    let mut zombie = cuda(503, &[]).state('Z');
    zombie.threads = 1;
    zombie.exiting = true;
    let host = |ended_millis_ago: u64| {
        let mut facts = zombie.clone();
        facts.ending_since_unix_millis = Some(LOOKED_AT_MILLIS - ended_millis_ago);
        let mut host = Host::idle()
            .used(USED_ONE_OWNER)
            .owner(503, Some(CHARGED_ONE_OWNER), present(facts))
            .first_seen(503, &cuda(503, &[0]))
            .holder(cuda(524, &[0]).child_of(503).started(150_000));
        host.taken_at = Some(LOOKED_AT_MILLIS / 1000);
        host
    };
    let Judged {
        account: within,
        verdict: within_verdict,
    } = host(ENDING_AT_MOST_MILLIS).judged();
    assert_eq!(within.owners[0].state(), OwnerState::Exiting);
    assert_eq!(within_verdict.finding.kind(), FindingKind::BeingFreed);
    assert_eq!(within.orphaned_bytes(), 0);
    let Judged {
        account: past,
        verdict: past_verdict,
    } = host(ENDING_AT_MOST_MILLIS + 1).judged();
    assert_eq!(past.owners[0].standing, Standing::Gone(WhyGone::Exited));
    assert_eq!(past_verdict.finding.kind(), FindingKind::Orphaned);
    assert_eq!(past.orphaned_owner_gone_bytes, CHARGED_ONE_OWNER);
    assert_eq!(
        past.culprits
            .iter()
            .map(|culprit| culprit.process.pid)
            .collect::<Vec<_>>(),
        vec![524]
    );
    // A main thread still in its exit path is being freed whatever the time: the driver
    // is at it (a stuck one is the killed owner's verdict, from its pending kill).
    let mut exiting = cuda(503, &[0]).state('D');
    exiting.exiting = true;
    exiting.ending_since_unix_millis = Some(LOOKED_AT_MILLIS - 60_000);
    let mut still =
        Host::idle()
            .used(USED_ONE_OWNER)
            .owner(503, Some(CHARGED_ONE_OWNER), present(exiting));
    still.taken_at = Some(LOOKED_AT_MILLIS / 1000);
    assert_eq!(still.account().owners[0].state(), OwnerState::Exiting);
    // A look that cannot say how long (a snapshot without times) keeps "being freed".
    let mut unknown = zombie.clone();
    unknown.ending_since_unix_millis = None;
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), present(unknown))
        .account();
    assert_eq!(account.owners[0].state(), OwnerState::Exiting);
}

#[test]
fn unreadable_mappings_make_an_owner_unknown_never_gone() {
    let mut facts = cuda(432, &[]);
    facts.mappings = References::Unreadable;
    let Judged { account, verdict } = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(facts))
        .judged();
    assert_eq!(account.owners[0].state(), OwnerState::Unknown);
    assert_eq!(
        account.owners[0].standing,
        Standing::Unknown(WhyUnknown::ContextUnreadable)
    );
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(verdict.finding.kind(), FindingKind::CannotTell);
}

#[test]
fn an_unreadable_proc_entry_is_unknown_never_gone() {
    let Judged { account, verdict } = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(
            432,
            Some(CHARGED_ONE_OWNER),
            ProcessLookup::Unreadable {
                error: "permission denied".into(),
            },
        )
        .judged();
    assert_eq!(account.owners[0].state(), OwnerState::Unknown);
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(verdict.finding.kind(), FindingKind::CannotTell);
}

#[test]
fn a_pid_a_foreign_procfs_cannot_show_is_unknown_never_gone() {
    // The exporter in its own PID namespace reading the host's /proc: before, namespace
    // PID 2 was looked up as the host's kthreadd and the live owner called gone.
    let mut host =
        Host::idle()
            .used(2 * GIB + 64 * MIB)
            .owner(2, Some(2 * GIB), ProcessLookup::NotVisible);
    host.procfs_view = ProcfsView::Foreign;
    host.host_pid_namespace = Some(false);
    let Judged { account, verdict } = host.judged();
    assert_eq!(account.owners[0].state(), OwnerState::Unknown);
    assert_eq!(
        account.owners[0].standing,
        Standing::Unknown(WhyUnknown::NotVisible)
    );
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(verdict.finding.kind(), FindingKind::CannotTell);
}

#[test]
fn an_mps_client_is_judged_by_its_start_time_alone() {
    // Its context lives in the MPS server: it maps nothing of the GPU itself. The
    // exporter first saw it started at 100,000 ticks.
    let client = nvml_client(700, "python3", &[0]);
    let listed_as_mps_client = |now: ProcessFacts| {
        let mut host = Host::idle()
            .used(USED_ONE_OWNER)
            .owner(700, Some(CHARGED_ONE_OWNER), present(now))
            .first_seen(700, &client);
        host.readings(0).1[0].mps_only = true;
        host.account()
    };

    // The same start time, mapping nothing: the same process, and live.
    let account = listed_as_mps_client(client.clone());
    assert_eq!(account.owners[0].state(), OwnerState::Running);
    assert_eq!(account.orphaned_bytes(), 0);

    // Another start time: another process has the PID, whatever it maps.
    let account = listed_as_mps_client(client.clone().started(900_000));
    assert_eq!(account.owners[0].state(), OwnerState::Gone);
    let Standing::Gone(WhyGone::Reused { by }) = &account.owners[0].standing else {
        panic!("{:?}", account.owners[0].standing)
    };
    assert_eq!((by.pid, by.start_time_ticks), (700, 900_000));
    assert_eq!(account.gone(GoneReason::Reused), 1);
    assert_eq!(account.orphaned_bytes(), CHARGED_ONE_OWNER);
}

#[test]
fn without_a_device_node_no_owner_can_be_proven_live() {
    let mut host = Host::idle().used(USED_ONE_OWNER).owner(
        432,
        Some(CHARGED_ONE_OWNER),
        present(cuda(432, &[0])),
    );
    host.gpus[0].minor = None;
    let Judged { account, verdict } = host.judged();
    assert_eq!(
        account.owners[0].standing,
        Standing::Unknown(WhyUnknown::NoDeviceNode)
    );
    assert_eq!(verdict.finding.kind(), FindingKind::CannotTell);
}
