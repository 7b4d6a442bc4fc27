//! A procfs tree for the reader's tests: the files it reads, for one process at a time.

use super::ProcessReader;
use crate::observe::procfs::earlier_looks::EarlierLooks;
use crate::observe::procfs::placement::{Placement, Position};
use crate::observe::procfs::reading::ProcessFacts;
use crate::observe::procfs::root::ProcRoot;
use std::fs;
use std::os::unix::fs::symlink;

/// A procfs tree with the files the reader reads, for one process at a time.
pub(super) struct FakeProc {
    pub(super) dir: tempfile::TempDir,
    pub(super) root: ProcRoot,
}

impl FakeProc {
    pub(super) fn new() -> FakeProc {
        let dir = tempfile::tempdir().unwrap();
        let root = ProcRoot {
            root: dir.path().to_path_buf(),
            device_prefix: b"/dev/nvidia".to_vec(),
            stand_in: true,
        };
        FakeProc { dir, root }
    }

    /// Process `pid` started at `start` ticks, in `state`, holding and mapping the
    /// GPU nodes `gpus` (and the control node).
    pub(super) fn process(&self, pid: u32, start: u64, state: char, gpus: &[u32]) {
        let dir = self.dir.path().join(pid.to_string());
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("fd")).unwrap();
        fs::write(
            dir.join("stat"),
            format!("{pid} (python3) {state} 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0"),
        )
        .unwrap();
        fs::write(
            dir.join("status"),
            "Name:\tpython3\nUid:\t0\t0\t0\t0\nNSpid:\t1\n",
        )
        .unwrap();
        symlink("/dev/nvidiactl", dir.join("fd/3")).unwrap();
        let mut maps =
            String::from("7f00a0000000-7f00a0001000 rw-s 00000000 00:05 1065 /dev/nvidiactl\n");
        for (fd, gpu) in gpus.iter().enumerate() {
            symlink(
                format!("/dev/nvidia{gpu}"),
                dir.join(format!("fd/{}", fd + 4)),
            )
            .unwrap();
            maps.push_str(&format!(
                "7f00b{gpu}000000-7f00b{gpu}001000 rw-s 00000000 00:05 {} /dev/nvidia{gpu}\n",
                2000 + gpu
            ));
        }
        fs::write(dir.join("maps"), maps).unwrap();
    }

    pub(super) fn placement(&self) -> Placement {
        Placement {
            own_pid: u32::MAX,
            position: Position::Own,
            count_denied_links: true,
        }
    }

    /// Read owner `pid` listed on `gpus` with `earlier_looks`, and remember what was read.
    pub(super) fn read_owner(
        &self,
        earlier_looks: &mut EarlierLooks,
        pid: u32,
        gpus: &[u32],
    ) -> ProcessFacts {
        let reader = ProcessReader::with_earlier_looks(&self.root, self.placement(), earlier_looks);
        let looked = reader.read_owner(pid, gpus);
        let facts = ProcessFacts::clone(&looked.facts.expect("the process"));
        let remember = looked.remember.expect("something to remember");
        drop(reader);
        earlier_looks.insert(pid, remember);
        facts
    }
}
