//! NVML, loaded at run time through `nvml-wrapper`: the GPUs, their memory and the
//! processes charged for it, their MIG devices, and what the driver says each needs.
//!
//! - `reading`: what a look yields ([`NvmlReading`] and its parts), plain serialisable
//!   data.
//! - `source`: the library, loaded lazily and again after failures, and the reader
//!   threads every NVML call runs on, one for the library and one per GPU
//!   (`NvmlSource`).
//! - `device`: one GPU or MIG device read through its handle.
//! - `mig`: the capability device nodes of MIG devices, from the driver's table.
//! - `xid`: the thread that counts critical Xid events, so a scrape never waits on them.

mod device;
mod mig;
mod reading;
mod source;
mod xid;

pub(crate) use mig::{attach_capabilities, has_mig_devices, MIG_MINORS};
pub use reading::{
    GpuError, GpuHealth, GpuReading, GpuState, MemoryReading, MigCapabilities, MigDeviceReading,
    MigReading, NvmlFailure, NvmlLists, NvmlProcess, NvmlReading, ProcessList, RecoveryAction,
    RemappedRows, RetiredPages, StuckCall, XidReading,
};
pub(crate) use source::{NvmlSource, NvmlThread};
