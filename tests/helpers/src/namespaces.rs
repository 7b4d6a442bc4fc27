//! A procfs of another PID namespace, mounted where a test can point `--path.procfs`: what
//! a container without the host's `/proc` mounted at `/host/proc` (or a typo in the flag)
//! leaves the exporter reading. Real: `unshare` makes the namespace, `nsenter` mounts its
//! procfs from inside it.

use crate::processes::{children_of, effective_uid};
use crate::wait_until;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The procfs of a new PID namespace whose PID 1 sleeps, mounted at `path`; unmounted
/// and its namespace ended when dropped.
pub struct OtherNamespaceProcfs {
    pub path: PathBuf,
    unshare: Child,
}

impl OtherNamespaceProcfs {
    /// Make the namespace and mount its procfs at `path` (made if missing). Needs root,
    /// as making a PID namespace and mounting a procfs do.
    pub fn mount(path: &Path) -> OtherNamespaceProcfs {
        assert_eq!(
            effective_uid(),
            0,
            "making a PID namespace and mounting its procfs (unshare, mount) needs the tests to run as root"
        );
        let unshare = Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child", "sleep", "1000"])
            .stdin(Stdio::null())
            .spawn()
            .expect("run unshare (util-linux)");
        let mut init = None;
        wait_until(
            "the new namespace's PID 1 runs",
            Duration::from_secs(10),
            || {
                init = children_of(unshare.id()).first().copied();
                init.is_some()
            },
        );
        fs::create_dir_all(path).unwrap();
        let mounted = Command::new("nsenter")
            .arg("--target")
            .arg(init.unwrap().to_string())
            .args(["--pid", "--", "mount", "-t", "proc", "proc"])
            .arg(path)
            .status()
            .expect("run nsenter (util-linux)");
        let procfs = OtherNamespaceProcfs {
            path: path.to_path_buf(),
            unshare,
        };
        assert!(mounted.success(), "mounting the namespace's procfs failed");
        procfs
    }
}

impl Drop for OtherNamespaceProcfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("--lazy")
            .arg(&self.path)
            .status();
        // `--kill-child` ends the namespace's PID 1 with it.
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}
