//! What tells a process's story after a kill, read with it: where it came from (its
//! parent, first read with it, and whether that parent has exited since; its group's and
//! session's leaders), whether the whole process is exiting, and since when a kill has
//! waited on it in uninterruptible sleep, with the kernel function it sleeps in.

use super::{Earlier, Looked, ProcessReader};
use crate::dates::now_unix_seconds;
use crate::observe::procfs::parse::{self, Stat, Status, PF_EXITING};
use crate::observe::procfs::reading::{Leader, Lineage, Relative};
use crate::observe::procfs::root::gone;
use std::fs;
use std::path::Path;
use std::sync::Arc;

impl ProcessReader<'_> {
    /// The kernel function a process in uninterruptible sleep waits in.
    pub(super) fn wchan(&self, dir: &Path, stat: &Stat) -> Option<String> {
        (stat.state == b'D')
            .then(|| fs::read_to_string(dir.join("wchan")).ok())
            .flatten()
            .filter(|name| !name.is_empty() && name != "0")
    }

    /// Whether the whole process is in its exit path: its main thread has begun to exit
    /// (`PF_EXITING`) and, when that thread is already a zombie, every other thread too.
    /// After a SIGKILL every thread exits, and the driver frees the context with the last
    /// (an H200's and an H100's PyTorch owners showed a zombie main thread for most of the
    /// 0.12-0.20 s a free took); a main thread that called pthread_exit leaves the others running with
    /// the context. Threads are read only for a zombie main thread.
    pub(super) fn process_exiting(&self, dir: &Path, stat: &Stat) -> bool {
        if stat.flags & PF_EXITING == 0 {
            return false;
        }
        if stat.state != b'Z' {
            return true;
        }
        match fs::read_dir(dir.join("task")) {
            // A thread that is gone by the time it is read has exited.
            Ok(threads) => threads.flatten().all(|thread| {
                self.root
                    .stat(&thread.path())
                    .map_or(true, |thread| thread.flags & PF_EXITING != 0)
            }),
            Err(_) => false,
        }
    }

    /// Since when a process in uninterruptible sleep has had a SIGKILL pending, carried
    /// from `earlier` or now; `None` outside state `D` or without a pending kill. Its
    /// status is read only in state `D`.
    pub(super) fn kill_pending_since(
        &self,
        dir: &Path,
        stat: &Stat,
        status: Option<&Status>,
        earlier: Earlier,
    ) -> Option<u64> {
        if stat.state != b'D' {
            return None;
        }
        let status = self.status_of(dir, status)?;
        status
            .kill_pending()
            .then(|| earlier.kill_pending_since.unwrap_or_else(now_unix_seconds))
    }

    /// Where a process came from, as `earlier` knew it, with its parent's exit if this
    /// stat line shows it for the first time. An exit said of a parent that is still the
    /// process's parent, alive with its start time, was never seen: it is dropped.
    pub(super) fn lineage_since(&self, earlier: Earlier, stat: &Stat) -> Option<Lineage> {
        let lineage = earlier.lineage?;
        if lineage.parent_exit_seen_unix_seconds.is_some()
            && stat.ppid == lineage.parent.pid
            && self.parent_lives(lineage)
        {
            return Some(Lineage {
                parent_exit_seen_unix_seconds: None,
                ..lineage.clone()
            });
        }
        Some(match self.parent_exit_seen(lineage, stat) {
            Some(seen) => Lineage {
                parent_exit_seen_unix_seconds: Some(seen),
                ..lineage.clone()
            },
            None => lineage.clone(),
        })
    }

    /// Whether the parent `lineage` first saw lives: its PID names a process with its
    /// start time (one that cannot be read is taken to live: an exit is seen, not guessed).
    fn parent_lives(&self, lineage: &Lineage) -> bool {
        let Some(start) = lineage.parent.start_time_ticks else {
            return false;
        };
        match self.root.stat(&self.root.pid_dir(lineage.parent.pid)) {
            Ok(now) => now.start_time_ticks == start,
            Err(error) => !gone(&error),
        }
    }

    /// An owner read afresh, with where it came from.
    pub(super) fn add_lineage(&self, looked: &mut Looked, dir: &Path) {
        let Ok(facts) = looked.facts.as_mut() else {
            return;
        };
        if facts.lineage.is_none() {
            let facts = Arc::make_mut(facts);
            let stat = Stat {
                comm: facts.comm.clone(),
                state: facts.state as u8,
                ppid: facts.ppid,
                pgrp: facts.pgid,
                session: facts.sid,
                flags: 0,
                threads: facts.threads,
                start_time_ticks: facts.start_time_ticks,
            };
            facts.lineage = Some(self.lineage(dir, facts.pid, &stat));
        }
        if let (Some(remember), Ok(facts)) = (looked.remember.as_mut(), looked.facts.as_ref()) {
            *remember = remember.with_facts(Arc::clone(facts));
        }
    }

    /// Where owner `pid` (stat `stat`) came from, read now: its parent, and its process
    /// group's and session's leaders (their PIDs cannot be another process's while the
    /// group or session lives); its command line only when its group's leader is gone.
    pub(super) fn lineage(&self, dir: &Path, pid: u32, stat: &Stat) -> Lineage {
        let relative = |relative_pid: u32| self.root.stat(&self.root.pid_dir(relative_pid)).ok();
        let parent_stat = (stat.ppid != 0).then(|| relative(stat.ppid)).flatten();
        let leader = |leader_pid: u32| {
            if leader_pid == pid {
                return Leader::Itself;
            }
            if leader_pid == 0 {
                return Leader::Unknown;
            }
            match self.root.stat(&self.root.pid_dir(leader_pid)) {
                Ok(found) if found.start_time_ticks <= stat.start_time_ticks => Leader::Alive,
                Ok(_) => Leader::Gone,
                Err(error) if gone(&error) => Leader::Gone,
                Err(_) => Leader::Unknown,
            }
        };
        let group_leader = leader(stat.pgrp);
        // Read only of a process whose group's leader is gone and whose parent adopted it
        // from outside that group: what a killed server's worker looks like, unwatched.
        let adopted = group_leader == Leader::Gone
            && parent_stat
                .as_ref()
                .is_some_and(|parent| parent.pgrp != stat.pgrp);
        let spawned_worker = group_leader == Leader::Gone
            && fs::read(dir.join("cmdline")).is_ok_and(|line| parse::spawned_worker(&line));
        let pipes_to_parent_closed =
            adopted && !spawned_worker && self.pipes_to_parent_closed(pid, stat.pgrp, dir);
        Lineage {
            parent: Relative {
                pid: stat.ppid,
                start_time_ticks: parent_stat.as_ref().map(|parent| parent.start_time_ticks),
                pgid: parent_stat.as_ref().map(|parent| parent.pgrp),
                comm: parent_stat.map(|parent| parent.comm),
            },
            parent_exit_seen_unix_seconds: None,
            group_leader,
            session_leader: leader(stat.session),
            spawned_worker,
            pipes_to_parent_closed,
        }
    }

    /// When the owner's stat now shows its first parent exited, if it shows that for the
    /// first time: a parent PID other than the one first read means the parent exited
    /// (the kernel hands a child to a subreaper or PID 1 only then); its PID is read to be
    /// sure, and the moment is kept.
    pub(super) fn parent_exit_seen(&self, lineage: &Lineage, stat: &Stat) -> Option<u64> {
        lineage.parent.start_time_ticks?;
        if lineage.parent_exit_seen_unix_seconds.is_some() || stat.ppid == lineage.parent.pid {
            return None;
        }
        (!self.parent_lives(lineage)).then(now_unix_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake_proc::FakeProc;
    use super::super::NOTHING_REMEMBERED;
    use super::*;
    use crate::observe::procfs::earlier_looks::{remember_witnessed, EarlierLooks};
    use crate::observe::procfs::reading::{Leader, Relative, WitnessedProcess};

    #[test]
    fn an_owner_remembers_its_first_parent_and_sees_it_exit() {
        let proc = FakeProc::new();
        // A server (PID 50) and its worker (PID 100) in the server's group, as first read.
        proc.process(50, 400, 'S', &[]);
        proc.process(100, 500, 'S', &[0]);
        let stat = |pid: u32, ppid: u32, start: u64| {
            fs::write(
                proc.dir.path().join(format!("{pid}/stat")),
                format!("{pid} (python3) S {ppid} 50 50 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0"),
            )
            .unwrap();
        };
        stat(50, 1, 400);
        stat(100, 50, 500);
        let mut earlier_looks = EarlierLooks::new();
        let first = proc.read_owner(&mut earlier_looks, 100, &[0]);
        let lineage = first.lineage.expect("read with the owner");
        assert_eq!(
            (lineage.parent.pid, lineage.parent.start_time_ticks),
            (50, Some(400))
        );
        assert_eq!(lineage.group_leader, Leader::Alive);
        assert_eq!(lineage.parent_exit_seen_unix_seconds, None);
        // The parent re-execs: the same PID and start time, another name. Not an exit.
        fs::write(
            proc.dir.path().join("50/stat"),
            "50 (server-v2) S 1 50 50 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 400 0",
        )
        .unwrap();
        let again = proc
            .read_owner(&mut earlier_looks, 100, &[0])
            .lineage
            .unwrap();
        assert_eq!(again.parent_exit_seen_unix_seconds, None);
        // The server is killed: the worker is adopted by PID 1, and the exit is seen once.
        fs::remove_dir_all(proc.dir.path().join("50")).unwrap();
        stat(100, 1, 500);
        let gone = proc
            .read_owner(&mut earlier_looks, 100, &[0])
            .lineage
            .unwrap();
        let seen = gone
            .parent_exit_seen_unix_seconds
            .expect("the exit is seen");
        assert_eq!(gone.parent.pid, 50, "the parent as first seen");
        let later = proc
            .read_owner(&mut earlier_looks, 100, &[0])
            .lineage
            .unwrap();
        assert_eq!(later.parent_exit_seen_unix_seconds, Some(seen));
    }

    #[test]
    fn a_zombie_main_thread_is_exiting_only_when_every_thread_is() {
        let proc = FakeProc::new();
        proc.process(100, 500, 'Z', &[0]);
        let dir = proc.dir.path().join("100");
        let thread = |tid: u32, state: char, flags: u32| {
            let task = dir.join(format!("task/{tid}"));
            fs::create_dir_all(&task).unwrap();
            fs::write(
                task.join("stat"),
                format!(
                    "{tid} (python3) {state} 1 100 100 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 3 0 500 0"
                ),
            )
            .unwrap();
        };
        let exiting = 4_194_560 | PF_EXITING;
        fs::write(
            dir.join("stat"),
            format!("100 (python3) Z 1 100 100 0 -1 {exiting} 0 0 0 0 0 0 0 0 20 0 3 0 500 0"),
        )
        .unwrap();
        thread(100, 'Z', exiting);
        thread(101, 'S', 4_194_560);
        let reader =
            ProcessReader::with_earlier_looks(&proc.root, proc.placement(), &NOTHING_REMEMBERED);
        let stat = proc.root.stat(&dir).unwrap();
        // pthread_exit of the main thread: another thread runs on with the context.
        assert!(!reader.process_exiting(&dir, &stat));
        // SIGKILL: every thread exits.
        thread(101, 'D', exiting);
        assert!(reader.process_exiting(&dir, &stat));
    }

    #[test]
    fn what_an_earlier_exporter_witnessed_counts_only_for_the_same_process() {
        let proc = FakeProc::new();
        // The worker as a restarted exporter finds it: adopted, its server gone.
        proc.process(100, 500, 'S', &[0]);
        let witnessed = |start: u64, exit_seen: Option<u64>| WitnessedProcess {
            pid: 100,
            start_time_ticks: start,
            lineage: Some(Lineage {
                parent: Relative {
                    pid: 50,
                    start_time_ticks: Some(400),
                    comm: Some("api-server".into()),
                    pgid: Some(50),
                },
                parent_exit_seen_unix_seconds: exit_seen,
                group_leader: Leader::Alive,
                session_leader: Leader::Alive,
                spawned_worker: false,
                pipes_to_parent_closed: false,
            }),
            kill_pending_since_unix_seconds: None,
            ending_since_unix_millis: None,
        };
        let mut earlier_looks = EarlierLooks::new();
        remember_witnessed(&mut earlier_looks, &[witnessed(500, Some(1_796_300_000))]);
        let read = proc
            .read_owner(&mut earlier_looks, 100, &[0])
            .lineage
            .unwrap();
        assert_eq!(read.parent.pid, 50);
        assert_eq!(read.parent_exit_seen_unix_seconds, Some(1_796_300_000));
        // The parent seen alive before the restart, gone now: the exit is seen now.
        let mut earlier_looks = EarlierLooks::new();
        remember_witnessed(&mut earlier_looks, &[witnessed(500, None)]);
        let read = proc
            .read_owner(&mut earlier_looks, 100, &[0])
            .lineage
            .unwrap();
        assert_eq!(read.parent.pid, 50, "the parent as first seen, not PID 1");
        assert!(read.parent_exit_seen_unix_seconds.is_some());
        // Another process under the PID: what was witnessed was of someone else.
        let mut earlier_looks = EarlierLooks::new();
        remember_witnessed(&mut earlier_looks, &[witnessed(499, Some(1_796_300_000))]);
        let read = proc
            .read_owner(&mut earlier_looks, 100, &[0])
            .lineage
            .unwrap();
        assert_eq!(read.parent.pid, 1);
        assert_eq!(read.parent_exit_seen_unix_seconds, None);
        // An exit said of a parent that lives, and is still the parent, was never seen.
        proc.process(50, 400, 'S', &[]);
        fs::write(
            proc.dir.path().join("100/stat"),
            "100 (python3) S 50 50 50 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 500 0",
        )
        .unwrap();
        let mut earlier_looks = EarlierLooks::new();
        remember_witnessed(&mut earlier_looks, &[witnessed(500, Some(1_796_300_000))]);
        let read = proc
            .read_owner(&mut earlier_looks, 100, &[0])
            .lineage
            .unwrap();
        assert_eq!(read.parent_exit_seen_unix_seconds, None);
    }

    #[test]
    fn an_ending_owner_keeps_the_moment_it_was_first_seen_ending() {
        let proc = FakeProc::new();
        proc.process(100, 500, 'S', &[0]);
        let mut earlier_looks = EarlierLooks::new();
        assert_eq!(
            proc.read_owner(&mut earlier_looks, 100, &[0])
                .ending_since_unix_millis,
            None
        );
        // Every thread exited, its parent has not reaped it: a zombie that maps nothing.
        let finished = |start: u64| {
            proc.process(100, start, 'Z', &[]);
            fs::write(proc.dir.path().join("100/maps"), "").unwrap();
        };
        finished(500);
        let first = proc.read_owner(&mut earlier_looks, 100, &[0]);
        assert!(first.finished());
        let since = first.ending_since_unix_millis.expect("ending");
        let again = proc.read_owner(&mut earlier_looks, 100, &[0]);
        assert_eq!(again.ending_since_unix_millis, Some(since));
        // Another process under the PID is seen ending from now, not from then.
        finished(900);
        let stranger = proc.read_owner(&mut earlier_looks, 100, &[0]);
        assert!(stranger.ending_since_unix_millis.unwrap() >= since);
        assert_eq!(stranger.start_time_ticks, 900);
    }

    #[test]
    fn a_pending_kill_in_uninterruptible_sleep_keeps_its_first_sighting() {
        let proc = FakeProc::new();
        proc.process(100, 500, 'D', &[0]);
        let status = proc.dir.path().join("100/status");
        fs::write(
            &status,
            "Name:\tpython3\nUid:\t0\t0\t0\t0\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000100\n",
        )
        .unwrap();
        let mut earlier_looks = EarlierLooks::new();
        let first = proc.read_owner(&mut earlier_looks, 100, &[0]);
        let since = first.kill_pending_since_unix_seconds.expect("killed");
        let again = proc.read_owner(&mut earlier_looks, 100, &[0]);
        assert_eq!(again.kill_pending_since_unix_seconds, Some(since));
        // Out of uninterruptible sleep, no kill is waiting.
        proc.process(100, 500, 'S', &[0]);
        assert_eq!(
            proc.read_owner(&mut earlier_looks, 100, &[0])
                .kill_pending_since_unix_seconds,
            None
        );
    }
}
