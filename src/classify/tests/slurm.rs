//! Slurm: cancelling a job whose step runs, killing what Slurm left behind.

use crate::classify::tests::fixtures::*;
use crate::classify::*;
use crate::observe::SlurmReading;

#[test]
fn a_culprit_in_a_step_that_runs_is_ended_by_cancelling_its_job() {
    let Judged { account, verdict } = slurm_fork_orphan()
        .slurm_running(&[(4242, "0"), (4242, "extern")])
        .judged();
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
    let Remedy::CancelJobs { jobs, targets } = &verdict.remedy else {
        panic!("{:?}", verdict.remedy)
    };
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].job_id, 4242);
    assert_eq!(jobs[0].user.as_deref(), Some("alice"));
    assert_eq!(
        jobs[0].culprits.iter().map(|c| c.pid).collect::<Vec<_>>(),
        [524]
    );
    assert!(targets.is_empty());
    assert!(!verdict
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
        let Judged {
            account: _,
            verdict,
        } = slurm_fork_orphan().slurm_running(running).judged();
        let Remedy::Kill { targets } = &verdict.remedy else {
            panic!("{:?}", verdict.remedy)
        };
        assert_eq!(targets.iter().map(|t| t.pid).collect::<Vec<_>>(), [524]);
        let left = verdict
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
    let Judged { account, verdict } = slurm_fork_orphan().judged();
    assert!(matches!(verdict.remedy, Remedy::Kill { .. }));
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
    assert!(matches!(host.judged().verdict.remedy, Remedy::Kill { .. }));
}

#[test]
fn culprits_inside_and_outside_running_steps_are_cancelled_and_killed() {
    let Judged {
        account: _,
        verdict,
    } = slurm_fork_orphan()
        .holder(cuda(600, &[0]))
        .holder(in_slurm_job(cuda(700, &[0]), 4243, "batch"))
        .slurm_running(&[(4242, "0"), (4243, "batch")])
        .judged();
    let Remedy::CancelJobs { jobs, targets } = &verdict.remedy else {
        panic!("{:?}", verdict.remedy)
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
    assert!(matches!(
        report.gpus[0].verdict().unwrap().remedy,
        Remedy::CancelJobs { .. }
    ));
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
        report.gpus[0].verdict().unwrap().remedy,
        Remedy::Kill { .. }
    ));
    assert_eq!(report.container_engines, None);
}

#[test]
fn a_live_owner_left_behind_by_its_slurm_job_gets_a_note() {
    let owner = in_slurm_job(cuda(432, &[0]), 4242, "0");
    let Judged { account, verdict } = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(owner))
        .slurm_running(&[])
        .judged();
    assert_eq!(account.owners[0].state(), OwnerState::Running);
    assert!(verdict.notes.iter().any(|note| matches!(
        note,
        Note::OwnerLeftBySlurm { pid: 432, job, .. } if job.state == JobState::Ended
    )));
    // While its step runs, there is nothing to say.
    let owner = in_slurm_job(cuda(432, &[0]), 4242, "0");
    let Judged {
        account: _,
        verdict,
    } = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(owner))
        .slurm_running(&[(4242, "0")])
        .judged();
    assert!(verdict.notes.is_empty(), "{:?}", verdict.notes);
}
