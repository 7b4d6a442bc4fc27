//! An error and its causes in one line, each part said once: the one way the exporter
//! puts an error chain on a line, wherever it says one (the readings that keep why a
//! source failed, a scrape served as NVML down, a web config that cannot be reloaded,
//! a flag's value that does not parse).

use std::error::Error;

/// `error: its cause: the cause's cause ...`. A cause whose words the line already ends
/// with is not said again: some libraries put their cause in their own message and give
/// it as `source` as well.
pub(crate) fn one_line(error: &(dyn Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        let words = error.to_string();
        if !line.ends_with(&words) {
            line.push_str(": ");
            line.push_str(&words);
        }
        cause = error.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use thiserror::Error;

    #[derive(Debug, Error)]
    #[error("cannot load NVML from libnvidia-ml.so.1")]
    struct Load(#[source] Library);

    /// A library error that says its cause in its message and chains it too.
    #[derive(Debug, Error)]
    #[error("a libloading error occurred: {0}")]
    struct Library(#[source] std::io::Error);

    #[test]
    fn each_cause_is_said_once() {
        let error = Load(Library(std::io::Error::other("no such file")));
        assert_eq!(
            one_line(&error),
            "cannot load NVML from libnvidia-ml.so.1: a libloading error occurred: no such file"
        );
        let bare = std::io::Error::other("refused");
        assert_eq!(one_line(&bare), "refused");
    }
}
