//! Case-by-case tests of the classifier, one rule each, with the figures measured on an
//! H200 (see the project's GPU facts) and expected values worked out by hand.

use super::fixtures::*;
use super::*;
use crate::observe::{
    GpuHealth, NvmlLists, ProcessFacts, ProcessLookup, RecoveryAction, References, SlurmReading,
};

// Owners: identity and context.

#[test]
fn an_idle_gpu_is_idle_with_nothing_orphaned() {
    let account = Host::idle().scanned().account();
    assert_eq!(account.finding, Finding::Idle);
    assert_eq!(account.remedy, Remedy::None);
    assert_eq!(account.orphaned_bytes(), 0);
    assert!(account.culprits.is_empty() && account.bystanders.is_empty());
}

#[test]
fn an_owner_that_maps_its_gpu_is_live_in_its_state() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(cuda(432, &[0])))
        .account();
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
    assert_eq!(account.finding, Finding::Owned);
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
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(
            432,
            Some(CHARGED_ONE_OWNER),
            present(cuda(432, &[0]).state('T')),
        )
        .account();
    assert_eq!(account.owners[0].state(), OwnerState::Stopped);
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(
        account.notes,
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
    let zombie = |threads: u32, maps: &[u32]| {
        let mut facts = cuda(454, maps).with_descriptors(&[0]).state('Z');
        facts.threads = threads;
        Host::idle()
            .used(4_850_000_000)
            .owner(454, Some(4_840_000_000), present(facts))
            .scanned()
            .account()
    };

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
    assert_eq!(account.remedy, Remedy::Wait);

    // No live thread, yet the mappings still name the GPU: the address space is not
    // torn down yet, so the context is still there and the owner still live.
    let account = zombie(1, &[0]);
    assert_eq!(account.owners[0].state(), OwnerState::Zombie);
    assert_eq!(account.orphaned_bytes(), 0);
}

#[test]
fn a_pid_with_no_process_is_gone_and_its_charge_is_orphaned() {
    let account = fork_orphan().account();
    let owner = &account.owners[0];
    assert_eq!(owner.state(), OwnerState::Gone);
    assert_eq!(owner.standing, Standing::Gone(WhyGone::Exited));
    assert_eq!(account.gone(GoneReason::Exited), 1);
    assert_eq!(account.orphaned_owner_gone_bytes, 9_229_565_952);
    assert_eq!(account.finding, Finding::Orphaned);
}

#[test]
fn a_pid_reused_by_an_nvml_client_is_gone_not_live() {
    // The H200 case: the dead owner's PID handed to an NVML-only client, which holds
    // /dev/nvidia0 open but maps nothing. The exporter used to call the owner live.
    let owner = cuda(503, &[0]);
    let reuser = nvml_client(503, "python3", &[0]).started(400_000);
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), present(reuser))
        .first_seen(503, &owner)
        .account();
    assert_eq!(account.owners[0].state(), OwnerState::Gone);
    assert!(matches!(
        &account.owners[0].standing,
        Standing::Gone(WhyGone::Reused { by }) if by.start_time_ticks == 400_000
    ));
    assert_eq!(account.gone(GoneReason::Reused), 1);
    assert_eq!(account.orphaned_bytes(), CHARGED_ONE_OWNER);
    assert!(matches!(
        &account.notes[0],
        Note::OwnerPidReused { pid: 503, was: Some(comm), .. } if comm == "python3"
    ));
}

#[test]
fn a_pid_first_seen_without_a_context_here_is_reused_even_with_no_history() {
    // The exporter started after the reuse: the start time matches what it first saw, but
    // the process maps nothing of GPU 0, so it holds no context there.
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(
            503,
            Some(CHARGED_ONE_OWNER),
            present(nvml_client(503, "gpu-health", &[0])),
        )
        .account();
    assert_eq!(account.owners[0].state(), OwnerState::Gone);
    assert_eq!(account.gone(GoneReason::Reused), 1);
    // No earlier process seen: the note cannot say who the owner was.
    assert!(matches!(
        &account.notes[0],
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
    // memory within 0.13-0.18 s. Branch 2 of the story: never a page.
    let mut zombie = cuda(432, &[]).state('Z');
    zombie.threads = 1;
    let mut exiting = cuda(432, &[]).state('D');
    exiting.exiting = true;
    for facts in [zombie, exiting] {
        let account = Host::idle()
            .used(USED_ONE_OWNER)
            .owner(432, Some(CHARGED_ONE_OWNER), present(facts))
            .scanned()
            .account();
        assert_eq!(account.owners[0].state(), OwnerState::Exiting);
        assert_eq!(account.orphaned_bytes(), 0);
        assert_eq!(account.finding, Finding::BeingFreed);
        assert_eq!(account.remedy, Remedy::Wait);
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
fn unreadable_mappings_make_an_owner_unknown_never_gone() {
    let mut facts = cuda(432, &[]);
    facts.mappings = References::Unreadable;
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(facts))
        .account();
    assert_eq!(account.owners[0].state(), OwnerState::Unknown);
    assert_eq!(
        account.owners[0].standing,
        Standing::Unknown(WhyUnknown::ContextUnreadable)
    );
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(account.finding, Finding::CannotTell);
}

#[test]
fn an_unreadable_proc_entry_is_unknown_never_gone() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(
            432,
            Some(CHARGED_ONE_OWNER),
            ProcessLookup::Unreadable {
                error: "permission denied".into(),
            },
        )
        .account();
    assert_eq!(account.owners[0].state(), OwnerState::Unknown);
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(account.finding, Finding::CannotTell);
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
    let account = host.account();
    assert_eq!(account.owners[0].state(), OwnerState::Unknown);
    assert_eq!(
        account.owners[0].standing,
        Standing::Unknown(WhyUnknown::NotVisible)
    );
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(account.finding, Finding::CannotTell);
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
    let account = host.account();
    assert_eq!(
        account.owners[0].standing,
        Standing::Unknown(WhyUnknown::NoDeviceNode)
    );
    assert_eq!(account.finding, Finding::CannotTell);
}

// Unattributed memory.

#[test]
fn used_memory_without_any_owner_is_orphaned_as_unattributed() {
    let account = Host::idle().used(4 * GIB).scanned().account();
    assert_eq!(account.unattributed_bytes, 4 * GIB);
    assert_eq!(account.orphaned_unattributed_bytes(), 4 * GIB);
    assert_eq!(account.remedy, Remedy::ResetGpu { blockers: vec![] });
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
    let account = host.account();
    assert_eq!(account.unattributed_bytes, 4 * GIB);
    assert_eq!(account.unattributed_trust, UnattributedTrust::Blind);
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(account.finding, Finding::CannotTell);
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
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, None, present(cuda(432, &[0])))
        .account();
    assert_eq!(account.usage_unavailable_owners, 1);
    assert_eq!(account.unattributed_bytes, USED_ONE_OWNER - 16 * MIB);
    assert_eq!(
        account.unattributed_trust,
        UnattributedTrust::OwnersUncertain
    );
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(account.finding, Finding::CannotTell);
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

// Culprits and bystanders.

#[test]
fn a_forked_child_mapping_the_gpu_is_the_culprit_with_its_evidence() {
    let account = fork_orphan().account();
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
        account.remedy,
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
    let account = fork_orphan()
        .holder(nvml_client(467, "python3", &[0]))
        .account();
    assert_eq!(pids(&account.culprits), vec![524]);
    assert_eq!(pids(&account.bystanders), vec![467]);
    assert_eq!(account.bystanders[0].evidence, vec![Evidence::NoContext]);
    let Remedy::Kill { targets } = &account.remedy else {
        panic!("{:?}", account.remedy)
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
    let gpu0 = host.account_of(0);
    assert_eq!(gpu0.finding, Finding::Owned);
    assert!(gpu0.culprits.is_empty() && gpu0.bystanders.is_empty());
}

#[test]
fn holders_are_named_only_for_a_gpu_with_orphaned_memory() {
    let account = Host::idle()
        .holder(nvml_client(467, "python3", &[0]))
        .holder(cuda(524, &[0]))
        .account();
    assert_eq!(account.finding, Finding::Idle);
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
    let account = host.account();
    assert_eq!(pids(&account.culprits), vec![528, 529, 530]);
    let Remedy::Kill { targets } = &account.remedy else {
        panic!("{:?}", account.remedy)
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
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(unknown)
        .account();
    assert_eq!(pids(&account.undetermined), vec![524]);
    assert!(account.culprits.is_empty());
    assert_eq!(
        account.remedy,
        Remedy::CannotTell {
            reason: Blindness::MappingsUnreadable { processes: 1 }
        }
    );
}

#[test]
fn culprits_beside_an_undetermined_holder_are_named_with_a_note() {
    let mut unknown = cuda(600, &[0]);
    unknown.mappings = References::Unreadable;
    let account = fork_orphan().holder(unknown).account();
    assert!(matches!(account.remedy, Remedy::Kill { .. }));
    assert!(account
        .notes
        .contains(&Note::UndeterminedHolders { pids: vec![600] }));
}

#[test]
fn a_gpus_own_live_owner_is_never_its_candidate() {
    let account = Host::idle()
        .used(2 * USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(cuda(432, &[0])))
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(cuda(432, &[0]))
        .account();
    assert!(account.culprits.is_empty() && account.bystanders.is_empty());
    assert_eq!(account.remedy, Remedy::StopOwners { pids: vec![432] });
}

#[test]
fn with_no_holder_and_a_complete_scan_only_a_reset_frees_it() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .scanned()
        .account();
    assert_eq!(account.remedy, Remedy::ResetGpu { blockers: vec![] });
}

#[test]
fn an_incomplete_scan_without_a_culprit_cannot_tell() {
    let mut host = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .scanned();
    host.scan_cut_short = true;
    assert_eq!(
        host.account().remedy,
        Remedy::CannotTell {
            reason: Blindness::ScanCutShort
        }
    );
    host.scan_cut_short = false;
    host.scan_denied = 3;
    assert_eq!(
        host.account().remedy,
        Remedy::CannotTell {
            reason: Blindness::ScanDenied { processes: 3 }
        }
    );
    host.holders = None;
    assert_eq!(
        host.account().remedy,
        Remedy::CannotTell {
            reason: Blindness::NoScan
        }
    );
}

#[test]
fn culprits_found_by_an_incomplete_scan_are_named_with_a_warning() {
    let mut host = fork_orphan();
    host.scan_denied = 2;
    let account = host.account();
    assert!(matches!(account.remedy, Remedy::Kill { .. }));
    assert!(account.notes.contains(&Note::MoreHoldersPossible {
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
    let account = host.account();
    assert_eq!(pids(&account.culprits), vec![524_000]);
    assert!(!account.culprits[0].process.visible_here);
    assert_eq!(
        account.remedy,
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

// Slurm.

#[test]
fn a_culprit_in_a_step_that_runs_is_ended_by_cancelling_its_job() {
    let account = slurm_fork_orphan()
        .slurm_running(&[(4242, "0"), (4242, "extern")])
        .account();
    let job = account.culprits[0].process.slurm_job.clone().unwrap();
    assert_eq!(
        (
            job.job_id,
            job.step.as_deref(),
            job.user.as_deref(),
            job.state
        ),
        (4242, Some("0"), Some("alice"), JobState::Running)
    );
    let Remedy::CancelJobs { jobs, targets } = &account.remedy else {
        panic!("{:?}", account.remedy)
    };
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].job_id, 4242);
    assert_eq!(jobs[0].user.as_deref(), Some("alice"));
    assert_eq!(
        jobs[0].culprits.iter().map(|c| c.pid).collect::<Vec<_>>(),
        [524]
    );
    assert!(targets.is_empty());
    assert!(!account
        .notes
        .iter()
        .any(|note| matches!(note, Note::CulpritsLeftBySlurm { .. })));
}

#[test]
fn a_culprit_whose_job_or_step_ended_is_killed_and_said_to_be_left_behind() {
    for (running, state) in [
        (&[][..], JobState::Ended),
        (&[(4242, "batch")][..], JobState::StepEnded),
        (&[(17, "0")][..], JobState::Ended),
    ] {
        let account = slurm_fork_orphan().slurm_running(running).account();
        let Remedy::Kill { targets } = &account.remedy else {
            panic!("{:?}", account.remedy)
        };
        assert_eq!(targets.iter().map(|t| t.pid).collect::<Vec<_>>(), [524]);
        let left = account
            .notes
            .iter()
            .find_map(|note| match note {
                Note::CulpritsLeftBySlurm { culprits } => Some(culprits.clone()),
                _ => None,
            })
            .expect("a note on the culprit Slurm left behind");
        assert_eq!(left.len(), 1);
        assert_eq!((left[0].pid, left[0].job.state), (524, state));
    }
}

#[test]
fn without_a_complete_look_at_slurmstepds_a_job_is_never_cancelled() {
    // No look at all (a snapshot without one), and one cut short.
    let account = slurm_fork_orphan().account();
    assert!(matches!(account.remedy, Remedy::Kill { .. }));
    assert_eq!(
        account.culprits[0]
            .process
            .slurm_job
            .as_ref()
            .unwrap()
            .state,
        JobState::Unknown
    );
    let mut host = slurm_fork_orphan();
    host.slurm = Some(SlurmReading {
        running_steps: Vec::new(),
        complete: false,
    });
    assert!(matches!(host.account().remedy, Remedy::Kill { .. }));
}

#[test]
fn culprits_inside_and_outside_running_steps_are_cancelled_and_killed() {
    let account = slurm_fork_orphan()
        .holder(cuda(600, &[0]))
        .holder(in_slurm_job(cuda(700, &[0]), 4243, "batch"))
        .slurm_running(&[(4242, "0"), (4243, "batch")])
        .account();
    let Remedy::CancelJobs { jobs, targets } = &account.remedy else {
        panic!("{:?}", account.remedy)
    };
    assert_eq!(
        jobs.iter().map(|job| job.job_id).collect::<Vec<_>>(),
        [4242, 4243]
    );
    assert_eq!(targets.iter().map(|t| t.pid).collect::<Vec<_>>(), [600]);
}

#[test]
fn a_snapshot_keeps_slurm_steps_and_container_names_and_replays_to_the_same_verdict() {
    let host = slurm_fork_orphan()
        .slurm_running(&[(4242, "0")])
        .holder(contained(cuda(600, &[0]), None))
        .containers_named();
    let observation = host.observation();
    let text = serde_json::to_string(&observation).unwrap();
    let replayed: crate::observe::Observation = serde_json::from_str(&text).unwrap();
    assert_eq!(replayed, observation);
    let report = classify(&replayed, &Settings::default());
    let account = report.gpus[0].account().unwrap();
    assert!(matches!(account.remedy, Remedy::CancelJobs { .. }));
    let named = account
        .culprits
        .iter()
        .find(|culprit| culprit.process.pid == 600)
        .and_then(|culprit| culprit.process.container.as_ref())
        .map(|container| container.name.as_str());
    assert_eq!(named, Some("trainer"));
    // A snapshot of an older version has neither: no job runs, no container is named.
    let mut older: serde_json::Value = serde_json::from_str(&text).unwrap();
    older.as_object_mut().unwrap().remove("slurm");
    older.as_object_mut().unwrap().remove("containers");
    let older: crate::observe::Observation = serde_json::from_value(older).unwrap();
    let report = classify(&older, &Settings::default());
    assert!(matches!(
        report.gpus[0].account().unwrap().remedy,
        Remedy::Kill { .. }
    ));
    assert_eq!(report.container_engines, None);
}

#[test]
fn a_live_owner_left_behind_by_its_slurm_job_gets_a_note() {
    let owner = in_slurm_job(cuda(432, &[0]), 4242, "0");
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(owner))
        .slurm_running(&[])
        .account();
    assert_eq!(account.owners[0].state(), OwnerState::Running);
    assert!(account.notes.iter().any(|note| matches!(
        note,
        Note::OwnerLeftBySlurm { pid: 432, job, .. } if job.state == JobState::Ended
    )));
    // While its step runs, there is nothing to say.
    let owner = in_slurm_job(cuda(432, &[0]), 4242, "0");
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(owner))
        .slurm_running(&[(4242, "0")])
        .account();
    assert!(account.notes.is_empty(), "{:?}", account.notes);
}

// Containers.

#[test]
fn a_live_owner_carries_its_container_and_pod() {
    let facts = contained(cuda(432, &[0]), Some(NamespaceInit::Running { pid: 400 }));
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(facts))
        .account();
    let process = account.owners[0].process().unwrap();
    assert_eq!(process.cgroup.container_id.as_deref(), Some(CONTAINER));
    assert_eq!(process.cgroup.pod_uid.as_deref(), Some(POD));
    assert_eq!(account.exited_container_processes(), 0);
}

#[test]
fn a_reused_pid_does_not_lend_its_container_to_the_gone_owner() {
    let reuser = contained(nvml_client(432, "python3", &[0]), None);
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(reuser))
        .account();
    assert_eq!(account.owners[0].state(), OwnerState::Gone);
    assert!(account.owners[0].process().is_none());
}

#[test]
fn owners_and_culprits_outliving_their_containers_are_counted() {
    let ended = Some(NamespaceInit::Exited { pid: 400 });
    let account = Host::idle()
        .used(2 * USED_ONE_OWNER)
        .owner(
            432,
            Some(CHARGED_ONE_OWNER),
            present(contained(cuda(432, &[0]).state('D'), ended)),
        )
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(contained(cuda(524, &[0]), ended))
        .holder(contained(cuda(525, &[0]), Some(NamespaceInit::Unknown)))
        .account();
    // The uninterruptible owner 432 and the culprit 524; not 525, whose PID 1 is unknown.
    assert_eq!(account.exited_container_processes(), 2);
    assert!(account
        .notes
        .contains(&Note::CulpritsContainerEnded { pids: vec![524] }));
}

// Garbage from NVML.

#[test]
fn used_beyond_the_total_is_clamped_flagged_and_not_called_orphaned() {
    let mut host = Host::idle().owner(432, Some(CHARGED_ONE_OWNER), present(cuda(432, &[0])));
    *host.readings(0).0 = MemoryReading {
        total: TOTAL,
        reserved: RESERVED,
        used: 4 * TOTAL,
        free: 0,
    };
    let account = host.account();
    assert!(account.memory_inconsistent);
    assert_eq!(account.memory.used, TOTAL - RESERVED);
    assert_eq!(account.memory.free, 0);
    assert_eq!(account.unattributed_trust, UnattributedTrust::Inconsistent);
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(account.finding, Finding::CannotTell);
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

// What `check` reports.

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
    let account = report.gpus[0].account().unwrap();
    assert_eq!(
        account.remedy,
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

// What the driver says the GPU needs.

#[test]
fn an_unheld_orphan_names_the_nvml_clients_a_reset_must_wait_for() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(nvml_client(1711, "nv-hostengine", &[0]))
        .account();
    assert!(account.culprits.is_empty());
    assert_eq!(
        account.remedy,
        Remedy::ResetGpu {
            blockers: vec![1711]
        }
    );
}

#[test]
fn when_the_driver_asks_for_a_reboot_an_unheld_orphan_needs_one() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .scanned()
        .health(recovery(RecoveryAction::NodeReboot))
        .account();
    assert_eq!(account.remedy, Remedy::Reboot);
    assert_eq!(
        account.notes[0],
        Note::DriverAsks {
            action: RecoveryAction::NodeReboot
        }
    );
    // A culprit is still the first thing to end: its memory may come back without a reboot.
    let account = fork_orphan()
        .health(recovery(RecoveryAction::NodeReboot))
        .account();
    assert!(matches!(account.remedy, Remedy::Kill { .. }));
}

#[test]
fn a_gpu_reset_action_on_a_healthy_gpu_is_a_note_not_an_orphan() {
    let account = Host::idle()
        .scanned()
        .health(recovery(RecoveryAction::GpuReset))
        .account();
    assert_eq!(account.finding, Finding::Idle);
    assert_eq!(
        account.notes,
        vec![Note::DriverAsks {
            action: RecoveryAction::GpuReset
        }]
    );
    // None is nothing to say.
    let account = Host::idle()
        .health(recovery(RecoveryAction::NoneNeeded))
        .account();
    assert!(account.notes.is_empty());
}

#[test]
fn memory_the_operating_system_manages_is_never_called_orphaned() {
    // A GH200 in NUMA mode keeps pages after a process exits: 4 GiB charged to nobody
    // there is normal, and cannot be told from an orphan.
    let account = Host::idle()
        .used(4 * GIB)
        .health(GpuHealth {
            numa_node: Some(1),
            ..GpuHealth::default()
        })
        .account();
    assert_eq!(account.unattributed_bytes, 4 * GIB);
    assert_eq!(account.unattributed_trust, UnattributedTrust::OsManaged);
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(account.finding, Finding::CannotTell);
}

// MIG instances.

#[test]
fn a_mig_culprit_is_named_in_the_instance_whose_capabilities_it_holds() {
    let report = mig_host(true)
        .holder(instance_child(524, &[21, 22]))
        .report();
    let gpu = &report.gpus[0];
    let instance = |gi: u32| {
        gpu.instances
            .iter()
            .find(|instance| instance.gpu_instance_id == Some(gi))
            .and_then(InstanceVerdict::account)
            .unwrap()
    };
    assert_eq!(instance(1).finding, Finding::Idle);
    assert!(instance(1).culprits.is_empty());
    assert_eq!(instance(2).finding, Finding::Orphaned);
    assert_eq!(pids(&instance(2).culprits), vec![524]);
    assert_eq!(gpu.status(), CheckStatus::Orphaned);
}

#[test]
fn a_process_of_another_instance_is_no_candidate_there() {
    let report = mig_host(true)
        .holder(instance_child(600, &[12, 13]))
        .report();
    let orphaned = report.gpus[0].instances[1].account().unwrap();
    assert!(orphaned.culprits.is_empty() && orphaned.bystanders.is_empty());
    assert_eq!(orphaned.remedy, Remedy::ResetGpu { blockers: vec![] });
}

#[test]
fn without_capability_minors_a_mig_holder_is_undetermined() {
    let report = mig_host(false)
        .holder(instance_child(524, &[21, 22]))
        .report();
    let orphaned = report.gpus[0].instances[1].account().unwrap();
    assert_eq!(pids(&orphaned.undetermined), vec![524]);
    assert!(orphaned.undetermined[0]
        .evidence
        .contains(&Evidence::InstanceUnknown));
    assert!(matches!(orphaned.remedy, Remedy::CannotTell { .. }));
}

// MPS: the control daemon and server are never culprits of a client's orphan.

#[test]
fn a_process_mapping_the_gpu_only_write_only_holds_no_context_and_is_no_culprit() {
    // The footprint the MPS control daemon showed on the H200, without MPS around it: the
    // driver initialised, no context. The mapping rule alone clears it.
    let writer = ProcessFacts {
        comm: "gpu-probe".into(),
        ..mps_daemon(447)
    };
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(writer)
        .account();
    assert!(account.culprits.is_empty());
    assert_eq!(pids(&account.bystanders), vec![447]);
    assert_eq!(
        account.bystanders[0].evidence,
        vec![Evidence::MapsGpuWithoutContext {
            access: NarrowAccess::WriteOnly
        }]
    );
    assert_eq!(
        account.remedy,
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
    let account = mps_fork_orphan().account();
    assert_eq!(account.finding, Finding::Orphaned);
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
    let Remedy::Kill { targets } = &account.remedy else {
        panic!("{:?}", account.remedy)
    };
    assert_eq!(targets.iter().map(|t| t.pid).collect::<Vec<_>>(), vec![500]);
    assert!(account.notes.contains(&Note::MpsNotBlamed {
        pids: vec![447, 466]
    }));
    assert!(!account
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
    let account = mps_dead_client_without_heir().account();
    assert!(account.culprits.is_empty());
    assert_eq!(pids(&account.bystanders), vec![447, 466]);
    assert_eq!(
        account.remedy,
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
        let seen = host.account();
        let fresh = host.seen_for_the_first_time().account();
        assert_eq!(fresh.culprits, seen.culprits);
        assert_eq!(fresh.bystanders, seen.bystanders);
        assert_eq!(fresh.remedy, seen.remedy);
        assert_eq!(fresh.notes, seen.notes);
    }
}

#[test]
fn a_live_mps_client_owns_its_memory_and_nothing_is_blamed() {
    let account = mps_live_client().account();
    assert_eq!(account.finding, Finding::Owned);
    assert_eq!(account.tally.processes(OwnerState::Running), 2);
    assert!(account.culprits.is_empty() && account.bystanders.is_empty());
    assert_eq!(account.remedy, Remedy::None);
}

#[test]
fn the_mps_server_is_told_by_its_listing_and_its_parent_not_by_its_name() {
    // The lists were not recorded (a snapshot of an older version): no server can be
    // told, so the live owner stays out of the candidates and the stop is suggested.
    let mut host = mps_dead_client_without_heir();
    for process in host.readings(0).1.iter_mut() {
        process.lists = NvmlLists::default();
    }
    let account = host.account();
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
        account.remedy,
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
    let account = host_with(&[seen]).account();
    assert_eq!(account.finding, Finding::LeftBehind);
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(account.left_behind_bytes(), CHARGED_ONE_OWNER);
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
    let Remedy::KillLeftBehind { targets } = &account.remedy else {
        panic!("{:?}", account.remedy)
    };
    assert_eq!(targets.iter().map(|t| t.pid).collect::<Vec<_>>(), [4242]);
    assert_eq!(
        host_with(&[seen_again]).report().gpus[0].status(),
        CheckStatus::LeftBehind
    );
}

#[test]
fn a_worker_never_seen_with_its_parent_is_possibly_left_behind_only_with_evidence() {
    // A spawned worker whose group's leader is gone, adopted by a parent outside the group.
    let account = host_with(&[worker(4242, 1, Leader::Gone, true)]).account();
    assert_eq!(account.finding, Finding::LeftBehind);
    assert!(matches!(
        account.left_behind[0].seen,
        Seen::Possibly {
            group_leader: 4200,
            adopted_by: 1,
            clue: Clue::SpawnedWorker,
            ..
        }
    ));
    // The series count only what was seen.
    assert_eq!(account.left_behind_bytes(), 0);

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
        let account = host_with(std::slice::from_ref(&facts)).account();
        assert!(account.left_behind.is_empty(), "{facts:?}");
        assert_eq!(account.finding, Finding::Owned, "{facts:?}");
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
}

#[test]
fn a_kill_that_waits_in_the_driver_past_a_minute_moves_the_remedy_to_a_reset_or_reboot() {
    let killed = |seconds: u64| {
        let mut facts = cuda(4242, &[0]).state('D');
        facts.wchan = Some("uvm_va_space_destroy".into());
        facts.kill_pending_since_unix_seconds = Some(LOOKED_AT - seconds);
        host_with(&[facts]).account()
    };
    let fresh = killed(5);
    assert_eq!(fresh.owners[0].state(), OwnerState::Killed);
    assert_eq!(fresh.finding, Finding::KilledStuck);
    assert_eq!(fresh.remedy, Remedy::Wait);
    let stuck = killed(KILL_STUCK_SECONDS);
    let Remedy::ResetOrReboot { stuck: targets } = &stuck.remedy else {
        panic!("{:?}", stuck.remedy)
    };
    assert_eq!(targets[0].pid, 4242);
    // The same owner with no kill pending is an uninterruptible owner, and fine.
    let mut sleeping = cuda(4242, &[0]).state('D');
    sleeping.wchan = Some("uvm_va_space_destroy".into());
    let account = host_with(&[sleeping]).account();
    assert_eq!(account.owners[0].state(), OwnerState::Uninterruptible);
    assert_eq!(account.finding, Finding::Owned);
}

#[test]
fn a_left_behind_worker_kill_cannot_reach_is_named_but_not_suggested_for_kill() {
    let mut hidden = worker(4242, 1, Leader::Gone, true);
    hidden.local_pid = None;
    let account = host_with(&[hidden]).account();
    assert_eq!(account.finding, Finding::LeftBehind);
    assert_eq!(
        account.remedy,
        Remedy::CannotTell {
            reason: Blindness::WorkersNotVisible
        }
    );
}

// What is suggested, as data.

#[test]
fn a_kill_is_suggested_as_commands_with_the_look_that_confirms_it() {
    let account = fork_orphan().account();
    let suggestion = &account.suggestion;
    assert!(matches!(suggestion.advice, Advice::Kill { .. }));
    assert_eq!(
        suggestion.commands,
        [Command {
            program: "kill",
            args: vec!["524".into()],
            stdin: None,
        }]
    );
    let then = suggestion.then.as_ref().expect("a look after the kill");
    assert_eq!(
        (then.program, then.args.join(" ")),
        ("vram-exporter", "check --gpu 0 --wait 30s".to_string())
    );
    assert_eq!(suggestion.wait_seconds, Some(30));
}

#[test]
fn a_reset_is_said_one_way_when_nothing_holds_the_gpu_and_another_when_clients_do() {
    let unheld = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .scanned()
        .account();
    assert_eq!(unheld.suggestion.advice, Advice::ResetUnheld);
    let held = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(nvml_client(1711, "nv-hostengine", &[0]))
        .account();
    assert_eq!(
        held.suggestion.advice,
        Advice::ResetOnceClientsStop {
            blockers: vec![1711]
        }
    );
    for account in [&unheld, &held] {
        assert_eq!(
            account.suggestion.commands[0].args,
            ["--gpu-reset", "-i", "0"]
        );
    }
}

#[test]
fn memory_being_freed_is_looked_at_again_sooner_than_a_kill_that_waits() {
    let mut exiting = cuda(432, &[]).state('Z');
    exiting.threads = 1;
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(exiting))
        .scanned()
        .account();
    assert_eq!(account.remedy, Remedy::Wait);
    assert_eq!(account.suggestion.advice, Advice::WaitWhileFreed);
    assert_eq!(account.suggestion.wait_seconds, Some(5));
}

// The GPUs `check` is asked about.

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
}
