//! The HTTP side: the server (binding, connections, graceful stop), what it answers
//! (landing page, health endpoints, `/metrics` from collections that concurrent scrapes
//! share), and what protects it: the `--web.config.file` of the Prometheus
//! exporter-toolkit (TLS, client certificates, basic authentication, extra response
//! headers, a rate limit), reloaded when it or a file it names changes, and the cap on
//! open connections. Metrics come from [`crate::exporter`], the one door to the rest.

pub(crate) mod auth;
mod collections;
mod config;
pub(crate) mod connections;
mod endpoints;
mod error;
mod file;
mod reload;
mod server;
mod settings;
mod tls;

pub use reload::WebConfig;
pub use server::{run, ServeConfig};
