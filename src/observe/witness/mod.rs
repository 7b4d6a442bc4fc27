//! The witness state: what a served exporter saw that no later look can see again, in a
//! small file in a runtime directory, so that `check` beside it, and the exporter after a
//! restart, give the verdict it gives. Which facts those are is the rest of observe's to
//! say (`observe::witnessed`); this source is the file: where it is, whether it may be
//! trusted, and writing it whole or not at all.
//!
//! The file is trusted only when it and its directory belong to root, to the user running
//! this command, or to the packages' `vram-exporter` user, and neither is writable by
//! others: a forged entry could otherwise put a `kill` line in front of root. A file
//! written in another boot, of another format, too large, unparsable, unreadable or not
//! trusted is no state, said in one warning, never a crash or an invented verdict.

use crate::dates::now_unix_seconds;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Where the state is kept unless `--path.state` says otherwise: a runtime directory,
/// which the systemd unit, the packages and the Helm chart make (and keep across a
/// restart), and where `check` on the same host or in the same pod finds it.
pub const DEFAULT_DIRECTORY: &str = "/run/vram-exporter";

/// The file's name in its directory.
pub const FILE_NAME: &str = "witness.json";

/// The format this build reads and writes; a file of another is no state.
const FORMAT: u32 = 1;

/// The largest file read: 4,096 processes take about 2 MiB.
const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// The user the packages run the exporter as.
const EXPORTER_USER: &str = "vram-exporter";

/// Why there is no state to go by, as one warning says it.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum NoState {
    /// No file: no exporter serving on this host keeps one there.
    #[error("no witness state at {path}: no exporter serving on this host keeps one there (see --path.state), so only what this look sees is judged")]
    Missing {
        /// The file.
        path: String,
    },
    /// Written in another boot: its processes are not this boot's.
    #[error("the witness state at {path} was written before this boot: ignored")]
    OtherBoot {
        /// The file.
        path: String,
    },
    /// Of another format version.
    #[error("the witness state at {path} is of format {format}, not {FORMAT}: ignored")]
    OtherFormat {
        /// The file.
        path: String,
        /// The format it says it is.
        format: u32,
    },
    /// Not a state this build can parse, or larger than any it writes.
    #[error("the witness state at {path} is corrupt ({error}): ignored")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong with it.
        error: String,
    },
    /// It cannot be read.
    #[error("cannot read the witness state at {path} ({error}): ignored")]
    Unreadable {
        /// The file.
        path: String,
        /// The error.
        error: String,
    },
    /// Someone other than root or the exporter's user could have written it.
    #[error("the witness state at {path} is not trusted ({why}): ignored")]
    Untrusted {
        /// The file.
        path: String,
        /// Why not.
        why: String,
    },
}

impl NoState {
    /// The word JSON gives the reason.
    pub fn kind(&self) -> &'static str {
        match self {
            NoState::Missing { .. } => "missing",
            NoState::OtherBoot { .. } => "other_boot",
            NoState::OtherFormat { .. } => "other_format",
            NoState::Corrupt { .. } => "corrupt",
            NoState::Unreadable { .. } => "unreadable",
            NoState::Untrusted { .. } => "untrusted",
        }
    }
}

/// The state as its file holds it.
#[derive(Debug, Serialize, Deserialize)]
struct StateFile<T> {
    /// [`FORMAT`].
    format: u32,
    /// The boot it was written in (`/proc/sys/kernel/random/boot_id`).
    boot_id: String,
    /// When, in seconds since the Unix epoch.
    written_unix_seconds: u64,
    /// What was witnessed.
    witnessed: T,
}

/// A state read and trusted.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded<T> {
    /// What was witnessed.
    pub witnessed: T,
    /// When it was written, in seconds since the Unix epoch.
    pub written_unix_seconds: u64,
}

/// The directory the state is kept in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDirectory {
    /// The directory.
    pub directory: PathBuf,
}

impl StateDirectory {
    /// The state file.
    pub fn file(&self) -> PathBuf {
        self.directory.join(FILE_NAME)
    }

    /// The state, if there is one written in boot `boot_id` that may be trusted.
    pub fn load<T: DeserializeOwned>(&self, boot_id: &str) -> Result<Loaded<T>, NoState> {
        let path = self.file();
        let named = path.display().to_string();
        let unreadable = |error: io::Error| NoState::Unreadable {
            path: named.clone(),
            error: error.to_string(),
        };
        // Not through a link: whoever may plant one could point it at a file of theirs.
        let mut file = match fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(NoState::Missing { path: named })
            }
            Err(error) => return Err(unreadable(error)),
        };
        let metadata = file.metadata().map_err(unreadable)?;
        let directory = fs::symlink_metadata(&self.directory).map_err(unreadable)?;
        if let Some(why) = distrust(&metadata, &directory) {
            return Err(NoState::Untrusted { path: named, why });
        }
        if metadata.len() > MAX_FILE_BYTES {
            return Err(NoState::Corrupt {
                path: named,
                error: format!("{} bytes, more than {MAX_FILE_BYTES}", metadata.len()),
            });
        }
        let mut text = Vec::with_capacity(metadata.len() as usize);
        Read::by_ref(&mut file)
            .take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(unreadable)?;
        // The envelope first: a file of another format need not parse as this one's.
        #[derive(Deserialize)]
        struct Envelope {
            format: u32,
            boot_id: String,
        }
        let corrupt = |error: serde_json::Error| NoState::Corrupt {
            path: named.clone(),
            error: error.to_string(),
        };
        let envelope: Envelope = serde_json::from_slice(&text).map_err(corrupt)?;
        if envelope.format != FORMAT {
            return Err(NoState::OtherFormat {
                path: named,
                format: envelope.format,
            });
        }
        if envelope.boot_id.is_empty() || envelope.boot_id != boot_id {
            return Err(NoState::OtherBoot { path: named });
        }
        let state: StateFile<T> = serde_json::from_slice(&text).map_err(corrupt)?;
        Ok(Loaded {
            witnessed: state.witnessed,
            written_unix_seconds: state.written_unix_seconds,
        })
    }

    /// Write `witnessed` as the state of boot `boot_id`, whole or not at all: into a new
    /// file beside it, then renamed over it. Makes the directory (readable by all,
    /// writable by its owner) when it is missing.
    pub fn save<T: Serialize>(&self, boot_id: &str, witnessed: &T) -> io::Result<()> {
        if !self.directory.is_dir() {
            fs::DirBuilder::new().mode(0o755).create(&self.directory)?;
        }
        let state = StateFile {
            format: FORMAT,
            boot_id: boot_id.to_string(),
            written_unix_seconds: now_unix_seconds(),
            witnessed,
        };
        let text = serde_json::to_vec(&state).map_err(io::Error::other)?;
        let temporary = self
            .directory
            .join(format!(".{FILE_NAME}.{}.tmp", std::process::id()));
        let result = (|| {
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&temporary)?;
            file.write_all(&text)?;
            fs::rename(&temporary, self.file())
        })();
        if result.is_err() {
            let _ = fs::remove_file(&temporary);
        }
        result
    }
}

/// Why a state file (`file`) in `directory` may not be trusted, if it may not: either
/// belongs to someone other than root, this process's user or the exporter's, or is
/// writable by others, or the file is not a plain file or the directory not a directory.
fn distrust(file: &fs::Metadata, directory: &fs::Metadata) -> Option<String> {
    let trusted = trusted_owners();
    let check = |what: &str, metadata: &fs::Metadata| {
        if !trusted.contains(&metadata.uid()) {
            return Some(format!(
                "the {what} belongs to uid {}, neither root nor the exporter's user",
                metadata.uid()
            ));
        }
        let writable_by_others = metadata.permissions().mode() & 0o022;
        (writable_by_others != 0).then(|| {
            format!(
                "the {what} is writable by others (mode {:o})",
                metadata.permissions().mode() & 0o7777
            )
        })
    };
    if !file.file_type().is_file() {
        return Some("it is not a plain file".into());
    }
    if !directory.file_type().is_dir() {
        return Some("its directory is not a plain directory".into());
    }
    check("file", file).or_else(|| check("directory", directory))
}

/// The users whose state is trusted: root, the user running this command, and the
/// packages' `vram-exporter` user when the host has one.
fn trusted_owners() -> Vec<u32> {
    // SAFETY: geteuid has no preconditions.
    let mut owners = vec![0, unsafe { libc::geteuid() }];
    if let Some(uid) = fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| user_id(&passwd, EXPORTER_USER))
    {
        owners.push(uid);
    }
    owners
}

/// The uid the password file `passwd` gives `name`.
fn user_id(passwd: &str, name: &str) -> Option<u32> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == name).then(|| fields.nth(1)?.parse().ok())?
    })
}

/// The boot this is, as `boot_id` of the procfs at `procfs` says (or the system's, for
/// a tree standing in for one); empty when neither can be read, which matches no state.
pub fn boot_id(procfs: &Path) -> String {
    let read = |root: &Path| fs::read_to_string(root.join("sys/kernel/random/boot_id")).ok();
    read(procfs)
        .or_else(|| read(Path::new("/proc")))
        .map(|id| id.trim().to_string())
        .unwrap_or_default()
}

/// Whether `path` is a directory that the state may be kept in, or can be made in; for a
/// server, which says at start when it cannot keep one.
pub fn writable(directory: &Path) -> io::Result<()> {
    let probe = StateDirectory {
        directory: directory.to_path_buf(),
    };
    if !directory.is_dir() {
        fs::DirBuilder::new().mode(0o755).create(directory)?;
    }
    let temporary = probe
        .directory
        .join(format!(".{FILE_NAME}.{}.probe", std::process::id()));
    fs::File::create(&temporary)?;
    fs::remove_file(temporary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn directory() -> (tempfile::TempDir, StateDirectory) {
        let temporary = tempfile::tempdir().unwrap();
        let state = StateDirectory {
            directory: temporary.path().join("state"),
        };
        (temporary, state)
    }

    #[test]
    fn a_state_written_is_read_back_in_the_same_boot_only() {
        let (_temporary, state) = directory();
        assert!(matches!(
            state.load::<serde_json::Value>("boot-a"),
            Err(NoState::Missing { .. })
        ));
        state.save("boot-a", &json!({"processes": [1, 2]})).unwrap();
        let loaded = state.load::<serde_json::Value>("boot-a").unwrap();
        assert_eq!(loaded.witnessed, json!({"processes": [1, 2]}));
        assert_eq!(
            state.load::<serde_json::Value>("boot-b"),
            Err(NoState::OtherBoot {
                path: state.file().display().to_string()
            })
        );
        // No temporary file is left beside it.
        let names: Vec<_> = fs::read_dir(&state.directory)
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, [FILE_NAME]);
    }

    #[test]
    fn a_corrupt_oversized_or_other_format_state_is_no_state() {
        let (_temporary, state) = directory();
        state.save("boot-a", &json!({})).unwrap();
        fs::write(state.file(), "{\"format\": 1, \"boot_id\": \"boot-a\"").unwrap();
        assert!(matches!(
            state.load::<serde_json::Value>("boot-a"),
            Err(NoState::Corrupt { .. })
        ));
        fs::write(state.file(), "{\"format\": 9, \"boot_id\": \"boot-a\"}").unwrap();
        assert!(matches!(
            state.load::<serde_json::Value>("boot-a"),
            Err(NoState::OtherFormat { format: 9, .. })
        ));
        fs::write(state.file(), vec![b' '; MAX_FILE_BYTES as usize + 1]).unwrap();
        assert!(matches!(
            state.load::<serde_json::Value>("boot-a"),
            Err(NoState::Corrupt { .. })
        ));
    }

    #[test]
    fn a_state_others_may_write_is_not_trusted() {
        let (_temporary, state) = directory();
        state.save("boot-a", &json!({})).unwrap();
        fs::set_permissions(state.file(), fs::Permissions::from_mode(0o666)).unwrap();
        let Err(NoState::Untrusted { why, .. }) = state.load::<serde_json::Value>("boot-a") else {
            panic!("trusted")
        };
        assert_eq!(why, "the file is writable by others (mode 666)");
        fs::set_permissions(state.file(), fs::Permissions::from_mode(0o644)).unwrap();
        fs::set_permissions(&state.directory, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            state.load::<serde_json::Value>("boot-a"),
            Err(NoState::Untrusted { .. })
        ));
        // A link to a state is not followed.
        fs::set_permissions(&state.directory, fs::Permissions::from_mode(0o755)).unwrap();
        let real = state.directory.join("real.json");
        fs::rename(state.file(), &real).unwrap();
        std::os::unix::fs::symlink(&real, state.file()).unwrap();
        assert!(matches!(
            state.load::<serde_json::Value>("boot-a"),
            Err(NoState::Unreadable { .. })
        ));
    }

    #[test]
    fn the_exporters_user_is_found_in_the_password_file() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nvram-exporter:x:998:998::/nonexistent:/usr/sbin/nologin\n";
        assert_eq!(user_id(passwd, "vram-exporter"), Some(998));
        assert_eq!(user_id(passwd, "nobody"), None);
    }
}
