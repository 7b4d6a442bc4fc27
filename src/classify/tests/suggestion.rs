//! What is suggested, as data.

use crate::classify::tests::fixtures::*;
use crate::classify::*;
use crate::observe::ProcessLookup;

#[test]
fn a_kill_is_suggested_as_commands_with_the_look_that_confirms_it() {
    let verdict = fork_orphan().judged().verdict;
    let suggestion = &verdict.suggestion;
    assert!(matches!(verdict.remedy, Remedy::Kill { .. }));
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
        .judged()
        .verdict;
    assert_eq!(unheld.remedy, Remedy::ResetGpu { blockers: vec![] });
    let held = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(nvml_client(1711, "nv-hostengine", &[0]))
        .judged()
        .verdict;
    assert_eq!(
        held.remedy,
        Remedy::ResetGpu {
            blockers: vec![1711]
        }
    );
    for verdict in [&unheld, &held] {
        assert_eq!(
            verdict.suggestion.commands[0].args,
            ["--gpu-reset", "-i", "0"]
        );
    }
}

#[test]
fn memory_being_freed_is_looked_at_again_sooner_than_a_kill_that_waits() {
    let mut exiting = cuda(432, &[]).state('Z');
    exiting.threads = 1;
    let verdict = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(exiting))
        .scanned()
        .judged()
        .verdict;
    assert_eq!(verdict.remedy, Remedy::Wait { on: WaitOn::Free });
    assert_eq!(verdict.suggestion.wait_seconds, Some(5));
}
