//! The jobs the live host hands its `/proc` reader thread in a look, and its waits for
//! them: NVML's owners (started with the last look's PIDs before NVML answers), the holder
//! scan (started beside them during an orphan episode), and Slurm's job steps; each answer
//! awaited until its deadline, a reader that does not answer reported with the read it is
//! stuck in. The looks themselves are `procfs`'s.

use super::procfs::{self, EarlierLooks, Owners, OwnersRead, OwnersScope};
use super::worker::{self, InCall, NoAnswer, Pending};
use super::{
    nvml, scan_deadline, CgroupAttribution, Deadlines, HolderScan, Lifespan, LiveHost, NvmlReading,
    Observation, ProcessLookup, ProcfsView, SlurmReading, StuckRead, LOOKING_FOR_SLURMSTEPDS,
    READING_OWNERS, SCANNING,
};
use crate::sync::lock;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl LiveHost {
    /// Starts reading the owners NVML listed at the last look (`guessed`), when there were
    /// any and the `/proc` reader is idle: a reading is taken after this look began, so it
    /// is as much this look's as one taken after NVML answers. Nothing else waits behind
    /// it, so a reader that is stuck or busy is left to [`LiveHost::read_owners`], which
    /// then reads every owner as before.
    ///
    /// When the last look was followed by a holder scan (memory orphaned), the reader
    /// goes on to this look's scan once the owners are read, with the owners it read,
    /// while the GPUs answer and the verdict is made: the scan [`LiveHost::scan`] then
    /// takes, if it was made with the owners this look ends up with and saw everything.
    pub(super) fn start_reading_owners(
        &self,
        guessed: &Arc<BTreeMap<u32, Vec<u32>>>,
        deadlines: &Deadlines,
    ) -> Option<Pending<Owners>> {
        *lock(&self.early_scan) = None;
        let scan_early = self.scanned_last.swap(false, Ordering::Relaxed);
        if guessed.is_empty() {
            return None;
        }
        // The owners' look stops its pass over /proc (which containers have ended) at the
        // scan's budget, as it always has, or sooner when the look must be done.
        let until = scan_deadline(Instant::now(), self.scan_budget, Some(deadlines.owners));
        let (root, placement) = (self.proc_root.clone(), self.placement);
        let guessed = Arc::clone(guessed);
        let scope = OwnersScope {
            listed: guessed.len(),
            every_owner: true,
        };
        if !scan_early {
            let job = move |earlier_looks: &mut EarlierLooks| {
                procfs::look_at_owners(&root, placement, earlier_looks, &guessed, scope, until)
            };
            return self.procfs.submit_if_idle(READING_OWNERS, job);
        }
        // It stops at NVML's deadline at the latest, so that a look at owners NVML lists
        // anew, queued behind it, still gets its time; a scan stopped short is made again.
        let (budget, scan_stops) = (self.scan_budget, deadlines.nvml);
        let job = move |earlier_looks: &mut EarlierLooks, early: worker::Early<Owners>| {
            let owners =
                procfs::look_at_owners(&root, placement, earlier_looks, &guessed, scope, until);
            let read = owners_read_of(owners.lookups.iter(), &guessed);
            early.answer(owners);
            worker::calling(SCANNING);
            let stops = scan_deadline(Instant::now(), budget, Some(scan_stops));
            let scan =
                procfs::look_for_holders(&root, placement, earlier_looks, read.clone(), stops);
            (read, scan)
        };
        let (owners, scan) = self.procfs.submit_two_if_idle(READING_OWNERS, job)?;
        *lock(&self.early_scan) = Some(scan);
        Some(owners)
    }

    /// What `/proc` says of each PID in `listed`, now that NVML has answered: from the
    /// look started early at the PIDs of `guessed` (`early`), where NVML lists a PID on
    /// the same GPUs as before, and from a look at the others (new PIDs, or listed on
    /// other GPUs: which GPUs a reading checks the mappings of). Without an early look,
    /// one look reads them all, as it always did. The driver's table of MIG capability
    /// minors is read on the /proc reader too, for a reading with MIG devices (a copy of
    /// it goes there); a reader that does not answer leaves the capabilities unknown.
    ///
    /// Both looks are waited for until `deadlines.owners`; an owner neither look read
    /// is "unknown" (not read is not gone), with the stuck read when there is one.
    #[allow(clippy::type_complexity)]
    pub(super) async fn read_owners(
        &self,
        early: Option<Pending<Owners>>,
        guessed: &BTreeMap<u32, Vec<u32>>,
        listed: &Arc<BTreeMap<u32, Vec<u32>>>,
        nvml: &mut NvmlReading,
        deadlines: &Deadlines,
    ) -> (
        BTreeMap<u32, ProcessLookup>,
        u64,
        ProcfsView,
        Option<StuckRead>,
    ) {
        let with_capabilities = nvml::has_mig_devices(nvml).then(|| nvml.clone());
        // Read again, or for the first time: what the early look did not read as NVML
        // lists it now.
        let rest: Option<BTreeMap<u32, Vec<u32>>> = early.as_ref().map(|_| {
            listed
                .iter()
                .filter(|&(pid, gpus)| guessed.get(pid) != Some(gpus))
                .map(|(pid, gpus)| (*pid, gpus.clone()))
                .collect()
        });
        let later = match &rest {
            Some(rest) if rest.is_empty() && with_capabilities.is_none() => None,
            _ => Some(self.submit_owners(rest, listed, with_capabilities, deadlines)),
        };
        let mut failure: Option<(String, Option<StuckRead>)> = None;
        let mut answered = Vec::with_capacity(2);
        if let Some(early) = early {
            match early.wait_until(deadlines.owners).await {
                Ok(owners) => answered.push(owners),
                Err(no_answer) => failure = Some(self.procfs_failure(no_answer)),
            }
        }
        // A later look queued behind a stuck early one would only be stuck behind it.
        let early_stuck = matches!(&failure, Some((_, Some(_))));
        if let Some(later) = later.filter(|_| !early_stuck) {
            match worker::answer(later, deadlines.owners).await {
                Ok((with_capabilities, owners)) => {
                    if let Some(with_capabilities) = with_capabilities {
                        *nvml = with_capabilities;
                    }
                    answered.push(owners);
                }
                Err(no_answer) => {
                    let this = self.procfs_failure(no_answer);
                    failure.get_or_insert(this);
                }
            }
        }
        let mut lookups = BTreeMap::new();
        let mut errors = 0;
        let mut view = None;
        // The later look's readings replace the early one's: it read what NVML lists now.
        for owners in answered {
            view = Some(owners.view);
            for (pid, lookup) in owners.lookups {
                if listed.contains_key(&pid) {
                    lookups.insert(pid, lookup);
                }
            }
            for (pid, count) in owners.errors {
                if listed.contains_key(&pid) {
                    errors += count;
                }
            }
        }
        let stuck = match failure {
            Some((error, stuck)) => {
                for &pid in listed.keys() {
                    lookups
                        .entry(pid)
                        .or_insert_with(|| ProcessLookup::Unreadable {
                            error: error.clone(),
                        });
                }
                stuck
            }
            None => None,
        };
        (
            lookups,
            errors,
            view.unwrap_or_else(|| self.placement.view()),
            stuck,
        )
    }

    /// Hands the /proc reader the look at `rest` (every PID of `listed` when `None`), with
    /// the MIG capabilities to attach to `with_capabilities`.
    #[allow(clippy::type_complexity)]
    fn submit_owners(
        &self,
        rest: Option<BTreeMap<u32, Vec<u32>>>,
        listed: &Arc<BTreeMap<u32, Vec<u32>>>,
        mut with_capabilities: Option<NvmlReading>,
        deadlines: &Deadlines,
    ) -> Result<Pending<(Option<NvmlReading>, Owners)>, NoAnswer> {
        let until = scan_deadline(Instant::now(), self.scan_budget, Some(deadlines.owners));
        let (root, placement) = (self.proc_root.clone(), self.placement);
        let scope = OwnersScope {
            listed: listed.len(),
            every_owner: rest.is_none(),
        };
        let listed = Arc::clone(listed);
        let mig_minors = self.mig_minors.clone();
        let job = move |earlier_looks: &mut EarlierLooks| {
            if let Some(reading) = with_capabilities.as_mut() {
                nvml::attach_capabilities(reading, &mig_minors);
            }
            let to_read = rest.as_ref().unwrap_or(&listed);
            let owners =
                procfs::look_at_owners(&root, placement, earlier_looks, to_read, scope, until);
            (with_capabilities, owners)
        };
        self.procfs.submit(READING_OWNERS, job)
    }

    /// The holder scan after `observation`, served from and adding to what earlier looks
    /// found, stopping at its budget or `deadlines.scan_stops`; with what the `/proc`
    /// reader is stuck in when it did not finish by `deadlines.scan_waited`.
    pub(super) async fn scan(
        &self,
        deadlines: &Deadlines,
        observation: &Observation,
    ) -> (HolderScan, Option<StuckRead>) {
        let started = Instant::now();
        let owners_read = owners_read(observation);
        self.scanned_last.store(true, Ordering::Relaxed);
        let early = lock(&self.early_scan).take();
        if let Some(early) = early {
            // Made after this look's owners were read, with the same owners: the scan
            // this look would make now, unless it stopped short of its end.
            match early.wait_until(deadlines.scan_waited).await {
                Ok((read, scan)) if read == owners_read && !scan.cut_short => {
                    self.procfs_answers();
                    return (scan, None);
                }
                Ok(_) => {}
                Err(no_answer) => {
                    return (cut_short_scan(started), self.procfs_failure(no_answer).1)
                }
            }
        }
        let stops = scan_deadline(started, self.scan_budget, Some(deadlines.scan_stops));
        let (root, placement) = (self.proc_root.clone(), self.placement);
        let job = move |earlier_looks: &mut EarlierLooks| {
            procfs::look_for_holders(&root, placement, earlier_looks, owners_read, stops)
        };
        match self.procfs.run(SCANNING, deadlines.scan_waited, job).await {
            Ok(scan) => {
                self.procfs_answers();
                (scan, None)
            }
            Err(no_answer) => {
                let (_, stuck) = self.procfs_failure(no_answer);
                (cut_short_scan(started), stuck)
            }
        }
    }

    /// Why a `/proc` look gave no answer, in one line, and what its reader is stuck in;
    /// logged once per episode.
    pub(super) fn procfs_failure(&self, no_answer: NoAnswer) -> (String, Option<StuckRead>) {
        match no_answer {
            NoAnswer::Stuck(InCall { call, since }) => {
                let stuck_seconds = since.elapsed().as_secs_f64();
                if !std::mem::replace(&mut *lock(&self.procfs_stuck), true)
                    && self.lifespan == Lifespan::Serving
                {
                    tracing::error!(
                        stuck_in = call,
                        stuck_seconds,
                        "a /proc read does not return (a process in uninterruptible sleep?); owners it did not read are unknown and the holder scan is incomplete until it does"
                    );
                }
                let error =
                    format!("the /proc reader has been stuck for {stuck_seconds:.1} s, {call}");
                let stuck = StuckRead {
                    call: call.to_string(),
                    stuck_seconds,
                };
                (error, Some(stuck))
            }
            NoAnswer::Failed(why) => (why, None),
        }
    }

    pub(super) fn procfs_answers(&self) {
        let was_stuck = std::mem::replace(&mut *lock(&self.procfs_stuck), false);
        if was_stuck && self.lifespan == Lifespan::Serving {
            tracing::info!("/proc reads return again");
        }
    }

    /// Whether the Slurm job steps of the processes in `cgroups` run now; `None` when none
    /// runs in a job. The look walks `/proc` when a step is new, so it runs on the `/proc`
    /// reader thread, waited for until `until`: a reader that does not answer makes the
    /// look incomplete, and no job is then cancelled on it.
    pub(super) async fn slurm_reading<'a>(
        &self,
        cgroups: impl Iterator<Item = &'a CgroupAttribution>,
        until: Instant,
    ) -> Option<SlurmReading> {
        let wanted: Vec<(u64, Option<String>)> = cgroups
            .filter_map(|cgroup| cgroup.slurm.as_ref())
            .map(|step| (step.job_id, step.step.clone()))
            .collect();
        if wanted.is_empty() {
            return None;
        }
        let deadline = scan_deadline(Instant::now(), self.scan_budget, Some(until));
        let (procfs, slurmstepds) = (self.proc_root.root.clone(), Arc::clone(&self.slurmstepds));
        let job = move |_: &mut EarlierLooks| lock(&slurmstepds).look(&procfs, &wanted, deadline);
        Some(
            match self.procfs.run(LOOKING_FOR_SLURMSTEPDS, until, job).await {
                Ok(reading) => {
                    self.procfs_answers();
                    reading
                }
                Err(no_answer) => {
                    self.procfs_failure(no_answer);
                    SlurmReading {
                        running_steps: Vec::new(),
                        complete: false,
                    }
                }
            },
        )
    }
}

/// The owners this observation read, for the holder scan that follows it.
fn owners_read(observation: &Observation) -> OwnersRead {
    let listed = observation.nvml.listed_pids();
    let lookups = observation
        .owners
        .iter()
        .map(|(pid, lookup)| (pid, &lookup.now));
    owners_read_of(lookups, &listed)
}

/// The owners present among `lookups` (by NVML's PID), with their start time and the
/// GPUs `listed` lists them on, by the procfs's PID.
fn owners_read_of<'a>(
    lookups: impl Iterator<Item = (&'a u32, &'a ProcessLookup)>,
    listed: &BTreeMap<u32, Vec<u32>>,
) -> OwnersRead {
    lookups
        .filter_map(|(pid, lookup)| match lookup {
            ProcessLookup::Present(facts) => Some((
                facts.pid,
                (facts.start_time_ticks, listed.get(pid)?.clone()),
            )),
            _ => None,
        })
        .collect()
}

/// The scan of a reader that did not answer, started at `started`: holders may be
/// missing, so it says it is incomplete, and no verdict rests on what it did not see.
fn cut_short_scan(started: Instant) -> HolderScan {
    HolderScan {
        holders: Vec::new(),
        permission_errors: 0,
        cut_short: true,
        duration_seconds: started.elapsed().as_secs_f64(),
    }
}
