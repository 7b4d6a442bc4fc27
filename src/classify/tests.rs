//! Case-by-case tests with the figures measured on an H200 (see the project's GPU facts).

use super::*;
use crate::observe::{CgroupAttribution, GpuReading, HolderScan, ProcessFacts};
use std::collections::BTreeMap;

const MIB: u64 = 1024 * 1024;
/// v2 `used` with one live PyTorch process holding an 8 GiB tensor.
const USED_ONE_OWNER: u64 = 9_238_806_528;
/// What NVML charged that process.
const CHARGED_ONE_OWNER: u64 = 9_229_565_952;
const TOTAL: u64 = 150_754_820_096;
const RESERVED: u64 = 644_939_776;

fn memory(used: u64) -> MemoryReading {
    MemoryReading {
        total: TOTAL,
        reserved: RESERVED,
        used,
        free: TOTAL - RESERVED - used,
    }
}

fn facts(state: char, device_files: DeviceFiles) -> ProcessLookup {
    ProcessLookup::Present(ProcessFacts {
        comm: "python3".into(),
        state,
        ppid: 1,
        start_time_ticks: 1000,
        uid: Some(0),
        device_files,
        cgroup: CgroupAttribution::default(),
        pid_namespace_init: None,
    })
}

struct Host {
    used: u64,
    /// NVML's memory figures as given, instead of a consistent reading of `used`.
    raw_memory: Option<MemoryReading>,
    listed: Vec<NvmlProcess>,
    processes: BTreeMap<u32, ProcessLookup>,
    host_pid_namespace: Option<bool>,
    holders: Option<Vec<Holder>>,
}

impl Host {
    fn idle() -> Host {
        Host {
            used: 0,
            raw_memory: None,
            listed: Vec::new(),
            processes: BTreeMap::new(),
            host_pid_namespace: Some(true),
            holders: None,
        }
    }

    fn used(mut self, used: u64) -> Host {
        self.used = used;
        self
    }

    fn owner(mut self, pid: u32, bytes: Option<u64>, lookup: ProcessLookup) -> Host {
        self.listed.push(NvmlProcess {
            pid,
            used_bytes: bytes,
        });
        self.processes.insert(pid, lookup);
        self
    }

    /// A process with these GPU nodes open.
    fn holder(mut self, pid: u32, ppid: u32, comm: &str, minors: &[u32]) -> Host {
        self.holders.get_or_insert_with(Vec::new).push(Holder {
            pid,
            ppid,
            comm: comm.into(),
            state: 'S',
            start_time_ticks: 2000,
            uid: Some(0),
            user: None,
            wchan: None,
            gpu_minors: minors.to_vec(),
            pgid: pid,
            sid: pid,
            cgroup: CgroupAttribution::default(),
            pid_namespace_init: None,
        });
        self
    }

    fn namespace(mut self, host: Option<bool>) -> Host {
        self.host_pid_namespace = host;
        self
    }

    fn observation(&self) -> Observation {
        Observation {
            nvml: NvmlReading::Up {
                driver_version: "580.159.04".into(),
                gpus: vec![GpuReading {
                    index: 0,
                    uuid: "GPU-0".into(),
                    name: "NVIDIA H200".into(),
                    pci_bus_id: "00000000:19:00.0".into(),
                    minor: Some(0),
                    state: GpuState::Ok {
                        memory: self.raw_memory.unwrap_or_else(|| memory(self.used)),
                        processes: self.listed.clone().into(),
                    },
                    mig: None,
                    health: Default::default(),
                }],
            },
            host_pid_namespace: self.host_pid_namespace,
            processes: self.processes.clone(),
            holder_scan: self.holders.clone().map(|holders| HolderScan {
                holders,
                permission_errors: 0,
                cut_short: false,
                duration_seconds: 0.001,
            }),
            procfs_errors: 0,
        }
    }

    fn account(&self) -> GpuAccount {
        let report = classify(&self.observation(), &Settings::default());
        report.gpus[0].account().expect("measured").clone()
    }
}

#[test]
fn idle_gpu_has_no_owners_and_nothing_orphaned() {
    let account = Host::idle().account();
    assert!(account.owners.is_empty());
    assert_eq!(account.orphaned_bytes(), 0);
    assert_eq!(account.unattributed_bytes, 0);
    for state in OwnerState::ALL {
        assert_eq!(account.tally.processes(state), 0, "{state:?}");
    }
}

#[test]
fn live_sleeping_owner_is_running_and_its_context_overhead_is_noise() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), facts('S', DeviceFiles::Held))
        .account();
    assert_eq!(account.tally.processes(OwnerState::Running), 1);
    assert_eq!(account.tally.bytes(OwnerState::Running), CHARGED_ONE_OWNER);
    // 8.8 MiB are uncharged per-context overhead: under the floor.
    assert_eq!(account.unattributed_bytes, 0);
    assert_eq!(account.orphaned_bytes(), 0);
}

#[test]
fn running_letters_r_s_i_are_running() {
    for letter in ['R', 'S', 'I', 'W', 'P'] {
        assert_eq!(OwnerState::from_proc_letter(letter), OwnerState::Running);
    }
}

#[test]
fn stopped_owner_is_stopped_not_orphaned() {
    for letter in ['T', 't'] {
        let account = Host::idle()
            .used(USED_ONE_OWNER)
            .owner(
                432,
                Some(CHARGED_ONE_OWNER),
                facts(letter, DeviceFiles::Held),
            )
            .account();
        assert_eq!(account.tally.processes(OwnerState::Stopped), 1);
        assert_eq!(account.tally.bytes(OwnerState::Stopped), CHARGED_ONE_OWNER);
        assert_eq!(account.orphaned_bytes(), 0);
    }
}

#[test]
fn owner_in_uninterruptible_sleep_is_live() {
    let account = Host::idle()
        .used(4_850_000_000)
        .owner(465, Some(4_840_000_000), facts('D', DeviceFiles::Held))
        .account();
    assert_eq!(account.tally.processes(OwnerState::Uninterruptible), 1);
    assert_eq!(account.orphaned_bytes(), 0);
}

#[test]
fn zombie_main_thread_with_live_threads_holding_the_device_is_a_live_zombie() {
    // pthread_exit case: the observer found the device in a thread's fd list.
    let account = Host::idle()
        .used(4_850_000_000)
        .owner(454, Some(4_840_000_000), facts('Z', DeviceFiles::Held))
        .account();
    assert_eq!(account.tally.processes(OwnerState::Zombie), 1);
    assert_eq!(account.tally.processes(OwnerState::Gone), 0);
    assert_eq!(account.orphaned_bytes(), 0);
}

#[test]
fn fork_inherited_orphan_charges_the_dead_pid_as_owner_gone() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .account();
    assert_eq!(account.tally.processes(OwnerState::Gone), 1);
    assert_eq!(account.tally.bytes(OwnerState::Gone), CHARGED_ONE_OWNER);
    assert_eq!(account.orphaned_owner_gone_bytes, CHARGED_ONE_OWNER);
    assert_eq!(account.orphaned_unattributed_bytes(), 0);
    assert_eq!(account.orphaned_bytes(), CHARGED_ONE_OWNER);
}

#[test]
fn reused_pid_without_the_device_is_gone() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(
            503,
            Some(CHARGED_ONE_OWNER),
            facts('S', DeviceFiles::NotHeld),
        )
        .account();
    assert_eq!(account.owners[0].state, OwnerState::Gone);
    assert_eq!(account.orphaned_owner_gone_bytes, CHARGED_ONE_OWNER);
}

#[test]
fn full_zombie_without_device_files_is_gone() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(
            503,
            Some(CHARGED_ONE_OWNER),
            facts('Z', DeviceFiles::NotHeld),
        )
        .account();
    assert_eq!(account.owners[0].state, OwnerState::Gone);
}

#[test]
fn unreadable_descriptor_list_is_never_called_gone() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(
            432,
            Some(CHARGED_ONE_OWNER),
            facts('S', DeviceFiles::Unreadable),
        )
        .account();
    assert_eq!(account.owners[0].state, OwnerState::Running);
    assert_eq!(account.orphaned_bytes(), 0);
}

#[test]
fn unreadable_proc_entry_is_unknown_not_gone() {
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
    assert_eq!(account.owners[0].state, OwnerState::Unknown);
    assert_eq!(account.tally.processes(OwnerState::Gone), 0);
    assert_eq!(account.orphaned_bytes(), 0);
}

#[test]
fn used_memory_without_any_owner_is_unattributed_orphan() {
    // The story: GPU 2 kept 76,107 MiB with no process listed.
    let used = 76_107 * MIB;
    let account = Host::idle().used(used).account();
    assert_eq!(account.unattributed_bytes, used);
    assert_eq!(account.unattributed_trust, UnattributedTrust::Counted);
    assert_eq!(account.orphaned_unattributed_bytes(), used);
    assert_eq!(account.orphaned_bytes(), used);
}

#[test]
fn unattributed_is_used_minus_charged_minus_floor_per_context() {
    let floor = Settings::default().context_overhead_bytes;
    let extra = 3 * 1024 * MIB;
    let used = CHARGED_ONE_OWNER + 2 * floor + extra;
    let account = Host::idle()
        .used(used)
        .owner(432, Some(CHARGED_ONE_OWNER), facts('S', DeviceFiles::Held))
        .account();
    // One context: one floor subtracted.
    assert_eq!(account.unattributed_bytes, floor + extra);
}

#[test]
fn unattributed_never_goes_below_zero() {
    // NVML may charge more than `used` says, between two calls.
    let account = Host::idle()
        .used(1000)
        .owner(432, Some(CHARGED_ONE_OWNER), facts('S', DeviceFiles::Held))
        .account();
    assert_eq!(account.unattributed_bytes, 0);
}

#[test]
fn blind_exporter_reports_unattributed_but_not_orphaned() {
    // Inside a foreign PID namespace NVML lists nothing while a 4 GiB owner lives outside.
    let used = 4 * 1024 * MIB + 9 * MIB;
    for namespace in [Some(false), None] {
        let account = Host::idle().used(used).namespace(namespace).account();
        assert_eq!(account.unattributed_bytes, used);
        assert_eq!(account.unattributed_trust, UnattributedTrust::Blind);
        assert_eq!(account.orphaned_bytes(), 0);
    }
}

#[test]
fn blind_exporter_still_reports_gone_owners() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .namespace(Some(false))
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .account();
    assert_eq!(account.orphaned_owner_gone_bytes, CHARGED_ONE_OWNER);
}

#[test]
fn live_owner_with_unavailable_usage_counts_but_blocks_unattributed_orphans() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, None, facts('S', DeviceFiles::Held))
        .account();
    assert_eq!(account.tally.processes(OwnerState::Running), 1);
    assert_eq!(account.tally.bytes(OwnerState::Running), 0);
    assert_eq!(account.usage_unavailable_owners, 1);
    // Its bytes are not subtracted, so the remainder is not evidence of an orphan.
    assert_eq!(
        account.unattributed_bytes,
        USED_ONE_OWNER - Settings::default().context_overhead_bytes
    );
    assert_eq!(
        account.unattributed_trust,
        UnattributedTrust::UsageUnavailable
    );
    assert_eq!(account.orphaned_bytes(), 0);
}

#[test]
fn gone_owner_with_unavailable_usage_leaves_its_memory_orphaned_as_unattributed() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, None, ProcessLookup::Missing)
        .account();
    assert_eq!(account.tally.processes(OwnerState::Gone), 1);
    assert_eq!(account.orphaned_owner_gone_bytes, 0);
    assert_eq!(account.unattributed_trust, UnattributedTrust::Counted);
    assert!(account.orphaned_bytes() > 8 * 1024 * MIB);
}

#[test]
fn live_and_gone_owners_are_tallied_separately() {
    let account = Host::idle()
        .used(2 * USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), facts('S', DeviceFiles::Held))
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .account();
    assert_eq!(account.tally.processes(OwnerState::Running), 1);
    assert_eq!(account.tally.processes(OwnerState::Gone), 1);
    assert_eq!(account.orphaned_owner_gone_bytes, CHARGED_ONE_OWNER);
}

#[test]
fn unlisted_holder_of_the_gpu_node_is_named() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(524, 1, "python3", &[0])
        .holder(600, 1, "python3", &[1])
        .holder(700, 1, "nvidia-persiste", &[0])
        .account();
    let pids: Vec<u32> = account.unlisted_holders.iter().map(|h| h.pid).collect();
    // 600 holds another GPU; 700 is the driver's persistence daemon.
    assert_eq!(pids, vec![524]);
    let others: Vec<u32> = account.other_holders.iter().map(|h| h.pid).collect();
    assert_eq!(others, vec![700]);
}

#[test]
fn known_nvml_clients_and_site_agents_are_never_culprits() {
    // NVML clients hold the very files a CUDA process holds; only their names tell.
    let host = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(800, 1, "gpu-agent", &[0])
        .holder(801, 1, "vram-exporter", &[0])
        .holder(524, 1, "python3", &[0]);
    let settings = Settings {
        ignored_holder_comms: vec!["gpu-agent".into()],
        ..Settings::default()
    };
    let report = classify(&host.observation(), &settings);
    let account = report.gpus[0].account().unwrap();
    let culprits: Vec<u32> = account.unlisted_holders.iter().map(|h| h.pid).collect();
    assert_eq!(culprits, vec![524]);
    let others: Vec<u32> = account.other_holders.iter().map(|h| h.pid).collect();
    assert_eq!(others, vec![800, 801]);
}

#[test]
fn kinship_ties_a_holder_to_the_gone_owner() {
    let mut holder = Host::idle()
        .holder(524, 1, "python3", &[0])
        .holders
        .unwrap()
        .remove(0);
    assert_eq!(kinship(&holder, &[503]), None);
    holder.sid = 503;
    assert_eq!(kinship(&holder, &[503]), Some(Kinship::SessionOf(503)));
    holder.pgid = 503;
    assert_eq!(kinship(&holder, &[503]), Some(Kinship::ProcessGroupOf(503)));
    holder.ppid = 503;
    assert_eq!(kinship(&holder, &[7, 503]), Some(Kinship::ChildOf(503)));
}

#[test]
fn listed_live_owner_is_not_an_unlisted_holder() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), facts('S', DeviceFiles::Held))
        .holder(432, 1, "python3", &[0])
        .account();
    assert!(account.unlisted_holders.is_empty());
}

#[test]
fn failed_gpu_has_no_account_and_no_orphans() {
    let mut observation = Host::idle().observation();
    if let NvmlReading::Up { gpus, .. } = &mut observation.nvml {
        gpus[0].state = GpuState::Failed {
            error: GpuError::GpuLost,
            message: "GPU is lost".into(),
        };
    }
    let report = classify(&observation, &Settings::default());
    assert!(report.gpus[0].account().is_none());
    assert_eq!(report.gpus[0].orphaned_bytes(), 0);
    assert!(report.nvml_up);
}

#[test]
fn nvml_down_reports_no_gpus() {
    let observation = Observation {
        nvml: NvmlReading::Down {
            error: "libnvidia-ml.so.1: cannot open shared object file".into(),
        },
        host_pid_namespace: Some(true),
        processes: BTreeMap::new(),
        holder_scan: None,
        procfs_errors: 0,
    };
    let report = classify(&observation, &Settings::default());
    assert!(!report.nvml_up);
    assert!(report.gpus.is_empty());
    assert!(report.nvml_error.unwrap().contains("libnvidia-ml"));
}

#[test]
fn context_overhead_setting_moves_the_floor() {
    let host = Host::idle().used(USED_ONE_OWNER).owner(
        432,
        Some(CHARGED_ONE_OWNER),
        facts('S', DeviceFiles::Held),
    );
    let strict = Settings {
        context_overhead_bytes: 0,
        ..Settings::default()
    };
    let report = classify(&host.observation(), &strict);
    let account = report.gpus[0].account().unwrap();
    assert_eq!(
        account.unattributed_bytes,
        USED_ONE_OWNER - CHARGED_ONE_OWNER
    );
}

/// A live owner's facts with its cgroup and PID namespace.
fn contained(container_id: &str, pod_uid: &str, init: Option<NamespaceInit>) -> ProcessLookup {
    let ProcessLookup::Present(mut facts) = facts('D', DeviceFiles::Held) else {
        unreachable!()
    };
    facts.cgroup = CgroupAttribution {
        cgroup: Some(format!("/kubepods/pod{pod_uid}/{container_id}")),
        container_id: Some(container_id.into()),
        pod_uid: Some(pod_uid.into()),
    };
    facts.pid_namespace_init = init;
    ProcessLookup::Present(facts)
}

const CONTAINER: &str = "3f2a9c0b1d2e3f2a9c0b1d2e3f2a9c0b1d2e3f2a9c0b1d2e3f2a9c0b1d2e3f2a";
const POD: &str = "1d9e2c4a-0000-4000-8000-000000000000";

#[test]
fn live_owner_carries_its_container_and_pod() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(
            432,
            Some(CHARGED_ONE_OWNER),
            contained(CONTAINER, POD, Some(NamespaceInit::Running { pid: 400 })),
        )
        .account();
    let owner = &account.owners[0];
    assert_eq!(owner.container_id.as_deref(), Some(CONTAINER));
    assert_eq!(owner.pod_uid.as_deref(), Some(POD));
    assert!(!owner.container_exited);
    assert_eq!(account.exited_container_processes(), 0);
}

#[test]
fn reused_pid_does_not_lend_its_container_to_the_gone_owner() {
    let ProcessLookup::Present(mut facts) = contained(CONTAINER, POD, None) else {
        unreachable!()
    };
    facts.device_files = DeviceFiles::NotHeld;
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), ProcessLookup::Present(facts))
        .account();
    let owner = &account.owners[0];
    assert_eq!(owner.state, OwnerState::Gone);
    assert_eq!(
        (owner.container_id.as_ref(), owner.pod_uid.as_ref()),
        (None, None)
    );
}

#[test]
fn owner_and_holder_outliving_their_containers_are_counted() {
    let ended = Some(NamespaceInit::Exited { pid: 400 });
    let mut host = Host::idle()
        .used(2 * USED_ONE_OWNER)
        .owner(
            432,
            Some(CHARGED_ONE_OWNER),
            contained(CONTAINER, POD, ended),
        )
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(524, 1, "python3", &[0])
        .holder(525, 1, "python3", &[0]);
    host.holders.as_mut().unwrap()[0].pid_namespace_init = ended;
    host.holders.as_mut().unwrap()[1].pid_namespace_init = Some(NamespaceInit::Unknown);
    let account = host.account();
    assert!(account.owners[0].container_exited);
    // The uninterruptible owner 432 and the holder 524; not 525, whose PID 1 is unknown.
    assert_eq!(account.exited_container_processes(), 2);
    assert_eq!(account.orphaned_owner_gone_bytes, CHARGED_ONE_OWNER);
}

#[test]
fn used_beyond_the_total_is_clamped_flagged_and_not_called_orphaned() {
    let mut host = Host::idle().owner(432, Some(CHARGED_ONE_OWNER), facts('S', DeviceFiles::Held));
    host.raw_memory = Some(MemoryReading {
        total: TOTAL,
        reserved: RESERVED,
        used: 4 * TOTAL,
        free: 0,
    });
    let account = host.account();
    assert!(account.memory_inconsistent);
    assert_eq!(account.memory.used, TOTAL - RESERVED);
    assert_eq!(account.memory.free, 0);
    assert_eq!(account.unattributed_trust, UnattributedTrust::Inconsistent);
    assert!(account.unattributed_bytes > 0);
    assert_eq!(account.orphaned_bytes(), 0);
}

#[test]
fn free_and_reserved_beyond_the_total_are_clamped() {
    let mut host = Host::idle();
    host.raw_memory = Some(MemoryReading {
        total: TOTAL,
        reserved: u64::MAX,
        used: 0,
        free: u64::MAX,
    });
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
fn consistent_readings_are_not_flagged() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), facts('S', DeviceFiles::Held))
        .account();
    assert!(!account.memory_inconsistent);
    assert_eq!(account.memory, memory(USED_ONE_OWNER));
}

#[test]
fn a_pid_listed_twice_counts_once() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .owner(503, None, ProcessLookup::Missing)
        .account();
    assert_eq!(account.owners.len(), 1);
    assert_eq!(account.tally.processes(OwnerState::Gone), 1);
    assert_eq!(account.orphaned_owner_gone_bytes, CHARGED_ONE_OWNER);
    assert_eq!(account.usage_unavailable_owners, 0);
}

#[test]
fn absurd_per_process_figures_never_overflow_or_exceed_the_gpu() {
    let mut host = Host::idle().used(USED_ONE_OWNER);
    for pid in 1000..1010 {
        host = host.owner(pid, Some(u64::MAX), ProcessLookup::Missing);
    }
    host = host.owner(2000, Some(u64::MAX), facts('S', DeviceFiles::Held));
    let account = host.account();
    let capacity = TOTAL - RESERVED;
    assert!(account
        .owners
        .iter()
        .all(|owner| owner.used_bytes == Some(capacity)));
    assert!(account.memory_inconsistent);
    // Orphaned memory is part of the used memory; what owners hold, part of the GPU.
    assert_eq!(account.orphaned_owner_gone_bytes, USED_ONE_OWNER);
    assert_eq!(account.orphaned_bytes(), USED_ONE_OWNER);
    assert_eq!(account.tally.bytes(OwnerState::Gone), capacity);
    assert_eq!(account.tally.bytes(OwnerState::Running), capacity);
}

#[test]
fn processes_charged_more_than_is_used_are_flagged_and_bounded_by_used() {
    let account = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(2 * USED_ONE_OWNER), ProcessLookup::Missing)
        .account();
    assert!(account.memory_inconsistent);
    assert_eq!(account.orphaned_owner_gone_bytes, USED_ONE_OWNER);
    assert_eq!(account.unattributed_bytes, 0);
}
