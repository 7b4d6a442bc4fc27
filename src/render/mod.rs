//! Render: turn a verdict into what its reader needs (Prometheus series, a table for a
//! person, JSON for a script).

pub mod json;
pub mod prometheus;
pub mod text;
pub mod words;

#[cfg(test)]
mod tests;
