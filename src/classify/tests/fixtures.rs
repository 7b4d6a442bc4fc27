//! Hosts to classify in tests, built a piece at a time, with the figures measured on an
//! H200 (see the project's GPU facts): the classifier's tests and the renderers' share
//! them, so each renderer is tested on reports the classifier really makes.

use crate::classify::*;
use std::collections::BTreeMap;
// Where a listed owner's PID leads in `/proc`, for the hosts the renderers' tests build.
use crate::observe::containers::ContainersReading;
pub(crate) use crate::observe::ProcessLookup;
use crate::observe::{
    CgroupAttribution, GpuHealth, GpuReading, GpuState, HolderScan, Identity, MemoryReading,
    NamespaceInit, NodeSet, NvmlLists, NvmlProcess, NvmlReading, Observation, OwnerLookup,
    ProcessFacts, ProcessList, ProcfsView, RecoveryAction, References, SlurmReading,
};

pub(crate) const MIB: u64 = 1024 * 1024;
pub(crate) const GIB: u64 = 1024 * MIB;
/// v2 `used` with one live PyTorch process holding an 8 GiB tensor.
pub(crate) const USED_ONE_OWNER: u64 = 9_238_806_528;
/// What NVML charged that process.
pub(crate) const CHARGED_ONE_OWNER: u64 = 9_229_565_952;
pub(crate) const TOTAL: u64 = 150_754_820_096;
pub(crate) const RESERVED: u64 = 644_939_776;
/// The host booted at 2026-12-03 00:00:00 UTC.
pub(crate) const BOOT: u64 = 1_796_256_000;

pub(crate) fn memory(used: u64) -> MemoryReading {
    MemoryReading {
        total: TOTAL,
        reserved: RESERVED,
        used,
        free: TOTAL - RESERVED - used,
    }
}

/// What a process maps or holds: the GPU nodes given, and the control node.
pub(crate) fn nodes(gpus: &[u32]) -> References {
    References::Read(NodeSet {
        gpus: gpus.to_vec(),
        control: !gpus.is_empty(),
        uvm: !gpus.is_empty(),
        ..NodeSet::default()
    })
}

/// A sleeping python3 that holds and maps `gpus` (a CUDA process with a context on
/// each), started 1000 s after boot.
pub(crate) fn cuda(pid: u32, gpus: &[u32]) -> ProcessFacts {
    ProcessFacts {
        pid,
        local_pid: Some(pid),
        start_time_ticks: 100_000,
        comm: "python3".into(),
        state: 'S',
        ppid: 1,
        pgid: pid,
        sid: pid,
        threads: 8,
        uid: Some(0),
        user: Some("root".into()),
        wchan: None,
        exiting: false,
        ending_since_unix_millis: None,
        kill_pending_since_unix_seconds: None,
        lineage: None,
        descriptors: nodes(gpus),
        mappings: nodes(gpus),
        cgroup: CgroupAttribution::default(),
        pid_namespace_init: None,
    }
}

/// An NVML client (a monitoring agent): it holds `gpus`' nodes open and maps nothing.
pub(crate) fn nvml_client(pid: u32, comm: &str, gpus: &[u32]) -> ProcessFacts {
    ProcessFacts {
        comm: comm.into(),
        mappings: nodes(&[]),
        ..cuda(pid, &[]).with_descriptors(gpus)
    }
}

impl ProcessFacts {
    pub(crate) fn with_descriptors(mut self, gpus: &[u32]) -> ProcessFacts {
        self.descriptors = nodes(gpus);
        self
    }

    pub(crate) fn state(mut self, letter: char) -> ProcessFacts {
        self.state = letter;
        self
    }

    pub(crate) fn started(mut self, ticks: u64) -> ProcessFacts {
        self.start_time_ticks = ticks;
        self
    }

    pub(crate) fn child_of(mut self, parent: u32) -> ProcessFacts {
        self.ppid = parent;
        self.pgid = parent;
        self.sid = parent;
        self
    }
}

/// A host being built: GPUs with their NVML readings, `/proc` under each listed PID, and
/// the holder scan.
pub(crate) struct Host {
    pub(crate) gpus: Vec<GpuReading>,
    pub(crate) owners: BTreeMap<u32, OwnerLookup>,
    pub(crate) host_pid_namespace: Option<bool>,
    pub(crate) procfs_view: ProcfsView,
    pub(crate) holders: Option<Vec<ProcessFacts>>,
    pub(crate) scan_cut_short: bool,
    pub(crate) scan_denied: u64,
    pub(crate) slurm: Option<SlurmReading>,
    pub(crate) containers: Option<ContainersReading>,
    pub(crate) taken_at: Option<u64>,
}

impl Host {
    /// One idle H200, minor 0.
    pub(crate) fn idle() -> Host {
        Host {
            gpus: Vec::new(),
            owners: BTreeMap::new(),
            host_pid_namespace: Some(true),
            procfs_view: ProcfsView::Own,
            holders: None,
            scan_cut_short: false,
            scan_denied: 0,
            slurm: None,
            containers: None,
            taken_at: None,
        }
        .gpu(0)
    }

    /// GPU `index` stuck for `seconds` in its memory call: it does not answer.
    pub(crate) fn not_answering(mut self, index: u32, seconds: f64) -> Host {
        let gpu = self
            .gpus
            .iter_mut()
            .find(|gpu| gpu.index == index)
            .expect("a GPU of this host");
        gpu.state = GpuState::NotAnswering {
            call: "nvmlDeviceGetMemoryInfo_v2".into(),
            stuck_seconds: seconds,
        };
        self
    }

    /// Another idle GPU, index and minor `index`.
    pub(crate) fn gpu(mut self, index: u32) -> Host {
        self.gpus.push(GpuReading {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H200".into(),
            pci_bus_id: format!("00000000:{:02x}:00.0", 0x19 + index),
            minor: Some(index),
            state: GpuState::Ok {
                memory: memory(0),
                processes: ProcessList::Listed(Vec::new()),
            },
            mig: None,
            health: GpuHealth::default(),
        });
        self
    }

    pub(crate) fn readings(&mut self, index: usize) -> (&mut MemoryReading, &mut Vec<NvmlProcess>) {
        match &mut self.gpus[index].state {
            GpuState::Ok {
                memory,
                processes: ProcessList::Listed(processes),
            } => (memory, processes),
            state => panic!("GPU {index} has no plain process list: {state:?}"),
        }
    }

    pub(crate) fn used(self, used: u64) -> Host {
        self.used_on(0, used)
    }

    pub(crate) fn used_on(mut self, gpu: usize, used: u64) -> Host {
        *self.readings(gpu).0 = memory(used);
        self
    }

    /// NVML charges `bytes` to `pid` on GPU 0; `/proc` shows `now` under it, and the
    /// exporter first saw `first` there.
    pub(crate) fn owner(self, pid: u32, bytes: Option<u64>, now: ProcessLookup) -> Host {
        self.owner_on(0, pid, bytes, now)
    }

    pub(crate) fn owner_on(
        mut self,
        gpu: usize,
        pid: u32,
        bytes: Option<u64>,
        now: ProcessLookup,
    ) -> Host {
        self.readings(gpu).1.push(NvmlProcess {
            pid,
            used_bytes: bytes,
            mps_only: false,
            lists: NvmlLists::COMPUTE,
        });
        let first_seen = match &now {
            ProcessLookup::Present(facts) => Some(Identity::of(facts)),
            _ => None,
        };
        self.owners.insert(pid, OwnerLookup { first_seen, now });
        self
    }

    /// The exporter first saw `first` under `pid`, whatever is there now.
    pub(crate) fn first_seen(mut self, pid: u32, first: &ProcessFacts) -> Host {
        self.owners.get_mut(&pid).expect("a listed PID").first_seen = Some(Identity::of(first));
        self
    }

    /// A process the holder scan found.
    pub(crate) fn holder(mut self, facts: ProcessFacts) -> Host {
        self.holders.get_or_insert_with(Vec::new).push(facts);
        self
    }

    /// A holder scan that found nothing.
    pub(crate) fn scanned(mut self) -> Host {
        self.holders.get_or_insert_with(Vec::new);
        self
    }

    pub(crate) fn observation(&self) -> Observation {
        Observation {
            nvml: NvmlReading::Up {
                driver_version: "580.159.04".into(),
                gpus: self.gpus.clone(),
            },
            host_pid_namespace: self.host_pid_namespace,
            procfs_view: self.procfs_view,
            boot_time_unix_seconds: Some(BOOT),
            clock_ticks_per_second: 100,
            taken_at_unix_seconds: self.taken_at,
            taken_at_unix_millis: None,
            owners: self.owners.clone(),
            holder_scan: self.holders.clone().map(|holders| HolderScan {
                holders,
                permission_errors: self.scan_denied,
                cut_short: self.scan_cut_short,
                duration_seconds: 0.001,
            }),
            procfs_errors: 0,
            procfs_stuck: None,
            kubernetes: None,
            slurm: self.slurm.clone(),
            containers: self.containers.clone(),
            witness: None,
            own_process: None,
        }
    }

    pub(crate) fn report(&self) -> Report {
        classify(&self.observation(), &Settings::default())
    }

    pub(crate) fn account(&self) -> GpuAccount {
        self.account_of(0)
    }

    pub(crate) fn account_of(&self, gpu: usize) -> GpuAccount {
        self.judged_of(gpu).account
    }

    /// GPU 0's account with the verdict on it.
    pub(crate) fn judged(&self) -> Judged {
        self.judged_of(0)
    }

    pub(crate) fn judged_of(&self, gpu: usize) -> Judged {
        self.report().gpus[gpu]
            .outcome
            .judged()
            .expect("measured")
            .clone()
    }
}

pub(crate) fn present(facts: ProcessFacts) -> ProcessLookup {
    ProcessLookup::Present(std::sync::Arc::new(facts))
}

pub(crate) fn pids(suspects: &[Suspect]) -> Vec<u32> {
    suspects.iter().map(|suspect| suspect.process.pid).collect()
}

/// The fork-inherited orphan measured on the H200: NVML charges 9,229,565,952 bytes to
/// PID 503, which exited; its child 524 maps GPU 0 and keeps the memory.
pub(crate) fn fork_orphan() -> Host {
    Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(cuda(524, &[0]).child_of(503).started(150_000))
}

pub(crate) const CONTAINER: &str =
    "3f2a9c0b1d2e3f2a9c0b1d2e3f2a9c0b1d2e3f2a9c0b1d2e3f2a9c0b1d2e3f2a";
pub(crate) const POD: &str = "1d9e2c4a-0000-4000-8000-000000000000";

pub(crate) fn contained(mut facts: ProcessFacts, init: Option<NamespaceInit>) -> ProcessFacts {
    facts.cgroup = CgroupAttribution {
        cgroup: Some(format!("/kubepods/pod{POD}/{CONTAINER}")),
        container_id: Some(CONTAINER.into()),
        pod_uid: Some(POD.into()),
        ..CgroupAttribution::default()
    };
    facts.pid_namespace_init = init;
    facts
}

/// The fork orphan 524 in step 0 of Slurm job 4242 of alice, whose owner 503 exited.
pub(crate) fn slurm_fork_orphan() -> Host {
    Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(in_slurm_job(
            cuda(524, &[0]).child_of(503).started(150_000),
            4242,
            "0",
        ))
}

/// `facts` in step `step` of Slurm job `job_id` of `user` (uid 1000), as cgroup v1
/// names it.
pub(crate) fn in_slurm_job(mut facts: ProcessFacts, job_id: u64, step: &str) -> ProcessFacts {
    facts.uid = Some(1000);
    facts.user = Some("alice".into());
    facts.cgroup = CgroupAttribution {
        cgroup: Some(format!("/slurm/uid_1000/job_{job_id}/step_{step}/task_0")),
        slurm: Some(crate::observe::SlurmStep {
            job_id,
            step: Some(step.into()),
            uid: Some(1000),
        }),
        ..CgroupAttribution::default()
    };
    facts
}

impl Host {
    /// The container engines' names: Podman named container `CONTAINER` `trainer`, from
    /// image `localhost/model:1`, in pod `lab`; Docker is absent.
    pub(crate) fn containers_named(mut self) -> Host {
        use crate::observe::containers::{ContainerName, Engine, EngineError, EngineHealth};
        self.containers = Some(ContainersReading {
            engines: [
                (
                    Engine::Docker,
                    EngineHealth {
                        error: Some(EngineError::Absent),
                        message: Some("no container engine socket at /var/run/docker.sock".into()),
                        last_success_unix_seconds: None,
                    },
                ),
                (
                    Engine::Podman,
                    EngineHealth {
                        error: None,
                        message: None,
                        last_success_unix_seconds: Some(1_764_800_000.5),
                    },
                ),
            ]
            .into(),
            names: [(
                CONTAINER.to_string(),
                ContainerName {
                    engine: Engine::Podman,
                    name: "trainer".into(),
                    image: Some("localhost/model:1".into()),
                    compose_project: None,
                    pod: Some("lab".into()),
                },
            )]
            .into(),
        });
        self
    }

    /// The Slurm job steps whose slurmstepd runs, from a complete look.
    pub(crate) fn slurm_running(mut self, steps: &[(u64, &str)]) -> Host {
        self.slurm = Some(SlurmReading {
            running_steps: steps
                .iter()
                .map(|(job_id, step)| crate::observe::RunningStep {
                    job_id: *job_id,
                    step: (*step).into(),
                })
                .collect(),
            complete: true,
        });
        self
    }

    pub(crate) fn health(mut self, health: GpuHealth) -> Host {
        self.gpus[0].health = health;
        self
    }
}

pub(crate) fn recovery(action: RecoveryAction) -> GpuHealth {
    GpuHealth {
        recovery_action: Some(action),
        ..GpuHealth::default()
    }
}

/// GPU 0 in MIG mode with GPU instances 1 and 2 (capability minors 12/13 and 21/22); NVML
/// charges PID 503, gone, in instance 2.
pub(crate) fn mig_host(capabilities: bool) -> Host {
    use crate::observe::{MigCapabilities, MigDeviceReading, MigReading};
    let device =
        |index: u32, gi: u32, minors: (u32, u32), processes: Vec<NvmlProcess>| MigDeviceReading {
            index,
            uuid: format!("MIG-{gi}"),
            name: "NVIDIA H200 MIG 1g.18gb".into(),
            profile: "1g.18gb".into(),
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(0),
            capabilities: capabilities.then_some(MigCapabilities {
                gpu_instance: Some(minors.0),
                compute_instance: Some(minors.1),
            }),
            state: GpuState::Ok {
                memory: memory(if processes.is_empty() {
                    0
                } else {
                    USED_ONE_OWNER
                }),
                processes: ProcessList::Listed(processes),
            },
        };
    let dead = NvmlProcess {
        pid: 503,
        used_bytes: Some(CHARGED_ONE_OWNER),
        mps_only: false,
        lists: NvmlLists::COMPUTE,
    };
    let mut host = Host::idle().used(USED_ONE_OWNER).owner(
        503,
        Some(CHARGED_ONE_OWNER),
        ProcessLookup::Missing,
    );
    host.gpus[0].mig = Some(MigReading {
        enabled: true,
        pending: true,
        devices: vec![
            device(0, 1, (12, 13), vec![]),
            device(1, 2, (21, 22), vec![dead]),
        ],
        error: None,
    });
    host
}

/// A fork child of 503 mapping GPU 0 and holding the capability nodes `caps`.
pub(crate) fn instance_child(pid: u32, caps: &[u32]) -> ProcessFacts {
    let mut child = cuda(pid, &[0]).child_of(503);
    child.descriptors = References::Read(NodeSet {
        gpus: vec![0],
        control: true,
        capabilities: caps.to_vec(),
        ..NodeSet::default()
    });
    child
}

/// NVML's answer when its init has not returned for `seconds`.
pub(crate) fn nvml_not_answering(seconds: f64) -> NvmlReading {
    NvmlReading::Down {
        error: "NVML does not answer: nvmlInit_v2 has not returned".into(),
        reason: NvmlFailure::NotAnswering,
        stuck: Some(StuckCall {
            call: "nvmlInit_v2".into(),
            stuck_seconds: seconds,
        }),
    }
}

/// NVML's answer when it cannot be loaded.
pub(crate) fn nvml_down(error: &str) -> NvmlReading {
    NvmlReading::Down {
        error: error.into(),
        reason: NvmlFailure::Missing,
        stuck: None,
    }
}

impl Host {
    /// NVML lists `pid` on GPU 0 on these lists (the fixtures list owners on the compute
    /// list).
    pub(crate) fn on_lists(mut self, pid: u32, lists: NvmlLists) -> Host {
        for process in self.readings(0).1.iter_mut().filter(|p| p.pid == pid) {
            process.lists = lists;
            process.mps_only = lists == NvmlLists::MPS;
        }
        self
    }

    /// The exporter never saw any listed process before this look (a fresh `check`).
    pub(crate) fn seen_for_the_first_time(mut self) -> Host {
        for lookup in self.owners.values_mut() {
            lookup.first_seen = None;
        }
        self
    }
}

/// The compute list and the MPS list: where the H200 listed every MPS client, live or dead.
pub(crate) const MPS_CLIENT: NvmlLists = NvmlLists {
    compute: true,
    graphics: false,
    mps: true,
};

/// The MPS control daemon as the H200 showed it (PID 447, started at 2365 ticks, before
/// every client): `nvidia-cuda-mps`, parent 1, leading its own session and group, holding
/// GPU 0's node and nvidiactl, mapping the GPU's node only write-only and nvidiactl only
/// read-only.
pub(crate) fn mps_daemon(pid: u32) -> ProcessFacts {
    ProcessFacts {
        comm: "nvidia-cuda-mps".into(),
        start_time_ticks: 2365,
        threads: 2,
        mappings: References::Read(NodeSet {
            gpus: vec![0],
            control: true,
            gpus_without_read_write: [(0, crate::observe::NarrowAccess::WriteOnly)].into(),
            control_without_read_write: Some(crate::observe::NarrowAccess::ReadOnly),
            ..NodeSet::default()
        }),
        ..cuda(pid, &[0])
    }
}

/// The MPS server as the H200 showed it: `nvidia-cuda-mps`, the daemon's child in its
/// group and session, started when the first client connected, mapping GPU 0 read-write.
pub(crate) fn mps_server(pid: u32, daemon: u32) -> ProcessFacts {
    ProcessFacts {
        comm: "nvidia-cuda-mps".into(),
        start_time_ticks: 2990,
        threads: 7,
        ..cuda(pid, &[0]).child_of(daemon)
    }
}

/// GPU 0 shared through MPS, as measured on the H200 (driver 580.159.04): the control
/// daemon 447, its server 466 (on the compute list only, 69,206,016 bytes), a live client
/// 449 (3 GiB: 3,860,856,832 bytes on the compute and MPS lists), and client 479, which
/// allocated 4 GiB and exited: NVML still lists it on both lists (4,934,598,656 bytes).
/// Without the dead client's forked child (see [`mps_fork_orphan`]).
pub(crate) fn mps_dead_client_without_heir() -> Host {
    mps_live_client()
        .used(8_874_885_120)
        .owner(479, Some(4_934_598_656), ProcessLookup::Missing)
        .on_lists(479, MPS_CLIENT)
}

/// GPU 0 shared through MPS with one live client, as on the H200: the daemon 447, its
/// server 466 and client 449 (3,939,434,496 bytes used).
pub(crate) fn mps_live_client() -> Host {
    Host::idle()
        .used(3_939_434_496)
        .owner(
            449,
            Some(3_860_856_832),
            present(cuda(449, &[0]).started(2370)),
        )
        .on_lists(449, MPS_CLIENT)
        .owner(466, Some(69_206_016), present(mps_server(466, 447)))
        .holder(mps_daemon(447))
        .holder(cuda(449, &[0]).started(2370))
        .holder(mps_server(466, 447))
}

/// The fork orphan under MPS: [`mps_dead_client_without_heir`] with the dead client's
/// child 500 (parent 1, in the dead client's group and session, started after it), which
/// never touched CUDA and maps GPU 0 read-write through the inherited context.
pub(crate) fn mps_fork_orphan() -> Host {
    let mut child = cuda(500, &[0]).child_of(479).started(3410);
    child.ppid = 1;
    mps_dead_client_without_heir().holder(child)
}
