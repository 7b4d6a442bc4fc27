//! What the benches read from the environment.

/// The whole number `name` says, or `default` when it is not set; anything else stops
/// the bench with the variable's name rather than measure what nobody asked for.
pub fn env_number(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Err(_) => default,
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a whole number")),
    }
}
