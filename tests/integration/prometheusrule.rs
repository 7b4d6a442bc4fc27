//! The PrometheusRule of `deploy/kubernetes/`, generated from
//! `alerts/vram-exporter.rules.yml`: shared by the test that checks the shipped file
//! (`deploy.rs`) and the example that writes it (`examples/prometheusrule.rs`), so that
//! no test run ever writes the file it compares against.

use serde_norway::{Mapping, Value};

/// The command that regenerates the shipped file.
pub const REGENERATE: &str = "cargo run --example prometheusrule";

/// The PrometheusRule for `rules` (the parsed rules file), as the generator writes it.
pub fn prometheus_rule(rules: &Value) -> String {
    let mut labels = Mapping::new();
    labels.insert("app.kubernetes.io/name".into(), "vram-exporter".into());
    let mut metadata = Mapping::new();
    metadata.insert("name".into(), "vram-exporter".into());
    metadata.insert("labels".into(), Value::Mapping(labels));
    let mut spec = Mapping::new();
    spec.insert("groups".into(), rules["groups"].clone());
    let mut document = Mapping::new();
    document.insert("apiVersion".into(), "monitoring.coreos.com/v1".into());
    document.insert("kind".into(), "PrometheusRule".into());
    document.insert("metadata".into(), Value::Mapping(metadata));
    document.insert("spec".into(), Value::Mapping(spec));
    format!(
        "# Generated from alerts/vram-exporter.rules.yml, the one source of these rules: edit\n\
         # that file, then regenerate this one with\n\
         #   {REGENERATE}\n{}",
        serde_norway::to_string(&Value::Mapping(document)).unwrap()
    )
}
