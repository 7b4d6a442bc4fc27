//! The one-shot commands: `check`, `snapshot` and `textfile`.

pub mod check;
pub mod snapshot;
pub mod textfile;
