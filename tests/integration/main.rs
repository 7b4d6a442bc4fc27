//! Integration tests: the real binary, the fake NVML, real processes and real /proc,
//! compiled as one test binary.

mod helpers;

mod alerts;
mod bad_input;
mod check;
mod coalescing;
mod containers;
mod dashboard;
mod deploy;
mod e2e;
mod exporter;
mod helm;
mod holders;
mod image;
mod kubelet;
mod kubernetes;
mod privilege;
mod release;
mod serving;
mod snapshot;
mod textfile;
mod web;

// Added with issue 14.
mod build_info;
mod readme;
// MIG and what the driver says a GPU needs (issue 13).
mod fake_nvml_docs;
mod gpu_health;
mod mig;
