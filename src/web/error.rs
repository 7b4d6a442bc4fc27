//! What can be wrong with a web configuration, said so that the chain of causes reads as
//! one line: `web config file web.yml: tls_server_config: cannot read cert_file
//! server.crt: No such file or directory (os error 2)`.

use std::path::PathBuf;
use thiserror::Error;

/// A web configuration that cannot be used. Each variant's message says only its own
/// part; the cause, if any, is its `source`, so a chain prints every part once.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// A file could not be read: the configuration itself, or a certificate or key it
    /// names.
    #[error("cannot read {what} {}", path.display())]
    Read {
        /// Which file: `web config file`, `cert_file`, ...
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// A setting is wrong; the message says which and why.
    #[error("{0}")]
    Invalid(String),
    /// A mistake found inside `place` (a file, a section, a key).
    #[error("{place}")]
    Within {
        /// Where the mistake is.
        place: String,
        /// The mistake.
        source: Box<ConfigError>,
    },
}

impl ConfigError {
    /// This mistake, said to be inside `place`.
    pub(crate) fn within(self, place: impl Into<String>) -> ConfigError {
        ConfigError::Within {
            place: place.into(),
            source: Box::new(self),
        }
    }
}

/// A [`ConfigError::Invalid`] with a `format!` message.
macro_rules! invalid {
    ($($message:tt)*) => {
        $crate::web::error::ConfigError::Invalid(format!($($message)*))
    };
}
pub(crate) use invalid;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_names_each_part_once() {
        let error = ConfigError::Read {
            what: "cert_file",
            path: PathBuf::from("server.crt"),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        }
        .within("tls_server_config")
        .within("web config file web.yml");
        let line = crate::observe::one_line(&error);
        assert_eq!(
            line,
            "web config file web.yml: tls_server_config: cannot read cert_file server.crt: entity not found"
        );
    }
}
