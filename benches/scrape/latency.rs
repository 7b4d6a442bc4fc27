//! Scrape latency end to end, and where the time of a scrape goes.

use crate::helpers::{exporter_binary, Rig};
use crate::serve::{
    check_body, micros, sample_sum, scenario, scrape_new_connection, start_binary, summarize,
    Connection,
};
use crate::{Owners, SHAPES};
use std::fs;
use std::time::{Duration, Instant};
use vram_exporter::observe::procfs::{EarlierLooks, Placement, ProcRoot, ProcessReader};

/// The end-to-end median of a scenario, and the exporter's own figure for the same scrapes.
pub(crate) struct Latency {
    pub(crate) gpus: u32,
    pub(crate) owners: usize,
    pub(crate) median: Duration,
    pub(crate) inside: Duration,
}

pub(crate) fn latency(rig: &Rig, all: &mut Owners, samples: usize, measure: bool) -> Vec<Latency> {
    let mut medians = Vec::new();
    let warm_up = if measure { 200 } else { 2 };
    println!("\n## scrape latency, keep-alive connection, request to last byte ({samples} scrapes per scenario, after {warm_up} warm-up)");
    // With a baseline build, each scenario runs it right before this build, so that both
    // see the same machine.
    let mut builds = vec![("this build", exporter_binary())];
    if let (true, Some(baseline)) = (measure, std::env::var_os("SCRAPE_BASELINE_BINARY")) {
        builds.insert(0, ("baseline", baseline.into()));
    }
    println!("| GPUs | owners | build | body bytes | median us | p90 us | p99 us | max us | mean us | in-exporter median us | new connection median us | new connection p99 us | bodies equal to the previous |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for ((gpus, owners), (build, binary)) in SHAPES
        .into_iter()
        .flat_map(|shape| builds.iter().map(move |build| (shape, build)))
    {
        let pids = all.pids(rig, gpus);
        let exporter = start_binary(rig, binary, gpus, &pids[..owners]);
        let mut connection = Connection::open(exporter.address);
        let mut body = Vec::new();
        for _ in 0..warm_up {
            connection.scrape(&mut body);
        }
        check_body(std::str::from_utf8(&body).unwrap(), gpus, owners);
        let mut timed = Vec::with_capacity(samples);
        let mut inside = Vec::with_capacity(samples);
        // A scrape must get a collection of its own: one that got the body of the
        // collection before it (the same bytes, scrape duration included) timed nothing.
        let mut previous = Vec::new();
        let mut shared = 0;
        for _ in 0..samples {
            timed.push(connection.scrape(&mut body));
            if body == previous {
                shared += 1;
            }
            previous.clone_from(&body);
            let text = std::str::from_utf8(&body).unwrap();
            inside.push(Duration::from_secs_f64(sample_sum(
                text,
                "vram_scrape_duration_seconds",
                "",
            )));
        }
        check_body(std::str::from_utf8(&body).unwrap(), gpus, owners);
        // Two collections can render the same bytes by chance (equal durations to the
        // nanosecond); a scrape joining a finished collection would show in half of them.
        assert!(
            shared * 100 < samples,
            "{shared} of {samples} scrapes got the previous scrape's body"
        );
        let fresh: Vec<Duration> = (0..samples.min(1_000))
            .map(|_| scrape_new_connection(exporter.address))
            .collect();
        let timed = summarize(timed);
        let inside = summarize(inside);
        let fresh = summarize(fresh);
        println!(
            "| {gpus} | {owners} | {build} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {shared} |",
            body.len(),
            micros(timed.median),
            micros(timed.p90),
            micros(timed.p99),
            micros(timed.max),
            micros(timed.mean),
            micros(inside.median),
            micros(fresh.median),
            micros(fresh.p99),
        );
        if *build == "this build" {
            medians.push(Latency {
                gpus,
                owners,
                median: timed.median,
                inside: inside.median,
            });
        }
        drop(exporter);
    }
    medians
}

/// Median of `runs` timings of `work`.
pub(crate) fn time_median(runs: usize, mut work: impl FnMut()) -> Duration {
    for _ in 0..runs / 10 {
        work();
    }
    let samples = (0..runs)
        .map(|_| {
            let started = Instant::now();
            work();
            started.elapsed()
        })
        .collect();
    summarize(samples).median
}

/// Real NVML's cost per GPU and scrape, measured on an H200 (docs: gpu-facts): about
/// 40 us of calls for memory, identity and the three process lists.
pub(crate) const REAL_NVML_PER_GPU: Duration = Duration::from_micros(40);

/// Where the time of a scrape goes, per scenario: the fake NVML answering the calls a
/// scrape makes, and the `/proc` lookups of the owners, each timed in this process; and
/// what a scrape would cost with real NVML instead of the fake.
pub(crate) fn breakdown(rig: &Rig, all: &mut Owners, latencies: &[Latency]) {
    const RUNS: usize = 500;
    println!("\n## where a scrape's time goes (medians; the parts timed in this process, {RUNS} runs each)");
    println!("| GPUs | owners | NVML calls | fake NVML answering them us | /proc lookups of the owners us | in-exporter (vram_scrape_duration_seconds) us | end to end us | end to end with real NVML (projected) us |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    // The fake NVML reads its scenario (and its call log) from the environment on every
    // call; no other thread of this process reads or writes the environment.
    std::env::set_var("FAKE_NVML_SCENARIO", &rig.scenario);
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(rig.library.as_os_str())
        .init()
        .expect("load the fake NVML");
    let calls = rig.dir.path().join("calls.log");
    let proc_root = ProcRoot {
        root: "/proc".into(),
        device_prefix: rig.device_prefix().into_os_string().into_encoded_bytes(),
        stand_in: false,
    };
    for (gpus, owners) in SHAPES {
        let spawned = all.pids(rig, gpus);
        let pids = &spawned[..owners];
        rig.write_scenario(&scenario(gpus, pids));
        let _ = fs::remove_file(&calls);
        std::env::set_var("FAKE_NVML_CALL_LOG", &calls);
        read_like_a_scrape(&nvml);
        std::env::remove_var("FAKE_NVML_CALL_LOG");
        let nvml_calls = fs::read_to_string(&calls).unwrap().lines().count();
        let nvml_read = time_median(RUNS, || read_like_a_scrape(&nvml));
        // As a scrape does: each owner served from what an earlier scrape read, its stat
        // read again.
        let placement = Placement::locate(&proc_root);
        let first_look = ProcessReader::new(&proc_root);
        let earlier_looks: EarlierLooks = pids
            .iter()
            .filter_map(|&pid| Some((pid, first_look.read_owner(pid, &[]).remember?)))
            .collect();
        let lookups = time_median(RUNS, || {
            let reader = ProcessReader::with_earlier_looks(&proc_root, placement, &earlier_looks);
            for &pid in pids {
                let _ = std::hint::black_box(reader.read_owner(pid, &[]));
            }
        });
        let measured = latencies
            .iter()
            .find(|latency| (latency.gpus, latency.owners) == (gpus, owners));
        let projected = measured
            .map(|latency| (latency.median + REAL_NVML_PER_GPU * gpus).saturating_sub(nvml_read));
        println!(
            "| {gpus} | {owners} | {nvml_calls} | {} | {} | {} | {} | {} |",
            micros(nvml_read),
            micros(lookups),
            measured.map_or("-".into(), |latency| micros(latency.inside)),
            measured.map_or("-".into(), |latency| micros(latency.median)),
            projected.map_or("-".into(), micros),
        );
    }
    println!(
        "(the fake re-reads and parses its JSON scenario on every call; real NVML costs about {} us per GPU and scrape)",
        REAL_NVML_PER_GPU.as_micros()
    );
}

/// The NVML calls one scrape makes (through nvml-wrapper, as the exporter does): the
/// driver version, then per GPU its identity, memory and the three process lists.
pub(crate) fn read_like_a_scrape(nvml: &nvml_wrapper::Nvml) {
    let count = nvml.device_count().expect("device count");
    std::hint::black_box(nvml.sys_driver_version().ok());
    for index in 0..count {
        let device = nvml.device_by_index(index).expect("device");
        std::hint::black_box((
            device.uuid().ok(),
            device.name().ok(),
            device.pci_info().ok(),
            device.minor_number().ok(),
            device.memory_info().ok(),
            device.running_compute_processes().ok(),
            device.running_graphics_processes().ok(),
            device.mps_running_compute_processes().ok(),
        ));
        // What the driver says the GPU needs, and its MIG mode (the scrape also asks for
        // remapped rows through a raw call).
        std::hint::black_box((
            device.mig_mode().ok(),
            device
                .field_values_for(&[nvml_wrapper::structs::device::FieldId(
                    nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
                )])
                .ok(),
            device.are_pages_pending_retired().ok(),
            device.numa_node_id().ok(),
        ));
    }
}
