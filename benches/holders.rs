//! The scan of every process's descriptors for NVIDIA device files, on a synthetic
//! procfs tree (10,000 processes with 50 open files each, built once in a temporary
//! folder) and on this host's real `/proc`.
//!
//! `cargo bench --bench holders`
//!
//! The scan runs only while some GPU has orphaned memory; its target is 150 ms for
//! 10,000 processes, and its cost should grow linearly with the open files it reads.
//!
//! Wall time is what a scrape waits, but on a machine shared with other work it
//! measures the others too. The largest tree is therefore also measured in CPU time
//! (user and system, of every thread of this process, from `getrusage`): what the scan
//! itself costs, whatever else runs. On an idle machine the wall time is about the CPU
//! time divided by the scan's threads (up to eight, one per core).

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use std::fs;
use std::hint::black_box;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vram_exporter::observe::procfs::{
    EarlierLooks, Placement, ProcRoot, ProcessReader, DEVICE_PREFIX,
};

/// Open files per synthetic process.
const FILES_PER_PROCESS: usize = 50;
/// One process in this many holds `/dev/nvidia0` (and the control node).
const HOLDER_EVERY: usize = 1_000;
/// Tree sizes, in processes.
const SIZES: [usize; 3] = [2_500, 5_000, 10_000];
/// Far above any scan here, so none is cut short.
const BUDGET: Duration = Duration::from_secs(60);

/// What the descriptors of an ordinary process point at.
const TARGETS: [&str; 10] = [
    "/dev/null",
    "/dev/pts/0",
    "socket:[4026531993]",
    "pipe:[81234]",
    "anon_inode:[eventfd]",
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/var/log/app/worker.log",
    "anon_inode:[eventpoll]",
    "/home/user/data/shard-00017.parquet",
    "/dev/urandom",
];

/// A procfs-shaped tree of `processes` PIDs under `root`; returns how many hold a GPU.
fn build_tree(root: &Path, processes: usize) -> usize {
    fs::create_dir_all(root).unwrap();
    let mut holders = 0;
    for index in 0..processes {
        let pid = 1_000 + index as u32;
        let pid_dir = root.join(pid.to_string());
        let fd_dir = pid_dir.join("fd");
        fs::create_dir_all(&fd_dir).unwrap();
        let holds_gpu = index % HOLDER_EVERY == HOLDER_EVERY / 2;
        for fd in 0..FILES_PER_PROCESS {
            let target = match fd {
                40 if holds_gpu => "/dev/nvidiactl",
                41 if holds_gpu => "/dev/nvidia0",
                42 if holds_gpu => "/dev/nvidia-uvm",
                _ => TARGETS[fd % TARGETS.len()],
            };
            symlink(target, fd_dir.join(fd.to_string())).unwrap();
        }
        // Every process has a stat line: the scan reads it first, for the start time.
        fs::write(
            pid_dir.join("stat"),
            format!(
                "{pid} (worker) S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {pid} 0\n"
            ),
        )
        .unwrap();
        if holds_gpu {
            holders += 1;
            fs::write(
                pid_dir.join("stat"),
                format!(
                    "{pid} (python3) S 1 {pid} {pid} 0 -1 4194560 1000 0 0 0 100 20 0 0 20 0 4 0 \
                     123456 8388608000 20000 18446744073709551615 1 1 0 0 0 0 0 4096 16386 0 0 0 \
                     17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
                ),
            )
            .unwrap();
            fs::write(pid_dir.join("status"), "Name:\tpython3\nUid:\t0\t0\t0\t0\n").unwrap();
            // A CUDA context: shared mappings of the GPU's node and the control node.
            fs::write(
                pid_dir.join("maps"),
                "7f10a0000000-7f10a0200000 rw-s 00000000 00:05 1065 /dev/nvidiactl\n\
                 7f10a4000000-7f10a4001000 rw-s 00000000 00:05 1071 /dev/nvidia0\n",
            )
            .unwrap();
        }
    }
    holders
}

struct Tree {
    _dir: tempfile::TempDir,
    roots: Vec<(usize, PathBuf, usize)>,
}

fn build_trees() -> Tree {
    // In memory where there is a tmpfs: quick to build and to remove, and no disk I/O.
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("temporary folder");
    let started = Instant::now();
    let roots = SIZES
        .iter()
        .map(|&processes| {
            let root = dir.path().join(format!("proc-{processes}"));
            let holders = build_tree(&root, processes);
            (processes, root, holders)
        })
        .collect();
    eprintln!(
        "built synthetic procfs trees of {SIZES:?} processes x {FILES_PER_PROCESS} files in {} in {:.1} s",
        dir.path().parent().unwrap().display(),
        started.elapsed().as_secs_f64()
    );
    Tree { _dir: dir, roots }
}

fn proc_root(root: PathBuf) -> ProcRoot {
    ProcRoot {
        root,
        device_prefix: DEVICE_PREFIX.to_vec(),
        // Synthetic trees of files standing in for a procfs.
        stand_in: true,
    }
}

fn bench_synthetic(c: &mut Criterion) {
    let tree = build_trees();
    let mut group = c.benchmark_group("holder_scan_synthetic");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(9));
    for (processes, root, holders) in &tree.roots {
        let root = proc_root(root.clone());
        let scan = ProcessReader::new(&root).scan_holders(BUDGET);
        assert!(!scan.cut_short && scan.permission_errors == 0, "{scan:?}");
        assert_eq!(scan.holders.len(), *holders);
        assert!(scan
            .holders
            .iter()
            .all(|holder| holder.descriptors.has_gpu(0)
                && holder.mappings.has_gpu(0)
                && holder.comm == "python3"
                && holder.state == 'S'));
        group.throughput(Throughput::Elements((processes * FILES_PER_PROCESS) as u64));
        // The first scan of an episode: nothing remembered, every link read.
        group.bench_with_input(
            BenchmarkId::new("first_scan_processes_x50_files", processes),
            &root,
            |b, root| b.iter(|| black_box(ProcessReader::new(root).scan_holders(BUDGET))),
        );
        // The scans after it, one per scrape while memory stays orphaned: a process
        // remembered with no NVIDIA file and as many descriptors is not listed again.
        let placement = Placement::locate(&root);
        let (_, learnt) =
            ProcessReader::new(&root).scan_and_remember(std::time::Instant::now() + BUDGET);
        let earlier_looks: EarlierLooks = learnt.into_iter().collect();
        group.bench_with_input(
            BenchmarkId::new("next_scans_processes_x50_files", processes),
            &root,
            |b, root| {
                b.iter(|| {
                    let reader = ProcessReader::with_earlier_looks(root, placement, &earlier_looks);
                    black_box(reader.scan_holders(BUDGET))
                })
            },
        );
    }
    group.finish();

    let (processes, root, _) = tree.roots.last().expect("a tree");
    let root = proc_root(root.clone());
    let mut group = c.benchmark_group("holder_scan_synthetic_cpu_time");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(9));
    group.bench_with_input(
        BenchmarkId::new("first_scan_processes_x50_files", processes),
        &root,
        |b, root| {
            b.iter_custom(|iterations| {
                cpu_time_of(iterations, || {
                    black_box(ProcessReader::new(root).scan_holders(BUDGET));
                })
            })
        },
    );
    let placement = Placement::locate(&root);
    let (_, learnt) = ProcessReader::new(&root).scan_and_remember(Instant::now() + BUDGET);
    let earlier_looks: EarlierLooks = learnt.into_iter().collect();
    group.bench_with_input(
        BenchmarkId::new("next_scans_processes_x50_files", processes),
        &root,
        |b, root| {
            b.iter_custom(|iterations| {
                cpu_time_of(iterations, || {
                    let reader = ProcessReader::with_earlier_looks(root, placement, &earlier_looks);
                    black_box(reader.scan_holders(BUDGET));
                })
            })
        },
    );
    group.finish();
}

/// The CPU time (user and system, every thread of this process) of `work` run
/// `iterations` times.
fn cpu_time_of(iterations: u64, mut work: impl FnMut()) -> Duration {
    let before = process_cpu_time();
    for _ in 0..iterations {
        work();
    }
    process_cpu_time().saturating_sub(before)
}

/// User and system time of this process so far, all its threads together.
fn process_cpu_time() -> Duration {
    // SAFETY: `getrusage` fills the zeroed struct we own and reads nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let seconds = |time: libc::timeval| {
        Duration::new(time.tv_sec as u64, 0) + Duration::from_micros(time.tv_usec as u64)
    };
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// This host's own `/proc`: what the scan costs on the machine that runs the benches.
fn bench_real_proc(c: &mut Criterion) {
    let root = proc_root(PathBuf::from("/proc"));
    let processes = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.parse::<u32>().is_ok())
        })
        .count();
    eprintln!("this host's /proc lists {processes} processes");
    let mut group = c.benchmark_group("holder_scan_real_proc");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    group.bench_function(BenchmarkId::new("processes", processes), |b| {
        b.iter(|| black_box(ProcessReader::new(&root).scan_holders(BUDGET)))
    });
    group.finish();
}

criterion_group!(benches, bench_synthetic, bench_real_proc);
criterion_main!(benches);
