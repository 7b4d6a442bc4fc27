//! The exporter's own process as its `process_*` series say it: the figures `/proc/self`
//! gave, in seconds and bytes. Only a server carries them: a one-shot command's CPU time
//! and memory describe a process that is gone once its output is read.

use crate::observe::procfs::OwnProcessReading;

/// The exporter's own process, in the units of the `process_*` series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExporterProcess {
    /// CPU time spent in user and kernel mode, in seconds.
    pub cpu_seconds: f64,
    /// Resident memory, in bytes.
    pub resident_bytes: u64,
    /// Virtual memory, in bytes.
    pub virtual_bytes: u64,
    /// Open descriptors, when they could be counted in time.
    pub open_fds: Option<u64>,
    /// The soft limit of open descriptors, when there is one.
    pub max_fds: Option<u64>,
    /// When the process started, in seconds since the Unix epoch, when the boot time is
    /// known.
    pub start_time_seconds: Option<f64>,
}

/// The exporter's process from one reading of `/proc/self`.
pub fn exporter_process(reading: &OwnProcessReading) -> ExporterProcess {
    let ticks = reading.ticks_per_second.max(1) as f64;
    ExporterProcess {
        cpu_seconds: reading.cpu_ticks as f64 / ticks,
        resident_bytes: reading.resident_bytes,
        virtual_bytes: reading.virtual_bytes,
        open_fds: reading.open_fds,
        max_fds: reading.max_fds,
        start_time_seconds: reading
            .boot_time_unix_seconds
            .map(|boot| boot as f64 + reading.start_time_ticks as f64 / ticks),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_become_seconds_and_the_start_a_time() {
        let reading = OwnProcessReading {
            cpu_ticks: 175,
            ticks_per_second: 100,
            resident_bytes: 20_480_000,
            virtual_bytes: 1 << 30,
            start_time_ticks: 48_213,
            boot_time_unix_seconds: Some(1_796_218_200),
            open_fds: Some(12),
            max_fds: Some(1024),
        };
        assert_eq!(
            exporter_process(&reading),
            ExporterProcess {
                cpu_seconds: 1.75,
                resident_bytes: 20_480_000,
                virtual_bytes: 1 << 30,
                open_fds: Some(12),
                max_fds: Some(1024),
                start_time_seconds: Some(1_796_218_682.13),
            }
        );
        let without_boot_time = OwnProcessReading {
            boot_time_unix_seconds: None,
            ..reading
        };
        assert_eq!(
            exporter_process(&without_boot_time).start_time_seconds,
            None
        );
    }
}
