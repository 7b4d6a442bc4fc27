//! Case-by-case tests of the classifier, one rule each, with the figures measured on an
//! H200 (see the project's GPU facts) and expected values worked out by hand.

mod after_kill;
mod check;
mod containers;
mod driver;
pub(crate) mod fixtures;
mod holders;
mod layers;
mod mig;
mod mps;
mod nvml_garbage;
mod owners;
mod slurm;
mod suggestion;
mod unattributed;
