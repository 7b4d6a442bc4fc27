//! MIG instances, each judged as a GPU of its own.

use crate::classify::tests::fixtures::*;
use crate::classify::*;

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
            .and_then(|instance| instance.outcome.judged())
            .unwrap()
    };
    assert_eq!(instance(1).verdict.finding.kind(), FindingKind::Idle);
    assert!(instance(1).account.culprits.is_empty());
    assert_eq!(instance(2).verdict.finding.kind(), FindingKind::Orphaned);
    assert_eq!(pids(&instance(2).account.culprits), vec![524]);
    assert_eq!(gpu.status(), CheckStatus::Orphaned);
}

#[test]
fn a_process_of_another_instance_is_no_candidate_there() {
    let report = mig_host(true)
        .holder(instance_child(600, &[12, 13]))
        .report();
    let instance = report.gpus[0].instances[1].outcome.judged().unwrap();
    let orphaned = &instance.account;
    assert!(orphaned.culprits.is_empty() && orphaned.bystanders.is_empty());
    assert_eq!(
        instance.verdict.remedy,
        Remedy::ResetGpu { blockers: vec![] }
    );
}

#[test]
fn without_capability_minors_a_mig_holder_is_undetermined() {
    let report = mig_host(false)
        .holder(instance_child(524, &[21, 22]))
        .report();
    let instance = report.gpus[0].instances[1].outcome.judged().unwrap();
    let orphaned = &instance.account;
    assert_eq!(pids(&orphaned.undetermined), vec![524]);
    assert!(orphaned.undetermined[0]
        .evidence
        .contains(&Evidence::InstanceUnknown));
    assert!(matches!(instance.verdict.remedy, Remedy::CannotTell { .. }));
}
