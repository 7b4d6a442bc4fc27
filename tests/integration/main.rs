//! Integration tests: the real binary, the fake NVML, real processes and real /proc,
//! compiled as one test binary. Three modules are shared rather than tests: `helpers` (the
//! crate in `tests/helpers`, shared with the benches), `kubelet` (a stand-in kubelet) and
//! `monitoring` (a real Prometheus and Alertmanager, and the webhook Alertmanager
//! notifies); every other module holds the tests of one subject.

use test_helpers as helpers;
mod kubelet;
mod monitoring;

mod after_kill;
mod alerts;
mod bad_input;
mod being_freed;
mod blind;
mod build_info;
mod check;
mod check_for_schedulers;
mod coalescing;
mod containers;
mod dashboard;
mod deploy;
mod docs;
mod docs_facts;
mod e2e;
mod engines;
mod exporter;
mod faces;
mod fake_nvml_docs;
mod fleet;
mod gpu_health;
mod helm;
mod holders;
mod image;
mod isolation;
mod kubernetes;
mod mig;
mod mps;
mod node_problem_detector;
mod privilege;
mod readme;
mod release;
mod release_workflow;
mod serving;
mod slurm;
mod snapshot;
mod suite;
mod textfile;
mod unwatched;
mod web;
mod witness;
