//! Containers: owners and culprits in containers, and those that outlived them.

use crate::classify::tests::fixtures::*;
use crate::classify::*;
use crate::observe::ProcessLookup;

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
    let Judged { account, verdict } = Host::idle()
        .used(2 * USED_ONE_OWNER)
        .owner(
            432,
            Some(CHARGED_ONE_OWNER),
            present(contained(cuda(432, &[0]).state('D'), ended)),
        )
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(contained(cuda(524, &[0]), ended))
        .holder(contained(cuda(525, &[0]), Some(NamespaceInit::Unknown)))
        .judged();
    // The uninterruptible owner 432 and the culprit 524; not 525, whose PID 1 is unknown.
    assert_eq!(account.exited_container_processes(), 2);
    assert!(verdict
        .notes
        .contains(&Note::CulpritsContainerEnded { pids: vec![524] }));
}
