//! The Prometheus series: label sets, families, and what is left out.

use super::*;

#[test]
fn the_exporters_own_process_is_rendered_only_when_the_report_carries_it() {
    let mut report = fork_orphan().report();
    let families = |text: &str| -> Vec<String> {
        samples(text)
            .into_iter()
            .map(|(family, _, _)| family)
            .filter(|family| family.starts_with("process_"))
            .collect()
    };
    assert_eq!(families(&metrics_of(&report)), Vec::<String>::new());

    report.exporter_process = Some(crate::classify::ExporterProcess {
        cpu_seconds: 1.75,
        resident_bytes: 20_480_000,
        virtual_bytes: 1 << 30,
        open_fds: Some(12),
        max_fds: Some(1024),
        start_time_seconds: Some(1_796_218_682.13),
    });
    let text = metrics_of(&report);
    assert!(
        text.contains("# TYPE process_cpu_seconds_total counter\n"),
        "{text}"
    );
    let all = samples(&text);
    for (family, expected) in [
        ("process_cpu_seconds_total", 1.75),
        ("process_resident_memory_bytes", 20_480_000.0),
        ("process_virtual_memory_bytes", 1_073_741_824.0),
        ("process_open_fds", 12.0),
        ("process_max_fds", 1024.0),
        ("process_start_time_seconds", 1_796_218_682.13),
    ] {
        assert_eq!(value(&all, family, &[]), expected, "{family}");
    }

    // What could not be read is left out, not written as 0.
    report.exporter_process = Some(crate::classify::ExporterProcess {
        open_fds: None,
        max_fds: None,
        start_time_seconds: None,
        ..report.exporter_process.unwrap()
    });
    assert_eq!(
        families(&metrics_of(&report)),
        [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes"
        ]
    );
}

#[test]
fn prometheus_writes_each_label_set_in_its_order() {
    let text = metrics_of(&stuck_in_an_ended_container().report());
    for line in [
        "vram_build_info{version=\"1.2.3\",revision=\"abc\",driver_version=\"580.159.04\"} 1",
        "vram_gpu_info{gpu=\"0\",uuid=\"GPU-0\",name=\"NVIDIA H200\",pci_bus_id=\"00000000:19:00.0\",minor=\"0\"} 1",
        "vram_orphaned_bytes{gpu=\"0\",uuid=\"GPU-0\",reason=\"owner_gone\"} 9229565952",
        "vram_orphaned_bytes{gpu=\"0\",uuid=\"GPU-0\",reason=\"unattributed\"} 0",
        "vram_owner_processes{gpu=\"0\",uuid=\"GPU-0\",state=\"gone\"} 1",
        "vram_gone_owner_processes{gpu=\"0\",uuid=\"GPU-0\",reason=\"exited\"} 1",
        "vram_holder_processes{gpu=\"0\",uuid=\"GPU-0\",role=\"bystander\"} 1",
        &format!("vram_holder_info{{gpu=\"0\",uuid=\"GPU-0\",pid=\"524\",start_time=\"{}\",comm=\"python3\",state=\"running\",container_id=\"{CONTAINER}\",pod_uid=\"{POD}\",namespace=\"\",pod=\"\",container_name=\"\",container_image=\"\",slurm_job_id=\"\",slurm_step=\"\",slurm_user=\"\"}} 1", BOOT + 1_500),
        "vram_process_used_bytes{gpu=\"0\",uuid=\"GPU-0\",pid=\"503\",comm=\"\",state=\"gone\",container_id=\"\",pod_uid=\"\",namespace=\"\",pod=\"\",container_name=\"\",container_image=\"\",slurm_job_id=\"\",slurm_step=\"\",slurm_user=\"\"} 9229565952",
        "vram_exited_container_processes{gpu=\"0\",uuid=\"GPU-0\"} 1",
        "vram_gpu_recovery_action{gpu=\"0\",uuid=\"GPU-0\",action=\"gpu_reset\"} 1",
    ] {
        assert!(
            text.lines().any(|written| written == line),
            "{line} not in:\n{text}"
        );
    }
    // The sparse families write their active members only: no zeros.
    for family in SPARSE_FAMILIES {
        let zero = text
            .lines()
            .find(|line| line.starts_with(&format!("{family}{{")) && line.ends_with(" 0"));
        assert_eq!(zero, None, "{family} writes a zero");
    }
}

#[test]
fn prometheus_holder_scan_is_complete_unless_cut_short_or_denied() {
    let complete = |host: &Host| {
        value(
            &samples(&metrics_of(&host.report())),
            "vram_holder_scan_complete",
            &[],
        )
    };
    // No scan made: none was needed, nothing was missed.
    assert_eq!(complete(&Host::idle()), 1.0);
    assert_eq!(complete(&fork_orphan()), 1.0);
    let mut cut_short = fork_orphan();
    cut_short.scan_cut_short = true;
    assert_eq!(complete(&cut_short), 0.0);
}

#[test]
fn prometheus_counts_any_unrecognised_recovery_action_as_unknown() {
    let mut host = Host::idle().health(recovery(RecoveryAction::Unrecognised(42)));
    host.gpus[0].health.xid = Some(XidReading {
        watched: true,
        counts: BTreeMap::from([(79, 2)]),
    });
    let samples = samples(&metrics_of(&host.report()));
    let actions = find(&samples, "vram_gpu_recovery_action", &[("gpu", "0")]);
    assert_eq!(
        actions.len(),
        1,
        "one series, the action asked for: {actions:?}"
    );
    let on: Vec<&str> = actions
        .iter()
        .filter(|(_, _, value)| *value == 1.0)
        .map(|(_, labels, _)| labels[2].1.as_str())
        .collect();
    assert_eq!(on, ["unknown"]);
    assert_eq!(
        value(&samples, "vram_xid_errors_total", &[("xid", "79")]),
        2.0
    );
    assert_eq!(value(&samples, "vram_xid_watched", &[("gpu", "0")]), 1.0);
}

#[test]
fn prometheus_mig_series_come_from_the_instance_verdicts() {
    let report = mig_host(true)
        .holder(instance_child(524, &[21, 22]))
        .report();
    let text = metrics_of(&report);
    assert!(text.lines().any(|line| line
        == "vram_mig_info{gpu=\"0\",uuid=\"GPU-0\",GPU_I_ID=\"2\",GPU_CI_ID=\"0\",GPU_I_PROFILE=\"1g.18gb\",mig_uuid=\"MIG-2\",name=\"NVIDIA H200 MIG 1g.18gb\"} 1"));
    let samples = samples(&text);
    let instance = |gi: &'static str| [("gpu", "0"), ("GPU_I_ID", gi)];
    assert_eq!(value(&samples, "vram_gpu_mig_mode", &[("gpu", "0")]), 1.0);
    assert_eq!(
        value(&samples, "vram_gpu_mig_mode_pending", &[("gpu", "0")]),
        1.0
    );
    assert_eq!(value(&samples, "vram_mig_up", &instance("2")), 1.0);
    assert_eq!(
        value(&samples, "vram_mig_used_bytes", &instance("2")),
        USED_ONE_OWNER as f64
    );
    assert_eq!(value(&samples, "vram_mig_processes", &instance("2")), 1.0);
    assert_eq!(value(&samples, "vram_mig_processes", &instance("1")), 0.0);
    assert_eq!(
        value(
            &samples,
            "vram_mig_orphaned_bytes",
            &[("GPU_I_ID", "2"), ("reason", "owner_gone")]
        ),
        CHARGED_ONE_OWNER as f64
    );
    assert_eq!(
        value(
            &samples,
            "vram_mig_holder_processes",
            &[("GPU_I_ID", "2"), ("role", "culprit")]
        ),
        1.0
    );
    // GPU 1 has no MIG: no mode, no devices.
    assert!(find(&samples, "vram_gpu_mig_mode", &[("gpu", "1")]).is_empty());
}
